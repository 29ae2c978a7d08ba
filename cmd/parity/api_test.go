package main

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tidb-parity/parity/api"
	"github.com/tidb-parity/parity/api/client"
	parityv1 "github.com/tidb-parity/parity/api/parity/v1"
	"github.com/tidb-parity/parity/cdc/loadgen"
	"github.com/tidb-parity/parity/daemon"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/testenv"
)

// freeAddr returns a free loopback address.
func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// apiErr checks a call's status code, ErrorInfo reason and (when set) metadata.
func apiErr(t *testing.T, what string, err error, code codes.Code, reason string, md map[string]string) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("%s: %v, want %v", what, err, code)
	}
	r, got := client.ReasonOf(err)
	if r != reason {
		t.Fatalf("%s: reason %q (%v), want %q", what, r, err, reason)
	}
	for k, v := range md {
		if got[k] != v {
			t.Fatalf("%s: metadata %v, want %s=%q", what, got, k, v)
		}
	}
}

// TestAPIUnderLoad (#18 items 1-2): loadgen runs transactions on TiDB, published through
// real Kafka into an in-process `parity serve` with verification and the gRPC API on a
// free loopback port. A Go client: health is SERVING while it replicates, reflection
// lists parity.v1.Parity; GetStatus, WatchStatus (three messages, the checkpoint moving
// on), WaitForApplied(now); after divergences injected into the fallback, StartDiff full
// → WatchDiff to its end (DIFFERENT) → GetDiff, CreateSnapshotPoint (and one past GC:
// TSO_PAST_GC), ListDiffs paged (a token reused with another filter is
// INVALID_ARGUMENT), ListDifferences filtered by kind and paged, GetFixSQL, Repair (dry
// run, then for real: re-verified EQUAL), CutoverCheck (passing, and failing on age),
// CancelDiff; errors: an unknown run NOT_FOUND with DIFF_NOT_FOUND naming it, a bad
// scope and table pattern INVALID_ARGUMENT naming the field, a WaitForApplied timeout
// DEADLINE_EXCEEDED; the calls counted in /metrics.
func TestAPIUnderLoad(t *testing.T) {
	upDSN := testenv.Require(t, testenv.EnvUpstream)
	down := testenv.Downstream(t)
	broker := testenv.Kafka(t)
	topic := testenv.NewTopic(t, "api", 2)
	db := testenv.UniqueName("api")
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()

	up, err := sql.Open("mysql", upDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	load := startLoad(t, ctx, upDSN, down.Root, broker, topic, db, func(lg *loadgen.Config) {
		lg.Tables, lg.Workers, lg.ImportRows = 2, 4, 1000
		lg.Rate, lg.RowsPerTxn = 200, 10
	})
	cfg := verifyServeConfig(t, "api-load", upDSN, down, broker, topic, db, load.ImportTs)
	cfg.API.Addr = freeAddr(t)
	cfg.API.StopTimeout = 5 * time.Second
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	srv := runServeInTest(t, ctx, cfg)
	defer srv.Close()

	conn, err := grpc.NewClient(cfg.API.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := parityv1.NewParityClient(conn)

	// Caught up.
	var st *parityv1.Status
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		st, err = c.GetStatus(ctx, &parityv1.GetStatusRequest{})
		if err == nil && st.AppliedTs > load.ImportTs && st.AppliedLagSeconds < 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve did not catch up within 90s: %v, %v", st, err)
		}
	}
	if st.Changefeed != "api-load" || st.ApplierState != parityv1.ApplierState_APPLIER_STATE_RUNNING || !st.Verification.GetEnabled() ||
		len(st.Partitions) != 2 || st.RowsApplied == 0 || st.AppliedTime == nil || st.ResolvedTs < st.AppliedTs {
		t.Fatalf("status: %v", st)
	}

	// Health (it follows the applier's state within half a second) and reflection.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		hr, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: api.ServiceName})
		if err == nil && hr.Status == healthpb.HealthCheckResponse_SERVING {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("health while replicating: %v, %v", hr, err)
		}
	}
	rc, err := rpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Send(&rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	rr, err := rc.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var services []string
	for _, s := range rr.GetListServicesResponse().GetService() {
		services = append(services, s.Name)
	}
	if !strings.Contains(" "+strings.Join(services, " ")+" ", " parity.v1.Parity ") {
		t.Fatalf("reflection lists %v", services)
	}
	_ = rc.CloseSend()

	// WatchStatus: three messages a second apart, the checkpoint moving on under load.
	wctx, wcancel := context.WithCancel(ctx)
	ws, err := c.WatchStatus(wctx, &parityv1.WatchStatusRequest{Interval: durationpb.New(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	var watched []*parityv1.Status
	for len(watched) < 3 {
		m, err := ws.Recv()
		if err != nil {
			t.Fatal(err)
		}
		watched = append(watched, m)
	}
	wcancel()
	if watched[2].AppliedTs <= watched[0].AppliedTs || watched[2].UpdateTime.AsTime().Sub(watched[0].UpdateTime.AsTime()) < 1500*time.Millisecond {
		t.Fatalf("watched status did not move on: %v .. %v", watched[0], watched[2])
	}

	// Divergences in the fallback, on rows loadgen never touches.
	exec := func(d *sql.DB, q string) {
		t.Helper()
		if _, err := d.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	tbl := func(name string) string { return ident.Table(db, name) }
	for _, side := range []*sql.DB{up, down.DB} {
		exec(side, "INSERT INTO "+tbl("sbtest1")+" (id, k, c, pad) VALUES (50000001, 1, 'one', 'p1'), (50000002, 2, 'two', 'p2')")
		exec(side, "INSERT INTO "+tbl("sbtest2")+" (id, k, c, pad) VALUES (50000001, 1, 'one', 'p1')")
	}
	exec(down.DB, "UPDATE "+tbl("sbtest1")+" SET c = 'diverged' WHERE id = 50000001")
	exec(down.DB, "INSERT INTO "+tbl("sbtest1")+" (id, k, c, pad) VALUES (50000010, 10, 'extra', 'p10')")
	exec(down.DB, "UPDATE "+tbl("sbtest2")+" SET pad = 'diverged' WHERE id = 50000001")

	// WaitForApplied(now): the applier is past TiDB's writes above.
	written := testenv.TiDBTSO(t, up)
	w, err := c.WaitForApplied(ctx, &parityv1.WaitForAppliedRequest{Target: &parityv1.WaitForAppliedRequest_Now{Now: true},
		Timeout: durationpb.New(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	if w.TargetTs < written || w.AppliedTs < w.TargetTs || w.Waited == nil {
		t.Fatalf("WaitForApplied(now) after ts %d: %v", written, w)
	}
	_, err = c.WaitForApplied(ctx, &parityv1.WaitForAppliedRequest{Target: &parityv1.WaitForAppliedRequest_Ts{Ts: w.TargetTs + 1<<40},
		Timeout: durationpb.New(300 * time.Millisecond)})
	apiErr(t, "WaitForApplied beyond", err, codes.DeadlineExceeded, "DEADLINE", nil)

	// CreateSnapshotPoint: at the resolved ts, and refused at a TSO GC has passed.
	sp, err := c.CreateSnapshotPoint(ctx, &parityv1.CreateSnapshotPointRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if sp.Ts < w.TargetTs || sp.PositionSource != "gtid_binlog_pos" || sp.DownstreamPosition == "" || strings.Contains(sp.DownstreamPosition, "mariadb") ||
		sp.Pause == nil || sp.CreateTime == nil || sp.TsTime == nil {
		t.Fatalf("snapshot point: %v", sp)
	}
	old := uint64(1) << 18
	_, err = c.CreateSnapshotPoint(ctx, &parityv1.CreateSnapshotPointRequest{AtTs: &old})
	apiErr(t, "a snapshot point past GC", err, codes.FailedPrecondition, "TSO_PAST_GC", map[string]string{"ts": "262144"})

	// StartDiff full, watched to its end.
	d, err := c.StartDiff(ctx, &parityv1.StartDiffRequest{Scope: "full"})
	if err != nil {
		t.Fatal(err)
	}
	if d.Name != "diffs/"+d.RunId || d.Trigger != "manual" || (d.State != parityv1.DiffState_DIFF_STATE_RUNNING && d.State != parityv1.DiffState_DIFF_STATE_QUEUED) {
		t.Fatalf("started: %v", d)
	}
	wd, err := c.WatchDiff(ctx, &parityv1.WatchDiffRequest{Name: d.Name, Interval: durationpb.New(200 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	var last *parityv1.Diff
	var updates, withProgress int
	for {
		m, err := wd.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		updates++
		if m.Progress != nil {
			withProgress++
		}
		last = m
	}
	if last == nil || last.State != parityv1.DiffState_DIFF_STATE_DONE || last.Result != parityv1.DiffResult_DIFF_RESULT_DIFFERENT ||
		last.Differences != 3 || last.TablesCompared != 4 || len(last.Pairs) == 0 || last.Pairs[0].PositionSource != "gtid_binlog_pos" ||
		last.FirstTs < w.TargetTs || last.Progress != nil {
		t.Fatalf("the run as it ended (%d updates): %v", updates, last)
	}
	if updates < 2 || withProgress == 0 {
		t.Errorf("WatchDiff sent %d updates, %d with progress", updates, withProgress)
	}
	g, err := c.GetDiff(ctx, &parityv1.GetDiffRequest{Name: d.RunId}) // a bare id is accepted
	if err != nil {
		t.Fatal(err)
	}
	if g.RunId != d.RunId || g.Result != last.Result || g.Differences != last.Differences || len(g.TableResults) != 4 {
		t.Fatalf("GetDiff: %v", g)
	}

	// A second run, of one table, to page through.
	d2, err := c.StartDiff(ctx, &parityv1.StartDiffRequest{Tables: []string{db + ".sbtest2"}})
	if err != nil {
		t.Fatal(err)
	}
	for {
		g2, err := c.GetDiff(ctx, &parityv1.GetDiffRequest{Name: d2.Name})
		if err != nil {
			t.Fatal(err)
		}
		if g2.State != parityv1.DiffState_DIFF_STATE_RUNNING && g2.State != parityv1.DiffState_DIFF_STATE_QUEUED {
			if g2.Result != parityv1.DiffResult_DIFF_RESULT_DIFFERENT || g2.TablesCompared != 1 {
				t.Fatalf("second run: %v", g2)
			}
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	p1, err := c.ListDiffs(ctx, &parityv1.ListDiffsRequest{PageSize: 1, Trigger: "manual"})
	if err != nil {
		t.Fatal(err)
	}
	if len(p1.Diffs) != 1 || p1.Diffs[0].RunId != d2.RunId || p1.NextPageToken == "" {
		t.Fatalf("ListDiffs page 1: %v", p1)
	}
	p2, err := c.ListDiffs(ctx, &parityv1.ListDiffsRequest{PageSize: 1, Trigger: "manual", PageToken: p1.NextPageToken})
	if err != nil {
		t.Fatal(err)
	}
	if len(p2.Diffs) != 1 || p2.Diffs[0].RunId != d.RunId || p2.NextPageToken != "" {
		t.Fatalf("ListDiffs page 2: %v", p2)
	}
	_, err = c.ListDiffs(ctx, &parityv1.ListDiffsRequest{PageSize: 1, Trigger: "nightly", PageToken: p1.NextPageToken})
	apiErr(t, "ListDiffs with another filter", err, codes.InvalidArgument, "INVALID_ARGUMENT", map[string]string{"field": "page_token"})

	// ListDifferences: all three, by kind, paged.
	all, err := c.ListDifferences(ctx, &parityv1.ListDifferencesRequest{Parent: d.Name})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]parityv1.DifferenceKind{}
	for _, x := range all.Differences {
		got[x.Table+" "+x.Key] = x.Kind
		if x.Class == "" || len(x.KeyColumns) != 1 || x.Count != 1 {
			t.Errorf("difference %v", x)
		}
	}
	for k, kind := range map[string]parityv1.DifferenceKind{
		db + ".sbtest1 id=50000001": parityv1.DifferenceKind_DIFFERENCE_KIND_DIFFERING,
		db + ".sbtest1 id=50000010": parityv1.DifferenceKind_DIFFERENCE_KIND_EXTRA,
		db + ".sbtest2 id=50000001": parityv1.DifferenceKind_DIFFERENCE_KIND_DIFFERING,
	} {
		if got[k] != kind {
			t.Errorf("ListDifferences: %s is %v, want %v (all: %v)", k, got[k], kind, got)
		}
	}
	if all.TotalSize != int64(len(all.Differences)) || all.TotalSize != last.Differences || all.NextPageToken != "" {
		t.Fatalf("ListDifferences: total %d, %d listed, run's %d, token %q", all.TotalSize, len(all.Differences), last.Differences, all.NextPageToken)
	}
	extra, err := c.ListDifferences(ctx, &parityv1.ListDifferencesRequest{Parent: d.Name, Kind: parityv1.DifferenceKind_DIFFERENCE_KIND_EXTRA, Table: db + ".sbtest1"})
	if err != nil {
		t.Fatal(err)
	}
	if extra.TotalSize != 1 || len(extra.Differences) != 1 || extra.Differences[0].Key != "id=50000010" {
		t.Fatalf("ListDifferences kind EXTRA: %v", extra)
	}
	var paged []string
	for tok := ""; ; {
		p, err := c.ListDifferences(ctx, &parityv1.ListDifferencesRequest{Parent: d.Name, PageSize: 1, PageToken: tok})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Differences) != 1 || p.TotalSize != all.TotalSize {
			t.Fatalf("ListDifferences page %d: %v", len(paged), p)
		}
		paged = append(paged, p.Differences[0].Table+" "+p.Differences[0].Key)
		if tok = p.NextPageToken; tok == "" {
			break
		}
	}
	if len(paged) != len(all.Differences) {
		t.Fatalf("paged through %v, want %d", paged, len(all.Differences))
	}

	// GetFixSQL: per table, the statements that make the fallback equal.
	fs, err := c.GetFixSQL(ctx, &parityv1.GetFixSQLRequest{Parent: d.Name})
	if err != nil {
		t.Fatal(err)
	}
	fix := map[string]string{}
	for {
		m, err := fs.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasSuffix(m.Sql, ";\n") {
			t.Errorf("fix chunk of %s does not end a statement: %q", m.Table, m.Sql)
		}
		fix[m.Table] += m.Sql
	}
	if len(fix) != 2 || !strings.Contains(fix[db+".sbtest1"], "DELETE") || !strings.Contains(fix[db+".sbtest1"], "50000010") ||
		!strings.Contains(fix[db+".sbtest2"], "50000001") {
		t.Fatalf("fix SQL: %v", fix)
	}
	fs, err = c.GetFixSQL(ctx, &parityv1.GetFixSQLRequest{Parent: d.Name, Table: db + ".nosuch"})
	if err == nil {
		_, err = fs.Recv()
	}
	apiErr(t, "GetFixSQL of a table not in the run", err, codes.InvalidArgument, "INVALID_ARGUMENT", map[string]string{"field": "table"})

	// Repair: a dry run, then for real, re-verified.
	dry, err := c.Repair(ctx, &parityv1.RepairRequest{Diff: d.Name, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if !dry.DryRun || dry.RepairId != "" || dry.VerifyDiff != "" || int64(len(dry.Keys)) != all.TotalSize || dry.Upserted+dry.Deleted != all.TotalSize {
		t.Fatalf("dry repair: %v", dry)
	}
	rep, err := c.Repair(ctx, &parityv1.RepairRequest{Diff: d.Name})
	if err != nil {
		t.Fatal(err)
	}
	if rep.RepairId == "" || rep.Deleted != 1 || rep.Upserted != 2 || rep.VerifyResult != parityv1.DiffResult_DIFF_RESULT_EQUAL ||
		!strings.HasPrefix(rep.VerifyDiff, "diffs/") {
		t.Fatalf("repair: %v", rep)
	}

	// CutoverCheck: every table has a clean full run (the first run's equal tables, the
	// repair's re-verification), so the check at TiDB's current TSO passes; with a
	// maximum age no run meets, it fails naming the tables.
	cc, err := c.CutoverCheck(ctx, &parityv1.CutoverCheckRequest{Upstream: &parityv1.CutoverCheckRequest_Now{Now: true},
		WaitTimeout: durationpb.New(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	if !cc.Passed || len(cc.Failures) != 0 || len(cc.Tables) != 4 || cc.Pair == nil || cc.Pair.Ts < cc.UpstreamTs || cc.UpstreamTs < rep.Keys[0].Ts ||
		!strings.HasPrefix(cc.Diff, "diffs/") || cc.Waited == nil {
		t.Fatalf("cutover check: %v", cc)
	}
	for _, ct := range cc.Tables {
		if ct.Result != "equal" || !strings.HasPrefix(ct.LastFullDiff, "diffs/") || ct.SinceTs == 0 {
			t.Errorf("cutover check table: %v", ct)
		}
	}
	stale, err := c.CutoverCheck(ctx, &parityv1.CutoverCheckRequest{Upstream: &parityv1.CutoverCheckRequest_Now{Now: true},
		MaxFullDiffAge: durationpb.New(time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	if stale.Passed || len(stale.Failures) == 0 || len(stale.Tables) != 4 || stale.Tables[0].Result != "full-diff-too-old" {
		t.Fatalf("cutover check with a 1ms maximum age: %v", stale)
	}
	_, err = c.CutoverCheck(ctx, &parityv1.CutoverCheckRequest{})
	apiErr(t, "CutoverCheck without a TSO", err, codes.InvalidArgument, "INVALID_ARGUMENT", map[string]string{"field": "upstream"})

	// CancelDiff: a run cancelled while it compares ends cancelled.
	d3, err := c.StartDiff(ctx, &parityv1.StartDiffRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		g3, err := c.GetDiff(ctx, &parityv1.GetDiffRequest{Name: d3.Name})
		if err != nil {
			t.Fatal(err)
		}
		if g3.State != parityv1.DiffState_DIFF_STATE_QUEUED && g3.State != parityv1.DiffState_DIFF_STATE_RUNNING {
			t.Fatalf("the run to cancel ended first: %v", g3)
		}
		if g3.GetProgress().GetTablesTotal() > 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	cd, err := c.CancelDiff(ctx, &parityv1.CancelDiffRequest{Name: d3.Name})
	if err != nil {
		t.Fatal(err)
	}
	if cd.State != parityv1.DiffState_DIFF_STATE_CANCELLED || cd.Result != parityv1.DiffResult_DIFF_RESULT_CANCELLED || cd.EndTime == nil {
		t.Fatalf("cancelled run: %v", cd)
	}
	if again, err := c.CancelDiff(ctx, &parityv1.CancelDiffRequest{Name: d3.Name}); err != nil || again.State != cd.State {
		t.Fatalf("cancelling an ended run: %v, %v", again, err)
	}

	// Errors.
	_, err = c.GetDiff(ctx, &parityv1.GetDiffRequest{Name: "diffs/v-nosuch"})
	apiErr(t, "GetDiff of an unknown run", err, codes.NotFound, "DIFF_NOT_FOUND", map[string]string{"name": "diffs/v-nosuch"})
	_, err = c.ListDifferences(ctx, &parityv1.ListDifferencesRequest{Parent: "diffs/v-nosuch"})
	apiErr(t, "ListDifferences of an unknown run", err, codes.NotFound, "DIFF_NOT_FOUND", map[string]string{"name": "diffs/v-nosuch"})
	_, err = c.StartDiff(ctx, &parityv1.StartDiffRequest{Scope: "everything"})
	apiErr(t, "StartDiff with a bad scope", err, codes.InvalidArgument, "INVALID_ARGUMENT", map[string]string{"field": "scope"})
	_, err = c.StartDiff(ctx, &parityv1.StartDiffRequest{Tables: []string{db + ".sbtest1", "nodot"}})
	apiErr(t, "StartDiff with a bad table", err, codes.InvalidArgument, "INVALID_ARGUMENT", map[string]string{"field": "tables[1]"})
	_, err = c.Repair(ctx, &parityv1.RepairRequest{Diff: d.Name, Tables: []string{db + ".nosuch"}})
	apiErr(t, "Repair of a table not in the run", err, codes.InvalidArgument, "INVALID_ARGUMENT", map[string]string{"field": "tables"})

	// The calls are in serve's /metrics.
	resp, err := http.Get("http://" + cfg.Status.Addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`parity_grpc_server_handled_total{changefeed="api-load",grpc_code="OK",grpc_method="StartDiff",grpc_service="parity.v1.Parity"} 3`,
		`parity_grpc_server_handled_total{changefeed="api-load",grpc_code="NotFound",grpc_method="GetDiff",grpc_service="parity.v1.Parity"} 1`,
		`parity_grpc_server_started_total{changefeed="api-load",grpc_method="WatchDiff",grpc_service="parity.v1.Parity"} 1`,
		`parity_grpc_server_handling_seconds_count{changefeed="api-load",grpc_method="Repair",grpc_service="parity.v1.Parity"} 3`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// TestServeAPIRefusesExposure: an API on a non-loopback address without authentication
// (and without api.insecure) stops serve from starting, with exit status 2.
func TestServeAPIRefusesExposure(t *testing.T) {
	cfg := daemon.DefaultConfig()
	cfg.Changefeed.ID, cfg.Changefeed.Brokers, cfg.Changefeed.Topics = "exposed", []string{"127.0.0.1:1"}, []string{"t"}
	cfg.Downstream.DSN = "u:p@tcp(127.0.0.1:1)/"
	cfg.Status.Addr = ""
	cfg.API.Addr = "0.0.0.0:0"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	err := runServe(context.Background(), cfg)
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 2 || !strings.Contains(err.Error(), "0.0.0.0") {
		t.Fatalf("serve with an exposed API: %v, want exit 2 naming the address", err)
	}
}
