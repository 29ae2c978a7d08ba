package checker

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidb-parity/parity/internal/testenv"
)

// TestTiDBRegionChunks: with TiDB upstream, chunks are cut at region boundaries even when
// the adaptive size would take the whole table in one chunk.
func TestTiDBRegionChunks(t *testing.T) {
	p := tidbPair(t)
	p.both(t, "CREATE TABLE rg (id BIGINT PRIMARY KEY, v VARCHAR(20))")
	var vals []string
	for i := 1; i <= 3000; i++ {
		vals = append(vals, fmt.Sprintf("(%d, 'v%d')", 2*i, i))
	}
	p.both(t, "INSERT INTO rg VALUES "+strings.Join(vals, ","))
	exec(t, p.up.DB, "SPLIT TABLE rg BETWEEN (0) AND (6000) REGIONS 6")
	exec(t, p.down.DB, "UPDATE rg SET v = 'changed' WHERE id = 1700", "DELETE FROM rg WHERE id = 6000")
	cfg := p.config(t, "rg")
	cfg.InitialChunkRows = 100000
	cfg.MaxChunkRows = 100000
	rep := run(t, cfg)
	tr := tableReport(t, rep, "rg")
	if tr.Chunks < 6 {
		t.Errorf("want at least one chunk per region (6), got %d", tr.Chunks)
	}
	if tr.RowsChecked != 3000 || tr.DownstreamRows != 2999 || tr.DifferencesTotal != 2 {
		t.Errorf("report: %+v", tr)
	}
}

// TestTiDBSnapshotRead reads the upstream at a TSO taken before a change: the diff sees
// the old data.
func TestTiDBSnapshotRead(t *testing.T) {
	p := tidbPair(t)
	p.both(t, "CREATE TABLE sn (id INT PRIMARY KEY, v INT)", "INSERT INTO sn VALUES (1, 1), (2, 2)")
	tso := fmt.Sprint(testenv.TiDBTSO(t, p.up.DB))
	exec(t, p.up.DB, "UPDATE sn SET v = 99 WHERE id = 2", "INSERT INTO sn VALUES (3, 3)")
	cfg := p.config(t, "sn")
	cfg.Upstream.Snapshot = tso
	if rep := run(t, cfg); !rep.Equal || rep.UpstreamSnapshot != tso || rep.DownstreamSnapshot != "" {
		t.Fatalf("at snapshot %s the tables are equal: %+v (snapshots %q, %q)", tso, rep.Tables, rep.UpstreamSnapshot, rep.DownstreamSnapshot)
	}
	cfg.Upstream.Snapshot = ""
	if rep := run(t, cfg); rep.Equal || rep.Tables[0].DifferencesTotal != 2 {
		t.Fatalf("without snapshot: %+v", rep.Tables)
	}
}

