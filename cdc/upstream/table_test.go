package upstream

import (
	"reflect"
	"testing"

	"github.com/tidb-parity/parity/cdc/open"
)

func TestBuildTableFlags(t *testing.T) {
	const (
		bin  = open.FlagBinary
		hk   = open.FlagHandleKey
		pk   = open.FlagPrimaryKey
		uk   = open.FlagUniqueKey
		mul  = open.FlagMultipleKey
		null = open.FlagNullable
		uns  = open.FlagUnsigned
	)
	for _, tc := range []struct {
		name      string
		defs      []columnDef
		idxs      []*index
		want      []open.Flag
		types     []byte
		handle    []int
		intHandle bool
	}{
		{
			name: "sysbench",
			defs: []columnDef{
				{name: "id", dataType: "int", columnType: "int(11)"},
				{name: "k", dataType: "int", columnType: "int(11)"},
				{name: "c", dataType: "char", columnType: "char(120)"},
				{name: "pad", dataType: "char", columnType: "char(60)"},
			},
			idxs: []*index{{name: "k_1", cols: []int{1}}, {name: "PRIMARY", unique: true, primary: true, cols: []int{0}}},
			// ticdc.md §1.1: an INT primary key is "f":11 = Binary|HandleKey|PrimaryKey.
			want:      []open.Flag{bin | hk | pk, bin | mul, 0, 0},
			types:     []byte{open.TypeLong, open.TypeLong, open.TypeString, open.TypeString},
			handle:    []int{0},
			intHandle: true,
		},
		{
			name: "keyless",
			defs: []columnDef{
				{name: "a", dataType: "int", columnType: "int(11)", nullable: true},
				{name: "b", dataType: "varchar", columnType: "varchar(32)", nullable: true},
			},
			want:  []open.Flag{bin | null, null},
			types: []byte{open.TypeLong, open.TypeVarchar},
		},
		{
			name: "composite pk, unique key, nullable unique key",
			defs: []columnDef{
				{name: "a", dataType: "varchar", columnType: "varchar(10)"},
				{name: "b", dataType: "bigint", columnType: "bigint(20) unsigned"},
				{name: "u", dataType: "int", columnType: "int(11)"},
				{name: "n", dataType: "blob", columnType: "blob", nullable: true},
			},
			idxs: []*index{
				{name: "PRIMARY", unique: true, primary: true, cols: []int{0, 1}},
				{name: "u1", unique: true, cols: []int{2}},
				{name: "n1", unique: true, cols: []int{3}},
			},
			want:   []open.Flag{hk | pk | mul, bin | hk | pk | mul | uns, bin | uk, bin | uk | null},
			types:  []byte{open.TypeVarchar, open.TypeLonglong, open.TypeLong, open.TypeBlob},
			handle: []int{0, 1},
		},
		{
			name: "no pk: the not-null unique key is the handle",
			defs: []columnDef{
				{name: "x", dataType: "int", columnType: "int(11)", nullable: true},
				{name: "y", dataType: "int", columnType: "int(11)"},
				{name: "z", dataType: "int", columnType: "int(11)"},
			},
			idxs: []*index{
				{name: "ux", unique: true, cols: []int{0}},
				{name: "uyz", unique: true, cols: []int{1, 2}},
			},
			want:   []open.Flag{bin | uk | null, bin | uk | mul | hk, bin | uk | mul | hk},
			types:  []byte{open.TypeLong, open.TypeLong, open.TypeLong},
			handle: []int{1, 2},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb, err := buildTable("s", "t", tc.defs, tc.idxs)
			if err != nil {
				t.Fatal(err)
			}
			for i, c := range tb.Columns {
				if c.Flags != tc.want[i] {
					t.Errorf("column %s: flags %#x, want %#x", c.Name, c.Flags, tc.want[i])
				}
				if c.Type != tc.types[i] {
					t.Errorf("column %s: type %d, want %d", c.Name, c.Type, tc.types[i])
				}
			}
			if !reflect.DeepEqual(tb.Handle, tc.handle) || tb.IntHandle != tc.intHandle {
				t.Errorf("handle %v int=%v, want %v int=%v", tb.Handle, tb.IntHandle, tc.handle, tc.intHandle)
			}
		})
	}
}

func TestBuildTableRejectsUnknownType(t *testing.T) {
	_, err := buildTable("s", "t", []columnDef{{name: "g", dataType: "geometry"}}, nil)
	if err == nil {
		t.Fatal("want an error naming the unsupported column")
	}
}

func TestColumnConvert(t *testing.T) {
	for _, tc := range []struct {
		col  Column
		raw  []byte
		want any
	}{
		{Column{Name: "i", DataType: "int"}, []byte("-3"), int64(-3)},
		{Column{Name: "u", DataType: "bigint", Flags: open.FlagUnsigned}, []byte("18446744073709551615"), uint64(18446744073709551615)},
		{Column{Name: "f", DataType: "float"}, []byte("0.1"), float64(float32(0.1))},
		{Column{Name: "d", DataType: "double"}, []byte("0.1"), 0.1},
		{Column{Name: "e", DataType: "enum"}, []byte("2"), uint64(2)},
		{Column{Name: "bit", DataType: "bit"}, []byte("682"), uint64(682)},
		{Column{Name: "dec", DataType: "decimal"}, []byte("1.500000"), "1.500000"},
		{Column{Name: "b", DataType: "varbinary"}, []byte{0, 1}, []byte{0, 1}},
		{Column{Name: "n", DataType: "varchar"}, nil, nil},
		{Column{Name: "y", DataType: "year"}, []byte("2020"), int64(2020)},
	} {
		got, err := tc.col.Convert(tc.raw)
		if err != nil {
			t.Fatalf("%s: %v", tc.col.Name, err)
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: %#v, want %#v", tc.col.Name, got, tc.want)
		}
	}
	if _, err := (Column{Name: "i", DataType: "int"}).Convert([]byte("x")); err == nil {
		t.Error("want an error for a non-numeric INT value")
	}
}
