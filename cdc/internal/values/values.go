// Package values turns the column values of one Kafka record, as a decoder reads them
// (numbers in place, text and bytes appended to two arenas), into Go interface values
// with a handful of allocations: one slice of bytes and, for all the boxed values
// together, one struct, with the text cut from a chunk shared by the records after it
// (docs/decode.md). cdc/open's decoder and rowbuf (the column builder of cdc/canal and
// cdc/simple, which imports cdc/open's event model) both use it, so it knows nothing of
// events or columns: Box sets the `any` field of each element of the caller's slice
// (Slots).
//
// A Boxer is scratch: keep it between records, never share it between goroutines.
// Nothing Box sets aliases the input or the Boxer's scratch (its text chunk is not
// scratch: what is written there is never written again).
package values

import (
	"bytes"
	"fmt"
	"math"
	"strings"
	"unsafe"
)

// Kind says what a Value is.
type Kind uint8

const (
	Null  Kind = iota
	Int        // int64(Num)
	Uint       // Num
	Float      // math.Float64frombits(Num)
	Text       // string(text[Off:End])
	Bytes      // bin[Off:End]
	Boxed      // made elsewhere (e.g. a converted TIMESTAMP): Box leaves its slot as it is
)

// Value is a decoded column value before Box boxes it.
type Value struct {
	Kind     Kind
	Num      uint64
	Off, End int
}

// keepBytes bounds each scratch buffer kept for the next record.
const keepBytes = 1 << 20

// emptyBytes is the value of an empty binary column: not nil (nil would be NULL) and of
// capacity 0, so sharing it is safe (appending to it copies).
var emptyBytes = []byte{}

// Boxer is the scratch of Box.
type Boxer struct {
	ints      slab[int64]
	uints     slab[uint64]
	floats    slab[float64]
	strs      slab[string]
	bytes     slab[[]byte]
	shapes    map[shape]*shaped // see box.go
	last      *shaped           // the shape used last
	lastShape shape
	textFree  []byte // the current text chunk: written up to its length, never again
}

// Box sets slot i of dst to vals[i] as an interface value (nil for Null; a Boxed
// value's slot is left as it is). Text values are cut from one copy of text (in the text
// chunk), Bytes values from one copy of bin; nothing set aliases the input or the
// Boxer's scratch. dst must have a slot for every value.
func (b *Boxer) Box(vals []Value, text, bin []byte, dst Slots) {
	if dst.Len() < len(vals) {
		panic(fmt.Sprintf("values: Box: %d values, %d slots", len(vals), dst.Len()))
	}
	txt := b.text(text)
	var bs []byte
	if len(bin) > 0 {
		bs = bytes.Clone(bin)
	}
	for i, v := range vals {
		switch v.Kind {
		case Null:
			*dst.at(i) = nil
		case Int:
			if x := int64(v.Num); x >= 0 && x < 256 {
				*dst.at(i) = x // the runtime boxes these without allocating
			} else {
				b.ints.add(x, i)
			}
		case Uint:
			if v.Num < 256 {
				*dst.at(i) = v.Num
			} else {
				b.uints.add(v.Num, i)
			}
		case Float:
			b.floats.add(math.Float64frombits(v.Num), i)
		case Text:
			if v.End == v.Off {
				*dst.at(i) = "" // boxed without allocating
			} else {
				b.strs.add(txt[v.Off:v.End], i)
			}
		case Bytes:
			if v.End == v.Off {
				b.bytes.add(emptyBytes, i)
			} else {
				b.bytes.add(bs[v.Off:v.End:v.End], i)
			}
		}
	}
	b.box(dst)
}

// text returns a copy of text as a string. Text written in place (TextArena) is taken
// as it is; other small text is appended to the Boxer's text chunk; either is read from
// there (unsafe.String): the bytes of a chunk up to its length are written once and never
// again (the next ones go after them, then to a new chunk), as a string's must be, so
// records share an allocation of text instead of making one each.
func (b *Boxer) text(text []byte) string {
	if len(text) == 0 {
		return ""
	}
	if free := b.textFree[len(b.textFree):cap(b.textFree)]; len(text) <= len(free) && unsafe.SliceData(text) == unsafe.SliceData(free) {
		b.textFree = b.textFree[:len(b.textFree)+len(text)] // written in place: taken, not copied
		return unsafe.String(unsafe.SliceData(text), len(text))
	}
	if len(text) > textChunk/8 {
		return string(text)
	}
	if cap(b.textFree)-len(b.textFree) < len(text) {
		b.textFree = newChunk()
	}
	off := len(b.textFree)
	b.textFree = append(b.textFree, text...)
	return unsafe.String(&b.textFree[off], len(text))
}

// TextArena returns where the caller may write the text of its next record so that Box
// takes it without a copy: an empty slice over the unwritten rest of the text chunk with
// room for at least n bytes (a new chunk when the rest is shorter), or nil when n is more
// than a quarter of a chunk. The caller appends its text to it and passes the result to
// Box as text: Box takes it in place when it is still there (it stayed within the
// capacity, nothing else was boxed since) and copies it otherwise. Text taken in place is
// the Boxer's: the caller must not write it again (it appends the next record's text to
// a new TextArena). Text written there and not passed to Box is overwritten by the next
// record's.
func (b *Boxer) TextArena(n int) []byte {
	if n > textChunk/4 {
		return nil
	}
	if cap(b.textFree)-len(b.textFree) < n {
		b.textFree = newChunk()
	}
	return b.textFree[len(b.textFree):len(b.textFree)]
}

// textChunk is the size of a text chunk; text of more than textChunk/8 bytes not
// written in place gets its own string.
const textChunk = 64 << 10

// newChunk returns an empty text chunk of capacity textChunk, its bytes not zeroed
// (strings.Builder grows without zeroing; every byte of a chunk is written before a
// string is made of it): zeroing a chunk cost as much as copying text into it.
func newChunk() []byte {
	var sb strings.Builder
	sb.Grow(textChunk)
	sb.WriteByte(0)
	return unsafe.Slice(unsafe.StringData(sb.String()), textChunk)[:0]
}

// Reset drops the scratch grown for a huge record.
func (b *Boxer) Reset() {
	b.ints.trim()
	b.uints.trim()
	b.floats.trim()
	b.strs.trim()
	b.bytes.trim()
}
