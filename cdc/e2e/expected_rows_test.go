package e2e

// The replay tests' own idea of what the fallback must hold, and the comparison with what
// it does hold. Nothing here uses parity's decoder, applier or checker: the expected
// tables come from the recordings' descriptions (the corpus's expected.json, the random
// datasets' final.jsonl.gz), and the fallback is read with plain SQL that renders every
// value in one canonical text form per kind.

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/big"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/go-sql-driver/mysql"

	"github.com/tidb-parity/parity/internal/testenv"
)

// Value kinds: how a column's values are read and compared.
const (
	kindInt       = "int" // integers of every width and sign, YEAR
	kindBit       = "bit" // the bits as an unsigned integer
	kindFloat     = "float"
	kindDouble    = "double"
	kindDecimal   = "decimal" // the text with the column's scale
	kindDate      = "date"
	kindDatetime  = "datetime"
	kindTimestamp = "timestamp" // in the session time zone of the reader
	kindTime      = "time"
	kindEnum      = "enum" // 1-based index
	kindSet       = "set"  // member bitmask
	kindJSON      = "json" // compared parsed
	kindVector    = "vector"
	kindBytes     = "bytes" // every string and binary type, as hex of its bytes
)

type wantCol struct{ name, kind string }

// wantRow is one expected row: its cells in canonical text (nil is SQL NULL), how many
// copies (keyless tables), and the record that wrote it last (for messages).
type wantRow struct {
	cells map[string]*string
	count int
	from  string
}

type wantTable struct {
	schema, name string    // upstream names
	cols         []wantCol // the columns compared, in order
	exactCols    bool      // the fallback must have exactly these columns, in this order
	handle       []string  // handle-key columns; none: a keyless table, compared as a multiset
	rows         map[string]*wantRow
	deleted      map[string]string // key → the record that deleted it last
}

func (t *wantTable) fullName() string { return t.schema + "." + t.name }

func (t *wantTable) col(name string) (wantCol, bool) {
	for _, c := range t.cols {
		if c.name == name {
			return c, true
		}
	}
	return wantCol{}, false
}

// key renders a row's key: its handle columns, or every column of a keyless row.
func (t *wantTable) key(cells map[string]*string) string {
	names := t.handle
	if len(names) == 0 {
		names = make([]string, len(t.cols))
		for i, c := range t.cols {
			names[i] = c.name
		}
	}
	var b strings.Builder
	for i, n := range names {
		if i > 0 {
			b.WriteString(", ")
		}
		c, _ := t.col(n)
		b.WriteString(n + "=" + showCell(c.kind, cells[n], 60))
	}
	return b.String()
}

// wantSet is the expected state of the fallback.
type wantSet struct {
	schemas   map[string]bool       // upstream schemas that must exist
	gone      map[string]bool       // upstream schemas that must not exist
	tables    map[string]*wantTable // by "schema.table" (upstream names)
	forbidden map[string]string     // tables that must not exist downstream → why
}

func newWantSet() *wantSet {
	return &wantSet{schemas: map[string]bool{}, gone: map[string]bool{}, tables: map[string]*wantTable{}, forbidden: map[string]string{}}
}

// summary counts the expected schemas, tables and rows.
func (w *wantSet) summary() string {
	rows := 0
	for _, wt := range w.tables {
		for _, r := range wt.rows {
			rows += r.count
		}
	}
	return fmt.Sprintf("%d schemas, %d tables, %d rows", len(w.schemas), len(w.tables), rows)
}

