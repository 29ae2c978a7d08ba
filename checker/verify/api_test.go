package verify

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidb-parity/parity/internal/retry"
	"github.com/tidb-parity/parity/internal/testenv"
	"github.com/tidb-parity/parity/internal/tso"
)

// movingApplier is stillApplier whose position the test moves: the fallback is at ts
// (the test writes the same rows to both sides before it moves it past them).
type movingApplier struct {
	ts       atomic.Uint64
	barriers atomic.Int64
}

func (a *movingApplier) Barrier(ctx context.Context, ts uint64, fn func(ctx context.Context) error) error {
	a.barriers.Add(1)
	if cur := a.ts.Load(); ts != cur {
		return fmt.Errorf("barrier at %d: the fallback is at %d", ts, cur)
	}
	return fn(ctx)
}

func (a *movingApplier) Watermarks() (uint64, uint64) { ts := a.ts.Load(); return ts, ts }

func (a *movingApplier) WaitApplied(ctx context.Context, ts uint64) error {
	for a.ts.Load() < ts {
		if err := retry.Sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

var _ Applier = (*movingApplier)(nil)

func ctxMinute(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// waitActive polls Get until the run runs with ok(progress) true.
func waitActive(t *testing.T, s *Service, runID string, ok func(a *ActiveRun) bool) (RunRecord, *ActiveRun) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		rec, a, err := s.Get(context.Background(), runID)
		if err != nil {
			t.Fatal(err)
		}
		if a != nil && ok(a) {
			return rec, a
		}
		if a == nil || time.Now().After(deadline) {
			t.Fatalf("run %s: %+v, progress %+v", runID, rec, a)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func runIDs(runs []RunRecord) []string {
	out := make([]string, len(runs))
	for i, r := range runs {
		out[i] = r.RunID
	}
	return out
}

// TestGetListCancel: Get returns a run with its progress while it runs (chunks, rows,
// its start) and without once it ended; Cancel stops a running run (rate-capped by
// its request to run for minutes) and a queued one, both end cancelled and are recorded
// so; cancelling an ended run returns it unchanged; unknown runs are ErrRunNotFound;
// List filters by state, trigger and start time, pages with offset and limit, newest
// first, and refuses a state or limit that is none.
func TestGetListCancel(t *testing.T) {
	f := newFixture(t, 6000)
	s, err := New(f.config(), Deps{Applier: &stillApplier{ts: f.ts}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, s)
	ctx := ctxMinute(t)
	first := manual(t, s, Request{})
	if first.Result != ResultEqual {
		t.Fatalf("first run: %+v", first)
	}
	if rec, a, err := s.Get(ctx, first.RunID); err != nil || a != nil || rec.RunID != first.RunID || rec.Result != ResultEqual || len(rec.Tables) != 1 || len(rec.Pairs) != 1 {
		t.Fatalf("Get of an ended run: %+v %+v %v", rec, a, err)
	}

	// A long run: 6000 rows at 300 rows/s.
	long, err := s.Trigger(ctx, Request{MaxRowsPerSecond: 300})
	if err != nil {
		t.Fatal(err)
	}
	rec, a := waitActive(t, s, long.RunID, func(a *ActiveRun) bool { return a.ChunksDone > 0 && a.RowsChecked > 0 })
	if rec.State != StateRunning || rec.Trigger != TriggerManual || a.StartedAt.IsZero() || a.Queued || a.ChunksTotal < a.ChunksDone || a.PairTS != f.ts ||
		rec.RowsChecked != a.RowsChecked {
		t.Fatalf("a running run: %+v, progress %+v", rec, a)
	}
	// Another trigger's run waits for the slot (verify.max-concurrent-runs 1).
	queued, err := s.trigger(ctx, "schedule", "other", Request{})
	if err != nil {
		t.Fatal(err)
	}
	qrec, qa, err := s.Get(ctx, queued.RunID)
	if err != nil || qa == nil || !qa.Queued || qrec.State != StateRunning || qrec.Trigger != "other" {
		t.Fatalf("a queued run: %+v, progress %+v, %v", qrec, qa, err)
	}
	crec, err := s.Cancel(ctx, queued.RunID)
	if err != nil || crec.State != StateCancelled || crec.Result != ResultCancelled || !strings.Contains(crec.Error, "cancelled before it started: cancelled on request") {
		t.Fatalf("cancelled queued run: %+v, %v", crec, err)
	}
	if h := recordOf(t, s, queued.RunID); h.State != StateCancelled || h.Trigger != "other" {
		t.Fatalf("history of the cancelled queued run: %+v", h)
	}

	start := time.Now()
	crec, err = s.Cancel(ctx, long.RunID)
	if err != nil {
		t.Fatal(err)
	}
	if crec.State != StateCancelled || crec.Result != ResultCancelled || crec.Error != "cancelled on request" || crec.RowsChecked >= 6000 || len(crec.Pairs) != 1 {
		t.Fatalf("cancelled run: %+v", crec)
	}
	t.Logf("cancel took %v", time.Since(start).Round(time.Millisecond))
	if h, a, err := s.Get(ctx, long.RunID); err != nil || a != nil || h.State != StateCancelled || h.Error != "cancelled on request" || h.FinishedAt.IsZero() {
		t.Fatalf("history of the cancelled run: %+v %+v %v", h, a, err)
	}
	if again, err := s.Cancel(ctx, long.RunID); err != nil || again.State != StateCancelled || !again.FinishedAt.Equal(crec.FinishedAt) {
		t.Fatalf("cancel of an ended run: %+v %v", again, err)
	}
	if st := s.Stats(); st.Running != 0 {
		t.Fatalf("runs left: %+v", st.Active)
	}
	if _, _, err := s.Get(ctx, "v-none"); !errors.Is(err, ErrRunNotFound) {
		t.Fatalf("Get of an unknown run: %v", err)
	}
	if _, err := s.Cancel(ctx, "v-none"); !errors.Is(err, ErrRunNotFound) {
		t.Fatalf("Cancel of an unknown run: %v", err)
	}

	// The history: long (cancelled), queued (cancelled, other), first (done), newest first.
	longRec := recordOf(t, s, long.RunID)
	for _, tc := range []struct {
		name string
		f    ListFilter
		want []string
	}{
		{"all", ListFilter{}, []string{queued.RunID, long.RunID, first.RunID}},
		{"done", ListFilter{State: StateDone}, []string{first.RunID}},
		{"cancelled", ListFilter{State: StateCancelled}, []string{queued.RunID, long.RunID}},
		{"manual", ListFilter{Trigger: TriggerManual}, []string{long.RunID, first.RunID}},
		{"manual cancelled", ListFilter{Trigger: TriggerManual, State: StateCancelled}, []string{long.RunID}},
		{"no such trigger", ListFilter{Trigger: "nightly"}, nil},
		{"page 1", ListFilter{Limit: 2}, []string{queued.RunID, long.RunID}},
		{"page 2", ListFilter{Offset: 2, Limit: 2}, []string{first.RunID}},
		{"page 3", ListFilter{Offset: 4, Limit: 2}, nil},
		{"started after", ListFilter{StartedAfter: longRec.StartedAt}, []string{queued.RunID, long.RunID}},
		{"started before", ListFilter{StartedBefore: longRec.StartedAt}, []string{first.RunID}},
	} {
		runs, err := s.List(ctx, tc.f)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := runIDs(runs); strings.Join(got, " ") != strings.Join(tc.want, " ") {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	if runs, err := s.List(ctx, ListFilter{State: StateDone}); err != nil || len(runs) != 1 || len(runs[0].Tables) != 1 || len(runs[0].Pairs) != 1 {
		t.Fatalf("a listed run's details: %+v %v", runs, err)
	}
	for _, bad := range []ListFilter{{State: "queued"}, {Limit: ListLimit + 1}, {Offset: -1}} {
		if _, err := s.List(ctx, bad); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("List(%+v): %v", bad, err)
		}
	}
}

// TestSnapshotPoint: a point at the resolved ts holds the fallback in the applier's
// barrier, reads its GTID position there, records it in the ts-map (source
// snapshot-point) and counts its pause; at a TSO the applier has passed it fails with
// the applier's error, and at one TiDB's GC has passed with ErrPastGC before the barrier
// is asked.
func TestSnapshotPoint(t *testing.T) {
	f := newFixture(t, 10)
	app := &stillApplier{ts: f.ts}
	tm := &tsMap{}
	s, err := New(f.config(), Deps{Applier: app, RecordTSMap: tm.record, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.SnapshotPoint(context.Background(), 0); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("before Run: %v", err)
	}
	serve(t, s)
	ctx := ctxMinute(t)
	p, err := s.SnapshotPoint(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if p.TS != f.ts || !strings.HasPrefix(p.Position, "mariadb-gtid:") || p.Source != "gtid_binlog_pos" || p.Pause <= 0 || p.CreatedAt.IsZero() {
		t.Fatalf("point: %+v", p)
	}
	if v, src := PositionSource(p.Position); v == "" || strings.HasPrefix(v, "mariadb") || src != p.Source {
		t.Fatalf("position %q: %q %q", p.Position, v, src)
	}
	tm.mu.Lock()
	if want := fmt.Sprintf("%d %s snapshot-point", f.ts, p.Position); len(tm.rows) != 1 || tm.rows[0] != want {
		t.Fatalf("ts-map: %q, want %q", tm.rows, want)
	}
	tm.mu.Unlock()
	if st := s.Stats(); st.Pause.Count != 1 || app.barriers.Load() != 1 {
		t.Fatalf("pause histogram %+v, %d barriers", st.Pause, app.barriers.Load())
	}
	// At the fallback's own TSO explicitly (its position may have moved: other tests
	// write to the shared server).
	if p2, err := s.SnapshotPoint(ctx, f.ts); err != nil || p2.TS != f.ts || !strings.HasPrefix(p2.Position, "mariadb-gtid:") {
		t.Fatalf("point at %d: %+v %v", f.ts, p2, err)
	}
	// A TSO the applier has passed: its barrier's error.
	if _, err := s.SnapshotPoint(ctx, f.ts-1); err == nil || !strings.Contains(err.Error(), "the fallback is at") {
		t.Fatalf("point at a passed TSO: %v", err)
	}
	barriers := app.barriers.Load()
	old := tso.FromTime(time.Date(1999, 6, 1, 0, 0, 0, 0, time.UTC))
	if _, err := s.SnapshotPoint(ctx, old); !errors.Is(err, ErrPastGC) || !strings.Contains(err.Error(), "GC safe point") {
		t.Fatalf("point at a collected TSO: %v", err)
	}
	if app.barriers.Load() != barriers {
		t.Fatal("the barrier was asked for a collected TSO")
	}
	if ts, err := s.UpstreamTSO(ctx); err != nil || ts <= f.ts {
		t.Fatalf("upstream TSO %d (fixture %d): %v", ts, f.ts, err)
	}
}

// TestRequestOptions: a run's MinTS holds its first pair until the applier resolved it
// (no barrier before), and the pair is then at it; MaxViewAge and MaxRowsPerSecond,
// below the service's (10m, no cap), make a run rotate its pairs as a 2s view age
// demands; options above the service's limits are refused.
func TestRequestOptions(t *testing.T) {
	f := newFixture(t, 8000)
	app := &movingApplier{}
	app.ts.Store(f.ts)
	cfg := f.config()
	cfg.MaxRowsPerSecond = 5000
	s, err := New(cfg, Deps{Applier: app, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, s)
	ctx := ctxMinute(t)
	later := testenv.TiDBTSO(t, f.up)
	st, err := s.Trigger(ctx, Request{MinTS: later})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	if n := app.barriers.Load(); n != 0 {
		t.Fatalf("%d barriers before the applier resolved the run's min ts", n)
	}
	if _, a, err := s.Get(ctx, st.RunID); err != nil || a == nil || a.PairTS != 0 {
		t.Fatalf("run waiting for its min ts: %+v %v", a, err)
	}
	app.ts.Store(later)
	rec, err := st.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Result != ResultEqual || rec.FirstTS != later {
		t.Fatalf("run with min ts %d: %+v", later, rec)
	}

	rec = manual(t, s, Request{MaxViewAge: 2 * time.Second, MaxRowsPerSecond: 2500})
	if rec.Result != ResultEqual || rec.RowsChecked != 8000 || len(rec.Pairs) < 2 {
		t.Fatalf("a run of ~3s with max view age 2s: %d pairs: %+v", len(rec.Pairs), rec)
	}
	for _, bad := range []struct {
		req   Request
		field string
	}{
		{Request{MaxViewAge: time.Hour}, FieldMaxViewAge}, {Request{MaxViewAge: time.Millisecond}, FieldMaxViewAge},
		{Request{MaxRowsPerSecond: 6000}, FieldMaxRowsPerSecond}, {Request{MaxRowsPerSecond: -1}, FieldMaxRowsPerSecond},
		{Request{MinTS: 12345}, FieldMinTS}, {Request{Scope: "sometimes"}, FieldScope}, {Request{Tables: []string{"nodot"}}, FieldTables},
	} {
		_, err := s.Trigger(ctx, bad.req)
		var re *RequestError
		if !errors.Is(err, ErrInvalidRequest) || !errors.As(err, &re) || re.Field != bad.field {
			t.Errorf("Trigger(%+v): %v (%+v), want an invalid request about %s", bad.req, err, re, bad.field)
		}
	}
}
