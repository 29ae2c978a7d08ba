package checker

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/tidb-parity/parity/internal/rowkey"
)

// keysPlan has a key of every kind keys.go types differently, and a non-key column.
func keysPlan() *tablePlan {
	return &tablePlan{
		Columns: []planColumn{
			{Name: "s", Kind: kindString, Collation: [2]string{"utf8mb4_general_ci", "utf8mb4_general_ci"}},
			{Name: "i", Kind: kindInt},
			{Name: "u", Kind: kindInt, Unsigned: true},
			{Name: "f", Kind: kindDouble},
			{Name: "d", Kind: kindDecimal},
			{Name: "t", Kind: kindTemporal},
			{Name: "b", Kind: kindBinary},
			{Name: "bit", Kind: kindBit},
			{Name: "v", Kind: kindString},
		},
		Key: []int{0, 1, 2, 3, 4, 5, 6, 7},
	}
}

// TestKeyValues pins the Go type of every kind of key value (the mapping keys.go
// documents) and that the Value read back is the same SQL value.
func TestKeyValues(t *testing.T) {
	p := keysPlan()
	col := func(name string) planColumn {
		for _, c := range p.Columns {
			if c.Name == name {
				return c
			}
		}
		t.Fatalf("no column %s", name)
		return planColumn{}
	}
	for _, c := range []struct {
		col  string
		in   sqlValue
		want any
		back string // the Value's text read back ("" : the same as in)
	}{
		{"s", stringValue("o'k é"), "o'k é", ""},
		{"s", nullValue, nil, ""},
		{"s", stringValue(""), "", ""},
		{"i", stringValue("-42"), int64(-42), ""},
		{"i", stringValue("18446744073709551615"), uint64(math.MaxUint64), ""}, // an unsigned downstream's value
		{"i", stringValue("0000"), int64(0), "0"},                              // YEAR 0
		{"i", stringValue("99999999999999999999"), "99999999999999999999", ""}, // no server prints it: its text
		{"u", stringValue("7"), uint64(7), ""},
		{"u", stringValue("-1"), int64(-1), ""}, // a signed downstream's value
		{"bit", stringValue("5"), uint64(5), ""},
		{"f", stringValue("1e+21"), 1e21, ""},
		{"f", stringValue("1e21"), 1e21, "1e+21"},
		{"f", stringValue("-0"), math.Copysign(0, -1), "0"}, // rowkey: -0 is 0
		{"f", stringValue("NaN"), "NaN", ""},
		{"d", stringValue("-0.50"), "-0.50", ""},
		{"t", stringValue("2024-02-29 23:59:59.500"), "2024-02-29 23:59:59.500", ""},
		{"b", sqlValue{Bytes: []byte{0, 0xff}}, []byte{0, 0xff}, ""},
		{"b", sqlValue{Bytes: []byte{}}, []byte{}, ""},
	} {
		got := keyValue(col(c.col), c.in)
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s %q: %#v, want %#v", c.col, c.in.Bytes, got, c.want)
			continue
		}
		k, err := rowkey.Encode(got)
		if err != nil {
			t.Fatal(err)
		}
		vals, err := k.Values()
		if err != nil {
			t.Fatal(err)
		}
		back := valueOfKey(vals[0])
		want := c.in
		if c.back != "" {
			want = stringValue(c.back)
		}
		if back.Null != want.Null || !bytes.Equal(back.Bytes, want.Bytes) {
			t.Errorf("%s %q read back as %q, want %q", c.col, c.in.Bytes, back.Bytes, want.Bytes)
		}
	}
}

