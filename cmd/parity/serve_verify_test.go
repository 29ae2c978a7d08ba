package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidb-parity/parity/cdc"
	"github.com/tidb-parity/parity/cdc/loadgen"
	"github.com/tidb-parity/parity/checker/verify"
	"github.com/tidb-parity/parity/daemon"
	"github.com/tidb-parity/parity/internal/instance"
	"github.com/tidb-parity/parity/internal/metaschema"
	"github.com/tidb-parity/parity/internal/testenv"
	"github.com/tidb-parity/parity/internal/tso"
)

// TestServeVerifyUnderLoad (#17 items 1, 2, 7, 8): loadgen imports tables into TiDB and
// the fallback and then runs transactions on TiDB, published through real Kafka;
// `parity serve`, in-process with verify.enabled, applies them and verifies beside the
// applier. Five manual runs asked for with `parity verify` each compare every table at
// snapshot pairs and find them equal with nothing re-checked, and each is in the
// history with trigger "manual"; a cron schedule (@every 3s) fires meanwhile, its runs
// in the history under its name, never overlapping one another; freshness is +Inf
// before the first clean run and moves back toward 0 after each; the ts-map has a row
// per pair and the periodic rows of verify.ts-map-interval; /status and `parity status`
// show verification next to the lag.
func TestServeVerifyUnderLoad(t *testing.T) {
	upDSN := testenv.Require(t, testenv.EnvUpstream)
	down := testenv.Downstream(t)
	broker := testenv.Kafka(t)
	topic := testenv.NewTopic(t, "verify", 3)
	db := testenv.UniqueName("verify")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	load := startLoad(t, ctx, upDSN, down.Root, broker, topic, db, func(lg *loadgen.Config) {
		lg.Tables, lg.Workers, lg.ImportRows = 3, 12, 3000
		lg.Rate, lg.RowsPerTxn = 0, 20 // as fast as TiDB takes them, up to 20 row changes per table each
		lg.CheckImages = true          // a wrong image (TiDB read inside the transaction) stops the load, named
	})
	importTs := load.ImportTs
	cfg := verifyServeConfig(t, "verify-load", upDSN, down, broker, topic, db, importTs)
	addr := cfg.Status.Addr
	cfg.Verify.TSMapInterval = time.Second
	cfg.Verify.Schedules = []verify.Schedule{{Name: "every-3s", Cron: "@every 3s"}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	srv := runServeInTest(t, ctx, cfg)
	defer srv.Close()

	// Caught up: the applied checkpoint within 3s of now.
	status := srv.Status
	deadline := time.Now().Add(90 * time.Second)
	checkedNever := false
	for {
		if _, _, err := fetchStatus(ctx, addr); err == nil {
			if !checkedNever { // within the schedule's first 3s: no run has ended
				if f := freshness(t, addr); !math.IsInf(f, 1) {
					t.Fatalf("freshness before any clean run: %v, want +Inf", f)
				}
				checkedNever = true
			}
			if st := status(); st.AppliedTs > importTs && st.AppliedLagSeconds < 3 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve did not catch up within 90s")
		}
		time.Sleep(200 * time.Millisecond)
	}
	st0, t0 := status(), time.Now()

	var runs []verify.RunRecord
	for i := 0; i < 5; i++ {
		time.Sleep(time.Second) // let load and replication move on; freshness grows
		before, tb := freshness(t, addr), time.Now()
		rec := verifyCLI(t, addr)
		after, ta := freshness(t, addr), time.Now()
		elapsed := rec.FinishedAt.Sub(rec.StartedAt)
		if rec.Result != verify.ResultEqual || rec.Trigger != verify.TriggerManual || rec.Resolved != 0 || rec.RecheckRounds != 0 ||
			rec.TablesCompared != 5 || rec.RowsChecked < 3*3000 || len(rec.Pairs) == 0 || len(rec.Tables) != 5 {
			t.Fatalf("run %d: %+v", i, rec)
		}
		for _, p := range rec.Pairs {
			if !strings.HasPrefix(p.Position, "mariadb-gtid:") || p.TS < importTs || p.ClosedAt.IsZero() {
				t.Fatalf("run %d pair: %+v", i, p)
			}
		}
		// Freshness moves back toward 0: without the run it would have grown by the time
		// between the two reads; after it, it is at most the time since the run's first
		// pair (the applier applied beyond it: load goes on), or since a newer clean
		// scheduled run's.
		sinceFirst := time.Since(tso.Time(rec.FirstTS)).Seconds()
		if after >= before+ta.Sub(tb).Seconds() || after > sinceFirst {
			t.Fatalf("run %d: freshness %.3fs before, %.3fs after (%v later) a clean run of %v whose first pair is %.3fs old",
				i, before, after, ta.Sub(tb), elapsed, sinceFirst)
		}
		t.Logf("run %d %s: equal, %d rows in %d tables at %d pair(s), %v; freshness %.3fs before, %.3fs after",
			i, rec.RunID, rec.RowsChecked, rec.TablesCompared, len(rec.Pairs), elapsed.Round(time.Millisecond), before, after)
		runs = append(runs, rec)
	}
	// A cdc-scoped run (#17 item 4): only the keys the changefeed changed since each
	// table's last clean verification, read from the dirty-key ledger, at a pair; equal,
	// and far fewer rows than a full run (the keyless table is compared whole).
	time.Sleep(time.Second)
	froms := verifiedTables(t, ctx, down.DB, cfg)
	cdcRun := verifyCLI(t, addr, "--scope", "cdc")
	if cdcRun.Result != verify.ResultEqual || cdcRun.Scope != verify.ScopeCDC || cdcRun.TablesCompared != 5 || cdcRun.Resolved != 0 ||
		cdcRun.RowsChecked >= runs[len(runs)-1].RowsChecked {
		t.Errorf("cdc-scoped run: %+v (the last full run compared %d rows)", cdcRun, runs[len(runs)-1].RowsChecked)
		if cdcRun.Differences > 0 {
			explainAndStop(t, ctx, upDSN, down, cfg, srv, load, cdcRun, froms)
		}
		t.FailNow()
	}
	t.Logf("cdc-scoped run %s: equal, %d rows compared (full: %d)", cdcRun.RunID, cdcRun.RowsChecked, runs[len(runs)-1].RowsChecked)
	st1, t1 := status(), time.Now()
	if ended, err := load.Ended(); ended {
		t.Fatalf("the load ended during the runs: %v", err)
	}
	rate := float64(st1.RowsApplied-st0.RowsApplied) / t1.Sub(t0).Seconds()

	// The history: the five manual runs and the schedule's, each with its trigger.
	hist := verifyHistory(t, addr)
	manual, scheduled, skipped := 0, []verify.RunRecord{}, 0
	var pauses []time.Duration
	for _, r := range hist {
		// The daemon that ran it: verify.instance, "<hostname>:<pid>" by default.
		if r.Instance != instance.DefaultInstance() {
			t.Fatalf("run %s by instance %q, want %q", r.RunID, r.Instance, instance.DefaultInstance())
		}
		switch {
		case r.Trigger == verify.TriggerManual:
			manual++
		case r.Trigger == "every-3s" && r.State == verify.StateSkipped:
			if !strings.HasPrefix(r.Error, "skipped: previous run still running") {
				t.Fatalf("skipped run: %+v", r)
			}
			skipped++
			continue
		case r.Trigger == "every-3s" && r.State != verify.StateRunning:
			if r.TriggerKind != "schedule" {
				t.Fatalf("scheduled run: %+v", r)
			}
			scheduled = append(scheduled, r)
		}
		if r.State != verify.StateRunning && (r.Result != verify.ResultEqual || r.Resolved != 0) {
			t.Fatalf("run %s (%s): %s, %d resolved: %s", r.RunID, r.Trigger, r.Result, r.Resolved, r.Error)
		}
		for _, p := range r.Pairs {
			pauses = append(pauses, p.Pause)
		}
	}
	if manual != 6 || len(scheduled) == 0 {
		t.Fatalf("history: %d manual runs, %d scheduled (want 6 — five full, one cdc — and some)", manual, len(scheduled))
	}
	for i := 0; i+1 < len(scheduled); i++ { // newest first
		if scheduled[i+1].FinishedAt.After(scheduled[i].StartedAt) {
			t.Fatalf("scheduled runs overlap: %+v and %+v", scheduled[i+1], scheduled[i])
		}
	}

	// The ts-map: a row per pair and the applier's rows every verify.ts-map-interval.
	var pairRows, intervalRows int
	q := "SELECT COALESCE(SUM(source='verify'),0), COALESCE(SUM(source='interval'),0) FROM " + metaschema.Table(cfg.Applier.MetaSchema, "ts_map") + " WHERE changefeed=?"
	if err := down.QueryRow(q, cfg.Changefeed.ID).Scan(&pairRows, &intervalRows); err != nil {
		t.Fatal(err)
	}
	npairs := 0
	for _, r := range hist {
		npairs += len(r.Pairs)
	}
	if pairRows < npairs || intervalRows < 5 {
		t.Fatalf("ts-map: %d pair rows (%d pairs), %d interval rows", pairRows, npairs, intervalRows)
	}

	// /status and parity status show it next to the lag.
	st := status()
	if st.Verify == nil || !st.Verify.Verified || st.Verify.FreshnessSeconds == nil || st.Verify.CleanRunID == "" || st.Verify.Pairs < 5 ||
		st.Verify.Instance != instance.DefaultInstance() {
		t.Fatalf("/status verify: %+v", st.Verify)
	}
	var out bytes.Buffer
	if err := printStatus(&out, st); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"applied lag:", "verification freshness:", "last verification:", "verification instance:", instance.DefaultInstance()} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("parity status lacks %q:\n%s", want, out.String())
		}
	}
	t.Logf("parity status:\n%s", out.String())
	m := metrics(t, addr)
	lintMetrics(t, m)
	for _, want := range []string{`parity_verify_runs_total{changefeed="verify-load",result="equal",trigger="manual"} 6`,
		`parity_verify_pause_seconds_count{changefeed="verify-load"}`, `parity_verify_differences_total{changefeed="verify-load",class="cdc",kind="missing"} 0`,
		`parity_verify_last_run_result{changefeed="verify-load",kind="manual",result="equal",trigger="manual"} 1`,
		`parity_verify_chunk_duration_seconds_count{changefeed="verify-load"}`, `parity_cdc_applier_state{changefeed="verify-load",state="running"} 1`,
		`parity_cdc_applied_rows_total{changefeed="verify-load",type="update"}`} {
		if !strings.Contains(m, want) {
			t.Fatalf("/metrics lacks %q", want)
		}
	}

	slices.Sort(pauses)
	pct := func(p float64) time.Duration { return pauses[int(math.Ceil(p*float64(len(pauses))))-1] }
	t.Logf("load: %.0f rows/s applied over %v; %d runs (%d scheduled, %d firings skipped), %d pairs (%d TSOs passed by the applier first): pause p50 %v, p99 %v, max %v",
		rate, t1.Sub(t0).Round(time.Second), len(hist)-skipped, len(scheduled), skipped, len(pauses), st.Verify.Passed, pct(0.5), pct(0.99), pauses[len(pauses)-1])
}

