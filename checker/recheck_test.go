package checker

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestRecheckResolvesInFlight plays replication in flight during a live diff (no
// snapshots): rows written upstream reach the downstream only after the comparison read
// them. Without the re-check they are reported; with it, the changefeed hook (Config.Lag,
// which the re-check waits on) "replicates" them, and only the real differences stay: a
// row changed downstream only, an extra downstream row, and a row that changed upstream
// again after being replicated once, whose fix SQL must carry its latest upstream value.
// Keys with a quote and a tab are written as hex literals in the stored differences and
// read back for the re-check. A keyless table's chunk that became equal is resolved; one
// that still differs keeps its differences. Upstream MariaDB and upstream TiDB.
func TestRecheckResolvesInFlight(t *testing.T) {
	t.Run("mariadb", func(t *testing.T) { testRecheck(t, mariaPair(t)) })
	t.Run("tidb", func(t *testing.T) { testRecheck(t, tidbPair(t)) })
}

func testRecheck(t *testing.T, p pair) {
	p.both(t, "CREATE TABLE rc (a VARCHAR(20) NOT NULL, b INT NOT NULL, v VARCHAR(50), PRIMARY KEY (a, b))",
		"CREATE TABLE kl (x INT, y VARCHAR(10))", "CREATE TABLE kr (x INT, y VARCHAR(10))")
	key := func(i int) string {
		switch i {
		case 20:
			return "'o''k'"
		case 30:
			return "'t\\tab'"
		}
		return fmt.Sprintf("'k%03d'", i)
	}
	p.fill(t, "rc", 300, func(i int) string { return fmt.Sprintf("(%s, %d, 'v%d')", key(i), i%7, i) })
	p.fill(t, "kl", 50, func(i int) string { return fmt.Sprintf("(%d, 'y%d')", i%10, i) })
	p.fill(t, "kr", 50, func(i int) string { return fmt.Sprintf("(%d, 'y%d')", i%10, i) })

	// In flight: applied upstream now, downstream by "replication" later.
	inFlight := []string{
		fmt.Sprintf("UPDATE rc SET v = 'new10' WHERE a = %s", key(10)),
		fmt.Sprintf("UPDATE rc SET v = 'new20' WHERE a = %s", key(20)),
		fmt.Sprintf("UPDATE rc SET v = NULL WHERE a = %s", key(30)),
		"INSERT INTO rc VALUES ('k999', 1, 'inserted')",
		fmt.Sprintf("DELETE FROM rc WHERE a = %s", key(60)),
		fmt.Sprintf("UPDATE rc SET v = 'first50' WHERE a = %s", key(50)),
		"INSERT INTO kl VALUES (1, 'y1')", // a duplicate row, keyless
		// kr also holds a real difference (below): its chunk still differs at the
		// re-check, which must resolve these three rows and keep only the real one.
		"INSERT INTO kr VALUES (7, 'late')",
		"UPDATE kr SET y = 'y8+' WHERE y = 'y8'",
	}
	exec(t, p.up.DB, inFlight...)
	// Real differences: written downstream only.
	exec(t, p.down.DB, fmt.Sprintf("UPDATE rc SET v = 'rogue' WHERE a = %s", key(40)),
		"INSERT INTO rc VALUES ('k998', 2, 'extra')", "INSERT INTO kr VALUES (3, 'y3')")

	kinds := func(tr TableReport) []string {
		var out []string
		for _, d := range tr.Differences {
			out = append(out, fmt.Sprintf("%s %s %v", d.Kind, d.Key[0].Value, d.Columns))
		}
		slices.Sort(out)
		return out
	}

	// Without the re-check, every row in flight is reported.
	cfg := p.config(t, "rc", "kl", "kr")
	cfg.RecheckRounds = 0
	rep := run(t, cfg)
	if tr := tableReport(t, rep, "rc"); tr.DifferencesTotal != 8 || tr.DifferencesResolved != 0 {
		t.Fatalf("without re-check: rc has %d differences (%d resolved), want 8 (0): %v", tr.DifferencesTotal, tr.DifferencesResolved, kinds(tr))
	}
	if tr := tableReport(t, rep, "kl"); tr.DifferencesTotal != 1 {
		t.Fatalf("without re-check: kl has %d differences, want 1", tr.DifferencesTotal)
	}
	if tr := tableReport(t, rep, "kr"); tr.DifferencesTotal != 4 {
		t.Fatalf("without re-check: kr has %d differences, want 4", tr.DifferencesTotal)
	}
	if rep.RecheckRounds != 0 {
		t.Fatalf("recheck_rounds = %d without re-check", rep.RecheckRounds)
	}
	// Neither at a snapshot pair nor re-checked: a difference may be in flight.
	if want := map[string]int64{ClassUnclassified: 13}; !maps.Equal(rep.DifferencesByClass, want) || rep.Classification == nil || len(rep.Classification.Notes) != 1 {
		t.Errorf("without re-check: differences by class %v (%+v), want %v and a note", rep.DifferencesByClass, rep.Classification, want)
	}

	// With it: the hook replicates what was in flight when the re-check first asks for the
	// changefeed's lag, and row 50 changes upstream again (not replicated).
	cfg = p.config(t, "rc", "kl", "kr")
	var once sync.Once
	var hookErr error
	calls := 0
	cfg.Lag = func(ctx context.Context) (time.Duration, error) {
		calls++
		once.Do(func() {
			for _, s := range inFlight {
				if _, err := p.down.ExecContext(ctx, s); err != nil {
					hookErr = fmt.Errorf("%s: %w", s, err)
					return
				}
			}
			if _, err := p.up.ExecContext(ctx, fmt.Sprintf("UPDATE rc SET v = 'second50' WHERE a = %s", key(50))); err != nil {
				hookErr = err
			}
		})
		return 0, hookErr
	}
	rep = run(t, cfg)
	if hookErr != nil {
		t.Fatal(hookErr)
	}
	if calls == 0 {
		t.Fatal("the re-check never waited for the changefeed")
	}
	if rep.RecheckRounds != 1 {
		t.Errorf("recheck_rounds = %d, want 1", rep.RecheckRounds)
	}
	tr := tableReport(t, rep, "rc")
	want := []string{"differing 'k040' [v]", "differing 'k050' [v]", "extra 'k998' []"}
	if got := kinds(tr); !slices.Equal(got, want) || tr.DifferencesTotal != 3 {
		t.Fatalf("rc after re-check: %d differences %v, want %v", tr.DifferencesTotal, got, want)
	}
	if tr.DifferencesResolved != 5 {
		t.Errorf("rc: %d resolved, want 5 (rows 10, 20, 30, 60 and k999)", tr.DifferencesResolved)
	}
	// Not at a snapshot pair: what the re-check still finds has diverged, what it
	// resolved was in flight.
	for _, d := range tr.Differences {
		if d.Class != ClassDiverged {
			t.Errorf("rc: %s %s classed %q after the re-check, want diverged", d.Kind, d.Key[0].Value, d.Class)
		}
	}
	if want := map[string]int64{ClassDiverged: 3, ClassInFlight: 5}; !maps.Equal(tr.DifferencesByClass, want) {
		t.Errorf("rc: differences by class %v, want %v", tr.DifferencesByClass, want)
	}
	if want := map[string]int64{ClassDiverged: 4, ClassInFlight: 9}; !maps.Equal(rep.DifferencesByClass, want) {
		t.Errorf("report: differences by class %v, want %v", rep.DifferencesByClass, want)
	}
	fix := readFix(t, cfg, tr)
	if !strings.Contains(fix, "'second50'") || strings.Contains(fix, "'first50'") || strings.Contains(fix, "new10") {
		t.Errorf("fix SQL does not carry the rows as read last:\n%s", fix)
	}
	if kl := tableReport(t, rep, "kl"); kl.DifferencesTotal != 0 || kl.DifferencesResolved != 1 || !kl.Equal() {
		t.Errorf("kl after re-check: %d differences, %d resolved; want 0 and 1", kl.DifferencesTotal, kl.DifferencesResolved)
	}
	kr := tableReport(t, rep, "kr")
	if got, want := kinds(kr), []string{"extra 3 []"}; kr.DifferencesTotal != 1 || kr.DifferencesResolved != 3 || !slices.Equal(got, want) {
		t.Errorf("kr after re-check: %d differences %v, %d resolved; want %v and 3 resolved (the rows in flight)", kr.DifferencesTotal, got, kr.DifferencesResolved, want)
	}

	// The stored chunk counts agree with the report (a resumed run sums them).
	var stored int64
	if err := p.down.QueryRowContext(context.Background(), "SELECT IFNULL(SUM(c.differences),0) FROM "+metaTable("diff_chunks")+" c JOIN "+metaTable("diff_tables")+" t USING (run_id, table_idx) WHERE c.run_id = ? AND t.up_table = 'rc'", rep.RunID).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if stored != 3 {
		t.Errorf("diff_chunks holds %d differences of rc, want 3", stored)
	}
	if err := p.down.QueryRowContext(context.Background(), "SELECT IFNULL(SUM(c.differences),0) FROM "+metaTable("diff_chunks")+" c JOIN "+metaTable("diff_tables")+" t USING (run_id, table_idx) WHERE c.run_id = ? AND t.up_table = 'kr'", rep.RunID).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if stored != 1 {
		t.Errorf("diff_chunks holds %d differences of kr, want 1", stored)
	}

	// The fix SQL makes the sides equal.
	applyFix(t, p.down.DB, fix)
	applyFix(t, p.down.DB, readFix(t, cfg, kr))
	cfg = p.config(t, "rc", "kl", "kr")
	if rep := run(t, cfg); !rep.Equal {
		t.Errorf("not equal after the fix: %+v", rep.Tables)
	}
}

// TestRecheckResume stops a run while its re-check waits for the changefeed, after the
// comparison stored its differences, and resumes it: the resumed run re-checks them (its
// comparison has nothing left to do) and reports what the re-check resolved.
func TestRecheckResume(t *testing.T) {
	p := mariaPair(t)
	p.both(t, "CREATE TABLE rr (id INT PRIMARY KEY, v VARCHAR(20))")
	p.fill(t, "rr", 2000, func(i int) string { return fmt.Sprintf("(%d, 'v%d')", i, i) })
	inFlight := "UPDATE rr SET v = CONCAT(v, '+') WHERE id % 7 = 0" // 285 rows: two batches
	exec(t, p.up.DB, inFlight)
	exec(t, p.down.DB, "UPDATE rr SET v = 'rogue' WHERE id = 1000")

	cfg := p.config(t, "rr")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg.Lag = func(context.Context) (time.Duration, error) {
		cancel() // stop the run here: the differences are stored, none re-checked
		return time.Hour, nil
	}
	_, err := NewDiff(cfg, nil).Run(ctx)
	var re *RunError
	if !asRunError(err, &re) || re.State != RunCancelled {
		t.Fatalf("want a cancelled run, got %v", err)
	}
	var stored int
	if err := p.down.QueryRow("SELECT COUNT(*) FROM "+metaTable("diff_differences")+" WHERE run_id = ?", re.RunID).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if stored != 286 {
		t.Fatalf("the stopped run stored %d differences, want 286", stored)
	}

	exec(t, p.down.DB, inFlight) // replication catches up
	cfg = p.config(t, "rr")
	cfg.Resume = re.RunID
	rep := run(t, cfg)
	tr := tableReport(t, rep, "rr")
	if tr.DifferencesTotal != 1 || tr.DifferencesResolved != 285 || len(tr.Differences) != 1 || tr.Differences[0].Key[0].Value != "1000" {
		t.Fatalf("resumed: %d differences %v, %d resolved; want only row 1000, 285 resolved", tr.DifferencesTotal, tr.Differences, tr.DifferencesResolved)
	}
}

// TestRecheckCollationKey: the re-check reads the rows of stored differences by key in
// SQL, with the key column's collation, so a row can come back spelled otherwise than its
// stored key: here the upstream renames four missing rows' keys within utf8mb4_general_ci
// ('k010' → 'K010', 'straße' → 'strase', 'Zeta' → 'zETA') after the comparison stored
// them. They are still missing downstream, and are kept, in the chunks their keys were
// stored in. Before rowkey the checker matched them to the stored keys by their literal
// text, found nothing, and dropped them as resolved (1 difference, 3 resolved).
func TestRecheckCollationKey(t *testing.T) {
	t.Run("mariadb", func(t *testing.T) { testRecheckCollationKey(t, mariaPair(t)) })
	t.Run("tidb", func(t *testing.T) { testRecheckCollationKey(t, tidbPair(t)) })
}

func testRecheckCollationKey(t *testing.T, p pair) {
	p.both(t, "CREATE TABLE ci (a VARCHAR(20) COLLATE utf8mb4_general_ci PRIMARY KEY, v INT) DEFAULT CHARSET utf8mb4")
	p.fill(t, "ci", 300, func(i int) string { return fmt.Sprintf("('k%03d', %d)", i, i) })
	p.both(t, "INSERT INTO ci VALUES ('straße', 1), ('Zeta', 2)")
	exec(t, p.down.DB, "DELETE FROM ci WHERE a IN ('k010', 'k200', 'straße', 'Zeta')")
	cfg := p.config(t, "ci")
	cfg.InitialChunkRows, cfg.MinChunkRows, cfg.MaxChunkRows = 50, 50, 50
	var once sync.Once
	var hookErr error
	cfg.Lag = func(ctx context.Context) (time.Duration, error) {
		once.Do(func() {
			for _, s := range []string{"UPDATE ci SET a = 'K010' WHERE a = 'k010'", "UPDATE ci SET a = 'strase' WHERE a = 'straße'", "UPDATE ci SET a = 'zETA' WHERE a = 'Zeta'"} {
				if _, err := p.up.ExecContext(ctx, s); err != nil {
					hookErr = fmt.Errorf("%s: %w", s, err)
					return
				}
			}
		})
		return 0, hookErr
	}
	rep := run(t, cfg)
	if hookErr != nil {
		t.Fatal(hookErr)
	}
	tr := tableReport(t, rep, "ci")
	var got []string
	for _, d := range tr.Differences {
		got = append(got, fmt.Sprintf("%s %s", d.Kind, d.Key[0].Value))
	}
	slices.Sort(got)
	want := []string{"missing 'K010'", "missing 'k200'", "missing 'strase'", "missing 'zETA'"}
	if !slices.Equal(got, want) || tr.DifferencesTotal != 4 || tr.DifferencesResolved != 0 {
		t.Fatalf("after the re-check: %d differences %v, %d resolved; want %v, none resolved", tr.DifferencesTotal, got, tr.DifferencesResolved, want)
	}
	// Each kept in its chunk: the chunks' counts are what they hold, nothing resolved.
	var mismatched, resolved int
	if err := p.down.QueryRow("SELECT COUNT(*) FROM "+metaTable("diff_chunks")+" c WHERE c.run_id = ? AND c.differences <> (SELECT COUNT(*) FROM "+
		metaTable("diff_differences")+" d WHERE d.run_id = c.run_id AND d.table_idx = c.table_idx AND d.chunk_seq = c.seq)", rep.RunID).Scan(&mismatched); err != nil {
		t.Fatal(err)
	}
	if err := p.down.QueryRow("SELECT COUNT(*) FROM "+metaTable("diff_rechecks")+" WHERE run_id = ? AND resolved <> 0", rep.RunID).Scan(&resolved); err != nil {
		t.Fatal(err)
	}
	if mismatched != 0 || resolved != 0 {
		t.Errorf("%d chunks count other differences than they hold; %d chunks with resolved rows", mismatched, resolved)
	}
	applyFix(t, p.down.DB, readFix(t, cfg, tr))
	if rep := run(t, p.config(t, "ci")); !rep.Equal {
		t.Errorf("not equal after the fix: %+v", rep.Tables)
	}
}
