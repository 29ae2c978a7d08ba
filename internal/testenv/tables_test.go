package testenv_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidb-parity/parity/internal/testenv"
)

func TestCanonicalValues(t *testing.T) {
	tbl := &testenv.Table{Schema: "s", Name: "t", Columns: []testenv.Column{
		{Name: "f", DataType: "float"}, {Name: "d", DataType: "double"}, {Name: "s", DataType: "varchar"}, {Name: "n", DataType: "decimal"},
	}}
	for _, tc := range []struct {
		col       int
		raw       []byte
		canon     string
		null      bool
		shown     string
		wantError bool
	}{
		{col: 0, raw: []byte("1.1"), canon: "1.1", shown: "1.1"},
		{col: 0, raw: []byte("1.100000023841858"), canon: "1.1", shown: "1.1"}, // the float32 1.1 as a double prints
		{col: 0, raw: []byte("1.1000001"), canon: "1.1000001", shown: "1.1000001"},
		{col: 1, raw: []byte("1e20"), canon: "1e+20", shown: "1e+20"},
		{col: 1, raw: []byte("100000000000000000000"), canon: "1e+20", shown: "1e+20"},
		{col: 1, raw: []byte("0.1"), canon: "0.1", shown: "0.1"},
		{col: 1, raw: []byte("x"), wantError: true},
		{col: 2, raw: []byte("NULL"), canon: "NULL", shown: `"NULL"`},
		{col: 2, raw: []byte{}, canon: "", shown: `""`},
		{col: 2, raw: []byte("1"), canon: "1", shown: "1"},
		{col: 2, raw: []byte("a | b=1"), canon: "a | b=1", shown: `"a | b=1"`},
		{col: 2, raw: []byte("Ase "), canon: "Ase ", shown: `"Ase "`},
		{col: 2, raw: []byte{0xff, 0}, canon: "\xff\x00", shown: `"\xff\x00"`},
		{col: 2, raw: nil, null: true, shown: "NULL"},
		{col: 3, raw: []byte("-12.500"), canon: "-12.500", shown: "-12.500"},
	} {
		v, err := tbl.NewValue(tc.col, tc.raw)
		if tc.wantError {
			if err == nil || !strings.Contains(err.Error(), "s.t column d") {
				t.Errorf("NewValue(%d, %q) = %+v, %v; want an error naming the table and column", tc.col, tc.raw, v, err)
			}
			continue
		}
		if err != nil || v.Null != tc.null || v.Canon != tc.canon || v.Text != string(tc.raw) || testenv.Show(v) != tc.shown {
			t.Errorf("NewValue(%d, %q) = %+v (shown %s), %v; want canon %q null %v shown %s", tc.col, tc.raw, v, testenv.Show(v), err, tc.canon, tc.null, tc.shown)
		}
	}
}

