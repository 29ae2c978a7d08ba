package verify

// run.go owns one run: the snapshot pairs it reads at (each at a TSO the applier's
// resolved ts has passed, refused when TiDB's GC has passed it, recorded in the history
// and the ts-map, and never used once its read view is verify.max-view-age old), the
// table list, and one checker diff per table at a pair. It must not decide when runs
// start (service.go) nor compare rows itself (the checker does).
//
// The checker compares a run's tables on one set of sources, so a run is split by
// table: a new pair is taken between tables once the current one is past half of
// max-view-age, and a table still being compared when its pair reaches max-view-age is
// stopped and its diff resumed (the same checker run: finished chunks stay finished,
// chunks in flight start over) at a fresh pair. Every chunk is thus compared inside one
// pair, and the history lists the pairs each table used.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/internal/tso"
)

// errViewExpired stops a table's diff whose pair reached max-view-age.
var errViewExpired = errors.New("the snapshot pair's read view reached verify.max-view-age")

// pairAttempts bounds the pairs a run tries when the applier applied beyond the TSO
// before its barrier was set (or, without Deps.BarrierPassed, when a barrier failed);
// the first resolvedAttempts are at the applier's resolved ts, the next at TiDB's
// current TSO with the barrier registered first (see openPair), holding the applier at
// most pairPrepWait for the pair's connections.
const (
	pairAttempts     = 6
	resolvedAttempts = 2
	pairPrepWait     = time.Second
)

// resolvedWait bounds how long a run waits for the applier's first resolved ts.
const resolvedWait = time.Minute

// systemSchemas are never verified.
var systemSchemas = map[string]bool{"mysql": true, "information_schema": true, "performance_schema": true,
	"sys": true, "metrics_schema": true}

// runner is one run at work.
type runner struct {
	s    *Service
	st   *runState
	log  *slog.Logger
	pair *checker.SnapshotPair
}

func (r *runner) progress(f func(st *runState)) {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	f(r.st)
}

// run verifies the run's tables; the record (r.st.rec) collects what it found.
func (r *runner) run(ctx context.Context) error {
	rec := r.st.rec
	if err := CheckScope(rec.Scope); err != nil {
		return err
	}
	defer r.closePair(ctx)
	if err := r.openPair(ctx); err != nil {
		return err
	}
	tables, err := r.listTables(ctx, rec.Patterns)
	if err != nil {
		return err
	}
	r.progress(func(st *runState) { st.tables = len(tables) })
	var failed []string
	for i, t := range tables {
		if err := ctx.Err(); err != nil {
			return err
		}
		if r.pair != nil && r.pair.Age() >= r.st.maxViewAge/2 {
			r.log.Debug("snapshot pair past half of verify.max-view-age; taking a new one", "resolved_ts", r.pair.TS, "age", r.pair.Age())
			r.closePair(ctx)
			r.s.mu.Lock()
			r.s.rotations++
			r.s.mu.Unlock()
		}
		name := t[0] + "." + t[1]
		r.progress(func(st *runState) { st.table = name })
		tr := r.compareTable(ctx, i+1, t)
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := r.s.hist.table(ctx, rec.RunID, tr); err != nil {
			r.log.Warn("could not record a table's result", "table", name, "err", err)
		}
		rec.Tables = append(rec.Tables, tr)
		rec.RowsChecked += tr.RowsChecked
		rec.Differences += tr.Differences
		switch tr.Result {
		case ResultFailed:
			failed = append(failed, name+": "+tr.Error)
		case ResultDifferent:
			rec.TablesCompared++
			rec.Result = ResultDifferent
		default:
			rec.TablesCompared++
		}
		r.progress(func(st *runState) { st.tablesDone, st.rowsDone = i+1, rec.RowsChecked })
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d of %d tables failed: %s", len(failed), len(tables), strings.Join(failed, "; "))
	}
	return nil
}

