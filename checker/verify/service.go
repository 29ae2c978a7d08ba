// Package verify is verification inside the daemon: a Service that parity serve runs
// beside the applier, which takes snapshot pairs (TiDB read at a TSO T, the fallback
// held at exactly T by the applier's barrier while its read view opens) and runs the
// checker's diff at them — on cron schedules, continuously, or when asked — and keeps
// the run history, the freshness of the last clean verification and its counters.
//
// It is its own package, under checker and beside it, because it joins the checker to
// the applier without either importing the other: it imports checker and internal/*
// only, never cdc. What it needs of the applier is the small Applier interface below
// (the barrier and the watermarks), the applier's "barrier passed" sentinel and a
// ts-map recorder, handed in by cmd/parity, which wires cdc.Replicator to it. It knows
// no metrics library either: the daemon exports Stats. Runs, pairs and table results
// are the "verify" component of internal/metaschema, in the applier's meta schema
// (history.go).
//
// It is built like vdiff's engine over controllers over table differs. service.go is
// the facade that wires the parts and owns every goroutine (Run); it holds no lock:
//   - scheduler.go: when runs start — manual triggers, cron schedules, the continuous
//     loop, one run per trigger; claims.go: each schedule fire claimed by one daemon and
//     the runs stopped daemons left running; instance.go: the instance lock that shows
//     other daemons this one lives.
//   - executor.go: one run's execution (a slot, its history row, how it ended); run.go:
//     its tables, a checker diff each; pair.go: its snapshot pairs and their rotation.
//     A run reports through two narrow interfaces (progress, runCounters) and never
//     takes a lock of the service's. barrier.go: the early barrier of a pair.
//   - stats.go: the counters under their own lock, Stats and freshness (histogram.go).
//   - cutover.go: the cutover gate. points.go: snapshot points.
//   - history.go: the history's store, records.go its tables and records,
//     retention.go its pruning.
//   - api.go: what the gRPC API asks (runs by id, cancel, list, differences, fix SQL,
//     request checks); pools.go: the connection pools; config.go.
package verify

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/robfig/cron/v3"
	"golang.org/x/sync/errgroup"

	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/internal/instance"
	"github.com/tidb-parity/parity/internal/metaschema"
	"github.com/tidb-parity/parity/internal/retry"
)

// Applier is what verification needs of the replicator that applies the changefeed to
// the fallback. cdc.Replicator satisfies it through a small adapter in cmd/parity.
type Applier interface {
	// Barrier holds the fallback exactly at ts while fn runs (checker.Barrierer).
	checker.Barrierer
	// Watermarks returns the applied checkpoint and the global resolved ts (0 while
	// unknown).
	Watermarks() (applied, resolved uint64)
	// WaitApplied returns once every change committed at or before ts is applied (the
	// cutover check waits so), or ctx's error.
	WaitApplied(ctx context.Context, ts uint64) error
}

// Deps are what New needs besides its Config.
type Deps struct {
	// Applier holds the fallback at pair TSOs. Required.
	Applier Applier
	// BarrierPassed is the applier's error (matched with errors.Is) for a barrier at a
	// TSO it has already applied beyond (cdc.ErrBarrierPassed): the pair is tried again
	// at the newer resolved ts. nil: every failed barrier is tried again, a bounded
	// number of times.
	BarrierPassed error
	// RecordTSMap records a pair in the ts-map (cdc.Replicator.RecordTSMap). nil: pairs
	// are not recorded there.
	RecordTSMap func(ctx context.Context, ts uint64, position, source string) error
	// Bypass is the bypass detector (cdc/bypass.Detector): scoped runs and cutover
	// checks add the keys of writes that bypassed parity and vouch only for windows it
	// watched (checker.BypassWatcher). nil: bypass detection is off; a scoped run says
	// so per table and a cutover check does not pass without a full comparison.
	Bypass checker.BypassWatcher
	// Logger receives the service's logs. Default: slog.Default().
	Logger *slog.Logger
}

// Request is a run asked for (a manual trigger): zero fields take verify.scope,
// verify.tables and the service's limits.
type Request struct {
	Scope  string
	Tables []string
	// MaxViewAge is the oldest a pair's read view may be (see verify.max-view-age); at
	// least 1s and at most verify.max-view-age. 0: verify.max-view-age.
	MaxViewAge time.Duration
	// MinTS: the run's first pair is at or after this TSO; the run waits (for the
	// applier's resolved ts to reach it) before it opens one. 0: no bound.
	MinTS uint64
	// AtTS: the run's first pair is at exactly this TSO — a fleet point, where every
	// member's run reads TiDB at one instant. The applier is held there when it arrives
	// (the run waits for it); a fallback already applied beyond it refuses the run
	// (ErrPairPassed, at the trigger or when the pair opens). Not with MinTS. 0: none.
	AtTS uint64
	// AtTSWait bounds, with AtTS, the wait for the applier to reach AtTS: past it the run
	// fails (its error matches context.DeadlineExceeded). 0: the run's context alone.
	AtTSWait time.Duration
	// WholeTables are tables ("schema.table") a scoped run compares whole, as a full
	// run would (checker.Config.WholeTables; the cutover check's full comparison).
	WholeTables []string
	// MaxRowsPerSecond caps the rows the run compares per second; at most
	// verify.max-rows-per-second when that is set. 0: verify.max-rows-per-second.
	MaxRowsPerSecond int64
}

