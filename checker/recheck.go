package checker

// recheck.go owns the re-check rounds and the confirmation at a snapshot pair: when to
// start a round (after a delay, and after the changefeed has applied what was in
// flight), which tables hold differences, re-reading them (a key scope per keyed table,
// compared by the comparer; a keyless table's chunks compared again) and swapping the
// stored differences for what is found now. It must not
// compare rows itself, nor count totals other than through the tracker.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/tidb-parity/parity/internal/retry"
)

// The re-check. When the two sides are not both read at a snapshot, a row that was written
// upstream while the run read it, and not yet replicated, shows as a difference although
// replication will apply it a moment later. So, once the comparison has ended, the rows of
// the differences found are read again, by key, on both sides (Config.RecheckRounds
// times, after Config.RecheckDelay and, with a changefeed, once its applied checkpoint has
// passed the moment they were read): a row that is then equal is dropped from the
// differences and counted as resolved; a row that still differs is stored as it is now
// (its fix SQL carries the upstream row read last). A keyless table has no key to read
// its rows by: its chunk is checksummed again, its differences are dropped when the chunk
// is equal now, and otherwise the chunk is compared again and only the rows still
// missing or extra stay (recheckKeyless). Chunks left undrilled
// (Config.MaxDifferences) are not re-checked.
//
// The confirmation. When both sides are read at a snapshot, reading a row again must read
// the same data, so there is no re-check; but a store whose snapshot read is not
// repeatable (a read at TSO T that misses a transaction committed below T, and sees it
// when read again at T) would have a run report a difference the data does not have. So,
// once the comparison has ended, the differences this process found are read again once,
// by key (a keyless chunk: checksummed and compared again, as the re-check does), on the
// same sources at the same pair: a difference of the data is there again and stays
// reported; one that is gone is counted as unconfirmed (diff_rechecks.unconfirmed,
// TableReport.DifferencesUnconfirmed), never as resolved, logged as a store anomaly, and
// not reported. Differences stored by an earlier process of a resumed run were found at
// another pair (or none): they stay as found.
//
// Each batch of re-read differences is swapped in one meta transaction
// (store.replaceDifferences), so a run killed during its re-check and resumed re-checks
// what is left, and never counts a resolved row twice.

// rechecker runs the re-check rounds of a run, or its confirmation.
type rechecker struct {
	cfg   *Config
	log   *slog.Logger
	st    *store
	cmp   *comparer
	track *tracker
	// confirming: the sides are read at the same snapshot pair as when the differences
	// were found; only the chunks this process found them in are read, and the rows
	// found equal are unconfirmed, not resolved.
	confirming bool
}

// recheckEnabled reports whether a run on pair re-checks its differences: not when both
// sides are read at a snapshot (reading again would read the same data).
func recheckEnabled(cfg *Config, pair *sourcePair) bool {
	return cfg.RecheckRounds > 0 && !pair.atSnapshot()
}

// run runs the re-check rounds; readEnd is when the comparison that found the
// differences ended (every row was read before it).
func (rc *rechecker) run(ctx context.Context, readEnd time.Time) error {
	for round := 1; round <= rc.cfg.RecheckRounds; round++ {
		todo, pending := rc.track.pending()
		if len(todo) == 0 {
			return nil
		}
		if err := rc.wait(ctx, readEnd); err != nil {
			return err
		}
		start := time.Now()
		rc.track.progress(true, 0)
		rc.log.Info("re-checking differences", "round", round, "differences", pending,
			"since_read", time.Since(readEnd).Round(time.Millisecond))
		resolved, err := rc.readAgain(ctx, todo)
		if err != nil {
			return err
		}
		rc.track.rechecked(round)
		rc.track.progress(true, 0)
		rc.log.Info("re-check round done", "round", round, "resolved", resolved, "remaining", pending-resolved,
			"elapsed", time.Since(start).Round(time.Millisecond))
		readEnd = time.Now()
	}
	return nil
}

// confirmEnabled reports whether a run on pair confirms its differences: when both sides
// are read at a snapshot.
func confirmEnabled(pair *sourcePair) bool { return pair.atSnapshot() }