// openFallback opens the fallback with the given session time zone (TIMESTAMP values are
// read in it) and text protocol values.
func openFallback(t testing.TB, tz string) *sql.DB {
	t.Helper()
	c, err := mysql.ParseDSN(testenv.Require(t, testenv.EnvDownstream))
	if err != nil {
		t.Fatal(err)
	}
	c.DBName = ""
	c.ParseTime = false
	c.InterpolateParams = false
	if c.Params == nil {
		c.Params = map[string]string{}
	}
	c.Params["time_zone"] = "'" + tz + "'"
	db, err := sql.Open("mysql", c.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(2)
	t.Cleanup(func() { db.Close() })
	return db
}

// compare reads the fallback and returns every difference from w, each naming the
// table, the row's key, the column, and the expected and found values. target maps an
// upstream schema to its downstream name. With only set ("schema.table"), just that
// table is compared.
func (w *wantSet) compare(t testing.TB, db *sql.DB, target func(string) string, only string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var errs []string
	if only == "" {
		for s := range w.schemas {
			if !schemaExists(t, ctx, db, target(s)) {
				errs = append(errs, fmt.Sprintf("schema %s (upstream %s) is missing on the fallback", target(s), s))
			}
		}
		for s := range w.gone {
			if schemaExists(t, ctx, db, target(s)) {
				errs = append(errs, fmt.Sprintf("schema %s (upstream %s) exists on the fallback; it was dropped upstream", target(s), s))
			}
		}
		for _, s := range sortedNames(w.schemas) {
			have := map[string]bool{}
			tables, err := testenv.ListTables(ctx, db, target(s))
			if err != nil {
				t.Fatal(err)
			}
			for _, tb := range tables {
				have[tb] = true
				name := s + "." + tb
				if _, ok := w.tables[name]; ok {
					continue
				}
				if why, ok := w.forbidden[name]; ok {
					errs = append(errs, fmt.Sprintf("table %s.%s exists on the fallback; it must not (%s)", target(s), tb, why))
				} else {
					errs = append(errs, fmt.Sprintf("table %s.%s exists on the fallback but not upstream", target(s), tb))
				}
			}
			for _, name := range sortedNames(w.tables) {
				wt := w.tables[name]
				if wt.schema == s && !have[wt.name] {
					errs = append(errs, fmt.Sprintf("table %s.%s (upstream %s) is missing on the fallback", target(s), wt.name, name))
				}
			}
		}
	}
	for _, name := range sortedNames(w.tables) {
		if only != "" && name != only {
			continue
		}
		wt := w.tables[name]
		if !schemaExists(t, ctx, db, target(wt.schema)) {
			continue // reported above
		}
		errs = append(errs, wt.compare(t, ctx, db, target(wt.schema))...)
	}
	return errs
}

func schemaExists(t testing.TB, ctx context.Context, db *sql.DB, s string) bool {
	t.Helper()
	var n int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?", s).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n > 0
}

func sortedNames[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// readExpr is the SQL that renders a column of a kind as canonical text's raw material.
func readExpr(name, kind string) string {
	q := replayQuote(name)
	switch kind {
	case kindBit:
		return "CAST(" + q + " AS UNSIGNED)"
	case kindEnum, kindSet:
		return "CAST(" + q + "+0 AS UNSIGNED)"
	case kindFloat:
		return "CAST(" + q + " AS DOUBLE)" // the text of a FLOAT has 6 digits; the double is exact
	case kindBytes:
		return "HEX(" + q + ")"
	default:
		return q
	}
}

const maxErrsPerTable = 12

func (wt *wantTable) compare(t testing.TB, ctx context.Context, db *sql.DB, schema string) []string {
	t.Helper()
	tname := schema + "." + wt.name
	if schema != wt.schema {
		tname += " (upstream " + wt.fullName() + ")"
	}
	var errs []string
	// Columns.
	rows, err := db.QueryContext(ctx, "SELECT COLUMN_NAME, IS_GENERATED FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION", schema, wt.name)
	if err != nil {
		t.Fatal(err)
	}
	var downCols []string
	generated := map[string]bool{}
	for rows.Next() {
		var n, g string
		if err := rows.Scan(&n, &g); err != nil {
			t.Fatal(err)
		}
		downCols = append(downCols, n)
		generated[n] = g != "NEVER"
	}
	rows.Close()
	if len(downCols) == 0 {
		return []string{fmt.Sprintf("table %s is missing on the fallback", tname)}
	}
	var names []string
	for _, c := range wt.cols {
		names = append(names, c.name)
	}
	if wt.exactCols {
		if strings.Join(downCols, ",") != strings.Join(names, ",") {
			return []string{fmt.Sprintf("table %s: columns on the fallback %v, upstream %v", tname, downCols, names)}
		}
	} else if len(wt.cols) > 0 {
		known := map[string]bool{}
		for _, n := range names {
			known[n] = true
		}
		have := map[string]bool{}
		for _, n := range downCols {
			have[n] = true
			if !known[n] && !generated[n] {
				errs = append(errs, fmt.Sprintf("table %s: column %s is on the fallback, but no event carried it", tname, n))
			}
		}
		for _, n := range names {
			if !have[n] {
				errs = append(errs, fmt.Sprintf("table %s: column %s is missing on the fallback", tname, n))
			}
		}
		if len(errs) > 0 {
			return errs
		}
	}
	// Rows.
	got := map[string]*wantRow{}
	if len(wt.cols) > 0 {
		exprs := make([]string, len(wt.cols))
		for i, c := range wt.cols {
			exprs[i] = readExpr(c.name, c.kind)
		}
		rows, err := db.QueryContext(ctx, "SELECT "+strings.Join(exprs, ", ")+" FROM "+replayQuote(schema)+"."+replayQuote(wt.name))
		if err != nil {
			return []string{fmt.Sprintf("table %s: read: %v", tname, err)}
		}
		raw := make([]sql.RawBytes, len(wt.cols))
		dest := make([]any, len(raw))
		for i := range raw {
			dest[i] = &raw[i]
		}
		for rows.Next() {
			if err := rows.Scan(dest...); err != nil {
				t.Fatal(err)
			}
			cells := map[string]*string{}
			for i, c := range wt.cols {
				if raw[i] == nil {
					cells[c.name] = nil
					continue
				}
				s := string(raw[i])
				if c.kind == kindBytes {
					s = strings.ToLower(s)
				}
				v := canonicalCell(c.kind, s)
				cells[c.name] = &v
			}
			k := wt.key(cells)
			if g, ok := got[k]; ok {
				g.count++
			} else {
				got[k] = &wantRow{cells: cells, count: 1}
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		rows.Close()
	} else {
		var n int
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+replayQuote(schema)+"."+replayQuote(wt.name)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			errs = append(errs, fmt.Sprintf("table %s: %d rows on the fallback, none expected", tname, n))
		}
	}
	for _, k := range sortedNames(wt.rows) {
		w := wt.rows[k]
		g, ok := got[k]
		if !ok {
			errs = append(errs, fmt.Sprintf("table %s: row %s is missing on the fallback (expected from %s)", tname, k, w.from))
			continue
		}
		if g.count != w.count {
			errs = append(errs, fmt.Sprintf("table %s: row %s is on the fallback %d times, expected %d", tname, k, g.count, w.count))
		}
		for _, c := range wt.cols {
			wc, ok := w.cells[c.name]
			if !ok {
				continue // no event told the value (a column added after the row was last written)
			}
			if !sameCell(c.kind, wc, g.cells[c.name]) {
				errs = append(errs, fmt.Sprintf("table %s row %s column %s: expected %s, the fallback has %s (row last written by %s)",
					tname, k, c.name, showCell(c.kind, wc, 200), showCell(c.kind, g.cells[c.name], 200), w.from))
			}
		}
	}
	for _, k := range sortedNames(got) {
		if _, ok := wt.rows[k]; ok {
			continue
		}
		msg := fmt.Sprintf("table %s: row %s is on the fallback (%d times) but not expected", tname, k, got[k].count)
		if d, ok := wt.deleted[k]; ok {
			msg += "; it was deleted by " + d
		}
		errs = append(errs, msg)
	}
	if len(errs) > maxErrsPerTable {
		n := len(errs)
		errs = append(errs[:maxErrsPerTable], fmt.Sprintf("table %s: %d more differences", tname, n-maxErrsPerTable))
	}
	return errs
}

func sameCell(kind string, a, b *string) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return *a == *b
}

// showCell renders a canonical cell for a message: bytes as hex with their text when it
// is valid UTF-8, long values cut.
func showCell(kind string, v *string, limit int) string {
	if v == nil {
		return "NULL"
	}
	s := *v
	if kind == kindBytes {
		b, err := hex.DecodeString(s)
		if err == nil && utf8.Valid(b) {
			s = fmt.Sprintf("x'%s' %q", s, b)
		} else {
			s = "x'" + s + "'"
		}
	}
	if len(s) > limit {
		s = s[:limit] + fmt.Sprintf("…(%d bytes)", len(s))
	}
	return s
}

// canonical turns a value's text (as the fallback's read expression or a recording gives
// it) into the one form compared for its kind.
func canonicalCell(kind, s string) string {
	switch kind {
	case kindInt, kindBit, kindEnum, kindSet:
		var n big.Int
		if _, ok := n.SetString(strings.TrimSpace(s), 10); ok {
			return n.String()
		}
		return "!not an integer: " + s
	case kindFloat:
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return "!not a float: " + s
		}
		return strconv.FormatFloat(float64(float32(f)), 'g', -1, 32)
	case kindDouble:
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return "!not a double: " + s
		}
		return strconv.FormatFloat(f, 'g', -1, 64)
	case kindJSON:
		return canonicalJSON(s)
	case kindVector:
		var fs []json.Number
		if err := json.Unmarshal([]byte(s), &fs); err != nil {
			return "!not a vector: " + s
		}
		parts := make([]string, len(fs))
		for i, f := range fs {
			v, err := strconv.ParseFloat(string(f), 32)
			if err != nil {
				return "!not a vector: " + s
			}
			parts[i] = strconv.FormatFloat(v, 'g', -1, 32)
		}
		return "[" + strings.Join(parts, ",") + "]"
	default:
		return s
	}
}

