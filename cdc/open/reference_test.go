package open

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/tidb-parity/parity/cdc/open/internal/reference"
)

// FuzzDecodeReference checks the decoder against internal/reference, the decoder as it
// was before its allocations and scanner were reworked (a frozen copy): on any record,
// both return the same events, or errors with the same text (offsets, event index,
// field).
func FuzzDecodeReference(f *testing.F) {
	for _, c := range loadCorpus(f) {
		mode := uint8(0)
		for i, comp := range fuzzCompressions {
			if comp == Compression(c.Encoder.Compression) {
				mode = uint8(i)
			}
		}
		for _, m := range c.Messages {
			f.Add(c.read(f, m.KeyFile), c.read(f, m.ValueFile), mode)
		}
	}
	k, v := record([]string{rowKey, `{"ts":2,"t":3}`, `{"ts":3,"scm":"s","t":2}`},
		[]string{row(`{"t":15,"f":1,"v":"\\x00a\"\\u00e9"}`), "", `{"q":"CREATE DATABASE s","t":1}`})
	f.Add(k, v, uint8(0))
	// Keys that begin alike (keyOf resumes after their "ts", "scm" and "tbl").
	k, v = record([]string{`{"ts":5,"scm":"s","tbl":"t","rid":1,"t":1}`, `{"ts":5,"scm":"s","tbl":"t","rid":2,"t":1}`, `{"ts":5,"scm":"s","tbl":"t","t":1}`},
		[]string{row(`{"t":3,"h":true,"f":11,"v":1}`), row(`{"t":3,"h":true,"f":11,"v":2}`), row(`{"t":3,"h":true,"f":11,"v":3}`)})
	f.Add(k, v, uint8(0))
	// Columns that begin alike (column resumes at their values).
	k, v = record([]string{`{"ts":5,"scm":"s","tbl":"t","rid":1,"t":1}`, `{"ts":5,"scm":"s","tbl":"t","rid":2,"t":1}`},
		[]string{`{"u":{"a":{"t":3,"h":true,"f":11,"v":1},"b":{"t":15,"f":0,"v":"x"}}}`,
			`{"u":{"a":{"t":3,"h":true,"f":11,"v":2},"b":{"t":15,"f":0,"v":"y"}},"p":{"a":{"t":3,"h":true,"f":11,"v":1},"b":{"t":15,"f":0,"v":"x"}}}`})
	f.Add(k, v, uint8(0))
	f.Fuzz(func(t *testing.T, key, value []byte, mode uint8) {
		comp := fuzzCompressions[int(mode)%len(fuzzCompressions)]
		d, err := NewDecoder(DecoderConfig{Compression: comp, KeepClaimCheck: true, MaxPayloadBytes: 16 << 20})
		if err != nil {
			t.Fatal(err)
		}
		ref, err := reference.NewDecoder(reference.DecoderConfig{Compression: reference.Compression(comp), KeepClaimCheck: true, MaxPayloadBytes: 16 << 20})
		if err != nil {
			t.Fatal(err)
		}
		checkAgainstReference(t, d, ref, key, value)
	})
}

func checkAgainstReference(t *testing.T, d *Decoder, ref *reference.Decoder, key, value []byte) {
	t.Helper()
	got, err := d.Decode(key, value)
	want, werr := ref.Decode(key, value)
	if (err == nil) != (werr == nil) || (err != nil && err.Error() != werr.Error()) {
		t.Fatalf("error %v\nreference %v", err, werr)
	}
	if err != nil {
		return
	}
	if len(got) != len(want) {
		t.Fatalf("%d events, reference %d", len(got), len(want))
	}
	for i := range want {
		w := fromReference(&want[i])
		if !reflect.DeepEqual(got[i], w) {
			t.Fatalf("event %d:\n got %#v\nwant %#v", i, got[i], w)
		}
	}
}

func fromReference(ev *reference.Event) Event {
	cols := func(in []reference.Column) []Column {
		if in == nil {
			return nil
		}
		out := make([]Column, len(in))
		for i, c := range in {
			out[i] = Column{Name: c.Name, Type: c.Type, Flags: Flag(c.Flags), Value: c.Value}
		}
		return out
	}
	return Event{
		Kind: Kind(ev.Kind), CommitTs: ev.CommitTs, Schema: ev.Schema, Table: ev.Table,
		Partition: ev.Partition, RowID: ev.RowID, Op: Op(ev.Op),
		Columns: cols(ev.Columns), OldColumns: cols(ev.OldColumns),
		OnlyHandleKey: ev.OnlyHandleKey, ClaimCheckLocation: ev.ClaimCheckLocation,
		Query: ev.Query, DDLType: ev.DDLType, Malformed: ev.Malformed,
	}
}

