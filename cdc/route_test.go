package cdc

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/internal/rowkey"
	"github.com/tidb-parity/parity/internal/testenv"
)

// routed is one op as a worker received it.
type routed struct {
	worker int
	op     op
	fenced bool // a fence op
}

// routeRound runs produce for one table's events over a lane of workers and returns the
// ops in the order each worker received them, interleaved as received. Workers ack fences
// at once (they hold nothing unwritten).
func routeRound(t *testing.T, info *tableInfo, lane []int, evs ...open.Event) []routed {
	t.Helper()
	a := newApplier(nil, nil, DefaultConfig(), slog.New(slog.DiscardHandler), nil, map[tableKey]uint64{}, nil)
	a.tables = newTableInfos(func(context.Context, string, string) (*tableInfo, error) { return info, nil })
	tb := &tableBuf{key: tableKey{"s", "t"}, sorted: true}
	for i := range evs {
		tb.mem = append(tb.mem, bufEvent{ev: &evs[i], ts: evs[i].CommitTs, seq: uint64(i)})
	}
	chans := make([]chan []op, 8)
	for i := range chans {
		chans[i] = make(chan []op, 1000)
	}
	// Fences block produce until acked: ack them from a goroutine that drains every
	// channel, recording arrival order.
	out := make(chan routed, 10000)
	done := make(chan error, 1)
	go func() {
		done <- a.produce(context.Background(), tb, 100, chans, lane, nil)
	}()
	var got []routed
	for {
		progressed := false
		for w, ch := range chans {
			select {
			case chunk := <-ch:
				progressed = true
				for _, o := range chunk {
					if o.fence != nil {
						o.fence <- struct{}{}
						got = append(got, routed{worker: w, fenced: true})
						continue
					}
					got = append(got, routed{worker: w, op: o})
				}
			default:
			}
		}
		if !progressed {
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
				// drain what is left
				for w, ch := range chans {
					for len(ch) > 0 {
						for _, o := range <-ch {
							got = append(got, routed{worker: w, op: o})
						}
					}
				}
				close(out)
				return got
			default:
			}
		}
	}
}

func strCol(name, v string, f open.Flag) open.Column {
	return open.Column{Name: name, Type: open.TypeVarchar, Flags: f, Value: v}
}

const hk = open.FlagHandleKey | open.FlagPrimaryKey

// TestRouteHandleOnlyDeleteWithOtherUniqueKey: in a table with a UNIQUE key besides the
// handle, a delete that carries only the handle goes to the same worker as the full rows
// of its key, in order (issue 21: the delete went to the worker its id hashed to, the
// REPLACE of the same id to the table's worker, and the row could survive).
func TestRouteHandleOnlyDeleteWithOtherUniqueKey(t *testing.T) {
	info := &tableInfo{exists: true, uniques: [][]string{{"id"}, {"u"}}, classes: map[string]rowkey.Class{}}
	// The round opens with a handle-only delete: nothing in it shows the UNIQUE key.
	evs := []open.Event{del(9, "s", "t", ci("id", 0, hk))}
	for id := int64(1); id <= 40; id++ {
		evs = append(evs, ins(10, "s", "t", ci("id", id, hk), ci("u", id, open.FlagUniqueKey)))
	}
	for id := int64(1); id <= 40; id++ {
		evs = append(evs, del(11, "s", "t", ci("id", id, hk))) // handle key only
	}
	got := routeRound(t, info, []int{2, 3, 5, 6}, evs...)
	if len(got) != 81 {
		t.Fatalf("%d ops, want 81", len(got))
	}
	for i, r := range got {
		if r.worker != 2 {
			t.Fatalf("op %d (del=%v) went to worker %d; every row of the table must go to its first worker 2", i, r.op.del, r.worker)
		}
		if !r.op.del && r.op.mode != modeReplace {
			t.Fatalf("op %d: mode %d, want REPLACE", i, r.op.mode)
		}
		if want := i == 0 || i > 40; r.op.del != want {
			t.Fatalf("op %d: del=%v out of order", i, r.op.del)
		}
	}
}

