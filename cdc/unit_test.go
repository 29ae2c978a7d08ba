package cdc

import (
	"bufio"
	"bytes"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/tidb-parity/parity/cdc/open"
)

func TestSpillEncodingRoundTrips(t *testing.T) {
	ev := &open.Event{Kind: open.KindRow, CommitTs: 42, Partition: -3, Op: open.OpUpdate,
		Columns: []open.Column{
			{Name: "i", Type: open.TypeLonglong, Flags: open.FlagHandleKey, Value: int64(math.MinInt64)},
			{Name: "u", Type: open.TypeLonglong, Flags: open.FlagUnsigned, Value: uint64(math.MaxUint64)},
			{Name: "f", Type: open.TypeDouble, Value: -0.125},
			{Name: "s", Type: open.TypeVarchar, Value: "naïve\x00"},
			{Name: "b", Type: open.TypeBlob, Flags: open.FlagBinary, Value: []byte{0, 1, 255}},
			{Name: "e", Type: open.TypeBlob, Flags: open.FlagBinary, Value: []byte{}},
			{Name: "n", Type: open.TypeVarchar, Value: nil},
		},
		OldColumns: []open.Column{},
	}
	var buf []byte
	buf = encodeEvent(buf, &bufEvent{ev: ev, ts: 42, seq: 7})
	ev2 := *ev
	ev2.OldColumns = nil
	buf = encodeEvent(buf, &bufEvent{ev: &ev2, ts: 43, seq: 8})
	// Length prefixes of 1, 2 and 3 bytes (bodies under 128 bytes, under 16 KiB, more).
	big := &open.Event{Kind: open.KindRow, CommitTs: 44, Op: open.OpInsert,
		Columns: []open.Column{{Name: "b", Type: open.TypeBlob, Flags: open.FlagBinary, Value: bytes.Repeat([]byte{7}, 20000)}}}
	small := &open.Event{Kind: open.KindRow, CommitTs: 45, Op: open.OpDelete, Columns: []open.Column{{Name: "i", Value: int64(1)}}}
	buf = encodeEvent(buf, &bufEvent{ev: big, ts: 44, seq: 9})
	buf = encodeEvent(buf, &bufEvent{ev: small, ts: 45, seq: 10})
	r := bufio.NewReader(bytes.NewReader(buf))
	names := map[string]string{}
	got, ts, seq, err := decodeEvent(r, names)
	if err != nil || ts != 42 || seq != 7 {
		t.Fatalf("decode: %v ts %d seq %d", err, ts, seq)
	}
	if !reflect.DeepEqual(got, ev) {
		t.Fatalf("round trip:\n got %#v\nwant %#v", got, ev)
	}
	got, _, _, err = decodeEvent(r, names)
	if err != nil || got.OldColumns != nil {
		t.Fatalf("second event: %v, old columns %#v", err, got.OldColumns)
	}
	for _, want := range []*open.Event{big, small} {
		got, ts, _, err := decodeEvent(r, names)
		if err != nil || ts != want.CommitTs || !reflect.DeepEqual(got.Columns, want.Columns) {
			t.Fatalf("event at ts %d: %v (ts %d)", want.CommitTs, err, ts)
		}
	}
	if _, _, _, err := decodeEvent(r, names); err == nil || !strings.Contains(err.Error(), "EOF") {
		t.Fatalf("end: %v", err)
	}
}

