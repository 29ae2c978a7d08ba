package values

import (
	"math/bits"
	"reflect"
)

// slab collects the values of one Go type of a record and boxes them with one
// allocation.
//
// Storing an int64 (string, []byte, …) in an interface allocates a copy of it, one per
// value. Instead, box copies all the record's values of type T into one array (reflect's
// slice-to-array conversion, one allocation) and takes each element's interface from
// the array: reflect points an interface made from an element of an unaddressable array
// at the element itself, as nothing can change it. If a Go release copied the elements
// instead, the values would be the same and only the allocations back to one per value
// (cdc/open's BenchmarkDecode and TestDecodeAllocations would show it). box.go puts the
// slabs of several types into one struct the same way.
type slab[T any] struct {
	vals  []T
	at    []int            // the slot of each value
	types [64]reflect.Type // [1<<k]T, made once per size
}

func (s *slab[T]) trim() {
	if cap(s.vals) > keepBytes/32 {
		s.vals, s.at = nil, nil
	}
}

func (s *slab[T]) add(v T, at int) {
	s.vals = append(s.vals, v)
	s.at = append(s.at, at)
}

// box boxes the slab's values alone (one allocation) into their slots of dst.
func (s *slab[T]) box(dst Slots) {
	n := len(s.vals)
	if n == 0 {
		return
	}
	if n == 1 { // one value: boxing it directly is one allocation too, without reflect
		*dst.at(s.at[0]) = s.vals[0]
		clear(s.vals)
		s.vals, s.at = s.vals[:0], s.at[:0]
		return
	}
	// Array sizes are powers of two: a bounded number of array types, at most twice
	// the space of the values.
	k := bits.Len(uint(n - 1))
	size := 1 << k
	var zero T
	for len(s.vals) < size {
		s.vals = append(s.vals, zero)
	}
	t := s.types[k]
	if t == nil {
		t = reflect.ArrayOf(size, reflect.TypeFor[T]())
		s.types[k] = t
	}
	arr := reflect.ValueOf(&s.vals).Elem().Convert(t)
	for i, c := range s.at {
		*dst.at(c) = arr.Index(i).Interface()
	}
	clear(s.vals) // no references into the record's arenas from the scratch
	s.vals, s.at = s.vals[:0], s.at[:0]
}
