package e2e

// corpus_model_test.go computes the state TestCorpusReplay expects, from the events each
// case's expected.json says the encoder was given, independently of parity's decoder
// (rowModel: inserts and updates set a row, deletes remove it, DDL creates, truncates,
// drops and renames tables).

import (
	"encoding/hex"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

// ---- the expected state, from the events expected.json describes ----

// rowModel applies the corpus's events to expected tables: an insert or update sets the
// row of its handle key (an update that changes the key removes the old one), a delete
// removes it; keyless tables count copies of whole rows. DDL create and drop schemas and
// tables, truncate, and rename.
type rowModel struct{ *wantSet }

func newRowModel() *rowModel { return &rowModel{newWantSet()} }

// renameRe reads a single-table RENAME TABLE as TiCDC renders it.
var renameRe = regexp.MustCompile("^RENAME TABLE `([^`]+)`\\.`([^`]+)` TO `([^`]+)`\\.`([^`]+)`$")

func (m *rowModel) apply(t *testing.T, rec replayRecord) {
	t.Helper()
	for _, ev := range rec.events {
		switch ev.Kind {
		case "resolved":
		case "ddl":
			m.ddl(t, rec.from, ev)
		case "row":
			m.row(t, rec.from, ev)
		}
	}
}

func (m *rowModel) table(t *testing.T, from, name string) *wantTable {
	t.Helper()
	wt, ok := m.tables[name]
	if !ok {
		t.Fatalf("model: %s writes to table %s, which does not exist at that point of the story", from, name)
	}
	return wt
}

func (m *rowModel) ddl(t *testing.T, from string, ev replayEvent) {
	t.Helper()
	name := ev.Schema + "." + ev.Table
	switch ev.DDLType {
	case 1: // CREATE DATABASE (IF NOT EXISTS: a second changefeed may create it again)
		m.schemas[ev.Schema] = true
		delete(m.gone, ev.Schema)
	case 2: // DROP DATABASE
		if !m.schemas[ev.Schema] {
			t.Fatalf("model: %s drops schema %s, which does not exist", from, ev.Schema)
		}
		delete(m.schemas, ev.Schema)
		m.gone[ev.Schema] = true
		for k, wt := range m.tables {
			if wt.schema == ev.Schema {
				delete(m.tables, k)
			}
		}
	case 3: // CREATE TABLE
		if !m.schemas[ev.Schema] {
			t.Fatalf("model: %s creates %s in a schema that does not exist", from, name)
		}
		if _, ok := m.tables[name]; ok {
			t.Fatalf("model: %s creates %s, which exists", from, name)
		}
		m.tables[name] = &wantTable{schema: ev.Schema, name: ev.Table, rows: map[string]*wantRow{}, deleted: map[string]string{}}
	case 4: // DROP TABLE
		m.table(t, from, name)
		delete(m.tables, name)
	case 5, 7: // ADD COLUMN, ADD INDEX: the rows tell the new column
		m.table(t, from, name)
	case 11: // TRUNCATE TABLE
		wt := m.table(t, from, name)
		wt.rows = map[string]*wantRow{}
	case 14: // RENAME TABLE; the event names the new table
		g := renameRe.FindStringSubmatch(ev.Query)
		if g == nil || g[3] != ev.Schema || g[4] != ev.Table {
			t.Fatalf("model: %s: cannot read the rename %q", from, ev.Query)
		}
		old := g[1] + "." + g[2]
		wt := m.table(t, from, old)
		delete(m.tables, old)
		wt.schema, wt.name = ev.Schema, ev.Table
		m.tables[name] = wt
	default:
		t.Fatalf("model: %s: DDL type %d (%q) is not modelled", from, ev.DDLType, ev.Query)
	}
}

func (m *rowModel) row(t *testing.T, from string, ev replayEvent) {
	t.Helper()
	wt := m.table(t, from, ev.Schema+"."+ev.Table)
	learn := func(cols []replayCol) {
		var handle []string
		for _, c := range cols {
			if c.virtual() {
				continue
			}
			if c.Flags&0x02 != 0 {
				handle = append(handle, c.Name)
			}
			if _, ok := wt.col(c.Name); !ok {
				wt.cols = append(wt.cols, wantCol{name: c.Name, kind: corpusKind(t, from, c)})
			}
		}
		if len(cols) > 0 {
			if wt.handle == nil && len(wt.rows) == 0 {
				wt.handle = handle
			} else if strings.Join(wt.handle, ",") != strings.Join(handle, ",") {
				t.Fatalf("model: %s: table %s has handle %v, the event %v", from, wt.fullName(), wt.handle, handle)
			}
		}
	}
	learn(ev.PreColumns)
	learn(ev.Columns)
	cells := func(cols []replayCol) map[string]*string {
		out := map[string]*string{}
		for _, c := range cols {
			if c.virtual() {
				continue
			}
			out[c.Name] = corpusCell(t, from, c)
		}
		return out
	}
	remove := func(old map[string]*string) {
		k := wt.key(old)
		w, ok := wt.rows[k]
		if !ok {
			t.Fatalf("model: %s removes row %s of %s, which the story does not hold", from, k, wt.fullName())
		}
		if w.count--; w.count == 0 {
			delete(wt.rows, k)
		}
		wt.deleted[k] = from
	}
	put := func(row map[string]*string) {
		k := wt.key(row)
		if len(wt.handle) == 0 {
			if w, ok := wt.rows[k]; ok {
				w.count++
				w.from = from
				return
			}
		}
		wt.rows[k] = &wantRow{cells: row, count: 1, from: from}
		delete(wt.deleted, k)
	}
	switch ev.RowKind {
	case "insert":
		put(cells(ev.Columns))
	case "update":
		old, row := cells(ev.PreColumns), cells(ev.Columns)
		if len(wt.handle) == 0 {
			remove(old)
		} else if k := wt.key(old); k != wt.key(row) {
			if _, ok := wt.rows[k]; ok {
				remove(old)
			}
		}
		put(row)
	case "delete":
		remove(cells(ev.PreColumns))
	default:
		t.Fatalf("model: %s: row kind %q", from, ev.RowKind)
	}
}

// corpusKind maps a column's MySQL type code to the value kind it is compared as.
func corpusKind(t *testing.T, from string, c replayCol) string {
	switch c.MySQLType {
	case 1, 2, 3, 8, 9, 13: // TINYINT … BIGINT, MEDIUMINT, YEAR
		return kindInt
	case 16:
		return kindBit
	case 4:
		return kindFloat
	case 5:
		return kindDouble
	case 246:
		return kindDecimal
	case 10:
		return kindDate
	case 12:
		return kindDatetime
	case 7:
		return kindTimestamp
	case 11:
		return kindTime
	case 247:
		return kindEnum
	case 248:
		return kindSet
	case 245:
		return kindJSON
	case 225:
		return kindVector
	case 15, 249, 250, 251, 252, 253, 254: // VARCHAR, BLOB/TEXT, CHAR/BINARY
		return kindBytes
	}
	t.Fatalf("model: %s: column %s has MySQL type %d, not modelled", from, c.Name, c.MySQLType)
	return ""
}

// corpusCell is the canonical text of the value TiCDC's encoder was given.
func corpusCell(t *testing.T, from string, c replayCol) *string {
	t.Helper()
	if len(c.Value) == 0 || string(c.Value) == "null" {
		return nil
	}
	kind := corpusKind(t, from, c)
	var text string
	if c.Value[0] == '"' {
		if err := json.Unmarshal(c.Value, &text); err != nil {
			t.Fatalf("model: %s column %s: %v", from, c.Name, err)
		}
	} else {
		text = string(c.Value) // a JSON number, digits exact
	}
	if kind == kindBytes {
		b := []byte(text)
		if c.ValueEncoding == "base64" {
			var err error
			if b, err = replayBase64(text); err != nil {
				t.Fatalf("model: %s column %s: %v", from, c.Name, err)
			}
		}
		text = hex.EncodeToString(b)
	}
	v := canonicalCell(kind, text)
	if strings.HasPrefix(v, "!") {
		t.Fatalf("model: %s column %s: %s", from, c.Name, v)
	}
	return &v
}