// verifyCLI asks the daemon's POST /verify/run (what `parity verify` asked before it
// called the gRPC API) and returns the run; a run that failed fails the test.
func verifyCLI(t *testing.T, addr string, args ...string) verify.RunRecord {
	t.Helper()
	code, out, errs := runVerifyHTTP(t, addr, args...)
	if code == 2 {
		t.Fatalf("POST /verify/run: %s\n%s", errs, out)
	}
	var rec verify.RunRecord
	if err := json.Unmarshal([]byte(out), &rec); err != nil {
		t.Fatalf("POST /verify/run: %v\n%s", err, out)
	}
	if rec.Unconfirmed > 0 {
		// Not a failure: rows a snapshot read got wrong, caught by reading them again at the
		// pair (docs/verify.md). Said, so that every sighting is on record.
		t.Logf("run %s (scope %s): %d differences gone when read again at the same pair (a snapshot read that was not repeatable)",
			rec.RunID, rec.Scope, rec.Unconfirmed)
	}
	return rec
}

func verifyHistory(t *testing.T, addr string) []verify.RunRecord {
	t.Helper()
	raw, _, err := verifyCall(t.Context(), http.MethodGet, addr, "/verify/runs?limit=1000")
	if err != nil {
		t.Fatalf("GET /verify/runs: %v", err)
	}
	var runs []verify.RunRecord
	if err := json.Unmarshal(raw, &runs); err != nil {
		t.Fatalf("GET /verify/runs: %v\n%s", err, raw)
	}
	return runs
}

