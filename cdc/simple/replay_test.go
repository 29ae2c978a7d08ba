package simple

import (
	"bytes"
	"cmp"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/internal/testenv"
)

// finalTable is one table of the dataset's final.jsonl.gz, as TiDB held it at the end.
type finalTable struct {
	Schema     string `json:"schema"`
	Table      string `json:"table"`
	Replicated bool   `json:"replicated"`
	Columns    []struct {
		Name string `json:"name"`
		Kind string `json:"kind"`
	} `json:"columns"`
	Rows [][]*string `json:"rows"`
}

// canonical renders a decoded value in final.jsonl.gz's canonical form of kind.
func canonical(tb testing.TB, kind string, v any) *string {
	tb.Helper()
	if v == nil {
		return nil
	}
	var s string
	switch x := v.(type) {
	case int64:
		s = strconv.FormatInt(x, 10)
	case uint64:
		s = strconv.FormatUint(x, 10)
	case float64:
		s = strconv.FormatFloat(x, 'g', -1, 64) // canonicalCell rounds a FLOAT to float32
	case []byte:
		s = hex.EncodeToString(x)
	case string:
		s = x
		if kind == "bytes" {
			s = hex.EncodeToString([]byte(x))
		}
	default:
		tb.Fatalf("value of type %T", v)
	}
	return canonicalCell(tb, kind, &s)
}

// canonicalCell normalises a cell text of kind for comparison (floats by value, JSON
// parsed).
func canonicalCell(tb testing.TB, kind string, c *string) *string {
	tb.Helper()
	if c == nil {
		return nil
	}
	s := *c
	switch kind {
	case "float", "double":
		bits := 64
		if kind == "float" {
			bits = 32
		}
		f, err := strconv.ParseFloat(s, bits)
		if err != nil {
			tb.Fatalf("%s %q: %v", kind, s, err)
		}
		s = strconv.FormatFloat(f, 'g', -1, bits)
	case "json":
		dec := json.NewDecoder(strings.NewReader(s))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			tb.Fatalf("json %q: %v", s, err)
		}
		b, _ := json.Marshal(v)
		s = string(b)
	}
	return &s
}

