package verify

// Tests of a run's snapshot pairs (pair.go): rotation at verify.max-view-age, a TSO
// past TiDB's GC, verify.max-lag, a barrier the applier passed.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/internal/tso"
)

// TestViewRotation: with verify.max-view-age 2s and a rate cap that makes the first
// table take 1.2s and the second 3.2s, no pair is used past its age: a new pair is taken between
// tables once the current one is past half of it, and a table still being compared when
// its pair reaches it goes on, in the same checker run, at a fresh pair. The run is
// equal, counts every row once, and the history lists the pairs each table used.
func TestViewRotation(t *testing.T) {
	f := newFixture(t, 3000, 8000)
	cfg := f.config()
	cfg.MaxViewAge = 2 * time.Second
	cfg.MaxRowsPerSecond = 2500
	s, err := New(cfg, Deps{Applier: &stillApplier{ts: f.ts}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, s)
	rec := manual(t, s, Request{})
	if rec.Result != ResultEqual || rec.RowsChecked != 11000 || rec.TablesCompared != 2 {
		t.Fatalf("run: %+v", rec)
	}
	h := recordOf(t, s, rec.RunID)
	if len(h.Pairs) < 3 {
		t.Fatalf("%d pairs for a run of about 4s with max-view-age 2s: %+v", len(h.Pairs), h.Pairs)
	}
	// A view is not read once it reached the age: the table's diff is stopped then (a
	// query in flight killed) and the pair closed; slack is for that on a busy machine.
	slack := time.Second
	var longest time.Duration
	for _, p := range h.Pairs {
		age := p.ClosedAt.Sub(p.OpenedAt)
		if p.ClosedAt.IsZero() || age > cfg.MaxViewAge+slack {
			t.Errorf("pair %d open for %v (max-view-age %v)", p.Seq, age, cfg.MaxViewAge)
		}
		longest = max(longest, age)
	}
	big := h.Tables[1]
	if big.Table != "t2" || len(big.Pairs) < 2 || big.RowsChecked != 8000 || big.DiffRunID == "" {
		t.Fatalf("the table compared across pairs: %+v", big)
	}
	// The first table's pair was past half its age when it ended: the second started at
	// a new one.
	if h.Tables[0].Pairs[len(h.Tables[0].Pairs)-1] == big.Pairs[0] {
		t.Errorf("the second table started at the first table's last pair: %+v", h.Tables)
	}
	if st := s.Stats(); st.Rotations < 2 || st.Pairs != int64(len(h.Pairs)) {
		t.Fatalf("stats: %+v", st)
	}
	t.Logf("pairs: %d; table pairs: %v, %v; longest open view %v", len(h.Pairs), h.Tables[0].Pairs, big.Pairs, longest.Round(time.Millisecond))
}

// TestGCTSORefused: a pair at a TSO TiDB's GC has passed (one from 1999: the shared
// TiDB's safe point is never older, and this test does not move it) fails the run
// before anything is read — not even the applier's barrier is asked — with an error
// naming the safe point; the history records the failure.
func TestGCTSORefused(t *testing.T) {
	f := newFixture(t, 10)
	old := tso.FromTime(time.Date(1999, 6, 1, 0, 0, 0, 0, time.UTC))
	app := &stillApplier{ts: old}
	s, err := New(f.config(), Deps{Applier: app, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, s)
	rec := manual(t, s, Request{})
	if rec.Result != ResultFailed || !strings.Contains(rec.Error, "older than TiDB's GC safe point") || !strings.Contains(rec.Error, fmt.Sprint(old)) {
		t.Fatalf("run at a collected TSO: %+v", rec)
	}
	if n := app.barriers.Load(); n != 0 {
		t.Fatalf("the barrier was asked %d times for a collected TSO", n)
	}
	h := recordOf(t, s, rec.RunID)
	if h.Result != ResultFailed || h.Error != rec.Error || len(h.Pairs) != 0 {
		t.Fatalf("history: %+v", h)
	}
	if st := s.Stats(); st.Verified || st.Pairs != 0 {
		t.Fatalf("stats: %+v", st)
	}
	// The pair itself, asked for without the check, fails before its barrier too:
	// TiDB refuses the snapshot when the pair's sessions set it.
	kill, err := sql.Open("mysql", f.downDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer kill.Close()
	p, err := checker.OpenSnapshotPair(context.Background(), app, checker.SnapshotPairConfig{TS: old, UpstreamDSN: f.upDSN, Downstream: f.down, Kill: kill})
	if err == nil {
		p.Close()
		t.Fatal("a pair opened at a collected TSO")
	}
	if !strings.Contains(err.Error(), "GC safe point") || app.barriers.Load() != 0 {
		t.Fatalf("pair at a collected TSO: %v (%d barriers)", err, app.barriers.Load())
	}
}

// lagApplier reports an applied checkpoint lagging by an hour until caughtUp is set
// (its resolved ts, where pairs are taken, is the fixture's TSO all along).
type lagApplier struct {
	stillApplier
	caughtUp atomic.Bool
}

func (a *lagApplier) Watermarks() (uint64, uint64) {
	if a.caughtUp.Load() {
		return a.ts, a.ts
	}
	return tso.FromTime(time.Now().Add(-time.Hour)), a.ts
}

// TestMaxLagHoldsRuns: while the applier lags by more than verify.max-lag no pair is
// opened (nothing asks its barrier); once it caught up the run goes on, and the wait is
// counted as throttled.
func TestMaxLagHoldsRuns(t *testing.T) {
	f := newFixture(t, 100)
	cfg := f.config()
	cfg.MaxLag = 10 * time.Second
	app := &lagApplier{stillApplier: stillApplier{ts: f.ts}}
	s, err := New(cfg, Deps{Applier: app, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, s)
	st, err := s.Trigger(context.Background(), Request{})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if n := app.barriers.Load(); n != 0 {
		t.Fatalf("%d barriers while the applier lagged an hour", n)
	}
	if a := s.Stats().Active; len(a) != 1 || a[0].RunID != st.RunID || a[0].PairTS != 0 {
		t.Fatalf("active runs while lagging: %+v", a)
	}
	app.caughtUp.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rec, err := st.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Result != ResultEqual || rec.Throttled < 1500*time.Millisecond || s.Stats().Throttled < 1500*time.Millisecond {
		t.Fatalf("run after the lag: %+v (service throttled %v)", rec, s.Stats().Throttled)
	}
}

// passedApplier has applied beyond the TSO it reports as resolved (a busy applier passes
// the resolved ts before a pair's connections are ready): its barrier refuses any TSO up
// to it with its sentinel, and holds the (unchanging) fallback at a later one.
type passedApplier struct {
	stillApplier
	passed   error
	refusals atomic.Int64
}

func (a *passedApplier) Barrier(ctx context.Context, ts uint64, fn func(ctx context.Context) error) error {
	a.barriers.Add(1)
	if ts <= a.ts {
		a.refusals.Add(1)
		return fmt.Errorf("barrier at %d: %w", ts, a.passed)
	}
	return fn(ctx)
}

// TestPairAfterApplierPassed: when the applier keeps passing the resolved ts before the
// barrier is set, the pair is taken at TiDB's current TSO, which it cannot have passed.
func TestPairAfterApplierPassed(t *testing.T) {
	f := newFixture(t, 100)
	app := &passedApplier{stillApplier: stillApplier{ts: f.ts}, passed: errors.New("applied past the barrier")}
	s, err := New(f.config(), Deps{Applier: app, BarrierPassed: app.passed, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, s)
	rec := manual(t, s, Request{})
	if rec.Result != ResultEqual || len(rec.Pairs) != 1 || rec.FirstTS <= f.ts || rec.RowsChecked != 100 {
		t.Fatalf("run: %+v", rec)
	}
	if n := app.refusals.Load(); n != resolvedAttempts {
		t.Fatalf("%d refusals before the pair at TiDB's TSO, want %d", n, resolvedAttempts)
	}
}