func TestBufferSpillsSortedRunsAndReleasesPrefixes(t *testing.T) {
	b, err := newBuffer(t.TempDir(), 4<<10)
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	add := rowAdder(t, b)
	// Out of ts order across "partitions": 300 rows at ts 1..3 interleaved.
	for i := 0; i < 300; i++ {
		add(uint64(3-i%3), int64(i))
	}
	if b.spilled == 0 || b.memBytes > 4<<10 {
		t.Fatalf("nothing spilled: spilled %d, mem %d", b.spilled, b.memBytes)
	}
	read := func(target uint64) []int64 { return bufferedIDs(t, b, target) }
	first := read(1)
	if len(first) != 100 || !reflect.DeepEqual(first, read(1)) {
		t.Fatalf("ts<=1: %d rows, not repeatable", len(first))
	}
	for i := 1; i < len(first); i++ {
		if first[i] <= first[i-1] {
			t.Fatalf("rows of one ts not in arrival order: %v", first)
		}
	}
	b.release(1)
	if got := read(3); len(got) != 200 {
		t.Fatalf("after release: %d rows, want 200", len(got))
	}
	b.release(3)
	if len(b.tables) != 0 || b.spilled != 0 || b.memCount != 0 || b.memBytes != 0 {
		t.Fatalf("buffer not empty: %+v", b)
	}
}

func TestStatementBuilders(t *testing.T) {
	h := open.FlagHandleKey
	rows := [][]open.Column{
		{{Name: "id", Flags: h, Value: int64(1)}, {Name: "v`x", Value: "it's"}},
		{{Name: "id", Flags: h, Value: int64(2)}, {Name: "v`x", Value: nil}},
	}
	q, args := buildUpsert("s", "t", rows, modeUpsert)
	if q != "INSERT INTO `s`.`t` (`id`,`v``x`) VALUES (1,'it''s'),(2,NULL) ON DUPLICATE KEY UPDATE `v``x`=VALUES(`v``x`)" || args != nil {
		t.Errorf("upsert: %s %v", q, args)
	}
	q, _ = buildUpsert("s", "t", rows, modeReplace)
	if q != "REPLACE INTO `s`.`t` (`id`,`v``x`) VALUES (1,'it''s'),(2,NULL)" {
		t.Errorf("replace: %s", q)
	}
	q, args = buildDeleteByHandle("s", "t", [][]open.Column{{rows[0][0]}, {rows[1][0]}})
	if q != "DELETE FROM `s`.`t` WHERE `id` IN (1,2)" || args != nil {
		t.Errorf("delete: %s", q)
	}
	q, _ = buildDeleteByHandle("s", "t", rows)
	if q != "DELETE FROM `s`.`t` WHERE (`id`=1 AND `v``x`='it''s') OR (`id`=2 AND `v``x`=NULL)" {
		t.Errorf("composite delete: %s", q)
	}
	q, args = buildDeleteOne("s", "t", []open.Column{{Name: "a", Value: int64(1)}, {Name: "f", Type: open.TypeFloat, Value: 1.5}, {Name: "n", Value: nil}})
	if q != "DELETE FROM `s`.`t` WHERE `a`=? AND `f`=CAST(? AS FLOAT) AND `n` IS NULL LIMIT 1" || len(args) != 2 {
		t.Errorf("keyless delete: %s %v", q, args)
	}
	lit := [][]open.Column{{{Name: "u", Value: uint64(math.MaxUint64)}, {Name: "f", Value: 1.5e300}, {Name: "b", Value: []byte{0, '\\', 0xff}},
		{Name: "e", Value: []byte{}}, {Name: "s", Value: "\"q\"\n\x1a ü"}}}
	q, args = buildUpsert("s", "t", lit, modeInsert)
	if q != "INSERT INTO `s`.`t` (`u`,`f`,`b`,`e`,`s`) VALUES (18446744073709551615,1.5e+300,_binary X'005cff',_binary X'','\"q\"\n\x1a ü')" || args != nil {
		t.Errorf("literals: %s %v", q, args)
	}
	// A backslash or NUL in a string: its literal depends on NO_BACKSLASH_ESCAPES, so
	// the driver interpolates the statement's values (it knows the session's mode).
	for _, v := range []string{`a\b`, "a\x00b"} {
		q, args = buildUpsert("s", "t", [][]open.Column{{{Name: "id", Value: int64(1)}, {Name: "s", Value: v}}}, modeInsert)
		if q != "INSERT INTO `s`.`t` (`id`,`s`) VALUES (?,?)" || len(args) != 2 {
			t.Errorf("string %q: %s %v", v, q, args)
		}
	}
}

