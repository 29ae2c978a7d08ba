package cdc

import (
	"bytes"
	"encoding/hex"
	"slices"
	"strconv"
	"strings"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/internal/ident"
)

// writable returns the columns that are written downstream (generated ones never are).
func writable(cols []open.Column) []open.Column {
	for _, c := range cols {
		if c.IsGenerated() {
			out := make([]open.Column, 0, len(cols))
			for _, c := range cols {
				if !c.IsGenerated() {
					out = append(out, c)
				}
			}
			return out
		}
	}
	return cols
}

// handleCols returns the handle-key columns of a row, nil for a keyless table.
func handleCols(cols []open.Column) []open.Column {
	var out []open.Column
	for _, c := range cols {
		if c.IsHandle() {
			out = append(out, c)
		}
	}
	return out
}

// hasOtherUnique reports whether a non-handle column belongs to a unique index: then an
// upsert must use REPLACE so a stale row holding the unique value is evicted.
func hasOtherUnique(cols []open.Column) bool {
	for _, c := range cols {
		if c.Flags&open.FlagUniqueKey != 0 && !c.IsHandle() {
			return true
		}
	}
	return false
}

// hasHandle reports whether a row has handle-key columns (false for a keyless table).
func hasHandle(cols []open.Column) bool {
	for _, c := range cols {
		if c.IsHandle() {
			return true
		}
	}
	return false
}

// sameNames reports whether two rows have the same column list, so that they can share
// a statement.
func sameNames(a, b []open.Column) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name {
			return false
		}
	}
	return true
}

// writeMode says how rows are written.
type writeMode uint8

const (
	modeUpsert  writeMode = iota // INSERT ... ON DUPLICATE KEY UPDATE: handle is the only unique key
	modeReplace                  // REPLACE: other unique keys exist, evict stale holders
	modeInsert                   // plain INSERT: tables without a handle (rows are appended)
)

// stmt assembles a statement. Values are written as SQL literals when every value of
// the statement has a literal that means the same under any sql_mode (see literalOK);
// otherwise as placeholders that the driver fills in. Literals spare the driver a second
// pass over the statement and a copy of it. The text is appended to a caller's buffer
// (the apply workers reuse theirs: see stmtTexts).
type stmt struct {
	buf     []byte
	literal bool
	args    []any
	scratch []byte
}

// newStmt starts a statement in dst's array (reused from its start) when it has room
// for size bytes of values, else in a new one.
func newStmt(dst []byte, literal bool, values, size int) *stmt {
	s := &stmt{literal: literal}
	if literal {
		s.buf = slices.Grow(dst[:0], size+64)
	} else {
		s.buf = slices.Grow(dst[:0], 64+2*values)
		s.args = make([]any, 0, values)
	}
	return s
}

// WriteString, WriteByte and Write append to the statement (as strings.Builder's do).
func (s *stmt) WriteString(x string) (int, error) {
	s.buf = append(s.buf, x...)
	return len(x), nil
}

func (s *stmt) WriteByte(c byte) error {
	s.buf = append(s.buf, c)
	return nil
}

func (s *stmt) Write(p []byte) (int, error) {
	s.buf = append(s.buf, p...)
	return len(p), nil
}

// value writes v as a literal or a placeholder.
func (s *stmt) value(v any) {
	if !s.literal {
		s.WriteByte('?')
		s.args = append(s.args, v)
		return
	}
	switch v := v.(type) {
	case nil:
		s.WriteString("NULL")
	case int64:
		s.scratch = strconv.AppendInt(s.scratch[:0], v, 10)
		s.Write(s.scratch)
	case uint64:
		s.scratch = strconv.AppendUint(s.scratch[:0], v, 10)
		s.Write(s.scratch)
	case float64:
		// As the driver interpolates a float64 parameter.
		s.scratch = strconv.AppendFloat(s.scratch[:0], v, 'g', -1, 64)
		s.Write(s.scratch)
	case string:
		// No backslash or NUL (literalOK): doubling the quote is the only escape
		// needed, and it means the same with and without NO_BACKSLASH_ESCAPES.
		s.WriteByte('\'')
		for {
			i := strings.IndexByte(v, '\'')
			if i < 0 {
				break
			}
			s.WriteString(v[:i+1])
			s.WriteByte('\'')
			v = v[i+1:]
		}
		s.WriteString(v)
		s.WriteByte('\'')
	case []byte:
		if v == nil {
			s.WriteString("NULL")
			return
		}
		// A binary string, as the driver's _binary'...'.
		s.WriteString("_binary X'")
		s.scratch = hex.AppendEncode(s.scratch[:0], v)
		s.Write(s.scratch)
		s.WriteByte('\'')
	}
}