// compareTable compares one table at the current pair (opening one when there is
// none), going on at fresh pairs while its pair's view expires.
func (r *runner) compareTable(ctx context.Context, seq int, t [2]string) TableRecord {
	tr := TableRecord{Seq: seq, Schema: t[0], Table: t[1]}
	fail := func(err error) TableRecord {
		tr.Result, tr.Error = ResultFailed, err.Error()
		return tr
	}
	pattern, err := checker.ExactTablePattern(t[0], t[1])
	if err != nil {
		return fail(err)
	}
	log := r.log.With("table", t[0]+"."+t[1])
	var diffID string
	lastDone, stalls := 0, 0
	for {
		if r.pair == nil {
			if err := r.openPair(ctx); err != nil {
				return fail(err)
			}
		}
		tr.Pairs = append(tr.Pairs, len(r.st.rec.Pairs))
		dc := r.diffConfig(pattern, diffID, log)
		dc.Started = func(id string) { diffID = id }
		src := r.pair.Sources
		src.Meta = r.s.meta
		d := checker.NewDiff(dc, &src)
		r.progress(func(st *runState) { st.diff = d })
		tctx, cancel := context.WithCancelCause(ctx)
		watchdog := time.AfterFunc(r.st.maxViewAge-r.pair.Age(), func() { cancel(errViewExpired) })
		rep, err := d.Run(tctx)
		watchdog.Stop()
		expired := errors.Is(context.Cause(tctx), errViewExpired)
		cancel(nil)
		stats := d.Stats()
		r.progress(func(st *runState) { st.diff = nil })
		r.st.rec.Throttled += stats.Paused
		tr.DiffRunID = diffID
		if err != nil && expired && ctx.Err() == nil {
			// The view is max-view-age old: never read it again. Finished chunks stay
			// finished in the checker's run, which goes on at a fresh pair.
			log.Info("snapshot pair reached verify.max-view-age during the table; resuming at a fresh pair",
				"resolved_ts", r.pair.TS, "max_view_age", r.st.maxViewAge, "diff_run_id", diffID, "chunks_done", stats.ChunksDone)
			r.closePair(ctx)
			r.s.mu.Lock()
			r.s.rotations++
			r.s.mu.Unlock()
			if stats.ChunksDone <= lastDone {
				stalls++
			} else {
				stalls = 0
			}
			lastDone = stats.ChunksDone
			if stalls >= 2 {
				return fail(fmt.Errorf("no chunk finished within verify.max-view-age (%v) at %d pairs in a row: raise it (or verify.max-rows-per-second)", r.st.maxViewAge, stalls))
			}
			continue
		}
		if err != nil {
			return fail(tso.Hint(err))
		}
		equal := rep.Equal
		for _, tb := range rep.Tables {
			r.s.tableDifferences(tb)
			tr.Scope, tr.ScopeFromTs, tr.ScopeUntilTs, tr.ScopeKeys = tb.Scope, tb.ScopeFromTs, tb.ScopeUntilTs, tb.ScopeKeys
			tr.Bypass, tr.BypassNote, tr.BypassKeys, tr.BypassDDL = tb.Bypass, tb.BypassNote, tb.BypassKeys, tb.BypassDDL
			tr.BypassSince, tr.BypassWatched = tb.BypassSince, tb.BypassWatched
			tr.RowsChecked += tb.RowsChecked
			tr.Differences += tb.DifferencesTotal
			r.st.rec.Resolved += tb.DifferencesResolved
			r.st.rec.Unconfirmed += tb.DifferencesUnconfirmed
			r.s.unconfirmed(tb)
			equal = equal && tb.Equal()
		}
		for class, n := range rep.DifferencesByClass {
			if class == checker.ClassInFlight || n == 0 {
				continue // resolved by the re-check: not a difference
			}
			if r.st.rec.DifferencesByClass == nil {
				r.st.rec.DifferencesByClass = map[string]int64{}
			}
			r.st.rec.DifferencesByClass[class] += n
		}
		r.st.rec.RecheckRounds += rep.RecheckRounds
		r.progress(func(st *runState) {
			st.chunksDone += stats.ChunksDone
			st.chunks += stats.Chunks
			st.diffs += tr.Differences
		})
		tr.Result = ResultEqual
		if !equal {
			tr.Result = ResultDifferent
		}
		return tr
	}
}