func TestOldRowCompletesOnlyUpdatedColumns(t *testing.T) {
	ev := &open.Event{Op: open.OpUpdate,
		Columns:    []open.Column{{Name: "a", Value: int64(1)}, {Name: "b", Value: "new"}, {Name: "c", Value: nil}},
		OldColumns: []open.Column{{Name: "b", Value: "old"}},
	}
	want := []open.Column{{Name: "a", Value: int64(1)}, {Name: "b", Value: "old"}, {Name: "c", Value: nil}}
	if got := oldRow(ev); !reflect.DeepEqual(got, want) {
		t.Fatalf("oldRow = %#v", got)
	}
	if ev.Columns[1].Value != "new" {
		t.Fatal("oldRow modified the new row")
	}
}

// The spill decoder never panics on corrupt input (a truncated or damaged spill file).
func FuzzSpillDecode(f *testing.F) {
	ev := &open.Event{Kind: open.KindRow, CommitTs: 1, Op: open.OpInsert, Columns: []open.Column{
		{Name: "a", Value: int64(-1)}, {Name: "b", Value: "x"}, {Name: "c", Value: []byte{1}}, {Name: "d", Value: 1.5},
		{Name: "e", Value: uint64(7)}, {Name: "f", Value: nil}}}
	f.Add(encodeEvent(nil, &bufEvent{ev: ev, ts: 1, seq: 2}))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bufio.NewReader(bytes.NewReader(data))
		names := map[string]string{}
		for i := 0; i < 100; i++ {
			if _, _, _, err := decodeEvent(r, names); err != nil {
				return
			}
		}
	})
}

func TestHandleChanged(t *testing.T) {
	h, g := open.FlagHandleKey, open.FlagGenerated
	col := func(name string, f open.Flag, v any) open.Column { return open.Column{Name: name, Flags: f, Value: v} }
	// reference: the handle columns of both rows, built and compared
	ref := func(ev *open.Event) bool {
		old, cur := handleCols(writable(oldRow(ev))), handleCols(writable(ev.Columns))
		if len(old) != len(cur) {
			return false
		}
		for i := range old {
			if old[i].Name != cur[i].Name || !valueEqual(old[i].Value, cur[i].Value) {
				return true
			}
		}
		return false
	}
	tests := []struct {
		name     string
		cur, old []open.Column
		want     bool
	}{
		{"same handle", []open.Column{col("id", h, int64(1)), col("v", 0, "b")}, []open.Column{col("id", h, int64(1)), col("v", 0, "a")}, false},
		{"new handle", []open.Column{col("id", h, int64(2)), col("v", 0, "b")}, []open.Column{col("id", h, int64(1)), col("v", 0, "b")}, true},
		{"composite, second part", []open.Column{col("a", h, "x"), col("b", h, []byte("2"))}, []open.Column{col("a", h, "x"), col("b", h, []byte("1"))}, true},
		{"only updated columns, handle unchanged", []open.Column{col("id", h, int64(1)), col("v", 0, "b")}, []open.Column{col("v", 0, "a")}, false},
		{"only updated columns, handle changed", []open.Column{col("id", h, int64(2)), col("v", 0, "b")}, []open.Column{col("id", h, int64(1))}, true},
		{"generated columns ignored", []open.Column{col("g", g|h, int64(9)), col("id", h, int64(1))}, []open.Column{col("g", g|h, int64(8)), col("id", h, int64(1))}, false},
		{"old row without handle flags", []open.Column{col("id", h, int64(2))}, []open.Column{col("id", 0, int64(1))}, false},
		{"more handle columns in the old row", []open.Column{col("a", h, int64(1)), col("b", 0, int64(2))}, []open.Column{col("a", h, int64(1)), col("b", h, int64(3))}, false},
		{"bytes against string", []open.Column{col("id", h, "1")}, []open.Column{col("id", h, []byte("1"))}, true},
	}
	for _, tc := range tests {
		ev := &open.Event{Op: open.OpUpdate, Columns: tc.cur, OldColumns: tc.old}
		if got := handleChanged(ev, writable(ev.Columns)); got != tc.want || got != ref(ev) {
			t.Errorf("%s: handleChanged %t, want %t (reference %t)", tc.name, got, tc.want, ref(ev))
		}
	}
}

