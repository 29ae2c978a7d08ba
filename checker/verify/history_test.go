package verify

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/metaschema"
	"github.com/tidb-parity/parity/internal/testenv"
)

// TestHistoryRecordsCounts: what a run ends with (differences, resolved, unconfirmed, the
// classes) is written to verify_runs and read back as it was, on the real fallback.
func TestHistoryRecordsCounts(t *testing.T) {
	db := testenv.Downstream(t)
	mc, err := mysql.ParseDSN(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	mc.ParseTime = true // as the daemon opens its meta database
	meta, err := sql.Open("mysql", mc.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer meta.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := metaschema.Migrate(ctx, meta, db.Name, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	h := newHistory(meta, db.Name, "cf-history", 30*time.Second)
	start := time.Now().UTC().Truncate(time.Millisecond)
	rec := &RunRecord{RunID: "v-history-1", TriggerKind: TriggerManual, Trigger: TriggerManual, Scope: ScopeFull,
		Patterns: []string{"db.*"}, State: StateRunning, StartedAt: start}
	if err := h.start(ctx, rec); err != nil {
		t.Fatal(err)
	}
	rec.State, rec.Result, rec.FinishedAt = StateDone, ResultDifferent, start.Add(time.Second)
	rec.Differences, rec.Resolved, rec.Unconfirmed, rec.RecheckRounds = 2, 0, 3, 0
	rec.DifferencesByClass = map[string]int64{"cdc": 2}
	if err := h.finish(ctx, rec); err != nil {
		t.Fatal(err)
	}
	got, err := h.list(ctx, 10, rec.RunID)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Fatalf("%d runs listed; want 1", len(got))
	}
	g := got[0]
	if g.Differences != 2 || g.Resolved != 0 || g.Unconfirmed != 3 || g.DifferencesByClass["cdc"] != 2 || g.Result != ResultDifferent {
		t.Errorf("read back: differences %d, resolved %d, unconfirmed %d, classes %v, result %q; want 2, 0, 3, cdc:2, %q",
			g.Differences, g.Resolved, g.Unconfirmed, g.DifferencesByClass, g.Result, ResultDifferent)
	}
}

// TestHistoryRetention: runs that ended before verify.history-retention are deleted with
// the checker's rows of their tables (chunks, differences); the newest clean run over
// verify.tables is kept however old, so are recent runs, and the tables' clean
// verifications (diff_verified). Real runs on the real servers, backdated in the history.
func TestHistoryRetention(t *testing.T) {
	f := newFixture(t, 300, 200)
	s, err := New(f.config(), Deps{Applier: &stillApplier{ts: f.ts}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, s)
	t2 := ident.Table(f.db, "t2")
	cleanOld := manual(t, s, Request{})
	f.exec(t, f.down, "UPDATE "+t2+" SET v='changed' WHERE id=7")
	differentOld := manual(t, s, Request{})
	f.exec(t, f.down, "UPDATE "+t2+" SET v='row 7' WHERE id=7")
	cleanNewest := manual(t, s, Request{})
	f.exec(t, f.down, "DELETE FROM "+t2+" WHERE id=9")
	differentRecent := manual(t, s, Request{})
	for i, r := range []RunRecord{cleanOld, differentOld, cleanNewest, differentRecent} {
		if want := []string{ResultEqual, ResultDifferent, ResultEqual, ResultDifferent}[i]; r.Result != want {
			t.Fatalf("run %d (%s): result %s, want %s", i, r.RunID, r.Result, want)
		}
	}
	count := func(table, where string, args ...any) int {
		t.Helper()
		var n int
		if err := f.down.QueryRow("SELECT COUNT(*) FROM "+metaschema.Table(f.meta, table)+" WHERE "+where, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	diffRuns := func(r RunRecord) []string {
		var ids []string
		for _, tb := range recordOf(t, s, r.RunID).Tables {
			ids = append(ids, tb.DiffRunID)
		}
		if len(ids) != 2 {
			t.Fatalf("run %s has %d tables' checker runs, want 2", r.RunID, len(ids))
		}
		return ids
	}
	gone := map[string][]string{cleanOld.RunID: diffRuns(cleanOld), differentOld.RunID: diffRuns(differentOld)}
	kept := map[string][]string{cleanNewest.RunID: diffRuns(cleanNewest), differentRecent.RunID: diffRuns(differentRecent)}
	verified := count("diff_verified", "1=1")
	if verified == 0 {
		t.Fatal("no clean verification recorded")
	}
	// The two old runs and the newest clean one ended 100 days ago.
	for _, id := range []string{cleanOld.RunID, differentOld.RunID, cleanNewest.RunID} {
		f.exec(t, f.down, fmt.Sprintf("UPDATE %s SET finished_at = finished_at - INTERVAL 100 DAY WHERE run_id = '%s'", metaschema.Table(f.meta, RunsTable), id))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s.hist.pruneExpired(ctx, s.cfg, s.log)

	for id, diffs := range gone {
		for _, tb := range []string{RunsTable, PairsTable, TablesTable} {
			if n := count(tb, "run_id = ?", id); n != 0 {
				t.Errorf("run %s past the retention: %d rows left in %s", id, n, tb)
			}
		}
		for _, d := range diffs {
			for _, tb := range []string{"diff_runs", "diff_tables", "diff_chunks", "diff_differences", "diff_rechecks"} {
				if n := count(tb, "run_id = ?", d); n != 0 {
					t.Errorf("checker run %s of pruned run %s: %d rows left in %s", d, id, n, tb)
				}
			}
		}
	}
	for id, diffs := range kept {
		if n := count(RunsTable, "run_id = ?", id); n != 1 {
			t.Errorf("run %s pruned: it is the newest clean one or recent", id)
		}
		for _, d := range diffs {
			if n := count("diff_chunks", "run_id = ?", d); n == 0 {
				t.Errorf("checker run %s of kept run %s: its chunks were deleted", d, id)
			}
		}
	}
	if n := count("diff_differences", "run_id IN (?, ?)", kept[differentRecent.RunID][0], kept[differentRecent.RunID][1]); n != 1 {
		t.Errorf("the recent different run keeps %d differences, want 1", n)
	}
	if n := count("diff_verified", "1=1"); n != verified {
		t.Errorf("clean verifications: %d after pruning, %d before", n, verified)
	}
	// The kept runs still read back whole, and the service's freshness starts from the
	// newest clean run.
	if h := recordOf(t, s, differentRecent.RunID); h.Differences != 1 || len(h.Tables) != 2 {
		t.Errorf("recent run after pruning: %+v", h)
	}
	if _, err := s.History(ctx, 1, differentOld.RunID); err != nil {
		t.Fatalf("history of a pruned run: %v", err)
	}
	if runs, _ := s.History(ctx, 1, differentOld.RunID); len(runs) != 0 {
		t.Errorf("a pruned run still listed: %+v", runs)
	}
}
