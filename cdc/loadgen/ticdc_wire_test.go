package loadgen

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tidb-parity/parity/cdc/canal"
	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/cdc/simple"
	"github.com/tidb-parity/parity/cdc/upstream"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/testenv"
)

// The encoders are checked against changefeeds TiCDC v8.5.6's own code wrote
// (../shared/ticdc-random, beside the repository), not against parity's decoders: the
// dataset's final tables are created on our TiDB from their SHOW CREATE TABLE, filled with
// the final rows, read back the way loadgen reads rows (upstream.LoadTable, ScanRows,
// loadWireTable), encoded with the message's commit ts, and compared member by member
// with the last message TiCDC wrote for each row's key (the message that left the row as
// it is in the final table). Members that legitimately differ are left out: the wall
// clock (canal ts, simple buildTs), TiDB's table ID and schema version, and the old image
// of an UPDATE (the final table does not hold it; "old" is written by the same code as
// "data").

var ticdcRandom = filepath.Join("..", "..", "..", "shared", "ticdc-random")

type tcRecord struct {
	Partition int    `json:"partition"`
	Value     []byte `json:"value"`
	Kind      string `json:"kind"`
}

type tcFinal struct {
	Table      string   `json:"table"`
	Replicated bool     `json:"replicated"`
	Handle     []string `json:"handle"`
	Columns    []struct {
		Name string `json:"name"`
		Kind string `json:"kind"`
	} `json:"columns"`
	Rows [][]*string `json:"rows"`
}

func parseJSON(t *testing.T, b []byte) map[string]any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	return m
}

// tcDataset is one TiCDC-made changefeed with its final tables loaded into our TiDB.
type tcDataset struct {
	records []map[string]any // decoded values, in file order
	finals  []tcFinal
	db      *testenv.DB
	read    *sql.Conn // session in TiCDC's time zone
}

func loadTiCDCDataset(t *testing.T, dir string) *tcDataset {
	t.Helper()
	ds := &tcDataset{}
	testenv.GzipLines(t, filepath.Join(ticdcRandom, dir, "records.jsonl.gz"), func(line []byte) {
		var r tcRecord
		if err := json.Unmarshal(line, &r); err != nil {
			t.Fatal(err)
		}
		ds.records = append(ds.records, parseJSON(t, r.Value))
	})
	testenv.GzipLines(t, filepath.Join(ticdcRandom, dir, "final.jsonl.gz"), func(line []byte) {
		var f tcFinal
		if err := json.Unmarshal(line, &f); err != nil {
			t.Fatal(err)
		}
		if f.Replicated {
			ds.finals = append(ds.finals, f)
		}
	})
	metaBytes, err := os.ReadFile(filepath.Join(ticdcRandom, dir, "meta.json"))
	if err != nil {
		t.Fatal(err)
	}
	var meta struct {
		Tables map[string]string `json:"tables"`
	}
	if err := json.Unmarshal(metaBytes, &meta); err != nil {
		t.Fatal(err)
	}

	ds.db = testenv.Upstream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	write, err := ds.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer write.Close()
	if _, err := write.ExecContext(ctx, "SET time_zone = '+00:00'"); err != nil { // the final TIMESTAMPs are UTC
		t.Fatal(err)
	}
	for _, f := range ds.finals {
		ddl, ok := meta.Tables[f.Table]
		if !ok {
			t.Fatalf("meta.json has no definition of %s", f.Table)
		}
		if _, err := write.ExecContext(ctx, ddl); err != nil {
			t.Fatalf("%s: %v", ddl, err)
		}
		meta, err := upstream.LoadTable(ctx, ds.db, ds.db.Name, f.Table)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		var cols []int
		for i, c := range f.Columns {
			if meta.Columns[meta.Col(c.Name)].Flags&open.FlagGenerated == 0 {
				names = append(names, ident.Quote(c.Name))
				cols = append(cols, i)
			}
		}
		q := "INSERT INTO " + ident.Quote(f.Table) + " (" + strings.Join(names, ", ") + ") VALUES (" +
			strings.TrimSuffix(strings.Repeat("?, ", len(cols)), ", ") + ")"
		for _, row := range f.Rows {
			args := make([]any, len(cols))
			for j, i := range cols {
				args[j] = finalArg(t, f.Columns[i].Kind, row[i])
			}
			if _, err := write.ExecContext(ctx, q, args...); err != nil {
				t.Fatalf("%s %v: %v", q, args, err)
			}
		}
	}
	ds.read, err = ds.db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ds.read.Close() })
	if _, err := ds.read.ExecContext(ctx, "SET time_zone = 'Asia/Shanghai'"); err != nil { // TiCDC's --tz
		t.Fatal(err)
	}
	return ds
}

