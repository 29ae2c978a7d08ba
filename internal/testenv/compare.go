package testenv

// compare.go compares two schemas (Side) table by table with the readers of tables.go:
// columns first, then rows as multisets (DiffRows, lost/extra/doubled/differs), or as
// digests for tables too big to hold; AssertSame fails a test on any difference.

import (
	"context"
	"database/sql"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sync/errgroup"

	"github.com/tidb-parity/parity/internal/tso"
)

// Side is one side of a comparison: a schema on a server, read as it is now, or (TiDB)
// as of a TSO.
type Side struct {
	Label  string  // names the side in reports: "TiDB", "the fallback"
	DB     *sql.DB // its session settings (time_zone above all) are the caller's
	Schema string
	// TS, when non-zero, is the TiDB TSO the side is read at (@@tidb_snapshot through
	// tso.At): its information_schema and its rows as of that TSO.
	TS uint64
}

func (s Side) String() string {
	if s.TS != 0 {
		return fmt.Sprintf("%s at ts %d", s.Label, s.TS)
	}
	return s.Label
}

// Session returns one connection of the side, pinned at its TSO if it has one (its
// information_schema too); close releases it (and resets the snapshot first).
func (s Side) Session(ctx context.Context) (conn *sql.Conn, close func(), err error) {
	conn, err = s.DB.Conn(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: connect: %w", s.Label, err)
	}
	if s.TS == 0 {
		return conn, func() { _ = conn.Close() }, nil
	}
	release, err := tso.At(ctx, conn, s.TS)
	if err != nil {
		_ = conn.Close()
		return nil, nil, fmt.Errorf("%s: %w", s.Label, err)
	}
	return conn, func() { release(); _ = conn.Close() }, nil
}

// DiffKind is what a Diff found.
type DiffKind int

const (
	Lost          DiffKind = iota + 1 // a row (or copies of it) on A, not on B
	Extra                             // a row on B whose key A does not have
	Doubled                           // more copies of a key on B than on A
	Differs                           // a row of one key on both sides, differing in Column
	TableLost                         // a table on A, not on B
	TableExtra                        // a table on B, not on A
	ColumnsDiffer                     // a table on both sides with other columns (names, order or collations)
)

var diffKindNames = map[DiffKind]string{Lost: "lost", Extra: "extra", Doubled: "doubled", Differs: "differs",
	TableLost: "table lost", TableExtra: "table extra", ColumnsDiffer: "columns differ"}

func (k DiffKind) String() string {
	if s, ok := diffKindNames[k]; ok {
		return s
	}
	return "DiffKind(" + strconv.Itoa(int(k)) + ")"
}

// Diff is one difference between side A (the reference, e.g. TiDB) and side B.
type Diff struct {
	Kind   DiffKind
	Table  string // the table's name
	Key    string // row differences: the row's key (Table.KeyOf)
	Column string // Differs: the column
	// A and B are the row on each side (nil where the side has none); for
	// ColumnsDiffer, nil.
	A, B Row
	// NA and NB are how many rows with Key each side holds.
	NA, NB int
	// What describes a table-level difference.
	What string
	// Desc is the table as side A describes it (the columns of A and B, in order); nil
	// for a table-level difference.
	Desc *Table

	labelA, labelB string
}

// String renders the difference for a test message, naming the table, the key, the
// column and both sides.
func (d Diff) String() string {
	a, b := d.labelA, d.labelB
	row := func(r Row) string { // the whole row, unless the key is the whole row
		if line := d.Desc.Line(r); line != d.Key {
			return ": " + line
		}
		return ""
	}
	switch d.Kind {
	case Lost:
		if d.NB == 0 {
			return fmt.Sprintf("table %s: row %s is on %s, not on %s%s", d.Table, d.Key, a, b, row(d.A))
		}
		return fmt.Sprintf("table %s: row %s is on %s %s, on %s %s%s", d.Table, d.Key, a, times(d.NA), b, times(d.NB), row(d.A))
	case Extra:
		return fmt.Sprintf("table %s: row %s is on %s (%s), not on %s%s", d.Table, d.Key, b, times(d.NB), a, row(d.B))
	case Doubled:
		return fmt.Sprintf("table %s: row %s is doubled: on %s %s, on %s %s%s", d.Table, d.Key, b, times(d.NB), a, times(d.NA), row(d.B))
	case Differs:
		i := d.Desc.Col(d.Column)
		return fmt.Sprintf("table %s: row %s differs in column %s: %s %s, %s %s", d.Table, d.Key, d.Column, a, Show(d.A[i]), b, Show(d.B[i]))
	default:
		return fmt.Sprintf("table %s: %s", d.Table, d.What)
	}
}

