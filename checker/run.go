package checker

// run.go owns a run's story and nothing else: store the run (new or resumed), open the
// pair, plan the tables, compare each table's scope on a bounded pool of workers while
// the journal stores their results, confirm (at a snapshot pair) or re-check, report,
// and store how the run ended. A failed chunk is compared again only when its error is
// transient (internal/retry). The work itself is done by the parts it wires together:
// the pair (pair.go), the planner (planner.go), the scopes (scope.go), the comparer
// (comparer.go), the tracker (tracker.go, journal.go, report.go), the confirmation and
// the re-check (recheck.go) and the throttles (throttle.go). It must not hold their
// state.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/retry"
)

// Diff is one diff run whose Stats can be read, from any goroutine, while it runs.
type Diff struct {
	cfg Config
	src *Sources // nil: opened from cfg's DSNs
	cur atomic.Pointer[runner]
}

// NewDiff returns a diff run, the checker's one entry point. With src nil, Run opens
// the sources from cfg's DSNs (each side read at its Snapshot when set), and closes
// them when it returns; the run state goes to cfg.MetaDSN (default: the downstream
// DSN). With src, the run reads the given sources (for callers that hold snapshot
// connections, see newConnSource and OpenSnapshotPair) and cfg's DSNs are not used.
func NewDiff(cfg Config, src *Sources) *Diff { return &Diff{cfg: cfg, src: src} }

// Stats returns the run's counters now (see Stats).
func (d *Diff) Stats() Stats {
	r := d.cur.Load()
	if r == nil {
		return Stats{State: runRunning, Phase: phaseStarting, PhaseTimes: map[Phase]time.Duration{}}
	}
	s := r.track.stats()
	if g := r.gate.Load(); g != nil {
		s.Pauses, s.Paused, s.Pausing = g.stats()
	}
	return s
}

// Run runs the diff once.
func (d *Diff) Run(ctx context.Context) (*Report, error) {
	cfg := d.cfg
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid config: %w", err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if d.src != nil {
		return d.run(ctx, &cfg, *d.src, log)
	}
	src, closeAll, err := openDSNSources(ctx, &cfg, log)
	if err != nil {
		return nil, err
	}
	defer closeAll()
	rep, err := d.run(ctx, &cfg, src, log)
	return rep, snapshotHint(err, &cfg)
}

// RunError is returned when a run stops before finishing; resume it with
// Config.Resume = RunID.
type RunError struct {
	RunID string
	State string // RunFailed or RunCancelled
	Err   error
}

func (e *RunError) Error() string { return fmt.Sprintf("run %s %s: %v", e.RunID, e.State, e.Err) }
func (e *RunError) Unwrap() error { return e.Err }

// runner is the parts of one run, wired together.
type runner struct {
	cfg     *Config
	log     *slog.Logger
	src     Sources
	st      *store
	track   *tracker
	limiter *rateLimiter
	// Set once the pair is open.
	pair *sourcePair
	cmp  *comparer
	gate atomic.Pointer[busyGate]
}

