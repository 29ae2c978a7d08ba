package verify

// scheduler.go owns when runs start: the manual triggers Run serves, the cron schedules
// (each fire claimed by one daemon, claims.go), the continuous loop, and the set of runs
// under way, one per trigger (a trigger never overlaps itself). A run it starts is
// executed by the executor (executor.go); it must not run one itself.

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/robfig/cron/v3"
	"golang.org/x/sync/errgroup"

	"github.com/tidb-parity/parity/internal/retry"
)

// scheduler starts runs and knows which run.
type scheduler struct {
	cfg   Config
	log   *slog.Logger
	crons []cron.Schedule // parsed cfg.Schedules
	reqs  chan *manualReq
	count *stats

	// Set by Service.Run before it serves triggers.
	exec   *executor
	hist   *history
	lock   *instanceLock
	histDB *sql.DB // reads whether other instances hold their locks

	mu     sync.Mutex
	active map[string]*runState // by trigger
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

func newScheduler(cfg Config, log *slog.Logger, crons []cron.Schedule, count *stats) *scheduler {
	return &scheduler{cfg: cfg, log: log, crons: crons, reqs: make(chan *manualReq), count: count,
		active: map[string]*runState{}}
}

// serve starts the runs asked for (Service.trigger) in g until ctx ends.
func (sc *scheduler) serve(ctx context.Context, g *errgroup.Group) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-sc.reqs:
			kind, name := m.kind, m.name
			if kind == "" {
				kind, name = TriggerManual, TriggerManual
			}
			st, err := sc.begin(ctx, g, kind, name, "", m.req)
			m.reply <- manualReply{started: st, err: err}
		}
	}
}

// begin starts a run of trigger name (kind: schedule, continuous or manual) in g, with
// run id runID (a new one when empty), unless the trigger's previous run is still
// running (*BusyError).
func (sc *scheduler) begin(ctx context.Context, g *errgroup.Group, kind, name, runID string, req Request) (*Started, error) {
	if req.Scope == "" {
		req.Scope = sc.cfg.Scope
	}
	if len(req.Tables) == 0 {
		req.Tables = sc.cfg.Tables
	}
	sc.mu.Lock()
	if cur, busy := sc.active[name]; busy {
		sc.mu.Unlock()
		return nil, &BusyError{Trigger: name, RunID: cur.initial.RunID}
	}
	if runID == "" {
		runID = newRunID()
	}
	st := &runState{
		rec: &RunRecord{RunID: runID, Changefeed: sc.cfg.Changefeed, Trigger: name, TriggerKind: kind, Instance: sc.cfg.Instance,
			Scope: req.Scope, Patterns: req.Tables, State: StateRunning, StartedAt: time.Now()},
		done:   make(chan struct{}),
		queued: true,
		opt:    sc.cfg.options(req),
	}
	st.initial = *st.rec
	rctx, cancel := context.WithCancelCause(ctx)
	st.cancel = cancel
	sc.active[name] = st
	sc.mu.Unlock()
	g.Go(func() error {
		defer cancel(nil)
		defer sc.ended(st)
		sc.exec.execute(rctx, st)
		return nil
	})
	return &Started{RunID: runID, st: st}, nil
}

// ended counts how st ended and releases its trigger in one step under sc.mu (Stats,
// read under it too, sees a run under way or counted, never both or neither), then
// its waiters. Lock order: sc.mu, then the stats' or a run's own.
func (sc *scheduler) ended(st *runState) {
	rec := st.rec
	final := *rec
	sc.mu.Lock()
	sc.count.ended(rec)
	delete(sc.active, rec.Trigger)
	sc.mu.Unlock()
	st.final = final
	close(st.done)
}

// byID returns the run runID while this service runs it (queued or running).
func (sc *scheduler) byID(runID string) (*runState, *ActiveRun) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	for _, st := range sc.active {
		if st.initial.RunID == runID {
			a := st.activeOf()
			return st, &a
		}
	}
	return nil, nil
}