func times(n int) string {
	if n == 1 {
		return "once"
	}
	return strconv.Itoa(n) + " times"
}

// DiffRows compares the rows of table t on side A (labelled la) with those on side B (lb)
// as multisets keyed by t's key. Rows of one key are paired in line order and compared
// column by column; surplus rows are Lost (more on A), Extra (none on A) or Doubled
// (more on B). Differences come in key order.
func DiffRows(t *Table, la, lb string, a, b []Row) []Diff {
	group := func(rows []Row) map[string][]Row {
		m := map[string][]Row{}
		for _, r := range rows {
			k := t.KeyOf(r)
			m[k] = append(m[k], r)
		}
		for _, rs := range m {
			SortRows(t, rs)
		}
		return m
	}
	ga, gb := group(a), group(b)
	keys := make([]string, 0, len(ga)+len(gb))
	for k := range ga {
		keys = append(keys, k)
	}
	for k := range gb {
		if _, ok := ga[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var out []Diff
	mk := func(kind DiffKind, key string) Diff {
		return Diff{Kind: kind, Table: t.Name, Key: key, NA: len(ga[key]), NB: len(gb[key]), Desc: t, labelA: la, labelB: lb}
	}
	for _, k := range keys {
		ra, rb := ga[k], gb[k]
		for i := 0; i < len(ra) && i < len(rb); i++ {
			for c := range t.Columns {
				if ra[i][c].Null != rb[i][c].Null || ra[i][c].Canon != rb[i][c].Canon {
					d := mk(Differs, k)
					d.Column, d.A, d.B = t.Columns[c].Name, ra[i], rb[i]
					out = append(out, d)
				}
			}
		}
		switch {
		case len(ra) > len(rb):
			d := mk(Lost, k)
			d.A = ra[len(rb)]
			if len(rb) > 0 {
				d.B = rb[0]
			}
			out = append(out, d)
		case len(ra) == 0:
			d := mk(Extra, k)
			d.B = rb[0]
			out = append(out, d)
		case len(rb) > len(ra):
			d := mk(Doubled, k)
			d.A, d.B = ra[0], rb[len(ra)]
			out = append(out, d)
		}
	}
	return out
}

// Options narrow or tighten a comparison.
type Options struct {
	// Tables, when set, are the tables compared (each must exist on both sides); by
	// default every base table of A's schema and of B's is, and both must have the same.
	Tables []string
	// Collations requires every column to have the same collation on both sides, besides
	// the same name in the same position.
	Collations bool
}

// TableReport is what one table's comparison saw.
type TableReport struct {
	Name       string
	RowsA      int // rows on side A
	RowsB      int
	Compared   bool // false when the table's rows were not compared (missing or other columns)
	Difference int  // how many of the report's Diffs are this table's
}

// Report is the result of comparing two schemas. A difference in data is a result, not
// an error.
type Report struct {
	A, B   Side
	Tables []TableReport // in name order
	Diffs  []Diff        // tables in name order, rows in key order
}

// Equal reports whether no difference was found.
func (r *Report) Equal() bool { return len(r.Diffs) == 0 }

// Rows is the number of rows compared on side A.
func (r *Report) Rows() int {
	n := 0
	for _, t := range r.Tables {
		n += t.RowsA
	}
	return n
}

// CompareSchemas compares schema A.Schema on A with B.Schema on B table by table: the
// same base tables, each with the same columns in the same order, every row equal. B is
// read with A's description of each table (its types decide the canonical forms). Each
// side is read on one connection (A's pinned at A.TS when set), the two sides of a table
// at the same time.
func CompareSchemas(ctx context.Context, a, b Side, o Options) (*Report, error) {
	p, err := openPair(ctx, a, b)
	if err != nil {
		return nil, err
	}
	defer p.close()
	rep := &Report{A: a, B: b}
	la, lb := a.String(), b.String()
	names := slices.Clone(o.Tables)
	slices.Sort(names)
	missing := map[string]Diff{} // tables listed on one side only
	if len(names) == 0 {
		ta, err := ListTables(ctx, p.ca, a.Schema)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", la, err)
		}
		tb, err := ListTables(ctx, p.cb, b.Schema)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", lb, err)
		}
		for _, n := range tb {
			if !slices.Contains(ta, n) {
				missing[n] = Diff{Kind: TableExtra, Table: n, What: fmt.Sprintf("on %s, not on %s", lb, la), labelA: la, labelB: lb}
			}
		}
		for _, n := range ta {
			if !slices.Contains(tb, n) {
				missing[n] = Diff{Kind: TableLost, Table: n, What: fmt.Sprintf("on %s, not on %s", la, lb), labelA: la, labelB: lb}
			}
		}
		names = append(ta, slices.Collect(maps.Keys(missing))...)
		slices.Sort(names)
		names = slices.Compact(names)
	}
	for _, name := range names {
		if d, ok := missing[name]; ok {
			rep.Diffs = append(rep.Diffs, d)
			rep.Tables = append(rep.Tables, TableReport{Name: name, Difference: 1})
			continue
		}
		tr, diffs, err := p.compareTable(ctx, name, o)
		if err != nil {
			return nil, err
		}
		tr.Difference = len(diffs)
		rep.Diffs = append(rep.Diffs, diffs...)
		rep.Tables = append(rep.Tables, tr)
	}
	return rep, nil
}