func metrics(t testing.TB, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		b.WriteString(sc.Text() + "\n")
	}
	return b.String()
}

// freshness reads parity_verify_freshness_seconds from /metrics.
func freshness(t testing.TB, addr string) float64 {
	t.Helper()
	for _, line := range strings.Split(metrics(t, addr), "\n") {
		if strings.HasPrefix(line, "parity_verify_freshness_seconds{") {
			f, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	t.Fatal("no parity_verify_freshness_seconds in /metrics")
	return 0
}

// The verification endpoints answer loopback clients only, and say when the service
// does not run.
func TestVerifyEndpointsLoopbackOnly(t *testing.T) {
	cfg := daemon.DefaultConfig()
	cfg.Changefeed.Brokers, cfg.Changefeed.Topics = []string{"127.0.0.1:1"}, []string{"t"}
	cfg.Upstream.DSN, cfg.Downstream.DSN = "u@tcp(127.0.0.1:1)/", "u@tcp(127.0.0.1:1)/"
	cfg.Verify.Enabled, cfg.Verify.Tables = true, []string{"app.*"}
	r, err := cdc.New(cfg.Parts().CDC, nil)
	if err != nil {
		t.Fatal(err)
	}
	vs, err := verify.New(cfg.Parts().Verify, verify.Deps{Applier: daemon.Applier(r), BarrierPassed: cdc.ErrBarrierPassed})
	if err != nil {
		t.Fatal(err)
	}
	h := daemon.Handler(daemon.Components{Replicator: r, Verify: vs}, daemon.BuildInfo{}, false)
	for _, tc := range []struct {
		method, path, remote string
		want                 int
	}{
		{http.MethodPost, "/verify/run", "10.1.2.3:5555", http.StatusForbidden},
		{http.MethodGet, "/verify/runs", "[2001:db8::1]:5555", http.StatusForbidden},
		{http.MethodPost, "/verify/run", "127.0.0.1:5555", http.StatusServiceUnavailable},
		{http.MethodPost, "/verify/run?scope=changed", "[::1]:5555", http.StatusBadRequest},
		{http.MethodGet, "/verify/runs", "127.0.0.1:5555", http.StatusServiceUnavailable},
		{http.MethodGet, "/verify/run", "127.0.0.1:5555", http.StatusMethodNotAllowed},
	} {
		req := httptest.NewRequest(tc.method, tc.path, nil)
		req.RemoteAddr = tc.remote
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != tc.want {
			t.Errorf("%s %s from %s: %d %s, want %d", tc.method, tc.path, tc.remote, w.Code, w.Body.String(), tc.want)
		}
	}
	// Without verification they are not mounted, and parity verify says so.
	srv := httptest.NewServer(daemon.Handler(daemon.Components{Replicator: r, Verify: nil}, daemon.BuildInfo{}, false))
	defer srv.Close()
	_, _, err = verifyCall(context.Background(), http.MethodPost, strings.TrimPrefix(srv.URL, "http://"), "/verify/run")
	if err == nil || !strings.Contains(err.Error(), "verify.enabled") {
		t.Fatalf("parity verify against a daemon without verification: %v", err)
	}
}
