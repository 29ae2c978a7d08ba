package canal

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// TestFastPath: the fast path decodes every record of the TiCDC-made corpus itself
// (none is left to decodeSlow) and gives exactly what decodeSlow gives.
func TestFastPath(t *testing.T) {
	d, err := NewDecoder(DecoderConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // the second time with the types and names cached
		for _, r := range loadCorpus(t) {
			st := d.state()
			got, ok := st.decode([]byte(r.Value))
			d.release(st)
			if !ok {
				t.Fatalf("%s: left to the slow path", r.Source)
			}
			want, err := decodeSlow([]byte(r.Value))
			if err != nil {
				t.Fatalf("%s: %v", r.Source, err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%s: fast path\n%+v\nslow path\n%+v", r.Source, got, want)
			}
		}
	}
}

// FuzzFastPath: whatever the fast path decodes, decodeSlow decodes to the same events
// (what the fast path does not decode, Decode leaves to decodeSlow). One decoder serves
// every input, so its cached column types and names are exercised across records.
func FuzzFastPath(f *testing.F) {
	for _, r := range loadCorpus(f) {
		f.Add([]byte(r.Value))
	}
	f.Add([]byte(`{"table":"t","type":"UPDATE","pkNames":["k"],"mysqlType":{"k":"varbinary","u":"bigint unsigned","f":"float"},"data":[{"k":"\u00ff\u0000","u":"18446744073709551615","f":"1e38"}],"old":[{"k":"a","u":null,"f":"-0"}],"_tidb":{"commitTs":9,"onlyHandleKey":true}}`))
	f.Add([]byte(`{"table":"t","type":"INSERT","mysqlType":{"a":"int"},"data":[{"a":"+1"},{"a":"-0"}],"_tidb":{"commitTs":1,"claimCheckLocation":"x"},"TABLE":"u"}`))
	d, err := NewDecoder(DecoderConfig{})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, value []byte) {
		st := d.state()
		got, ok := st.decode(value)
		d.release(st)
		want, err := decodeSlow(value)
		if !ok {
			return
		}
		if err != nil {
			t.Fatalf("the fast path decoded %d events, the slow path failed: %v", len(got), err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("fast path\n%+v\nslow path\n%+v", got, want)
		}
	})
}

// TestConcurrentDecode: one Decoder serves several goroutines (each call takes a state
// of its own); every one decodes the corpus to the same events as decodeSlow.
func TestConcurrentDecode(t *testing.T) {
	d, err := NewDecoder(DecoderConfig{})
	if err != nil {
		t.Fatal(err)
	}
	recs := loadCorpus(t)
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			for range 20 {
				for _, r := range recs {
					got, err := d.Decode(nil, []byte(r.Value))
					want, _ := decodeSlow([]byte(r.Value))
					if err != nil || !reflect.DeepEqual(got, want) {
						errs <- fmt.Errorf("%s: %v, events differ: %v", r.Source, err, !reflect.DeepEqual(got, want))
						return
					}
				}
			}
			errs <- nil
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// TestTypesCache: a table's mysqlType and sqlType are recognized from the last message
// of the table — byte for byte, or with mysqlType's members in another order — and a
// changed type is parsed again; every message decodes as decodeSlow decodes it.
func TestTypesCache(t *testing.T) {
	msg := func(mysqlType, sqlType, b string) []byte {
		return []byte(`{"id":0,"database":"d","table":"t","pkNames":["a"],"isDdl":false,"type":"INSERT","es":1,"ts":2,"sql":"",` +
			`"sqlType":` + sqlType + `,"mysqlType":` + mysqlType + `,"old":null,"data":[{"a":"1","b":"` + b + `"}],"_tidb":{"commitTs":5}}`)
	}
	const sql1, sql2 = `{"a":4,"b":12}`, `{"a":4,"b":-5}`
	d, err := NewDecoder(DecoderConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name      string
		value     []byte
		same      bool // the table's cached types were recognized
		bIsString bool
	}{
		{"first", msg(`{"a":"int","b":"varchar"}`, sql1, "300"), false, true},
		{"same bytes", msg(`{"a":"int","b":"varchar"}`, sql1, "301"), true, true},
		{"other order", msg(`{"b":"varchar","a":"int"}`, sql1, "302"), true, true},
		{"other sqlType", msg(`{"b":"varchar","a":"int"}`, sql2, "303"), true, true},
		{"type changed", msg(`{"b":"bigint","a":"int"}`, sql2, "304"), false, false},
		{"changed type kept", msg(`{"a":"int","b":"bigint"}`, sql2, "305"), true, false},
		{"invalid after cached sqlType", msg(`{"a":"int","b":"bigint"}`, sql2+"}", "305"), false, false},
		{"column added", msg(`{"a":"int","b":"bigint","c":"int"}`, sql2, "306"), false, false},
		{"column dropped again", msg(`{"a":"int","b":"bigint"}`, sql2, "307"), false, false},
		{"invalid after cached mysqlType", msg(`{"a":"int","b":"bigint"}]`, sql2, "309"), false, false},
	} {
		st := d.state()
		got, ok := st.decode(c.value)
		same := st.same
		d.release(st)
		want, werr := decodeSlow(c.value)
		if strings.HasPrefix(c.name, "invalid") {
			if ok || werr == nil {
				t.Fatalf("%s: fast path ok %v, slow path error %v; want both to fail", c.name, ok, werr)
			}
			continue
		}
		if !ok || werr != nil {
			t.Fatalf("%s: fast path ok %v, slow path error %v", c.name, ok, werr)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: fast path\n%+v\nslow path\n%+v", c.name, got, want)
		}
		if same != c.same {
			t.Errorf("%s: cached types recognized %v, want %v", c.name, same, c.same)
		}
		if _, isString := got[0].Columns[1].Value.(string); isString != c.bIsString {
			t.Errorf("%s: b is %T, want a string %v", c.name, got[0].Columns[1].Value, c.bIsString)
		}
	}
}

// TestPKNamesCache: the key columns are taken from each message's pkNames, also when
// they change between messages of a table whose types are cached (and after a message
// naming a column the table does not have).
func TestPKNamesCache(t *testing.T) {
	d, err := NewDecoder(DecoderConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for _, pk := range []string{`["a"]`, `["a"]`, `["b"]`, `["a","b"]`, `["b","a","b"]`, `null`, `["x"]`, `[]`, `["x"]`, `["b"]`} {
		value := []byte(`{"id":0,"database":"d","table":"t","pkNames":` + pk + `,"isDdl":false,"type":"INSERT","es":1,"ts":2,"sql":"",` +
			`"sqlType":{"a":4,"b":4},"mysqlType":{"a":"int","b":"int"},"old":null,"data":[{"a":"1","b":"2"}],"_tidb":{"commitTs":5}}`)
		got, gerr := d.Decode(nil, value)
		want, werr := decodeSlow(value)
		if (gerr == nil) != (werr == nil) || !reflect.DeepEqual(got, want) {
			t.Fatalf("pkNames %s: Decode %+v, %v; decodeSlow %+v, %v", pk, got, gerr, want, werr)
		}
		st := d.state()
		_, ok := st.decode(value)
		d.release(st)
		if ok != (pk != `["x"]`) {
			t.Errorf("pkNames %s: decoded by the fast path %v", pk, ok)
		}
	}
}