// pair is one connection to each side of a comparison.
type pair struct {
	a, b   Side
	ca, cb *sql.Conn
	close  func()
}

func openPair(ctx context.Context, a, b Side) (*pair, error) {
	ca, closeA, err := a.Session(ctx)
	if err != nil {
		return nil, err
	}
	cb, closeB, err := b.Session(ctx)
	if err != nil {
		closeA()
		return nil, err
	}
	return &pair{a: a, b: b, ca: ca, cb: cb, close: func() { closeB(); closeA() }}, nil
}

// describe describes table on both sides. It returns A's description, B's, and the
// description B is read with: A's columns and types in B's schema, so both sides are
// canonicalized alike.
func (p *pair) describe(ctx context.Context, table string) (ta, tb, readB *Table, err error) {
	if ta, err = DescribeTable(ctx, p.ca, p.a.Schema, table); err != nil {
		return nil, nil, nil, fmt.Errorf("%s: %w", p.a, err)
	}
	if tb, err = DescribeTable(ctx, p.cb, p.b.Schema, table); err != nil {
		return nil, nil, nil, fmt.Errorf("%s: %w", p.b, err)
	}
	r := *ta
	r.Schema = p.b.Schema
	return ta, tb, &r, nil
}

// both runs fa on A's connection and fb on B's at the same time; an error names its side.
func (p *pair) both(fa, fb func(*sql.Conn) error) error {
	var g errgroup.Group
	g.Go(func() error {
		if err := fa(p.ca); err != nil {
			return fmt.Errorf("%s: %w", p.a, err)
		}
		return nil
	})
	g.Go(func() error {
		if err := fb(p.cb); err != nil {
			return fmt.Errorf("%s: %w", p.b, err)
		}
		return nil
	})
	return g.Wait()
}

