package cdc

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/internal/rowkey"
)

// tableInfo is what the applier knows of a downstream table, read from the downstream's
// schema (not from the events: an event's columns say what that event carries, not what
// the table is — a handle-key-only delete carries no unique-key flags, and the open
// protocol carries no collation). It decides, per table, how every version of every key
// is written and routed.
type tableInfo struct {
	// exists is false when the downstream has no such table (yet): rows are then
	// written through one ordered connection, in the mode their flags ask for, and
	// the statements' own errors say what is wrong.
	exists bool
	// uniques lists the column names (lower-cased) of each unique index.
	uniques [][]string
	// classes gives the rowkey class of each column by lower-cased name (column names
	// are case-insensitive); a column missing here is Opaque when it holds text.
	classes map[string]rowkey.Class
	// loadable tells, by lower-cased name, the columns whose type LOAD DATA reads as
	// INSERT reads their literals (load.go).
	loadable map[string]bool
	// triggers is true when the downstream table has triggers: its upserts are then
	// never written as LOAD DATA ... REPLACE (a trigger would see deletes).
	triggers bool
	// noLoad is set once a LOAD DATA of the table left warnings: its rows are written
	// with INSERT until the next DDL reads the table again.
	noLoad atomic.Bool
}

// otherUnique reports whether the table has a unique index other than the one on the
// handle columns (of cols, a row of the table): a row's write can then conflict with
// another key's row, so rows are written by REPLACE (evicting stale holders) through one
// ordered connection.
func (t *tableInfo) otherUnique(cols []open.Column) bool {
	var handle []string
	for i := range cols {
		if cols[i].IsHandle() {
			handle = append(handle, strings.ToLower(cols[i].Name))
		}
	}
	for _, u := range t.uniques {
		if !slices.Equal(u, handle) {
			return true
		}
	}
	return false
}

// class returns the key class of column c.
func (t *tableInfo) class(c *open.Column) rowkey.Class {
	switch c.Type {
	case open.TypeVarchar, open.TypeVarString, open.TypeString,
		open.TypeTinyBlob, open.TypeBlob, open.TypeMediumBlob, open.TypeLongBlob:
	default:
		return rowkey.Exact // numbers, DECIMAL and temporal text, ENUM/SET, BIT
	}
	if k, ok := t.classes[strings.ToLower(c.Name)]; ok {
		return k
	}
	return rowkey.Opaque
}

// routeKey appends the collation-aware key of a row's handle columns (the columns of
// cols flagged as handle). ok is false when a value cannot be folded safely: the key may
// then equal another key of the table whose encoding differs.
func (t *tableInfo) routeKey(dst []byte, cols []open.Column) ([]byte, bool) {
	all := true
	for i := range cols {
		c := &cols[i]
		if !c.IsHandle() {
			continue
		}
		var ok bool
		dst, ok = rowkey.Append(dst, c.Value, t.class(c))
		all = all && ok
	}
	return dst, all
}

// tableInfos caches tableInfo per downstream table until the next DDL.
type tableInfos struct {
	load func(ctx context.Context, schema, table string) (*tableInfo, error)

	mu sync.Mutex
	m  map[[2]string]*tableInfo
}

func newTableInfos(load func(ctx context.Context, schema, table string) (*tableInfo, error)) *tableInfos {
	return &tableInfos{load: load, m: map[[2]string]*tableInfo{}}
}

// get returns the table's info, reading it on first use after a DDL.
func (ti *tableInfos) get(ctx context.Context, schema, table string) (*tableInfo, error) {
	k := [2]string{schema, table}
	ti.mu.Lock()
	t := ti.m[k]
	ti.mu.Unlock()
	if t != nil {
		return t, nil
	}
	t, err := ti.load(ctx, schema, table)
	if err != nil {
		return nil, err
	}
	if t.exists { // a table created later (not by the changefeed) is read again
		ti.mu.Lock()
		ti.m[k] = t
		ti.mu.Unlock()
	}
	return t, nil
}

// forget drops everything read: a DDL may have changed any table (RENAME, indexes,
// collations).
func (ti *tableInfos) forget() {
	ti.mu.Lock()
	clear(ti.m)
	ti.mu.Unlock()
}

// loadTableInfo reads a table's unique indexes and column collations from the
// downstream's information_schema.
func loadTableInfo(ctx context.Context, db *sql.DB, schema, table string) (*tableInfo, error) {
	t := &tableInfo{classes: map[string]rowkey.Class{}, loadable: map[string]bool{}}
	rows, err := db.QueryContext(ctx,
		"SELECT COLUMN_NAME, COALESCE(COLLATION_NAME, ''), DATA_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA=? AND TABLE_NAME=?",
		schema, table)
	if err != nil {
		return nil, fmt.Errorf("reading the columns of %s.%s: %w", schema, table, err)
	}
	defer rows.Close()
	for rows.Next() {
		var name, coll, typ string
		if err := rows.Scan(&name, &coll, &typ); err != nil {
			return nil, fmt.Errorf("reading the columns of %s.%s: %w", schema, table, err)
		}
		t.exists = true
		t.classes[strings.ToLower(name)] = rowkey.ClassOf(coll)
		t.loadable[strings.ToLower(name)] = loadType(typ)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading the columns of %s.%s: %w", schema, table, err)
	}
	if !t.exists {
		return t, nil
	}
	var triggers int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.TRIGGERS WHERE EVENT_OBJECT_SCHEMA=? AND EVENT_OBJECT_TABLE=?",
		schema, table).Scan(&triggers); err != nil {
		return nil, fmt.Errorf("reading the triggers of %s.%s: %w", schema, table, err)
	}
	t.triggers = triggers > 0
	// Index columns in the table's column order, as TiCDC lists a row's handle columns.
	// Both sides of the join name the table with constants: MariaDB reads only that
	// table's definition for each. Joined on s's columns, it filled COLUMNS from every
	// table of the server (135 views opened, 3,651 rows into a temporary table, per
	// table, on the test server's 354 tables; a fallback holds many more).
	irows, err := db.QueryContext(ctx, `SELECT s.INDEX_NAME, s.COLUMN_NAME, s.SUB_PART IS NOT NULL
FROM information_schema.STATISTICS s JOIN information_schema.COLUMNS c ON c.COLUMN_NAME=s.COLUMN_NAME
WHERE s.TABLE_SCHEMA=? AND s.TABLE_NAME=? AND c.TABLE_SCHEMA=? AND c.TABLE_NAME=? AND s.NON_UNIQUE=0
ORDER BY s.INDEX_NAME, c.ORDINAL_POSITION`, schema, table, schema, table)
	if err != nil {
		return nil, fmt.Errorf("reading the indexes of %s.%s: %w", schema, table, err)
	}
	defer irows.Close()
	last := ""
	for irows.Next() {
		var index, col string
		var prefix bool
		if err := irows.Scan(&index, &col, &prefix); err != nil {
			return nil, fmt.Errorf("reading the indexes of %s.%s: %w", schema, table, err)
		}
		if len(t.uniques) == 0 || index != last {
			t.uniques = append(t.uniques, nil)
			last = index
		}
		n := len(t.uniques) - 1
		col = strings.ToLower(col)
		if prefix {
			col += "(prefix)" // unique on a prefix: conflicts between different keys
		}
		t.uniques[n] = append(t.uniques[n], col)
	}
	if err := irows.Err(); err != nil {
		return nil, fmt.Errorf("reading the indexes of %s.%s: %w", schema, table, err)
	}
	return t, nil
}
