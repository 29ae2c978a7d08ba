package checker

// fix.go owns fix SQL, which makes the downstream equal to the upstream: the statements
// of a difference, built when it is stored, and a table's fix SQL streamed from the
// stored differences, the one form of it, which parity diff writes to its fix files
// (report.go) and RunFixSQL hands to callers outside the checker (the daemon's API). It
// must not execute fix SQL.

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"

	"github.com/tidb-parity/parity/internal/ident"
)

// Fix SQL makes the downstream equal to the upstream. Statements are written per table in
// two groups, deletes first: under a _ci key, a row whose key differs only in case is
// reported as one extra and one missing row, and deleting before inserting keeps the
// insert. Values are literals that do not depend on the session's sql_mode.

// insertColumns returns the columns a fix statement writes for an upstream row: the
// compared ones, and the carried ones it was read with.
func (p *tablePlan) insertColumns(row []sqlValue) []planColumn {
	return slices.Concat(p.Columns, p.Carried[:len(row)-len(p.Columns)])
}

func columnList(cols []planColumn) string {
	names := make([]string, len(cols))
	for i, c := range cols {
		names[i] = ident.Quote(c.Name)
	}
	return strings.Join(names, ", ")
}

// fixLiteralBytes is the longest literal a fix statement holds. A longer value (a wide
// BLOB, TEXT or JSON) is first built in a user variable from hexadecimal pieces of
// fixPieceBytes bytes, one SET statement each, so that no statement of a fix file
// approaches a server's max_allowed_packet (16 MiB by default on MariaDB and MySQL
// before 8.0; a 9 MiB BLOB is an 18 MiB hexadecimal literal).
const (
	fixLiteralBytes = 512 << 10
	fixPieceBytes   = 128 << 10
)

// fixStatement builds one fix statement and the statements that prepare its long values.
type fixStatement struct {
	pre  []string // SET @parity_vN pieces
	vars []string // the variables, cleared after the statement
}

// lit returns the SQL of value v of column c: its literal, or for a long value a user
// variable built by pre-statements (a string or JSON value converted from the variable's
// bytes as utf8mb4, as its literal would be read).
func (f *fixStatement) lit(c planColumn, v sqlValue) string {
	// A literal is never shorter than its value's bytes: a longer value is not rendered
	// whole only to be measured.
	if len(v.Bytes) <= fixLiteralBytes {
		if l := sqlLiteral(c.Kind, v); len(l) <= fixLiteralBytes {
			return l
		}
	}
	name := fmt.Sprintf("@parity_v%d", len(f.vars))
	f.vars = append(f.vars, name)
	for i := 0; i < len(v.Bytes); i += fixPieceBytes {
		piece := hexLiteral(v.Bytes[i:min(i+fixPieceBytes, len(v.Bytes))])
		if i == 0 {
			f.pre = append(f.pre, "SET "+name+" = "+piece+";")
		} else {
			f.pre = append(f.pre, "SET "+name+" = CONCAT("+name+", "+piece+");")
		}
	}
	if c.Kind == kindString || c.Kind == kindJSON {
		return "CONVERT(" + name + " USING utf8mb4)"
	}
	return name
}

// sql returns stmt with its preparation before and the variables cleared after it.
func (f *fixStatement) sql(stmt string) string {
	if len(f.vars) == 0 {
		return stmt
	}
	var sb strings.Builder
	for _, s := range f.pre {
		sb.WriteString(s)
		sb.WriteByte('\n')
	}
	sb.WriteString(stmt)
	sb.WriteString("\nSET ")
	for i, v := range f.vars {
		if i > 0 {
			sb.WriteString(", ")
		}
		sb.WriteString(v + " = NULL")
	}
	sb.WriteByte(';')
	return sb.String()
}

func valueList(f *fixStatement, cols []planColumn, row []sqlValue) string {
	vals := make([]string, len(cols))
	for i, c := range cols {
		vals[i] = f.lit(c, row[i])
	}
	return strings.Join(vals, ", ")
}

// upsert writes the upstream row: REPLACE when every downstream column is compared and no
// foreign key references the table, otherwise INSERT ... ON DUPLICATE KEY UPDATE, so that
// ignored columns keep their values and children of the row are not deleted by an ON
// DELETE CASCADE (REPLACE deletes the old row before it inserts the new one).
func (p *tablePlan) upsert(row []sqlValue) string {
	var f fixStatement
	t := p.table(downSide)
	cols := p.insertColumns(row)
	if !p.PartialColumns && !p.Referenced {
		return f.sql(fmt.Sprintf("REPLACE INTO %s (%s) VALUES (%s);", t, columnList(cols), valueList(&f, cols, row)))
	}
	// An existing row keeps what is not compared: only the compared columns are updated.
	sets := make([]string, 0, len(p.Columns))
	for _, c := range p.Columns {
		sets = append(sets, ident.Quote(c.Name)+" = VALUES("+ident.Quote(c.Name)+")")
	}
	return f.sql(fmt.Sprintf("INSERT INTO %s (%s) VALUES (%s) ON DUPLICATE KEY UPDATE %s;", t, columnList(cols), valueList(&f, cols, row), strings.Join(sets, ", ")))
}

