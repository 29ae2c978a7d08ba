package cdc

import (
	"strings"

	"github.com/tidb-parity/parity/cdc/open"
)

// quoteIdent is the one identifier escaper of the package: it back-quotes name,
// doubling embedded back-quotes.
func quoteIdent(name string) string {
	return "`" + strings.ReplaceAll(name, "`", "``") + "`"
}

// quoteTable returns `schema`.`table`.
func quoteTable(schema, table string) string {
	return quoteIdent(schema) + "." + quoteIdent(table)
}

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

// colSignature identifies a column list, so rows with the same columns share a statement.
func colSignature(cols []open.Column) string {
	var b strings.Builder
	for _, c := range cols {
		b.WriteString(c.Name)
		b.WriteByte(0)
	}
	return b.String()
}

// writeMode says how rows are written.
type writeMode uint8

const (
	modeUpsert  writeMode = iota // INSERT ... ON DUPLICATE KEY UPDATE: handle is the only unique key
	modeReplace                  // REPLACE: other unique keys exist, evict stale holders
	modeInsert                   // plain INSERT: tables without a handle (rows are appended)
)

// buildUpsert returns a multi-row INSERT ... ON DUPLICATE KEY UPDATE, REPLACE or INSERT
// for rows that all have the column list of rows[0].
func buildUpsert(schema, table string, rows [][]open.Column, mode writeMode) (string, []any) {
	cols := rows[0]
	var b strings.Builder
	if mode == modeReplace {
		b.WriteString("REPLACE INTO ")
	} else {
		b.WriteString("INSERT INTO ")
	}
	b.WriteString(quoteTable(schema, table))
	b.WriteString(" (")
	for i, c := range cols {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(quoteIdent(c.Name))
	}
	b.WriteString(") VALUES ")
	ph := "(" + strings.TrimSuffix(strings.Repeat("?,", len(cols)), ",") + ")"
	args := make([]any, 0, len(rows)*len(cols))
	for i, r := range rows {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(ph)
		for _, c := range r {
			args = append(args, c.Value)
		}
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
			q := quoteIdent(c.Name)
			b.WriteString(q + "=VALUES(" + q + ")")
			n++
		}
		if n == 0 {
			q := quoteIdent(cols[0].Name)
			b.WriteString(q + "=" + q)
		}
	}
	return b.String(), args
}

// buildDeleteByHandle deletes rows by their handle-key values; keys all have the column
// list of keys[0].
func buildDeleteByHandle(schema, table string, keys [][]open.Column) (string, []any) {
	var b strings.Builder
	b.WriteString("DELETE FROM ")
	b.WriteString(quoteTable(schema, table))
	b.WriteString(" WHERE ")
	args := make([]any, 0, len(keys)*len(keys[0]))
	if len(keys[0]) == 1 {
		b.WriteString(quoteIdent(keys[0][0].Name))
		b.WriteString(" IN (")
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteByte('?')
			args = append(args, k[0].Value)
		}
		b.WriteByte(')')
		return b.String(), args
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
			b.WriteString(quoteIdent(c.Name))
			b.WriteString("=?")
			args = append(args, c.Value)
		}
		b.WriteByte(')')
	}
	return b.String(), args
}

// buildDeleteOne deletes exactly one row equal to cols on every column (a table without
// a primary or unique key): duplicates stay duplicates.
func buildDeleteOne(schema, table string, cols []open.Column) (string, []any) {
	var b strings.Builder
	b.WriteString("DELETE FROM ")
	b.WriteString(quoteTable(schema, table))
	b.WriteString(" WHERE ")
	args := make([]any, 0, len(cols))
	for i, c := range cols {
		if i > 0 {
			b.WriteString(" AND ")
		}
		b.WriteString(quoteIdent(c.Name))
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