func TestDiffRowsAndDigest(t *testing.T) {
	keyed := &testenv.Table{Schema: "s", Name: "k", Key: []int{0}, Columns: []testenv.Column{{Name: "id", DataType: "int"}, {Name: "v", DataType: "varchar"}}}
	keyless := &testenv.Table{Schema: "s", Name: "nk", Columns: keyed.Columns}
	row := func(tbl *testenv.Table, vals ...any) testenv.Row {
		r := make(testenv.Row, len(vals))
		for i, v := range vals {
			var raw []byte
			if v != nil {
				raw = []byte(fmt.Sprint(v))
			}
			var err error
			if r[i], err = tbl.NewValue(i, raw); err != nil {
				t.Fatal(err)
			}
		}
		return r
	}
	a := []testenv.Row{row(keyed, 1, "a"), row(keyed, 2, "b"), row(keyed, 3, "c"), row(keyed, 4, nil)}
	b := []testenv.Row{row(keyed, 1, "a"), row(keyed, 3, "C"), row(keyed, 4, "NULL"), row(keyed, 5, "e"), row(keyed, 5, "e")}
	var got []string
	for _, d := range testenv.DiffRows(keyed, "up", "down", a, b) {
		got = append(got, fmt.Sprintf("%s %s %s %d/%d", d.Kind, d.Key, d.Column, d.NA, d.NB))
	}
	want := []string{"lost id=2  1/0", "differs id=3 v 1/1", "differs id=4 v 1/1", "extra id=5  0/2"}
	if !slices.Equal(got, want) {
		t.Errorf("keyed diffs %q, want %q", got, want)
	}
	a = []testenv.Row{row(keyless, 1, "x"), row(keyless, 1, "x"), row(keyless, 2, "y")}
	b = []testenv.Row{row(keyless, 1, "x"), row(keyless, 2, "y"), row(keyless, 2, "y"), row(keyless, nil, "z")}
	got = nil
	for _, d := range testenv.DiffRows(keyless, "up", "down", a, b) {
		got = append(got, fmt.Sprintf("%s %s %d/%d", d.Kind, d.Key, d.NA, d.NB))
		if !strings.Contains(d.String(), "table nk: row "+d.Key) {
			t.Errorf("%q does not name the table and the key", d.String())
		}
	}
	want = []string{`lost id=1 | v="x" 2/1`, `doubled id=2 | v="y" 1/2`, `extra id=NULL | v="z" 0/1`}
	if !slices.Equal(got, want) {
		t.Errorf("keyless diffs %q, want %q", got, want)
	}

	digest := func(rows ...testenv.Row) testenv.Digest {
		var d testenv.Digest
		for _, r := range rows {
			d.Add(r)
		}
		return d
	}
	x, y, z := row(keyless, 1, "x"), row(keyless, 2, "y"), row(keyless, nil, "z")
	if digest(x, y, z) != digest(z, x, y) {
		t.Error("a digest depends on the order of the rows")
	}
	for name, other := range map[string]testenv.Digest{
		"a doubled row":   digest(x, y, y, z),
		"a missing row":   digest(x, y),
		"NULL vs 'NULL'":  digest(x, y, row(keyless, "NULL", "z")),
		"a shifted value": digest(x, y, row(keyless, nil, "z"), row(keyless, "1x", "")),
		"a changed value": digest(x, y, row(keyless, nil, "Z")),
	} {
		if other == digest(x, y, z) {
			t.Errorf("%s leaves the digest unchanged", name)
		}
	}
	if d := digest(x, y, y, z); d.Rows != 4 {
		t.Errorf("digest counts %d rows, want 4", d.Rows)
	}
}

