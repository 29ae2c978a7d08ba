package testenv

// The tests' one table comparator. It proves that two schemas hold the same data —
// typically TiDB read at a TSO and the fallback MariaDB that parity serve applied the
// changefeed to — with plain SQL and a little Go, and nothing of parity's own: not the
// checker (so a checker bug cannot hide an applier bug), not cdc or cdc/upstream (so the
// code under test does not read its own result). Tables and columns come from
// information_schema, every row of a table is read with a plain SELECT of its columns in
// the text protocol, and each value is compared in one canonical form:
//
//   - FLOAT by its float32 value and DOUBLE (REAL) by its float64 value, written back as
//     the shortest text that parses to them (servers print the same float differently).
//     A FLOAT is read as CAST(c AS DOUBLE): MariaDB prints a FLOAT with 6 significant
//     digits (1.2345678 as 1.23457, 16777216 as 16777200), which would make different
//     floats equal;
//   - every other type by the bytes the server sends, exactly (strings and binaries are
//     their bytes; numbers, temporal values, ENUM, SET, JSON their text).
//
// Rows are matched by their primary key (the whole row for a table without one) and
// compared as multisets, so a lost, an extra, a doubled or a differing row is reported
// with its table, key and column. For tables too big to hold, a Digest is the count and
// an order-independent hash of the canonical rows, read streaming.

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/tidb-parity/parity/internal/ident"
)

// Querier is what the readers need: a *sql.DB, *sql.Conn or *sql.Tx.
type Querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// Column is one column of a base table as information_schema.COLUMNS describes it.
type Column struct {
	Name       string
	DataType   string // DATA_TYPE in lower case: "int", "varchar", "float", ...
	ColumnType string // COLUMN_TYPE in lower case: "int unsigned", "enum('a','b')", "bit(10)", ...
	Collation  string // COLLATION_NAME; "" for a column without one
}

// Table is a base table: its columns in table order and its primary key.
type Table struct {
	Schema, Name string
	Columns      []Column
	// Key holds the positions in Columns of the primary key's columns, in key order;
	// empty for a table without a primary key, whose rows are keyed by all their values.
	Key []int
}

// Value is one value of a row.
type Value struct {
	Null bool
	// Text is the value as the server sent it in the text protocol: for strings and
	// binaries their bytes, for everything else its text (a FLOAT's as a DOUBLE).
	Text string
	// Canon is what is compared: Text, except for FLOAT and DOUBLE columns (see the
	// file comment).
	Canon string
}

// Row is one row of a table, its values in table order.
type Row []Value

