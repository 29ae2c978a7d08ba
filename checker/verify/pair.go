package verify

// pair.go owns a run's snapshot pairs: each at a TSO the applier's resolved ts has
// passed (waiting while the applier lags beyond verify.max-lag), refused when TiDB's GC
// has passed it, recorded in the history and the ts-map, and never used once its read
// view is verify.max-view-age old (run.go rotates them).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/internal/retry"
	"github.com/tidb-parity/parity/internal/tso"
)

// openPair opens a snapshot pair, once the applier's lag is within verify.max-lag, and
// records it. The pair's TSO is first the applier's global resolved ts, where the
// applier holds the fallback at once. Opening the pair's connections (before the
// barrier, so the pause is a few statements) takes a moment, in which a busy applier
// may apply beyond it and the barrier then refuses. After resolvedAttempts such
// refusals the TSO is TiDB's current one, which the applier cannot have passed, and the
// barrier is registered before the connections are prepared (earlyBarrier): the
// applier goes on applying until the global resolved ts has passed the TSO, and holds
// there until the pair's transactions are open — a pause that includes what is left of
// the preparation when the applier gets there first (at most pairPrepWait).
func (r *runner) openPair(ctx context.Context) error {
	e, cfg, rec := r.e, r.e.cfg, r.rec
	waited, err := e.waitLag(ctx, r.log)
	rec.Throttled += waited
	if err != nil {
		return err
	}
	quiet := slog.New(checkerLog{r.log.Handler()})
	if len(rec.Pairs) == 0 && r.opt.atTS > 0 {
		return r.openPairAt(ctx, r.opt.atTS, quiet)
	}
	if len(rec.Pairs) == 0 && r.opt.minTS > 0 {
		if err := e.waitResolved(ctx, r.opt.minTS, r.log); err != nil {
			return err
		}
	}
	var firstErr, lastErr error
	for attempt := 1; attempt <= pairAttempts; attempt++ {
		early := attempt > resolvedAttempts
		ts, err := e.pairTS(ctx)
		if err == nil && early {
			ts, err = e.db.upstreamTSO(ctx, cfg.QueryTimeout)
		}
		if err != nil {
			return err
		}
		// Before anything reads at ts: a TSO TiDB's GC has passed is refused, naming
		// the safe point (not tried again: later attempts are at newer TSOs).
		if attempt == 1 {
			if err := checker.CheckSnapshotGC(ctx, cfg.UpstreamDSN, ts, quiet); err != nil {
				return pastGC(fmt.Errorf("snapshot pair at %d (%s): %w", ts, tso.Format(ts), err))
			}
		}
		var b checker.Barrierer = e.deps.Applier
		var eb *earlyBarrier
		if early {
			eb = holdAt(ctx, e.deps.Applier, ts, pairPrepWait)
			b = eb
		}
		p, err := checker.OpenSnapshotPair(ctx, b, e.pairConfig(ts))
		if eb != nil {
			held := eb.close()
			if err == nil {
				p.Pause = held // the whole time the applier held ts
			}
		}
		if err == nil {
			r.opened(ctx, p)
			return nil
		}
		lastErr = tso.Hint(err)
		if firstErr == nil {
			firstErr = lastErr
		}
		if ctx.Err() != nil || (e.deps.BarrierPassed != nil && !errors.Is(err, e.deps.BarrierPassed)) {
			return lastErr
		}
		e.count.barrierPassed()
		r.log.Debug("the applier passed the pair's TSO before its barrier; trying a newer one", "resolved_ts", ts, "attempt", attempt)
	}
	if firstErr != lastErr && firstErr.Error() != lastErr.Error() {
		// The first failure is often the cause: later attempts are at newer TSOs (early
		// barriers at TiDB's current one) and fail for their own reasons.
		return fmt.Errorf("no snapshot pair in %d attempts: %w (the first failed with: %v)", pairAttempts, lastErr, firstErr)
	}
	return fmt.Errorf("no snapshot pair in %d attempts: %w", pairAttempts, lastErr)
}