// run stores the run, runs it and reports.
func (d *Diff) run(ctx context.Context, cfg *Config, src Sources, log *slog.Logger) (*Report, error) {
	if src.Upstream == nil || src.Downstream == nil || src.Meta == nil {
		return nil, errors.New("invalid sources: upstream, downstream and meta are required")
	}
	if cfg.Changefeed.MaxLag > 0 && cfg.Lag == nil {
		return nil, errors.New("invalid config: changefeed.max_lag needs a lag source (Config.Lag)")
	}
	start := time.Now()
	st := &store{db: src.Meta, raw: cfg.MetaSchema, schema: ident.Quote(cfg.MetaSchema), tmo: cfg.QueryTimeout}
	if err := st.migrate(ctx); err != nil {
		return nil, err
	}
	if cfg.Resume != "" {
		st.runID = cfg.Resume
		if err := st.resumeRun(ctx, cfg); err != nil {
			return nil, err
		}
	} else {
		st.runID = newRunID()
		if err := st.createRun(ctx, cfg); err != nil {
			return nil, err
		}
	}
	log = log.With("run_id", st.runID)
	track := newTracker(cfg, st, log, start)
	r := &runner{cfg: cfg, log: log, src: src, st: st, track: track, limiter: newRateLimiter(cfg.MaxRowsPerSecond)}
	d.cur.Store(r)
	if cfg.Started != nil {
		cfg.Started(st.runID)
	}
	log.Info("diff started", "resume", cfg.Resume != "", "upstream", src.Upstream.Describe(), "downstream", src.Downstream.Describe())

	err := r.run(ctx)
	state := runDone
	switch {
	case err == nil:
	case ctx.Err() != nil:
		state = RunCancelled
	default:
		state = RunFailed
	}
	if ferr := st.finishRun(ctx, state, err); ferr != nil && err == nil {
		err = ferr
	}
	if err != nil {
		track.finish(state)
		log.Error("diff stopped", "state", state, "err", err)
		return nil, &RunError{RunID: st.runID, State: state, Err: err}
	}
	track.enter(phaseReporting)
	rep, err := track.report(context.WithoutCancel(ctx), r.pair)
	track.finish(state)
	if err != nil {
		return nil, err
	}
	log.Info("diff finished", "equal", rep.Equal, "elapsed", time.Since(track.start).Round(time.Millisecond))
	return rep, nil
}

// run is the story: open the pair, plan, compare every table's scope, confirm or
// re-check.
func (r *runner) run(ctx context.Context) error {
	r.track.enter(phasePlanning)
	pair, err := openPair(ctx, r.cfg, r.src.Upstream, r.src.Downstream, r.log)
	if err != nil {
		return err
	}
	r.pair, r.cmp = pair, newComparer(r.cfg, pair, r.log)
	r.track.opened(pair)
	r.gate.Store(newBusyGate(r.cfg, threadsRunning(pair, downSide), r.log))
	targets, err := (&planner{cfg: r.cfg, pair: pair, st: r.st, log: r.log}).plan(ctx)
	if err != nil {
		return err
	}
	r.track.planned(targets)
	scopes, err := r.resolveScopes(ctx, targets)
	if err != nil {
		return err
	}
	r.track.scoped(scopes)

	// The journal's writer outlives the workers: it stores what they queued, even after a
	// cancellation, and stops the workers if it fails.
	r.track.enter(phaseComparing)
	journal := r.track.openJournal()
	wctx, stopWorkers := context.WithCancel(ctx)
	defer stopWorkers()
	var jg errgroup.Group
	jg.Go(func() error {
		err := journal.run(context.WithoutCancel(ctx))
		if err != nil {
			stopWorkers()
		}
		return err
	})
	err = r.compare(wctx, targets, scopes)
	readEnd := time.Now()
	journal.close()
	if jerr := jg.Wait(); jerr != nil && (err == nil || (ctx.Err() == nil && errors.Is(err, context.Canceled))) {
		err = jerr
	}
	if err != nil {
		return err
	}
	if confirmEnabled(pair) {
		// At a snapshot pair: the differences found are read again at the same pair
		// before they are reported (recheck.go).
		r.track.enter(phaseConfirming)
		if err := (&rechecker{cfg: r.cfg, log: r.log, st: r.st, cmp: r.cmp, track: r.track, confirming: true}).confirm(ctx); err != nil {
			return err
		}
	}
	if recheckEnabled(r.cfg, pair) {
		// The re-check starts once the journal has stored every chunk's result: it
		// updates the chunks' difference counts itself.
		r.track.enter(phaseRechecking)
		if err := (&rechecker{cfg: r.cfg, log: r.log, st: r.st, cmp: r.cmp, track: r.track}).run(ctx, readEnd); err != nil {
			return err
		}
	}
	// The differences are final: classify them, and record the tables found equal at a
	// snapshot pair as verified there.
	cl, err := (&classifier{cfg: r.cfg, log: r.log, st: r.st, track: r.track, pair: r.pair}).classify(ctx)
	if err != nil {
		return err
	}
	r.track.mu.Lock()
	r.track.classification = cl
	r.track.mu.Unlock()
	n, err := r.recordVerified(ctx, targets, scopes)
	if err != nil {
		return err
	}
	if n > 0 {
		r.log.Info("clean verifications recorded", "changefeed", r.cfg.Changefeed.ID, "tables", n)
	}
	return nil
}

