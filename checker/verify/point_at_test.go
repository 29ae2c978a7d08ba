package verify

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestRunAtExactTS (#31, the fleet point): a run asked for its first pair at exactly a
// TSO opens it there, at the applier's barrier at that TSO; one the applier has applied
// beyond is refused at the trigger with ErrPairPassed (nothing started); AtTS with MinTS
// is an invalid request naming at_ts; one the applier does not reach within AtTSWait fails
// the run, saying so.
func TestRunAtExactTS(t *testing.T) {
	f := newFixture(t, 50)
	app := &aheadApplier{}
	app.ts.Store(f.ts)
	s, err := New(f.config(), Deps{Applier: app, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, s)
	ctx := ctxMinute(t)

	started, err := s.Trigger(ctx, Request{Scope: ScopeFull, AtTS: f.ts})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := started.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Result != ResultEqual || len(rec.Pairs) == 0 || rec.Pairs[0].TS != f.ts || rec.FirstTS != f.ts {
		t.Fatalf("run at exactly %d: result %s, pairs %+v", f.ts, rec.Result, rec.Pairs)
	}

	barriers := app.barriers.Load()
	if _, err := s.Trigger(ctx, Request{Scope: ScopeFull, AtTS: f.ts - 1}); !errors.Is(err, ErrPairPassed) {
		t.Fatalf("a run at a TSO the applier passed: %v, want ErrPairPassed", err)
	}
	if app.barriers.Load() != barriers {
		t.Fatal("the barrier was asked for a TSO the applier had passed")
	}
	// A TSO the applier does not reach within AtTSWait: the run fails, saying so.
	started, err = s.Trigger(ctx, Request{Scope: ScopeFull, AtTS: f.ts + 1<<18, AtTSWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if rec, err = started.Wait(ctx); err != nil || rec.Result != ResultFailed || !strings.Contains(rec.Error, "did not reach it within 1s") || len(rec.Pairs) != 0 {
		t.Fatalf("a run at a TSO never reached: %s %q, pairs %v, %v", rec.Result, rec.Error, rec.Pairs, err)
	}
	var re *RequestError
	if _, err := s.Trigger(context.Background(), Request{AtTS: f.ts, MinTS: f.ts}); !errors.As(err, &re) || re.Field != FieldAtTS {
		t.Fatalf("AtTS with MinTS: %v", err)
	}
}

// aheadApplier is movingApplier whose barrier at a TSO beyond it waits, as the applier
// does until its changefeed gets there (here: never).
type aheadApplier struct{ movingApplier }

func (a *aheadApplier) Barrier(ctx context.Context, ts uint64, fn func(ctx context.Context) error) error {
	if ts > a.ts.Load() {
		a.barriers.Add(1)
		<-ctx.Done()
		return ctx.Err()
	}
	return a.movingApplier.Barrier(ctx, ts, fn)
}
