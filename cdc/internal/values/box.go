package values

import (
	"math/bits"
	"reflect"
	"unsafe"
)

// Boxing all of a record's values with one allocation. Each slab alone boxes its
// values with one allocation (an array of its type); a record with values of several
// Go types would make one per type. box instead allocates one struct, of a type made
// once per shape (the power-of-two array length of each slab's values), and each slab
// copies its values into its field of it (slab.boxInto).

// slabs is the number of slabs of a Boxer, in the order of (*Boxer).slabList.
const slabs = 5

// shape says how long each slab's array in the struct is: 0 for no field, else
// 1 + log2 of the length.
type shape [slabs]uint8

// shaped is the struct type of a shape.
type shaped struct {
	typ reflect.Type   // struct{F0 [n0]int64; …}
	off [slabs]uintptr // the offset of each slab's field (of the slabs the shape has)
}

// maxShapes bounds the struct types a Boxer makes; records of further shapes box
// their values one allocation per Go type.
const maxShapes = 64

// boxer is what box needs of a slab, whatever its type.
type boxer interface {
	count() int
	elem() reflect.Type
	box(dst Slots)
	boxInto(base unsafe.Pointer, dst Slots)
}

func (s *slab[T]) count() int         { return len(s.vals) }
func (s *slab[T]) elem() reflect.Type { return reflect.TypeFor[T]() }

func (b *Boxer) slabList() [slabs]boxer {
	return [slabs]boxer{&b.ints, &b.uints, &b.floats, &b.strs, &b.bytes}
}

// box sets the slots of dst whose values wait in the slabs.
func (b *Boxer) box(dst Slots) {
	list := b.slabList()
	var sh shape
	used := 0
	for i, s := range list {
		if n := s.count(); n > 0 {
			sh[i] = uint8(bits.Len(uint(n-1))) + 1
			used++
		}
	}
	var st *shaped
	if used > 1 {
		st = b.shape(sh, list)
	}
	if st == nil {
		for _, s := range list {
			s.box(dst)
		}
		return
	}
	obj := reflect.New(st.typ).UnsafePointer() // the one allocation
	for i, s := range list {
		if sh[i] != 0 {
			s.boxInto(unsafe.Add(obj, st.off[i]), dst)
		}
	}
}

// shape returns the struct type of a shape, made on first use; nil once maxShapes are
// made.
func (b *Boxer) shape(sh shape, list [slabs]boxer) *shaped {
	if b.last != nil && b.lastShape == sh {
		return b.last
	}
	st := b.shapes[sh]
	if st == nil {
		if len(b.shapes) >= maxShapes {
			return nil
		}
		st = newShaped(sh, list)
		if b.shapes == nil {
			b.shapes = make(map[shape]*shaped)
		}
		b.shapes[sh] = st
	}
	b.last, b.lastShape = st, sh
	return st
}

func newShaped(sh shape, list [slabs]boxer) *shaped {
	st := &shaped{}
	var fields []reflect.StructField
	var slab []int
	for i, s := range list {
		if sh[i] == 0 {
			continue
		}
		slab = append(slab, i)
		fields = append(fields, reflect.StructField{
			Name: "F" + string(rune('0'+i)),
			Type: reflect.ArrayOf(1<<(sh[i]-1), s.elem()),
		})
	}
	st.typ = reflect.StructOf(fields)
	for f, i := range slab {
		st.off[i] = st.typ.Field(f).Offset
	}
	return st
}