// TestDatasetReplay applies every decoded event of the TiCDC-made changefeed to an
// in-memory model of the tables (in commit-ts order; a DDL after the rows of its ts) and
// compares the result with the tables TiDB held at the end, cell for cell: the decoded
// values, handle keys and DDL schemas are what TiDB had, not what this decoder thinks.
func TestDatasetReplay(t *testing.T) {
	recs := loadDataset(t)
	d, err := NewDecoder(DecoderConfig{TimeZone: time.UTC}) // final.jsonl.gz holds TIMESTAMPs in UTC
	if err != nil {
		t.Fatal(err)
	}
	type item struct {
		ev  open.Event
		seq int
	}
	var items []item
	seenDDL := map[string]bool{}
	for i, r := range recs {
		evs, err := d.Decode(r.Key, r.Value)
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		for _, ev := range evs {
			if ev.Kind == open.KindDDL {
				k := fmt.Sprint(ev.CommitTs, ev.Query)
				if seenDDL[k] {
					continue // the copy on another partition
				}
				seenDDL[k] = true
			}
			if ev.Kind != open.KindResolved {
				items = append(items, item{ev, i})
			}
		}
	}
	rank := func(ev *open.Event) int {
		if ev.Kind == open.KindDDL {
			return 9
		}
		return map[open.Op]int{open.OpDelete: 0, open.OpUpdate: 1, open.OpInsert: 2}[ev.Op]
	}
	slices.SortStableFunc(items, func(a, b item) int {
		return cmp.Or(cmp.Compare(a.ev.CommitTs, b.ev.CommitTs), cmp.Compare(rank(&a.ev), rank(&b.ev)))
	})

	// The model: table → key → row (column → value); a keyless table keys rows by
	// their whole content and counts duplicates.
	type row = map[string]any
	type mtable struct {
		rows  map[string]row
		count map[string]int
	}
	model := map[string]*mtable{}
	get := func(name string) *mtable {
		if model[name] == nil {
			model[name] = &mtable{rows: map[string]row{}, count: map[string]int{}}
		}
		return model[name]
	}
	keyOf := func(cols []open.Column) string {
		var b strings.Builder
		keyed := slices.ContainsFunc(cols, open.Column.IsHandle)
		for _, c := range cols {
			if !keyed || c.IsHandle() {
				fmt.Fprintf(&b, "%s=%#v;", c.Name, c.Value)
			}
		}
		return b.String()
	}
	toRow := func(cols []open.Column) row {
		r := row{}
		for _, c := range cols {
			r[c.Name] = c.Value
		}
		return r
	}
	var anomalies []string
	for _, it := range items {
		ev := &it.ev
		name := ev.Table
		switch ev.Kind {
		case open.KindDDL:
			q := strings.ToUpper(ev.Query)
			switch {
			case strings.HasPrefix(q, "RENAME TABLE"):
				from := strings.Trim(strings.Split(strings.Split(ev.Query, " TO ")[0], ".")[1], "`")
				model[name], model[from] = model[from], nil
			case strings.HasPrefix(q, "TRUNCATE"):
				model[name] = nil
			case strings.Contains(q, "DROP COLUMN"):
				col := strings.Trim(ev.Query[strings.LastIndex(ev.Query, " ")+1:], "`")
				for _, r := range get(name).rows {
					delete(r, col)
				}
			case strings.Contains(q, "ADD COLUMN"):
				// Every row gets the column's default: DECIMAL text from tableSchema.
				var w wireMessage
				if err := json.Unmarshal(recs[it.seq].Value, &w); err != nil {
					t.Fatal(err)
				}
				last := w.TableSchema.Columns[len(w.TableSchema.Columns)-1]
				for _, r := range get(name).rows {
					r[last.Name] = last.Default
				}
			}
		case open.KindRow:
			tb := get(name)
			switch ev.Op {
			case open.OpInsert:
				k := keyOf(ev.Columns)
				if tb.count[k] > 0 && slices.ContainsFunc(ev.Columns, open.Column.IsHandle) {
					anomalies = append(anomalies, fmt.Sprintf("insert of existing %s %s at %d", name, k, ev.CommitTs))
				}
				tb.rows[k] = toRow(ev.Columns)
				tb.count[k]++
			case open.OpDelete:
				k := keyOf(ev.Columns)
				if tb.count[k] == 0 {
					anomalies = append(anomalies, fmt.Sprintf("delete of missing %s %s at %d", name, k, ev.CommitTs))
				}
				if tb.count[k]--; tb.count[k] <= 0 {
					delete(tb.rows, k)
					delete(tb.count, k)
				}
			case open.OpUpdate:
				ko, kn := keyOf(ev.OldColumns), keyOf(ev.Columns)
				if tb.count[ko] == 0 {
					anomalies = append(anomalies, fmt.Sprintf("update of missing %s %s at %d", name, ko, ev.CommitTs))
				}
				if tb.count[ko]--; tb.count[ko] <= 0 {
					delete(tb.rows, ko)
					delete(tb.count, ko)
				}
				tb.rows[kn] = toRow(ev.Columns)
				tb.count[kn]++
			}
		}
	}
	if len(anomalies) > 0 {
		t.Errorf("%d anomalies, first: %s", len(anomalies), anomalies[0])
	}

	compared := 0
	testenv.GzipLines(t, filepath.Join(datasetDir, "final.jsonl.gz"), func(line []byte) {
		var ft finalTable
		if err := json.Unmarshal(line, &ft); err != nil {
			t.Fatal(err)
		}
		mt := model[ft.Table]
		if !ft.Replicated {
			return
		}
		if mt == nil {
			t.Errorf("table %s: not in the replay", ft.Table)
			return
		}
		render := func(cells []*string) string {
			var b bytes.Buffer
			for _, c := range cells {
				if c == nil {
					b.WriteString("NULL|")
				} else {
					b.WriteString(strconv.Quote(*c) + "|")
				}
			}
			return b.String()
		}
		var want, got []string
		for _, r := range ft.Rows {
			cells := make([]*string, len(r))
			for i, c := range r {
				cells[i] = canonicalCell(t, ft.Columns[i].Kind, c)
			}
			want = append(want, render(cells))
		}
		for k, r := range mt.rows {
			if len(r) != len(ft.Columns) {
				t.Errorf("table %s: a row with %d columns, TiDB's has %d", ft.Table, len(r), len(ft.Columns))
			}
			cells := make([]*string, len(ft.Columns))
			for i, c := range ft.Columns {
				cells[i] = canonical(t, c.Kind, r[c.Name])
			}
			for range mt.count[k] {
				got = append(got, render(cells))
			}
		}
		slices.Sort(want)
		slices.Sort(got)
		if !slices.Equal(want, got) {
			var miss, extra []string
			for _, w := range want {
				if !slices.Contains(got, w) {
					miss = append(miss, w)
				}
			}
			for _, g := range got {
				if !slices.Contains(want, g) {
					extra = append(extra, g)
				}
			}
			t.Errorf("table %s: %d rows replayed, TiDB has %d; %d missing (first %v), %d extra (first %v)",
				ft.Table, len(got), len(want), len(miss), first(miss), len(extra), first(extra))
			return
		}
		compared += len(want)
	})
	t.Logf("%d events replayed; %d final rows equal to TiDB's, cell for cell", len(items), compared)
	if compared == 0 {
		t.Error("nothing compared")
	}
}

func first(s []string) string {
	if len(s) == 0 {
		return "-"
	}
	return s[0]
}