// TestRouteCollationEqualKeys: keys the downstream collation holds equal go to one worker.
func TestRouteCollationEqualKeys(t *testing.T) {
	spellings := [][]string{
		{"Ase", "ASE", "ase", "Asé", "ÀSÉ", "Ase ", "ase  "},
		{"k1", "K1", "k1 "},
		{"Ωμέγα", "ΩΜΕΓΑ", "ωμεγα"},
		{"中文", "中文  "},
	}
	// Many distinct keys: with the routing hash's random seed, the four above alone all
	// land on one of six workers in 1 run of 216 per collation.
	for i := range 40 {
		spellings = append(spellings, []string{fmt.Sprint("row", i), fmt.Sprint("ROW", i), fmt.Sprint("Row", i, " ")})
	}
	for _, coll := range []string{"utf8mb4_general_ci", "utf8mb4_unicode_ci", "utf8mb4_unicode_520_ci", "utf8mb4_0900_ai_ci", "utf8mb4_uca1400_ai_ci"} {
		info := &tableInfo{exists: true, uniques: [][]string{{"k"}}, classes: map[string]rowkey.Class{"k": rowkey.ClassOf(coll)}}
		var evs []open.Event
		for round := 0; round < 20; round++ {
			for _, group := range spellings {
				for i, s := range group {
					if i%2 == 0 {
						evs = append(evs, del(10, "s", "t", strCol("k", s, hk)))
					}
					evs = append(evs, ins(10, "s", "t", strCol("k", s, hk), ci("v", int64(round), 0)))
				}
			}
		}
		got := routeRound(t, info, []int{0, 1, 2, 3, 4, 5}, evs...)
		worker := map[string]int{}
		used := map[int]bool{}
		for _, r := range got {
			if r.fenced {
				t.Fatalf("%s: a fence for keys that fold safely", coll)
			}
			k := r.op.cols[0].Value.(string)
			for gi, group := range spellings {
				for _, s := range group {
					if s == k {
						k = fmt.Sprint("group", gi)
					}
				}
			}
			if w, ok := worker[k]; ok && w != r.worker {
				t.Fatalf("%s: spellings of %s went to workers %d and %d", coll, k, w, r.worker)
			}
			worker[k] = r.worker
			used[r.worker] = true
		}
		if len(used) < 2 {
			t.Fatalf("%s: every key went to one worker; folding should keep distinct keys apart", coll)
		}
	}
	// utf8mb4_bin: trailing spaces only; case stays distinct.
	info := &tableInfo{exists: true, uniques: [][]string{{"k"}}, classes: map[string]rowkey.Class{"k": rowkey.ClassOf("utf8mb4_bin")}}
	got := routeRound(t, info, []int{0, 1, 2, 3, 4, 5},
		ins(10, "s", "t", strCol("k", "a", hk)), del(10, "s", "t", strCol("k", "a ", hk)), ins(10, "s", "t", strCol("k", "a  ", hk)))
	for _, r := range got[1:] {
		if r.worker != got[0].worker {
			t.Fatalf("utf8mb4_bin: 'a' and 'a ' on workers %d and %d", got[0].worker, r.worker)
		}
	}
}

