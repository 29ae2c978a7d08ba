package verify

// executor.go owns the execution of one run once the scheduler has started it: the wait
// for a slot (verify.max-concurrent-runs), its row in the history, the runner (run.go)
// and how it ended. A run reports what it does through two narrow interfaces — its
// progress (runState, under the run's own lock) and the service's counters (stats,
// under theirs) — and never takes a lock of the service's. It must not decide when runs
// start (scheduler.go).

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/tidb-parity/parity/checker"
)

// progress is what a run reports of itself as it goes; Stats and Get read it.
type progress interface {
	// started: the run left the queue at.
	started(at time.Time)
	// listed: the run compares n tables; comparing: it begins table name.
	listed(n int)
	comparing(table string)
	// diffing: the table's checker diff under way (nil once it ended).
	diffing(d *checker.Diff)
	// compared adds a table's chunks and differences; tableDone: done tables and rows.
	compared(chunksDone, chunks int, diffs int64)
	tableDone(done int, rows int64)
	// paired: the run's current snapshot pair (nil between pairs).
	paired(p *checker.SnapshotPair)
}

// runCounters is what a run counts for the whole service (stats).
type runCounters interface {
	pairOpened(pause time.Duration)
	rotated()
	barrierPassed()
	throttledFor(d time.Duration)
	chunkDone(result string, took time.Duration)
	tableCompared(tb checker.TableReport)
}

// runOptions are a run's options: its request's, with the service's defaults applied.
type runOptions struct {
	maxViewAge time.Duration
	minTS      uint64
	atTS       uint64        // Request.AtTS
	atTSWait   time.Duration // Request.AtTSWait
	rate       int
	whole      []string // Request.WholeTables
}

// runState is a run from its trigger to its end.
type runState struct {
	rec  *RunRecord // owned by the run's goroutine
	done chan struct{}
	// final is rec as it ended, set before done is closed.
	final RunRecord
	// initial is rec as the run was created (immutable: Get reads it for a queued run).
	initial RunRecord
	// cancel ends the run (Cancel: errCancelled).
	cancel context.CancelCauseFunc
	// opt are the request's options, with the service's defaults applied (immutable).
	opt runOptions

	// Progress, under mu.
	mu         sync.Mutex
	queued     bool
	table      string
	tablesDone int
	tables     int
	rowsDone   int64
	diff       *checker.Diff
	pair       *checker.SnapshotPair
	// Chunks of the tables done (the current diff's are added by activeOf) and the
	// differences found so far; startedAt is when the run left the queue.
	chunksDone, chunks int
	diffs              int64
	startedAt          time.Time
}

var _ progress = (*runState)(nil)

func (r *runState) started(at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.queued, r.startedAt = false, at
}

func (r *runState) listed(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tables = n
}

func (r *runState) comparing(table string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.table = table
}

func (r *runState) diffing(d *checker.Diff) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.diff = d
}

func (r *runState) compared(chunksDone, chunks int, diffs int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.chunksDone += chunksDone
	r.chunks += chunks
	r.diffs += diffs
}

func (r *runState) tableDone(done int, rows int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tablesDone, r.rowsDone = done, rows
}

func (r *runState) paired(p *checker.SnapshotPair) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pair = p
}

// activeOf returns r's progress.
func (r *runState) activeOf() ActiveRun {
	r.mu.Lock()
	defer r.mu.Unlock()
	a := ActiveRun{RunID: r.initial.RunID, Trigger: r.initial.Trigger, Queued: r.queued, Table: r.table,
		TablesDone: r.tablesDone, Tables: r.tables, RowsChecked: r.rowsDone, ChunksDone: r.chunksDone, ChunksTotal: r.chunks,
		Differences: r.diffs, StartedAt: r.startedAt}
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

// executor executes runs: what every run shares (the pools, the history, the counters
// and the slots of verify.max-concurrent-runs).
type executor struct {
	cfg   Config
	deps  Deps
	log   *slog.Logger
	db    *pools
	hist  *history
	count runCounters
	slots chan struct{}
}

// execute runs st once a slot is free and records it.
func (e *executor) execute(ctx context.Context, st *runState) {
	rec := st.rec
	log := e.log.With("run_id", rec.RunID, "trigger", rec.Trigger)
	select {
	case e.slots <- struct{}{}:
	case <-ctx.Done():
		e.cancelledBeforeStart(ctx, rec, log)
		return
	}
	defer func() { <-e.slots }()
	rec.StartedAt = time.Now()
	st.started(rec.StartedAt)
	err := ctx.Err()
	if err == nil {
		err = e.hist.start(ctx, rec)
	}
	if err != nil {
		rec.State, rec.Result, rec.Error, rec.FinishedAt = StateFailed, ResultFailed, err.Error(), time.Now()
		if ctx.Err() != nil {
			e.cancelledBeforeStart(ctx, rec, log)
			return
		}
		log.Error("verification run failed", "err", err)
		return
	}
	log.Info("verification started", "scope", rec.Scope, "tables", rec.Patterns)
	err = (&runner{e: e, rec: rec, opt: st.opt, prog: st, log: log}).run(ctx)
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
	if ferr := e.hist.finish(fctx, rec); ferr != nil {
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
func (e *executor) cancelledBeforeStart(ctx context.Context, rec *RunRecord, log *slog.Logger) {
	rec.State, rec.Result, rec.Error, rec.FinishedAt = StateCancelled, ResultCancelled, "cancelled before it started", time.Now()
	if !errors.Is(context.Cause(ctx), errCancelled) {
		return
	}
	rec.Error += ": " + errCancelled.Error()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	// A new row; or, when its start was being recorded as it was cancelled, that row.
	if err := e.hist.start(rctx, rec); err != nil {
		if err := e.hist.finish(rctx, rec); err != nil {
			log.Warn("could not record a cancelled verification", "err", err)
		}
	}
}