// openPairAt opens the run's first pair at exactly ts (Request.AtTS): one attempt, the
// applier's barrier registered at once, so an applier behind ts holds there when it
// arrives (the wait is bounded by ctx). An applier already past ts refuses it: the
// error matches ErrPairPassed, and the caller (a fleet point) tries a newer TSO.
func (r *runner) openPairAt(ctx context.Context, ts uint64, quiet *slog.Logger) error {
	e, cfg := r.e, r.e.cfg
	if err := checkNotPassed(e.deps.Applier, ts); err != nil {
		return err
	}
	// The barrier first: the applier must not pass ts while TiDB's GC is asked about it.
	eb := holdAt(ctx, e.deps.Applier, ts, pairPrepWait)
	if err := checker.CheckSnapshotGC(ctx, cfg.UpstreamDSN, ts, quiet); err != nil {
		eb.close()
		return pastGC(fmt.Errorf("snapshot pair at %d (%s): %w", ts, tso.Format(ts), err))
	}
	// A fleet point may be a little ahead of TiDB's clock when it is taken: the pair's
	// read views open once TiDB has passed it, while the applier comes to ts.
	if err := e.waitUpstreamPast(ctx, ts); err != nil {
		eb.close()
		return err
	}
	if w := r.opt.atTSWait; w > 0 {
		eb.expireAfter(w)
	}
	p, err := checker.OpenSnapshotPair(ctx, eb, e.pairConfig(ts))
	held := eb.close()
	switch {
	case err == nil:
	case errors.Is(err, errPrepSlow) || (e.deps.BarrierPassed != nil && errors.Is(err, e.deps.BarrierPassed)):
		// Passed before the barrier was set, or released while the pair was not ready:
		// either way the applier is beyond ts now.
		e.count.barrierPassed()
		return pairPassed(fmt.Errorf("snapshot pair at exactly %d (%s): %w", ts, tso.Format(ts), err))
	case errors.Is(err, errNotReached):
		applied, _ := e.deps.Applier.Watermarks()
		return fmt.Errorf("snapshot pair at exactly %d (%s): the fallback did not reach it within %v (applied %d, %s): %w",
			ts, tso.Format(ts), r.opt.atTSWait, applied, tso.Format(applied), context.DeadlineExceeded)
	default:
		return fmt.Errorf("snapshot pair at exactly %d (%s): %w", ts, tso.Format(ts), tso.Hint(err))
	}
	p.Pause = held
	r.opened(ctx, p)
	return nil
}

// pairConfig is how a run's pair at ts is opened.
func (e *executor) pairConfig(ts uint64) checker.SnapshotPairConfig {
	return checker.SnapshotPairConfig{TS: ts, UpstreamDSN: e.cfg.UpstreamDSN, Downstream: e.db.down, Kill: e.db.kill,
		Conns: e.cfg.MaxConnections, QueryTimeout: e.cfg.QueryTimeout}
}

// waitUpstreamPast waits until TiDB's TSO has passed ts (at once for a ts from TiDB's
// past: one query when ts is within the last few seconds of the local clock, none
// before).
func (e *executor) waitUpstreamPast(ctx context.Context, ts uint64) error {
	for time.Until(tso.Time(ts)) > -5*time.Second {
		cur, err := e.db.upstreamTSO(ctx, e.cfg.QueryTimeout)
		if err != nil {
			return err
		}
		if cur >= ts {
			return nil
		}
		if err := retry.Sleep(ctx, max(time.Duration(ts-cur)>>18*time.Millisecond, 5*time.Millisecond)); err != nil {
			return err
		}
	}
	return nil
}

// checkNotPassed fails with ErrPairPassed when the applier has applied beyond ts.
func checkNotPassed(a Applier, ts uint64) error {
	if applied, _ := a.Watermarks(); applied > ts {
		return pairPassed(fmt.Errorf("snapshot pair at exactly %d (%s): the fallback has applied %d (%s)",
			ts, tso.Format(ts), applied, tso.Format(applied)))
	}
	return nil
}

// opened records a new pair.
func (r *runner) opened(ctx context.Context, p *checker.SnapshotPair) {
	rec := r.rec
	r.pair = p
	pr := PairRecord{Seq: len(rec.Pairs) + 1, TS: p.TS, Position: p.Position, Pause: p.Pause, OpenedAt: p.OpenedAt}
	rec.Pairs = append(rec.Pairs, pr)
	if rec.FirstTS == 0 || p.TS < rec.FirstTS {
		rec.FirstTS = p.TS
	}
	rec.LastTS = max(rec.LastTS, p.TS)
	rec.MaxPause = max(rec.MaxPause, p.Pause)
	r.log.Debug("snapshot pair opened", "resolved_ts", p.TS, "position", p.Position, "pause", p.Pause)
	if err := r.e.hist.pair(ctx, rec.RunID, pr); err != nil {
		r.log.Warn("could not record a snapshot pair", "resolved_ts", p.TS, "err", err)
	}
	if rt := r.e.deps.RecordTSMap; rt != nil {
		if err := rt(ctx, p.TS, p.Position, "verify"); err != nil {
			r.log.Warn("could not record a snapshot pair in the ts-map", "resolved_ts", p.TS, "err", err)
		}
	}
	r.e.count.pairOpened(p.Pause)
	r.prog.paired(p)
}