// finalArg is a final.jsonl cell as an INSERT argument.
func finalArg(t *testing.T, kind string, cell *string) any {
	if cell == nil {
		return nil
	}
	switch kind {
	case "bytes":
		b, err := hex.DecodeString(*cell)
		if err != nil {
			t.Fatal(err)
		}
		return b
	case "bit", "enum", "set":
		v, err := strconv.ParseUint(*cell, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	return *cell
}

// rows reads a final table as loadgen reads rows, with its wire definition.
func (ds *tcDataset) rows(t *testing.T, f tcFinal) (*upstream.Table, *wireTable, [][]open.Column) {
	t.Helper()
	ctx := context.Background()
	meta, err := upstream.LoadTable(ctx, ds.read, ds.db.Name, f.Table)
	if err != nil {
		t.Fatal(err)
	}
	wt, err := loadWireTable(ctx, ds.db.DB, ds.db.Name, f.Table)
	if err != nil {
		t.Fatal(err)
	}
	if err := wt.check(meta); err != nil {
		t.Fatal(err)
	}
	rows, err := ds.read.QueryContext(ctx, "SELECT "+meta.SelectList()+" FROM "+meta.QualifiedName())
	if err != nil {
		t.Fatal(err)
	}
	images, _, err := upstream.ScanRows(rows, meta, 0)
	if err != nil {
		t.Fatal(err)
	}
	return meta, wt, images
}

// keyOf renders a row's handle-key values as the messages carry text columns.
func keyOf(t *testing.T, handle []string, get func(name string) string) string {
	var parts []string
	for _, h := range handle {
		parts = append(parts, get(h))
	}
	return strings.Join(parts, "\x00")
}

func imageKey(t *testing.T, handle []string, img []open.Column) string {
	return keyOf(t, handle, func(name string) string {
		for _, c := range img {
			if c.Name == name {
				return canalValue(&c)
			}
		}
		t.Fatalf("no handle column %s", name)
		return ""
	})
}

// lastWrites returns, per table and handle key, the last INSERT or UPDATE message of
// the stream whose row was not deleted after it; image picks the new row of a message.
func lastWrites(t *testing.T, ds *tcDataset, table func(m map[string]any) string, image func(m map[string]any) map[string]any,
	op func(m map[string]any) string) map[string]map[string]map[string]any {
	last := map[string]map[string]map[string]any{}
	handles := map[string][]string{}
	for _, f := range ds.finals {
		handles[f.Table] = f.Handle
		last[f.Table] = map[string]map[string]any{}
	}
	for _, m := range ds.records {
		tb := table(m)
		h, ok := handles[tb]
		if !ok || len(h) == 0 {
			continue
		}
		img := image(m)
		if img == nil {
			continue
		}
		k := keyOf(t, h, func(name string) string { s, _ := img[name].(string); return s })
		switch op(m) {
		case "INSERT", "UPDATE":
			last[tb][k] = m
		case "DELETE":
			delete(last[tb], k)
		}
	}
	return last
}

func sameColumns(f tcFinal, img map[string]any) bool {
	if len(img) != len(f.Columns) {
		return false
	}
	for _, c := range f.Columns {
		if _, ok := img[c.Name]; !ok {
			return false
		}
	}
	return true
}

func TestCanalJSONEncoderMatchesTiCDC(t *testing.T) {
	ds := loadTiCDCDataset(t, "canal-json-table")
	data := func(m map[string]any) map[string]any {
		if d, ok := m["data"].([]any); ok && len(d) == 1 {
			return d[0].(map[string]any)
		}
		return nil
	}
	str := func(key string) func(m map[string]any) string {
		return func(m map[string]any) string { s, _ := m[key].(string); return s }
	}
	last := lastWrites(t, ds, str("table"), data, str("type"))
	canalDec, err := canal.NewDecoder(canal.DecoderConfig{}) // the second check: parity's decoder reads it back
	if err != nil {
		t.Fatal(err)
	}
	compared, updates := 0, 0
	firstDelete := map[string]map[string]any{}
	for _, m := range ds.records {
		if tb, _ := m["table"].(string); m["type"] == "DELETE" && firstDelete[tb] == nil {
			firstDelete[tb] = m
		}
	}
	for _, f := range ds.finals {
		_, wt, images := ds.rows(t, f)
		n := 0
		for _, img := range images {
			if len(f.Handle) == 0 {
				break
			}
			want := last[f.Table][imageKey(t, f.Handle, img)]
			if want == nil || !sameColumns(f, data(want)) {
				continue
			}
			ts, err := strconv.ParseUint(string(want["_tidb"].(map[string]any)["commitTs"].(json.Number)), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			ev := &open.Event{Kind: open.KindRow, CommitTs: ts, Schema: "rnd", Table: f.Table, Op: open.OpInsert, Columns: img}
			if want["type"] == "UPDATE" {
				ev.Op, ev.OldColumns = open.OpUpdate, img
				updates++
			}
			b, err := encodeCanalRow(ev, wt)
			if err != nil {
				t.Fatal(err)
			}
			decodedSame(t, f.Table, img, func() ([]open.Event, error) { return canalDec.Decode(nil, b) })
			got := parseJSON(t, b)
			w := maps.Clone(want)
			for _, m := range []map[string]any{got, w} {
				delete(m, "ts") // the wall clock when the message was built
				if ev.Op == open.OpUpdate {
					delete(m, "old") // the final table does not hold the old row
				}
			}
			if d := cmp.Diff(w, got); d != "" {
				t.Errorf("%s row %s (-TiCDC +loadgen):\n%s", f.Table, imageKey(t, f.Handle, img), d)
				if n > 3 {
					t.FailNow()
				}
			}
			n++
		}
		t.Logf("%s: %d rows compared", f.Table, n)
		compared += n
		// A DELETE: the same members as TiCDC's DELETEs of the table, "old" null, the row in "data".
		if del := firstDelete[f.Table]; del != nil && len(images) > 0 && sameColumns(f, data(del)) {
			b, err := encodeCanalRow(&open.Event{Kind: open.KindRow, CommitTs: 1 << 40, Schema: "rnd", Table: f.Table,
				Op: open.OpDelete, Columns: images[0]}, wt)
			if err != nil {
				t.Fatal(err)
			}
			got := parseJSON(t, b)
			for _, k := range []string{"id", "database", "table", "pkNames", "isDdl", "type", "sql", "mysqlType", "old"} {
				if !cmp.Equal(got[k], del[k]) {
					t.Errorf("%s DELETE member %s = %v, TiCDC wrote %v", f.Table, k, got[k], del[k])
				}
			}
			if !sameColumns(f, data(got)) {
				t.Errorf("%s DELETE data = %v", f.Table, got["data"])
			}
		}
	}
	if compared < 300 || updates == 0 {
		t.Fatalf("%d rows compared (%d updates): the dataset no longer matches the test", compared, updates)
	}
	// DDLs and watermarks: the first CREATE DATABASE, CREATE TABLE and TIDB_WATERMARK.
	seen := map[string]bool{}
	for _, m := range ds.records {
		typ, _ := m["type"].(string)
		if seen[typ] || (typ != "QUERY" && typ != "CREATE" && typ != "TIDB_WATERMARK") {
			continue
		}
		seen[typ] = true
		ext := m["_tidb"].(map[string]any)
		var b []byte
		if typ == "TIDB_WATERMARK" {
			ts, _ := strconv.ParseUint(string(ext["watermarkTs"].(json.Number)), 10, 64)
			b = encodeCanalWatermark(ts)
		} else {
			ts, _ := strconv.ParseUint(string(ext["commitTs"].(json.Number)), 10, 64)
			ev := &open.Event{Kind: open.KindDDL, CommitTs: ts, Schema: m["database"].(string), Table: m["table"].(string),
				Query: m["sql"].(string), DDLType: map[string]int{"QUERY": ddlCreateSchema, "CREATE": ddlCreateTable}[typ]}
			var err error
			if b, err = encodeCanalDDL(ev); err != nil {
				t.Fatal(err)
			}
		}
		got, w := parseJSON(t, b), maps.Clone(m)
		delete(got, "ts")
		delete(w, "ts")
		if d := cmp.Diff(w, got); d != "" {
			t.Errorf("%s (-TiCDC +loadgen):\n%s", typ, d)
		}
	}
	if len(seen) != 3 {
		t.Errorf("DDL and watermark messages compared: %v", seen)
	}
	t.Logf("%d rows compared with TiCDC's messages (%d updates)", compared, updates)
}

func TestSimpleEncoderMatchesTiCDC(t *testing.T) {
	ds := loadTiCDCDataset(t, "simple-index-value")
	image := func(m map[string]any) map[string]any {
		key := "data"
		if m["type"] == "DELETE" {
			key = "old"
		}
		d, _ := m[key].(map[string]any)
		return d
	}
	str := func(key string) func(m map[string]any) string {
		return func(m map[string]any) string { s, _ := m[key].(string); return s }
	}
	last := lastWrites(t, ds, str("table"), image, str("type"))
	// The last schema TiCDC sent of each table (BOOTSTRAP or DDL).
	schemas := map[string]any{}
	for _, m := range ds.records {
		if ts, ok := m["tableSchema"].(map[string]any); ok {
			schemas[ts["table"].(string)] = ts
		}
	}
	loc, err := time.LoadLocation("Asia/Shanghai") // the dataset's TiCDC --tz
	if err != nil {
		t.Fatal(err)
	}
	coder := &simpleCoder{location: loc}
	simpleDec, err := simple.NewDecoder(simple.DecoderConfig{}) // the second check: parity's decoder verifies the checksums
	if err != nil {
		t.Fatal(err)
	}
	compared, updates, checksums, noChecksum := 0, 0, 0, 0
	for _, f := range ds.finals {
		_, wt, images := ds.rows(t, f)
		wt.schema = "rnd"
		boot, err := encodeSimpleBootstrap(wt)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := simpleDec.Decode(nil, boot); err != nil {
			t.Fatalf("%s bootstrap: %v", f.Table, err)
		}
		if want, ok := schemas[f.Table].(map[string]any); ok {
			b, err := json.Marshal(wt.tableSchema())
			if err != nil {
				t.Fatal(err)
			}
			got, w := parseJSON(t, b), maps.Clone(want)
			for _, m := range []map[string]any{got, w} {
				delete(m, "tableID") // TiDB's IDs and versions of another cluster
				delete(m, "version")
			}
			if d := cmp.Diff(w, got); d != "" {
				t.Errorf("%s tableSchema (-TiCDC +loadgen):\n%s", f.Table, d)
			}
		} else {
			t.Errorf("TiCDC sent no schema of %s", f.Table)
		}
		n := 0
		for _, img := range images {
			if len(f.Handle) == 0 {
				break
			}
			want := last[f.Table][imageKey(t, f.Handle, img)]
			if want == nil || !sameColumns(f, image(want)) {
				continue
			}
			ts, err := strconv.ParseUint(string(want["commitTs"].(json.Number)), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			ev := &open.Event{Kind: open.KindRow, CommitTs: ts, Schema: "rnd", Table: f.Table, Op: open.OpInsert, Columns: img}
			if want["type"] == "UPDATE" {
				ev.Op, ev.OldColumns = open.OpUpdate, img
				updates++
			}
			b, err := coder.encodeRow(ev, wt)
			if err != nil {
				t.Fatal(err)
			}
			decodedSame(t, f.Table, img, func() ([]open.Event, error) { return simpleDec.Decode(nil, b) })
			got, w := parseJSON(t, b), maps.Clone(want)
			gotSum, wantSum := maps.Clone(got["checksum"].(map[string]any)), maps.Clone(w["checksum"].(map[string]any))
			got["checksum"], w["checksum"] = gotSum, wantSum
			for _, m := range []map[string]any{got, w} {
				delete(m, "buildTs")       // the wall clock
				delete(m, "tableID")       // TiDB's table ID and
				delete(m, "schemaVersion") // schema version on another cluster
				if ev.Op == open.OpUpdate {
					delete(m, "old") // the final table does not hold the old row
					delete(m["checksum"].(map[string]any), "previous")
				}
			}
			if wantSum["current"] == json.Number("0") {
				// TiCDC v8.5.6 zeroes both halves of an UPDATE it splits (cdc/model/sink.go
				// SplitUpdateEvent): nothing to compare the checksum with.
				delete(gotSum, "current")
				delete(wantSum, "current")
				noChecksum++
			} else {
				checksums++
			}
			if d := cmp.Diff(w, got); d != "" {
				t.Errorf("%s row %s (-TiCDC +loadgen):\n%s", f.Table, imageKey(t, f.Handle, img), d)
				if n > 3 {
					t.FailNow()
				}
			}
			n++
		}
		t.Logf("%s: %d rows compared", f.Table, n)
		compared += n
	}
	if compared < 300 || updates == 0 || checksums < 200 {
		t.Fatalf("%d rows compared (%d updates, %d checksums): the dataset no longer matches the test", compared, updates, checksums)
	}
	// The first CREATE DATABASE and WATERMARK.
	seen := map[string]bool{}
	for _, m := range ds.records {
		typ, _ := m["type"].(string)
		if seen[typ] || (typ != "QUERY" && typ != "WATERMARK") {
			continue
		}
		seen[typ] = true
		ts, _ := strconv.ParseUint(string(m["commitTs"].(json.Number)), 10, 64)
		var b []byte
		if typ == "WATERMARK" {
			b = encodeSimpleWatermark(ts)
		} else {
			var err error
			if b, err = encodeSimpleDDL(&open.Event{Kind: open.KindDDL, CommitTs: ts, Query: m["sql"].(string), DDLType: ddlCreateSchema}, nil); err != nil {
				t.Fatal(err)
			}
		}
		got, w := parseJSON(t, b), maps.Clone(m)
		delete(got, "buildTs")
		delete(w, "buildTs")
		if d := cmp.Diff(w, got); d != "" {
			t.Errorf("%s (-TiCDC +loadgen):\n%s", typ, d)
		}
	}
	if len(seen) != 2 {
		t.Errorf("DDL and watermark messages compared: %v", seen)
	}
	t.Logf("%d rows compared with TiCDC's messages (%d updates; %d checksums equal, %d rows TiCDC sent 0)", compared, updates, checksums, noChecksum)
	if st := simpleDec.Stats(); st.Mismatches != 0 || st.RowsVerified < uint64(compared) {
		t.Errorf("cdc/simple verified %d images, %d mismatches", st.RowsVerified, st.Mismatches)
	}
}

// decodedSame decodes an encoded row with parity's decoder and compares the values with
// the image encoded.
func decodedSame(t *testing.T, table string, img []open.Column, decode func() ([]open.Event, error)) {
	t.Helper()
	evs, err := decode()
	if err != nil || len(evs) != 1 {
		t.Fatalf("%s: parity's decoder: %d events, %v", table, len(evs), err)
	}
	if len(evs[0].Columns) != len(img) {
		t.Fatalf("%s: decoded %d columns, encoded %d", table, len(evs[0].Columns), len(img))
	}
	for i, c := range evs[0].Columns {
		if c.Name != img[i].Name || !reflect.DeepEqual(c.Value, img[i].Value) {
			t.Errorf("%s: decoded %s = %#v, encoded %s = %#v", table, c.Name, c.Value, img[i].Name, img[i].Value)
		}
	}
}