func (s *stmt) done() ([]byte, []any) { return s.buf, s.args }

// literalOK reports whether every value has a literal stmt writes: NULL, integers,
// floats, byte strings (hex) and strings without a backslash or NUL (whose escaping
// depends on the session's sql_mode NO_BACKSLASH_ESCAPES).
func literalOK(rows [][]open.Column) bool {
	for _, r := range rows {
		for _, c := range r {
			switch v := c.Value.(type) {
			case nil, int64, uint64, float64, []byte:
			case string:
				if strings.IndexByte(v, '\\') >= 0 || strings.IndexByte(v, 0) >= 0 {
					return false
				}
			default:
				return false
			}
		}
	}
	return true
}

// buildUpsert returns a multi-row INSERT ... ON DUPLICATE KEY UPDATE, REPLACE or INSERT
// for rows that all have the column list of rows[0]. args is nil when the values are
// written as literals.
func buildUpsert(schema, table string, rows [][]open.Column, mode writeMode) (string, []any) {
	q, args := appendUpsert(nil, schema, table, rows, mode)
	return string(q), args
}

// appendUpsert is buildUpsert writing the statement into dst's array (see newStmt).
func appendUpsert(dst []byte, schema, table string, rows [][]open.Column, mode writeMode) ([]byte, []any) {
	cols := rows[0]
	size := 0
	for _, r := range rows {
		size += rowBytes(r)
	}
	b := newStmt(dst, literalOK(rows), len(rows)*len(cols), size+16*len(cols))
	if mode == modeReplace {
		b.WriteString("REPLACE INTO ")
	} else {
		b.WriteString("INSERT INTO ")
	}
	b.WriteString(ident.Table(schema, table))
	b.WriteString(" (")
	for i, c := range cols {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(ident.Quote(c.Name))
	}
	b.WriteString(") VALUES ")
	for i, r := range rows {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('(')
		for j, c := range r {
			if j > 0 {
				b.WriteByte(',')
			}
			b.value(c.Value)
		}
		b.WriteByte(')')
	}
	if mode == modeUpsert {
		b.WriteString(" ON DUPLICATE KEY UPDATE ")
		n := 0
		for _, c := range cols {
			if c.IsHandle() {
				continue
			}
			if n > 0 {
				b.WriteByte(',')
			}
			q := ident.Quote(c.Name)
			b.WriteString(q + "=VALUES(" + q + ")")
			n++
		}
		if n == 0 {
			q := ident.Quote(cols[0].Name)
			b.WriteString(q + "=" + q)
		}
	}
	return b.done()
}

// buildDeleteByHandle deletes rows by their handle-key values; keys all have the column
// list of keys[0]. args is nil when the values are written as literals.
func buildDeleteByHandle(schema, table string, keys [][]open.Column) (string, []any) {
	q, args := appendDeleteByHandle(nil, schema, table, keys)
	return string(q), args
}

// appendDeleteByHandle is buildDeleteByHandle writing the statement into dst's array
// (see newStmt).
func appendDeleteByHandle(dst []byte, schema, table string, keys [][]open.Column) ([]byte, []any) {
	size := 0
	for _, k := range keys {
		size += rowBytes(k) + 8*len(k)
	}
	b := newStmt(dst, literalOK(keys), len(keys)*len(keys[0]), size)
	b.WriteString("DELETE FROM ")
	b.WriteString(ident.Table(schema, table))
	b.WriteString(" WHERE ")
	if len(keys[0]) == 1 {
		b.WriteString(ident.Quote(keys[0][0].Name))
		b.WriteString(" IN (")
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			b.value(k[0].Value)
		}
		b.WriteByte(')')
		return b.done()
	}
	for i, k := range keys {
		if i > 0 {
			b.WriteString(" OR ")
		}
		b.WriteByte('(')
		for j, c := range k {
			if j > 0 {
				b.WriteString(" AND ")
			}
			b.WriteString(ident.Quote(c.Name))
			b.WriteByte('=')
			b.value(c.Value)
		}
		b.WriteByte(')')
	}
	return b.done()
}

