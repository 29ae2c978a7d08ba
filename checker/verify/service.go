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
// Files: service.go (the service: triggers, the run bound, the loops that own every
// goroutine), run.go (one run: pairs, rotation, a diff per table), history.go (the
// meta schema tables), fires.go (several daemons on one changefeed: the instance lock
// and the claims that run each schedule fire once), api.go (runs by id, cancel, list,
// snapshot points, differences and fix SQL, request options: what the gRPC API asks),
// cutover.go (the cutover check), stats.go (Stats and freshness), config.go.
package verify

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/robfig/cron/v3"
	"golang.org/x/sync/errgroup"

	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/internal/instance"
	"github.com/tidb-parity/parity/internal/metaschema"
	"github.com/tidb-parity/parity/internal/tso"
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
// History may be called from other goroutines.
type Service struct {
	cfg   Config
	deps  Deps
	log   *slog.Logger
	crons []cron.Schedule // parsed cfg.Schedules

	started atomic.Bool
	ready   chan struct{} // closed once Run serves triggers
	done    chan struct{} // closed when Run returned
	reqs    chan *manualReq
	slots   chan struct{} // verify.max-concurrent-runs

	// Set by Run before ready is closed; closed when it returns.
	down, kill, meta, histDB *sql.DB
	up                       *sql.DB // TiDB's current TSO
	lockDB                   *sql.DB // the instance lock's connection
	hist                     *history
	lock                     *instanceLock

	mu           sync.Mutex
	active       map[string]*runState // by trigger
	runs         map[[2]string]int64  // (trigger, result) → runs
	rows         int64
	diffs        int64
	diffsByClass map[string]int64
	pairs        int64
	rotations    int64
	passed       int64
	pause        Histogram
	throttled    time.Duration
	lastRun      *RunRecord
	covered      uint64
	cleanID      string
	lastErr      string
	obs          observed // stats.go: more counts for the metrics
}

type manualReq struct {
	req Request
	// kind and name are the trigger's (TriggerManual when empty).
	kind, name string
	reply      chan manualReply
}

type manualReply struct {
	started *Started
	err     error
}

// runState is a run from its trigger to its end.
type runState struct {
	rec  *RunRecord // owned by the run's goroutine; read under Service.mu for Stats
	done chan struct{}
	// final is rec as it ended, set before done is closed.
	final RunRecord
	// initial is rec as the run was created (immutable: Get reads it for a queued run).
	initial RunRecord
	// cancel ends the run (Cancel: errCancelled).
	cancel context.CancelCauseFunc
	// The request's options, with the service's defaults applied.
	maxViewAge time.Duration
	minTS      uint64
	rate       int
	whole      []string // Request.WholeTables

	// Progress, under Service.mu.
	queued     bool
	table      string
	tablesDone int
	tables     int
	rowsDone   int64
	diff       *checker.Diff
	pair       *checker.SnapshotPair
	// Chunks of the tables done (the current diff's are added by activeOf) and the
	// differences found so far; started is when the run left the queue.
	chunksDone, chunks int
	diffs              int64
	started            time.Time
}

