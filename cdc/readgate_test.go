package cdc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/internal/testenv"
)

func resolvedEvents(ts ...uint64) []open.Event {
	var evs []open.Event
	for _, t := range ts {
		evs = append(evs, open.Event{Kind: open.KindResolved, CommitTs: t})
	}
	return evs
}

// waits reports whether partition i's reader would wait now.
func waits(g *readGate, i int) bool {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return g.wait(ctx, i) != nil
}

func TestReadGate(t *testing.T) {
	row := open.Event{Kind: open.KindRow, CommitTs: 50}
	type step struct {
		part int
		evs  []open.Event
		want []bool // per partition: whether its reader waits after the step
	}
	for _, tc := range []struct {
		name  string
		start []uint64
		steps []step
	}{
		{"all start level", []uint64{0, 0, 0}, []step{
			{0, nil, []bool{false, false, false}},
			{0, resolvedEvents(10), []bool{true, false, false}},
			{1, resolvedEvents(10), []bool{true, true, false}},
			{2, resolvedEvents(5), []bool{true, true, false}},
			{2, resolvedEvents(10), []bool{false, false, false}},
		}},
		{"rows do not move the gate", []uint64{0, 0}, []step{
			{0, []open.Event{row, row}, []bool{false, false}},
			{1, []open.Event{row}, []bool{false, false}},
		}},
		{"the largest resolved ts of a record counts", []uint64{0, 0}, []step{
			{0, append(resolvedEvents(7, 30, 20), row), []bool{true, false}},
			{1, resolvedEvents(20), []bool{true, false}},
			{1, resolvedEvents(30), []bool{false, false}},
		}},
		{"an older resolved ts changes nothing", []uint64{40, 40}, []step{
			{0, resolvedEvents(30), []bool{false, false}},
			{0, resolvedEvents(50), []bool{true, false}},
			{0, resolvedEvents(45), []bool{true, false}},
		}},
		{"a partition read from its start holds the resumed ones", []uint64{100, 100, 0}, []step{
			{2, nil, []bool{true, true, false}},
			{2, resolvedEvents(90), []bool{true, true, false}},
			{2, resolvedEvents(120), []bool{false, false, true}},
		}},
		{"one partition", []uint64{0}, []step{
			{0, resolvedEvents(10), []bool{false}},
			{0, resolvedEvents(20), []bool{false}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newReadGate(append([]uint64(nil), tc.start...))
			for i, s := range tc.steps {
				g.passed(s.part, s.evs)
				for p, want := range s.want {
					if got := waits(g, p); got != want {
						t.Errorf("step %d: partition %d waits = %t, want %t (resolved %v)", i, p, got, want, g.resolved)
					}
				}
			}
		})
	}
}

func TestReadGateWakesAWaitingReader(t *testing.T) {
	g := newReadGate([]uint64{0, 0})
	g.passed(0, resolvedEvents(10))
	done := make(chan error, 1)
	go func() { done <- g.wait(context.Background(), 0) }()
	select {
	case err := <-done:
		t.Fatalf("wait returned %v while partition 1 is behind", err)
	case <-time.After(50 * time.Millisecond):
	}
	g.passed(1, resolvedEvents(10))
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("wait did not return once partition 1 caught up")
	}

	// A waiting reader is released by its context.
	g.passed(0, resolvedEvents(20))
	ctx, cancel := context.WithCancel(context.Background())
	go func() { done <- g.wait(ctx, 0) }()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("wait = %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("wait did not return when its context ended")
	}
}

// TestSlowPartitionHoldsTheOthersBack: a partition whose resolved ts lags keeps the other
// partitions' readers one resolved interval ahead of it (their rows wait in Kafka, not in
// the buffer), and once it catches up everything is applied.
func TestSlowPartitionHoldsTheOthersBack(t *testing.T) {
	down := testenv.Downstream(t)
	f := newFeed(t, 2)
	db := down.Name
	exec(t, down.DB, "CREATE TABLE t (id BIGINT PRIMARY KEY, v VARCHAR(20))")

	resolvedOn := func(part int, ts uint64) {
		m := f.enc.EncodeResolved(ts)
		f.write(part, kafka.Message{Key: m.Key, Value: m.Value})
	}
	// Partition 1: five intervals of 12 rows, each closed by its resolved ts.
	// Partition 0: only the first interval's resolved ts, for now.
	const intervals, perInterval = 5, 12
	var want []string
	var resolved []uint64
	id := int64(0)
	for range intervals {
		ts := f.next()
		var evs []open.Event
		for range perInterval {
			id++
			v := fmt.Sprintf("v%d", id)
			evs = append(evs, ins(ts, db, "t", ci("id", id, pk), cs("v", v)))
			want = append(want, fmt.Sprintf("%d|%s", id, v))
		}
		f.rows(1, evs...)
		r := f.next()
		resolvedOn(1, r)
		resolved = append(resolved, r)
	}
	resolvedOn(0, resolved[0])

	cfg := testConfig(t, f, down)
	run := start(t, cfg, nil)
	run.wait(t, resolved[0])

	// Partition 1's reader reads the second interval and its resolved ts, then waits:
	// the second interval's rows are buffered, the rest stays unread in Kafka.
	deadline := time.Now().Add(30 * time.Second)
	for run.r.Status().BufferedRows < perInterval && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // a reader that does not wait reads on meanwhile
	st := run.r.Status()
	if st.BufferedRows != perInterval {
		t.Fatalf("buffered rows = %d, want %d (the interval after the slow partition's resolved ts only)", st.BufferedRows, perInterval)
	}
	if p := st.Partitions[1]; p.ResolvedTs != resolved[1] || p.Lag == 0 {
		t.Fatalf("partition 1: resolved ts %d (want %d), %d records unread (want some): %+v", p.ResolvedTs, resolved[1], p.Lag, p)
	}
	if st.AppliedTs != resolved[0] {
		t.Fatalf("applied ts %d, want %d", st.AppliedTs, resolved[0])
	}

	// The slow partition catches up: everything is read and applied.
	resolvedOn(0, resolved[intervals-1])
	run.wait(t, resolved[intervals-1])
	slices.Sort(want)
	equal(t, "fallback", dump(t, down.DB, db, "t"), want)
	if st := run.r.Status(); st.BufferedRows != 0 {
		t.Fatalf("buffered rows = %d after everything was applied", st.BufferedRows)
	}
}
