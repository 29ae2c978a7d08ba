package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/tidb-parity/parity/api/client"
	parityv1 "github.com/tidb-parity/parity/api/parity/v1"
	"github.com/tidb-parity/parity/cdc/loadgen"
	"github.com/tidb-parity/parity/fleet"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/testenv"
)

// fleetEnv is a fleet on one machine: N fallback servers (scripts/env's fleet1..fleetN),
// a schema each, loaded through a topic of its own, and a `parity serve` per fallback
// (this test binary re-executed as parity; member m1 with a standby).
type fleetEnv struct {
	t       testing.TB
	dir     string
	upDSN   string
	broker  string
	members []*fleetMember
	loads   []*testLoad
	ended   []chan struct{} // closed when each load's workload ended (heartbeat goes on)
	file    string          // the fleet file
}

// fleetMember is one fallback and its daemons.
type fleetMember struct {
	name, db, topic, meta string
	downDSN               string
	down                  *sql.DB
	daemons               []*haProc // [0] active at the start; [1] its standby (m1 only)
	base                  string
}

func newFleetEnv(t testing.TB, n int, workload time.Duration) *fleetEnv {
	t.Helper()
	dsns := strings.Split(testenv.Require(t, "PARITY_TEST_FLEET_DSNS"), ",")
	if len(dsns) < n {
		t.Fatalf("PARITY_TEST_FLEET_DSNS has %d fallbacks, the test needs %d (PARITY_FALLBACKS)", len(dsns), n)
	}
	e := &fleetEnv{t: t, dir: t.TempDir(), upDSN: testenv.Require(t, testenv.EnvUpstream), broker: testenv.Kafka(t)}
	prefix := testenv.UniqueName("fl")
	for i := range n {
		m := &fleetMember{name: fmt.Sprintf("m%d", i+1), db: fmt.Sprintf("%s_s%d", prefix, i+1), downDSN: dsns[i],
			meta: testenv.UniqueName("pm")}
		d, err := sql.Open("mysql", m.downDSN)
		if err != nil {
			t.Fatal(err)
		}
		m.down = d
		t.Cleanup(func() {
			_, _ = d.Exec("DROP DATABASE IF EXISTS " + ident.Quote(m.meta))
			d.Close()
		})
		e.members = append(e.members, m)
	}
	// One changefeed, each schema routed to its own topic (TiCDC's topic = "…{schema}"
	// dispatcher): a fallback per topic. The workload runs for workload, then keeps the
	// topics' resolved ts moving (writes stopped: the cutover). No import: each topic
	// carries its schema's CREATE DATABASE and CREATE TABLE.
	done := make(chan struct{})
	var topicOf func(string) string
	var schemas []string
	for _, m := range e.members {
		schemas = append(schemas, m.db)
	}
	l := startLoad(t, context.Background(), e.upDSN, e.members[0].downDSN, e.broker, prefix+"_{schema}", "", func(lg *loadgen.Config) {
		lg.Database, lg.Databases, lg.Partitions = "", schemas, 2
		lg.Tables, lg.Workers, lg.ImportRows = 2, 2, 0
		lg.Rate, lg.RowsPerTxn = 40, 3
		lg.Duration, lg.Heartbeat = workload, true
		lg.WorkloadEnded = func(loadgen.Result) { close(done) }
		topicOf = lg.TopicOf
		for _, s := range lg.Schemas() {
			if err := loadgen.CreateTopic(context.Background(), lg.Brokers, lg.TopicOf(s), lg.Partitions); err != nil {
				t.Fatal(err)
			}
		}
	})
	e.loads, e.ended = append(e.loads, l), append(e.ended, done)
	for _, m := range e.members {
		m.topic = topicOf(m.db)
		t.Cleanup(func() {
			up, err := sql.Open("mysql", e.upDSN)
			if err == nil {
				_, _ = up.Exec("DROP DATABASE IF EXISTS " + ident.Quote(m.db))
				up.Close()
			}
			_, _ = m.down.Exec("DROP DATABASE IF EXISTS " + ident.Quote(m.db))
		})
		m.base = fmt.Sprintf(`[changefeed]
id = %q
brokers = [%q]
topics = [%q]
start-ts = %d
[upstream]
dsn = %q
[downstream]
dsn = %q
[applier]
meta-schema = %q
spill-dir = %q
[verify]
enabled = true
tables = [%q]
[bypass]
enabled = true
server-id = %d
schemas = [%q]
[log]
level = "info"
`, "fleet-"+m.name, e.broker, m.topic, 0, e.upDSN, m.downDSN, m.meta, filepath.Join(e.dir, m.name+"-spill"),
			m.db+".*", 700000+len(e.members)*1000+int(time.Now().UnixNano()%997)+int(m.name[1]), m.db)
	}
	return e
}

