// Package rowbuf collects the columns of one Kafka record's row events and turns them
// into open.Columns with a handful of allocations, as cdc/open's decoder does
// (docs/decode.md): values are kept unboxed while a record is decoded (numbers in place,
// text and bytes in two arenas), and FinishEvents hands out the columns, built in place
// in a chunk, with events cut from another, and boxes the values with package values
// (the text from a chunk, one slice of bytes, one struct of the boxed values).
//
// A Builder is scratch: keep it between records (Reset), never share it between
// goroutines. Nothing FinishEvents returns aliases its scratch: it cuts events and
// columns from chunks no later record is given again.
package rowbuf

import (
	"reflect"

	"github.com/tidb-parity/parity/cdc/internal/values"
	"github.com/tidb-parity/parity/cdc/open"
)

// Kind and Value are the values package's: a pending value and what it is.
type (
	Kind  = values.Kind
	Value = values.Value
)

// The kinds of a Value (see values.Kind).
const (
	Null  = values.Null
	Int   = values.Int
	Uint  = values.Uint
	Float = values.Float
	Text  = values.Text
	Bytes = values.Bytes
	Boxed = values.Boxed // Column.Value already set (a value made elsewhere, e.g. a converted TIMESTAMP)
)

// Builder is the scratch of one record.
type Builder struct {
	// Cols are the record's columns (Value is set by FinishEvents). From Reset on they are
	// built in place in the column chunk, where FinishEvents hands them out without a
	// copy.
	Cols []open.Column
	Vals []Value // their values, parallel to Cols
	Text []byte  // Text values, one after another
	Bin  []byte  // Bytes values, one after another

	box values.Boxer

	evFree  []open.Event  // the rest of the current event chunk (FinishEvents)
	colFree []open.Column // the rest of the current column chunk, Cols at its start
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
	if b.Cols != nil && !b.inChunk() {
		clear(b.colFree) // Add outgrew the chunk after writing all of it
	}
	clear(b.Cols) // nil once FinishEvents handed them out
	if len(b.colFree) < colChunk/8 {
		b.colFree = make([]open.Column, colChunk)
	}
	b.Cols = b.colFree[:0]
	b.Vals, b.Text, b.Bin = b.Vals[:0], b.Text[:0], b.Bin[:0]
	if cap(b.Vals)*int(reflect.TypeFor[Value]().Size()) > keepBytes {
		b.Vals = nil
	}
	if cap(b.Text) > keepBytes {
		b.Text = nil
	}
	if cap(b.Bin) > keepBytes {
		b.Bin = nil
	}
	b.box.Reset()
}

// FinishEvents returns the record's columns with their values (Cols[i] is element i)
// and n zero events for the caller to fill. It hands out Cols themselves, built in the
// column chunk since Reset, and cuts the events from an event chunk, so that a record of one row, the common case of canal-json and
// simple, allocates neither and copies no column; b forgets what it handed out.
func (b *Builder) FinishEvents(n int) ([]open.Event, []open.Column) {
	evs := b.carveEvents(n)
	k := len(b.Cols)
	if k == 0 {
		return evs, nil
	}
	cols := b.Cols[:k:k]
	if b.inChunk() {
		b.colFree = b.colFree[k:]
	} else {
		clear(b.colFree) // Add outgrew the chunk after writing all of it
	}
	b.Cols = nil
	b.box.Box(b.Vals, b.Text, b.Bin, values.SlotsOf(cols, columnValue))
	return evs, cols
}

// The chunks records' events and columns are cut from. Each piece is handed out once,
// capped at its length (appending to it copies), so records never share an element; a
// chunk lives while any piece of it does, which for a stream of records applied in
// order is about as long as the pieces themselves. A record that outgrows what is left
// of the column chunk gets the array Add grew for it.
const (
	eventChunk = 32  // events (about 6 KiB)
	colChunk   = 512 // columns (24 KiB)
)

// inChunk reports whether Cols are still at the start of the column chunk (Add did not
// outgrow it).
func (b *Builder) inChunk() bool {
	return cap(b.Cols) > 0 && len(b.colFree) > 0 && &b.Cols[:1][0] == &b.colFree[:1][0]
}

// carveEvents returns n zero events.
func (b *Builder) carveEvents(n int) []open.Event {
	if n == 0 {
		return []open.Event{}
	}
	if n > eventChunk/4 {
		return make([]open.Event, n)
	}
	if len(b.evFree) < n {
		b.evFree = make([]open.Event, eventChunk)
	}
	evs := b.evFree[:n:n]
	b.evFree = b.evFree[n:]
	return evs
}

// columnValue is where values.Box puts a column's value.
func columnValue(c *open.Column) *any { return &c.Value }