// job is a unit to compare, with the table and scope it comes from.
type job struct {
	t  *target
	sc scope
	u  unit
}

// compare runs the producer, which opens each table's scope in turn and hands out its
// units, and Concurrency workers that compare them.
func (r *runner) compare(ctx context.Context, targets []*target, scopes []*tableScope) error {
	jobs := make(chan job, r.cfg.Concurrency*2)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		defer close(jobs)
		for i, t := range targets {
			if t.fatal {
				continue
			}
			var sc scope
			var err error
			if scopes[i].mode == tableKeys {
				sc, err = openKeyListScope(gctx, r.cfg, t, scopes[i], r.st, r.track)
			} else {
				sc, err = openRangeScope(gctx, r.cfg, t, r.pair, r.st, r.track, r.log)
			}
			if err != nil {
				return err
			}
			for {
				u, ok, err := sc.next(gctx)
				if err != nil || !ok {
					if err != nil {
						return err
					}
					break
				}
				select {
				case jobs <- job{t: t, sc: sc, u: u}:
				case <-gctx.Done():
					return gctx.Err()
				}
			}
		}
		return nil
	})
	for range r.cfg.Concurrency {
		g.Go(func() error {
			for j := range jobs {
				if err := r.workWithRetry(gctx, j); err != nil {
					return err
				}
			}
			return nil
		})
	}
	return g.Wait()
}

// chunkRetries is how often a chunk that failed with a transient error (a timeout, a lost
// connection, a lock wait, TiDB's region or store unavailable: retry.Transient) is
// compared again before the run fails; any other error (a syntax error, a missing table)
// fails the run at once. The first retry waits chunkBackoff, each next one twice as long.
const (
	chunkRetries = 2
	chunkBackoff = time.Second
)

func (r *runner) workWithRetry(ctx context.Context, j job) error {
	policy := retry.Policy{MaxRetries: chunkRetries, Backoff: chunkBackoff, MaxBackoff: chunkRetries * chunkBackoff}
	return policy.Do(ctx, func(ctx context.Context) error { return r.work(ctx, j) }, func(attempt int, _ time.Duration, err error) {
		r.log.Warn("chunk failed; retrying", "table", j.t.name, "chunk", j.u.Seq, "attempt", attempt, "err", err)
		r.track.retried()
		// Earlier attempts may have stored differences: the next drops them first.
		j.u.retry = true
	})
}

// Chunk results passed to Config.ChunkDone.
const (
	ChunkEqual     = "equal"
	ChunkDifferent = "different"
	ChunkFailed    = "failed"
)

// work compares one unit once the busy gate lets it, and records its result.
func (r *runner) work(ctx context.Context, j job) (err error) {
	if err := r.gate.Load().wait(ctx); err != nil {
		return err
	}
	var res chunkResult
	if done := r.cfg.ChunkDone; done != nil {
		start := time.Now()
		defer func() {
			switch {
			case err != nil && ctx.Err() != nil: // cancelled: no result
			case err != nil:
				done(ChunkFailed, time.Since(start))
			case res.differences != 0:
				done(ChunkDifferent, time.Since(start))
			default:
				done(ChunkEqual, time.Since(start))
			}
		}()
	}
	if err := r.track.started(ctx, j.u.keyChunk); err != nil {
		return err
	}
	sink := r.track.sink(ctx, j.t, j.u.keyChunk)
	res, err = r.cmp.compare(ctx, j.t, j.u, sink)
	if err != nil {
		return err
	}
	if res, err = sink.close(ctx, res); err != nil {
		return err
	}
	j.sc.feedback(j.u, res)
	if res.differences > 0 {
		r.track.found(j.t.idx, j.u.Seq)
	}
	// The chunk counts as done only once the journal has stored its result (after its
	// differences, stored above).
	if err := r.track.finished(ctx, j.u.keyChunk, res); err != nil {
		return err
	}
	return r.limiter.take(ctx, int(max(res.up.count, res.down.count)))
}
