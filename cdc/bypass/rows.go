package bypass

// rows.go owns row events: which transaction a change belongs to and whether it is
// parity's (commit, rows), and what the detector knows of a watched table to read a
// row's key (tableInfo, column: the key's columns and their text). It must not write the
// meta schema (store.go does).

import (
	"context"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-mysql-org/go-mysql/replication"

	"github.com/tidb-parity/parity/internal/bypasslog"
	"github.com/tidb-parity/parity/internal/metaschema"
)

func gtidOf(e *replication.GTIDEvent) string {
	return fmt.Sprintf("%s:%d", uuidText(e.SID), e.GNO)
}

func uuidText(b []byte) string {
	if len(b) != 16 {
		return hex.EncodeToString(b)
	}
	h := hex.EncodeToString(b)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// commit ends the transaction cur at the event with header h: its changes become
// pending unless it carries parity's marker.
func (s *session) commit(cur *txn, file string, h *replication.EventHeader) {
	at := position{File: file, Pos: h.LogPos, Time: time.Unix(int64(h.Timestamp), 0).UTC()}
	if cur != nil {
		at.GTID = cur.gtid
	}
	if h.LogPos == 0 { // an artificial event: no place to resume from
		at.Pos = s.read.Pos
	}
	s.read = at
	if cur == nil {
		s.dirty = true
		return
	}
	if !cur.own || !cur.rows {
		s.dirty = true
	}
	if cur.marked || len(cur.changes) == 0 {
		return
	}
	for i := range cur.changes {
		cur.changes[i].at = at
		cur.changes[i].server = h.ServerID
	}
	if cur.dropped > 0 {
		s.d.log.Warn("a write that bypassed parity changed more rows than are recorded", "changefeed", s.d.cfg.Changefeed,
			"gtid", at.GTID, "position", at.String(), "recorded", len(cur.changes), "not_recorded", cur.dropped)
	}
	s.pending = append(s.pending, cur.changes...)
}

// rows handles a row event of transaction cur.
func (s *session) rows(ctx context.Context, cur *txn, h *replication.EventHeader, e *replication.RowsEvent) {
	cur.rows = true
	if cur.marked || e.Table == nil {
		return
	}
	schema, table := string(e.Table.Schema), string(e.Table.Table)
	meta := s.d.cfg.MetaSchema
	if schema == meta {
		switch table {
		case bypasslog.MarkerTable:
			cur.marked = true
			cur.changes, cur.dropped = nil, 0
			s.markDDLThreads(e)
		case bypasslog.PositionTable, bypasslog.WritesTable:
		default:
			cur.own = false
		}
		return
	}
	cur.own = false
	info := s.table(ctx, schema, table)
	if !info.watched {
		return
	}
	var kind string
	switch h.EventType {
	case replication.WRITE_ROWS_EVENTv0, replication.WRITE_ROWS_EVENTv1, replication.WRITE_ROWS_EVENTv2, replication.MARIADB_WRITE_ROWS_COMPRESSED_EVENT_V1:
		kind = bypasslog.KindInsert
	case replication.UPDATE_ROWS_EVENTv0, replication.UPDATE_ROWS_EVENTv1, replication.UPDATE_ROWS_EVENTv2, replication.PARTIAL_UPDATE_ROWS_EVENT,
		replication.MARIADB_UPDATE_ROWS_COMPRESSED_EVENT_V1:
		kind = bypasslog.KindUpdate
	default:
		kind = bypasslog.KindDelete
	}
	add := func(row []any, prev *change) *change {
		if len(cur.changes) >= maxTxnChanges {
			cur.dropped++
			return nil
		}
		c := change{seq: len(cur.changes), schema: schema, table: table, kind: kind}
		c.columns, c.values, c.text = info.key(row, int(e.ColumnCount))
		if prev != nil && prev.text == c.text && slices.Equal(prev.columns, c.columns) {
			return nil // an update that kept its key: one change
		}
		cur.changes = append(cur.changes, c)
		return &cur.changes[len(cur.changes)-1]
	}
	if kind == bypasslog.KindUpdate {
		for i := 0; i+1 < len(e.Rows); i += 2 {
			before := add(e.Rows[i], nil)
			if before != nil {
				c := *before
				add(e.Rows[i+1], &c)
			}
		}
		return
	}
	for _, row := range e.Rows {
		add(row, nil)
	}
}

// tableInfo is what the detector knows of a downstream table.
type tableInfo struct {
	watched bool
	cols    []column // in ordinal order, as row events carry them
	keyIdx  []int    // the key's columns
	why     string   // why the key cannot be read, for key_text
}

type column struct {
	name     string
	unsigned bool
	medium   bool     // MEDIUMINT: decoded sign-extended from 24 bits
	enum     []string // ENUM's or SET's members
	set      bool
}

var systemSchemas = map[string]bool{"mysql": true, "information_schema": true, "performance_schema": true, "sys": true}

// table returns what the detector knows of schema.table, reading it on first sight.
// What cannot be read is watched with an unknown key: a change is never dropped for it.
func (s *session) table(ctx context.Context, schema, table string) *tableInfo {
	k := [2]string{schema, table}
	if t := s.tables[k]; t != nil {
		return t
	}
	t := &tableInfo{}
	s.tables[k] = t
	watched, err := s.watchedSchema(ctx, schema)
	if !watched {
		return t
	}
	t.watched = true
	if err != nil {
		t.why = "key unknown: " + err.Error()
		delete(s.tables, k) // read again next time
		return t
	}
	if err := s.loadTable(ctx, schema, table, t); err != nil {
		t.why = "key unknown: " + err.Error()
		delete(s.tables, k)
	}
	return t
}

// watchedSchema reports whether the tables of schema are replicated (watched): not a
// system schema, not a parity meta schema, one of bypass.schemas when they are given. A
// schema that cannot be told from a meta schema is watched, with the error.
func (s *session) watchedSchema(ctx context.Context, schema string) (bool, error) {
	if systemSchemas[strings.ToLower(schema)] || schema == s.d.cfg.MetaSchema {
		return false, nil
	}
	if len(s.d.cfg.Schemas) > 0 && !slices.Contains(s.d.cfg.Schemas, schema) {
		return false, nil
	}
	isMeta, err := s.isMetaSchema(ctx, schema)
	return err != nil || !isMeta, err
}

// isMetaSchema reports whether schema is a parity meta schema (it holds parity's
// migration table): another parity's bookkeeping is not a replicated table.
func (s *session) isMetaSchema(ctx context.Context, schema string) (bool, error) {
	if v, ok := s.metaSchemas[schema]; ok {
		return v, nil
	}
	ctx, cancel := s.qctx(ctx)
	defer cancel()
	var n int
	if err := s.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
		schema, metaschema.VersionTable).Scan(&n); err != nil {
		return false, fmt.Errorf("read schema %s: %w", schema, err)
	}
	s.metaSchemas[schema] = n > 0
	return n > 0, nil
}