// New validates cfg and returns a Service.
func New(cfg Config, deps Deps) (*Service, error) {
	if err := cfg.Validate(); err != nil {
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
	s := &Service{
		cfg: cfg, deps: deps, log: deps.Logger.With("changefeed", cfg.Changefeed),
		ready: make(chan struct{}), done: make(chan struct{}), reqs: make(chan *manualReq),
		slots:  make(chan struct{}, cfg.MaxConcurrentRuns),
		active: map[string]*runState{}, runs: map[[2]string]int64{}, diffsByClass: map[string]int64{},
		obs: observed{since: time.Now()},
	}
	for _, sc := range cfg.Schedules {
		p, err := cronParser.Parse(sc.Cron)
		if err != nil { // Validate parsed it already
			return nil, fmt.Errorf("verify.schedule %q: %w", sc.Name, err)
		}
		s.crons = append(s.crons, p)
	}
	return s, nil
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
		s.setErr(err)
		s.log.Warn("verification cannot start yet; trying again", "err", err, "retry_in", setupRetry)
		if sleep(ctx, setupRetry) != nil {
			return nil
		}
	}
	s.setErr(nil)
	s.log.Info("verification service started", "instance", s.cfg.Instance, "tables", s.cfg.Tables, "schedules", len(s.cfg.Schedules),
		"continuous_interval", s.cfg.ContinuousInterval, "max_view_age", s.cfg.MaxViewAge)

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		close(s.ready)
		for {
			select {
			case <-gctx.Done():
				return nil
			case m := <-s.reqs:
				kind, name := m.kind, m.name
				if kind == "" {
					kind, name = TriggerManual, TriggerManual
				}
				st, err := s.begin(gctx, g, kind, name, "", m.req)
				m.reply <- manualReply{started: st, err: err}
			}
		}
	})
	g.Go(func() error { return s.keepInstance(gctx) })
	for i, sc := range s.cfg.Schedules {
		g.Go(func() error { return s.scheduleLoop(gctx, g, sc, s.crons[i]) })
	}
	if s.cfg.ContinuousInterval > 0 {
		g.Go(func() error { return s.continuousLoop(gctx, g) })
	}
	if s.cfg.HistoryRetention > 0 {
		g.Go(func() error { return s.pruneLoop(gctx) })
	}
	err := g.Wait()
	s.log.Info("verification service stopped")
	return err
}

// pruneInterval spaces the pruning of the history (verify.history-retention).
const pruneInterval = time.Hour

// pruneLoop deletes the runs past verify.history-retention now and every pruneInterval
// until ctx ends. A failure is logged and tried again at the next interval.
func (s *Service) pruneLoop(ctx context.Context) error {
	for {
		s.pruneHistory(ctx)
		if sleep(ctx, pruneInterval) != nil {
			return nil
		}
	}
}

// pruneHistory deletes the runs that ended more than verify.history-retention ago,
// keeping the newest clean run over verify.tables (freshness after a restart starts
// from it).
func (s *Service) pruneHistory(ctx context.Context) {
	keep := ""
	clean, err := s.hist.lastClean(ctx, s.cfg.Tables)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("verification history not pruned", "err", err)
		}
		return
	}
	if clean != nil {
		keep = clean.RunID
	}
	n, err := s.hist.prune(ctx, s.cfg.MetaSchema, time.Now().Add(-s.cfg.HistoryRetention), keep)
	if n > 0 {
		s.log.Info("pruned verification runs past the history's retention", "runs", n, "retention", s.cfg.HistoryRetention)
	}
	if err != nil && ctx.Err() == nil {
		s.log.Warn("verification history not pruned", "err", err)
	}
}