func TestGCSettings(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Changefeed.Brokers, cfg.Changefeed.Topics, cfg.Downstream.DSN = []string{"k:9092"}, []string{"t"}, "root@tcp(h:3306)/"
	if got := cfg.gcLimit(); got != 2*(256<<20)+32<<20 {
		t.Errorf("default memory limit %d", got)
	}
	cfg.Applier.MemoryBytes = 1 << 20
	if got := cfg.gcLimit(); got != 128<<20 {
		t.Errorf("memory limit floor %d", got)
	}
	cfg.Applier.GCPercent = -1
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "applier.gc-percent: must be between 0 and 10000, got -1") {
		t.Errorf("negative gc-percent: %v", err)
	}
	cfg.Applier.GCPercent = 0
	if err := cfg.Validate(); err != nil {
		t.Errorf("gc-percent 0: %v", err)
	}
}

// BenchmarkEncodeEvent encodes a sysbench-shaped row for spilling (no allocation per
// event).
func BenchmarkEncodeEvent(b *testing.B) {
	ev := &open.Event{Kind: open.KindRow, CommitTs: 1, Op: open.OpInsert, Columns: []open.Column{
		{Name: "id", Type: open.TypeLong, Flags: open.FlagHandleKey | open.FlagPrimaryKey, Value: int64(12345)},
		{Name: "k", Type: open.TypeLong, Value: int64(4711)},
		{Name: "c", Type: open.TypeString, Value: strings.Repeat("83868641912-", 10)},
		{Name: "pad", Type: open.TypeString, Value: strings.Repeat("67847967377-", 5)},
	}}
	e := &bufEvent{ev: ev, ts: 1, seq: 1}
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		buf = encodeEvent(buf[:0], e)
	}
	b.SetBytes(int64(len(buf)))
}

