package slots

import (
	"sync"
	"testing"
)

func TestSlots(t *testing.T) {
	k := New[int](2)
	if p := k.Get(); p != nil {
		t.Fatalf("empty Slots gave %v", *p)
	}
	a, b, c := new(int), new(int), new(int)
	k.Put(a)
	k.Put(b)
	k.Put(c) // beyond n: dropped
	got := map[*int]bool{}
	for p := k.Get(); p != nil; p = k.Get() {
		if got[p] {
			t.Fatal("a value came back twice")
		}
		got[p] = true
	}
	if len(got) != 2 || !got[a] || !got[b] {
		t.Fatalf("got %d values back (a %v, b %v), want a and b", len(got), got[a], got[b])
	}
	if n := New[int](100).n; n != Max {
		t.Fatalf("New(100) keeps %d, want %d", n, Max)
	}
}

// TestSlotsConcurrent: a value is never handed to two goroutines at once.
func TestSlotsConcurrent(t *testing.T) {
	k := New[int](4)
	for range 4 {
		k.Put(new(int))
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 2000 {
				p := k.Get()
				if p == nil {
					p = new(int)
				}
				*p++
				if *p%2 != 1 {
					t.Error("a value was used by two goroutines at once")
					return
				}
				*p++
				k.Put(p)
			}
		}()
	}
	wg.Wait()
}
