package checker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
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
// Each batch of re-read differences is swapped in one meta transaction
// (store.replaceDifferences), so a run killed during its re-check and resumed re-checks
// what is left, and never counts a resolved row twice.

// recheckBatch is how many differences one pair of RowsByKeysSQL queries re-reads.
const recheckBatch = 256

// recheckBatchBytes ends a batch early once the fix SQL of its differences (which holds
// their rows) reaches this size: the re-read rows are held until the batch is stored.
const recheckBatchBytes = 8 << 20

var errBatchFull = errors.New("re-check batch full")

// recheckEnabled reports whether the run re-checks its differences: not when both sides
// were read at a snapshot (reading again would read the same data).
func (r *runner) recheckEnabled() bool {
	return r.cfg.RecheckRounds > 0 && (r.cfg.Upstream.Snapshot == "" || r.cfg.Downstream.Snapshot == "")
}

// recheck runs the re-check rounds; readEnd is when the comparison that found the
// differences ended (every row was read before it).
func (r *runner) recheck(ctx context.Context, readEnd time.Time) error {
	for round := 1; round <= r.cfg.RecheckRounds; round++ {
		var pending int64
		var todo []*tableState
		for _, ts := range r.tables {
			ts.mu.Lock()
			if ts.plan != nil && !ts.fatal && ts.differences > 0 {
				pending += ts.differences
				todo = append(todo, ts)
			}
			ts.mu.Unlock()
		}
		if len(todo) == 0 {
			return nil
		}
		if err := r.recheckWait(ctx, readEnd); err != nil {
			return err
		}
		start := time.Now()
		r.reportPhase(true, 0)
		r.log.Info("re-checking differences", "round", round, "differences", pending,
			"since_read", time.Since(readEnd).Round(time.Millisecond))
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(r.cfg.Concurrency)
		var resolvedTotal atomic.Int64
		for _, ts := range todo {
			g.Go(func() error {
				resolved, err := r.recheckTable(gctx, ts)
				if err != nil {
					return fmt.Errorf("re-check %s: %w", ts.name, err)
				}
				ts.mu.Lock()
				ts.differences -= resolved
				ts.mu.Unlock()
				resolvedTotal.Add(resolved)
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			return err
		}
		r.rechecks = round
		r.reportPhase(true, 0)
		r.log.Info("re-check round done", "round", round, "resolved", resolvedTotal.Load(), "remaining", pending-resolvedTotal.Load(),
			"elapsed", time.Since(start).Round(time.Millisecond))
		readEnd = time.Now()
	}
	return nil
}

// recheckWait waits until the differences read before readEnd are due for a re-check:
// RecheckDelay after readEnd and, when the changefeed's lag is known, until its applied
// checkpoint has passed readEnd (at most RecheckMaxWait; then the round goes ahead, and
// rows still in flight stay reported).
func (r *runner) recheckWait(ctx context.Context, readEnd time.Time) error {
	if d := time.Until(readEnd.Add(r.cfg.RecheckDelay)); d > 0 {
		if err := sleep(ctx, d); err != nil {
			return err
		}
	}
	if r.cfg.Lag == nil {
		return nil
	}
	deadline := time.Now().Add(r.cfg.RecheckMaxWait)
	for {
		lag, err := r.cfg.Lag(ctx)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			r.log.Warn("re-check: changefeed lag unknown; re-checking without waiting for it", "changefeed", r.cfg.Changefeed.ID, "err", err)
			return nil
		case time.Since(readEnd) >= lag: // the applied checkpoint, now - lag, is past readEnd
			return nil
		case time.Now().After(deadline):
			r.log.Warn("re-check: changefeed still behind the differences' reads; re-checking anyway",
				"changefeed", r.cfg.Changefeed.ID, "lag", lag.Round(time.Millisecond), "recheck_max_wait", r.cfg.RecheckMaxWait)
			return nil
		}
		r.reportPhase(true, lag)
		if err := sleep(ctx, min(250*time.Millisecond, lag-time.Since(readEnd))); err != nil {
			return err
		}
	}
}

// recheckTable re-checks the stored differences of a table and returns the rows resolved.
// A keyed table's differences are read in batches of up to recheckBatch, across chunks,
// in (chunk, n) order; each batch's rows are read again by key on both sides with one
// query per side and swapped in one meta transaction.
func (r *runner) recheckTable(ctx context.Context, ts *tableState) (int64, error) {
	p := ts.plan
	if p.Keyless {
		return r.recheckKeyless(ctx, ts)
	}
	// Differences stored by this round get numbers above their chunk's largest, and the
	// round skips them: it reads each difference once.
	maxN, err := r.st.maxDifferenceNs(ctx, ts.idx)
	if err != nil {
		return 0, err
	}
	next := map[int]int{}
	for seq, n := range maxN {
		next[seq] = n + 1
	}
	seq, after := int64(-1), int64(-1)
	var resolved int64
	for {
		var old []diffRef
		var keys []Bound
		chunkOf := map[string]int{} // key text → chunk
		oldRows := map[int]int64{}
		bytes := 0
		limit := recheckBatch
		err := r.st.scanDifferences(ctx, ts.idx, "", seq, after, &limit, func(sq, n int64, d Difference, fix string) error {
			seq, after = sq, n
			c, ok := maxN[int(sq)]
			if !ok || int(n) > c {
				return nil // stored by this round
			}
			k, err := p.keyBound(d.Key)
			if err != nil {
				return fmt.Errorf("difference %d of chunk %d: %w", n, sq, err)
			}
			old = append(old, diffRef{seq: int(sq), n: int(n)})
			keys = append(keys, k)
			kt := keyText(d.Key)
			if _, dup := chunkOf[kt]; !dup {
				chunkOf[kt] = int(sq)
			}
			oldRows[int(sq)] += int64(max(1, d.Count))
			if bytes += len(fix); bytes >= recheckBatchBytes {
				return errBatchFull
			}
			return nil
		})
		full := errors.Is(err, errBatchFull)
		if err != nil && !full {
			return resolved, err
		}
		if len(old) > 0 {
			var news []storedDiff
			emit := func(d Difference) error {
				if c, ok := chunkOf[keyText(d.Key)]; ok {
					news = append(news, newStoredDiff(c, next[c], d))
					next[c]++
				}
				return nil
			}
			if err := r.mergeQueries(ctx, ts, p.RowsByKeysSQL(Upstream, keys), p.RowsByKeysSQL(Downstream, keys), emit); err != nil {
				return resolved, err
			}
			n, err := r.st.replaceDifferences(ctx, ts.idx, old, false, oldRows, news)
			if err != nil {
				return resolved, err
			}
			resolved += n
		}
		if !full && limit > 0 { // the scan reached the table's last difference
			return resolved, nil
		}
	}
}

// recheckKeyless re-checks a keyless table chunk by chunk: a chunk equal now has its
// differences resolved; one that still differs is compared again (diffKeyless), and of its
// differences only the rows still missing or extra stay, each at most as often as it was
// found before (a row that differs now and did not then was written since: the re-check
// resolves differences, it never adds one). A chunk whose stored differences exceed
// recheckBatchBytes, or whose comparison reaches Config.MaxDifferences, keeps them as
// found: both bound what the re-check holds in memory.
func (r *runner) recheckKeyless(ctx context.Context, ts *tableState) (int64, error) {
	chunks, err := r.st.chunksWithDifferences(ctx, ts.idx)
	if err != nil {
		return 0, err
	}
	var resolved int64
	for _, c := range chunks {
		u, d, err := r.checksumBoth(ctx, ts, c.Range)
		if err != nil {
			return resolved, err
		}
		var news []storedDiff
		if !sameChecksum(u, d) {
			var ok bool
			news, ok, err = r.redrillKeyless(ctx, ts, c)
			if err != nil {
				return resolved, err
			}
			if !ok {
				continue
			}
		}
		n, err := r.st.replaceDifferences(ctx, ts.idx, []diffRef{{seq: c.Seq}}, true, map[int]int64{c.Seq: c.res.differences}, news)
		if err != nil {
			return resolved, err
		}
		resolved += n
	}
	return resolved, nil
}

// redrillKeyless compares keyless chunk c again and returns the differences to store in
// place of its stored ones: those found again, each row at most as often as before. ok is
// false when the chunk keeps its differences as found (see recheckKeyless).
func (r *runner) redrillKeyless(ctx context.Context, ts *tableState, c storedChunk) (news []storedDiff, ok bool, err error) {
	p := ts.plan
	before := map[string]int64{} // kind and row → copies found before
	bytes := 0
	limit := -1
	rowKey := func(kind DiffKind, k Key) string { return string(kind) + "\x00" + keyText(k) }
	err = r.st.scanDifferences(ctx, ts.idx, fmt.Sprintf(" AND chunk_seq = %d", c.Seq), int64(c.Seq), -1, &limit, func(_, _ int64, d Difference, fix string) error {
		k := rowKey(d.Kind, d.Key)
		before[k] += int64(max(1, d.Count))
		if bytes += len(fix) + len(k); bytes >= recheckBatchBytes {
			return errBatchFull
		}
		return nil
	})
	switch {
	case errors.Is(err, errBatchFull):
		r.log.Info("re-check keeps a keyless chunk's differences as found: too many to hold",
			"table", ts.name, "chunk", c.Seq, "differences", c.res.differences)
		return nil, false, nil
	case err != nil:
		return nil, false, err
	}
	keep := func(kind DiffKind, row []Value, n int64) int64 {
		k := rowKey(kind, p.keyFor(row))
		n = min(n, before[k])
		before[k] -= n
		return n
	}
	emit := func(d Difference) error {
		news = append(news, newStoredDiff(c.Seq, len(news), d))
		return nil
	}
	err = r.diffKeyless(ctx, ts, c.Range, emit, keep)
	switch {
	case errors.Is(err, errMaxDifferences):
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("chunk %d: %w", c.Seq, err)
	}
	return news, true, nil
}

// keyBound reads a stored difference's key (its columns in key order, values as written
// by Literal) back into key values.
func (p *TablePlan) keyBound(k Key) (Bound, error) {
	if len(k) != len(p.Key) {
		return nil, fmt.Errorf("key %s does not match the table's key (%s)", keyColumns(k), strings.Join(p.KeyNames(), ", "))
	}
	b := make(Bound, len(k))
	for i, kv := range k {
		if !strings.EqualFold(kv.Column, p.Columns[p.Key[i]].Name) {
			return nil, fmt.Errorf("key %s does not match the table's key (%s)", keyColumns(k), strings.Join(p.KeyNames(), ", "))
		}
		v, err := parseLiteral(kv.Value)
		if err != nil {
			return nil, fmt.Errorf("key column %s: %w", kv.Column, err)
		}
		b[i] = v
	}
	return b, nil
}

func keyColumns(k Key) string {
	names := make([]string, len(k))
	for i, kv := range k {
		names[i] = kv.Column
	}
	return "(" + strings.Join(names, ", ") + ")"
}

// keyText identifies a key by its columns' literals.
func keyText(k Key) string {
	var b strings.Builder
	for _, kv := range k {
		b.WriteString(kv.Value)
		b.WriteByte(0)
	}
	return b.String()
}