// diffConfig is the checker's configuration for one table (resume: its diff run to go
// on with, "" for a new one).
func (r *runner) diffConfig(pattern, resume string, log *slog.Logger) checker.Config {
	cfg := r.s.cfg
	c := checker.DefaultConfig()
	c.Tables = []string{pattern}
	c.MetaSchema = cfg.MetaSchema
	c.Concurrency = cfg.MaxConnections
	c.MaxRowsPerSecond = r.st.rate
	c.MaxThreadsRunning = cfg.MaxThreadsRunning
	c.QueryTimeout = cfg.QueryTimeout
	c.Changefeed = checker.ChangefeedConfig{ID: cfg.Changefeed, MetaSchema: cfg.MetaSchema, MaxLag: cfg.MaxLag}
	c.Lag = func(context.Context) (time.Duration, error) {
		lag, _ := r.s.lag()
		return lag, nil
	}
	c.Scope = r.st.rec.Scope
	c.Bypass = r.s.deps.Bypass
	c.WholeTables = r.st.whole
	c.CaughtUpLag = cfg.CaughtUpLag
	c.Resume = resume
	c.ChunkDone = r.s.chunkDone
	c.Logger = slog.New(checkerLog{log.With("verify_run_id", r.st.rec.RunID).Handler()})
	return c
}

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
	cfg := r.s.cfg
	rec := r.st.rec
	waited, err := r.s.waitLag(ctx, r.log)
	rec.Throttled += waited
	if err != nil {
		return err
	}
	quiet := slog.New(checkerLog{r.log.Handler()})
	if len(rec.Pairs) == 0 && r.st.minTS > 0 {
		if err := r.s.waitResolved(ctx, r.st.minTS, r.log); err != nil {
			return err
		}
	}
	var firstErr, lastErr error
	for attempt := 1; attempt <= pairAttempts; attempt++ {
		early := attempt > resolvedAttempts
		ts, err := r.s.pairTS(ctx)
		if err == nil && early {
			ts, err = r.s.upstreamTSO(ctx)
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
		var b checker.Barrierer = r.s.deps.Applier
		var eb *earlyBarrier
		if early {
			eb = holdAt(ctx, r.s.deps.Applier, ts, pairPrepWait)
			b = eb
		}
		p, err := checker.OpenSnapshotPair(ctx, b, checker.SnapshotPairConfig{
			TS: ts, UpstreamDSN: cfg.UpstreamDSN, Downstream: r.s.down, Kill: r.s.kill,
			Conns: cfg.MaxConnections, QueryTimeout: cfg.QueryTimeout,
		})
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
		if ctx.Err() != nil || (r.s.deps.BarrierPassed != nil && !errors.Is(err, r.s.deps.BarrierPassed)) {
			return lastErr
		}
		r.s.mu.Lock()
		r.s.passed++
		r.s.mu.Unlock()
		r.log.Debug("the applier passed the pair's TSO before its barrier; trying a newer one", "resolved_ts", ts, "attempt", attempt)
	}
	if firstErr != lastErr && firstErr.Error() != lastErr.Error() {
		// The first failure is often the cause: later attempts are at newer TSOs (early
		// barriers at TiDB's current one) and fail for their own reasons.
		return fmt.Errorf("no snapshot pair in %d attempts: %w (the first failed with: %v)", pairAttempts, lastErr, firstErr)
	}
	return fmt.Errorf("no snapshot pair in %d attempts: %w", pairAttempts, lastErr)
}

// opened records a new pair.
func (r *runner) opened(ctx context.Context, p *checker.SnapshotPair) {
	rec := r.st.rec
	r.pair = p
	pr := PairRecord{Seq: len(rec.Pairs) + 1, TS: p.TS, Position: p.Position, Pause: p.Pause, OpenedAt: p.OpenedAt}
	rec.Pairs = append(rec.Pairs, pr)
	if rec.FirstTS == 0 || p.TS < rec.FirstTS {
		rec.FirstTS = p.TS
	}
	rec.LastTS = max(rec.LastTS, p.TS)
	rec.MaxPause = max(rec.MaxPause, p.Pause)
	r.log.Debug("snapshot pair opened", "resolved_ts", p.TS, "position", p.Position, "pause", p.Pause)
	if err := r.s.hist.pair(ctx, rec.RunID, pr); err != nil {
		r.log.Warn("could not record a snapshot pair", "resolved_ts", p.TS, "err", err)
	}
	if rt := r.s.deps.RecordTSMap; rt != nil {
		if err := rt(ctx, p.TS, p.Position, "verify"); err != nil {
			r.log.Warn("could not record a snapshot pair in the ts-map", "resolved_ts", p.TS, "err", err)
		}
	}
	r.s.mu.Lock()
	r.s.pairs++
	r.s.pause.observe(p.Pause)
	r.st.pair = p
	r.s.mu.Unlock()
}

// closePair ends the current pair's read view and records when.
func (r *runner) closePair(ctx context.Context) {
	if r.pair == nil {
		return
	}
	if err := r.pair.Close(); err != nil {
		r.log.Warn("closing a snapshot pair", "resolved_ts", r.pair.TS, "err", err)
	}
	rec := r.st.rec
	pr := &rec.Pairs[len(rec.Pairs)-1]
	pr.ClosedAt = time.Now()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := r.s.hist.pairClosed(cctx, rec.RunID, *pr); err != nil {
		r.log.Warn("could not record the end of a snapshot pair", "err", err)
	}
	r.pair = nil
	r.progress(func(st *runState) { st.pair = nil })
}