// TestTiDBSnapshotKeyBounds: TiDB's unistore answers a descending scan at a snapshot, and
// so MAX, from the newest data (SELECT MAX(id) reads NULL, or a lower key, once the
// largest row is deleted after the snapshot), while ascending scans honour the snapshot.
// The drill-down's key buckets are placed by MIN/MAX; the rows above a wrong MAX must
// still be compared, and contradictory bounds (a MIN without a MAX) must not fail the run.
func TestTiDBSnapshotKeyBounds(t *testing.T) {
	p := tidbPair(t)
	p.both(t, "CREATE TABLE sb (id INT PRIMARY KEY, v INT)", "CREATE TABLE sc (id INT PRIMARY KEY, v INT)")
	p.fill(t, "sb", 200, func(i int) string { return fmt.Sprintf("(%d, %d)", i, i) }) // ids 1..200
	p.both(t, "INSERT INTO sc VALUES (7, 7)")
	// Real differences: the largest row of sb is missing downstream and one row differs;
	// sc has a row extra downstream. After the snapshot the upstream deletes sb's largest
	// row (its MAX falls below a row the snapshot holds) and sc's only row (MIN without
	// MAX: the chunk planner's bounds contradict themselves).
	exec(t, p.down.DB, "DELETE FROM sb WHERE id = 200", "UPDATE sb SET v = -3 WHERE id = 3", "INSERT INTO sc VALUES (9, 9)")
	tso := fmt.Sprint(testenv.TiDBTSO(t, p.up.DB))
	// After the snapshot: the rows that make the bounds wrong.
	exec(t, p.up.DB, "DELETE FROM sb WHERE id = 200", "DELETE FROM sc WHERE id = 7")
	var mx sql.NullInt64
	if err := p.up.QueryRow("SELECT MAX(id) FROM sb").Scan(&mx); err != nil {
		t.Fatal(err)
	}
	cfg := p.config(t, "sb", "sc")
	cfg.Upstream.Snapshot = tso
	cfg.InitialChunkRows, cfg.RowDiffRows = 1000, 4 // one open-ended chunk, drilled by buckets
	rep := run(t, cfg)
	sb := tableReport(t, rep, "sb")
	var got []string
	for _, d := range sb.Differences {
		got = append(got, fmt.Sprintf("%s %s %v", d.Kind, d.Key[0].Value, d.Columns))
	}
	if want := []string{"differing 3 [v]", "missing 200 []"}; !slices.Equal(got, want) || sb.DifferencesTotal != 2 || sb.RowsChecked != 200 {
		t.Errorf("sb at the snapshot: %d rows, %d differences %v; want 200 rows and %v", sb.RowsChecked, sb.DifferencesTotal, got, want)
	}
	if sc := tableReport(t, rep, "sc"); sc.DifferencesTotal != 1 || len(sc.Differences) != 1 || sc.Differences[0].Kind != Extra || sc.Differences[0].Key[0].Value != "9" {
		t.Errorf("sc at the snapshot: %d differences %+v; want extra 9", sc.DifferencesTotal, sc.Differences)
	}
	// Say what the server did, so a TiDB that fixes its descending scans is seen here.
	var snapMax sql.NullInt64
	conn, err := p.up.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(context.Background(), "SET @@tidb_snapshot = '"+tso+"'"); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRowContext(context.Background(), "SELECT MAX(id) FROM sb").Scan(&snapMax); err != nil {
		t.Fatal(err)
	}
	t.Logf("MAX(id) of sb at the snapshot: %v (the snapshot holds 200; now %v)", snapMax, mx)
}

// TestTiDBLongKeyOrder: TiDB's CAST(col AS BINARY) of a VARCHAR(n) keeps only n bytes, so
// ordering drill-down streams by it tied keys that share their first n bytes (a 3-byte
// character fills a VARCHAR(3)'s n) and left them in TiDB's own order, not byte order: the
// merge then reported equal rows as missing and extra. One real difference in a chunk of
// such keys must be the only one reported.
func TestTiDBLongKeyOrder(t *testing.T) {
	p := tidbPair(t)
	p.both(t, "CREATE TABLE lk (k VARCHAR(3) COLLATE utf8mb4_general_ci PRIMARY KEY, v INT)")
	keys := []string{"a", "b", "中", "中\t", "中\ta", "中a", "中b", "中中", "中é", "中1", "中!", "中~", "中\n", "z"}
	var vals []string
	for i, k := range keys {
		vals = append(vals, fmt.Sprintf("('%s', %d)", k, i))
	}
	p.both(t, "INSERT INTO lk VALUES "+strings.Join(vals, ", "))
	exec(t, p.down.DB, "UPDATE lk SET v = -1 WHERE k = '中b'")
	cfg := p.config(t, "lk")
	cfg.RecheckRounds = 0 // what the comparison itself reports
	rep := run(t, cfg)
	tr := tableReport(t, rep, "lk")
	if tr.DifferencesTotal != 1 || len(tr.Differences) != 1 || tr.Differences[0].Kind != Differing || tr.Differences[0].Key[0].Value != "'中b'" {
		t.Fatalf("want only 中b differing, got %d differences %+v", tr.DifferencesTotal, tr.Differences)
	}
}