// TestBoundForms: a bound is stored as a rowkey.Key, typed by the key's columns; bounds
// stored as JSON by earlier releases (this one copied from checker/testdata/oldrun) still
// decode.
func TestBoundForms(t *testing.T) {
	p := keysPlan()
	b := chunkBound{stringValue("Ésa"), stringValue("-3"), stringValue("18446744073709551615"), stringValue("2.5"),
		stringValue("-0.01"), stringValue("2038-01-19 03:14:07.000"), {Bytes: []byte{0, '\''}}, nullValue}
	enc, err := p.encodeBound(b)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(enc, boundPrefix) {
		t.Fatalf("stored as %s", enc)
	}
	got, err := decodeBound(enc)
	if err != nil || !reflect.DeepEqual(got, b) {
		t.Fatalf("%s decodes to %+v (%v), want %+v", enc, got, err, b)
	}
	raw, _ := strings.CutPrefix(enc, boundPrefix)
	if k, _ := base64.StdEncoding.DecodeString(raw); rowkey.Key(k).String() != "'Ésa', -3, 18446744073709551615, 2.5, '-0.01', '2038-01-19 03:14:07.000', X'0027', NULL" {
		t.Errorf("stored key reads %s", rowkey.Key(k))
	}
	// Prefixes of the key (TiDB region starts can be shorter) and no bound at all.
	if enc, err := p.encodeBound(b[:1]); err != nil {
		t.Fatal(err)
	} else if got, _ := decodeBound(enc); !reflect.DeepEqual(got, b[:1]) {
		t.Errorf("one-value bound: %+v", got)
	}
	if enc, err := p.encodeBound(nil); enc != "" || err != nil {
		t.Errorf("open end stored as %q (%v)", enc, err)
	}
	if got, err := decodeBound(""); got != nil || err != nil {
		t.Errorf("open end read as %+v (%v)", got, err)
	}
	if got, err := decodeBound(boundPrefix); got == nil || len(got) != 0 || err != nil {
		t.Errorf("a bound of no values read as %#v (%v): nil is an open end", got, err)
	}
	if _, err := p.encodeBound(append(b, stringValue("x"))); err == nil {
		t.Error("a bound longer than the key was stored")
	}
	old := `[{"x":"azAwOTk="},{"x":"OTk="},{"x":"LTc1LjI1"},{"x":"MjAyNC0wMy0wMSAwMDowMTozOC41MDA="},{"x":"AAK1"},{"n":true},{}]`
	got, err = decodeBound(old)
	want := chunkBound{stringValue("k0099"), stringValue("99"), stringValue("-75.25"), stringValue("2024-03-01 00:01:38.500"), {Bytes: []byte{0, 2, 0xb5}}, nullValue, stringValue("")}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("old bound %s: %+v (%v)", old, got, err)
	}
	for _, bad := range []string{"{}", "rk:%%", "rk:" + "AQ==" + "AQ==", "[1]", "x"} {
		if _, err := decodeBound(bad); err == nil {
			t.Errorf("decodeBound(%q) accepted", bad)
		}
	}
}

// TestStoredDifferenceForms: a stored difference carries its rowkey.Key beside the report
// form, which report.json keeps as it was; one stored by an earlier release (no rk, as in
// checker/testdata/oldrun) gives the same key values from its literals.
func TestStoredDifferenceForms(t *testing.T) {
	p := keysPlan()
	row := []sqlValue{stringValue("o'k"), stringValue("-5"), stringValue("9223372036854775808"), stringValue("1e+21"),
		stringValue("-0.01"), stringValue("1999-12-31 23:59:59.999"), {Bytes: []byte{0x27}}, stringValue("3"), stringValue("v")}
	d := p.missing(row, 1)
	stored := marshalDifference(d)
	report, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	wantReport := `{"kind":"missing","key":{"s":"_utf8mb4 X'6F276B'","i":"-5","u":"9223372036854775808","f":"1e+21","d":"-0.01","t":"'1999-12-31 23:59:59.999'","b":"X'27'","bit":"3"}}`
	if string(report) != wantReport {
		t.Errorf("report entry %s\nwant %s", report, wantReport)
	}
	if !strings.HasPrefix(stored, strings.TrimSuffix(wantReport, "}")+`,"rk":"`) {
		t.Errorf("stored as %s", stored)
	}
	got, err := unmarshalDifference(stored)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.rk, d.rk) || got.rk == nil {
		t.Fatalf("rk read back %x, stored %x", got.rk, d.rk)
	}
	viaKey, err := p.keyValues(got)
	if err != nil {
		t.Fatal(err)
	}
	old, err := unmarshalDifference(string(report)) // as an earlier release stored it
	if err != nil || old.rk != nil {
		t.Fatalf("old form: %v, rk %x", err, old.rk)
	}
	viaLiterals, err := p.keyValues(old)
	if err != nil {
		t.Fatal(err)
	}
	want := []any{"o'k", int64(-5), uint64(1 << 63), 1e21, "-0.01", "1999-12-31 23:59:59.999", []byte{0x27}, uint64(3)}
	if !reflect.DeepEqual(viaKey, want) || !reflect.DeepEqual(viaLiterals, want) {
		t.Errorf("key values: from rk %#v, from literals %#v, want %#v", viaKey, viaLiterals, want)
	}
	// A key of other columns than the table's is refused, naming both.
	other := old
	other.Key = append(Key{}, old.Key...)
	other.Key[1].Column = "j"
	if _, err := p.keyValues(other); err == nil || !strings.Contains(err.Error(), "(s, j, u") {
		t.Errorf("foreign key columns: %v", err)
	}
}

