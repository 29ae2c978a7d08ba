package rowkey

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"testing"
)

func TestKeyRoundTripAndText(t *testing.T) {
	for _, tc := range []struct {
		vals []any
		text string
	}{
		{[]any{int64(7)}, "7"},
		{[]any{int64(math.MinInt64), uint64(math.MaxUint64)}, "-9223372036854775808, 18446744073709551615"},
		{[]any{"a'b", nil}, "'a''b', NULL"},
		{[]any{[]byte{0, 0xff}}, "X'00FF'"},
		{[]any{"a\x00b\tc"}, "_utf8mb4 X'6100620963'"},
		{[]any{1.5, -0.25}, "1.5, -0.25"},
		{[]any{"", []byte{}}, "'', X''"},
	} {
		k, err := Encode(tc.vals...)
		if err != nil {
			t.Fatal(err)
		}
		got, err := k.Values()
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, tc.vals) {
			t.Errorf("%v round-trips as %v", tc.vals, got)
		}
		if k.String() != tc.text {
			t.Errorf("%v: text %q, want %q", tc.vals, k.String(), tc.text)
		}
	}
	a, _ := Encode(int64(1))
	b, _ := Encode("1")
	c, _ := Encode([]byte("1"))
	n, _ := Encode(nil)
	e, _ := Encode("")
	if bytes.Equal(a, b) || bytes.Equal(b, c) || bytes.Equal(n, e) {
		t.Fatal("1, '1', X'31' and NULL, '' must be distinct keys")
	}
	if _, err := Encode(struct{}{}); err == nil {
		t.Fatal("a struct encoded")
	}
	for _, bad := range []Key{{0x99}, {tagInt, 1, 2}, {tagString, 'a'}, {tagString, 'a', 0, 7}} {
		if _, err := bad.Values(); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%x: %v, want ErrCorrupt", []byte(bad), err)
		}
	}
}

func TestKeyOrder(t *testing.T) {
	ordered := [][]any{
		{int64(math.MinInt64)}, {int64(-2)}, {int64(-1)}, {int64(0)}, {int64(1)}, {int64(math.MaxInt64)},
	}
	floats := []float64{math.Inf(-1), -1e300, -1, -1e-300, 0, 1e-300, 1, 1e300, math.Inf(1)}
	check := func(vals [][]any) {
		t.Helper()
		for i := 1; i < len(vals); i++ {
			a, _ := Encode(vals[i-1]...)
			b, _ := Encode(vals[i]...)
			if Compare(a, b) >= 0 {
				t.Errorf("%v does not sort before %v", vals[i-1], vals[i])
			}
		}
	}
	check(ordered)
	var fs [][]any
	for _, f := range floats {
		fs = append(fs, []any{f})
	}
	check(fs)
	check([][]any{{"a", int64(9)}, {"a\x00", int64(0)}, {"ab", int64(0)}, {"b"}})
}

// FuzzKeyRoundTrip: every key of fuzzed values decodes to those values; Values never
// panics on arbitrary bytes.
func FuzzKeyRoundTrip(f *testing.F) {
	f.Add(int64(1), uint64(2), 3.5, "a\x00b", []byte{0, 1, 0xff}, true, []byte{tagString, 0, 0})
	f.Add(int64(-1), uint64(0), math.Inf(-1), "", []byte(nil), false, []byte{})
	f.Fuzz(func(t *testing.T, i int64, u uint64, fl float64, s string, b []byte, null bool, junk []byte) {
		if math.IsNaN(fl) {
			fl = 0
		}
		if fl == 0 {
			fl = 0 // -0 encodes as 0
		}
		if b == nil {
			b = []byte{}
		}
		vals := []any{i, u, fl, s, b}
		if null {
			vals = append(vals, nil)
		}
		k, err := Encode(vals...)
		if err != nil {
			t.Fatal(err)
		}
		got, err := k.Values()
		if err != nil {
			t.Fatalf("%v: %v", vals, err)
		}
		if !reflect.DeepEqual(got, vals) {
			t.Fatalf("%v round-trips as %v", vals, got)
		}
		_ = k.String()
		_, _ = Key(junk).Values()
		_ = Key(junk).String()
	})
}