// confirm reads the differences this process found again at the same pair (see the
// file comment); rc is confirming.
func (rc *rechecker) confirm(ctx context.Context) error {
	pending, _ := rc.track.pending()
	var todo []*target
	for _, t := range pending {
		if len(rc.track.foundChunks(t.idx)) > 0 {
			todo = append(todo, t)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	start := time.Now()
	rc.log.Info("confirming differences at the snapshot pair", "tables", len(todo))
	gone, err := rc.readAgain(ctx, todo)
	if err != nil {
		return err
	}
	rc.log.Info("differences confirmed", "unconfirmed", gone, "elapsed", time.Since(start).Round(time.Millisecond))
	return nil
}

// readAgain reads the stored differences of tables again (rc.table), Concurrency tables
// at a time, counts the rows no longer different in the tracker (resolved, or
// unconfirmed when confirming) and returns them in all.
func (rc *rechecker) readAgain(ctx context.Context, tables []*target) (int64, error) {
	what := "re-check"
	if rc.confirming {
		what = "confirm"
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(rc.cfg.Concurrency)
	var total atomic.Int64
	for _, t := range tables {
		g.Go(func() error {
			n, err := rc.table(gctx, t)
			if err != nil {
				return fmt.Errorf("%s %s: %w", what, t.name, err)
			}
			rc.track.gone(t.idx, n, rc.confirming)
			total.Add(n)
			if rc.confirming && n > 0 {
				// A store anomaly, not a data difference: said loudly, counted, not reported.
				rc.log.Warn("differences gone when read again at the same snapshot pair: a snapshot read was not repeatable; not reported",
					"table", t.name, "unconfirmed", n, "upstream_snapshot", rc.cmp.pair.snapshot[upSide],
					"downstream_snapshot", rc.cmp.pair.snapshot[downSide])
			}
			return nil
		})
	}
	err := g.Wait()
	return total.Load(), err
}

// wait waits until the differences read before readEnd are due for a re-check:
// RecheckDelay after readEnd and, when the changefeed's lag is known, until its applied
// checkpoint has passed readEnd (at most RecheckMaxWait; then the round goes ahead, and
// rows still in flight stay reported).
func (rc *rechecker) wait(ctx context.Context, readEnd time.Time) error {
	if d := time.Until(readEnd.Add(rc.cfg.RecheckDelay)); d > 0 {
		if err := retry.Sleep(ctx, d); err != nil {
			return err
		}
	}
	if rc.cfg.Lag == nil {
		return nil
	}
	deadline := time.Now().Add(rc.cfg.RecheckMaxWait)
	for {
		lag, err := rc.cfg.Lag(ctx)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			rc.log.Warn("re-check: changefeed lag unknown; re-checking without waiting for it", "changefeed", rc.cfg.Changefeed.ID, "err", err)
			return nil
		case time.Since(readEnd) >= lag: // the applied checkpoint, now - lag, is past readEnd
			return nil
		case time.Now().After(deadline):
			rc.log.Warn("re-check: changefeed still behind the differences' reads; re-checking anyway",
				"changefeed", rc.cfg.Changefeed.ID, "lag", lag.Round(time.Millisecond), "recheck_max_wait", rc.cfg.RecheckMaxWait)
			return nil
		}
		rc.track.progress(true, lag)
		if err := retry.Sleep(ctx, min(250*time.Millisecond, lag-time.Since(readEnd))); err != nil {
			return err
		}
	}
}

// collected is a differenceSink that keeps what it is given.
type collected []Difference

func (c *collected) full() bool { return false }
func (c *collected) emit(d Difference) error {
	*c = append(*c, d)
	return nil
}

// table re-checks the stored differences of a table and returns the rows resolved. A
// keyed table's differences are read in batches (keyScope); each batch's rows are read
// again by key on both sides with one query per side and swapped in one meta transaction.
func (rc *rechecker) table(ctx context.Context, t *target) (int64, error) {
	if t.plan.Keyless {
		return rc.keyless(ctx, t)
	}
	ks, err := openKeyScope(ctx, t, rc.st)
	if err != nil {
		return 0, err
	}
	if rc.confirming {
		here := rc.track.foundChunks(t.idx)
		maps.DeleteFunc(ks.maxN, func(seq, _ int) bool { return !here[seq] })
	}
	// Differences stored by this round get numbers above their chunk's largest.
	next := map[int]int{}
	for seq, n := range ks.maxN {
		next[seq] = n + 1
	}
	var resolved int64
	for {
		u, ok, err := ks.next(ctx)
		if err != nil || !ok {
			return resolved, err
		}
		var found collected
		if _, err := rc.cmp.compare(ctx, t, u, &found); err != nil {
			return resolved, err
		}
		var news []storedDiff
		for _, d := range found {
			if c, ok := u.found.chunkOf(t.plan, d); ok {
				news = append(news, newStoredDiff(c, next[c], d))
				next[c]++
			}
		}
		n, err := rc.st.replaceDifferences(ctx, t.idx, u.found.refs, false, u.found.rows, news, rc.confirming)
		if err != nil {
			return resolved, err
		}
		resolved += n
	}
}

// keyless re-checks a keyless table chunk by chunk: a chunk equal now has its differences
// resolved; one that still differs is compared again (diffKeyless), and of its
// differences only the rows still missing or extra stay, each at most as often as it was
// found before (a row that differs now and did not then was written since: the re-check
// resolves differences, it never adds one). A chunk whose stored differences exceed
// recheckBatchBytes, or whose comparison reaches Config.MaxDifferences, keeps them as
// found: both bound what the re-check holds in memory.
func (rc *rechecker) keyless(ctx context.Context, t *target) (int64, error) {
	chunks, err := rc.st.chunksWithDifferences(ctx, t.idx)
	if err != nil {
		return 0, err
	}
	here := rc.track.foundChunks(t.idx)
	var resolved int64
	for _, c := range chunks {
		if rc.confirming && !here[c.Seq] {
			continue
		}
		u, d, err := rc.cmp.checksumBoth(ctx, t, c.keyRange)
		if err != nil {
			return resolved, err
		}
		var news []storedDiff
		if !sameChecksum(u, d) {
			var ok bool
			news, ok, err = rc.redrillKeyless(ctx, t, c)
			if err != nil {
				return resolved, err
			}
			if !ok {
				continue
			}
		}
		n, err := rc.st.replaceDifferences(ctx, t.idx, []diffRef{{seq: c.Seq}}, true, map[int]int64{c.Seq: c.res.differences}, news, rc.confirming)
		if err != nil {
			return resolved, err
		}
		resolved += n
	}
	return resolved, nil
}

// redrillKeyless compares keyless chunk c again and returns the differences to store in
// place of its stored ones: those found again, each row at most as often as before. ok is
// false when the chunk keeps its differences as found (see keyless).
func (rc *rechecker) redrillKeyless(ctx context.Context, t *target, c storedChunk) (news []storedDiff, ok bool, err error) {
	p := t.plan
	before := map[string]int64{} // kind and row → copies found before
	bytes := 0
	limit := -1
	// A keyless row is the same row when its values are exactly the same: the exact key
	// of every column (keys.go), after its kind.
	rowKey := func(kind DiffKind, rk string) string { return string(kind) + "\x00" + rk }
	err = rc.st.scanDifferences(ctx, t.idx, fmt.Sprintf(" AND chunk_seq = %d", c.Seq), int64(c.Seq), -1, &limit, func(_, n int64, d Difference, fix string) error {
		vals, err := p.keyValues(d)
		if err != nil {
			return fmt.Errorf("difference %d of chunk %d: %w", n, c.Seq, err)
		}
		rk, err := exactKey(vals)
		if err != nil {
			return fmt.Errorf("difference %d of chunk %d: %w", n, c.Seq, err)
		}
		k := rowKey(d.Kind, rk)
		before[k] += int64(max(1, d.Count))
		if bytes += len(fix) + len(k); bytes >= recheckBatchBytes {
			return errBatchFull
		}
		return nil
	})
	switch {
	case errors.Is(err, errBatchFull):
		rc.log.Info("re-check keeps a keyless chunk's differences as found: too many to hold",
			"table", t.name, "chunk", c.Seq, "differences", c.res.differences)
		return nil, false, nil
	case err != nil:
		return nil, false, err
	}
	keep := func(kind DiffKind, row []sqlValue, n int64) int64 {
		_, rk := p.keyFor(row)
		k := rowKey(kind, string(rk))
		n = min(n, before[k])
		before[k] -= n
		return n
	}
	emit := func(d Difference) error {
		news = append(news, newStoredDiff(c.Seq, len(news), d))
		return nil
	}
	err = rc.cmp.diffKeyless(ctx, t, c.keyRange, emit, keep)
	switch {
	case errors.Is(err, errMaxDifferences):
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("chunk %d: %w", c.Seq, err)
	}
	return news, true, nil
}