// TestSameKey: Go puts together the keys the collations hold equal, and may put together
// more, never fewer.
func TestSameKey(t *testing.T) {
	plan := func(up, down string) *tablePlan {
		return &tablePlan{Columns: []planColumn{{Name: "s", Kind: kindString, Collation: [2]string{up, down}}, {Name: "i", Kind: kindInt}}, Key: []int{0, 1}}
	}
	form := func(p *tablePlan, s string, i int64) string {
		f, ok := p.sameKey([]any{s, i})
		if !ok {
			t.Fatalf("%q not folded", s)
		}
		return f
	}
	same := func(p *tablePlan, a, b string) bool { return form(p, a, 1) == form(p, b, 1) }
	ci := plan("utf8mb4_general_ci", "utf8mb4_general_ci")
	for _, s := range []string{"ASE", "Asé", "Ase ", "ase"} {
		if !same(ci, "Ase", s) {
			t.Errorf("general_ci: 'Ase' and %q are one key", s)
		}
	}
	if same(ci, "Ase", "Asf") || same(ci, "Ase", "Ase\x00x") {
		t.Error("general_ci: distinct keys taken for one")
	}
	bin := plan("utf8mb4_bin", "utf8mb4_bin")
	if !same(bin, "a", "a ") || same(bin, "a", "A") {
		t.Error("_bin: PAD SPACE only")
	}
	// The coarser side decides.
	if !same(plan("utf8mb4_bin", "utf8mb4_general_ci"), "a", "A") || !same(plan("binary", "utf8mb4_unicode_ci"), "a", "A") {
		t.Error("mixed collations: the coarser one decides")
	}
	// A collation Go cannot fold is left out; the other columns still count.
	de := plan("utf8mb4_german2_ci", "utf8mb4_german2_ci")
	if !same(de, "ä", "ae") || !same(de, "x", "y") || form(de, "x", 1) == form(de, "x", 2) {
		t.Error("german2_ci: the column left out, the integer kept")
	}
	// A character the fold does not model ('ß' is 's' in general_ci): no form.
	if _, ok := ci.sameKey([]any{"ß", int64(1)}); ok {
		t.Error("general_ci: 'ß' folded")
	}
	// Types stay apart: 1 and '1'.
	if form(ci, "1", 1) == func() string { f, _ := ci.sameKey([]any{int64(1), int64(1)}); return f }() {
		t.Error("1 and '1' taken for one key")
	}
	// looseKey: only the non-character columns.
	if ci.looseKey([]any{"ß", int64(1)}) != ci.looseKey([]any{"s", int64(1)}) || ci.looseKey([]any{"s", int64(1)}) == ci.looseKey([]any{"s", int64(2)}) {
		t.Error("looseKey")
	}
}

// TestFoundChunk: a row the re-check reads again by key goes back to the chunk its key
// was stored in, however the collation lets it be spelled now.
func TestFoundChunk(t *testing.T) {
	p := &tablePlan{Columns: []planColumn{{Name: "s", Kind: kindString, Collation: [2]string{"utf8mb4_general_ci", "utf8mb4_general_ci"}}, {Name: "i", Kind: kindInt}}, Key: []int{0, 1}}
	f := newFoundDiffs()
	for i, k := range []struct {
		s   string
		seq int
	}{{"abc", 3}, {"ABC", 4}, {"ß", 5}, {"zz", 6}} {
		if err := f.add(p, diffRef{seq: k.seq, n: i}, []any{k.s, int64(1)}, 1); err != nil {
			t.Fatal(err)
		}
	}
	found := func(s string, i int64) int {
		d := p.missing([]sqlValue{stringValue(s), stringValue(fmt.Sprint(i))}, 1)
		c, ok := f.chunkOf(p, d)
		if !ok {
			t.Fatalf("%q: no chunk", s)
		}
		return c
	}
	for _, c := range []struct {
		s    string
		i    int64
		want int
	}{
		{"abc", 1, 3}, {"ABC", 1, 4}, // exact
		{"Abc", 1, 3}, {"ábc ", 1, 3}, // the collation's equal: the first such key's chunk
		{"ZZ", 1, 6},
		{"s", 1, 5},  // folded, matching no folded key: 'ß', which has no form
		{"zz", 2, 3}, // no stored key like it: the unit's first chunk
	} {
		if got := found(c.s, c.i); got != c.want {
			t.Errorf("%q, %d: chunk %d, want %d", c.s, c.i, got, c.want)
		}
	}
}