// ListTables returns the names of the base tables of schema, sorted.
func ListTables(ctx context.Context, q Querier, schema string) ([]string, error) {
	rows, err := q.QueryContext(ctx, "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_TYPE = 'BASE TABLE'", schema)
	if err != nil {
		return nil, fmt.Errorf("list tables of %s: %w", schema, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, fmt.Errorf("list tables of %s: %w", schema, err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list tables of %s: %w", schema, err)
	}
	slices.Sort(out)
	return out, nil
}

// DescribeTable reads a table's columns and primary key from information_schema. A table
// without columns (one that does not exist) is an error.
func DescribeTable(ctx context.Context, q Querier, schema, table string) (*Table, error) {
	name := schema + "." + table
	rows, err := q.QueryContext(ctx, "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IFNULL(COLLATION_NAME, '') FROM information_schema.COLUMNS "+
		"WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION", schema, table)
	if err != nil {
		return nil, fmt.Errorf("read columns of %s: %w", name, err)
	}
	t := &Table{Schema: schema, Name: table}
	for rows.Next() {
		var c Column
		if err := rows.Scan(&c.Name, &c.DataType, &c.ColumnType, &c.Collation); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read columns of %s: %w", name, err)
		}
		c.DataType, c.ColumnType = strings.ToLower(c.DataType), strings.ToLower(c.ColumnType)
		t.Columns = append(t.Columns, c)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, fmt.Errorf("read columns of %s: %w", name, err)
	}
	if len(t.Columns) == 0 {
		return nil, fmt.Errorf("table %s does not exist (no columns in information_schema)", name)
	}
	rows, err = q.QueryContext(ctx, "SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE "+
		"WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND CONSTRAINT_NAME = 'PRIMARY' ORDER BY ORDINAL_POSITION", schema, table)
	if err != nil {
		return nil, fmt.Errorf("read the primary key of %s: %w", name, err)
	}
	defer rows.Close()
	for rows.Next() {
		var col string
		if err := rows.Scan(&col); err != nil {
			return nil, fmt.Errorf("read the primary key of %s: %w", name, err)
		}
		i := t.Col(col)
		if i < 0 {
			return nil, fmt.Errorf("table %s: primary key column %s is not among its columns", name, col)
		}
		t.Key = append(t.Key, i)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the primary key of %s: %w", name, err)
	}
	return t, nil
}

// Col returns the position of the named column (compared case-insensitively, as MySQL
// does), or -1.
func (t *Table) Col(name string) int {
	return slices.IndexFunc(t.Columns, func(c Column) bool { return strings.EqualFold(c.Name, name) })
}

// FullName is schema.table.
func (t *Table) FullName() string { return t.Schema + "." + t.Name }

// ColumnNames returns the column names in table order.
func (t *Table) ColumnNames() []string {
	out := make([]string, len(t.Columns))
	for i, c := range t.Columns {
		out[i] = c.Name
	}
	return out
}

// NewValue returns the value of column col whose text-protocol bytes are raw (nil for
// NULL), with its canonical form.
func (t *Table) NewValue(col int, raw []byte) (Value, error) {
	if raw == nil {
		return Value{Null: true}, nil
	}
	v := Value{Text: string(raw)}
	v.Canon = v.Text
	switch t.Columns[col].DataType {
	case "float":
		f, err := strconv.ParseFloat(v.Text, 32)
		if err != nil {
			return Value{}, fmt.Errorf("table %s column %s: FLOAT %q: %w", t.FullName(), t.Columns[col].Name, v.Text, err)
		}
		v.Canon = strconv.FormatFloat(f, 'g', -1, 32)
	case "double", "real":
		f, err := strconv.ParseFloat(v.Text, 64)
		if err != nil {
			return Value{}, fmt.Errorf("table %s column %s: DOUBLE %q: %w", t.FullName(), t.Columns[col].Name, v.Text, err)
		}
		v.Canon = strconv.FormatFloat(f, 'g', -1, 64)
	}
	return v, nil
}

// Show renders a value for a message and for the canonical line of its row: NULL, a
// number as it is, anything else Go-quoted (so every byte shows, and no text can pass
// for NULL, a number or a separator).
func Show(v Value) string {
	if v.Null {
		return "NULL"
	}
	if v.Canon != "" && strings.Trim(v.Canon, "0123456789.-+eE") == "" && v.Canon != "." {
		return v.Canon
	}
	return strconv.Quote(v.Canon)
}

// Line renders a row canonically, every column as name=value: two rows of the table are
// the same exactly when their lines are.
func (t *Table) Line(r Row) string {
	var b strings.Builder
	for i, v := range r {
		if i > 0 {
			b.WriteString(" | ")
		}
		b.WriteString(t.Columns[i].Name)
		b.WriteByte('=')
		b.WriteString(Show(v))
	}
	return b.String()
}

// KeyOf renders a row's key: its primary-key columns as name=value, or the whole row's
// line for a table without a primary key.
func (t *Table) KeyOf(r Row) string {
	if len(t.Key) == 0 {
		return t.Line(r)
	}
	var b strings.Builder
	for i, c := range t.Key {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(t.Columns[c].Name)
		b.WriteByte('=')
		b.WriteString(Show(r[c]))
	}
	return b.String()
}

// ScanRows reads every row of table t through q, in no particular order, calling fn with
// each (a fresh Row each time).
func ScanRows(ctx context.Context, q Querier, t *Table, fn func(Row) error) error {
	cols := make([]string, len(t.Columns))
	for i, c := range t.Columns {
		cols[i] = ident.Quote(c.Name)
		if c.DataType == "float" {
			cols[i] = "CAST(" + cols[i] + " AS DOUBLE)"
		}
	}
	rows, err := q.QueryContext(ctx, "SELECT "+strings.Join(cols, ", ")+" FROM "+ident.Table(t.Schema, t.Name))
	if err != nil {
		return fmt.Errorf("read %s: %w", t.FullName(), err)
	}
	defer rows.Close()
	raw := make([]sql.RawBytes, len(cols))
	dest := make([]any, len(cols))
	for i := range raw {
		dest[i] = &raw[i]
	}
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			return fmt.Errorf("read %s: %w", t.FullName(), err)
		}
		r := make(Row, len(cols))
		for i := range raw {
			if r[i], err = t.NewValue(i, raw[i]); err != nil {
				return err
			}
		}
		if err := fn(r); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read %s: %w", t.FullName(), err)
	}
	return nil
}

// ReadRows returns every row of table t, sorted by their lines.
func ReadRows(ctx context.Context, q Querier, t *Table) ([]Row, error) {
	var out []Row
	err := ScanRows(ctx, q, t, func(r Row) error { out = append(out, r); return nil })
	if err != nil {
		return nil, err
	}
	SortRows(t, out)
	return out, nil
}

// SortRows sorts rows of t by their lines.
func SortRows(t *Table, rows []Row) {
	type lined struct {
		line string
		row  Row
	}
	ls := make([]lined, len(rows))
	for i, r := range rows {
		ls[i] = lined{t.Line(r), r}
	}
	slices.SortStableFunc(ls, func(a, b lined) int { return strings.Compare(a.line, b.line) })
	for i := range ls {
		rows[i] = ls[i].row
	}
}

// Digest is a table's row count and an order-independent hash of its canonical rows:
// the sum, lane by lane modulo 2^64, of the first 16 bytes of each row's SHA-256. A
// doubled row counts twice; two tables with the same multiset of rows have the same
// digest.
type Digest struct {
	Rows int64
	Sum  [2]uint64
}

// Add adds one row.
func (d *Digest) Add(r Row) {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	for _, v := range r {
		if v.Null {
			h.Write([]byte{0})
			continue
		}
		h.Write([]byte{1})
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(v.Canon)))])
		h.Write([]byte(v.Canon))
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	d.Rows++
	d.Sum[0] += binary.BigEndian.Uint64(sum[0:8])
	d.Sum[1] += binary.BigEndian.Uint64(sum[8:16])
}

func (d Digest) String() string {
	return fmt.Sprintf("%d rows, hash %016x%016x", d.Rows, d.Sum[0], d.Sum[1])
}

// ReadDigest reads every row of table t through q into a Digest, holding one row at a
// time.
func ReadDigest(ctx context.Context, q Querier, t *Table) (Digest, error) {
	var d Digest
	err := ScanRows(ctx, q, t, func(r Row) error { d.Add(r); return nil })
	return d, err
}