// TestCompareSchemas compares a TiDB schema, read at a TSO and now, with a MariaDB
// schema that holds planted differences of every kind.
func TestCompareSchemas(t *testing.T) {
	t.Parallel()
	up, down := testenv.Upstream(t), testenv.Downstream(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	exec := func(db *testenv.DB, qs ...string) {
		t.Helper()
		for _, q := range qs {
			if _, err := db.ExecContext(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
	}
	for _, db := range []*testenv.DB{up, down} {
		exec(db,
			"CREATE TABLE t1 (id INT PRIMARY KEY, f FLOAT, d DOUBLE, s VARCHAR(20) COLLATE utf8mb4_bin, b VARBINARY(8))",
			"INSERT INTO t1 VALUES (1, 1.1, 0.1, 'a', x'00ff'), (2, -3.25, 1e20, 'b', NULL), (3, NULL, NULL, 'c', ''), (4, 0, 0, 'd', x'41'), (5, 1.2345678, 1.2345678901234567, 'e', NULL)",
			"CREATE TABLE kl (a INT, b VARCHAR(10))",
			"INSERT INTO kl VALUES (1, 'x'), (1, 'x'), (2, 'y'), (NULL, NULL)",
			"CREATE TABLE coll (id INT PRIMARY KEY, k VARCHAR(10))",
		)
	}
	exec(up, "CREATE TABLE only_up (id INT PRIMARY KEY)", "CREATE TABLE cols (id INT PRIMARY KEY, x INT)",
		"ALTER TABLE coll MODIFY k VARCHAR(10) COLLATE utf8mb4_general_ci")
	exec(down, "CREATE TABLE only_down (id INT PRIMARY KEY)", "CREATE TABLE cols (id INT PRIMARY KEY, y INT)",
		"ALTER TABLE coll MODIFY k VARCHAR(10) COLLATE utf8mb4_bin")
	ts := testenv.TiDBTSO(t, up.DB)
	tidb := testenv.Side{Label: "TiDB", DB: up.DB, Schema: up.Name, TS: ts}
	fallback := testenv.Side{Label: "the fallback", DB: down.DB, Schema: down.Name}

	rep := testenv.AssertSame(t, ctx, tidb, fallback, testenv.Options{Tables: []string{"t1", "kl", "coll"}})
	if rep.Rows() != 9 || len(rep.Tables) != 3 {
		t.Fatalf("compared %d rows in %d tables, want 9 in 3: %+v", rep.Rows(), len(rep.Tables), rep.Tables)
	}
	da, db, err := testenv.CompareDigests(ctx, tidb, fallback, "t1")
	if err != nil || da != db || da.Rows != 5 {
		t.Fatalf("digests of equal tables: %v, %v, %v", da, db, err)
	}

	// After ts: TiDB changes, the fallback gets every kind of difference.
	exec(up, "UPDATE t1 SET s = 'changed' WHERE id = 4", "CREATE TABLE later (id INT PRIMARY KEY)")
	exec(down,
		"DELETE FROM t1 WHERE id = 2",
		"INSERT INTO t1 VALUES (9, 1, 1, 'extra', NULL)",
		"UPDATE t1 SET b = x'00ff00' WHERE id = 1",
		"UPDATE t1 SET f = 1.5 WHERE id = 3",
		"UPDATE t1 SET f = 1.2345679 WHERE id = 5", // another float32, which MariaDB prints as 1.23457 too
		"DELETE FROM kl WHERE a = 1 LIMIT 1",
		"INSERT INTO kl VALUES (2, 'y')",
	)
	rep, err = testenv.CompareSchemas(ctx, tidb, fallback, testenv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range rep.Diffs {
		got = append(got, fmt.Sprintf("%s/%s/%s/%s", d.Table, d.Kind, d.Key, d.Column))
		t.Log(d)
	}
	want := []string{
		"cols/columns differ//",
		`kl/lost/a=1 | b="x"/`, `kl/doubled/a=2 | b="y"/`,
		"only_down/table extra//", "only_up/table lost//",
		"t1/differs/id=1/b", "t1/lost/id=2/", "t1/differs/id=3/f", "t1/differs/id=5/f", "t1/extra/id=9/",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("differences at ts:\n got %q\nwant %q", got, want)
	}
	for _, d := range rep.Diffs {
		if d.Kind == testenv.Differs && d.Key == "id=1" && !strings.Contains(d.String(), `"\x00\xff", the fallback "\x00\xff\x00"`) {
			t.Errorf("%q does not show both values' bytes", d)
		}
		if d.Kind == testenv.TableLost && !strings.Contains(d.String(), fmt.Sprintf("on TiDB at ts %d, not on the fallback", ts)) {
			t.Errorf("%q does not name the sides", d)
		}
	}
	// Now (no TSO) TiDB also has its own change and table.
	now := tidb
	now.TS = 0
	rep, err = testenv.CompareSchemas(ctx, now, fallback, testenv.Options{Tables: []string{"t1"}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(rep.Diffs, func(d testenv.Diff) bool { return d.Key == "id=4" && d.Column == "s" }) {
		t.Errorf("read now, TiDB's change of id=4 is not reported: %v", rep.Diffs)
	}
	rep, err = testenv.CompareSchemas(ctx, now, fallback, testenv.Options{})
	if err != nil || !slices.ContainsFunc(rep.Diffs, func(d testenv.Diff) bool { return d.Table == "later" && d.Kind == testenv.TableLost }) {
		t.Errorf("read now, TiDB's new table is not reported (%v): %v", err, rep)
	}
	// Collations count only when asked.
	rep, err = testenv.CompareSchemas(ctx, tidb, fallback, testenv.Options{Tables: []string{"coll"}, Collations: true})
	if err != nil || len(rep.Diffs) != 1 || rep.Diffs[0].Kind != testenv.ColumnsDiffer || !strings.Contains(rep.Diffs[0].What, "utf8mb4_general_ci") {
		t.Errorf("a column's other collation: %v, %v", rep.Diffs, err)
	}
	if _, err := testenv.CompareSchemas(ctx, tidb, fallback, testenv.Options{Tables: []string{"only_up"}}); err == nil ||
		!strings.Contains(err.Error(), "the fallback") || !strings.Contains(err.Error(), "only_up") {
		t.Errorf("a named table missing on one side: %v; want an error naming the side and table", err)
	}
	da, db, err = testenv.CompareDigests(ctx, tidb, fallback, "t1")
	if err != nil || da == db || da.Rows != 5 || db.Rows != 5 {
		t.Fatalf("digests of differing tables: %v, %v, %v", da, db, err)
	}
	// A session pinned at a TSO went back to the pool reading the present.
	var n int
	if err := up.QueryRowContext(ctx, "SELECT COUNT(*) FROM later").Scan(&n); err != nil {
		t.Fatalf("after the comparisons at ts the pool reads the past: %v", err)
	}
}