// buildDeleteOne deletes exactly one row equal to cols on every column (a table without
// a primary or unique key): duplicates stay duplicates.
func buildDeleteOne(schema, table string, cols []open.Column) (string, []any) {
	var b strings.Builder
	b.WriteString("DELETE FROM ")
	b.WriteString(ident.Table(schema, table))
	b.WriteString(" WHERE ")
	args := make([]any, 0, len(cols))
	for i, c := range cols {
		if i > 0 {
			b.WriteString(" AND ")
		}
		b.WriteString(ident.Quote(c.Name))
		if c.Value == nil {
			b.WriteString(" IS NULL")
			continue
		}
		switch c.Type {
		case open.TypeFloat:
			// A FLOAT column holds a float32; compare at that precision.
			b.WriteString("=CAST(? AS FLOAT)")
		default:
			b.WriteString("=?")
		}
		args = append(args, c.Value)
	}
	b.WriteString(" LIMIT 1")
	return b.String(), args
}

// estimateSize approximates the memory an event holds, for the buffer's bound.
func estimateSize(ev *open.Event) int64 {
	n := int64(160 + len(ev.Schema) + len(ev.Table))
	for _, cols := range [2][]open.Column{ev.Columns, ev.OldColumns} {
		for _, c := range cols {
			n += 48 + int64(len(c.Name))
			switch v := c.Value.(type) {
			case string:
				n += int64(len(v))
			case []byte:
				n += int64(len(v))
			case nil:
			default:
				n += 8
			}
		}
	}
	return n
}

// oldRow returns the complete old row of an update. With TiCDC's
// only-output-updated-columns the old row ("p") holds only the changed columns; the
// unchanged ones are taken from the new row.
func oldRow(ev *open.Event) []open.Column {
	if len(ev.OldColumns) >= len(ev.Columns) {
		return ev.OldColumns
	}
	out := make([]open.Column, len(ev.Columns))
	copy(out, ev.Columns)
	for _, o := range ev.OldColumns {
		for i := range out {
			if out[i].Name == o.Name {
				out[i] = o
				break
			}
		}
	}
	return out
}

// handleChanged reports whether an update moves its row to another handle: the handle
// columns of its old row (oldRow, writable) and of its new row (cols) are as many and
// differ in a name or value. It is handleCols of both compared, without building them.
func handleChanged(ev *open.Event, cols []open.Column) bool {
	complete := len(ev.OldColumns) >= len(ev.Columns)
	src := ev.Columns
	if complete {
		src = ev.OldColumns
	}
	j, differ := 0, false
	for k := range src {
		v := &src[k]
		if !complete { // the old row lists only changed columns
			for i := range ev.OldColumns {
				if ev.OldColumns[i].Name == v.Name {
					v = &ev.OldColumns[i]
					break
				}
			}
		}
		if v.IsGenerated() || !v.IsHandle() {
			continue
		}
		for j < len(cols) && !cols[j].IsHandle() {
			j++
		}
		if j == len(cols) {
			return false // more old handle columns than new ones
		}
		if cols[j].Name != v.Name || !valueEqual(cols[j].Value, v.Value) {
			differ = true
		}
		j++
	}
	for ; j < len(cols); j++ {
		if cols[j].IsHandle() {
			return false // more new handle columns than old ones
		}
	}
	return differ
}

func valueEqual(x, y any) bool {
	if bx, ok := x.([]byte); ok {
		by, ok := y.([]byte)
		return ok && bytes.Equal(bx, by)
	}
	if _, ok := y.([]byte); ok {
		return false
	}
	return x == y
}

func rowBytes(cols []open.Column) int {
	n := 0
	for _, c := range cols {
		switch v := c.Value.(type) {
		case string:
			n += len(v) + 3
		case []byte:
			n += 2*len(v) + 10
		default:
			n += 21
		}
	}
	return n
}
