// Package slots keeps a few values (a decoder's scratch states) for reuse between
// calls without a lock: a fixed array of atomic pointers. Unlike a sync.Pool, what it
// keeps survives garbage collections (the states hold caches worth keeping); unlike a
// buffered channel, taking and returning a value is one atomic operation when
// uncontended instead of a lock and an unlock.
package slots

import "sync/atomic"

// Max is the most values a Slots keeps.
const Max = 8

// Slots keeps up to n values (n from New). The zero Slots keeps none.
type Slots[T any] struct {
	n int
	s [Max]atomic.Pointer[T]
}

// New returns Slots that keep up to n values (at least 1, at most Max).
func New[T any](n int) *Slots[T] {
	return &Slots[T]{n: min(max(n, 1), Max)}
}

// Get takes a kept value, or returns nil when none is kept.
func (k *Slots[T]) Get() *T {
	for i := range k.n {
		if k.s[i].Load() != nil {
			if p := k.s[i].Swap(nil); p != nil {
				return p
			}
		}
	}
	return nil
}

// Put keeps p unless n values are kept already (then p is dropped).
func (k *Slots[T]) Put(p *T) {
	for i := range k.n {
		if k.s[i].CompareAndSwap(nil, p) {
			return
		}
	}
}
