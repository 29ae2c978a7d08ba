package verify

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

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
