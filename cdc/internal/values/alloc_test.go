//go:build !race

// The race detector changes what allocates: counts are pinned without it.

package values

import "testing"

// TestBoxAllocations: a record with values of every type takes three allocations — the
// text, the bytes and one struct of all the boxed values.
func TestBoxAllocations(t *testing.T) {
	var b Boxer
	vals, text, bin, _ := record([7]int{3, 2, 2, 5, 2, 1, 1})
	dst := make([]slot, len(vals))
	slots := SlotsOf(dst, slotValue)
	b.Box(vals, text, bin, slots)
	b.Reset()
	allocs := testing.AllocsPerRun(100, func() {
		b.Box(vals, text, bin, slots)
		b.Reset()
	})
	if allocs != 3 {
		t.Errorf("Box took %v allocations, want 3", allocs)
	}
}
