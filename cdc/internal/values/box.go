package values

import (
	"math/bits"
	"reflect"
)

// Boxing all of a record's values with one allocation. Each slab alone boxes its
// values with one allocation (an array of its type); a record with values of several
// Go types would make one per type. box instead copies every slab into one struct, of a
// type made once per shape (the power-of-two array length of each slab's values), held
// in a scratch slice of length one; converting that slice to a one-element array copies
// it into one new, unaddressable value, and reflect takes each value's interface from
// its element of that copy without copying it again (see slab).

// slabs is the number of slabs of a Boxer, in the order of (*Boxer).slabList.
const slabs = 5

// shape says how long each slab's array in the struct is: 0 for no field, else
// 1 + log2 of the length.
type shape [slabs]uint8

// shaped is the struct type of a shape and its scratch.
type shaped struct {
	scratch reflect.Value // []S of length 1
	arr     reflect.Type  // [1]S
	field   [slabs]int    // the field of each slab, -1 if none
	view    [slabs]any    // each field's array of the scratch as a []T, nil if none
}

// maxShapes bounds the struct types a Boxer makes; records of further shapes box
// their values one allocation per Go type.
const maxShapes = 64

// boxer is what box needs of a slab, whatever its type.
type boxer interface {
	count() int
	elem() reflect.Type
	box(dst Slots)
	copyTo(view any)
	boxFrom(arr reflect.Value, view any, dst Slots)
}

func (s *slab[T]) count() int         { return len(s.vals) }
func (s *slab[T]) elem() reflect.Type { return reflect.TypeFor[T]() }
func (s *slab[T]) copyTo(view any)    { copy(view.([]T), s.vals) }

// boxFrom sets the values' slots of dst from arr, the slab's field of the record's copy of
// the scratch, and clears the slab and the scratch's field (view).
func (s *slab[T]) boxFrom(arr reflect.Value, view any, dst Slots) {
	for i, c := range s.at {
		*dst.at(c) = arr.Index(i).Interface()
	}
	clear(view.([]T)[:len(s.vals)]) // no references into the record from the scratch
	clear(s.vals)
	s.vals, s.at = s.vals[:0], s.at[:0]
}

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
	for i, s := range list {
		if sh[i] != 0 {
			s.copyTo(st.view[i])
		}
	}
	one := st.scratch.Convert(st.arr).Index(0) // the one allocation
	for i, s := range list {
		if sh[i] != 0 {
			s.boxFrom(one.Field(st.field[i]), st.view[i], dst)
		}
	}
}

// shape returns the struct type and scratch of a shape, made on first use; nil once
// maxShapes are made.
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
	st := &shaped{field: [slabs]int{-1, -1, -1, -1, -1}}
	var fields []reflect.StructField
	for i, s := range list {
		if sh[i] == 0 {
			continue
		}
		st.field[i] = len(fields)
		fields = append(fields, reflect.StructField{
			Name: "F" + string(rune('0'+i)),
			Type: reflect.ArrayOf(1<<(sh[i]-1), s.elem()),
		})
	}
	t := reflect.StructOf(fields)
	st.arr = reflect.ArrayOf(1, t)
	st.scratch = reflect.MakeSlice(reflect.SliceOf(t), 1, 1)
	v := st.scratch.Index(0)
	for i, f := range st.field {
		if f >= 0 {
			a := v.Field(f)
			st.view[i] = a.Slice(0, a.Len()).Interface()
		}
	}
	return st
}