// compareTable compares one table that both sides should have.
func (p *pair) compareTable(ctx context.Context, name string, o Options) (TableReport, []Diff, error) {
	tr := TableReport{Name: name}
	la, lb := p.a.String(), p.b.String()
	ta, tb, readB, err := p.describe(ctx, name)
	if err != nil {
		return tr, nil, err
	}
	if cols := columnsDiffer(ta, tb, o.Collations); cols != "" {
		return tr, []Diff{{Kind: ColumnsDiffer, Table: name, labelA: la, labelB: lb,
			What: fmt.Sprintf("columns differ: %s %s, %s %s", la, describeColumns(ta, o.Collations), lb, describeColumns(tb, o.Collations))}}, nil
	}
	var ra, rb []Row
	err = p.both(
		func(c *sql.Conn) (err error) { ra, err = ReadRows(ctx, c, ta); return err },
		func(c *sql.Conn) (err error) { rb, err = ReadRows(ctx, c, readB); return err })
	if err != nil {
		return tr, nil, err
	}
	tr.RowsA, tr.RowsB, tr.Compared = len(ra), len(rb), true
	return tr, DiffRows(ta, la, lb, ra, rb), nil
}

// columnsDiffer returns "" when a and b have the same column names in the same order
// (and collations, if asked), else what differs first.
func columnsDiffer(a, b *Table, collations bool) string {
	if len(a.Columns) != len(b.Columns) {
		return fmt.Sprintf("%d columns, %d", len(a.Columns), len(b.Columns))
	}
	for i := range a.Columns {
		ca, cb := a.Columns[i], b.Columns[i]
		if !strings.EqualFold(ca.Name, cb.Name) {
			return fmt.Sprintf("column %d is %s, %s", i+1, ca.Name, cb.Name)
		}
		if collations && ca.Collation != cb.Collation {
			return fmt.Sprintf("column %s has collation %q, %q", ca.Name, ca.Collation, cb.Collation)
		}
	}
	return ""
}

func describeColumns(t *Table, collations bool) string {
	parts := make([]string, len(t.Columns))
	for i, c := range t.Columns {
		parts[i] = c.Name
		if collations && c.Collation != "" {
			parts[i] += " " + c.Collation
		}
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

// CompareDigests reads table from both sides into digests, streaming, each described by
// A (B must have the same column names in the same order): for tables too big to hold.
// The digests are equal exactly when the tables hold the same multiset of canonical
// rows (but for a hash collision).
func CompareDigests(ctx context.Context, a, b Side, table string) (da, db Digest, err error) {
	p, err := openPair(ctx, a, b)
	if err != nil {
		return da, db, err
	}
	defer p.close()
	ta, tb, readB, err := p.describe(ctx, table)
	if err != nil {
		return da, db, err
	}
	if d := columnsDiffer(ta, tb, false); d != "" {
		return da, db, fmt.Errorf("table %s: columns differ between %s and %s: %s", table, a, b, d)
	}
	err = p.both(
		func(c *sql.Conn) (err error) { da, err = ReadDigest(ctx, c, ta); return err },
		func(c *sql.Conn) (err error) { db, err = ReadDigest(ctx, c, readB); return err })
	return da, db, err
}

// MaxDiffsShown is how many differences per table AssertSame prints.
const MaxDiffsShown = 10

// AssertSame compares two schemas (CompareSchemas) and fails the test when they differ,
// printing up to MaxDiffsShown differences per table and a count per table. It returns
// the report of an equal comparison.
func AssertSame(t testing.TB, ctx context.Context, a, b Side, o Options) *Report {
	t.Helper()
	rep, err := CompareSchemas(ctx, a, b, o)
	if err != nil {
		t.Fatalf("compare %s with %s: %v", a, b, err)
	}
	if rep.Equal() {
		return rep
	}
	shown := map[string]int{}
	for _, d := range rep.Diffs {
		if shown[d.Table] < MaxDiffsShown {
			t.Errorf("%s", d)
		}
		shown[d.Table]++
	}
	var counts []string
	for _, name := range slices.Sorted(maps.Keys(shown)) {
		counts = append(counts, fmt.Sprintf("%s: %d", name, shown[name]))
	}
	t.Fatalf("%s differs from %s: %d differences (%s)", b, a, len(rep.Diffs), strings.Join(counts, ", "))
	return rep
}
