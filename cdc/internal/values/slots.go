package values

import (
	"fmt"
	"unsafe"
)

// Slots is where Box puts its values: an `any` field of each element of a slice (the
// Value of each column), so that every value is written once, straight into the
// column, with no slice of values between (such a slice, copied and cleared, cost the
// canal-json and simple decoders 3–5 %). Make it with SlotsOf.
type Slots struct {
	base   unsafe.Pointer // the field of element 0
	stride uintptr        // the size of an element
	n      int
}

// SlotsOf returns the slots of field (which returns a pointer to an `any` field of the
// element it is given) in each element of elems. The slots are valid while elems is.
func SlotsOf[E any](elems []E, field func(*E) *any) Slots {
	if len(elems) == 0 {
		return Slots{}
	}
	e := unsafe.Pointer(&elems[0])
	f := unsafe.Pointer(field(&elems[0]))
	size := unsafe.Sizeof(elems[0])
	if uintptr(f) < uintptr(e) || uintptr(f)-uintptr(e)+unsafe.Sizeof(any(nil)) > size {
		panic(fmt.Sprintf("values: SlotsOf: the field is not inside its element of %T", elems[0]))
	}
	return Slots{base: f, stride: size, n: len(elems)}
}

// Len returns the number of slots.
func (s Slots) Len() int { return s.n }

// at returns slot i; i out of range panics, as indexing a slice does.
func (s Slots) at(i int) *any {
	if uint(i) >= uint(s.n) {
		outOfRange(i, s.n)
	}
	return (*any)(unsafe.Add(s.base, uintptr(i)*s.stride))
}

// outOfRange panics; apart from at, so that at is inlined.
//
//go:noinline
func outOfRange(i, n int) {
	panic(fmt.Sprintf("values: slot %d of %d", i, n))
}
