package open

import (
	"bytes"
	"io"
	"reflect"

	"github.com/pierrec/lz4/v4"

	"github.com/tidb-parity/parity/cdc/internal/jsonscan"
	"github.com/tidb-parity/parity/cdc/internal/values"
)

// decodeState is the scratch of one Decode call. The columns of every event of the
// record are read into one slice in message order, their values into pending (numbers
// in place, text and bytes appended to two arenas), and finish turns all of it into the
// record's events with a handful of allocations: one slice of columns, one string of
// text, one slice of bytes and one struct of all the boxed values (package values),
// instead of a slice per event and one or two allocations per value.
//
// A Decoder keeps a few states between calls (Decoder.states), so the scratch and the
// interned names are reused; nothing returned to the caller aliases a state.
type decodeState struct {
	d     *Decoder
	sc    jsonscan.Scanner
	names jsonscan.Names // interned schema, table and column names

	cols     []Column  // the record's columns in message order, Value not yet set; nil after finish hands them out
	colsHint int       // the columns of the last record: the capacity cols starts with
	vals     []pending // their values, parallel to cols
	text     []byte    // string values, one after another: in textBuf, or in place in box's text chunk (begin)
	textBuf  []byte    // the scratch text is written to when it is not in place
	inPlace  bool      // text started in the text chunk
	bin      []byte    // []byte values, one after another
	rows     []rowSpan // per event: where its columns are in cols
	last     span      // the columns section read last
	// lastKey is a key JSON of this record (the caller's bytes, dropped at the end of
	// the call) whose first keyPrefix bytes are its "ts", "scm" and "tbl" members, and
	// keyTs, keySchema and keyTable are their values (see keyOf).
	heads               colHeads // the columns' leading members (see column)
	lastKey             []byte
	keyPrefix           int
	keyTs               uint64
	keySchema, keyTable string

	dbuf  bytes.Buffer     // a decompressed payload
	lz4   *lz4.Reader      // LZ4 frame reader (and its block buffers)
	lzsrc bytes.Reader     // its input
	lzlim io.LimitedReader // its output, bounded

	box values.Boxer // boxes the values of vals
}

// keepScratchBytes bounds each scratch buffer a state keeps for the next call (a record
// of 16 events is typically well under 1 MiB): after a huge record it is dropped rather
// than held.
const keepScratchBytes = 1 << 20

// pending is a decoded column value before finish boxes it into Column.Value.
type pending = values.Value

// span is a range of decodeState.cols.
type span struct{ start, end int }

func (s span) len() int { return s.end - s.start }

// rowSpan says where a row event's columns are.
type rowSpan struct {
	cols, old span
	claimed   bool // the event was replaced by its claim-check object's event
}

// begin readies st for a record of events events and size bytes of value: its text is
// written straight into the Boxer's text chunk when it fits (text is never longer than
// the value it is read from, unless the value is compressed; text that does not fit is
// copied by Box), else into textBuf.
func (st *decodeState) begin(events, size int) {
	st.lastKey, st.keyPrefix = nil, 0
	st.text, st.inPlace = st.textBuf[:0], false
	if a := st.box.TextArena(size); a != nil {
		st.text, st.inPlace = a, true
	}
	st.rows = st.rows[:0]
	for range events {
		st.rows = append(st.rows, rowSpan{})
	}
}

// reset empties st after a call; scratch grown beyond keepScratchBytes is dropped.
func (st *decodeState) reset() {
	if !st.inPlace && cap(st.text) > cap(st.textBuf) {
		st.textBuf = st.text // grown for this record
	}
	clear(st.cols) // the names
	st.cols, st.vals, st.text, st.bin, st.rows = st.cols[:0], st.vals[:0], nil, st.bin[:0], st.rows[:0]
	st.last = span{}
	st.lastKey, st.keyPrefix, st.keySchema, st.keyTable = nil, 0, "", ""
	st.sc.Reset(nil, keepScratchBytes)
	if cap(st.cols)*int(reflect.TypeFor[Column]().Size()) > keepScratchBytes {
		st.cols, st.vals = nil, nil
	}
	st.colsHint = min(st.colsHint, keepScratchBytes/int(reflect.TypeFor[Column]().Size()))
	if cap(st.textBuf) > keepScratchBytes {
		st.textBuf = nil
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
	st.box.Reset()
	st.names.Trim()
}

// columnValue is where values.Box puts a column's value.
func columnValue(c *Column) *any { return &c.Value }

// finish sets the columns and values of the record's row events.
func (st *decodeState) finish(events []Event) {
	if len(st.cols) == 0 {
		return
	}
	// The columns were read into a slice of this record's own (sized as the last
	// record's): it is handed out as it is, where copying it out of a reused scratch
	// slice was 3.5 % of serve's CPU under the insert bench.
	cols := st.cols[:len(st.cols):len(st.cols)]
	st.cols, st.colsHint = nil, len(cols)
	st.box.Box(st.vals, st.text, st.bin, values.SlotsOf(cols, columnValue))
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