// BusyError is returned when a trigger's previous run is still running: a trigger
// never overlaps itself (a schedule not even across daemons).
type BusyError struct {
	Trigger string
	RunID   string
	// Instance is the other daemon running it; empty when it is this one.
	Instance string
}

func (e *BusyError) Error() string {
	if e.Instance != "" {
		return fmt.Sprintf("the previous %s run (%s) is still running on daemon %s", e.Trigger, e.RunID, e.Instance)
	}
	return fmt.Sprintf("the previous %s run (%s) is still running", e.Trigger, e.RunID)
}

// ErrNotRunning is returned by Trigger when the service does not run (yet, or any
// more).
var ErrNotRunning = errors.New("verification service is not running")

// Started is a run that was started.
type Started struct {
	RunID string
	st    *runState
}

// Wait waits for the run to end and returns its record.
func (s *Started) Wait(ctx context.Context) (RunRecord, error) {
	select {
	case <-s.st.done:
		return s.st.final, nil
	case <-ctx.Done():
		return RunRecord{}, ctx.Err()
	}
}

// Service runs verifications. Create it with New, run it with Run; Trigger, Stats and
// History may be called from other goroutines. It wires its parts (see the package
// comment) and holds no lock of its own.
type Service struct {
	cfg  Config
	deps Deps
	log  *slog.Logger

	started atomic.Bool
	ready   chan struct{} // closed once Run serves triggers
	done    chan struct{} // closed when Run returned

	stats *stats
	sched *scheduler

	// Set by Run before ready is closed; the pools are closed when it returns.
	db   *pools
	hist *history
	lock *instanceLock
	exec *executor
	gate *gate
}

// New returns a Service; cfg is checked (Config.Checked) unless it already was.
func New(cfg Config, deps Deps) (*Service, error) {
	cfg, err := cfg.Checked()
	if err != nil {
		return nil, err
	}
	if !cfg.Enabled {
		return nil, errors.New("verify.enabled: the service runs only when enabled")
	}
	if deps.Applier == nil {
		return nil, errors.New("verify: an applier is required")
	}
	if deps.Logger == nil {
		deps.Logger = slog.Default()
	}
	if cfg.Instance == "" {
		cfg.Instance = instance.DefaultInstance()
	}
	var crons []cron.Schedule
	for _, sc := range cfg.Schedules {
		p, err := cronParser.Parse(sc.Cron)
		if err != nil { // Validate parsed it already
			return nil, fmt.Errorf("verify.schedule %q: %w", sc.Name, err)
		}
		crons = append(crons, p)
	}
	log := deps.Logger.With("changefeed", cfg.Changefeed)
	st := newStats(cfg, crons)
	return &Service{cfg: cfg, deps: deps, log: log, ready: make(chan struct{}), done: make(chan struct{}),
		stats: st, sched: newScheduler(cfg, log, crons, st)}, nil
}

// setupRetry is how long Run waits before it tries again to reach the meta schema.
const setupRetry = 10 * time.Second

// Run serves verification until ctx ends, then waits for the runs under way, which end
// as cancelled, and returns nil. A run's failure is recorded, never returned: nothing in
// verification stops replication. It may be called once.
func (s *Service) Run(ctx context.Context) error {
	if !s.started.CompareAndSwap(false, true) {
		return errors.New("verify: Run called twice")
	}
	defer func() {
		// done first: a call arriving while the pools close is told the service is
		// not running, not that its database is closed. close also closes the pools
		// a failed open had opened.
		close(s.done)
		s.close()
	}()
	if err := s.open(); err != nil {
		return err
	}
	for {
		err := s.setup(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		s.stats.setErr(err)
		s.log.Warn("verification cannot start yet; trying again", "err", err, "retry_in", setupRetry)
		if retry.Sleep(ctx, setupRetry) != nil {
			return nil
		}
	}
	s.stats.setErr(nil)
	s.log.Info("verification service started", "instance", s.cfg.Instance, "tables", s.cfg.Tables, "schedules", len(s.cfg.Schedules),
		"continuous_interval", s.cfg.ContinuousInterval, "max_view_age", s.cfg.MaxViewAge)

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		close(s.ready)
		return s.sched.serve(gctx, g)
	})
	g.Go(func() error { return s.lock.keep(gctx, s.log) })
	for i, sc := range s.cfg.Schedules {
		g.Go(func() error { return s.sched.scheduleLoop(gctx, g, sc, s.sched.crons[i]) })
	}
	if s.cfg.ContinuousInterval > 0 {
		g.Go(func() error { return s.sched.continuousLoop(gctx, g) })
	}
	if s.cfg.HistoryRetention > 0 {
		g.Go(func() error { return s.hist.retain(gctx, s.cfg, s.log) })
	}
	err := g.Wait()
	s.log.Info("verification service stopped")
	return err
}

