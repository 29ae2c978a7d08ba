package barrier

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// earlyReturner keeps the barrier's contract the way cdc.Replicator does: fn runs on
// the applier's goroutine, started when start is closed, and Barrier returns ctx's
// error as soon as ctx ends, fn finished or not. ended, when set, receives fn's result.
type earlyReturner struct {
	start chan struct{}
	ended chan error
}

func (a earlyReturner) Barrier(ctx context.Context, ts uint64, fn func(ctx context.Context) error) error {
	result := make(chan error, 1)
	go func() {
		<-a.start
		err := fn(context.WithoutCancel(ctx))
		if a.ended != nil {
			a.ended <- err
		}
		result <- err
	}()
	select {
	case err := <-result:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestHoldWaitsForFn: when Barrier returns on its context while fn runs, Hold returns
// only after fn ended (what fn wrote is then safe to read: run with -race); when fn had
// not started, it never does.
func TestHoldWaitsForFn(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	a := earlyReturner{start: make(chan struct{})}
	close(a.start)
	running, release := make(chan struct{}), make(chan struct{})
	var wrote int
	type result struct {
		ran bool
		err error
	}
	res := make(chan result, 1)
	go func() {
		ran, err := Hold(ctx, a.Barrier, 1, func(context.Context) error {
			close(running)
			<-release
			wrote = 42
			return nil
		})
		res <- result{ran, err}
	}()
	<-running
	cancel() // Barrier returns now; fn is still running
	select {
	case r := <-res:
		t.Fatalf("Hold returned %v while fn still ran", r.err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if r := <-res; !r.ran || !errors.Is(r.err, context.Canceled) {
		t.Fatalf("Hold: ran %v, %v; want ran, context.Canceled", r.ran, r.err)
	}
	if wrote != 42 {
		t.Fatalf("fn's write not seen after Hold: %d", wrote)
	}

	// fn not started when Barrier returned: it never runs.
	ctx, cancel = context.WithCancel(context.Background())
	a = earlyReturner{start: make(chan struct{}), ended: make(chan error, 1)}
	var ran atomic.Bool
	cancel()
	if held, err := Hold(ctx, a.Barrier, 1, func(context.Context) error { ran.Store(true); return nil }); held || !errors.Is(err, context.Canceled) {
		t.Fatalf("Hold with an ended context: ran %v, %v; want not ran, context.Canceled", held, err)
	}
	close(a.start)
	if err := <-a.ended; !errors.Is(err, context.Canceled) {
		t.Fatalf("held function after abandonment returned %v, want context.Canceled", err)
	}
	if ran.Load() {
		t.Fatal("fn ran after Barrier had returned without it")
	}
}
