package values

import (
	"fmt"
	"math"
	"reflect"
	"testing"
)

// record returns the values, arenas and expected interfaces of a record with counts[k]
// values of each kind (Int, Uint, Float, Text, Bytes, Null, Boxed), small numbers and
// empty texts among them (boxed without the slabs).
func record(counts [7]int) (vals []Value, text, bin []byte, want []any) {
	add := func(v Value, w any) {
		vals = append(vals, v)
		want = append(want, w)
	}
	for i := range counts[0] {
		x := int64(-1000 * (i + 1))
		if i%3 == 2 {
			x = int64(i) // under 256: no allocation
		}
		add(Value{Kind: Int, Num: uint64(x)}, x)
	}
	for i := range counts[1] {
		x := uint64(1000 + i)
		if i%3 == 2 {
			x = uint64(i)
		}
		add(Value{Kind: Uint, Num: x}, x)
	}
	for i := range counts[2] {
		x := 0.5 + float64(i)
		add(Value{Kind: Float, Num: math.Float64bits(x)}, x)
	}
	for i := range counts[3] {
		s := fmt.Sprintf("text %d", i)
		if i%4 == 3 {
			s = ""
		}
		off := len(text)
		text = append(text, s...)
		add(Value{Kind: Text, Off: off, End: len(text)}, s)
	}
	for i := range counts[4] {
		p := []byte{byte(i), 0xff}
		if i%4 == 3 {
			p = []byte{}
		}
		off := len(bin)
		bin = append(bin, p...)
		add(Value{Kind: Bytes, Off: off, End: len(bin)}, p)
	}
	for range counts[5] {
		add(Value{}, nil)
	}
	for range counts[6] {
		add(Value{Kind: Boxed}, nil)
	}
	return vals, text, bin, want
}

// TestBox: every value comes out with its Go type and value whatever mix of types a
// record has (one struct per shape, past maxShapes one array per type), nothing aliases
// the arenas, and the shapes made stay bounded.
func TestBox(t *testing.T) {
	var b Boxer
	n := 0
	for ints := range 4 {
		for uints := range 3 {
			for floats := range 3 {
				for strs := range 4 {
					for bins := range 4 {
						counts := [7]int{ints * 3, uints * 2, floats, strs * 5, bins * 2, 1, ints % 2}
						vals, text, bin, want := record(counts)
						got := b.Box(vals, text, bin)
						n++
						if len(got) != len(want) {
							t.Fatalf("%v: %d values, want %d", counts, len(got), len(want))
						}
						for i := range want {
							if !reflect.DeepEqual(got[i], want[i]) {
								t.Fatalf("%v: value %d is %#v, want %#v", counts, i, got[i], want[i])
							}
						}
						// The values own their memory: scribbling over the arenas changes none.
						kept := append([]any(nil), got...)
						for i := range text {
							text[i] = '#'
						}
						for i := range bin {
							bin[i] = '#'
						}
						b.Reset()
						for i := range want {
							if !reflect.DeepEqual(kept[i], want[i]) {
								t.Fatalf("%v: value %d became %#v after the arenas changed, want %#v", counts, i, kept[i], want[i])
							}
						}
					}
				}
			}
		}
	}
	if len(b.shapes) > maxShapes {
		t.Fatalf("%d shapes made, at most %d", len(b.shapes), maxShapes)
	}
	t.Logf("%d records, %d shapes", n, len(b.shapes))
}

// TestBoxReusesOut: a second Box of fewer values leaves no element of the first.
func TestBoxReusesOut(t *testing.T) {
	var b Boxer
	vals, text, bin, _ := record([7]int{4, 0, 0, 2, 0, 0, 0})
	b.Box(vals, text, bin)
	got := b.Box([]Value{{}, {Kind: Boxed}}, nil, nil)
	if got[0] != nil || got[1] != nil {
		t.Fatalf("Null and Boxed after an earlier record: %#v, want nils", got)
	}
}