// TestRouteUnfoldableKeyFences: a key Go cannot fold ('ß' is 's' in general_ci and "ss"
// in unicode_ci) may equal a key already sent to another worker: produce waits for every
// other worker of the lane, then writes the rest of the table's round through its first
// worker.
func TestRouteUnfoldableKeyFences(t *testing.T) {
	info := &tableInfo{exists: true, uniques: [][]string{{"k"}}, classes: map[string]rowkey.Class{"k": rowkey.Folded}}
	var evs []open.Event
	for i := 0; i < 30; i++ {
		evs = append(evs, ins(10, "s", "t", strCol("k", fmt.Sprint("ss", i), hk)))
	}
	evs = append(evs, del(10, "s", "t", strCol("k", "ß0", hk)))
	for i := 0; i < 30; i++ {
		evs = append(evs, ins(10, "s", "t", strCol("k", fmt.Sprint("x", i), hk)))
	}
	lane := []int{1, 2, 4}
	got := routeRound(t, info, lane, evs...)
	fences := map[int]bool{}
	after := false
	for _, r := range got {
		if r.fenced {
			fences[r.worker] = true
			continue
		}
		k := r.op.cols[0].Value.(string)
		if k == "ß0" {
			if len(fences) != len(lane)-1 {
				t.Fatalf("'ß0' sent before every other worker was fenced (fenced: %v)", fences)
			}
			after = true
		}
		if after && r.worker != 1 {
			t.Fatalf("%q after the fence went to worker %d, want the table's worker 1", k, r.worker)
		}
	}
	if !after {
		t.Fatal("the unfoldable key was never sent")
	}
	// Opaque collations (locale-tailored) fence at the first string key.
	info.classes["k"] = rowkey.ClassOf("latin1_swedish_ci")
	got = routeRound(t, info, lane, evs...)
	for _, r := range got {
		if !r.fenced && r.worker != 1 {
			t.Fatalf("latin1_swedish_ci: %v went to worker %d", r.op.cols[0].Value, r.worker)
		}
	}
}