func (s *session) loadTable(ctx context.Context, schema, table string, t *tableInfo) error {
	ctx, cancel := s.qctx(ctx)
	defer cancel()
	rows, err := s.db.QueryContext(ctx, "SELECT COLUMN_NAME, COLUMN_TYPE, DATA_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION", schema, table)
	if err != nil {
		return err
	}
	for rows.Next() {
		var c column
		var ctype, dtype string
		if err := rows.Scan(&c.name, &ctype, &dtype); err != nil {
			rows.Close()
			return err
		}
		c.unsigned = strings.Contains(strings.ToLower(ctype), "unsigned")
		switch strings.ToLower(dtype) {
		case "mediumint":
			c.medium = true
		case "enum":
			c.enum = members(ctype)
		case "set":
			c.enum, c.set = members(ctype), true
		}
		t.cols = append(t.cols, c)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if len(t.cols) == 0 {
		t.why = "table not found"
		return nil
	}
	rows, err = s.db.QueryContext(ctx, "SELECT INDEX_NAME, COLUMN_NAME, NULLABLE FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND NON_UNIQUE = 0 ORDER BY INDEX_NAME = 'PRIMARY' DESC, INDEX_NAME, SEQ_IN_INDEX", schema, table)
	if err != nil {
		return err
	}
	defer rows.Close()
	type idx struct {
		cols     []string
		nullable bool
	}
	var order []string
	idxs := map[string]*idx{}
	for rows.Next() {
		var name, col, nullable string
		if err := rows.Scan(&name, &col, &nullable); err != nil {
			return err
		}
		x := idxs[name]
		if x == nil {
			x = &idx{}
			idxs[name] = x
			order = append(order, name)
		}
		x.cols = append(x.cols, col)
		x.nullable = x.nullable || nullable == "YES"
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for _, name := range order {
		x := idxs[name]
		if x.nullable {
			continue
		}
		for _, col := range x.cols {
			for i, c := range t.cols {
				if strings.EqualFold(c.name, col) {
					t.keyIdx = append(t.keyIdx, i)
				}
			}
		}
		return nil
	}
	t.why = "no primary or NOT NULL unique key"
	return nil
}

// members parses ENUM('a','b') / SET('a','b').
func members(ctype string) []string {
	open, end := strings.IndexByte(ctype, '('), strings.LastIndexByte(ctype, ')')
	if open < 0 || end <= open {
		return nil
	}
	var out []string
	body := ctype[open+1 : end]
	for i := 0; i < len(body); {
		if body[i] != '\'' {
			i++
			continue
		}
		var b strings.Builder
		j := i + 1
		for j < len(body) {
			if body[j] == '\'' {
				if j+1 < len(body) && body[j+1] == '\'' {
					b.WriteByte('\'')
					j += 2
					continue
				}
				break
			}
			if body[j] == '\\' && j+1 < len(body) {
				j++
			}
			b.WriteByte(body[j])
			j++
		}
		out = append(out, b.String())
		i = j + 1
	}
	return out
}

// key returns the key of row (a row image of n columns): its columns, their values as
// the server's text protocol prints them, and a readable form.
func (t *tableInfo) key(row []any, n int) ([]string, [][]byte, string) {
	if t.why != "" || len(t.keyIdx) == 0 {
		if t.why == "" {
			t.why = "key unknown"
		}
		return nil, nil, "(" + t.why + ")"
	}
	if n != len(t.cols) || len(row) != len(t.cols) {
		return nil, nil, fmt.Sprintf("(key unknown: the event has %d columns, the table now %d)", len(row), len(t.cols))
	}
	cols := make([]string, len(t.keyIdx))
	vals := make([][]byte, len(t.keyIdx))
	var text strings.Builder
	for i, ci := range t.keyIdx {
		c := t.cols[ci]
		cols[i] = c.name
		vals[i] = c.text(row[ci])
		if i > 0 {
			text.WriteString(", ")
		}
		text.WriteString(c.name + "=" + c.literal(row[ci], vals[i]))
	}
	return cols, vals, text.String()
}

// text is v as the server's text protocol prints it (nil: NULL).
func (c column) text(v any) []byte {
	switch v := v.(type) {
	case nil:
		return nil
	case int8:
		if c.unsigned {
			return strconv.AppendUint(nil, uint64(uint8(v)), 10)
		}
		return strconv.AppendInt(nil, int64(v), 10)
	case int16:
		if c.unsigned {
			return strconv.AppendUint(nil, uint64(uint16(v)), 10)
		}
		return strconv.AppendInt(nil, int64(v), 10)
	case int32:
		if c.unsigned {
			if c.medium {
				return strconv.AppendUint(nil, uint64(uint32(v)&0xFFFFFF), 10)
			}
			return strconv.AppendUint(nil, uint64(uint32(v)), 10)
		}
		return strconv.AppendInt(nil, int64(v), 10)
	case int64:
		switch {
		case c.enum != nil && c.set:
			var names []string
			for i, m := range c.enum {
				if v&(1<<i) != 0 {
					names = append(names, m)
				}
			}
			return []byte(strings.Join(names, ","))
		case c.enum != nil:
			if v >= 1 && int(v) <= len(c.enum) {
				return []byte(c.enum[v-1])
			}
			return []byte{}
		case c.unsigned:
			return strconv.AppendUint(nil, uint64(v), 10)
		}
		return strconv.AppendInt(nil, v, 10)
	case int:
		return strconv.AppendInt(nil, int64(v), 10)
	case float32:
		return strconv.AppendFloat(nil, float64(v), 'g', -1, 32)
	case float64:
		return strconv.AppendFloat(nil, v, 'g', -1, 64)
	case string:
		return []byte(v)
	case []byte:
		return slices.Clone(v)
	case fmt.Stringer:
		return []byte(v.String())
	}
	return fmt.Append(nil, v)
}

// literal is a readable SQL literal of a key value.
func (c column) literal(v any, text []byte) string {
	switch v.(type) {
	case nil:
		return "NULL"
	case int8, int16, int32, int64, int, float32, float64:
		if c.enum == nil {
			return string(text)
		}
	}
	if !utf8.Valid(text) {
		return "0x" + hex.EncodeToString(text)
	}
	return "'" + strings.ReplaceAll(string(text), "'", "''") + "'"
}
