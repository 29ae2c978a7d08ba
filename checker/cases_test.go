package checker

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func diffsByKind(tr TableReport) map[DiffKind]int {
	out := map[DiffKind]int{}
	for _, d := range tr.Differences {
		n := d.Count
		if n == 0 {
			n = 1
		}
		out[d.Kind] += n
	}
	return out
}

func TestKeylessDuplicates(t *testing.T)     { testKeylessDuplicates(t, mariaPair(t)) }
func TestKeylessDuplicatesTiDB(t *testing.T) { testKeylessDuplicates(t, tidbPair(t)) }

func testKeylessDuplicates(t *testing.T, p pair) {
	p.both(t, "CREATE TABLE k (a INT NOT NULL, b VARCHAR(10), c TEXT, KEY (a))")
	exec(t, p.up.DB, "INSERT INTO k VALUES (1,'x','t'),(1,'x','t'),(1,'x','t'),(2,NULL,'u'),(3,'y',NULL),(4,'z','w')")
	exec(t, p.down.DB, "INSERT INTO k VALUES (1,'x','t'),(2,NULL,'u'),(3,'y',NULL),(3,'y',NULL),(4,'z','W')")
	p.both(t, "CREATE TABLE k2 (a INT NOT NULL, b VARCHAR(10), c TEXT)", "INSERT INTO k2 SELECT * FROM k")
	cfg := p.config(t, "k", "k2")
	cfg.InitialChunkRows = 2 // several chunks, cut on index (a)
	rep := run(t, cfg)
	tr := tableReport(t, rep, "k")
	if !tr.Keyless || tr.Chunks < 3 {
		t.Fatalf("table should be keyless, cut into chunks: %+v", tr)
	}
	// The same data without any index: one chunk.
	tr2 := tableReport(t, rep, "k2")
	if tr2.Chunks != 1 || tr2.DifferencesTotal != 5 {
		t.Fatalf("keyless table without index: %+v", tr2)
	}
	// Upstream has two more (1,x,t) and (4,z,w); downstream one more (3,y,NULL) and (4,z,W).
	got := diffsByKind(tr)
	if got[Missing] != 3 || got[Extra] != 2 || tr.DifferencesTotal != 5 {
		t.Fatalf("got %v (total %d): %+v", got, tr.DifferencesTotal, tr.Differences)
	}
	applyFix(t, p.down.DB, readFix(t, cfg, tr))
	applyFix(t, p.down.DB, readFix(t, cfg, tr2))
	if rep := run(t, cfg); !rep.Equal {
		t.Fatalf("after fix: %+v", rep.Tables)
	}
}

func TestCompositeStringKey(t *testing.T)     { testCompositeStringKey(t, mariaPair(t)) }
func TestCompositeStringKeyTiDB(t *testing.T) { testCompositeStringKey(t, tidbPair(t)) }

// testCompositeStringKey: a (general_ci, bin) string key with quotes, backslashes and
// non-ASCII bytes, cut into many chunks and bisected (string keys are not bucketed).
func testCompositeStringKey(t *testing.T, p pair) {
	p.both(t, "CREATE TABLE c (region VARCHAR(20) COLLATE utf8mb4_general_ci NOT NULL, name VARCHAR(40) COLLATE utf8mb4_bin NOT NULL, n INT, PRIMARY KEY (region, name))")
	var vals []string
	for i := 0; i < 1200; i++ {
		vals = append(vals, fmt.Sprintf("('r%02d', 'Name %04d é''\\\\', %d)", i%7, i, i))
	}
	p.both(t, "INSERT INTO c VALUES "+strings.Join(vals, ","))
	exec(t, p.up.DB, "INSERT INTO c VALUES ('Ünïcode', 'x', 1), ('a', 'b', 2)")
	exec(t, p.down.DB, "INSERT INTO c VALUES ('Ünïcode', 'x', 1), ('A', 'b', 2)",
		"UPDATE c SET n = -1 WHERE region = 'r03' AND name = 'Name 0500 é''\\\\'",
		"DELETE FROM c WHERE region = 'r06' AND name = 'Name 1000 é''\\\\'")
	cfg := p.config(t, "c")
	cfg.InitialChunkRows = 100
	cfg.RowDiffRows = 10
	rep := run(t, cfg)
	tr := tableReport(t, rep, "c")
	got := diffsByKind(tr)
	// 'a' vs 'A' in a _ci key: byte-level comparison reports one missing and one extra row.
	if got[Missing] != 2 || got[Extra] != 1 || got[Differing] != 1 {
		t.Fatalf("got %v: %+v", got, tr.Differences)
	}
	if tr.Chunks < 5 {
		t.Errorf("expected several chunks, got %d", tr.Chunks)
	}
	applyFix(t, p.down.DB, readFix(t, cfg, tr))
	if rep := run(t, cfg); !rep.Equal {
		t.Fatalf("after fix: %+v", rep.Tables)
	}
}

