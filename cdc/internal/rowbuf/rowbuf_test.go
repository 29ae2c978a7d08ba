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
// types a record has, a Boxed value keeps the Value set before Finish, and the events and columns of FinishEvents are separate, capacity-limited slices.
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