// whileRunning calls f with the progress of the runs under way, under the lock ended
// counts a run's end under.
func (sc *scheduler) whileRunning(f func(active []ActiveRun)) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	var out []ActiveRun
	for _, st := range sc.active {
		out = append(out, st.activeOf())
	}
	f(out)
}

// skipped records, as run runID, a firing skipped because the trigger's previous run
// still runs (here or on the daemon busy names).
func (sc *scheduler) skipped(ctx context.Context, kind, runID string, busy *BusyError, req Request) {
	now := time.Now()
	on := ""
	if busy.Instance != "" {
		on = " on daemon " + busy.Instance
	}
	rec := &RunRecord{RunID: runID, Changefeed: sc.cfg.Changefeed, Trigger: busy.Trigger, TriggerKind: kind, Instance: sc.cfg.Instance,
		Scope: req.Scope, Patterns: req.Tables, State: StateSkipped, Result: ResultSkipped, StartedAt: now, FinishedAt: now,
		Error: "skipped: previous run still running (" + busy.RunID + ")" + on}
	if rec.Scope == "" {
		rec.Scope = sc.cfg.Scope
	}
	if len(rec.Patterns) == 0 {
		rec.Patterns = sc.cfg.Tables
	}
	sc.log.Info("verification skipped: previous run still running", "trigger", busy.Trigger, "running_run_id", busy.RunID, "running_instance", busy.Instance)
	if err := sc.hist.start(ctx, rec); err != nil {
		sc.log.Warn("could not record a skipped verification", "trigger", busy.Trigger, "err", err)
	}
	sc.count.skipped(rec)
}

// scheduleLoop fires sched at the times of its cron schedule. Each fire runs on the
// daemon that claims it (claims.go): here, unless another daemon verifying the
// changefeed claimed it first. The claimer records one row for the fire: the run, or a
// skipped firing while the schedule's previous run still runs on a live daemon.
func (sc *scheduler) scheduleLoop(ctx context.Context, g *errgroup.Group, s Schedule, sched cron.Schedule) error {
	req := Request{Scope: s.Scope, Tables: s.Tables}
	log := sc.log.With("schedule", s.Name)
	for {
		next := sched.Next(time.Now())
		if next.IsZero() {
			log.Warn("verification schedule never fires again", "cron", s.Cron)
			return nil
		}
		if retry.Sleep(ctx, time.Until(next)) != nil {
			return nil
		}
		runID := newRunID()
		won, err := sc.hist.claim(ctx, s.Name, next, sc.cfg.Instance, runID)
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
			sc.count.firedElsewhere(s.Name, next)
			continue
		}
		busy, err := sc.runningElsewhere(ctx, s.Name)
		if err != nil {
			// Never start beside a run that may still run: skip, and say why.
			busy = &BusyError{Trigger: s.Name, RunID: "unknown: " + err.Error()}
			log.Warn("cannot tell whether the previous run runs on another daemon; skipping the fire", "err", err)
		}
		if busy == nil {
			_, err = sc.begin(ctx, g, "schedule", s.Name, runID, req)
			errors.As(err, &busy)
		}
		if busy != nil {
			sc.skipped(ctx, "schedule", runID, busy, req)
		}
	}
}

// continuousLoop runs a verification, waits verify.continuous-interval after it ended,
// and runs the next.
func (sc *scheduler) continuousLoop(ctx context.Context, g *errgroup.Group) error {
	for {
		st, err := sc.begin(ctx, g, TriggerContinuous, TriggerContinuous, "", Request{})
		if err != nil {
			return nil // only a busy trigger fails, and this loop is its one starter
		}
		if _, err := st.Wait(ctx); err != nil {
			return nil
		}
		if retry.Sleep(ctx, sc.cfg.ContinuousInterval) != nil {
			return nil
		}
	}
}
