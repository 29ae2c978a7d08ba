package open

import (
	"bytes"
	"io"
	"math"
	"math/bits"
	"reflect"

	"github.com/pierrec/lz4/v4"

	"github.com/tidb-parity/parity/cdc/internal/jsonscan"
)

// decodeState is the scratch of one Decode call. The columns of every event of the
// record are read into one slice in message order, their values into pending (numbers
// in place, text and bytes appended to two arenas), and finish turns all of it into the
// record's events with a handful of allocations: one slice of columns, one string of
// text, one slice of bytes and one array per Go type of the boxed values, instead of a
// slice per event and one or two allocations per value.
//
// A Decoder keeps a few states between calls (Decoder.states), so the scratch and the
// interned names are reused; nothing returned to the caller aliases a state.
type decodeState struct {
	d     *Decoder
	sc    jsonscan.Scanner
	names jsonscan.Names // interned schema, table and column names

	cols []Column  // the record's columns in message order, Value not yet set
	vals []pending // their values, parallel to cols
	text []byte    // string values, one after another
	bin  []byte    // []byte values, one after another
	rows []rowSpan // per event: where its columns are in cols
	last span      // the columns section read last

	dbuf  bytes.Buffer     // a decompressed payload
	lz4   *lz4.Reader      // LZ4 frame reader (and its block buffers)
	lzsrc bytes.Reader     // its input
	lzlim io.LimitedReader // its output, bounded

	ints   slab[int64]
	uints  slab[uint64]
	floats slab[float64]
	strs   slab[string]
	bytes  slab[[]byte]
}

// keepScratchBytes bounds each scratch buffer a state keeps for the next call (a record
// of 16 events is typically well under 1 MiB): after a huge record it is dropped rather
// than held.
const keepScratchBytes = 1 << 20

// valueKind says what a pending value is.
type valueKind uint8

const (
	valNull   valueKind = iota
	valInt              // int64(num)
	valUint             // num
	valFloat            // math.Float64frombits(num)
	valString           // text[off:end]
	valBytes            // bin[off:end]
)

// pending is a decoded column value before finish boxes it into Column.Value.
type pending struct {
	kind     valueKind
	num      uint64
	off, end int
}

// span is a range of decodeState.cols.
type span struct{ start, end int }

func (s span) len() int { return s.end - s.start }

// rowSpan says where a row event's columns are.
type rowSpan struct {
	cols, old span
	claimed   bool // the event was replaced by its claim-check object's event
}

// emptyBytes is the value of an empty binary column: not nil (nil would be NULL) and of
// capacity 0, so sharing it is safe (appending to it copies).
var emptyBytes = []byte{}

func (st *decodeState) begin(events int) {
	st.rows = st.rows[:0]
	for range events {
		st.rows = append(st.rows, rowSpan{})
	}
}

// reset empties st after a call; scratch grown beyond keepScratchBytes is dropped.
func (st *decodeState) reset() {
	clear(st.cols) // the names
	st.cols, st.vals, st.text, st.bin, st.rows = st.cols[:0], st.vals[:0], st.text[:0], st.bin[:0], st.rows[:0]
	st.last = span{}
	st.sc.Reset(nil, keepScratchBytes)
	if cap(st.cols)*int(reflect.TypeFor[Column]().Size()) > keepScratchBytes {
		st.cols, st.vals = nil, nil
	}
	if cap(st.text) > keepScratchBytes {
		st.text = nil
	}
	if cap(st.bin) > keepScratchBytes {
		st.bin = nil
	}
	if st.dbuf.Cap() > keepScratchBytes {
		st.dbuf = bytes.Buffer{}
	}
	st.dbuf.Reset()
	st.lzsrc.Reset(nil)
	st.lzlim.R = nil
	if st.lz4 != nil {
		st.lz4.Reset(nil)
	}
	st.ints.trim()
	st.uints.trim()
	st.floats.trim()
	st.strs.trim()
	st.bytes.trim()
	st.names.Trim()
}

// intern returns b as a string, the same string for the same bytes.

// finish sets the columns and values of the record's row events.
func (st *decodeState) finish(events []Event) {
	if len(st.cols) == 0 {
		return
	}
	cols := make([]Column, len(st.cols))
	copy(cols, st.cols)
	var text string
	if len(st.text) > 0 {
		text = string(st.text)
	}
	var bin []byte
	if len(st.bin) > 0 {
		bin = bytes.Clone(st.bin)
	}
	for i, v := range st.vals {
		switch v.kind {
		case valInt:
			if x := int64(v.num); x >= 0 && x < 256 {
				cols[i].Value = x // the runtime boxes these without allocating
			} else {
				st.ints.add(x, i)
			}
		case valUint:
			if v.num < 256 {
				cols[i].Value = v.num
			} else {
				st.uints.add(v.num, i)
			}
		case valFloat:
			st.floats.add(math.Float64frombits(v.num), i)
		case valString:
			if v.end == v.off {
				cols[i].Value = "" // boxed without allocating
			} else {
				st.strs.add(text[v.off:v.end], i)
			}
		case valBytes:
			if v.end == v.off {
				st.bytes.add(emptyBytes, i)
			} else {
				st.bytes.add(bin[v.off:v.end:v.end], i)
			}
		}
	}
	st.ints.box(cols)
	st.uints.box(cols)
	st.floats.box(cols)
	st.strs.box(cols)
	st.bytes.box(cols)
	for i, r := range st.rows {
		ev := &events[i]
		if ev.Kind != KindRow || r.claimed {
			continue
		}
		ev.Columns = cols[r.cols.start:r.cols.end:r.cols.end]
		if r.old.len() > 0 {
			ev.OldColumns = cols[r.old.start:r.old.end:r.old.end]
		}
	}
}

// slab collects the values of one Go type of a record and boxes them into Column.Value
// with one allocation.
//
// Storing an int64 (string, []byte, …) in an interface allocates a copy of it, one per
// value. Instead, box copies all the record's values of type T into one array (reflect's
// slice-to-array conversion, one allocation) and takes each element's interface from
// the array: reflect points an interface made from an element of an unaddressable array
// at the element itself, as nothing can change it. If a Go release copied the elements
// instead, the values would be the same and only the allocations back to one per value
// (BenchmarkDecode and TestDecodeAllocations would show it).
type slab[T any] struct {
	vals  []T
	at    []int            // the column of each value
	types [64]reflect.Type // [1<<k]T, made once per size
}

// trim drops scratch grown for a huge record.
func (s *slab[T]) trim() {
	if cap(s.vals) > keepScratchBytes/32 {
		s.vals, s.at = nil, nil
	}
}

func (s *slab[T]) add(v T, col int) {
	s.vals = append(s.vals, v)
	s.at = append(s.at, col)
}

func (s *slab[T]) box(cols []Column) {
	n := len(s.vals)
	if n == 0 {
		return
	}
	// Array sizes are powers of two: a bounded number of array types, at most twice
	// the space of the values.
	k := bits.Len(uint(n - 1))
	size := 1 << k
	var zero T
	for len(s.vals) < size {
		s.vals = append(s.vals, zero)
	}
	t := s.types[k]
	if t == nil {
		t = reflect.ArrayOf(size, reflect.TypeFor[T]())
		s.types[k] = t
	}
	arr := reflect.ValueOf(&s.vals).Elem().Convert(t)
	for i, c := range s.at {
		cols[c].Value = arr.Index(i).Interface()
	}
	clear(s.vals) // no references into the record's arenas from the scratch
	s.vals, s.at = s.vals[:0], s.at[:0]
}
