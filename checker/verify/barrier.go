package verify

// barrier.go owns the early barrier: the applier's barrier registered as soon as a pair's
// TSO is chosen, before checker.OpenSnapshotPair prepares the pair's connections, so a
// busy applier cannot apply past the TSO meanwhile. It must not open connections itself.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/internal/barrier"
)

// errPrepSlow releases an early barrier whose pair was not ready in time.
var errPrepSlow = errors.New("the snapshot pair's connections were not ready in time")

// errNotReached ends the wait for an applier that did not reach the barrier's TSO in
// the time expireAfter gave it.
var errNotReached = errors.New("the applier did not reach the pair's TSO in time")

// earlyBarrier holds the applier's barrier at ts from its creation, and runs in it the
// function that OpenSnapshotPair later hands its Barrier. When the applier reaches ts
// first it waits (at most maxWait) for that function: that wait is part of the pause.
//
// Barrier and close are called by one goroutine (the one opening the pair).
type earlyBarrier struct {
	ts     uint64
	cancel context.CancelFunc
	fns    chan func(context.Context) error // handed over while the applier holds ts
	result chan error                       // the handed function's result
	done   chan error                       // the applier's Barrier call ended
	handed bool                             // a function was handed over and has returned
	ended  bool                             // done was received
	err    error                            // what done carried
	pause  time.Duration                    // the applier held ts this long (set before done)
	expiry <-chan time.Time                 // Barrier gives up (errNotReached) when it fires; nil: never
}

// expireAfter makes Barrier give up waiting for the applier to reach ts after d
// (errNotReached). Call it before Barrier, from the same goroutine.
func (e *earlyBarrier) expireAfter(d time.Duration) { e.expiry = time.After(d) }

var _ checker.Barrierer = (*earlyBarrier)(nil)

// holdAt registers the applier's barrier at ts now; close must be called.
func holdAt(ctx context.Context, a checker.Barrierer, ts uint64, maxWait time.Duration) *earlyBarrier {
	ctx, cancel := context.WithCancel(ctx)
	e := &earlyBarrier{ts: ts, cancel: cancel, fns: make(chan func(context.Context) error),
		result: make(chan error, 1), done: make(chan error, 1)}
	// The goroutine ends when the applier's Barrier returns: close waits for it.
	go func() {
		// Hold: the pause is written before done is sent, even when close's cancel
		// makes the applier's Barrier return while it still runs the function.
		_, err := barrier.Hold(ctx, a.Barrier, ts, func(bctx context.Context) error {
			start := time.Now()
			defer func() { e.pause = time.Since(start) }()
			t := time.NewTimer(maxWait)
			defer t.Stop()
			select {
			case fn := <-e.fns:
				err := fn(bctx)
				e.result <- err
				return err
			case <-t.C:
				return errPrepSlow
			case <-bctx.Done():
				return bctx.Err()
			}
		})
		e.done <- err
	}()
	return e
}

// Barrier implements checker.Barrierer for the pair at e.ts: fn runs inside the held
// barrier. It returns the applier's own error when its barrier ended without fn (it had
// passed ts, it stopped, or the pair was not ready within maxWait).
func (e *earlyBarrier) Barrier(ctx context.Context, ts uint64, fn func(ctx context.Context) error) error {
	if ts != e.ts {
		return fmt.Errorf("early barrier at %d asked for %d", e.ts, ts)
	}
	select {
	case e.fns <- fn:
		e.handed = true
		return <-e.result
	case err := <-e.done:
		e.ended, e.err = true, err
		if err == nil {
			err = errPrepSlow
		}
		return err
	case <-e.expiry:
		return errNotReached
	case <-ctx.Done():
		return ctx.Err()
	}
}

// close releases the barrier if it still waits, waits for the applier's Barrier call to
// end and returns how long the applier held ts.
//
// A barrier whose function was handed over is not cancelled first: that function has
// returned and the applier releases ts by itself, reporting its own outcome rather
// than the cancellation's.
func (e *earlyBarrier) close() time.Duration {
	if !e.handed {
		e.cancel()
	}
	if !e.ended {
		e.err, e.ended = <-e.done, true
	}
	e.cancel()
	return e.pause
}
