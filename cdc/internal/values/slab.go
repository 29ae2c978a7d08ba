package values

import "unsafe"

// slab collects the values of one Go type of a record and boxes them with one
// allocation.
//
// Storing an int64 (string, []byte, …) in an interface allocates a copy of it, one per
// value. Instead, the slab's values are copied into one array (one allocation: box, or
// the record's struct in box.go) and each slot's interface is pointed at its element
// there: an interface holding a value of a non-pointer type is two words, the type and
// a pointer to the value, which is exactly what boxing makes (eface). Nothing writes
// the array after, as the runtime requires of a boxed value, and the interior pointers
// keep it alive. cdc/open's TestDecodeAllocations and this package's TestBox and
// TestBoxAllocations would show a layout that changed.
type slab[T any] struct {
	vals []T
	at   []int          // the slot of each value
	typ  unsafe.Pointer // the type word of an interface holding a T, set on first use
}

// eface is the layout of an `any`: its type word and a pointer to its value (for the
// types here, none of which is pointer-shaped).
type eface struct {
	typ, data unsafe.Pointer
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
	switch len(s.vals) {
	case 0:
		return
	case 1: // one value: boxing it directly is one allocation too
		*dst.at(s.at[0]) = s.vals[0]
		clear(s.vals)
		s.vals, s.at = s.vals[:0], s.at[:0]
	default:
		arr := make([]T, len(s.vals))
		s.boxInto(unsafe.Pointer(unsafe.SliceData(arr)), dst)
	}
}

// boxInto copies the slab's values into the array at base (of at least len(vals)
// elements of T, zero, never written after) and points their slots of dst at them; the
// slab is left empty.
func (s *slab[T]) boxInto(base unsafe.Pointer, dst Slots) {
	arr := unsafe.Slice((*T)(base), len(s.vals))
	copy(arr, s.vals)
	typ := s.typeWord()
	for i, c := range s.at {
		*(*eface)(unsafe.Pointer(dst.at(c))) = eface{typ: typ, data: unsafe.Pointer(&arr[i])}
	}
	clear(s.vals) // no references into the record's arenas from the scratch
	s.vals, s.at = s.vals[:0], s.at[:0]
}

// typeWord returns the type word of an interface holding a T.
func (s *slab[T]) typeWord() unsafe.Pointer {
	if s.typ == nil {
		var zero T
		x := any(zero) // a zero value of these types boxes without allocating
		s.typ = (*eface)(unsafe.Pointer(&x)).typ
	}
	return s.typ
}
