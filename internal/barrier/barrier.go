// Package barrier holds one rule of the applier's barrier that both sides of the
// checker/cdc boundary must keep: the function handed to Barrier(ctx, ts, fn) runs on
// the applier's goroutine and may still be running after Barrier returned on ctx
// (cdc.Replicator.Barrier, checker.Barrierer). The checker's snapshot pairs and points
// and cdc's repair both wait for it before they read what it wrote or release what it
// uses, and neither package may import the other, so the rule lives in this leaf.
package barrier

import (
	"context"
	"sync"
)

// Func is a barrier: Barrier(ctx, ts, fn) holds the fallback exactly at ts while fn runs.
type Func func(ctx context.Context, ts uint64, fn func(ctx context.Context) error) error

// Hold runs fn inside barrier at ts and returns only once fn has ended or will never
// start: fn does not start after the barrier returned without it. ran says whether fn
// ran (what it wrote is then safe to read); err is the barrier's result, which is ctx's
// error when the barrier returned early, even if fn then succeeded.
func Hold(ctx context.Context, barrier Func, ts uint64, fn func(ctx context.Context) error) (ran bool, err error) {
	var (
		mu        sync.Mutex
		abandoned bool
		started   bool
		done      = make(chan struct{})
	)
	err = barrier(ctx, ts, func(bctx context.Context) error {
		mu.Lock()
		if abandoned {
			mu.Unlock()
			return context.Canceled
		}
		started = true
		mu.Unlock()
		defer close(done)
		return fn(bctx)
	})
	mu.Lock()
	abandoned = true
	ran = started
	mu.Unlock()
	if ran {
		<-done
	}
	return ran, err
}