// start starts a daemon of member m (with ha when withHA).
func (e *fleetEnv) start(m *fleetMember, name string, withHA bool) *haProc {
	e.t.Helper()
	statusAddr, apiAddr := freeAddr(e.t), freeAddr(e.t)
	cfg := strings.Replace(m.base, "spill-dir = ", fmt.Sprintf("spill-dir = %q\n#", filepath.Join(e.dir, name+"-spill")), 1) +
		fmt.Sprintf("[status]\naddr = %q\n[api]\naddr = %q\n", statusAddr, apiAddr)
	if withHA {
		cfg += fmt.Sprintf("[ha]\nenabled = true\ninstance = %q\ntakeover = \"5s\"\n", name)
	}
	p := startDaemon(e.t, e.dir, name, statusAddr, apiAddr, cfg)
	m.daemons = append(m.daemons, p)
	return p
}

// fleetAPI starts `parity fleet serve` over the fleet file and returns its client.
func (e *fleetEnv) fleetAPI(path string) parityv1.FleetClient {
	e.t.Helper()
	addr := freeAddr(e.t)
	p := startParity(e.t, "fleet serve", nil, "fleet", "serve", "--fleet", path, "--addr", addr)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { conn.Close() })
	hc := healthpb.NewHealthClient(conn)
	for deadline := time.Now().Add(30 * time.Second); ; {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			break
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("parity fleet serve did not serve: %v\n%s", err, p.stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	return parityv1.NewFleetClient(conn)
}

// withStandby starts m's standby once its first daemon holds the lease.
func (e *fleetEnv) withStandby(m *fleetMember) {
	e.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		st, _, err := fetchStatus(ctx, m.daemons[0].statusAddr)
		cancel()
		if err == nil && st.HA != nil && st.HA.Role == "active" {
			break
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s did not take the lease: %v", m.daemons[0].name, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	e.start(m, m.name+"b", true)
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// writeFleetFile writes the fleet file: each member owns its schema.
func (e *fleetEnv) writeFleetFile(edit func(m *fleetMember) (owns []string)) string {
	e.t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "[fleet]\nname = \"test-estate\"\ntables = [%q]\nfailover = \"45s\"\n", strings.SplitN(e.members[0].db, "_s", 2)[0]+"_s*.*")
	for _, m := range e.members {
		var addrs []string
		for _, d := range m.daemons {
			addrs = append(addrs, fmt.Sprintf("%q", d.apiAddr))
		}
		owns := []string{m.db + ".*"}
		if edit != nil {
			owns = edit(m)
		}
		var quoted []string
		for _, o := range owns {
			quoted = append(quoted, fmt.Sprintf("%q", o))
		}
		fmt.Fprintf(&b, "[[member]]\nname = %q\naddrs = [%s]\nowns = [%s]\n", m.name, strings.Join(addrs, ", "), strings.Join(quoted, ", "))
	}
	path := filepath.Join(e.dir, fmt.Sprintf("fleet-%d.toml", time.Now().UnixNano()))
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		e.t.Fatal(err)
	}
	return path
}

func (e *fleetEnv) open(path string) *fleet.Fleet {
	e.t.Helper()
	cfg, err := fleet.Load(path)
	if err != nil {
		e.t.Fatal(err)
	}
	f, err := fleet.Open(cfg, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(f.Close)
	return f
}

// waitApplying waits until every member answers as active with an applied checkpoint.
func (e *fleetEnv) waitApplying(f *fleet.Fleet) fleet.Status {
	e.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		st := f.Status(ctx)
		cancel()
		ok := st.Unreachable == 0
		for _, m := range st.Members {
			ok = ok && m.State == "running" && m.AppliedTS > 0
		}
		if ok {
			return st
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("the fleet's members are not all applying: %+v", st)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// fleetCLI runs `parity fleet args...` to its end: its output (stdout, then stderr)
// and exit code.
func fleetCLI(t *testing.T, args ...string) (string, int) {
	t.Helper()
	p := runParity(t, "fleet "+args[0], nil, append([]string{"fleet"}, args...)...)
	return p.stdout.String() + p.stderr.String(), p.code
}

// TestFleetVerifyAndCutover (#31): four fallbacks, four members (m1 with a standby),
// four schemas loaded through four topics. Under load a fleet full verification at one
// T is equal, every member's pair at T; a divergence injected into two members'
// fallbacks (rows nothing else touches) is found and named by member, table, key, kind
// and class; repaired; once writes stopped a fleet cutover-check passes at one T with
// per-member evidence; a second one with m1's active daemon SIGKILLed mid-check either
// passes with m1 (its standby answering) or fails naming m1 — never passes without it.
// A table owned by no member, or by two, makes the fleet refuse to answer, naming it.
func TestFleetVerifyAndCutover(t *testing.T) {
	e := newFleetEnv(t, 4, 50*time.Second)
	for i, m := range e.members {
		e.start(m, m.name+"a", i == 0)
	}
	m1 := e.members[0]
	e.withStandby(m1)
	path := e.writeFleetFile(nil)
	f := e.open(path)
	st := e.waitApplying(f)
	t.Logf("fleet status: lag %.2fs (worst %s)", st.Lag, st.WorstMember)
	if out, code := fleetCLI(t, "status", "--fleet", path); code != 0 || !strings.Contains(out, "fleet test-estate") || strings.Count(out, "running") < 4 {
		t.Fatalf("parity fleet status: exit %d\n%s", code, out)
	} else {
		t.Logf("parity fleet status:\n%s", out)
	}

	// Ownership: a table owned by no member, or by two, is refused, named.
	unowned := e.writeFleetFile(func(m *fleetMember) []string {
		if m == e.members[3] {
			return []string{m.db + ".sbtest1"}
		}
		return []string{m.db + ".*"}
	})
	if out, code := fleetCLI(t, "verify", "--fleet", unowned); code != 2 || !strings.Contains(out, "table "+e.members[3].db+".sbtest2 is owned by no member") {
		t.Fatalf("a table owned by no member: exit %d\n%s", code, out)
	}
	shared := e.writeFleetFile(func(m *fleetMember) []string {
		if m == e.members[1] {
			return []string{m.db + ".*", e.members[2].db + ".sbtest1"}
		}
		return []string{m.db + ".*"}
	})
	if out, code := fleetCLI(t, "cutover-check", "--fleet", shared); code != 2 || !strings.Contains(out, "table "+e.members[2].db+".sbtest1 is owned by m2 and m3") {
		t.Fatalf("a table owned by two members: exit %d\n%s", code, out)
	}

	// A fleet full verification under load: equal, at one T.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	v, err := f.Verify(ctx, fleet.VerifyRequest{Scope: "full"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("fleet verification under load: %s at T %d in %d attempt(s), slowest pause %v, took %v", v.Result, v.T, v.Attempts, v.MaxPause, v.Took)
	if v.Result != "equal" {
		t.Fatalf("fleet verification under load: %+v", v)
	}
	for _, mr := range v.Members {
		if mr.PairTS != v.T || mr.Keys == 0 || mr.PairPosition == "" {
			t.Fatalf("member %s: pair %d (T %d), %d keys, position %q", mr.Member, mr.PairTS, v.T, mr.Keys, mr.PairPosition)
		}
	}

	// One divergence in each of two members' fallbacks, on rows the load never touches
	// (its ids stay below its next id): a row only m2's fallback has, and on m3 a row
	// both sides hold, changed straight in the fallback.
	m2, m3 := e.members[1], e.members[2]
	if _, err := m2.down.Exec("INSERT INTO " + ident.Quote(m2.db) + ".sbtest1 (id, k, c, pad) VALUES (900001, 1, 'only in the fallback', 'x')"); err != nil {
		t.Fatal(err)
	}
	// (loadgen publishes only its own transactions: the row is written to both sides, as
	// an import would, then changed in the fallback.)
	up := openSchema(t, e.upDSN, m3.db)
	for _, db := range []*sql.DB{up, m3.down} {
		if _, err := db.Exec("INSERT INTO " + ident.Quote(m3.db) + ".sbtest2 (id, k, c, pad) VALUES (900002, 2, 'from TiDB', 'y')"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m3.down.Exec("UPDATE " + ident.Quote(m3.db) + ".sbtest2 SET c = 'changed in the fallback' WHERE id = 900002"); err != nil {
		t.Fatal(err)
	}
	v, err = f.Verify(ctx, fleet.VerifyRequest{Scope: "full"})
	if err != nil {
		t.Fatal(err)
	}
	out := func(d fleet.Difference) string {
		return fmt.Sprintf("%s %s %s %s %s", d.Member, d.Table, d.Key, d.Kind, d.Class)
	}
	var got []string
	for _, d := range v.Differences {
		got = append(got, out(d))
	}
	t.Logf("fleet verification after the injections: %s at T %d: %q", v.Result, v.T, got)
	want := []string{
		fmt.Sprintf("m2 %s.sbtest1 id=900001 extra bypass", m2.db),
		fmt.Sprintf("m3 %s.sbtest2 id=900002 differing bypass", m3.db),
	}
	if v.Result != "different" || len(got) != 2 || !containsAll(got, want) {
		t.Fatalf("fleet verification after the injections: %s, differences %q, want %q", v.Result, got, want)
	}
	for _, mr := range v.Members {
		if mr.PairTS != v.T {
			t.Fatalf("member %s: pair %d, T %d", mr.Member, mr.PairTS, v.T)
		}
	}
	// The fleet's status names the bypass writes by member.
	st = f.Status(ctx)
	for _, ms := range st.Members {
		want := int64(0)
		if ms.Member == "m2" || ms.Member == "m3" {
			want = 1
		}
		if ms.Bypass != "reading" || (want > 0) != (ms.Detections > 0) {
			t.Fatalf("member %s: bypass %q with %d detections, want reading with detections: %v", ms.Member, ms.Bypass, ms.Detections, want > 0)
		}
	}
	// Repaired, each through its member's API.
	for _, mr := range v.Members {
		if mr.Result != "different" {
			continue
		}
		conn, err := grpc.NewClient(mr.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		r, err := parityv1.NewParityClient(conn).Repair(ctx, &parityv1.RepairRequest{Diff: "diffs/" + mr.RunID})
		conn.Close()
		if err != nil || r.GetRefused() > 0 || r.GetUpserted()+r.GetDeleted() != 1 || r.GetVerifyResult() != parityv1.DiffResult_DIFF_RESULT_EQUAL {
			t.Fatalf("repairing %s's run %s: %v %v", mr.Member, mr.RunID, r, err)
		}
		t.Logf("member %s repaired: %d upserted, %d deleted, verified %s", mr.Member, r.GetUpserted(), r.GetDeleted(), r.GetVerifyResult())
	}

	// Writes stop (the workloads end; resolved ts keeps moving): the fleet cutover check.
	for _, d := range e.ended {
		select {
		case <-d:
		case <-time.After(3 * time.Minute):
			t.Fatal("the workloads did not end")
		}
	}
	c, err := f.CutoverCheck(ctx, fleet.CutoverRequest{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("fleet cutover check: passed %v at T %d in %d attempt(s); slowest pause %v, slowest member %v, fleet %v (%.2fx)",
		c.Passed, c.T, c.Attempts, c.MaxPause, c.Slowest, c.Took, c.Took.Seconds()/c.Slowest.Seconds())
	if !c.Passed || len(c.Members) != 4 || len(c.Tables) < 8 {
		t.Fatalf("fleet cutover check: %+v", c)
	}
	owned := map[string]int{}
	for _, m := range c.Tables {
		owned[m]++
	}
	for _, mr := range c.Members {
		if mr.Result != "passed" || mr.PairTS != c.T || mr.PairPosition == "" || len(mr.Tables) != owned[mr.Member] {
			t.Fatalf("member %s's evidence (owns %d tables): %+v", mr.Member, owned[mr.Member], mr)
		}
	}
	if out, code := fleetCLI(t, "cutover-check", "--fleet", path); code != 0 || !strings.Contains(out, "PASSED at T") {
		t.Fatalf("parity fleet cutover-check: exit %d\n%s", code, out)
	} else {
		t.Logf("parity fleet cutover-check:\n%s", out)
	}

	// The same through the Fleet API (parity fleet serve), as a runbook calls it.
	fc := e.fleetAPI(path)
	fst, err := fc.GetFleetStatus(ctx, &parityv1.GetFleetStatusRequest{})
	if err != nil || len(fst.GetMembers()) != 4 || fst.GetUnreachable() != 0 {
		t.Fatalf("GetFleetStatus: %v %v", fst, err)
	}
	t.Logf("GetFleetStatus:\n%s", protojson.Format(fst))
	fcr, err := fc.FleetCutoverCheck(ctx, &parityv1.FleetCutoverCheckRequest{})
	if err != nil || !fcr.GetPassed() || len(fcr.GetMembers()) != 4 {
		t.Fatalf("FleetCutoverCheck: %v %v", fcr, err)
	}
	for _, mr := range fcr.GetMembers() {
		if mr.GetPairTs() != fcr.GetT() || mr.GetResult() != "passed" {
			t.Fatalf("FleetCutoverCheck's member %s: %v", mr.GetMember(), mr)
		}
	}
	t.Logf("FleetCutoverCheck:\n%s", protojson.Format(fcr))
	fv, err := fc.VerifyFleet(ctx, &parityv1.VerifyFleetRequest{Scope: "full"})
	if err != nil || fv.GetResult() != "equal" || len(fv.GetMembers()) != 4 {
		t.Fatalf("VerifyFleet: %v %v", fv, err)
	}
	for _, mr := range fv.GetMembers() {
		if mr.GetPairTs() != fv.GetT() {
			t.Fatalf("VerifyFleet's member %s at %d, T %d", mr.GetMember(), mr.GetPairTs(), fv.GetT())
		}
	}
	t.Logf("VerifyFleet:\n%s", protojson.Format(fv))
	if _, err := fc.VerifyFleet(ctx, &parityv1.VerifyFleetRequest{MaxRowsPerSecond: -1}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("VerifyFleet with a negative rate: %v", err)
	}
	{
		// A fleet file whose ownership is wrong: FAILED_PRECONDITION, FLEET_OWNERSHIP, naming the table.
		bad := e.fleetAPI(unowned)
		_, err := bad.FleetCutoverCheck(ctx, &parityv1.FleetCutoverCheckRequest{})
		if r, _ := client.ReasonOf(err); status.Code(err) != codes.FailedPrecondition || r != "FLEET_OWNERSHIP" || !strings.Contains(err.Error(), e.members[3].db+".sbtest2 is owned by no member") {
			t.Fatalf("FleetCutoverCheck over a table owned by no member: %v", err)
		}
	}

	// m1's active daemon SIGKILLed mid-check: its standby takes over; the check never
	// passes without m1.
	active := m1.daemons[0]
	g, gctx := errgroup.WithContext(ctx)
	var killed fleet.CutoverResult
	g.Go(func() error {
		var err error
		killed, err = f.CutoverCheck(gctx, fleet.CutoverRequest{})
		return err
	})
	time.Sleep(300 * time.Millisecond)
	if err := active.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := g.Wait(); err != nil {
		t.Logf("fleet cutover check with m1a killed: %v (no answer, naming m1: %v)", err, strings.Contains(err.Error(), "m1"))
		if !strings.Contains(err.Error(), "m1") {
			t.Fatalf("the check failed without naming m1: %v", err)
		}
		return
	}
	var m1run fleet.MemberRun
	for _, mr := range killed.Members {
		if mr.Member == "m1" {
			m1run = mr
		}
	}
	t.Logf("fleet cutover check with m1a SIGKILLed: passed %v at T %d in %d attempt(s); m1 answered by %s (%s); failures %q",
		killed.Passed, killed.T, killed.Attempts, m1run.Addr, m1run.Result, killed.Failures)
	switch {
	case killed.Passed && (m1run.Result != "passed" || m1run.Addr != m1.daemons[1].apiAddr || m1run.PairTS != killed.T):
		t.Fatalf("passed without m1's standby answering at T: %+v", m1run)
	case !killed.Passed && !strings.Contains(strings.Join(killed.Failures, "\n"), "member m1"):
		t.Fatalf("failed without naming m1: %q", killed.Failures)
	}
}

func containsAll(got, want []string) bool {
	for _, w := range want {
		if !containsPrefix(got, w) {
			return false
		}
	}
	return true
}

func containsPrefix(got []string, p string) bool {
	for _, g := range got {
		if strings.HasPrefix(g, p) {
			return true
		}
	}
	return false
}
