//go:build !race

// The race detector changes what allocates: counts are pinned without it (go test -race
// in make test skips this file; go test without -race runs it).

package rowbuf

import "testing"

// TestFinishAllocations: a one-event record with values of every type takes two
// allocations — the bytes and the boxed values; its event, its columns and its text are
// cut from chunks (one allocation each per many records).
func TestFinishAllocations(t *testing.T) {
	var b Builder
	counts := [6]int{3, 2, 2, 5, 2, 1}
	fillRecord(&b, counts)
	b.FinishEvents(1)
	b.Reset()
	allocs := testing.AllocsPerRun(100, func() {
		fillRecord(&b, counts)
		b.FinishEvents(1)
		b.Reset()
	})
	// fillRecord's own: the names and the strings it formats.
	var names int
	for _, n := range counts {
		names += n
	}
	own := testing.AllocsPerRun(100, func() {
		fillRecord(&b, counts)
		b.Reset()
	})
	if got := allocs - own; got != 2 {
		t.Fatalf("FinishEvents made %v allocations (%v in all, %v filling %d columns), want 2", got, allocs, own, names)
	}
}