// TestBufferReleaseKeepsTheRowsLeft: release moves the rows above the target to the front
// of the table's array and keeps the array for the next round's rows; the slots it
// vacated hold no events (they could not be collected), and rows added after it are read
// in order after the ones left.
func TestBufferReleaseKeepsTheRowsLeft(t *testing.T) {
	b, err := newBuffer(t.TempDir(), 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	add := rowAdder(t, b)
	read := func(target uint64) []int64 { return bufferedIDs(t, b, target) }
	for i := range 2000 {
		add(uint64(1+i%4), int64(i)) // ts 1, 2, 3, 4, 1, …
	}
	tb := b.tables[tableKey{"s", "t"}]
	if b.spilled != 0 {
		t.Fatalf("spilled %d bytes under a 64 MiB limit", b.spilled)
	}
	capBefore := cap(tb.mem)
	b.release(2)
	if len(tb.mem) != 1000 || b.memCount != 1000 {
		t.Fatalf("after release(2): %d rows in memory (count %d), want 1000", len(tb.mem), b.memCount)
	}
	if cap(tb.mem) != capBefore {
		t.Errorf("release(2) gave back the array: cap %d, was %d", cap(tb.mem), capBefore)
	}
	for i, e := range tb.mem[len(tb.mem):cap(tb.mem)] {
		if e.ev != nil {
			t.Fatalf("vacated slot %d still holds an event", len(tb.mem)+i)
		}
	}
	var want []int64
	for i := range 2000 {
		if 1+i%4 == 3 {
			want = append(want, int64(i))
		}
	}
	for i := range 2000 {
		if 1+i%4 == 4 {
			want = append(want, int64(i))
		}
	}
	if got := read(4); !reflect.DeepEqual(got, want) {
		t.Fatalf("rows left after release(2): %d rows, want %d in ts then arrival order", len(got), len(want))
	}
	for i := range 10 {
		add(5, int64(10000+i))
		want = append(want, int64(10000+i))
	}
	if got := read(5); !reflect.DeepEqual(got, want) {
		t.Fatalf("rows added after the release: got %d rows, want %d in order", len(got), len(want))
	}
	b.release(5)
	if len(b.tables) != 0 || b.memCount != 0 || b.memBytes != 0 {
		t.Fatalf("buffer not empty: %+v", b)
	}
}

// rowAdder returns a func that adds to b a row of table s.t with handle id at ts, each
// with the next arrival sequence number.
func rowAdder(t *testing.T, b *buffer) func(ts uint64, id int64) {
	var seq uint64
	return func(ts uint64, id int64) {
		seq++
		ev := &open.Event{Kind: open.KindRow, CommitTs: ts, Schema: "s", Table: "t", Op: open.OpInsert,
			Columns: []open.Column{{Name: "id", Type: open.TypeLonglong, Flags: open.FlagHandleKey, Value: id}}}
		if err := b.add(ev, seq); err != nil {
			t.Fatal(err)
		}
	}
}

// bufferedIDs returns the ids of table s.t's buffered rows up to target, in the order the
// buffer gives them, and fails t if they are not in ts order or go past target.
func bufferedIDs(t *testing.T, b *buffer, target uint64) []int64 {
	t.Helper()
	var ids []int64
	var last uint64
	for ev, err := range b.tables[tableKey{"s", "t"}].events(target) {
		if err != nil {
			t.Fatal(err)
		}
		if ev.CommitTs < last || ev.CommitTs > target {
			t.Fatalf("ts %d after %d (target %d)", ev.CommitTs, last, target)
		}
		last = ev.CommitTs
		ids = append(ids, ev.Columns[0].Value.(int64))
	}
	return ids
}

// TestStatementTextReuse: a statement written into a worker's reused buffer is the
// statement buildUpsert writes, whatever the buffer held before, and the buffers go
// back to the worker only within their bound.
func TestStatementTextReuse(t *testing.T) {
	rows := [][]open.Column{
		{{Name: "id", Value: int64(1), Flags: open.FlagHandleKey}, {Name: "v", Value: "it's"}},
		{{Name: "id", Value: int64(2), Flags: open.FlagHandleKey}, {Name: "v", Value: []byte{0, 1}}},
	}
	var texts stmtTexts
	long, _ := appendUpsert(texts.get(), "s", "a_much_longer_table_name_than_the_next", rows, modeReplace)
	texts.put(long)
	for _, mode := range []writeMode{modeUpsert, modeReplace, modeInsert} {
		q, args := appendUpsert(texts.get(), "s", "t", rows, mode)
		want, wantArgs := buildUpsert("s", "t", rows, mode)
		if got := texts.str(q); got != want || len(args) != len(wantArgs) {
			t.Errorf("mode %d: reused buffer gives %q %v, want %q %v", mode, got, args, want, wantArgs)
		}
		texts.put(q)
	}
	q, _ := appendDeleteByHandle(texts.get(), "s", "t", [][]open.Column{{rows[0][0]}})
	if want, _ := buildDeleteByHandle("s", "t", [][]open.Column{{rows[0][0]}}); texts.str(q) != want {
		t.Errorf("delete in a reused buffer: %q, want %q", texts.str(q), want)
	}
	texts.put(make([]byte, 0, maxKeptText+1))
	texts.put(nil)
	if len(texts.free) != 0 {
		t.Errorf("%d buffers kept; want none (one too large, one empty)", len(texts.free))
	}
}
