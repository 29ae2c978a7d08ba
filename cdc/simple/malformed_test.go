package simple

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tidb-parity/parity/cdc/open"
)

const testBootstrap = `{"version":1,"type":"BOOTSTRAP","commitTs":0,"buildTs":1,"tableSchema":{"schema":"s","table":"t","tableID":1,"version":7,` +
	`"columns":[{"name":"id","dataType":{"mysqlType":"int","charset":"binary","collate":"binary","length":11},"nullable":false,"default":null},` +
	`{"name":"e","dataType":{"mysqlType":"enum","charset":"utf8mb4","collate":"utf8mb4_bin","length":5,"elements":["a","b"]},"nullable":true,"default":null},` +
	`{"name":"b","dataType":{"mysqlType":"varbinary","charset":"binary","collate":"binary","length":8},"nullable":true,"default":null},` +
	`{"name":"ts","dataType":{"mysqlType":"timestamp","charset":"binary","collate":"binary","length":19},"nullable":true,"default":null}],` +
	`"indexes":[{"name":"primary","unique":true,"primary":true,"nullable":false,"columns":["id"]}]}}`

const testKeyless = `{"version":1,"type":"BOOTSTRAP","commitTs":0,"buildTs":1,"tableSchema":{"schema":"s","table":"k","tableID":2,"version":7,` +
	`"columns":[{"name":"a","dataType":{"mysqlType":"int","charset":"binary","collate":"binary","length":11},"nullable":true,"default":null},` +
	`{"name":"v","dataType":{"mysqlType":"vector","charset":"binary","collate":"binary","length":3},"nullable":true,"default":null}],"indexes":[]}}`

func row(typ, rest string) string {
	return `{"version":1,"database":"s","table":"t","tableID":1,"type":"` + typ + `","commitTs":100,"buildTs":1,"schemaVersion":7` + rest + `}`
}