func TestEmptyAndSingleRowTables(t *testing.T) {
	p := mariaPair(t)
	p.both(t, "CREATE TABLE e (id INT PRIMARY KEY, v INT)", "CREATE TABLE one (id INT PRIMARY KEY, v INT)",
		"CREATE TABLE e2 (id INT PRIMARY KEY)", "INSERT INTO one VALUES (1, 1)")
	exec(t, p.down.DB, "INSERT INTO e2 VALUES (7)")
	cfg := p.config(t, "e", "one", "e2")
	rep := run(t, cfg)
	if tr := tableReport(t, rep, "e"); !tr.Equal() || tr.RowsChecked != 0 || tr.Chunks != 1 {
		t.Errorf("empty table: %+v", tr)
	}
	if tr := tableReport(t, rep, "one"); !tr.Equal() || tr.RowsChecked != 1 {
		t.Errorf("one-row table: %+v", tr)
	}
	tr := tableReport(t, rep, "e2")
	if tr.DifferencesTotal != 1 || tr.Differences[0].Kind != Extra || tr.Differences[0].Key[0].Value != "7" {
		t.Errorf("empty upstream, one row downstream: %+v", tr)
	}
}

func TestStructureDifferences(t *testing.T) {
	p := mariaPair(t)
	exec(t, p.up.DB, "CREATE TABLE s (id INT PRIMARY KEY, a INT, b VARCHAR(10), ign INT, u INT NOT NULL, UNIQUE KEY (u))", "INSERT INTO s VALUES (1, 1, 'x', 1, 1)")
	exec(t, p.down.DB, "CREATE TABLE s (id INT PRIMARY KEY, a BIGINT, c INT, ign INT, u INT NOT NULL)", "INSERT INTO s VALUES (1, 1, 5, 2, 1)")
	cfg := p.config(t, "s", "missing_table")
	cfg.Tables = []string{p.up.Name + ".*"}
	cfg.IgnoreColumns = []string{"*.s.ign"}
	exec(t, p.up.DB, "CREATE TABLE nodown (id INT PRIMARY KEY)")
	rep := run(t, cfg)
	tr := tableReport(t, rep, "s")
	if tr.StructureEqual || len(tr.StructureProblems) != 4 || !tr.DataCompared || tr.DifferencesTotal != 0 {
		t.Errorf("structure: %+v", tr)
	}
	if tr := tableReport(t, rep, "nodown"); tr.DataCompared || tr.StructureEqual {
		t.Errorf("table missing downstream: %+v", tr)
	}
	if rep.Equal {
		t.Error("report should not be equal")
	}
}