// TestRespelledKeysAndHandleOnlyDeletes replays, through real Kafka into the real
// fallback with 6 workers and small batches, rounds that race when routing looks at bytes
// or at one event's columns: in a table with a UNIQUE key besides the handle, inserts and
// handle-only deletes of the same ids in one round (issue 21); in _ci and PAD SPACE
// tables, keys respelled by case, accent and trailing spaces as TiCDC sends it (DELETE of
// the old spelling, INSERT of the new, deletes first) several times in a round (issue
// 24). Each table has the feed to itself, so its rows spread over every worker. Every
// table must end with exactly the rows TiDB would hold.
func TestRespelledKeysAndHandleOnlyDeletes(t *testing.T) {
	const rounds, keys = 50, 10
	spell := func(name string, v int64) []open.Column {
		return []open.Column{strCol("k", name, hk), ci("v", v, open.FlagNullable)}
	}
	// One transaction (commit ts) respells each key once, as TiCDC sends a transaction:
	// at most one event per row, the split key change's DELETE first. The round holds
	// three such transactions after the insert.
	respell := func(s string, r int64, ts, ts2 uint64) (evs []open.Event) {
		for k := int64(0); k < keys; k++ {
			base := fmt.Sprintf("ase%d_%d", r, k)
			words := []string{base, strings.ToUpper(base), "As\u00e9" + base[3:], "ASE" + base[3:] + "  "}
			evs = append(evs, ins(ts, s, "t", spell(words[0], r)...))
			for i := 1; i < len(words); i++ {
				txn := ts + uint64(i) // between ts and ts2 (f.next steps by more)
				evs = append(evs, del(txn, s, "t", strCol("k", words[i-1], hk)), ins(txn, s, "t", spell(words[i], r*10+int64(i))...))
			}
		}
		return evs
	}
	respelled := func(r int64) (out []string) {
		for k := int64(0); k < keys; k++ {
			out = append(out, fmt.Sprintf("ASE%d_%d  |%d", r, k, r*10+3))
		}
		return out
	}
	cases := []struct {
		name, ddl string
		round     func(s string, r int64, ts, ts2 uint64) []open.Event
		want      func(r int64) []string
	}{
		{"unique key besides the handle", "id BIGINT PRIMARY KEY, u BIGINT NOT NULL, UNIQUE KEY (u)",
			func(s string, r int64, ts, ts2 uint64) (evs []open.Event) {
				// ids inserted, then deleted by handle only; the last one survives.
				for id := r*keys + 1; id <= r*keys+keys; id++ {
					evs = append(evs, ins(ts, s, "t", ci("id", id, pk), ci("u", id, open.FlagUniqueKey)))
				}
				for id := r*keys + 1; id < r*keys+keys; id++ {
					evs = append(evs, del(ts2, s, "t", ci("id", id, pk)))
				}
				return evs
			},
			func(r int64) []string { return []string{fmt.Sprintf("%d|%d", r*keys+keys, r*keys+keys)} }},
		{"utf8mb4_general_ci", "k VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci PRIMARY KEY, v BIGINT", respell, respelled},
		{"utf8mb4_unicode_ci", "k VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci PRIMARY KEY, v BIGINT", respell, respelled},
		{"utf8mb4_bin", "k VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PRIMARY KEY, v BIGINT",
			func(s string, r int64, ts, ts2 uint64) (evs []open.Event) {
				// 'p' and 'p ' are one key; 'P' is another.
				for k := int64(0); k < keys; k++ {
					p := fmt.Sprintf("p%d_%d", r, k)
					evs = append(evs, ins(ts, s, "t", spell(p, r)...),
						del(ts2, s, "t", strCol("k", p, hk)), ins(ts2, s, "t", spell(p+" ", r+1)...),
						ins(ts2, s, "t", spell(strings.ToUpper(p), r+2)...))
				}
				return evs
			},
			func(r int64) (out []string) {
				for k := int64(0); k < keys; k++ {
					out = append(out, fmt.Sprintf("P%d_%d|%d", r, k, r+2), fmt.Sprintf("p%d_%d |%d", r, k, r+1))
				}
				return out
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			down := testenv.Downstream(t)
			f := newFeed(t, 2)
			s := down.Name
			exec(t, down.DB, "CREATE TABLE t ("+tc.ddl+")")
			var last uint64
			var want []string
			for r := int64(0); r < rounds; r++ {
				ts, ts2 := f.next(), f.next()
				f.rows(int(r%2), tc.round(s, r, ts, ts2)...)
				f.resolved(ts2)
				last = ts2
				want = append(want, tc.want(r)...)
			}
			cfg := testConfig(t, f, down)
			cfg.Applier.Workers = 6
			cfg.Applier.BatchRows = 2
			run := start(t, cfg, nil)
			run.wait(t, last)
			slices.Sort(want)
			equal(t, tc.name, dump(t, down.DB, s, "t"), want)
			if err := run.stop(t); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestBufferDeletesFirstWithinACommitTs: a transaction's delete that arrives after its
// inserts (another partition, index-value dispatch) is still applied before them, in
// memory and from spill runs; other rows keep their arrival order.
func TestBufferDeletesFirstWithinACommitTs(t *testing.T) {
	for _, limit := range []int64{1 << 30, 2 << 10} {
		b, err := newBuffer(t.TempDir(), limit)
		if err != nil {
			t.Fatal(err)
		}
		var seq uint64
		add := func(ts uint64, op open.Op, k string) {
			seq++
			ev := &open.Event{Kind: open.KindRow, CommitTs: ts, Schema: "s", Table: "t", Op: op,
				Columns: []open.Column{strCol("k", k, hk)}}
			if err := b.add(ev, seq); err != nil {
				t.Fatal(err)
			}
		}
		for i := 0; i < 40; i++ {
			ts := uint64(10 + i/4)
			add(ts, open.OpInsert, fmt.Sprintf("Asé%d", i))
			add(ts, open.OpUpdate, fmt.Sprintf("u%d", i))
			add(ts, open.OpDelete, fmt.Sprintf("Ase%d", i))
		}
		var got []string
		var last uint64
		lastDelete := true
		for ev, err := range b.tables[tableKey{"s", "t"}].events(100) {
			if err != nil {
				t.Fatal(err)
			}
			if ev.CommitTs != last {
				last, lastDelete = ev.CommitTs, true
			}
			del := ev.Op == open.OpDelete
			if del && !lastDelete {
				t.Fatalf("limit %d: a delete after an insert or update at ts %d: %v", limit, ev.CommitTs, got)
			}
			lastDelete = del
			got = append(got, ev.Columns[0].Value.(string))
		}
		if len(got) != 120 || got[0] != "Ase0" || got[4] != "Asé0" || got[5] != "u0" || got[6] != "Asé1" {
			t.Fatalf("limit %d: order %v", limit, got[:12])
		}
		if limit < 1<<20 && b.spilled == 0 {
			t.Fatal("nothing spilled")
		}
		b.close()
	}
}
