package checker

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// earlyReturner keeps Barrierer's contract the way cdc.Replicator does: fn runs on
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
	errc := make(chan error, 1)
	go func() {
		errc <- Hold(ctx, a, 1, func(context.Context) error {
			close(running)
			<-release
			wrote = 42
			return nil
		})
	}()
	<-running
	cancel() // Barrier returns now; fn is still running
	select {
	case err := <-errc:
		t.Fatalf("Hold returned %v while fn still ran", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Hold: %v, want context.Canceled", err)
	}
	if wrote != 42 {
		t.Fatalf("fn's write not seen after Hold: %d", wrote)
	}

	// fn not started when Barrier returned: it never runs.
	ctx, cancel = context.WithCancel(context.Background())
	a = earlyReturner{start: make(chan struct{}), ended: make(chan error, 1)}
	var ran atomic.Bool
	cancel()
	if err := Hold(ctx, a, 1, func(context.Context) error { ran.Store(true); return nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("Hold with an ended context: %v", err)
	}
	close(a.start)
	if err := <-a.ended; !errors.Is(err, context.Canceled) {
		t.Fatalf("held function after abandonment returned %v, want context.Canceled", err)
	}
	if ran.Load() {
		t.Fatal("fn ran after Barrier had returned without it")
	}
}