// open opens the pools (no connection yet) and wires the parts that use them.
func (s *Service) open() error {
	s.db = &pools{}
	if err := s.db.open(s.cfg); err != nil {
		return err
	}
	cfg := s.cfg
	s.hist = newHistory(s.db.hist, cfg.MetaSchema, cfg.Changefeed, min(cfg.QueryTimeout, time.Minute))
	s.lock = &instanceLock{db: s.db.lock, schema: cfg.MetaSchema, cf: cfg.Changefeed, self: cfg.Instance,
		timeout: min(cfg.QueryTimeout, 30*time.Second)}
	s.exec = &executor{cfg: cfg, deps: s.deps, log: s.log, db: s.db, hist: s.hist, count: s.stats,
		slots: make(chan struct{}, cfg.MaxConcurrentRuns)}
	s.sched.exec, s.sched.hist, s.sched.lock, s.sched.histDB = s.exec, s.hist, s.lock, s.db.hist
	s.gate = &gate{cfg: cfg, deps: s.deps, log: s.log, db: s.db, hist: s.hist, runs: s}
	return nil
}

func (s *Service) close() {
	if s.lock != nil {
		s.lock.close()
	}
	if s.db != nil {
		s.db.close()
	}
}

// setup migrates the meta schema, takes the instance lock, closes the runs a previous
// process (of this instance, or of a stopped one) left running and reads the last clean
// verification.
func (s *Service) setup(ctx context.Context) error {
	if err := metaschema.Migrate(ctx, s.db.meta, s.cfg.MetaSchema, min(s.cfg.QueryTimeout, time.Minute)); err != nil {
		return err
	}
	if err := s.lock.hold(ctx); err != nil {
		// lock.keep reports it and tries again; runs go on meanwhile.
		s.log.Warn("verification instance lock not held yet", "instance", s.cfg.Instance, "err", err)
	}
	if err := s.sched.interrupted(ctx); err != nil {
		return err
	}
	clean, err := s.hist.lastClean(ctx, s.cfg.Tables)
	if err != nil {
		return err
	}
	if clean != nil {
		s.stats.setClean(clean)
	}
	return nil
}

// serving returns ErrNotRunning unless Run serves (the pools and the history are open).
func (s *Service) serving() error {
	select {
	case <-s.ready:
	default:
		return ErrNotRunning
	}
	select {
	case <-s.done:
		return ErrNotRunning
	default:
		return nil
	}
}

// Trigger starts a manual run and returns it; a *BusyError when the previous manual run
// is still running, ErrNotRunning when the service does not serve triggers.
func (s *Service) Trigger(ctx context.Context, req Request) (*Started, error) {
	return s.trigger(ctx, "", "", req)
}

// trigger starts a run of trigger name (kind; "" for manual) in Run's group.
func (s *Service) trigger(ctx context.Context, kind, name string, req Request) (*Started, error) {
	if err := s.cfg.checkRequest(req); err != nil {
		return nil, err
	}
	if req.AtTS > 0 {
		if err := checkNotPassed(s.deps.Applier, req.AtTS); err != nil {
			return nil, err
		}
	}
	select {
	case <-s.ready:
	case <-s.done:
		return nil, ErrNotRunning
	default:
		return nil, ErrNotRunning
	}
	m := &manualReq{req: req, kind: kind, name: name, reply: make(chan manualReply, 1)}
	select {
	case s.sched.reqs <- m:
	case <-s.done:
		return nil, ErrNotRunning
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	r := <-m.reply
	return r.started, r.err
}

// History returns the newest limit runs of the changefeed (newest first), or the run
// runID when it is set, with their pairs and tables.
func (s *Service) History(ctx context.Context, limit int, runID string) ([]RunRecord, error) {
	if err := s.serving(); err != nil {
		return nil, err
	}
	return s.hist.list(ctx, max(limit, 1), runID)
}

// Stats returns the service's counters now.
func (s *Service) Stats() Stats {
	applied, _ := s.deps.Applier.Watermarks()
	now := time.Now()
	var st Stats
	s.sched.whileRunning(func(active []ActiveRun) { st = s.stats.read(now, applied, active) })
	st.Changefeed, st.Instance = s.cfg.Changefeed, s.cfg.Instance
	return st
}

func newRunID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "v" + time.Now().UTC().Format("20060102T150405") + "-" + hex.EncodeToString(b[:])
}