// canonicalJSON parses a JSON document and writes it back with sorted keys, one spelling
// per number (integers exactly, others as the nearest float64) and no spaces.
func canonicalJSON(s string) string {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return "!not JSON: " + s
	}
	var b bytes.Buffer
	writeCanonJSON(&b, v)
	return b.String()
}

var jsonIntRe = regexp.MustCompile(`^-?\d+$`)

func writeCanonJSON(b *bytes.Buffer, v any) {
	switch x := v.(type) {
	case map[string]any:
		b.WriteByte('{')
		for i, k := range sortedNames(x) {
			if i > 0 {
				b.WriteByte(',')
			}
			kb, _ := json.Marshal(k)
			b.Write(kb)
			b.WriteByte(':')
			writeCanonJSON(b, x[k])
		}
		b.WriteByte('}')
	case []any:
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteByte(',')
			}
			writeCanonJSON(b, e)
		}
		b.WriteByte(']')
	case json.Number:
		if jsonIntRe.MatchString(string(x)) {
			b.WriteString(string(x))
		} else if f, err := strconv.ParseFloat(string(x), 64); err == nil {
			b.WriteString(strconv.FormatFloat(f, 'g', -1, 64))
		} else {
			b.WriteString(string(x))
		}
	default:
		eb, _ := json.Marshal(x)
		b.Write(eb)
	}
}
