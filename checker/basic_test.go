package checker

import (
	"fmt"
	"strings"
	"testing"
)

func TestBasicDiffMariaDB(t *testing.T) { testBasicDiff(t, mariaPair(t)) }
func TestBasicDiffTiDB(t *testing.T)    { testBasicDiff(t, tidbPair(t)) }

// testBasicDiff: 3000 rows in 500-row chunks, drill-down by key buckets of at most 100
// rows; a change, a NULL, a missing and an extra row; the fix SQL makes the sides equal.
func testBasicDiff(t *testing.T, p pair) {
	p.both(t, "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20), n INT)")
	var vals []string
	for i := 1; i <= 3000; i++ {
		vals = append(vals, fmt.Sprintf("(%d, 'v%d', %d)", i, i, i*7))
	}
	p.both(t, "INSERT INTO t VALUES "+strings.Join(vals, ","))
	cfg := p.config(t, "t")
	cfg.InitialChunkRows = 500
	cfg.RowDiffRows = 100
	cfg.MaxThreadsRunning = 10000 // probes the real Threads_running, never pauses
	rep := run(t, cfg)
	if tr := tableReport(t, rep, "t"); !rep.Equal || tr.RowsChecked != 3000 {
		t.Fatalf("equal tables: equal=%v report %+v", rep.Equal, tr)
	}
	exec(t, p.down.DB, "UPDATE t SET v = 'changed' WHERE id = 1234", "DELETE FROM t WHERE id = 2000",
		"INSERT INTO t VALUES (5000, 'x', 1)", "UPDATE t SET n = NULL WHERE id = 1", "UPDATE t SET v = 'v1235 ' WHERE id = 1235")
	rep = run(t, cfg)
	tr := tableReport(t, rep, "t")
	if rep.Equal || tr.DifferencesTotal != 5 {
		t.Fatalf("want 5 differences, got %+v", tr)
	}
	got := map[string]string{}
	for _, d := range tr.Differences {
		got[d.Key[0].Value] = string(d.Kind) + strings.Join(d.Columns, ",")
	}
	want := map[string]string{"1": "differingn", "1234": "differingv", "1235": "differingv", "2000": "missing", "5000": "extra"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("key %s: got %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
	applyFix(t, p.down.DB, readFix(t, cfg, tr))
	if rep := run(t, cfg); !rep.Equal {
		t.Fatalf("after fix: not equal: %+v", rep.Tables)
	}
}
