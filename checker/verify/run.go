package verify

// run.go owns one run at work (the runner): the table list and one checker diff per
// table at a snapshot pair (pair.go), reporting through the executor's narrow
// interfaces. It must not decide when runs start (scheduler.go) nor compare rows
// itself (the checker does).
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

// runner is one run at work. Its record is its own; what others read of it goes
// through prog and the executor's counters.
type runner struct {
	e    *executor
	rec  *RunRecord
	opt  runOptions
	prog progress
	log  *slog.Logger
	pair *checker.SnapshotPair
}

// run verifies the run's tables; the record (r.rec) collects what it found.
func (r *runner) run(ctx context.Context) error {
	rec := r.rec // its scope was checked where the run was asked for (the request or verify's config)
	defer r.closePair(ctx)
	if err := r.openPair(ctx); err != nil {
		return err
	}
	tables, err := r.listTables(ctx, rec.Patterns)
	if err != nil {
		return err
	}
	r.prog.listed(len(tables))
	var failed []string
	for i, t := range tables {
		if err := ctx.Err(); err != nil {
			return err
		}
		if r.pair != nil && r.pair.Age() >= r.opt.maxViewAge/2 {
			r.log.Debug("snapshot pair past half of verify.max-view-age; taking a new one", "resolved_ts", r.pair.TS, "age", r.pair.Age())
			r.closePair(ctx)
			r.e.count.rotated()
		}
		name := t[0] + "." + t[1]
		r.prog.comparing(name)
		tr := r.compareTable(ctx, i+1, t)
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := r.e.hist.table(ctx, rec.RunID, tr); err != nil {
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
		r.prog.tableDone(i+1, rec.RowsChecked)
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
		tr.Pairs = append(tr.Pairs, len(r.rec.Pairs))
		dc := r.diffConfig(pattern, diffID, log)
		dc.Started = func(id string) { diffID = id }
		src := r.pair.Sources
		src.Meta = r.e.db.meta
		d := checker.NewDiff(dc, &src)
		r.prog.diffing(d)
		tctx, cancel := context.WithCancelCause(ctx)
		watchdog := time.AfterFunc(r.opt.maxViewAge-r.pair.Age(), func() { cancel(errViewExpired) })
		rep, err := d.Run(tctx)
		watchdog.Stop()
		expired := errors.Is(context.Cause(tctx), errViewExpired)
		cancel(nil)
		stats := d.Stats()
		r.prog.diffing(nil)
		r.rec.Throttled += stats.Paused
		tr.DiffRunID = diffID
		if err != nil && expired && ctx.Err() == nil {
			// The view is max-view-age old: never read it again. Finished chunks stay
			// finished in the checker's run, which goes on at a fresh pair.
			log.Info("snapshot pair reached verify.max-view-age during the table; resuming at a fresh pair",
				"resolved_ts", r.pair.TS, "max_view_age", r.opt.maxViewAge, "diff_run_id", diffID, "chunks_done", stats.ChunksDone)
			r.closePair(ctx)
			r.e.count.rotated()
			if stats.ChunksDone <= lastDone {
				stalls++
			} else {
				stalls = 0
			}
			lastDone = stats.ChunksDone
			if stalls >= 2 {
				return fail(fmt.Errorf("no chunk finished within verify.max-view-age (%v) at %d pairs in a row: raise it (or verify.max-rows-per-second)", r.opt.maxViewAge, stalls))
			}
			continue
		}
		if err != nil {
			return fail(tso.Hint(err))
		}
		equal := rep.Equal
		for _, tb := range rep.Tables {
			r.e.count.tableCompared(tb)
			tr.Scope, tr.ScopeFromTs, tr.ScopeUntilTs, tr.ScopeKeys = tb.Scope, tb.ScopeFromTs, tb.ScopeUntilTs, tb.ScopeKeys
			tr.BypassReport = tb.BypassReport
			tr.RowsChecked += tb.RowsChecked
			tr.Differences += tb.DifferencesTotal
			r.rec.Resolved += tb.DifferencesResolved
			r.rec.Unconfirmed += tb.DifferencesUnconfirmed
			equal = equal && tb.Equal()
		}
		for class, n := range rep.DifferencesByClass {
			if class == checker.ClassInFlight || n == 0 {
				continue // resolved by the re-check: not a difference
			}
			if r.rec.DifferencesByClass == nil {
				r.rec.DifferencesByClass = map[string]int64{}
			}
			r.rec.DifferencesByClass[class] += n
		}
		r.rec.RecheckRounds += rep.RecheckRounds
		r.prog.compared(stats.ChunksDone, stats.Chunks, tr.Differences)
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
	cfg := r.e.cfg
	c := checker.DefaultConfig()
	c.Tables = []string{pattern}
	c.MetaSchema = cfg.MetaSchema
	c.Concurrency = cfg.MaxConnections
	c.MaxRowsPerSecond = r.opt.rate
	c.MaxThreadsRunning = cfg.MaxThreadsRunning
	c.QueryTimeout = cfg.QueryTimeout
	c.Changefeed = checker.ChangefeedConfig{ID: cfg.Changefeed, MetaSchema: cfg.MetaSchema, MaxLag: cfg.MaxLag}
	c.Lag = func(context.Context) (time.Duration, error) {
		lag, _ := r.e.lag()
		return lag, nil
	}
	c.Scope = r.rec.Scope
	c.Bypass = r.e.deps.Bypass
	c.WholeTables = r.opt.whole
	c.CaughtUpLag = cfg.CaughtUpLag
	c.Resume = resume
	c.ChunkDone = r.e.count.chunkDone
	c.Logger = slog.New(checkerLog{log.With("verify_run_id", r.rec.RunID).Handler()})
	return c
}

// listTables lists the upstream's tables at the pair that patterns select (and
// verify.exclude does not), in name order.
func (r *runner) listTables(ctx context.Context, patterns []string) ([][2]string, error) {
	cfg := r.e.cfg
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
		if !cfg.verifiable(patterns, s, t) {
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
func (c *Config) verifiable(patterns []string, schema, table string) bool {
	return !systemSchemas[strings.ToLower(schema)] && !strings.EqualFold(schema, c.MetaSchema) && selected(patterns, c.Exclude, schema, table)
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
