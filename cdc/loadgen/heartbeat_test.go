package loadgen

import (
	"context"
	"testing"
	"time"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/internal/testenv"
)

// TestHeartbeatAfterWorkload: with Heartbeat, a workload that ended by its transaction
// limit is followed, on real Kafka, by resolved events that keep advancing on every
// partition past TiDB's TSO of after the workload (what `parity wait-applied --now`
// waits for once the writes stopped), with no row after the workload's final resolved
// ts; the run ends, without error, only when its context does. Without the heartbeat a
// consumer never saw a TSO after the workload's last resolved: a wait for TiDB's current
// TSO timed out.
func TestHeartbeatAfterWorkload(t *testing.T) {
	up := testenv.Upstream(t)
	const partitions = 2
	topic := testenv.NewTopic(t, "lgbeat", partitions)
	cfg := DefaultConfig()
	cfg.Upstream = testenv.Require(t, testenv.EnvUpstream)
	cfg.Brokers = []string{testenv.Kafka(t)}
	cfg.Topic = topic
	cfg.Database = up.Name
	cfg.Tables, cfg.AllTypes, cfg.Keyless = 1, false, false
	cfg.Workers, cfg.Transactions = 2, 20
	cfg.ResolvedInterval = 200 * time.Millisecond
	cfg.Heartbeat = true
	ended := make(chan Result, 1)
	cfg.WorkloadEnded = func(r Result) { ended <- r }

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	type outcome struct {
		res Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := Run(rctx, cfg)
		done <- outcome{res, err}
	}()

	var workload Result
	select {
	case workload = <-ended:
	case o := <-done:
		t.Fatalf("Run returned before its workload ended: %+v, %v", o.res, o.err)
	case <-ctx.Done():
		t.Fatal("the workload did not end within 3 minutes")
	}
	if workload.Transactions != 20 || workload.ResolvedTs <= workload.StartTs {
		t.Fatalf("the workload: %+v", workload)
	}
	// TiDB's TSO now, after the writes: the quiescent point a cutover waits for.
	quiet := testenv.TiDBTSO(t, up.DB)

	dec, err := open.NewDecoder(open.DefaultDecoderConfig())
	if err != nil {
		t.Fatal(err)
	}
	// resolvedAfter returns, per partition, the resolved ts published after the
	// workload's final one, in order; a row event after it fails the test.
	resolvedAfter := func() [][]uint64 {
		out := make([][]uint64, partitions)
		for p, msgs := range testenv.ReadTopic(t, testenv.Kafka(t), topic, partitions) {
			final := false
			for _, m := range msgs {
				evs, err := dec.Decode(m.Key, m.Value)
				if err != nil {
					t.Fatalf("decode partition %d offset %d: %v", p, m.Offset, err)
				}
				for _, ev := range evs {
					switch {
					case ev.Kind == open.KindResolved && ev.CommitTs == workload.ResolvedTs:
						final = true
					case final && ev.Kind != open.KindResolved:
						t.Fatalf("partition %d offset %d: a %v event (commit ts %d) after the workload's final resolved ts %d",
							p, m.Offset, ev.Kind, ev.CommitTs, workload.ResolvedTs)
					case final:
						out[p] = append(out[p], ev.CommitTs)
					}
				}
			}
			if !final {
				t.Fatalf("partition %d has no resolved event at the workload's final resolved ts %d", p, workload.ResolvedTs)
			}
		}
		return out
	}
	var seen [][]uint64
	deadline := time.Now().Add(60 * time.Second)
	for {
		seen = resolvedAfter()
		covered := true
		for _, ts := range seen {
			covered = covered && len(ts) >= 3 && ts[len(ts)-1] >= quiet
		}
		if covered {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("60s after the workload ended, the resolved ts per partition since its final %d: %v; want 3 or more, the last past TiDB's TSO %d",
				workload.ResolvedTs, seen, quiet)
		}
		time.Sleep(500 * time.Millisecond)
	}
	for p, ts := range seen {
		prev := workload.ResolvedTs
		for _, v := range ts {
			if v <= prev {
				t.Fatalf("partition %d: resolved ts %d after %d: not advancing (%v)", p, v, prev, ts)
			}
			prev = v
		}
	}
	// Still advancing a moment later.
	last := seen[0][len(seen[0])-1]
	time.Sleep(time.Second)
	if again := resolvedAfter(); again[0][len(again[0])-1] <= last {
		t.Fatalf("partition 0's resolved ts stayed at %d for a second: %v", last, again[0])
	}
	select {
	case o := <-done:
		t.Fatalf("Run returned while the heartbeat should run: %+v, %v", o.res, o.err)
	default:
	}

	stop()
	select {
	case o := <-done:
		if o.err != nil {
			t.Fatalf("Run stopped with %v; a heartbeat that ends with its context is not an error", o.err)
		}
		if o.res.ResolvedTs < last || o.res.Transactions != 20 {
			t.Fatalf("Run's result %+v: want 20 transactions and the last heartbeat (>= %d)", o.res, last)
		}
		t.Logf("workload: %d transactions, final resolved ts %d; heartbeats to %d (TiDB's TSO after the workload: %d)",
			workload.Transactions, workload.ResolvedTs, o.res.ResolvedTs, quiet)
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30s of its context ending")
	}
}
