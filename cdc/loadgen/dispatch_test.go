package loadgen

import (
	"testing"

	"github.com/tidb-parity/parity/cdc/open"
)

// The expected partitions are TiCDC's own test vectors (tiflow
// cdc/sink/dmlsink/mq/dispatcher/partition/{table,index_value}_test.go, 16 partitions).
func TestTableDispatcherMatchesTiCDC(t *testing.T) {
	d, err := NewDispatcher(DispatchTable)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		schema, table string
		want          int
	}{
		{"test", "t1", 15},
		{"test", "t2", 5},
		{"test", "t3", 3},
	} {
		ev := &open.Event{Kind: open.KindRow, Schema: tc.schema, Table: tc.table, Op: open.OpInsert}
		got, key := d.Dispatch(ev, 16)
		if got != tc.want {
			t.Errorf("%s.%s: partition %d, want %d", tc.schema, tc.table, got, tc.want)
		}
		if key != tc.schema+"."+tc.table {
			t.Errorf("%s.%s: key %q", tc.schema, tc.table, key)
		}
	}
}

func TestIndexValueDispatcherMatchesTiCDC(t *testing.T) {
	d, err := NewDispatcher(DispatchIndexValue)
	if err != nil {
		t.Fatal(err)
	}
	handle := open.FlagHandleKey | open.FlagPrimaryKey
	col := func(name string, v int64, f open.Flag) open.Column {
		return open.Column{Name: name, Type: open.TypeLong, Flags: f, Value: v}
	}
	for _, tc := range []struct {
		name string
		ev   open.Event
		want int
	}{
		{"single pk 11", open.Event{Table: "t1", Columns: []open.Column{col("a", 11, handle), col("b", 22, 0)}}, 2},
		{"single pk 22", open.Event{Table: "t1", Columns: []open.Column{col("a", 22, handle), col("b", 22, 0)}}, 11},
		{"single pk 11 other value", open.Event{Table: "t1", Columns: []open.Column{col("a", 11, handle), col("b", 33, 0)}}, 2},
		{"composite 11,22", open.Event{Table: "t2", Columns: []open.Column{col("a", 11, handle), col("b", 22, handle)}}, 5},
		{"composite reordered", open.Event{Table: "t2", Columns: []open.Column{col("b", 22, handle), col("a", 11, handle)}}, 5},
		{"composite 11,0", open.Event{Table: "t2", Columns: []open.Column{col("a", 11, handle), col("b", 0, handle)}}, 14},
		{"composite 11,33", open.Event{Table: "t2", Columns: []open.Column{col("a", 11, handle), col("b", 33, handle)}}, 2},
	} {
		ev := tc.ev
		ev.Kind, ev.Schema, ev.Op = open.KindRow, "test", open.OpInsert
		if got, _ := d.Dispatch(&ev, 16); got != tc.want {
			t.Errorf("%s: partition %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestIndexValueDispatcherKeylessUsesTable(t *testing.T) {
	iv, _ := NewDispatcher(DispatchIndexValue)
	tb, _ := NewDispatcher(DispatchTable)
	ev := &open.Event{Kind: open.KindRow, Schema: "test", Table: "t1", Op: open.OpInsert,
		Columns: []open.Column{{Name: "a", Type: open.TypeLong, Value: int64(7)}}}
	p1, _ := iv.Dispatch(ev, 16)
	p2, _ := tb.Dispatch(ev, 16)
	if p1 != p2 {
		t.Fatalf("keyless row: index-value partition %d, table partition %d; want equal", p1, p2)
	}
}

func TestColumnValueString(t *testing.T) {
	for _, tc := range []struct {
		c    open.Column
		want string
	}{
		{open.Column{Type: open.TypeLong, Value: nil}, "null"},
		{open.Column{Type: open.TypeLonglong, Value: int64(-5)}, "-5"},
		{open.Column{Type: open.TypeLonglong, Flags: open.FlagUnsigned, Value: uint64(18446744073709551615)}, "18446744073709551615"},
		{open.Column{Type: open.TypeFloat, Value: float64(float32(0.1))}, "0.1"},
		{open.Column{Type: open.TypeDouble, Value: 0.1}, "0.1"},
		{open.Column{Type: open.TypeDouble, Value: 1e21}, "1000000000000000000000"},
		{open.Column{Type: open.TypeVarchar, Value: "abc"}, "abc"},
		{open.Column{Type: open.TypeVarchar, Flags: open.FlagBinary, Value: []byte{0, 'x'}}, "\x00x"},
	} {
		if got := ColumnValueString(tc.c); got != tc.want {
			t.Errorf("%#v: %q, want %q", tc.c.Value, got, tc.want)
		}
	}
}

func TestNewDispatcherRejectsUnknown(t *testing.T) {
	if _, err := NewDispatcher("columns"); err == nil {
		t.Fatal("want an error for an unsupported dispatcher")
	}
}
