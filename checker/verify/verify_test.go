package verify

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/metaschema"
	"github.com/tidb-parity/parity/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The tests of this package run the service against the real TiDB and fallback
// MariaDB, on tables written once to both with the same rows, where nothing
// replicates: at any TSO after those writes the fallback holds exactly TiDB at that
// TSO. stillApplier stands in for the applier there (its barrier has nothing to hold
// back). The service under a live changefeed, with cdc.Replicator as its applier, is
// tested in cmd/parity (TestServeVerifyUnderLoad).
type stillApplier struct {
	ts       uint64
	barriers atomic.Int64
}

func (a *stillApplier) Barrier(ctx context.Context, ts uint64, fn func(ctx context.Context) error) error {
	a.barriers.Add(1)
	if ts != a.ts {
		return fmt.Errorf("barrier at %d: the fallback is at %d", ts, a.ts)
	}
	return fn(ctx)
}

func (a *stillApplier) Watermarks() (uint64, uint64) { return a.ts, a.ts }

// WaitApplied: the fallback is at ts and never moves.
func (a *stillApplier) WaitApplied(ctx context.Context, ts uint64) error {
	if ts <= a.ts {
		return nil
	}
	<-ctx.Done()
	return ctx.Err()
}

var _ Applier = (*stillApplier)(nil)

// fixture is a database of the same name on TiDB and the fallback with the same rows,
// and a meta schema on the fallback.
type fixture struct {
	up, down *sql.DB
	upDSN    string
	downDSN  string
	db       string
	meta     string
	ts       uint64 // a TSO after every write
}

// newFixture creates tables t<i> (id INT PRIMARY KEY, v VARCHAR(64)) with rows[i] rows
// each on both servers.
func newFixture(t *testing.T, rows ...int) *fixture {
	t.Helper()
	f := &fixture{upDSN: testenv.Require(t, testenv.EnvUpstream), downDSN: testenv.Require(t, testenv.EnvDownstream),
		db: testenv.UniqueName("vf"), meta: testenv.UniqueName("vm")}
	var err error
	if f.up, err = sql.Open("mysql", f.upDSN); err != nil {
		t.Fatal(err)
	}
	if f.down, err = sql.Open("mysql", f.downDSN); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, db := range []*sql.DB{f.up, f.down} {
			_, _ = db.Exec("DROP DATABASE IF EXISTS " + ident.Quote(f.db))
		}
		_, _ = f.down.Exec("DROP DATABASE IF EXISTS " + ident.Quote(f.meta))
		f.up.Close()
		f.down.Close()
	})
	for i, n := range rows {
		tbl := ident.Table(f.db, fmt.Sprintf("t%d", i+1))
		for _, db := range []*sql.DB{f.up, f.down} {
			f.exec(t, db, "CREATE DATABASE IF NOT EXISTS "+ident.Quote(f.db))
			f.exec(t, db, "CREATE TABLE "+tbl+" (id INT PRIMARY KEY, v VARCHAR(64))")
			for lo := 1; lo <= n; lo += 1000 {
				var b strings.Builder
				for id := lo; id < lo+1000 && id <= n; id++ {
					if b.Len() > 0 {
						b.WriteByte(',')
					}
					fmt.Fprintf(&b, "(%d,'row %d')", id, id)
				}
				f.exec(t, db, "INSERT INTO "+tbl+" VALUES "+b.String())
			}
		}
		f.exec(t, f.up, "ANALYZE TABLE "+tbl)
	}
	f.ts = testenv.TiDBTSO(t, f.up)
	return f
}