// TestTiDBChecksumChoice: tidb_checksum "auto" keeps the checksums in TiDB on the
// test environment's unistore and would push them down on TiKV; "pushdown" and "tidb"
// force the form; a MariaDB side never gets the pushdown form.
func TestTiDBChecksumChoice(t *testing.T) {
	p := tidbPair(t)
	ctx := context.Background()
	up, err := OpenDSN(ctx, p.up.DSN, 1, "", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	down, err := OpenDSN(ctx, p.down.DSN, 1, "", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	var store string
	if err := p.up.QueryRow("SELECT JSON_UNQUOTE(JSON_EXTRACT(@@tidb_config, '$.store'))").Scan(&store); err != nil {
		t.Fatal(err)
	}
	for mode, want := range map[TiDBChecksum]bool{
		TiDBChecksumAuto: store != "unistore", TiDBChecksumPushdown: true, TiDBChecksumTiDB: false,
	} {
		sp := newSourcePair(up, down, time.Minute)
		if err := sp.choosePushdown(ctx, mode, slog.New(slog.DiscardHandler)); err != nil {
			t.Fatal(err)
		}
		if sp.pushdown != [2]bool{want, false} {
			t.Errorf("tidb_checksum %q on store %s: pushdown %v, want [%v false]", mode, store, sp.pushdown, want)
		}
	}
	if store != "unistore" {
		t.Logf("the upstream's store is %q, not the test environment's unistore", store)
	}
}

// TestTiDBWithoutNewCollations: a TiDB bootstrapped without new collations compares a
// utf8mb4_general_ci key as binary bytes, NO PAD; the MariaDB downstream compares it
// case-insensitively with PAD SPACE. Keys whose first characters sort differently in the
// two orders ('B' < '_' < 'a' in bytes; 'a' < 'B' < '_' case-insensitively; 'b' < 'b\t' in
// bytes, 'b\t' < 'b' padded) must still fall into the same chunks on both sides: no
// re-check round hides a false difference here, every upstream row is counted once, and
// only the real differences are reported.
func TestTiDBWithoutNewCollations(t *testing.T) {
	p := pair{up: oldCollationTiDB(t), down: testenv.Downstream(t)}
	var same int
	if err := p.up.QueryRow("SELECT _utf8mb4'a' = _utf8mb4'A' COLLATE utf8mb4_general_ci").Scan(&same); err != nil || same != 0 {
		t.Fatalf("the old-collation TiDB compares 'a' and 'A' as equal (%d, %v): not bootstrapped without new collations", same, err)
	}
	p.both(t, "CREATE TABLE oc (s VARCHAR(20) COLLATE utf8mb4_general_ci NOT NULL PRIMARY KEY, v INT)")
	firsts := []string{"a", "B", "_", "c", "D", "[", "é", "Z", "~", "b", "b\t", "b ", "A!"}
	const n = 1300
	key := func(i int) string { return fmt.Sprintf("%s%04d", firsts[i%len(firsts)], i) }
	p.fill(t, "oc", n, func(i int) string { return fmt.Sprintf("(%s, %d)", sqlString(key(i)), i) })
	cfg := p.config(t, "oc")
	cfg.InitialChunkRows, cfg.MaxChunkRows = 60, 60
	cfg.RecheckRounds = 0
	rep := run(t, cfg)
	tr := tableReport(t, rep, "oc")
	if !rep.Equal || tr.RowsChecked != n || tr.DownstreamRows != n || tr.Chunks < 10 {
		t.Fatalf("equal data: equal %v, %d rows upstream and %d downstream (want %d), %d chunks; %d differences, the first %+v",
			rep.Equal, tr.RowsChecked, tr.DownstreamRows, n, tr.Chunks, tr.DifferencesTotal, tr.Differences[:min(3, len(tr.Differences))])
	}

	// The downstream's range predicates: for every range between two keys (in TiDB's byte
	// order) the index-served superset plus the byte comparison select exactly the rows a
	// plain byte comparison does, and MariaDB serves a range with a common prefix from its
	// primary key.
	plan := p.plan(t, "oc", FlavorTiDB)
	plan.compareBytes(upSide)
	var keys [][]byte
	for _, k := range firstColumn(t, p.up.DB, "SELECT s FROM oc ORDER BY s") {
		keys = append(keys, []byte(k))
	}
	if len(keys) != n {
		t.Fatalf("%d keys upstream", len(keys))
	}
	ranged := 0
	for i := 0; i+1 < len(keys); i += 37 {
		for _, j := range []int{i + 1, min(i+60, len(keys)-1), len(keys) - 1} {
			lo, hi := chunkBound{sqlValue{Bytes: keys[i]}}, chunkBound{sqlValue{Bytes: keys[j]}}
			where := plan.rangePredicate(downSide, keyRange{Lo: lo, Hi: hi})
			var got, want int
			if err := p.down.QueryRow("SELECT COUNT(*) FROM oc WHERE " + where).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if err := p.down.QueryRow("SELECT COUNT(*) FROM oc WHERE CAST(s AS BINARY) > ? AND CAST(s AS BINARY) <= ?", keys[i], keys[j]).Scan(&want); err != nil {
				t.Fatal(err)
			}
			if got != want || want != j-i {
				t.Fatalf("range (%q, %q]: %d rows downstream with parity's predicate, %d by bytes, %d upstream", keys[i], keys[j], got, want, j-i)
			}
			if plan.byteRangeSuperset(downSide, keyRange{Lo: lo, Hi: hi}) != "" {
				ranged++
				if typ := explainType(t, p.down.DB, "SELECT COUNT(*) FROM oc WHERE "+where); typ != "range" {
					t.Errorf("range (%q, %q]: MariaDB reads it by %q, not by an index range", keys[i], keys[j], typ)
				}
			}
		}
	}
	if ranged < 20 {
		t.Errorf("only %d ranges had a common prefix", ranged)
	}

	// Real differences: one changed, one missing and one extra row, at keys whose order
	// differs between the servers.
	changed, missing, extra := key(10), key(11), "b\t9999"
	exec(t, p.down.DB,
		"UPDATE oc SET v = -1 WHERE s = "+sqlString(changed),
		"DELETE FROM oc WHERE s = "+sqlString(missing),
		"INSERT INTO oc VALUES ("+sqlString(extra)+", 1)")
	lit := func(s string) string { return sqlLiteral(kindString, sqlValue{Bytes: []byte(s)}) }
	want := map[string]string{
		lit(changed): string(Differing) + " v",
		lit(missing): string(Missing) + " ",
		lit(extra):   string(Extra) + " ",
	}
	// Once as compared, once re-read by key (the re-check's point lookups compare bytes
	// too, and must not resolve a real difference).
	for _, rounds := range []int{0, 1} {
		cfg.RecheckRounds = rounds
		rep = run(t, cfg)
		tr = tableReport(t, rep, "oc")
		got := map[string]string{}
		for _, d := range tr.Differences {
			got[d.Key[0].Value] = string(d.Kind) + " " + strings.Join(d.Columns, ",")
		}
		if fmt.Sprint(got) != fmt.Sprint(want) || tr.DifferencesTotal != 3 || tr.RowsChecked != n {
			t.Fatalf("re-check rounds %d: got %v (total %d, %d rows upstream), want %v", rounds, got, tr.DifferencesTotal, tr.RowsChecked, want)
		}
	}
	applyFix(t, p.down.DB, readFix(t, cfg, tr))
	if rep := run(t, cfg); !rep.Equal {
		t.Fatalf("after fix: %+v", rep.Tables)
	}
}

// explainType returns the access type MariaDB's EXPLAIN shows for q's first table.
func explainType(t *testing.T, db *sql.DB, q string) string {
	t.Helper()
	cols, rows := queryTable(t, db, "EXPLAIN "+q)
	for i, c := range cols {
		if c == "type" && len(rows) > 0 {
			return rows[0][i]
		}
	}
	t.Fatalf("EXPLAIN %s: no type in %v %v", q, cols, rows)
	return ""
}