// listTables lists the upstream's tables at the pair that patterns select (and
// verify.exclude does not), in name order.
func (r *runner) listTables(ctx context.Context, patterns []string) ([][2]string, error) {
	cfg := r.s.cfg
	q, release, err := r.pair.Sources.Upstream.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing upstream tables: %w", err)
	}
	defer release()
	qctx, cancel := context.WithTimeout(ctx, cfg.QueryTimeout)
	defer cancel()
	rows, err := q.QueryContext(qctx, "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_TYPE = 'BASE TABLE' ORDER BY TABLE_SCHEMA, TABLE_NAME")
	if err != nil {
		return nil, fmt.Errorf("listing upstream tables: %w", err)
	}
	defer rows.Close()
	var out [][2]string
	for rows.Next() {
		var s, t string
		if err := rows.Scan(&s, &t); err != nil {
			return nil, fmt.Errorf("listing upstream tables: %w", err)
		}
		if !r.s.verifiable(patterns, s, t) {
			continue
		}
		out = append(out, [2]string{s, t})
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing upstream tables: %w", err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no upstream table matches %s at TSO %d", strings.Join(patterns, ", "), r.pair.TS)
	}
	return out, nil
}

// verifiable reports whether patterns select the upstream table schema.table for
// verification: not a system schema, not the meta schema, not in verify.exclude.
func (s *Service) verifiable(patterns []string, schema, table string) bool {
	return !systemSchemas[strings.ToLower(schema)] && !strings.EqualFold(schema, s.cfg.MetaSchema) && selected(patterns, s.cfg.Exclude, schema, table)
}

func selected(patterns, exclude []string, schema, table string) bool {
	in := false
	for _, p := range patterns {
		if checker.MatchTable(p, schema, table) {
			in = true
			break
		}
	}
	if !in {
		return false
	}
	for _, p := range exclude {
		if checker.MatchTable(p, schema, table) {
			return false
		}
	}
	return true
}

// pairTS returns the TSO to open a pair at: the applier's global resolved ts (or its
// checkpoint, when that is newer), waiting for the first one.
func (s *Service) pairTS(ctx context.Context) (uint64, error) {
	deadline := time.Now().Add(resolvedWait)
	for {
		applied, resolved := s.deps.Applier.Watermarks()
		if ts := max(applied, resolved); ts > 0 {
			return ts, nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("the applier has no resolved ts after %v: no snapshot pair can be opened", resolvedWait)
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return 0, err
		}
	}
}

// waitResolved waits until the applier's resolved ts (or checkpoint) reaches ts: a run's
// first pair at or after a TSO (Request.MinTS).
func (s *Service) waitResolved(ctx context.Context, ts uint64, log *slog.Logger) error {
	logged := false
	for {
		applied, resolved := s.deps.Applier.Watermarks()
		if max(applied, resolved) >= ts {
			return nil
		}
		if !logged {
			log.Info("waiting for the applier to resolve the run's first pair TSO", "min_ts", ts, "resolved_ts", resolved)
			logged = true
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

// upstreamTSO returns TiDB's current TSO: the start ts of a new transaction.
func (s *Service) upstreamTSO(ctx context.Context) (uint64, error) {
	return tso.Current(ctx, s.up, min(s.cfg.QueryTimeout, 30*time.Second))
}

// waitLag waits while the applier lags by more than verify.max-lag, returning how long.
func (s *Service) waitLag(ctx context.Context, log *slog.Logger) (time.Duration, error) {
	if s.cfg.MaxLag <= 0 {
		return 0, nil
	}
	start := time.Now()
	logged := false
	defer func() {
		w := time.Since(start)
		if logged {
			s.mu.Lock()
			s.throttled += w
			s.mu.Unlock()
			log.Info("applier caught up; verification goes on", "waited", w.Round(time.Millisecond))
		}
	}()
	for {
		lag, ok := s.lag()
		if !ok || lag <= s.cfg.MaxLag {
			if !logged {
				return 0, nil
			}
			return time.Since(start), nil
		}
		if !logged {
			log.Info("applier lagging; verification waits", "lag", lag.Round(time.Millisecond), "max_lag", s.cfg.MaxLag)
			logged = true
		}
		if err := sleep(ctx, time.Second); err != nil {
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