// open opens the service's pools (no connection yet).
func (s *Service) open() error {
	mc, err := mysql.ParseDSN(s.cfg.DownstreamDSN)
	if err != nil {
		return fmt.Errorf("downstream.dsn: %w", err)
	}
	mc.DBName = ""
	mc.InterpolateParams = true
	pool := func(c *mysql.Config, n int) (*sql.DB, error) {
		conn, err := mysql.NewConnector(c)
		if err != nil {
			return nil, fmt.Errorf("downstream.dsn: %w", err)
		}
		db := sql.OpenDB(conn)
		db.SetMaxOpenConns(n)
		db.SetMaxIdleConns(n)
		db.SetConnMaxLifetime(30 * time.Minute)
		return db, nil
	}
	runs := s.cfg.MaxConcurrentRuns
	// The snapshot transactions: verify.max-connections per run.
	if s.down, err = pool(mc, runs*s.cfg.MaxConnections); err != nil {
		return err
	}
	// KILL QUERY of a timed-out snapshot query, outside the transactions.
	s.kill, _ = pool(mc, 2)
	// The checker's run state (its journal writes a few statements per chunk).
	s.meta, _ = pool(mc, 2*runs+1)
	// The history, read as UTC times.
	hc := mc.Clone()
	hc.ParseTime, hc.Loc = true, time.UTC
	if hc.Params == nil {
		hc.Params = map[string]string{}
	}
	hc.Params["time_zone"] = "'+00:00'"
	s.histDB, _ = pool(hc, 2)
	s.hist = newHistory(s.histDB, s.cfg.MetaSchema, s.cfg.Changefeed, min(s.cfg.QueryTimeout, time.Minute))
	s.lockDB, _ = pool(mc, 1)
	s.lock = &instanceLock{db: s.lockDB, schema: s.cfg.MetaSchema, cf: s.cfg.Changefeed, self: s.cfg.Instance,
		timeout: min(s.cfg.QueryTimeout, 30*time.Second)}
	uc, err := mysql.ParseDSN(s.cfg.UpstreamDSN)
	if err != nil {
		return fmt.Errorf("upstream.dsn: %w", err)
	}
	uc.DBName = ""
	if s.up, err = pool(uc, 1); err != nil {
		return err
	}
	return nil
}

func (s *Service) close() {
	if s.lock != nil {
		s.lock.close()
	}
	for _, db := range []*sql.DB{s.down, s.kill, s.meta, s.histDB, s.up, s.lockDB} {
		if db != nil {
			_ = db.Close()
		}
	}
}

// setup migrates the meta schema, takes the instance lock, closes the runs a previous
// process (of this instance, or of a stopped one) left running and reads the last clean
// verification.
func (s *Service) setup(ctx context.Context) error {
	if err := metaschema.Migrate(ctx, s.meta, s.cfg.MetaSchema, min(s.cfg.QueryTimeout, time.Minute)); err != nil {
		return err
	}
	if err := s.lock.hold(ctx); err != nil {
		// keepInstance reports it and tries again; runs go on meanwhile.
		s.log.Warn("verification instance lock not held yet", "instance", s.cfg.Instance, "err", err)
	}
	if err := s.interrupted(ctx); err != nil {
		return err
	}
	clean, err := s.hist.lastClean(ctx, s.cfg.Tables)
	if err != nil {
		return err
	}
	if clean != nil {
		s.mu.Lock()
		s.covered, s.cleanID, s.obs.cleanAt = clean.FirstTS, clean.RunID, clean.FinishedAt
		s.mu.Unlock()
	}
	return nil
}

func (s *Service) setErr(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastErr = ""
	if err != nil {
		s.lastErr = err.Error()
	}
}

// Trigger starts a manual run and returns it; a *BusyError when the previous manual run
// is still running, ErrNotRunning when the service does not serve triggers.
func (s *Service) Trigger(ctx context.Context, req Request) (*Started, error) {
	return s.trigger(ctx, "", "", req)
}

