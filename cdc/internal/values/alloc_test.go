//go:build !race

// The race detector changes what allocates: counts are pinned without it.

package values

import "testing"

// TestBoxAllocations: a record with values of every type takes two allocations — the
// bytes and one struct of all the boxed values; its text is cut from the Boxer's text
// chunk (one allocation per many records).
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
	if allocs != 2 {
		t.Errorf("Box took %v allocations, want 2", allocs)
	}
}