// FuzzBoundRoundTrip: a bound of any values of any two key kinds is stored and read back
// as the same SQL values (the same bytes for text, binary, DECIMAL, temporal and JSON
// values; the same number for integers and floats), and stored again identically; any
// text (either stored form, or neither) decodes to a bound or an error.
func FuzzBoundRoundTrip(f *testing.F) {
	f.Add([]byte("a"), []byte{}, uint8(kindString), uint8(kindBinary), true)
	f.Add([]byte("-12"), []byte("1e21"), uint8(kindInt), uint8(kindDouble), false)
	f.Add([]byte("0000"), []byte("-0"), uint8(kindInt), uint8(kindFloat), false)
	f.Add([]byte("18446744073709551615"), []byte("-0.50"), uint8(kindBit), uint8(kindDecimal), false)
	f.Add([]byte(`[{"x":"MTIz"},{"n":true},{}]`), []byte("rk:AgAAAAAAAAAB"), uint8(kindJSON), uint8(kindTemporal), true)
	f.Fuzz(func(t *testing.T, a, b []byte, ka, kb uint8, null bool) {
		p := &tablePlan{Columns: []planColumn{
			{Name: "a", Kind: colKind(int(ka) % (int(kindJSON) + 1)), Unsigned: ka > 128},
			{Name: "b", Kind: colKind(int(kb) % (int(kindJSON) + 1))},
		}, Key: []int{0, 1}}
		in := chunkBound{{Bytes: a}, {Bytes: b}}
		if null {
			in[1] = nullValue
		}
		s, err := p.encodeBound(in)
		if err != nil {
			t.Fatal(err)
		}
		out, err := decodeBound(s)
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		if len(out) != 2 {
			t.Fatalf("%+v -> %s -> %+v", in, s, out)
		}
		for i, c := range p.Columns {
			x, y := keyValue(c, in[i]), keyValue(c, out[i])
			kx, err1 := rowkey.Encode(x)
			ky, err2 := rowkey.Encode(y)
			if err1 != nil || err2 != nil || !bytes.Equal(kx, ky) {
				t.Fatalf("column %d (%s): %q stored as %s, read back %q: keys %x and %x", i, c.Kind, in[i].Bytes, s, out[i].Bytes, kx, ky)
			}
			switch x.(type) {
			case int64, uint64, float64:
				if compareValue(c.Kind, in[i], out[i]) != 0 {
					t.Fatalf("column %d (%s): %q read back as %q", i, c.Kind, in[i].Bytes, out[i].Bytes)
				}
			default:
				if in[i].Null != out[i].Null || !bytes.Equal(in[i].Bytes, out[i].Bytes) {
					t.Fatalf("column %d (%s): %q read back as %q", i, c.Kind, in[i].Bytes, out[i].Bytes)
				}
			}
		}
		if again, err := p.encodeBound(out); err != nil || again != s {
			t.Fatalf("stored again as %s, first %s (%v)", again, s, err)
		}
		for _, text := range []string{string(a), boundPrefix + string(b), boundPrefix + base64.StdEncoding.EncodeToString(b)} {
			if got, err := decodeBound(text); err == nil && strings.HasPrefix(text, boundPrefix) {
				if _, err := p.encodeBound(got[:min(len(got), 2)]); err != nil {
					t.Fatalf("decoded %q, cannot store it again: %v", text, err)
				}
			}
		}
	})
}

// FuzzStoredKey: the re-check's reader of stored differences (keyValues, both forms)
// gives the key values the row's own key has, and refuses, without panicking, what it
// did not store.
func FuzzStoredKey(f *testing.F) {
	f.Add([]byte("o'k"), []byte("-5"), []byte(`{"kind":"missing","key":{"s":"'a'","i":"1"},"rk":"CGEAAQIAAAAAAAAAAQ=="}`))
	f.Add([]byte{0xff, 0}, []byte("18446744073709551615"), []byte(`{"kind":"extra","key":{"s":"X'FF'","i":"NULL"}}`))
	f.Fuzz(func(t *testing.T, s, i, stored []byte) {
		p := &tablePlan{Columns: []planColumn{
			{Name: "s", Kind: kindString, Collation: [2]string{"utf8mb4_general_ci", "utf8mb4_bin"}},
			{Name: "i", Kind: kindInt},
		}, Key: []int{0, 1}}
		row := []sqlValue{{Bytes: s}, {Bytes: i}}
		d := p.missing(row, 1)
		want := []any{keyValue(p.Columns[0], row[0]), keyValue(p.Columns[1], row[1])}
		for _, form := range []string{marshalDifference(d), marshalDifference(Difference{Kind: d.Kind, Key: d.Key})} {
			got, err := unmarshalDifference(form)
			if err != nil {
				t.Fatalf("%s: %v", form, err)
			}
			vals, err := p.keyValues(got)
			if err != nil {
				t.Fatalf("%s: %v", form, err)
			}
			kw, _ := exactKey(want)
			kg, _ := exactKey(vals)
			sg, okg := p.sameKey(vals)
			sw, okw := p.sameKey(want)
			if kw != kg || sg != sw || okg != okw || p.looseKey(vals) != p.looseKey(want) {
				t.Fatalf("%s: key values %#v, want %#v", form, vals, want)
			}
		}
		if got, err := unmarshalDifference(string(stored)); err == nil {
			if vals, err := p.keyValues(got); err == nil {
				_, _ = p.sameKey(vals)
				_ = p.looseKey(vals)
				_ = boundOf(vals)
			}
		}
	})
}