// closePair ends the current pair's read view and records when.
func (r *runner) closePair(ctx context.Context) {
	if r.pair == nil {
		return
	}
	if err := r.pair.Close(); err != nil {
		r.log.Warn("closing a snapshot pair", "resolved_ts", r.pair.TS, "err", err)
	}
	rec := r.rec
	pr := &rec.Pairs[len(rec.Pairs)-1]
	pr.ClosedAt = time.Now()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := r.e.hist.pairClosed(cctx, rec.RunID, *pr); err != nil {
		r.log.Warn("could not record the end of a snapshot pair", "err", err)
	}
	r.pair = nil
	r.prog.paired(nil)
}

// pairTS returns the TSO to open a pair at: the applier's global resolved ts (or its
// checkpoint, when that is newer), waiting for the first one.
func (e *executor) pairTS(ctx context.Context) (uint64, error) {
	deadline := time.Now().Add(resolvedWait)
	for {
		applied, resolved := e.deps.Applier.Watermarks()
		if ts := max(applied, resolved); ts > 0 {
			return ts, nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("the applier has no resolved ts after %v: no snapshot pair can be opened", resolvedWait)
		}
		if err := retry.Sleep(ctx, 100*time.Millisecond); err != nil {
			return 0, err
		}
	}
}

// waitResolved waits until the applier's resolved ts (or checkpoint) reaches ts: a run's
// first pair at or after a TSO (Request.MinTS).
func (e *executor) waitResolved(ctx context.Context, ts uint64, log *slog.Logger) error {
	logged := false
	for {
		applied, resolved := e.deps.Applier.Watermarks()
		if max(applied, resolved) >= ts {
			return nil
		}
		if !logged {
			log.Info("waiting for the applier to resolve the run's first pair TSO", "min_ts", ts, "resolved_ts", resolved)
			logged = true
		}
		if err := retry.Sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

// waitLag waits while the applier lags by more than verify.max-lag, returning how long.
func (e *executor) waitLag(ctx context.Context, log *slog.Logger) (time.Duration, error) {
	if e.cfg.MaxLag <= 0 {
		return 0, nil
	}
	start := time.Now()
	logged := false
	defer func() {
		w := time.Since(start)
		if logged {
			e.count.throttledFor(w)
			log.Info("applier caught up; verification goes on", "waited", w.Round(time.Millisecond))
		}
	}()
	for {
		lag, ok := e.lag()
		if !ok || lag <= e.cfg.MaxLag {
			if !logged {
				return 0, nil
			}
			return time.Since(start), nil
		}
		if !logged {
			log.Info("applier lagging; verification waits", "lag", lag.Round(time.Millisecond), "max_lag", e.cfg.MaxLag)
			logged = true
		}
		if err := retry.Sleep(ctx, time.Second); err != nil {
			return time.Since(start), err
		}
	}
}

// checkerLog is the handler of the checker's logs inside a run: its info and debug
// records go to debug (every table of every continuous run would log several lines), and
// its errors become warnings (a run's failure is logged once, by the service, and a
// rotation stops a table's diff on purpose).
type checkerLog struct{ h slog.Handler }

func shiftLevel(l slog.Level) slog.Level {
	switch {
	case l >= slog.LevelError:
		return slog.LevelWarn
	case l < slog.LevelWarn:
		return slog.LevelDebug
	}
	return l
}

func (c checkerLog) Enabled(ctx context.Context, l slog.Level) bool {
	return c.h.Enabled(ctx, shiftLevel(l))
}

func (c checkerLog) Handle(ctx context.Context, r slog.Record) error {
	r.Level = shiftLevel(r.Level)
	return c.h.Handle(ctx, r)
}

func (c checkerLog) WithAttrs(as []slog.Attr) slog.Handler { return checkerLog{c.h.WithAttrs(as)} }
func (c checkerLog) WithGroup(n string) slog.Handler       { return checkerLog{c.h.WithGroup(n)} }

// lag is the applier's lag now: wall clock minus its checkpoint's time (ok false while
// it has none).
func (e *executor) lag() (time.Duration, bool) {
	applied, _ := e.deps.Applier.Watermarks()
	if applied == 0 {
		return 0, false
	}
	return time.Since(tso.Time(applied)), true
}
