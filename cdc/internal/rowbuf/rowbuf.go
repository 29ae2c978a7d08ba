// Package rowbuf collects the columns of one Kafka record's row events and turns them
// into open.Columns with a handful of allocations, the way cdc/open's decoder does it
// (docs/decode.md): values are kept unboxed while a record is decoded (numbers in place,
// text and bytes in two arenas), and Finish makes one slice of columns, one string of
// text, one slice of bytes and one array per Go type of the boxed values.
//
// A Builder is scratch: keep it between records (Reset), never share it between
// goroutines. Nothing Finish returns aliases it.
package rowbuf

import (
	"bytes"
	"math"
	"math/bits"
	"reflect"

	"github.com/tidb-parity/parity/cdc/open"
)

// Kind says what a pending value is.
type Kind uint8

const (
	Null  Kind = iota
	Int        // int64(Num)
	Uint       // Num
	Float      // math.Float64frombits(Num)
	Text       // string(Builder.Text[Off:End])
	Bytes      // Builder.Bin[Off:End]
	Boxed      // Column.Value already set (a value made elsewhere, e.g. a converted TIMESTAMP)
)

// Value is a decoded column value before Finish boxes it into Column.Value.
type Value struct {
	Kind     Kind
	Num      uint64
	Off, End int
}

// Builder is the scratch of one record.
type Builder struct {
	Cols []open.Column // the record's columns; Value is set by Finish
	Vals []Value       // their values, parallel to Cols
	Text []byte        // Text values, one after another
	Bin  []byte        // Bytes values, one after another

	ints      slab[int64]
	uints     slab[uint64]
	floats    slab[float64]
	strs      slab[string]
	bytes     slab[[]byte]
	shapes    map[shape]*shaped // see box
	last      *shaped           // the shape used last
	lastShape shape
}

// keepBytes bounds each scratch buffer kept for the next record.
const keepBytes = 1 << 20

// Add appends a column and returns its index; its value is Null until set.
func (b *Builder) Add(name string, typ byte, flags open.Flag) int {
	b.Cols = append(b.Cols, open.Column{Name: name, Type: typ, Flags: flags})
	b.Vals = append(b.Vals, Value{})
	return len(b.Cols) - 1
}

// Truncate drops the columns from n on.
func (b *Builder) Truncate(n int) {
	clear(b.Cols[n:])
	b.Cols, b.Vals = b.Cols[:n], b.Vals[:n]
}

// Reset empties b for the next record; scratch grown past keepBytes is dropped.
func (b *Builder) Reset() {
	clear(b.Cols)
	b.Cols, b.Vals, b.Text, b.Bin = b.Cols[:0], b.Vals[:0], b.Text[:0], b.Bin[:0]
	if cap(b.Cols)*int(reflect.TypeFor[open.Column]().Size()) > keepBytes {
		b.Cols, b.Vals = nil, nil
	}
	if cap(b.Text) > keepBytes {
		b.Text = nil
	}
	if cap(b.Bin) > keepBytes {
		b.Bin = nil
	}
	b.ints.trim()
	b.uints.trim()
	b.floats.trim()
	b.strs.trim()
	b.bytes.trim()
}

// emptyBytes is the value of an empty binary column: not nil (nil would be NULL) and of
// capacity 0, so sharing it is safe (appending to it copies).
var emptyBytes = []byte{}

// Finish returns the record's columns with their values; Cols[i] of b is element i.
func (b *Builder) Finish() []open.Column {
	if len(b.Cols) == 0 {
		return nil
	}
	cols := make([]open.Column, len(b.Cols))
	b.fill(cols)
	return cols
}

// FinishEvents is Finish that also returns n zero events for the caller to fill. A
// record of one event and at most maxBlockCols columns gets its event and its columns
// in one allocation (block).
func (b *Builder) FinishEvents(n int) ([]open.Event, []open.Column) {
	if n == 1 && len(b.Cols) > 0 {
		if evs, cols := block(len(b.Cols)); evs != nil {
			b.fill(cols)
			return evs, cols
		}
	}
	return make([]open.Event, n), b.Finish()
}

// fill copies the columns into cols (of len(b.Cols)) and sets their values.
func (b *Builder) fill(cols []open.Column) {
	copy(cols, b.Cols)
	var text string
	if len(b.Text) > 0 {
		text = string(b.Text)
	}
	var bin []byte
	if len(b.Bin) > 0 {
		bin = bytes.Clone(b.Bin)
	}
	for i, v := range b.Vals {
		switch v.Kind {
		case Null:
			cols[i].Value = nil
		case Int:
			if x := int64(v.Num); x >= 0 && x < 256 {
				cols[i].Value = x // the runtime boxes these without allocating
			} else {
				b.ints.add(x, i)
			}
		case Uint:
			if v.Num < 256 {
				cols[i].Value = v.Num
			} else {
				b.uints.add(v.Num, i)
			}
		case Float:
			b.floats.add(math.Float64frombits(v.Num), i)
		case Text:
			if v.End == v.Off {
				cols[i].Value = "" // boxed without allocating
			} else {
				b.strs.add(text[v.Off:v.End], i)
			}
		case Bytes:
			if v.End == v.Off {
				b.bytes.add(emptyBytes, i)
			} else {
				b.bytes.add(bin[v.Off:v.End:v.End], i)
			}
		}
	}
	b.box(cols)
}

// slab collects the values of one Go type of a record and boxes them into Column.Value
// with one allocation (cdc/open's batch.go explains the technique): box copies all the
// values into one array (reflect's slice-to-array conversion) and takes each element's
// interface from the array, which reflect does without copying the element.
type slab[T any] struct {
	vals  []T
	at    []int            // the column of each value
	types [64]reflect.Type // [1<<k]T, made once per size
}

func (s *slab[T]) trim() {
	if cap(s.vals) > keepBytes/32 {
		s.vals, s.at = nil, nil
	}
}

func (s *slab[T]) add(v T, col int) {
	s.vals = append(s.vals, v)
	s.at = append(s.at, col)
}

func (s *slab[T]) box(cols []open.Column) {
	n := len(s.vals)
	if n == 0 {
		return
	}
	if n == 1 { // one value: boxing it directly is one allocation too, without reflect
		cols[s.at[0]].Value = s.vals[0]
		clear(s.vals)
		s.vals, s.at = s.vals[:0], s.at[:0]
		return
	}
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