// TestCorpusReference decodes every corpus record (claim-check objects loaded) with both
// decoders.
func TestCorpusReference(t *testing.T) {
	for _, c := range loadCorpus(t) {
		t.Run(c.Name, func(t *testing.T) {
			ref, err := reference.NewDecoder(reference.DecoderConfig{
				Compression: reference.Compression(c.Encoder.Compression), ClaimCheck: c.claimCheckLoader(),
			})
			if err != nil {
				t.Fatal(err)
			}
			d := c.decoder(t, false)
			for _, m := range c.Messages {
				checkAgainstReference(t, d, ref, c.read(t, m.KeyFile), c.read(t, m.ValueFile))
			}
		})
	}
}

// TestKeyPrefixReference: records whose keys begin alike (a transaction's rows of one
// table: keyOf resumes after their "ts", "scm" and "tbl") decode as the reference
// decoder, which parses every key whole: equal keys, classic keys with row ids, keys one
// byte apart, a member repeated after the prefix, prefixes that are not "ts", "scm",
// "tbl", white space and escapes, a broken key after a good one (the record's error is
// the reference's), and the next record after each.
func TestKeyPrefixReference(t *testing.T) {
	k1 := `{"ts":5,"scm":"s","tbl":"t","t":1}`
	k2 := `{"ts":5,"scm":"s","tbl":"u","t":1}`
	k3 := `{"ts":6,"scm":"s","tbl":"t","t":1}`
	ohk := `{"ts":5,"scm":"s","tbl":"t","t":1,"ohk":true}`
	ptn := `{"ts":5,"scm":"s","tbl":"t","ptn":7,"rid":3,"t":1}`
	bad := `{"ts":5,"scm":"s","tbl":"t","t":9}`
	rid := func(id int) string { return fmt.Sprintf(`{"ts":5,"scm":"s","tbl":"t","rid":%d,"t":1}`, id) }
	a := row(`{"t":3,"h":true,"f":11,"v":1}`)
	b := row(`{"t":3,"h":true,"f":11,"v":2}`)
	for _, tc := range []struct {
		name string
		keys []string
	}{
		{"a run of equal keys", []string{k1, k1, k1, k1}},
		{"runs of two tables", []string{k1, k1, k2, k2, k1}},
		{"keys one byte apart", []string{k1, k3, k1, k3}},
		{"handle-key-only after an equal key", []string{k1, ohk, ohk, k1}},
		{"partition and row id", []string{ptn, ptn, k1, ptn}},
		{"an unknown kind repeated", []string{k1, bad, bad}},
		{"a resolved key repeated", []string{`{"ts":9,"t":3}`, `{"ts":9,"t":3}`}},
		{"classic keys: row ids", []string{rid(1), rid(2), rid(30), rid(2), k1}},
		{"a member repeated after the prefix", []string{`{"ts":5,"scm":"s","tbl":"t","ts":8,"tbl":"v","t":1}`, k1, k1}},
		{"the prefix in another order", []string{`{"scm":"s","ts":5,"tbl":"t","t":1}`, `{"scm":"s","ts":5,"tbl":"t","t":1}`}},
		{"white space", []string{` { "ts" : 5 , "scm":"s","tbl":"t" , "t":1}`, ` { "ts" : 5 , "scm":"s","tbl":"t" , "t":1}`, k1}},
		{"an escaped table name", []string{`{"ts":5,"scm":"s","tbl":"\u0074","t":1}`, `{"ts":5,"scm":"s","tbl":"\u0074","rid":4,"t":1}`}},
		{"a table name that extends the last", []string{k1, `{"ts":5,"scm":"s","tbl":"tu","t":1}`, `{"ts":5,"scm":"s","tbl":"t\"","t":1}`}},
		{"a prefix then a broken rest", []string{k1, `{"ts":5,"scm":"s","tbl":"t","t":1`}},
		{"a prefix then a missing kind", []string{k1, `{"ts":5,"scm":"s","tbl":"t"}`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, ref := decoderPair(t)
			var values []string
			for i, k := range tc.keys {
				switch {
				case strings.Contains(k, `"t":3`):
					values = append(values, "")
				case i%2 == 0:
					values = append(values, a)
				default:
					values = append(values, b)
				}
			}
			key, value := record(tc.keys, values)
			checkAgainstReference(t, d, ref, key, value)
			// The same decoder and state on a record of other keys after it.
			key, value = record([]string{k2, k3}, []string{a, b})
			checkAgainstReference(t, d, ref, key, value)
		})
	}
}

