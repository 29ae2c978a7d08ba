package values

import (
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
	"unsafe"
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

// TestBox: every value comes out in its slot with its Go type and value whatever mix of
// types a record has (one struct per shape, past maxShapes one array per type), nothing
// beside the slots is written, nothing aliases the arenas, and the shapes made stay
// bounded.
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
						got := make([]slot, len(vals)+1)
						for i := range got {
							got[i] = slot{before: i, after: -i}
						}
						b.Box(vals, text, bin, SlotsOf(got, slotValue))
						n++
						for i := range want {
							if !reflect.DeepEqual(got[i].v, want[i]) || got[i].before != i || got[i].after != -i {
								t.Fatalf("%v: slot %d is %d, %#v, %d; want %d, %#v, %d", counts, i, got[i].before, got[i].v, got[i].after, i, want[i], -i)
							}
						}
						if last := got[len(vals)]; last.v != nil || last.before != len(vals) || last.after != -len(vals) {
							t.Fatalf("%v: the slot past the values was written: %#v", counts, last)
						}
						// The values own their memory: scribbling over the arenas changes none.
						kept := make([]any, len(got))
						for i := range got {
							kept[i] = got[i].v
						}
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

// slot is an element with an `any` field between others, which Box must leave alone.
type slot struct {
	before int
	v      any
	after  int
}

func slotValue(s *slot) *any { return &s.v }

// TestBoxSlots: Null clears its slot, Boxed leaves it, and too few slots or a field
// outside its element panic (a programming error, like an index out of range).
func TestBoxSlots(t *testing.T) {
	var b Boxer
	got := []slot{{v: "old"}, {v: "made elsewhere"}, {v: 7}}
	b.Box([]Value{{}, {Kind: Boxed}, {Kind: Int, Num: 1000}}, nil, nil, SlotsOf(got, slotValue))
	if got[0].v != nil || got[1].v != "made elsewhere" || got[2].v != int64(1000) {
		t.Fatalf("slots %#v", got)
	}
	panics := func(what string, f func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("%s did not panic", what)
			}
		}()
		f()
	}
	panics("Box with too few slots", func() { b.Box(make([]Value, 4), nil, nil, SlotsOf(got, slotValue)) })
	var other slot
	panics("SlotsOf a field outside the element", func() { SlotsOf(got, func(*slot) *any { return &other.v }) })
	if s := SlotsOf([]slot(nil), slotValue); s.Len() != 0 {
		t.Errorf("SlotsOf(nil) has %d slots", s.Len())
	}
}

// TestBoxTextChunk: text cut from the Boxer's chunk stays what it was after the records
// boxed after it, whether they fit the chunk, start a new one or are too large for one,
// were written in place or not (or were abandoned there), and whatever the caller does
// to the text it passed in.
func TestBoxTextChunk(t *testing.T) {
	var b Boxer
	type kept struct {
		dst  []slot
		want []string
	}
	var all []kept
	for r := range 3000 {
		n := r%4 + 1
		size := 10 + r%300
		if r%250 == 0 {
			size = textChunk/8 + 1 // its own string
		}
		var vals []Value
		var text []byte
		var want []string
		// Every third record writes its text in place (TextArena), some of them more
		// than they asked room for (Box then copies it), and every seventh is abandoned
		// after writing there (a record that failed to decode): the next record's text
		// overwrites it, and no kept value may change.
		inPlace := r%3 == 0
		if inPlace {
			ask := n * (size + 12)
			if r%33 == 0 {
				ask = 1 // overflows
			}
			text = b.TextArena(ask)
			if text == nil && ask <= textChunk/4 {
				t.Fatalf("record %d: no arena for %d bytes", r, ask)
			}
		}
		for i := range n {
			s := strings.Repeat(string(rune('a'+(r+i)%26)), size) + fmt.Sprint(r, ".", i)
			off := len(text)
			text = append(text, s...)
			vals = append(vals, Value{Kind: Text, Off: off, End: len(text)})
			want = append(want, s)
		}
		if inPlace && r%7 == 0 {
			continue // abandoned
		}
		dst := make([]slot, n)
		b.Box(vals, text, nil, SlotsOf(dst, slotValue))
		if !inPlace {
			clear(text) // the caller's arena is reused (text written in place is the Boxer's now)
		}
		if r%500 == 0 {
			b.Reset()
		}
		all = append(all, kept{dst, want})
	}
	for r, k := range all {
		for i, s := range k.dst {
			if s.v != k.want[i] {
				t.Fatalf("record %d value %d changed after later records: %.20q…, want %.20q…", r, i, s.v, k.want[i])
			}
		}
	}
}

// TestBoxTextInPlace: text written in the arena TextArena gives is taken where it is (the
// value's bytes are the arena's), the next arena starts after it, and text that outgrew
// its arena is copied.
func TestBoxTextInPlace(t *testing.T) {
	var b Boxer
	arena := b.TextArena(64)
	text := append(arena, "in place"...)
	dst := make([]slot, 1)
	b.Box([]Value{{Kind: Text, End: len(text)}}, text, nil, SlotsOf(dst, slotValue))
	s := dst[0].v.(string)
	if s != "in place" || unsafe.StringData(s) != &text[0] {
		t.Fatalf("value %q at %p, want \"in place\" at %p (the arena)", s, unsafe.StringData(s), &text[0])
	}
	next := b.TextArena(64)
	if got, want := unsafe.SliceData(next[:1]), unsafe.Add(unsafe.Pointer(&text[0]), len(text)); unsafe.Pointer(got) != want {
		t.Fatalf("the next arena starts at %p, want %p (after the text taken)", got, want)
	}
	grown := append(next, strings.Repeat("x", 300)...) // more than asked for, still within the chunk
	if unsafe.SliceData(grown) != unsafe.SliceData(next[:1]) {
		t.Fatalf("300 bytes did not stay in the chunk")
	}
	b.Box([]Value{{Kind: Text, End: len(grown)}}, grown, nil, SlotsOf(dst, slotValue))
	if s := dst[0].v.(string); unsafe.StringData(s) != &grown[0] || len(s) != 300 {
		t.Fatalf("text in the chunk past what was asked was not taken in place")
	}
	// Text that outgrew the chunk (append moved it) is copied.
	last := b.TextArena(textChunk / 4)
	over := append(last, make([]byte, textChunk)...)
	b.Box([]Value{{Kind: Text, End: len(over)}}, over, nil, SlotsOf(dst, slotValue))
	if s := dst[0].v.(string); len(s) != textChunk || unsafe.StringData(s) == &over[0] {
		t.Fatalf("text that outgrew the chunk was not copied")
	}
	if b.TextArena(textChunk/4+1) != nil {
		t.Fatalf("an arena for more than a quarter of a chunk")
	}
}
