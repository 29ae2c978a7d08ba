package verify

import (
	"context"
	"errors"
	"testing"
)

// TestRunAtExactTS (#31, the fleet point): a run asked for its first pair at exactly a
// TSO opens it there, at the applier's barrier at that TSO; one the applier has applied
// beyond is refused at the trigger with ErrPairPassed (nothing started); AtTS with MinTS
// is an invalid request naming at_ts.
func TestRunAtExactTS(t *testing.T) {
	f := newFixture(t, 50)
	app := &movingApplier{}
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
	var re *RequestError
	if _, err := s.Trigger(context.Background(), Request{AtTS: f.ts, MinTS: f.ts}); !errors.As(err, &re) || re.Field != FieldAtTS {
		t.Fatalf("AtTS with MinTS: %v", err)
	}
}
