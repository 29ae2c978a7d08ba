package rowbuf

import (
	"fmt"
	"math"
	"reflect"
	"testing"

	"github.com/tidb-parity/parity/cdc/open"
)

// fillRecord adds n values of each kind in kinds (cycling) to b and returns the values
// the columns must end up with.
func fillRecord(b *Builder, counts [6]int) []any {
	var want []any
	add := func(v Value, w any) {
		c := b.Add(fmt.Sprintf("c%d", len(want)), open.TypeLonglong, 0)
		b.Vals[c] = v
		want = append(want, w)
	}
	for i := range counts[0] {
		x := int64(-1000 * (i + 1))
		add(Value{Kind: Int, Num: uint64(x)}, x)
	}
	for i := range counts[1] {
		x := uint64(1000 + i)
		add(Value{Kind: Uint, Num: x}, x)
	}
	for i := range counts[2] {
		x := 0.5 + float64(i)
		add(Value{Kind: Float, Num: math.Float64bits(x)}, x)
	}
	for i := range counts[3] {
		s := fmt.Sprintf("text %d", i)
		off := len(b.Text)
		b.Text = append(b.Text, s...)
		add(Value{Kind: Text, Off: off, End: len(b.Text)}, s)
	}
	for i := range counts[4] {
		p := []byte{byte(i), 0xff}
		off := len(b.Bin)
		b.Bin = append(b.Bin, p...)
		add(Value{Kind: Bytes, Off: off, End: len(b.Bin)}, p)
	}
	for range counts[5] {
		add(Value{}, nil)
	}
	return want
}

// TestFinishValues: every value comes out with its Go type and value, whatever mix of
// types a record has, a Boxed value keeps the Value set before FinishEvents, and the
// events and columns of FinishEvents are separate, capacity-limited slices.
func TestFinishValues(t *testing.T) {
	var b Builder
	n := 0
	for ints := range 4 {
		for uints := range 3 {
			for floats := range 3 {
				for strs := range 4 {
					for bins := range 3 {
						for _, events := range []int{1, 2} {
							counts := [6]int{ints * 3, uints, floats * 2, strs * 5, bins, 1}
							want := fillRecord(&b, counts)
							// A value made elsewhere (Boxed) keeps its Column.Value.
							c := b.Add(fmt.Sprintf("c%d", len(want)), open.TypeTimestamp, 0)
							b.Cols[c].Value, b.Vals[c] = "2026-11-29 02:09:36", Value{Kind: Boxed}
							want = append(want, "2026-11-29 02:09:36")
							evs, cols := b.FinishEvents(events)
							b.Reset()
							n++
							if len(evs) != events || cap(evs) != events || len(cols) != len(want) || cap(cols) != len(want) {
								t.Fatalf("%v: %d events (cap %d), %d columns (cap %d); want %d, %d", counts, len(evs), cap(evs), len(cols), cap(cols), events, len(want))
							}
							for i, c := range cols {
								if !reflect.DeepEqual(c.Value, want[i]) || c.Name != fmt.Sprintf("c%d", i) {
									t.Fatalf("%v: column %d is %s = %#v, want %#v", counts, i, c.Name, c.Value, want[i])
								}
							}
						}
					}
				}
			}
		}
	}
	t.Logf("%d records", n)
}

// TestFinishEventsChunks: the events and columns FinishEvents hands out from its chunks
// are never given to another record: over many records (several chunks, records that
// outgrow a chunk among them, every other one started without FinishEvents) each keeps
// its own values after the records after it, and appending to one record's events or
// columns leaves the next record's alone.
func TestFinishEventsChunks(t *testing.T) {
	var b Builder
	type kept struct {
		evs  []open.Event
		cols []open.Column
		want []any
	}
	var all []kept
	for r := range 400 {
		counts := [6]int{r%5 + 1, 0, 0, r % 3, 0, 0}
		switch {
		case r%97 == 0:
			counts[0] = colChunk/8 + 1 // as large as the chunk keeps room for
		case r%101 == 0:
			counts[0] = colChunk + 10 // outgrows the chunk
		}
		events := 1
		if r%89 == 0 {
			events = eventChunk/4 + 1 // too many for the event chunk
		}
		if r%2 == 1 {
			fillRecord(&b, [6]int{3, 1, 0, 2, 1, 0}) // a record given up (the fast path's)
			b.Reset()
		}
		want := fillRecord(&b, counts)
		evs, cols := b.FinishEvents(events)
		b.Reset()
		for i := range evs {
			evs[i].CommitTs = uint64(r) // the caller fills its events
			evs[i].Columns = cols
		}
		all = append(all, kept{evs, cols, want})
	}
	for r, k := range all {
		if len(k.cols) != len(k.want) || cap(k.cols) != len(k.want) || cap(k.evs) != len(k.evs) {
			t.Fatalf("record %d: %d columns (cap %d, want %d), %d events (cap %d)", r, len(k.cols), cap(k.cols), len(k.want), len(k.evs), cap(k.evs))
		}
		for i, c := range k.cols {
			if !reflect.DeepEqual(c.Value, k.want[i]) {
				t.Fatalf("record %d column %d is %#v, want %#v: a later record wrote over it", r, i, c.Value, k.want[i])
			}
		}
		for _, ev := range k.evs {
			if ev.CommitTs != uint64(r) {
				t.Fatalf("record %d has an event of record %d", r, ev.CommitTs)
			}
		}
	}
	// Appending copies: the next record's first column and event are untouched.
	next0, nextEv := all[2].cols[0].Value, all[2].evs[0].CommitTs
	_ = append(all[1].cols, open.Column{Name: "x", Value: "appended"})
	_ = append(all[1].evs, open.Event{CommitTs: 999})
	if !reflect.DeepEqual(all[2].cols[0].Value, next0) || all[2].evs[0].CommitTs != nextEv {
		t.Fatal("appending to a record's columns or events changed the next record's")
	}
}
