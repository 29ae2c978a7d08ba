package checker

import (
	"context"
	"database/sql"
	"strconv"
	"sync"
	"testing"
	"time"
)

// TestConfirmAtSnapshotPair: at a snapshot pair, the differences found are read again at
// the same pair before they are reported. The upstream here is a source labelled as a
// snapshot whose reads are not repeatable (autocommit connections, changed between the
// comparison and the confirmation: what a store that misses a committed transaction in
// its first read at T does); the downstream is a real consistent snapshot. A difference
// that vanishes when read again is counted as unconfirmed (not resolved, not reported,
// not classified, in the meta schema); one the data really has (a row deleted
// downstream before the snapshot, an extra keyless row) stays reported, and a change
// committed downstream after the snapshot is not seen by the confirmation.
func TestConfirmAtSnapshotPair(t *testing.T) {
	p := mariaPair(t)
	p.both(t, "CREATE TABLE cf (id INT PRIMARY KEY, v INT)", "CREATE TABLE cfk (v INT, w INT)")
	p.fill(t, "cf", 100, func(i int) string { return "(" + strconv.Itoa(i) + ", " + strconv.Itoa(i) + ")" })
	p.fill(t, "cfk", 100, func(i int) string { return "(" + strconv.Itoa(i) + ", " + strconv.Itoa(i) + ")" })
	// Differences of the data, made before the downstream's snapshot.
	exec(t, p.down.DB, "DELETE FROM cf WHERE id = 50", "INSERT INTO cfk VALUES (999, 999)")
	// What the first upstream read sees and the confirmation does not.
	exec(t, p.up.DB, "UPDATE cf SET v = -7 WHERE id = 7", "UPDATE cfk SET w = -3 WHERE v = 3")

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	open := func(db *sql.DB, label string, snapshot bool) *connSource {
		t.Helper()
		var conns []*sql.Conn
		for range 2 {
			c, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
			if snapshot {
				for _, q := range []string{"START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY", "SELECT COUNT(*) FROM cf", "SELECT COUNT(*) FROM cfk"} {
					if _, err := c.ExecContext(ctx, q); err != nil {
						t.Fatalf("%s: %v", q, err)
					}
				}
			}
			conns = append(conns, c)
		}
		src, err := newConnSource(ctx, conns, connSourceConfig{Desc: label, Snapshot: label, Kill: db})
		if err != nil {
			t.Fatal(err)
		}
		return src
	}
	up, down := open(p.up.DB, "unrepeatable-up", false), open(p.down.DB, "pair-down", true)
	// After the snapshot: the confirmation must not see it (it reads the pair, not live data).
	exec(t, p.down.DB, "INSERT INTO cf VALUES (50, 50)")

	cfg := p.config(t, "cf", "cfk")
	cfg.Concurrency = 2
	cfg.MinChunkRows, cfg.InitialChunkRows = 1000, 1000 // one chunk per table
	var mu sync.Mutex
	done := 0
	cfg.ChunkDone = func(result string, _ time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		if done++; done == 2 { // both tables' one chunk compared: the upstream "re-reads" right
			exec(t, p.up.DB, "UPDATE cf SET v = 7 WHERE id = 7", "UPDATE cfk SET w = 3 WHERE v = 3")
		}
	}
	d := NewDiff(cfg, &Sources{Upstream: up, Downstream: down, Meta: p.down.DB})
	rep, err := d.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cf, cfk := tableReport(t, rep, "cf"), tableReport(t, rep, "cfk")
	if cf.Chunks != 1 || cfk.Chunks != 1 {
		t.Fatalf("chunks %d and %d; the test restores the upstream after the second chunk and wants one per table", cf.Chunks, cfk.Chunks)
	}
	if cf.DifferencesTotal != 1 || cf.DifferencesUnconfirmed != 1 || cf.DifferencesResolved != 0 {
		t.Errorf("cf: %d differences, %d unconfirmed, %d resolved; want 1, 1, 0", cf.DifferencesTotal, cf.DifferencesUnconfirmed, cf.DifferencesResolved)
	}
	if len(cf.Differences) != 1 || cf.Differences[0].Kind != Missing || len(cf.Differences[0].Key) != 1 || cf.Differences[0].Key[0].Value != "50" {
		t.Errorf("cf differences %+v; want id 50 missing downstream", cf.Differences)
	}
	// The keyless row (3, -3) read first upstream is an extra upstream row and (3, 3) an
	// extra downstream one: both gone when read again; (999, 999) stays.
	if cfk.DifferencesTotal != 1 || cfk.DifferencesUnconfirmed != 2 || cfk.DifferencesResolved != 0 {
		t.Errorf("cfk: %d differences, %d unconfirmed, %d resolved; want 1, 2, 0", cfk.DifferencesTotal, cfk.DifferencesUnconfirmed, cfk.DifferencesResolved)
	}
	if rep.Equal || rep.RecheckRounds != 0 {
		t.Errorf("report equal %v, %d re-check rounds; want false, 0", rep.Equal, rep.RecheckRounds)
	}
	if n := rep.DifferencesByClass[ClassInFlight]; n != 0 {
		t.Errorf("%d differences counted in-flight; the unconfirmed are not resolved", n)
	}
	var total int64
	for _, n := range rep.DifferencesByClass {
		total += n
	}
	if total != 2 {
		t.Errorf("classes %v: %d rows; want the 2 reported", rep.DifferencesByClass, total)
	}
	st := d.Stats()
	if st.DifferencesUnconfirmed != 3 || st.DifferencesResolved != 0 || st.Differences != 2 {
		t.Errorf("stats: %d unconfirmed, %d resolved, %d differences; want 3, 0, 2", st.DifferencesUnconfirmed, st.DifferencesResolved, st.Differences)
	}
	if _, ok := st.PhaseTimes[phaseConfirming]; !ok {
		t.Errorf("phase times %v: no %s", st.PhaseTimes, phaseConfirming)
	}
	var resolved, unconfirmed int64
	if err := p.down.QueryRow("SELECT COALESCE(SUM(resolved), 0), COALESCE(SUM(unconfirmed), 0) FROM "+metaTable("diff_rechecks")+" WHERE run_id = ?", rep.RunID).Scan(&resolved, &unconfirmed); err != nil {
		t.Fatal(err)
	}
	if resolved != 0 || unconfirmed != 3 {
		t.Errorf("diff_rechecks: %d resolved, %d unconfirmed; want 0, 3", resolved, unconfirmed)
	}
}