// TestKillAndResume cancels a run after some chunks and resumes it by ID: chunks finished
// before the kill are not compared again; at most the in-flight ones are.
func TestKillAndResume(t *testing.T) {
	p := mariaPair(t)
	p.both(t, "CREATE TABLE r (id INT PRIMARY KEY, v VARCHAR(20))")
	p.fill(t, "r", 4000, func(i int) string { return fmt.Sprintf("(%d, 'v%d')", i, i) })
	exec(t, p.down.DB, "UPDATE r SET v = 'x' WHERE id IN (10, 1990, 3999)")
	cfg := p.config(t, "r")
	cfg.InitialChunkRows = 100
	cfg.MinChunkRows = 100
	cfg.MaxChunkRows = 100
	cfg.Concurrency = 3
	// Slow enough (about a second) that the cancellation lands mid-run.
	cfg.MaxRowsPerSecond = 4000
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var runID string
	cfg.Progress = func(pr Progress) {
		runID = pr.RunID
		if pr.ChunksDone >= 15 {
			cancel()
		}
	}
	_, err := NewDiff(cfg, nil).Run(ctx)
	var re *RunError
	if err == nil || !asRunError(err, &re) || re.State != RunCancelled {
		t.Fatalf("want a cancelled run error, got %v", err)
	}
	if re.RunID != runID {
		t.Fatalf("run id %s vs progress %s", re.RunID, runID)
	}
	meta := p.down.DB
	var doneBefore int
	q := "SELECT COUNT(*) FROM " + metaTable("diff_chunks") + " WHERE run_id = ? AND state = 'done'"
	if err := meta.QueryRow(q, runID).Scan(&doneBefore); err != nil {
		t.Fatal(err)
	}
	if doneBefore < 10 || doneBefore >= 40 {
		t.Fatalf("done chunks before resume: %d", doneBefore)
	}
	var state string
	if err := meta.QueryRow("SELECT state FROM "+metaTable("diff_runs")+" WHERE run_id = ?", runID).Scan(&state); err != nil || state != RunCancelled {
		t.Fatalf("run state %q, %v", state, err)
	}

	cfg.Progress = nil
	cfg.MaxRowsPerSecond = 0
	cfg.Resume = runID
	bad := cfg
	bad.Hash = HashMD5
	if _, err := NewDiff(bad, nil).Run(context.Background()); err == nil || !strings.Contains(err.Error(), "hash") {
		t.Fatalf("resume with another hash: want an error naming hash, got %v", err)
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer rcancel()
	rep, err := NewDiff(cfg, nil).Run(rctx)
	if err != nil {
		t.Fatal(err)
	}
	tr := tableReport(t, rep, "r")
	if tr.RowsChecked != 4000 || tr.Chunks != 40 || tr.DifferencesTotal != 3 {
		t.Fatalf("resumed report: rows %d chunks %d diffs %d", tr.RowsChecked, tr.Chunks, tr.DifferencesTotal)
	}
	var redone, maxAttempts, checkpoint int
	if err := meta.QueryRow("SELECT COUNT(*), MAX(attempts) FROM "+metaTable("diff_chunks")+" WHERE run_id = ? AND attempts > 1", runID).Scan(&redone, new(any)); err != nil {
		t.Fatal(err)
	}
	_ = maxAttempts
	if redone > cfg.Concurrency {
		t.Errorf("%d chunks compared twice; at most the %d in flight may be", redone, cfg.Concurrency)
	}
	if err := meta.QueryRow("SELECT checkpoint_seq FROM "+metaTable("diff_tables")+" WHERE run_id = ?", runID).Scan(&checkpoint); err != nil || checkpoint != tr.Chunks-1 {
		t.Errorf("checkpoint %d, %v; want the last chunk, %d", checkpoint, err, tr.Chunks-1)
	}
	t.Logf("done before kill: %d chunks; compared twice: %d", doneBefore, redone)
}

// TestMaxRowsPerSecond: the rate cap paces the run (3000 rows at 3000 rows/s cannot finish
// much faster than a second).
func TestMaxRowsPerSecond(t *testing.T) {
	p := mariaPair(t)
	p.both(t, "CREATE TABLE rl (id INT PRIMARY KEY)")
	var vals []string
	for i := 1; i <= 3000; i++ {
		vals = append(vals, fmt.Sprintf("(%d)", i))
	}
	p.both(t, "INSERT INTO rl VALUES "+strings.Join(vals, ","))
	cfg := p.config(t, "rl")
	cfg.InitialChunkRows, cfg.MaxChunkRows = 500, 500
	cfg.MaxRowsPerSecond = 3000
	start := time.Now()
	rep := run(t, cfg)
	if el := time.Since(start); el < 700*time.Millisecond || !rep.Equal {
		t.Fatalf("3000 rows at 3000 rows/s took %s (equal %v)", el, rep.Equal)
	}
}

// TestOddKeys: an ENUM in the primary key, a DOUBLE primary key (a row identity like any
// number: one differing row, see testFloatKeys) and a prefix-unique key (not a row
// identity: compared as a multiset).
func TestOddKeys(t *testing.T) {
	p := mariaPair(t)
	p.both(t, "CREATE TABLE ek (e ENUM('zz','aa','mm') NOT NULL, n INT NOT NULL, v INT, PRIMARY KEY (e, n))",
		"CREATE TABLE fk (f DOUBLE PRIMARY KEY, v INT)",
		"CREATE TABLE pk (s VARCHAR(20) NOT NULL, v INT, UNIQUE KEY (s(2)))")
	var vals []string
	for i := 0; i < 300; i++ {
		vals = append(vals, fmt.Sprintf("('%s', %d, %d)", []string{"zz", "aa", "mm"}[i%3], i, i))
	}
	p.both(t, "INSERT INTO ek VALUES "+strings.Join(vals, ","),
		"INSERT INTO fk VALUES (0.1, 1), (1e-300, 2), (1.2345678901234567, 3)",
		"INSERT INTO pk VALUES ('abc', 1), ('xyz', 2)")
	exec(t, p.down.DB, "UPDATE ek SET v = -1 WHERE e = 'mm' AND n = 2", "UPDATE fk SET v = 9 WHERE v = 3", "UPDATE pk SET v = 5 WHERE s = 'xyz'")
	cfg := p.config(t, "ek", "fk", "pk")
	cfg.InitialChunkRows = 20
	rep := run(t, cfg)
	if tr := tableReport(t, rep, "ek"); tr.DifferencesTotal != 1 || tr.RowsChecked != 300 || tr.Chunks < 10 ||
		tr.Differences[0].Key[0].Value != "'mm'" || tr.Differences[0].Key[1].Value != "2" {
		t.Errorf("enum key: %+v", tr)
	}
	if tr := tableReport(t, rep, "fk"); tr.Keyless || tr.DifferencesTotal != 1 || tr.Differences[0].Kind != Differing ||
		tr.Differences[0].Key[0].Value != "1.2345678901234567" {
		t.Errorf("float key: %+v", tr)
	}
	if tr := tableReport(t, rep, "pk"); !tr.Keyless || tr.DifferencesTotal != 2 {
		t.Errorf("prefix unique key: %+v", tr)
	}
}

// TestWhereRouteAndCap: a row filter on both sides, a table-level route to another name,
// and the cap on listed differences (the total still counts all).
func TestWhereRouteAndCap(t *testing.T) {
	p := mariaPair(t)
	exec(t, p.up.DB, "CREATE TABLE w (id INT PRIMARY KEY, v INT)")
	exec(t, p.down.DB, "CREATE TABLE w_renamed (id INT PRIMARY KEY, v INT)")
	var vals []string
	for i := 1; i <= 200; i++ {
		vals = append(vals, fmt.Sprintf("(%d, %d)", i, i))
	}
	exec(t, p.up.DB, "INSERT INTO w VALUES "+strings.Join(vals, ","))
	exec(t, p.down.DB, "INSERT INTO w_renamed VALUES "+strings.Join(vals, ","),
		"UPDATE w_renamed SET v = -v WHERE id BETWEEN 50 AND 59 OR id > 150")
	cfg := p.config(t, "w")
	cfg.Routes = []Route{{From: p.up.Name + ".w", To: p.down.Name + ".w_renamed"}}
	cfg.TableConfigs = []TableConfig{{Table: "*.w", Where: "id <= 100"}}
	cfg.MaxReportedDifferences = 4
	rep := run(t, cfg)
	tr := tableReport(t, rep, "w")
	if tr.DownstreamTable != "w_renamed" || tr.RowsChecked != 100 || tr.DifferencesTotal != 10 ||
		len(tr.Differences) != 4 || !tr.DifferencesTruncated || tr.Differences[0].Key[0].Value != "50" {
		t.Fatalf("report: %+v", tr)
	}
	fix := readFix(t, cfg, tr)
	if n := strings.Count(fix, "REPLACE INTO `"+p.down.Name+"`.`w_renamed`"); n != 10 {
		t.Fatalf("fix SQL has %d statements, want all 10:\n%s", n, fix)
	}
}

// TestIntegerKeyCutting covers tables with a single integer key, which are cut by key
// value when dense (no index walk) and by index walk otherwise: every difference is found
// and no chunk holds more than twice the rows asked for, in a dense table, at the top of
// the unsigned BIGINT range, with a gap of 10^12 keys, under a WHERE that keeps one row in
// ten (walked: no MIN/MAX under a filter), and in a table dense enough by its statistics
// whose first 30,000 keys hold a row in 30 (the cutter hands over to the index walk).
func TestIntegerKeyCutting(t *testing.T) {
	p := mariaPair(t)
	const chunkRows = 100
	insert := func(table string, ids []string) {
		var vals []string
		for _, id := range ids {
			vals = append(vals, "("+id+", 1)")
		}
		p.both(t, "INSERT INTO "+table+" VALUES "+strings.Join(vals, ","))
	}
	span := func(from, n int64) (ids []string) {
		for i := range n {
			ids = append(ids, fmt.Sprint(from+i))
		}
		return ids
	}
	p.both(t, "CREATE TABLE dense (id INT PRIMARY KEY, v INT)",
		"CREATE TABLE top (id BIGINT UNSIGNED PRIMARY KEY, v INT)",
		"CREATE TABLE gap (id BIGINT PRIMARY KEY, v INT)",
		"CREATE TABLE filtered (id INT PRIMARY KEY, v INT)",
		"CREATE TABLE sparse (id INT PRIMARY KEY, v INT)")
	insert("dense", span(-500, 3000))
	var top []string
	for i := range 1500 {
		top = append(top, fmt.Sprintf("18446744073709551615 - %d", i))
	}
	insert("top", top)
	insert("gap", append(span(1, 1500), span(1_000_000_000_000, 1500)...))
	insert("filtered", span(1, 5000))
	var sparse []string
	for id := 30; id <= 30000; id += 30 {
		sparse = append(sparse, fmt.Sprint(id))
	}
	insert("sparse", append(sparse, span(30001, 10000)...))
	p.both(t, "ANALYZE TABLE dense, top, gap, filtered, sparse")
	exec(t, p.up.DB, "DELETE FROM top WHERE id = 18446744073709551615 - 700")
	exec(t, p.down.DB,
		"UPDATE dense SET v = 2 WHERE id IN (-500, 0, 2499)",
		"DELETE FROM top WHERE id = 18446744073709551615",
		"UPDATE gap SET v = 2 WHERE id IN (1500, 1000000000000)",
		"INSERT INTO gap VALUES (2000000000000, 1)",
		"UPDATE filtered SET v = 2 WHERE id IN (20, 21, 4990)",
		"UPDATE sparse SET v = 2 WHERE id IN (30, 29970, 30001, 40000)")
	cfg := p.config(t, "dense", "top", "gap", "filtered", "sparse")
	cfg.InitialChunkRows, cfg.MinChunkRows, cfg.MaxChunkRows = chunkRows, chunkRows, chunkRows
	cfg.RowDiffRows = 10
	cfg.TableConfigs = []TableConfig{{Table: p.up.Name + ".filtered", Where: "id % 10 = 0"}}
	rep := run(t, cfg)
	for _, tc := range []struct {
		table     string
		rows      int64
		want      map[DiffKind]int
		maxChunks int
	}{
		{"dense", 3000, map[DiffKind]int{Differing: 3}, 31},
		{"top", 1499, map[DiffKind]int{Missing: 1, Extra: 1}, 17},
		{"gap", 3000, map[DiffKind]int{Differing: 2, Extra: 1}, 32},
		{"filtered", 500, map[DiffKind]int{Differing: 2}, 6},
		// 200 chunks if cut by value throughout (the sparse keys at twice the width).
		{"sparse", 11000, map[DiffKind]int{Differing: 4}, 150},
	} {
		tr := tableReport(t, rep, tc.table)
		if got := diffsByKind(tr); tr.RowsChecked != tc.rows || !maps.Equal(got, tc.want) {
			t.Errorf("%s: %d rows checked, differences %v; want %d rows, %v", tc.table, tr.RowsChecked, got, tc.rows, tc.want)
		}
		t.Logf("%s: %d chunks", tc.table, tr.Chunks)
		if tr.Chunks > tc.maxChunks {
			t.Errorf("%s: %d chunks, want at most %d", tc.table, tr.Chunks, tc.maxChunks)
		}
		var biggest int64
		q := "SELECT IFNULL(MAX(GREATEST(c.up_count, c.down_count)), 0) FROM " + metaTable("diff_chunks") + " c JOIN " + metaTable("diff_tables") + " t USING (run_id, table_idx) WHERE c.run_id = ? AND t.up_table = ?"
		if err := p.down.DB.QueryRow(q, rep.RunID, tc.table).Scan(&biggest); err != nil {
			t.Fatal(err)
		}
		if biggest > 2*chunkRows {
			t.Errorf("%s: a chunk of %d rows; chunks must hold at most %d", tc.table, biggest, 2*chunkRows)
		}
	}
}

// TestManyDifferences: 11,000 differences are read back from the meta schema in pages (a
// query per page): the report lists the first 7,000 in key order, and the fix SQL holds
// every one, the deletes of extra rows first, and makes the tables equal.
func TestManyDifferences(t *testing.T) {
	p := mariaPair(t)
	p.both(t, "CREATE TABLE m (id INT PRIMARY KEY, v INT)")
	p.fill(t, "m", 12000, func(i int) string { return fmt.Sprintf("(%d, %d)", i, i) })
	exec(t, p.down.DB, "UPDATE m SET v = -v WHERE id <= 6000", "DELETE FROM m WHERE id > 9000",
		"INSERT INTO m SELECT id + 20000, v FROM m WHERE id <= 2000")
	cfg := p.config(t, "m")
	cfg.MaxReportedDifferences = 7000
	rep := run(t, cfg)
	tr := tableReport(t, rep, "m")
	if tr.DifferencesTotal != 11000 || len(tr.Differences) != 7000 || !tr.DifferencesTruncated {
		t.Fatalf("report: %d differences, %d listed, truncated %v", tr.DifferencesTotal, len(tr.Differences), tr.DifferencesTruncated)
	}
	last := 0
	for i, d := range tr.Differences {
		id, err := strconv.Atoi(d.Key[0].Value)
		if err != nil || id <= last {
			t.Fatalf("difference %d: key %v after %d: not in key order", i, d.Key, last)
		}
		last = id
	}
	fix := readFix(t, cfg, tr)
	deletes, replaces := strings.Count(fix, "DELETE FROM"), strings.Count(fix, "REPLACE INTO")
	if deletes != 2000 || replaces != 9000 || strings.LastIndex(fix, "DELETE FROM") > strings.Index(fix, "REPLACE INTO") {
		t.Fatalf("fix SQL: %d deletes, %d replaces (want 2000 then 9000)", deletes, replaces)
	}
	applyFix(t, p.down.DB, fix)
	if rep := run(t, cfg); !rep.Equal {
		t.Fatalf("after fix: %+v", rep.Tables[0].DifferencesTotal)
	}
}

func TestFloatKeys(t *testing.T)     { testFloatKeys(t, mariaPair(t)) }
func TestFloatKeysTiDB(t *testing.T) { testFloatKeys(t, tidbPair(t)) }

// testFloatKeys: DOUBLE and FLOAT primary keys (values that need 17 digits, float32
// values that print short in MariaDB, huge, tiny, negative, subnormal, zero) are compared
// by key, cut into many chunks and bisected; a changed row, a missing and an extra row are
// found at their exact keys, and the fix SQL, which names rows by those keys, makes the
// downstream equal.
func testFloatKeys(t *testing.T, p pair) {
	p.both(t, "CREATE TABLE fd (k DOUBLE NOT NULL PRIMARY KEY, v INT)", "CREATE TABLE ff (k FLOAT NOT NULL PRIMARY KEY, v INT)")
	keys := []string{"0", "-1.5", "0.1", "0.30000000000000004", "1e300", "-1e-300", "4.9e-324", "3.141592653589793", "123456789.12345678", "2.5e-5"}
	for i := 0; i < 600; i++ {
		keys = append(keys, fmt.Sprintf("%d.%03d", i-300, (i*7919)%1000))
	}
	var vals []string
	for i, k := range keys {
		vals = append(vals, fmt.Sprintf("(%s, %d)", k, i))
	}
	p.both(t, "INSERT INTO fd VALUES "+strings.Join(vals, ","))
	// FLOAT: distinct float32 values (the 600 generated ones are distinct as float32 too).
	fvals := []string{"(3.4e38, -1)", "(-1.17549435e-38, -2)", "(1.1, -3)", "(1.2345678, -4)", "(16777217, -5)"}
	p.both(t, "INSERT INTO ff VALUES "+strings.Join(append(fvals, vals[10:]...), ","))
	exec(t, p.down.DB,
		"UPDATE fd SET v = -1 WHERE k = 0.30000000000000004", "DELETE FROM fd WHERE k = 4.9e-324", "INSERT INTO fd VALUES (0.30000000000000009, 7)",
		"UPDATE ff SET v = 99 WHERE v = -4", "DELETE FROM ff WHERE v = -1", "INSERT INTO ff VALUES (1.1000001, 7)") // FLOAT = literal compares as DOUBLE: select by v
	cfg := p.config(t, "fd", "ff")
	cfg.InitialChunkRows = 50
	cfg.MinChunkRows = 50
	cfg.RowDiffRows = 10
	rep := run(t, cfg)
	for _, name := range []string{"fd", "ff"} {
		tr := tableReport(t, rep, name)
		if tr.Keyless || len(tr.Key) != 1 || tr.Chunks < 5 {
			t.Fatalf("%s: want keyed by k in several chunks: %+v", name, tr)
		}
		got := diffsByKind(tr)
		if got[Missing] != 1 || got[Extra] != 1 || got[Differing] != 1 || tr.DifferencesTotal != 3 {
			t.Errorf("%s: got %v: %+v", name, got, tr.Differences)
		}
		applyFix(t, p.down.DB, readFix(t, cfg, tr))
	}
	if rep := run(t, cfg); !rep.Equal {
		t.Fatalf("after fix: %+v", rep.Tables)
	}
}

// TestMaxDifferences: a table whose every row differs stops being drilled down once
// max_differences rows were found (overshooting by at most the chunks in flight); its
// further mismatched chunks are still found by checksum, counted as undrilled, and make
// the table and the run unequal; only the drilled rows are stored and get fix SQL.
func TestMaxDifferences(t *testing.T) {
	p := mariaPair(t)
	p.both(t, "CREATE TABLE md (id INT PRIMARY KEY, v INT)")
	p.fill(t, "md", 12000, func(i int) string { return fmt.Sprintf("(%d, %d)", i, i) })
	exec(t, p.down.DB, "UPDATE md SET v = -v")
	cfg := p.config(t, "md")
	cfg.MaxDifferences = 1000
	cfg.Concurrency = 2
	cfg.MaxChunkRows = 200
	rep := run(t, cfg)
	tr := tableReport(t, rep, "md")
	if rep.Equal || tr.Equal() {
		t.Fatal("a table with undrilled mismatched chunks reported equal")
	}
	if tr.RowsChecked != 12000 || tr.DownstreamRows != 12000 {
		t.Errorf("rows checked %d/%d, want the whole table", tr.RowsChecked, tr.DownstreamRows)
	}
	// At most the two chunks in flight when the limit was reached go over it.
	if tr.DifferencesTotal < 1000 || tr.DifferencesTotal > 1000+2*200 {
		t.Errorf("%d differences drilled, want 1000 to 1400", tr.DifferencesTotal)
	}
	if tr.UndrilledChunks == 0 || int64(tr.UndrilledChunks)*200 < 12000-tr.DifferencesTotal {
		t.Errorf("%d undrilled chunks for %d undrilled rows", tr.UndrilledChunks, 12000-tr.DifferencesTotal)
	}
	if n := strings.Count(readFix(t, cfg, tr), "REPLACE INTO"); int64(n) != tr.DifferencesTotal {
		t.Errorf("%d fix statements for %d differences", n, tr.DifferencesTotal)
	}
	data, err := os.ReadFile(filepath.Join(cfg.OutputDir, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), fmt.Sprintf(`"undrilled_chunks": %d`, tr.UndrilledChunks)) {
		t.Errorf("report.json lacks undrilled_chunks")
	}
	// Without the limit every row is found.
	cfg.MaxDifferences = 0
	cfg.OutputDir = t.TempDir()
	if tr := tableReport(t, run(t, cfg), "md"); tr.DifferencesTotal != 12000 || tr.UndrilledChunks != 0 {
		t.Errorf("without max_differences: %d differences, %d undrilled chunks", tr.DifferencesTotal, tr.UndrilledChunks)
	}
}

// TestGeneratedColumns: a column generated on one side only is a structure difference. One
// generated upstream but plain downstream holds data the downstream stores like any other
// column: it is compared and fixed (it used to be left out silently). One generated
// downstream cannot be written: it is not compared, and fix SQL leaves it (and columns
// generated on both sides) out.
func TestGeneratedColumns(t *testing.T)     { testGeneratedColumns(t, mariaPair(t)) }
func TestGeneratedColumnsTiDB(t *testing.T) { testGeneratedColumns(t, tidbPair(t)) }

func testGeneratedColumns(t *testing.T, p pair) {
	exec(t, p.up.DB, "CREATE TABLE g (id INT PRIMARY KEY, a INT, b INT AS (a * 2) VIRTUAL, c INT AS (a + 1) STORED, d INT)")
	exec(t, p.down.DB, "CREATE TABLE g (id INT PRIMARY KEY, a INT, b INT AS (a * 2) VIRTUAL, c INT, d INT AS (a - 1) VIRTUAL)")
	exec(t, p.up.DB, "INSERT INTO g (id, a, d) VALUES (1, 10, 9), (2, 20, 7), (3, 30, 29)")
	exec(t, p.down.DB, "INSERT INTO g (id, a, c) VALUES (1, 10, 11), (2, 20, 99), (3, 31, 31)")
	cfg := p.config(t, "g")
	tr := tableReport(t, run(t, cfg), "g")
	var problems []string
	for _, sp := range tr.StructureProblems {
		problems = append(problems, sp.Column+": "+sp.Problem)
	}
	want := []string{"c: generated upstream, a plain column downstream: compared as data",
		"d: generated downstream, a plain column upstream: not compared"}
	if !slices.Equal(problems, want) || tr.StructureEqual {
		t.Errorf("structure problems %q (equal %v), want %q", problems, tr.StructureEqual, want)
	}
	var got []string
	for _, d := range tr.Differences {
		got = append(got, fmt.Sprintf("%s %s %v", d.Kind, d.Key[0].Value, d.Columns))
	}
	// Row 2: the plain downstream c differs from the generated upstream one. Row 3: a
	// differs (c, 31, happens to be what the upstream derives); d is never compared.
	if want := []string{"differing 2 [c]", "differing 3 [a]"}; !slices.Equal(got, want) {
		t.Fatalf("differences %q, want %q", got, want)
	}
	fix := readFix(t, cfg, tr)
	if strings.Contains(fix, "`b`") || strings.Contains(fix, "`d`") {
		t.Errorf("fix SQL writes a column generated downstream:\n%s", fix)
	}
	applyFix(t, p.down.DB, fix)
	cfg.OutputDir = t.TempDir()
	if tr := tableReport(t, run(t, cfg), "g"); tr.DifferencesTotal != 0 {
		t.Errorf("after the fix SQL: %d differences", tr.DifferencesTotal)
	}
}

// TestKeylessManyDifferences: a keyless table without an index (one chunk) with 1,200
// differing rows. Their rows are read 256 row hashes per query (one query per hash scanned
// the table 1,200 times); with max_differences below the count of differing row groups,
// the chunk is left undrilled instead of holding every differing row in memory.
func TestKeylessManyDifferences(t *testing.T) {
	p := mariaPair(t)
	p.both(t, "CREATE TABLE kn (a INT NOT NULL, b VARCHAR(20))")
	p.fill(t, "kn", 2000, func(i int) string { return fmt.Sprintf("(%d, 'v%d')", i, i) })
	exec(t, p.down.DB, "UPDATE kn SET b = CONCAT(b, 'x') WHERE a % 10 < 3") // 600 rows
	cfg := p.config(t, "kn")
	cfg.MaxReportedDifferences = 2000
	rep := run(t, cfg)
	tr := tableReport(t, rep, "kn")
	if got := diffsByKind(tr); tr.Chunks != 1 || tr.DifferencesTotal != 1200 || got[Missing] != 600 || got[Extra] != 600 {
		t.Fatalf("%d chunks, %d differences %v, want one chunk, 600 missing and 600 extra", tr.Chunks, tr.DifferencesTotal, got)
	}
	applyFix(t, p.down.DB, readFix(t, cfg, tr))
	cfg.OutputDir = t.TempDir()
	if rep := run(t, cfg); !rep.Equal {
		t.Fatalf("after the fix SQL: %+v", rep.Tables)
	}
	exec(t, p.down.DB, "UPDATE kn SET b = CONCAT(b, 'y') WHERE a % 10 < 3")
	cfg.MaxDifferences = 500
	cfg.OutputDir = t.TempDir()
	if tr := tableReport(t, run(t, cfg), "kn"); tr.UndrilledChunks != 1 || tr.DifferencesTotal != 0 {
		t.Errorf("max_differences 500: %d undrilled chunks, %d differences; want the chunk undrilled", tr.UndrilledChunks, tr.DifferencesTotal)
	}
}

// TestBucketDrillBounds: the bucket drill-down of an integer key rounds its bucket width
// up, so the last bucket's span can pass the end of the range being narrowed. Its
// sub-range must stop at that end: beyond it lie the next bucket's rows, which were
// reported twice (and written twice into the fix SQL) when they differed too. Here one
// chunk of 11,000 keys is cut into buckets of 11 keys, and each of those into buckets of
// 3 keys: the fourth spans 12 keys from the start of its 11-key bucket.
func TestBucketDrillBounds(t *testing.T) {
	p := mariaPair(t)
	p.both(t, "CREATE TABLE bd (id INT PRIMARY KEY, v INT)")
	p.fill(t, "bd", 11000, func(i int) string { return fmt.Sprintf("(%d, %d)", i, i) })
	// Every row differs: every bucket is followed, the last ones too.
	exec(t, p.down.DB, "UPDATE bd SET v = -v")
	cfg := p.config(t, "bd")
	cfg.InitialChunkRows, cfg.MinChunkRows, cfg.MaxChunkRows = 11000, 11000, 11000
	cfg.MinChunks = 1
	cfg.RowDiffRows = 4
	cfg.MaxReportedDifferences = 20000
	rep := run(t, cfg)
	tr := tableReport(t, rep, "bd")
	if tr.Chunks != 1 {
		t.Fatalf("want one chunk, got %d", tr.Chunks)
	}
	seen := map[string]bool{}
	dups := 0
	for _, d := range tr.Differences {
		if k := d.Key[0].Value; seen[k] || d.Kind != Differing {
			dups++
		} else {
			seen[k] = true
		}
	}
	if tr.DifferencesTotal != 11000 || len(seen) != 11000 || dups != 0 {
		t.Fatalf("want the 11000 changed rows once each, got %d differences, %d distinct keys, %d repeated", tr.DifferencesTotal, len(seen), dups)
	}
}

// TestGroupedChunks: chunks checksummed per key bucket (the cost model's choice for sparse
// differences behind costly drill-downs, forced here) find exactly the changed, missing
// and extra rows, also in a chunk's first and last buckets, next to a chunk boundary and
// in buckets that hold both kinds; and the fix SQL makes the sides equal.
func TestGroupedChunks(t *testing.T) {
	for _, tc := range []struct {
		name string
		pair func(*testing.T) pair
	}{{"mariadb", mariaPair}, {"tidb", tidbPair}} {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.pair(t)
			p.both(t, "CREATE TABLE gc (id BIGINT PRIMARY KEY, v VARCHAR(20), n INT)")
			p.fill(t, "gc", 20000, func(i int) string { return fmt.Sprintf("(%d, 'v%d', %d)", 3*i-30000, i, i%7) })
			// Keys run from -29997 to 30000 in steps of 3.
			exec(t, p.down.DB,
				"UPDATE gc SET v = 'changed' WHERE id IN (-29997, -29994, -3, 0, 3, 15000, 30000)",
				"UPDATE gc SET n = NULL WHERE id = 6000",
				"DELETE FROM gc WHERE id IN (-29991, -6, 1500, 29997)",
				"INSERT INTO gc VALUES (-29999, 'x', 1), (-1, 'x', 1), (1501, 'x', 1), (29999, 'x', 1), (40000, 'x', 1)")
			var logs bytes.Buffer
			cfg := p.config(t, "gc")
			cfg.groupedChunks = true
			cfg.InitialChunkRows, cfg.MinChunkRows, cfg.MaxChunkRows = 1500, 1500, 1500
			cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			rep := run(t, cfg)
			tr := tableReport(t, rep, "gc")
			got := diffsByKind(tr)
			if tr.DifferencesTotal != 17 || got[Differing] != 8 || got[Missing] != 4 || got[Extra] != 5 {
				t.Fatalf("want 8 differing, 4 missing and 5 extra rows, got %d: %+v", tr.DifferencesTotal, tr.Differences)
			}
			for _, d := range tr.Differences {
				want := map[DiffKind][]string{
					Differing: {"-29997", "-29994", "-3", "0", "3", "15000", "30000", "6000"},
					Missing:   {"-29991", "-6", "1500", "29997"},
					Extra:     {"-29999", "-1", "1501", "29999", "40000"},
				}[d.Kind]
				if !slices.Contains(want, d.Key[0].Value) {
					t.Errorf("unexpected %s difference at id %s", d.Kind, d.Key[0].Value)
				}
			}
			if n := strings.Count(logs.String(), "grouped=true"); n < 3 {
				t.Fatalf("want the mismatched chunks compared per bucket, %d were:\n%s", n, logs.String())
			}
			applyFix(t, p.down.DB, readFix(t, cfg, tr))
			cfg.OutputDir = t.TempDir()
			if tr := tableReport(t, run(t, cfg), "gc"); !tr.Equal() || tr.RowsChecked != 20000 {
				t.Fatalf("after the fix: %+v", tr)
			}
		})
	}
}