// difference returns a difference of kind about row, with its key.
func (p *tablePlan) difference(kind DiffKind, row []sqlValue) Difference {
	d := Difference{Kind: kind}
	d.Key, d.rk = p.keyFor(row)
	return d
}

func (p *tablePlan) missing(row []sqlValue, n int) Difference {
	d := p.difference(Missing, row)
	if p.Keyless {
		var f fixStatement
		cols := p.insertColumns(row)
		stmt := fmt.Sprintf("INSERT INTO %s (%s) VALUES (%s);", p.table(downSide), columnList(cols), valueList(&f, cols, row))
		d.fix = f.sql(strings.TrimSuffix(strings.Repeat(stmt+"\n", n), "\n"))
		if n > 1 {
			d.Count = n
		}
		return d
	}
	d.fix = p.upsert(row)
	return d
}

func (p *tablePlan) differing(row []sqlValue, cols []string) Difference {
	d := p.difference(Differing, row)
	d.Columns, d.fix = cols, p.upsert(row)
	return d
}

func (p *tablePlan) extra(row []sqlValue, n int) Difference {
	d := p.difference(Extra, row)
	var f fixStatement
	var conds []string
	if p.Keyless {
		// Exact-row delete, as many copies as extra: NULL-safe equality on every column,
		// and for text also equal bytes. The column's collation alone would take 'A' for
		// 'a' or 'a ' for 'a' (and so perhaps delete a copy of another row); the bytes are
		// compared as utf8mb4, as they were read. The collation's equality stays first, so
		// that an index on the column can still narrow the delete.
		for i, c := range p.Columns {
			l := f.lit(c, row[i])
			cond := ident.Quote(c.Name) + " <=> " + l
			if c.Kind == kindString && !row[i].Null {
				f := p.Flavor[downSide]
				cond += " AND " + byteString(f, p.text(downSide, c)) + " = " + byteString(f, l)
			}
			conds = append(conds, cond)
		}
		if n > 1 {
			d.Count = n
		}
	} else {
		for _, k := range p.Key {
			c := p.Columns[k]
			conds = append(conds, ident.Quote(c.Name)+" = "+f.lit(c, row[k]))
		}
	}
	d.fix = f.sql(fmt.Sprintf("DELETE FROM %s WHERE %s LIMIT %d;", p.table(downSide), strings.Join(conds, " AND "), n))
	return d
}

// fixHeader starts a table's fix SQL (a fix file, or RunFixSQL's first statements): down
// and up are the quoted downstream and upstream table names.
func fixHeader(runID, down, up string) string {
	return fmt.Sprintf("-- parity diff run %s: make %s equal to upstream %s.\n"+
		"-- Review before applying. Deletes come first. The rows are the upstream's as the run read them:\n"+
		"-- apply while nothing else writes these rows (replication into the table caught up and paused),\n"+
		"-- or a later change may be overwritten with an older one.\n"+
		"-- Text values are written as utf8mb4 (plain, or _utf8mb4 X'..').\n"+
		"SET NAMES utf8mb4;\n"+
		"SET SESSION time_zone = '+00:00';\n"+
		"-- Zero dates are data here (the upstream holds them): allow them, and keep the rest of sql_mode.\n"+
		"SET SESSION sql_mode = TRIM(BOTH ',' FROM REPLACE(REPLACE(CONCAT(',', @@SESSION.sql_mode, ','), ',NO_ZERO_DATE,', ','), ',NO_ZERO_IN_DATE,', ','));\n",
		runID, down, up)
}

// fixSQL streams table t's fix SQL to emit: the header, then the stored fix statements
// (deletes first), each ending in ";\n". Without stored differences only the header
// is emitted when always is set (a fix file is never empty), else nothing.
func (s *store) fixSQL(ctx context.Context, t storedTable, always bool, emit func(sql string) error) error {
	header := false
	head := func() error {
		header = true
		return emit(fixHeader(s.runID, ident.Table(t.downSchema, t.downName), ident.Table(t.upSchema, t.upTable)))
	}
	if always {
		if err := head(); err != nil {
			return err
		}
	}
	return s.differences(ctx, t.idx, -1, true, func(_ Difference, fix string) error {
		if !header {
			if err := head(); err != nil {
				return err
			}
		}
		return emit(fix + "\n")
	})
}

// RunFixSQL streams the fix SQL of the finished checker run runID in the meta schema
// metaSchema of db — exactly what parity diff writes to its fix files — table by table
// in the run's order: emit gets the downstream table ("schema.table", unquoted) and
// whole statements (first the table's header of SET statements and comments, then one
// call per difference's statements, deletes first), each ending in ";\n". Tables
// without differences emit nothing. tables filters as RunDifferences does; an unknown
// run is ErrRunNotFound, one still running ErrRunRunning.
func RunFixSQL(ctx context.Context, db *sql.DB, metaSchema, runID string, tables []string, emit func(table, sql string) error) error {
	s, keep, err := finishedRun(ctx, db, metaSchema, runID, tables)
	if err != nil {
		return err
	}
	for _, t := range keep {
		name := t.downSchema + "." + t.downName
		if err := s.fixSQL(ctx, t, false, func(sql string) error { return emit(name, sql) }); err != nil {
			return err
		}
	}
	return nil
}