func (f *fixture) exec(t *testing.T, db *sql.DB, q string) {
	t.Helper()
	if _, err := db.Exec(q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func (f *fixture) config() Config {
	c := DefaultConfig()
	c.Enabled = true
	c.Tables = []string{f.db + ".*"}
	c.Changefeed = "verify-test"
	c.UpstreamDSN, c.DownstreamDSN, c.MetaSchema = f.upDSN, f.downDSN, f.meta
	c.MaxLag = 0
	return c
}

// tsMap records the service's ts-map calls.
type tsMap struct {
	mu   sync.Mutex
	rows []string
}

func (m *tsMap) record(_ context.Context, ts uint64, pos, source string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.rows = append(m.rows, fmt.Sprintf("%d %s %s", ts, pos, source))
	return nil
}

// serve runs s until the test ends.
func serve(t *testing.T, s *Service) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-s.ready:
			return
		case err := <-done:
			t.Fatalf("Run returned early: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the service did not start: %s", s.Stats().LastError)
		}
	}
}

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() && os.Getenv("PARITY_TEST_VERIFY_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

func manual(t *testing.T, s *Service, req Request) RunRecord {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, err := s.Trigger(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := st.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

func recordOf(t *testing.T, s *Service, runID string) RunRecord {
	t.Helper()
	runs, err := s.History(context.Background(), 1, runID)
	if err != nil || len(runs) != 1 {
		t.Fatalf("history of %s: %v (%d runs)", runID, err, len(runs))
	}
	return runs[0]
}

// TestManualRun: a manual full run at a snapshot pair finds the two sides equal, and
// the history holds it with its trigger, its pair (TSO, the fallback's GTID position,
// the pause), each table with the checker's run, and the ts-map got the pair; the run
// covers the applied changes (freshness 0). A row then changed on the fallback alone is
// found by the next run, which is recorded as different and does not move the coverage.
func TestManualRun(t *testing.T) {
	f := newFixture(t, 3000, 500)
	app := &stillApplier{ts: f.ts}
	tm := &tsMap{}
	s, err := New(f.config(), Deps{Applier: app, RecordTSMap: tm.record, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Verified {
		t.Fatalf("verified before any run: %+v", st)
	}
	serve(t, s)
	rec := manual(t, s, Request{})
	first := rec.RunID
	if rec.Result != ResultEqual || rec.State != StateDone || rec.TablesCompared != 2 || rec.RowsChecked != 3500 || rec.Differences != 0 || rec.Resolved != 0 || rec.RecheckRounds != 0 {
		t.Fatalf("run: %+v", rec)
	}
	h := recordOf(t, s, rec.RunID)
	if h.Trigger != TriggerManual || h.TriggerKind != "manual" || h.Result != ResultEqual || h.FirstTS != f.ts || h.LastTS != f.ts ||
		h.RowsChecked != 3500 || len(h.Pairs) != 1 || len(h.Tables) != 2 || h.FinishedAt.Before(h.StartedAt) {
		t.Fatalf("history: %+v", h)
	}
	p := h.Pairs[0]
	if p.TS != f.ts || !strings.HasPrefix(p.Position, "mariadb-gtid:") || p.ClosedAt.Before(p.OpenedAt) || p.Pause <= 0 {
		t.Fatalf("pair: %+v", p)
	}
	for _, tb := range h.Tables {
		if tb.Result != ResultEqual || tb.DiffRunID == "" || len(tb.Pairs) != 1 || tb.Pairs[0] != 1 {
			t.Fatalf("table: %+v", tb)
		}
		var state string
		if err := f.down.QueryRow("SELECT state FROM "+metaschema.Table(f.meta, "diff_runs")+" WHERE run_id=?", tb.DiffRunID).Scan(&state); err != nil || state != "done" {
			t.Fatalf("the checker's run %s: %q, %v", tb.DiffRunID, state, err)
		}
	}
	tm.mu.Lock()
	if len(tm.rows) != 1 || !strings.HasPrefix(tm.rows[0], fmt.Sprintf("%d mariadb-gtid:", f.ts)) || !strings.HasSuffix(tm.rows[0], " verify") {
		t.Fatalf("ts-map: %q", tm.rows)
	}
	tm.mu.Unlock()
	st := s.Stats()
	if !st.Verified || st.CoveredTS != f.ts || st.CleanRunID != rec.RunID || st.Freshness != 0 || st.Pause.Count != 1 || st.Pairs != 1 ||
		len(st.Runs) != 1 || st.Runs[0] != (RunCount{TriggerManual, ResultEqual, 1}) {
		t.Fatalf("stats: %+v", st)
	}

	// A difference made on the fallback alone.
	f.exec(t, f.down, "UPDATE "+ident.Table(f.db, "t2")+" SET v='changed' WHERE id=7")
	rec = manual(t, s, Request{Tables: []string{f.db + ".t2"}})
	if rec.Result != ResultDifferent || rec.Differences != 1 || rec.TablesCompared != 1 {
		t.Fatalf("run after a change on the fallback: %+v", rec)
	}
	if st := s.Stats(); st.CleanRunID == rec.RunID || st.Differences != 1 {
		t.Fatalf("stats after a different run: %+v", st)
	}
	// Classified (no ledger here: unclassified), in the record and the stats.
	var classified int64
	for _, n := range rec.DifferencesByClass {
		classified += n
	}
	if st := s.Stats(); classified != 1 || st.DifferencesByClass[checker.ClassUnclassified] != rec.DifferencesByClass[checker.ClassUnclassified] {
		t.Fatalf("classes of the run's difference: %v, stats %v", rec.DifferencesByClass, st.DifferencesByClass)
	}
	// The history holds them too (what `parity verify` and /verify/runs print); the
	// clean run has none.
	if h := recordOf(t, s, rec.RunID); !maps.Equal(h.DifferencesByClass, rec.DifferencesByClass) {
		t.Fatalf("history of the different run: classes %v, want %v", h.DifferencesByClass, rec.DifferencesByClass)
	}
	if h := recordOf(t, s, first); h.DifferencesByClass != nil {
		t.Fatalf("history of the clean run: classes %v", h.DifferencesByClass)
	}
	// A scope that is none is refused before anything starts.
	if _, err := s.Trigger(context.Background(), Request{Scope: "changed"}); err == nil || !strings.Contains(err.Error(), `unknown scope "changed"`) {
		t.Fatalf("scope changed: %v", err)
	}
}

// TestScheduleNeverOverlaps: a schedule firing every second whose runs take about 3s
// (a rate cap) runs, records its runs with its name as trigger, and skips the firings
// that come while its previous run still runs (recorded as skipped, with the reason) —
// with max-concurrent-runs 3, so only the no-overlap rule holds them back.
func TestScheduleNeverOverlaps(t *testing.T) {
	f := newFixture(t, 6000)
	cfg := f.config()
	cfg.MaxRowsPerSecond = 2000
	cfg.MaxConcurrentRuns = 3
	cfg.Schedules = []Schedule{{Name: "every-second", Cron: "@every 1s"}}
	s, err := New(cfg, Deps{Applier: &stillApplier{ts: f.ts}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, s)
	deadline := time.Now().Add(60 * time.Second)
	for {
		var done, skipped int64
		for _, c := range s.Stats().Runs {
			switch {
			case c.Trigger == "every-second" && c.Result == ResultEqual:
				done += c.Runs
			case c.Trigger == "every-second" && c.Result == ResultSkipped:
				skipped += c.Runs
			case c.Trigger == "every-second":
				t.Fatalf("a scheduled run ended %s: %+v", c.Result, s.Stats().LastRun)
			}
		}
		if done >= 2 && skipped >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 60s: %d runs, %d skipped", done, skipped)
		}
		time.Sleep(200 * time.Millisecond)
	}
	runs, err := s.History(context.Background(), 100, "")
	if err != nil {
		t.Fatal(err)
	}
	var ran []RunRecord
	skips := 0
	for _, r := range runs {
		if r.Trigger != "every-second" || r.TriggerKind != "schedule" {
			t.Fatalf("run with trigger %q (%s)", r.Trigger, r.TriggerKind)
		}
		switch r.State {
		case StateSkipped:
			if r.Result != ResultSkipped || !strings.HasPrefix(r.Error, "skipped: previous run still running (v") {
				t.Fatalf("skipped run: %+v", r)
			}
			skips++
		case StateDone:
			if r.Result != ResultEqual || r.RowsChecked != 6000 {
				t.Fatalf("scheduled run: %+v", r)
			}
			ran = append(ran, r)
		}
	}
	if len(ran) < 2 || skips < 2 {
		t.Fatalf("history: %d runs, %d skipped", len(ran), skips)
	}
	// Newest first: each run ended before the next began.
	for i := 0; i+1 < len(ran); i++ {
		if ran[i+1].FinishedAt.After(ran[i].StartedAt) {
			t.Fatalf("runs overlap: %s ran %s-%s, %s started %s", ran[i+1].RunID, ran[i+1].StartedAt, ran[i+1].FinishedAt, ran[i].RunID, ran[i].StartedAt)
		}
	}
	t.Logf("%d scheduled runs, %d firings skipped; a run took %v", len(ran), skips, ran[len(ran)-1].FinishedAt.Sub(ran[len(ran)-1].StartedAt).Round(time.Millisecond))
}
