package main

import (
	"context"
	"sort"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	parityv1 "github.com/tidb-parity/parity/api/parity/v1"
	"github.com/tidb-parity/parity/fleet"
)

// BenchmarkFleetCutover (#31): four members after writes stopped. Each round asks every
// member alone for its cutover check (the slowest of them is what one member costs) and
// then the fleet's check at one T; it reports the fleet point's pause (the slowest
// member's, median over rounds) and the fleet check's wall time against the slowest
// single member's (median ratio; target <= 1.25).
func BenchmarkFleetCutover(b *testing.B) {
	e := newFleetEnv(b, 4, 20*time.Second)
	for i, m := range e.members {
		e.start(m, m.name+"a", i == 0)
	}
	e.withStandby(e.members[0])
	f := e.open(e.writeFleetFile(nil))
	e.waitApplying(f)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	if v, err := f.Verify(ctx, fleet.VerifyRequest{Scope: "full"}); err != nil || v.Result != "equal" {
		b.Fatalf("the fleet's full verification: %+v %v", v, err)
	}
	for _, d := range e.ended {
		<-d
	}
	rounds := max(b.N, 5)
	var ratios, pauses, walls, singles []float64
	for range rounds {
		var slowest time.Duration
		for _, m := range e.members {
			addr := m.daemons[0].apiAddr
			if len(m.daemons) > 1 {
				if st := f.Status(ctx); st.Members[0].Addr != "" {
					addr = st.Members[0].Addr
				}
			}
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			r, err := parityv1.NewParityClient(conn).CutoverCheck(ctx, &parityv1.CutoverCheckRequest{
				Upstream: &parityv1.CutoverCheckRequest_Now{Now: true}, Tables: []string{m.db + ".*"}})
			took := time.Since(start)
			conn.Close()
			if err != nil || !r.GetPassed() {
				b.Fatalf("member %s alone: %v %v", m.name, r.GetFailures(), err)
			}
			slowest = max(slowest, took)
		}
		c, err := f.CutoverCheck(ctx, fleet.CutoverRequest{})
		if err != nil || !c.Passed {
			b.Fatalf("the fleet's cutover check: %+v %v", c, err)
		}
		ratios = append(ratios, c.Took.Seconds()/slowest.Seconds())
		pauses = append(pauses, float64(c.MaxPause.Microseconds())/1000)
		walls = append(walls, float64(c.Took.Milliseconds()))
		singles = append(singles, float64(slowest.Milliseconds()))
		b.Logf("round: fleet check %v at T %d (%d attempt(s)), slowest single member %v, ratio %.2f, fleet point pause (slowest member) %v",
			c.Took.Round(time.Millisecond), c.T, c.Attempts, slowest.Round(time.Millisecond), c.Took.Seconds()/slowest.Seconds(), c.MaxPause.Round(time.Millisecond))
	}
	b.ReportMetric(median(ratios), "fleet/slowest-member")
	b.ReportMetric(median(pauses), "pause-ms")
	b.ReportMetric(median(walls), "fleet-ms")
	b.ReportMetric(median(singles), "slowest-member-ms")
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}