// TestMalformed: every kind of bad record gets an error naming what is bad.
func TestMalformed(t *testing.T) {
	tests := []struct {
		name  string
		value string
		is    error
		want  []string // substrings of the message
	}{
		{"row before its table's BOOTSTRAP", strings.Replace(row("INSERT", `,"data":{"id":"1","e":null,"b":null,"ts":null}`), `"table":"t"`, `"table":"u"`, 1),
			ErrNoSchema, []string{"s.u", "schema version 7", "LearnSchema"}},
		{"row at an unknown schema version", strings.Replace(row("INSERT", `,"data":{"id":"1","e":null,"b":null,"ts":null}`), `"schemaVersion":7`, `"schemaVersion":8`, 1),
			ErrNoSchema, []string{"s.t", "schema version 8"}},
		{"not JSON (Avro or compressed)", "\x00\x01avro", ErrUnsupported, []string{"byte 0x00", "avro"}},
		{"empty", "", ErrSyntax, []string{"nothing"}},
		{"truncated", row("INSERT", `,"data":{"id":"1"`)[:60], ErrSyntax, nil},
		{"version 2", `{"version":2,"type":"WATERMARK","commitTs":1}`, ErrVersion, []string{"version 2"}},
		{"no version", `{"type":"WATERMARK","commitTs":1}`, ErrMissingField, []string{"version"}},
		{"unknown type", `{"version":1,"type":"HEARTBEAT","commitTs":1}`, ErrType, []string{"HEARTBEAT"}},
		{"watermark without commitTs", `{"version":1,"type":"WATERMARK"}`, ErrMissingField, []string{"commitTs"}},
		{"DDL without sql", `{"version":1,"type":"CREATE","commitTs":5}`, ErrMissingField, []string{"sql"}},
		{"bootstrap without schema", `{"version":1,"type":"BOOTSTRAP","commitTs":0}`, ErrMissingField, []string{"tableSchema"}},
		{"row without schemaVersion", strings.Replace(row("INSERT", `,"data":{}`), `,"schemaVersion":7`, ``, 1), ErrMissingField, []string{"s.t", "schemaVersion"}},
		{"insert without data", row("INSERT", ``), ErrMissingField, []string{"s.t", "data"}},
		{"delete with data", row("DELETE", `,"data":{"id":"1","e":null,"b":null,"ts":null},"old":{"id":"1","e":null,"b":null,"ts":null}`), ErrColumn, []string{"data"}},
		{"update without old", row("UPDATE", `,"data":{"id":"1","e":null,"b":null,"ts":null}`), ErrMissingField, []string{"old"}},
		{"missing column", row("INSERT", `,"data":{"id":"1","e":null,"b":null}`), ErrColumn, []string{"s.t", "data.ts", "missing"}},
		{"unknown column", row("INSERT", `,"data":{"id":"1","e":null,"b":null,"ts":null,"zz":"1"}`), ErrColumn, []string{"data.zz", "version 7"}},
		{"INT out of range", row("INSERT", `,"data":{"id":"2147483648","e":null,"b":null,"ts":null}`), ErrRange, []string{"data.id", "2147483648"}},
		{"INT not a number", row("INSERT", `,"data":{"id":"1e3","e":null,"b":null,"ts":null}`), ErrValue, []string{"data.id"}},
		{"INT as a JSON number", row("INSERT", `,"data":{"id":1,"e":null,"b":null,"ts":null}`), ErrValue, []string{"data.id", "a number"}},
		{"ENUM beyond its members", row("INSERT", `,"data":{"id":"1","e":"3","b":null,"ts":null}`), ErrRange, []string{"data.e"}},
		{"bad base64", row("INSERT", `,"data":{"id":"1","e":null,"b":"!!","ts":null}`), ErrValue, []string{"data.b", "base64"}},
		{"TIMESTAMP as a string", row("INSERT", `,"data":{"id":"1","e":null,"b":null,"ts":"2020-01-01 00:00:00"}`), ErrValue, []string{"data.ts"}},
		{"TIMESTAMP in an unknown zone", row("INSERT", `,"data":{"id":"1","e":null,"b":null,"ts":{"location":"Mars/Base","value":"2020-01-01 00:00:00"}}`), ErrValue, []string{"data.ts", "Mars/Base"}},
		{"TIMESTAMP not a time", row("INSERT", `,"data":{"id":"1","e":null,"b":null,"ts":{"location":"UTC","value":"2020-02-30 00:00:00"}}`), ErrValue, []string{"data.ts"}},
		{"claim-check", row("INSERT", `,"claimCheckLocation":"s3://b/x.json","data":{"id":"1"}`), ErrUnsupported, []string{"claim-check"}},
		{"insert with an old checksum", row("INSERT", `,"checksum":{"version":2,"corrupted":false,"current":0,"previous":5},"data":{"id":"1","e":null,"b":null,"ts":null}`), ErrValue, []string{"checksum.previous"}},
		{"unknown checksum version", row("INSERT", `,"checksum":{"version":9,"corrupted":false,"current":1,"previous":0},"data":{"id":"1","e":null,"b":null,"ts":null}`), ErrUnsupported, []string{"version 9"}},
		{"row of a table with an unsupported column type", strings.Replace(row("INSERT", `,"data":{"a":"1","v":"[1,2,3]"}`), `"table":"t"`, `"table":"k"`, 1), ErrUnknownType, []string{"s.k", `"vector"`, "column v"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, err := NewDecoder(DefaultDecoderConfig())
			if err != nil {
				t.Fatal(err)
			}
			for _, b := range []string{testBootstrap, testKeyless} {
				if evs, err := d.Decode(nil, []byte(b)); err != nil || len(evs) != 0 {
					t.Fatalf("bootstrap: %v %v", evs, err)
				}
			}
			evs, err := d.Decode(nil, []byte(tc.value))
			if err == nil {
				t.Fatalf("decoded to %+v, want an error", evs)
			}
			if evs != nil {
				t.Errorf("events with an error: %+v", evs)
			}
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Errorf("error %T is not a *DecodeError", err)
			}
			if !errors.Is(err, tc.is) {
				t.Errorf("error %v is not %v", err, tc.is)
			}
			err = WithRecord(err, "tp", 2, 99)
			for _, w := range append(tc.want, "topic tp partition 2 offset 99") {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
			if st := d.Stats(); st != (Stats{}) {
				t.Errorf("a failed record changed the counters: %+v", st)
			}
		})
	}
}