// TestColumnHeadReference: columns that begin like the column at their position before
// them (column resumes at the value) decode as the reference decoder parses them whole:
// flags and types that extend the last one's digits, a handle mark that comes and goes,
// "v" first, members after "v" (repeated ones too), an unknown member before "v", white
// space, an escaped name, sections of other lengths, and broken values after a match.
func TestColumnHeadReference(t *testing.T) {
	cols := func(cs ...string) string {
		var b strings.Builder
		for i, c := range cs {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `"c%d":%s`, i, c)
		}
		return b.String()
	}
	upd := func(u, p string) string { return `{"u":{` + u + `},"p":{` + p + `}}` }
	ins := func(u string) string { return `{"u":{` + u + `}}` }
	for _, tc := range []struct {
		name   string
		values []string
	}{
		{"sysbench rows", []string{
			ins(cols(`{"t":8,"h":true,"f":11,"v":5000001}`, `{"t":3,"f":1,"v":498037}`, `{"t":254,"f":0,"v":"abc"}`)),
			ins(cols(`{"t":8,"h":true,"f":11,"v":5000002}`, `{"t":3,"f":1,"v":498074}`, `{"t":254,"f":0,"v":"abd"}`)),
			upd(cols(`{"t":8,"h":true,"f":11,"v":5000003}`, `{"t":3,"f":1,"v":7}`), cols(`{"t":8,"h":true,"f":11,"v":5000003}`, `{"t":3,"f":1,"v":8}`)),
		}},
		{"digits that extend the last ones", []string{
			ins(cols(`{"t":3,"f":1,"v":1}`, `{"t":1,"f":0,"v":2}`)),
			ins(cols(`{"t":3,"f":11,"v":1}`, `{"t":15,"f":0,"v":"x"}`)),
			ins(cols(`{"t":3,"f":1,"v":10}`, `{"t":1,"f":0,"v":-2}`)),
		}},
		{"a handle mark that comes and goes", []string{
			ins(cols(`{"t":3,"h":true,"f":3,"v":1}`)),
			ins(cols(`{"t":3,"f":3,"v":1}`)),
			ins(cols(`{"t":3,"h":false,"f":3,"v":1}`)),
			ins(cols(`{"t":3,"h":true,"f":3,"v":1}`)),
		}},
		{"v first, members after v", []string{
			ins(cols(`{"v":1,"t":3,"f":0}`, `{"t":3,"v":1,"f":0}`)),
			ins(cols(`{"v":2,"t":3,"f":0}`, `{"t":3,"v":2,"f":1}`)),
			ins(cols(`{"v":2,"t":3,"f":0,"v":"x"}`, `{"t":3,"v":2,"f":1,"t":254}`)),
			ins(cols(`{"v":3}`, `{"t":3,"v":3}`)),
		}},
		{"an unknown member, white space, escapes", []string{
			ins(cols(`{"t":3,"x":[1,{"v":2}],"f":0,"v":1}`, `{ "t" : 3 , "f" : 0 , "v" : 1 }`, `{"t":3,"f":0,"\u0076":1}`)),
			ins(cols(`{"t":3,"x":[1,{"v":2}],"f":0,"v":2}`, `{ "t" : 3 , "f" : 0 , "v" :  2 }`, `{"t":3,"f":0,"\u0076":"y"}`)),
		}},
		{"sections of other lengths", []string{
			upd(cols(`{"t":3,"f":0,"v":1}`, `{"t":15,"f":0,"v":"a"}`, `{"t":15,"f":0,"v":"b"}`), cols(`{"t":15,"f":0,"v":"a"}`)),
			upd(cols(`{"t":15,"f":0,"v":"a"}`), cols(`{"t":3,"f":0,"v":1}`, `{"t":15,"f":0,"v":"c"}`)),
		}},
		{"a broken value after a match", []string{
			ins(cols(`{"t":3,"f":0,"v":1}`)),
			ins(cols(`{"t":3,"f":0,"v":1x}`)),
		}},
		{"a missing value after a match", []string{
			ins(cols(`{"t":3,"f":0,"v":1}`)),
			ins(cols(`{"t":3,"f":0,"v":}`)),
		}},
		{"a value of another type after a match", []string{
			ins(cols(`{"t":3,"f":0,"v":1}`)),
			ins(cols(`{"t":3,"f":0,"v":"z"}`)),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, ref := decoderPair(t)
			keys := make([]string, len(tc.values))
			for i := range keys {
				keys[i] = fmt.Sprintf(`{"ts":5,"scm":"s","tbl":"t","rid":%d,"t":1}`, i)
			}
			key, value := record(keys, tc.values)
			checkAgainstReference(t, d, ref, key, value)
			// Each event alone after it, with what the decoder kept of the columns.
			for i := range keys {
				key, value := record(keys[i:i+1], tc.values[i:i+1])
				checkAgainstReference(t, d, ref, key, value)
			}
		})
	}
}

// decoderPair returns a decoder and the reference decoder, claim-check objects kept.
func decoderPair(t *testing.T) (*Decoder, *reference.Decoder) {
	t.Helper()
	d, err := NewDecoder(DecoderConfig{KeepClaimCheck: true})
	if err != nil {
		t.Fatal(err)
	}
	ref, err := reference.NewDecoder(reference.DecoderConfig{KeepClaimCheck: true})
	if err != nil {
		t.Fatal(err)
	}
	return d, ref
}
