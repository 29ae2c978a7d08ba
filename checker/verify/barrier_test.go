package verify

import (
	"context"
	"errors"
	"testing"
	"time"
)

// coordinatorApplier keeps checker.Barrierer's contract the way cdc.Replicator does: the
// held function runs on the applier's own goroutine, and Barrier returns ctx's error as
// soon as ctx ends even while that goroutine still finishes the function. lag is how
// long the coordinator takes, after the function returned, to report its result.
// ran, when set, receives what each held function returned.
type coordinatorApplier struct {
	lag time.Duration
	ran chan error
}

func (a coordinatorApplier) Barrier(ctx context.Context, ts uint64, fn func(ctx context.Context) error) error {
	result := make(chan error, 1)
	go func() {
		err := fn(ctx)
		if a.ran != nil {
			a.ran <- err
		}
		time.Sleep(a.lag)
		result <- err
	}()
	select {
	case err := <-result:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestEarlyBarrierPause: close returns how long the applier held ts, measured on the
// applier's goroutine, once the handed function returned. Run with -race: closing by
// cancelling first let Barrier return on the context before the measurement was
// written (found in TestAPIUnderLoad).
func TestEarlyBarrierPause(t *testing.T) {
	const work = 30 * time.Millisecond
	e := holdAt(context.Background(), coordinatorApplier{lag: 20 * time.Millisecond}, 7, time.Second)
	err := e.Barrier(context.Background(), 7, func(context.Context) error {
		time.Sleep(work)
		return nil
	})
	if err != nil {
		t.Fatalf("Barrier: %v", err)
	}
	if held := e.close(); held < work {
		t.Fatalf("pause %v, want at least the %v the handed function took", held, work)
	}
	if e.err != nil {
		t.Fatalf("applier's barrier ended with %v, want nil", e.err)
	}
}

// TestEarlyBarrierNotReady: a pair not handed over within maxWait releases the applier
// with errPrepSlow, and one closed before any hand-over releases it at once.
func TestEarlyBarrierNotReady(t *testing.T) {
	ran := make(chan error, 1)
	e := holdAt(context.Background(), coordinatorApplier{ran: ran}, 7, 10*time.Millisecond)
	if err := <-ran; !errors.Is(err, errPrepSlow) { // the applier gave up on the pair
		t.Fatalf("held function returned %v, want errPrepSlow", err)
	}
	err := e.Barrier(context.Background(), 7, func(context.Context) error {
		t.Error("function ran after the applier gave up waiting for it")
		return nil
	})
	if !errors.Is(err, errPrepSlow) {
		t.Fatalf("Barrier after maxWait: %v, want errPrepSlow", err)
	}
	e.close()

	e = holdAt(context.Background(), coordinatorApplier{}, 7, time.Hour)
	e.close() // does not wait the hour
	if !errors.Is(e.err, context.Canceled) {
		t.Fatalf("closed before hand-over: applier's barrier ended with %v, want context.Canceled", e.err)
	}
	if err := e.Barrier(context.Background(), 8, nil); err == nil {
		t.Fatal("Barrier at another ts: no error")
	}
}