// TestWithoutChecksum: images TiCDC could not checksum are counted, not failed; an
// all-NULL image hashes to 0 (the CRC of nothing), so a non-zero checksum on one is a
// mismatch.
func TestWithoutChecksum(t *testing.T) {
	d, err := NewDecoder(DefaultDecoderConfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{testBootstrap, strings.Replace(testKeyless, `"mysqlType":"vector"`, `"mysqlType":"double"`, 1)} {
		if _, err := d.Decode(nil, []byte(b)); err != nil {
			t.Fatal(err)
		}
	}
	keyless := func(typ, rest string) []byte {
		return []byte(strings.Replace(row(typ, rest), `"table":"t"`, `"table":"k"`, 1))
	}
	for _, v := range [][]byte{
		[]byte(row("INSERT", `,"data":{"id":"1","e":"1","b":"AA==","ts":null}`)),                                                                    // no checksum field
		[]byte(row("INSERT", `,"checksum":{"version":2,"corrupted":false,"current":0,"previous":0},"data":{"id":"1","e":null,"b":null,"ts":null}`)), // split-update half
		keyless("INSERT", `,"checksum":{"version":2,"corrupted":false,"current":0,"previous":0},"data":{"a":null,"v":null}`),                        // all NULL
		[]byte(row("UPDATE", `,"checksum":{"version":2,"corrupted":false,"current":0,"previous":0},"data":{"id":"1","e":null,"b":null,"ts":null},"old":{"id":"1","e":"2","b":null,"ts":null}`)),
	} {
		if _, err := d.Decode(nil, v); err != nil {
			t.Fatalf("%s: %v", v, err)
		}
	}
	if st := d.Stats(); st != (Stats{RowsWithoutChecksum: 5}) {
		t.Errorf("stats %+v, want 5 rows without checksum", st)
	}
	_, err = d.Decode(nil, keyless("DELETE", `,"checksum":{"version":2,"corrupted":false,"current":0,"previous":77},"old":{"a":null,"v":null}`))
	var ce *ChecksumError
	if !errors.As(err, &ce) || ce.Want != 77 || ce.Got != 0 || ce.Key != "a=NULL, v=NULL" || ce.Image != "old" {
		t.Errorf("all-NULL row with checksum 77: got %v", err)
	}
	if st := d.Stats(); st.Mismatches != 1 {
		t.Errorf("stats %+v, want 1 mismatch", st)
	}
}

// TestTimestampZone: a TIMESTAMP is carried as TiCDC sent it, or in DecoderConfig.TimeZone.
func TestTimestampZone(t *testing.T) {
	for _, tc := range []struct {
		zone *time.Location
		want string
	}{
		{nil, "2020-06-01 08:00:00.5"},
		{time.UTC, "2020-06-01 00:00:00.5"},
		{time.FixedZone("+08:00", 8*3600), "2020-06-01 08:00:00.5"},
	} {
		d, err := NewDecoder(DecoderConfig{TimeZone: tc.zone})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.Decode(nil, []byte(testBootstrap)); err != nil {
			t.Fatal(err)
		}
		evs, err := d.Decode(nil, []byte(row("INSERT", `,"data":{"id":"1","e":null,"b":null,"ts":{"location":"Asia/Shanghai","value":"2020-06-01 08:00:00.5"}}`)))
		if err != nil {
			t.Fatal(err)
		}
		if got := evs[0].Columns[3].Value; got != tc.want {
			t.Errorf("zone %v: TIMESTAMP %v, want %s", tc.zone, got, tc.want)
		}
	}
}

// TestSchemaCache: versions are kept apart; a RENAME's new name and a TRUNCATE's new
// BOOTSTRAP serve rows; LearnSchema ignores rows.
func TestSchemaCache(t *testing.T) {
	d, err := NewDecoder(DefaultDecoderConfig())
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := d.LearnSchema([]byte(row("INSERT", `,"data":{}`))); ok || err != nil {
		t.Fatalf("LearnSchema of a row: %v %v", ok, err)
	}
	if ok, err := d.LearnSchema([]byte(testBootstrap)); !ok || err != nil {
		t.Fatalf("LearnSchema of a bootstrap: %v %v", ok, err)
	}
	v8 := strings.Replace(strings.Replace(testBootstrap, `"version":7`, `"version":8`, 1), `"BOOTSTRAP","commitTs":0`, `"ALTER","sql":"ALTER TABLE s.t DROP COLUMN ts","commitTs":9`, 1)
	v8 = strings.Replace(v8, `,{"name":"ts","dataType":{"mysqlType":"timestamp","charset":"binary","collate":"binary","length":19},"nullable":true,"default":null}`, ``, 1)
	evs, err := d.Decode(nil, []byte(v8))
	if err != nil || len(evs) != 1 || evs[0].Kind != open.KindDDL || evs[0].Table != "t" || evs[0].Schema != "s" || evs[0].CommitTs != 9 {
		t.Fatalf("DDL: %+v %v", evs, err)
	}
	if _, err := d.Decode(nil, []byte(row("INSERT", `,"data":{"id":"1","e":null,"b":null,"ts":null}`))); err != nil {
		t.Errorf("a row at version 7 after the DDL to 8: %v", err)
	}
	r8 := strings.Replace(row("INSERT", `,"data":{"id":"1","e":null,"b":null}`), `"schemaVersion":7`, `"schemaVersion":8`, 1)
	if _, err := d.Decode(nil, []byte(r8)); err != nil {
		t.Errorf("a row at version 8: %v", err)
	}
}

// The consumer calls every protocol's decoder alike (open.Decoder, canal.Decoder): one
// Kafka record in, its events out.
var _ interface {
	Decode(key, value []byte) ([]open.Event, error)
} = (*Decoder)(nil)

// TestExportImportSchemas: a decoder restored from another's exported schemas decodes
// the rows of the TiCDC-made corpus without their BOOTSTRAPs.
func TestExportImportSchemas(t *testing.T) {
	d, recs := corpusDecoder(t)
	data, err := d.ExportSchemas()
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := NewDecoder(DefaultDecoderConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := fresh.ImportSchemas(data); err != nil {
		t.Fatal(err)
	}
	rows := 0
	for _, r := range recs {
		if !strings.HasPrefix(r.Name[4:], "row-") {
			continue
		}
		if _, err := fresh.Decode(nil, []byte(r.Value)); err != nil {
			t.Fatalf("%s: %v", r.Name, err)
		}
		rows++
	}
	empty, _ := NewDecoder(DefaultDecoderConfig())
	if _, err := empty.Decode(nil, []byte(recs[len(recs)-1].Value)); !errors.Is(err, ErrNoSchema) {
		t.Errorf("a decoder without the schemas: %v, want ErrNoSchema", err)
	}
	if rows == 0 || fresh.Stats().RowsVerified == 0 {
		t.Errorf("%d rows, stats %+v", rows, fresh.Stats())
	}
	if err := fresh.ImportSchemas([]byte(`[null]`)); err == nil {
		t.Error("a null schema imported")
	}
}

// TestSchemasSince: what records add to the cache is reported once, from the caller's
// mark; a BOOTSTRAP repeating a cached schema adds nothing, a changed one is reported
// again; imported schemas are not reported; a JSON array of the reported TableSchema
// restores a decoder that decodes the rows.
func TestSchemasSince(t *testing.T) {
	d, err := NewDecoder(DefaultDecoderConfig())
	if err != nil {
		t.Fatal(err)
	}
	if got, mark := d.SchemasSince(0); len(got) != 0 || mark != 0 {
		t.Fatalf("empty decoder: %d entries, mark %d", len(got), mark)
	}
	mustDecode := func(v string) {
		t.Helper()
		if _, err := d.Decode(nil, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	mustDecode(testBootstrap)
	mustDecode(testBootstrap) // TiCDC repeats a BOOTSTRAP per partition and periodically
	got, mark := d.SchemasSince(0)
	if len(got) != 1 || got[0].Schema != "s" || got[0].Table != "t" || got[0].Version != 7 || mark != 1 {
		t.Fatalf("after a BOOTSTRAP twice: %+v, mark %d", got, mark)
	}
	if again, m := d.SchemasSince(mark); len(again) != 0 || m != mark {
		t.Fatalf("nothing new since mark %d: %+v, mark %d", mark, again, m)
	}
	mustDecode(testKeyless)
	changed := strings.Replace(testBootstrap, `"length":8}`, `"length":9}`, 1) // same version, other content
	mustDecode(changed)
	got, mark2 := d.SchemasSince(mark)
	if len(got) != 2 || got[0].Table != "k" || got[1].Table != "t" || !strings.Contains(string(got[1].TableSchema), `"length":9`) || mark2 != 3 {
		t.Fatalf("since mark %d: %+v, mark %d", mark, got, mark2)
	}

	all, _ := d.SchemasSince(0)
	arr := []byte("[")
	for i, e := range all {
		if i > 0 {
			arr = append(arr, ',')
		}
		arr = append(arr, e.TableSchema...)
	}
	arr = append(arr, ']')
	fresh, _ := NewDecoder(DefaultDecoderConfig())
	if err := fresh.ImportSchemas(arr); err != nil {
		t.Fatal(err)
	}
	if got, m := fresh.SchemasSince(0); len(got) != 0 || m != 0 {
		t.Fatalf("imported schemas reported: %+v, mark %d", got, m)
	}
	if _, err := fresh.Decode(nil, []byte(row("INSERT", `,"data":{"id":"1","e":null,"b":null,"ts":null}`))); err != nil {
		t.Fatalf("a row after the import: %v", err)
	}
	if _, err := fresh.Decode(nil, []byte(changed)); err != nil {
		t.Fatal(err)
	}
	if got, _ := fresh.SchemasSince(0); len(got) != 0 {
		t.Fatalf("a BOOTSTRAP equal to an imported schema reported: %+v", got)
	}
}