// trigger starts a run of trigger name (kind; "" for manual) in Run's group.
func (s *Service) trigger(ctx context.Context, kind, name string, req Request) (*Started, error) {
	if err := s.checkRequest(req); err != nil {
		return nil, err
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
	case s.reqs <- m:
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
	select {
	case <-s.ready:
	default:
		return nil, ErrNotRunning
	}
	select {
	case <-s.done:
		return nil, ErrNotRunning
	default:
	}
	return s.hist.list(ctx, max(limit, 1), runID)
}

// begin starts a run of trigger name (kind: schedule, continuous or manual) in g, with
// run id runID (a new one when empty), unless the trigger's previous run is still
// running (*BusyError).
func (s *Service) begin(ctx context.Context, g *errgroup.Group, kind, name, runID string, req Request) (*Started, error) {
	if req.Scope == "" {
		req.Scope = s.cfg.Scope
	}
	if len(req.Tables) == 0 {
		req.Tables = s.cfg.Tables
	}
	s.mu.Lock()
	if cur, busy := s.active[name]; busy {
		s.mu.Unlock()
		return nil, &BusyError{Trigger: name, RunID: cur.rec.RunID}
	}
	if runID == "" {
		runID = newRunID()
	}
	st := &runState{
		rec: &RunRecord{RunID: runID, Changefeed: s.cfg.Changefeed, Trigger: name, TriggerKind: kind, Instance: s.cfg.Instance,
			Scope: req.Scope, Patterns: req.Tables, State: StateRunning, StartedAt: time.Now()},
		done:   make(chan struct{}),
		queued: true,
	}
	s.options(st, req)
	st.initial = *st.rec
	rctx, cancel := context.WithCancelCause(ctx)
	st.cancel = cancel
	s.active[name] = st
	s.mu.Unlock()
	g.Go(func() error {
		defer cancel(nil)
		s.execute(rctx, st)
		return nil
	})
	return &Started{RunID: st.rec.RunID, st: st}, nil
}

// skipped records, as run runID, a firing skipped because the trigger's previous run
// still runs (here or on the daemon busy names).
func (s *Service) skipped(ctx context.Context, kind, runID string, busy *BusyError, req Request) {
	now := time.Now()
	on := ""
	if busy.Instance != "" {
		on = " on daemon " + busy.Instance
	}
	rec := &RunRecord{RunID: runID, Changefeed: s.cfg.Changefeed, Trigger: busy.Trigger, TriggerKind: kind, Instance: s.cfg.Instance,
		Scope: req.Scope, Patterns: req.Tables, State: StateSkipped, Result: ResultSkipped, StartedAt: now, FinishedAt: now,
		Error: "skipped: previous run still running (" + busy.RunID + ")" + on}
	if rec.Scope == "" {
		rec.Scope = s.cfg.Scope
	}
	if len(rec.Patterns) == 0 {
		rec.Patterns = s.cfg.Tables
	}
	s.log.Info("verification skipped: previous run still running", "trigger", busy.Trigger, "running_run_id", busy.RunID, "running_instance", busy.Instance)
	if err := s.hist.start(ctx, rec); err != nil {
		s.log.Warn("could not record a skipped verification", "trigger", busy.Trigger, "err", err)
	}
	s.mu.Lock()
	s.runs[[2]string{busy.Trigger, ResultSkipped}]++
	s.obs.ended(rec)
	s.mu.Unlock()
}

// scheduleLoop fires sc at the times of its cron schedule. Each fire runs on the
// daemon that claims it (fires.go): here, unless another daemon verifying the changefeed
// claimed it first. The claimer records one row for the fire: the run, or a skipped
// firing while the schedule's previous run still runs on a live daemon.
func (s *Service) scheduleLoop(ctx context.Context, g *errgroup.Group, sc Schedule, sched cron.Schedule) error {
	req := Request{Scope: sc.Scope, Tables: sc.Tables}
	log := s.log.With("schedule", sc.Name)
	for {
		next := sched.Next(time.Now())
		if next.IsZero() {
			log.Warn("verification schedule never fires again", "cron", sc.Cron)
			return nil
		}
		if sleep(ctx, time.Until(next)) != nil {
			return nil
		}
		runID := newRunID()
		won, err := s.hist.claim(ctx, sc.Name, next, s.cfg.Instance, runID)
		if err != nil && !won {
			if ctx.Err() == nil {
				log.Warn("verification fire not run: it could not be claimed", "fire_at", next, "err", err)
			}
			continue
		}
		if err != nil { // claimed; only the cleanup of old claims failed
			log.Warn("verification fire claims not cleaned up", "err", err)
		}
		if !won {
			log.Debug("verification fire claimed by another daemon", "fire_at", next)
			s.mu.Lock()
			s.obs.firedElsewhere(sc.Name, next)
			s.mu.Unlock()
			continue
		}
		busy, err := s.runningElsewhere(ctx, sc.Name)
		if err != nil {
			// Never start beside a run that may still run: skip, and say why.
			busy = &BusyError{Trigger: sc.Name, RunID: "unknown: " + err.Error()}
			log.Warn("cannot tell whether the previous run runs on another daemon; skipping the fire", "err", err)
		}
		if busy == nil {
			_, err = s.begin(ctx, g, "schedule", sc.Name, runID, req)
			errors.As(err, &busy)
		}
		if busy != nil {
			s.skipped(ctx, "schedule", runID, busy, req)
		}
	}
}

// continuousLoop runs a verification, waits verify.continuous-interval after it ended,
// and runs the next.
func (s *Service) continuousLoop(ctx context.Context, g *errgroup.Group) error {
	for {
		st, err := s.begin(ctx, g, TriggerContinuous, TriggerContinuous, "", Request{})
		if err != nil {
			return nil // only a busy trigger fails, and this loop is its one starter
		}
		if _, err := st.Wait(ctx); err != nil {
			return nil
		}
		if sleep(ctx, s.cfg.ContinuousInterval) != nil {
			return nil
		}
	}
}

// execute runs st once a slot is free and records it.
func (s *Service) execute(ctx context.Context, st *runState) {
	rec := st.rec
	log := s.log.With("run_id", rec.RunID, "trigger", rec.Trigger)
	defer s.ended(st)
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		s.cancelledBeforeStart(ctx, rec, log)
		return
	}
	defer func() { <-s.slots }()
	rec.StartedAt = time.Now()
	s.mu.Lock()
	st.queued, st.started = false, rec.StartedAt
	s.mu.Unlock()
	err := ctx.Err()
	if err == nil {
		err = s.hist.start(ctx, rec)
	}
	if err != nil {
		rec.State, rec.Result, rec.Error, rec.FinishedAt = StateFailed, ResultFailed, err.Error(), time.Now()
		if ctx.Err() != nil {
			s.cancelledBeforeStart(ctx, rec, log)
			return
		}
		log.Error("verification run failed", "err", err)
		return
	}
	log.Info("verification started", "scope", rec.Scope, "tables", rec.Patterns)
	err = (&runner{s: s, st: st, log: log}).run(ctx)
	rec.FinishedAt = time.Now()
	switch {
	case err == nil && rec.Differences == 0 && rec.Result == "":
		rec.State, rec.Result = StateDone, ResultEqual
	case err == nil:
		rec.State = StateDone
		if rec.Result == "" {
			rec.Result = ResultDifferent
		}
	case ctx.Err() != nil:
		rec.State, rec.Result, rec.Error = StateCancelled, ResultCancelled, err.Error()
		if cause := context.Cause(ctx); errors.Is(cause, errCancelled) {
			rec.Error = cause.Error()
		}
	default:
		rec.State, rec.Result, rec.Error = StateFailed, ResultFailed, err.Error()
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if ferr := s.hist.finish(fctx, rec); ferr != nil {
		log.Warn("could not record the end of the verification", "err", ferr)
	}
	attrs := []any{"result", rec.Result, "tables", rec.TablesCompared, "rows", rec.RowsChecked, "differences", rec.Differences,
		"pairs", len(rec.Pairs), "first_ts", rec.FirstTS, "elapsed", rec.FinishedAt.Sub(rec.StartedAt).Round(time.Millisecond)}
	switch rec.Result {
	case ResultFailed:
		log.Error("verification failed", append(attrs, "err", rec.Error)...)
	case ResultDifferent:
		log.Warn("verification found differences", attrs...)
	default:
		log.Info("verification finished", attrs...)
	}
}

// cancelledBeforeStart ends rec, which never started, as cancelled; one cancelled on
// request (Cancel) is recorded in the history (the service stopping records nothing).
func (s *Service) cancelledBeforeStart(ctx context.Context, rec *RunRecord, log *slog.Logger) {
	rec.State, rec.Result, rec.Error, rec.FinishedAt = StateCancelled, ResultCancelled, "cancelled before it started", time.Now()
	if !errors.Is(context.Cause(ctx), errCancelled) {
		return
	}
	rec.Error += ": " + errCancelled.Error()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	// A new row; or, when its start was being recorded as it was cancelled, that row.
	if err := s.hist.start(rctx, rec); err != nil {
		if err := s.hist.finish(rctx, rec); err != nil {
			log.Warn("could not record a cancelled verification", "err", err)
		}
	}
}

// ended releases st's trigger and counts how it ended.
func (s *Service) ended(st *runState) {
	rec := st.rec
	s.mu.Lock()
	delete(s.active, rec.Trigger)
	s.runs[[2]string{rec.Trigger, rec.Result}]++
	s.rows += rec.RowsChecked
	s.diffs += rec.Differences
	for class, n := range rec.DifferencesByClass {
		s.diffsByClass[class] += n
	}
	final := *rec
	s.lastRun = &final
	s.obs.ended(rec)
	// A clean full run covers every applied change up to its first pair; so does a clean
	// cdc run (it refuses a table without an earlier clean verification, and covers the
	// changes since it).
	if rec.Result == ResultEqual && (rec.Scope == ScopeFull || rec.Scope == ScopeCDC) && samePatterns(rec.Patterns, s.cfg.Tables) && rec.FirstTS > s.covered {
		s.covered, s.cleanID, s.obs.cleanAt = rec.FirstTS, rec.RunID, rec.FinishedAt
	}
	s.mu.Unlock()
	st.final = final
	close(st.done)
}

func samePatterns(a, b []string) bool { return patternsText(a) == patternsText(b) }

// activeOf returns r's progress; under Service.mu.
func (r *runState) activeOf() ActiveRun {
	a := ActiveRun{RunID: r.initial.RunID, Trigger: r.initial.Trigger, Queued: r.queued, Table: r.table,
		TablesDone: r.tablesDone, Tables: r.tables, RowsChecked: r.rowsDone, ChunksDone: r.chunksDone, ChunksTotal: r.chunks,
		Differences: r.diffs, StartedAt: r.started}
	if r.diff != nil {
		ds := r.diff.Stats()
		a.RowsChecked += ds.RowsChecked
		a.ChunksDone += ds.ChunksDone
		a.ChunksTotal += ds.Chunks
		a.Differences += ds.Differences
	}
	if r.pair != nil {
		a.PairTS, a.PairAge = r.pair.TS, r.pair.Age()
	}
	return a
}

// Stats returns the service's counters now.
func (s *Service) Stats() Stats {
	applied, _ := s.deps.Applier.Watermarks()
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{
		Changefeed: s.cfg.Changefeed, Instance: s.cfg.Instance, Runs: sortedCounts(s.runs), RowsChecked: s.rows, Differences: s.diffs, DifferencesByClass: maps.Clone(s.diffsByClass),
		Pairs: s.pairs, Rotations: s.rotations, BarrierPassed: s.passed, Pause: s.pause.clone(), Throttled: s.throttled,
		Verified: s.covered > 0, CoveredTS: s.covered, CleanRunID: s.cleanID, AppliedTS: applied, LastError: s.lastErr,
	}
	if s.lastRun != nil {
		r := *s.lastRun
		r.Pairs, r.Tables = nil, nil
		st.LastRun = &r
	}
	st.Freshness, _ = Freshness(now, applied, s.covered)
	for _, r := range s.active {
		st.Active = append(st.Active, r.activeOf())
	}
	st.Running = len(st.Active)
	s.fillStats(&st, now)
	return st
}

// lag is the applier's lag now: wall clock minus its checkpoint's time (ok false while
// it has none).
func (s *Service) lag() (time.Duration, bool) {
	applied, _ := s.deps.Applier.Watermarks()
	if applied == 0 {
		return 0, false
	}
	return time.Since(tso.Time(applied)), true
}

func newRunID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "v" + time.Now().UTC().Format("20060102T150405") + "-" + hex.EncodeToString(b[:])
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
