package verify

// api.go owns what callers outside the service's own loops ask of it (the daemon's gRPC
// API): a run by id and its cancellation, the history filtered and paged, a run's
// differences and fix SQL, and the request options and error sentinels they share. Runs
// are started by scheduler.go and executed by executor.go; snapshot points are
// points.go, the cutover check cutover.go.

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

// ErrRunNotFound is returned (wrapped, with the id) for a verification run the history
// does not hold.
var ErrRunNotFound = errors.New("verification run not found")

// ErrPastGC is matched (errors.Is) by an error about a TSO TiDB's GC has passed: its
// row versions may be gone, so nothing reads at it. The error's text names the TSO and
// the safe point.
var ErrPastGC = errors.New("TSO is older than TiDB's GC safe point")

// ErrPairPassed is matched (errors.Is) by an error about a pair asked for at exactly a
// TSO (Request.AtTS, CutoverRequest.ExactPair) that the applier has already applied
// beyond: the fallback can no longer be held there. Try again at a newer TSO.
var ErrPairPassed = errors.New("the fallback has applied past the pair's TSO")

// ErrInvalidRequest is matched (errors.Is) by an error about what was asked: a scope, a
// table pattern, a request option or a filter that is none. The error's text names it.
var ErrInvalidRequest = errors.New("invalid verification request")

// errCancelled is the cause of a run ended by Cancel.
var errCancelled = errors.New("cancelled on request")

// sentinelError is err (its text) that also matches a sentinel.
type sentinelError struct{ sentinel, err error }

func (e *sentinelError) Error() string   { return e.err.Error() }
func (e *sentinelError) Unwrap() []error { return []error{e.sentinel, e.err} }

// checkerQuiet is log for the checker's own logs (checkerLog).
func checkerQuiet(log *slog.Logger) *slog.Logger { return slog.New(checkerLog{log.Handler()}) }

func pastGC(err error) error     { return &sentinelError{ErrPastGC, err} }
func invalid(err error) error    { return &sentinelError{ErrInvalidRequest, err} }
func pairPassed(err error) error { return &sentinelError{ErrPairPassed, err} }

// Request fields an invalid request can be about (RequestError.Field), as Request and
// CutoverRequest name them; callers map them to their own field paths.
const (
	FieldScope            = "scope"
	FieldTables           = "tables"
	FieldMaxViewAge       = "max_view_age"
	FieldMaxRowsPerSecond = "max_rows_per_second"
	FieldMinTS            = "min_ts"
	FieldAtTS             = "at_ts"
	FieldUpstreamTS       = "upstream_ts"
	FieldMaxFullAge       = "max_full_age"
	FieldFullTables       = "full_tables"
	FieldWaitTimeout      = "wait_timeout"
)

// RequestError is an invalid request (it matches ErrInvalidRequest) about one field of
// it, Field (FieldScope, …); its text names the value and what was wanted.
type RequestError struct {
	Field string
	Err   error
}

func (e *RequestError) Error() string   { return e.Err.Error() }
func (e *RequestError) Unwrap() []error { return []error{ErrInvalidRequest, e.Err} }

// invalidField is invalid(err) about one request field.
func invalidField(field string, err error) error { return &RequestError{Field: field, Err: err} }

// checkRequest checks a request's scope, tables and options against the service's
// limits; the errors match ErrInvalidRequest.
func (c *Config) checkRequest(req Request) error {
	if req.Scope != "" {
		if err := CheckScope(req.Scope); err != nil {
			return invalidField(FieldScope, err)
		}
	}
	for i, t := range req.Tables {
		if err := checker.CheckTablePattern(t); err != nil {
			return invalidField(FieldTables, fmt.Errorf("tables[%d]: %w", i, err))
		}
	}
	switch v := req.MaxViewAge; {
	case v < 0 || (v > 0 && v < time.Second):
		return invalidField(FieldMaxViewAge, fmt.Errorf("max view age %v: want at least 1s", v))
	case v > c.MaxViewAge:
		return invalidField(FieldMaxViewAge, fmt.Errorf("max view age %v is above verify.max-view-age (%v)", v, c.MaxViewAge))
	}
	switch v := req.MaxRowsPerSecond; {
	case v < 0:
		return invalidField(FieldMaxRowsPerSecond, fmt.Errorf("max rows per second %d: must not be negative", v))
	case c.MaxRowsPerSecond > 0 && v > int64(c.MaxRowsPerSecond):
		return invalidField(FieldMaxRowsPerSecond, fmt.Errorf("max rows per second %d is above verify.max-rows-per-second (%d)", v, c.MaxRowsPerSecond))
	}
	for _, f := range []struct {
		field, name string
		ts          uint64
	}{{FieldMinTS, "min ts", req.MinTS}, {FieldAtTS, "at ts", req.AtTS}} {
		if at := tso.Time(f.ts); f.ts > 0 && (at.Year() < 2000 || at.After(time.Now().Add(24*time.Hour))) {
			return invalidField(f.field, fmt.Errorf("%s %d is not a TiDB TSO of now or before (it would be %s)", f.name, f.ts, at.UTC().Format(time.RFC3339)))
		}
	}
	if req.AtTS > 0 && req.MinTS > 0 {
		return invalidField(FieldAtTS, errors.New("at ts and min ts: give one of them"))
	}
	return nil
}

// options are a run's options from req (checked) and the service's defaults.
func (c *Config) options(req Request) runOptions {
	o := runOptions{maxViewAge: c.MaxViewAge, rate: c.MaxRowsPerSecond, minTS: req.MinTS, atTS: req.AtTS, atTSWait: req.AtTSWait, whole: req.WholeTables}
	if req.MaxViewAge > 0 {
		o.maxViewAge = req.MaxViewAge
	}
	if req.MaxRowsPerSecond > 0 {
		o.rate = int(req.MaxRowsPerSecond)
	}
	return o
}

// UpstreamTSO returns TiDB's current TSO.
func (s *Service) UpstreamTSO(ctx context.Context) (uint64, error) {
	if err := s.serving(); err != nil {
		return 0, err
	}
	return s.db.upstreamTSO(ctx, s.cfg.QueryTimeout)
}

// Ended returns a channel closed when the run runID has ended (its end recorded in the
// history, Get returns it ended), while this service runs it, queued or running; nil
// when it does not (an unknown run, one that has ended, one another daemon runs). A
// watcher wakes on it for the run's final state instead of polling for it.
func (s *Service) Ended(runID string) <-chan struct{} {
	if st, _ := s.sched.byID(runID); st != nil {
		return st.done
	}
	return nil
}

// Get returns the run runID as the history holds it, with its pairs and tables, and
// while this service runs it its progress (nil once it ended). The counts of a running
// run's record are its progress so far. A queued run, not yet in the history, is
// returned as it was asked for. Unknown: ErrRunNotFound.
func (s *Service) Get(ctx context.Context, runID string) (RunRecord, *ActiveRun, error) {
	if err := s.serving(); err != nil {
		return RunRecord{}, nil, err
	}
	st, a := s.sched.byID(runID)
	runs, err := s.hist.list(ctx, 1, runID)
	if err != nil {
		return RunRecord{}, nil, err
	}
	if len(runs) == 0 {
		if st != nil {
			return st.initial, a, nil
		}
		if st, a := s.sched.byID(runID); st != nil { // it left the queue meanwhile
			return st.initial, a, nil
		}
		return RunRecord{}, nil, fmt.Errorf("run %s: %w", runID, ErrRunNotFound)
	}
	rec := runs[0]
	if rec.State != StateRunning || a == nil {
		return rec, nil, nil
	}
	rec.TablesCompared, rec.RowsChecked, rec.Differences = a.TablesDone, a.RowsChecked, a.Differences
	return rec, a, nil
}

// Cancel stops the run runID, queued or running, and returns its record once it has
// ended: state cancelled, recorded in the history. A run that has ended is returned
// unchanged. Unknown: ErrRunNotFound; a run that another daemon runs is an error.
func (s *Service) Cancel(ctx context.Context, runID string) (RunRecord, error) {
	if err := s.serving(); err != nil {
		return RunRecord{}, err
	}
	st, _ := s.sched.byID(runID)
	if st == nil {
		rec, _, err := s.Get(ctx, runID)
		if err == nil && rec.State == StateRunning {
			return rec, fmt.Errorf("verification run %s is not run by this daemon: cancel it where it runs", runID)
		}
		return rec, err
	}
	s.log.Info("verification cancelled on request", "run_id", runID, "trigger", st.initial.Trigger)
	st.cancel(errCancelled)
	select {
	case <-st.done:
	case <-ctx.Done():
		return RunRecord{}, ctx.Err()
	}
	rec, _, err := s.Get(ctx, runID)
	if err != nil {
		return st.final, nil
	}
	return rec, nil
}

// ListFilter selects runs of the history. Zero fields select all.
type ListFilter struct {
	// State and Trigger are a run's state (running, done, failed, cancelled, skipped)
	// and trigger (a schedule's name, continuous, manual, cutover-check).
	State, Trigger string
	// StartedAfter and StartedBefore bound when runs started: at or after, before.
	StartedAfter, StartedBefore time.Time
	// Offset skips that many runs; Limit returns at most that many (0: 50; at most
	// 1000).
	Offset, Limit int
}

// ListLimit is the most runs List returns at once.
const ListLimit = 1000

// List returns the changefeed's runs that f selects, newest first (by start), with
// their pairs and tables. Queued runs are not in the history yet (Stats().Active and
// Get show them).
func (s *Service) List(ctx context.Context, f ListFilter) ([]RunRecord, error) {
	if err := s.serving(); err != nil {
		return nil, err
	}
	switch {
	case f.Offset < 0:
		return nil, invalid(fmt.Errorf("offset %d: must not be negative", f.Offset))
	case f.Limit < 0 || f.Limit > ListLimit:
		return nil, invalid(fmt.Errorf("limit %d: want 1 to %d (0: 50)", f.Limit, ListLimit))
	case f.Limit == 0:
		f.Limit = 50
	}
	switch f.State {
	case "", StateRunning, StateDone, StateFailed, StateCancelled, StateSkipped:
	default:
		return nil, invalid(fmt.Errorf("state %q: want running, done, failed, cancelled or skipped", f.State))
	}
	ids, err := s.hist.ids(ctx, f)
	if err != nil {
		return nil, err
	}
	out := make([]RunRecord, 0, len(ids))
	for _, id := range ids {
		runs, err := s.hist.list(ctx, 1, id)
		if err != nil {
			return nil, err
		}
		out = append(out, runs...)
	}
	return out, nil
}

// runTables returns the tables of rec that patterns select (all when empty) and whose
// checker run stored differences; a pattern that is none, or matches none of the run's
// tables, is an error (ErrInvalidRequest).
func runTables(rec RunRecord, patterns []string) ([]TableRecord, error) {
	matched := make([]bool, len(patterns))
	for i, p := range patterns {
		if err := checker.CheckTablePattern(p); err != nil {
			return nil, invalidField(FieldTables, fmt.Errorf("tables[%d]: %w", i, err))
		}
	}
	var out []TableRecord
	for _, t := range rec.Tables {
		ok := len(patterns) == 0
		for i, p := range patterns {
			if checker.MatchTable(p, t.Schema, t.Table) {
				matched[i], ok = true, true
			}
		}
		if ok && t.DiffRunID != "" && t.Differences > 0 {
			out = append(out, t)
		}
	}
	for i, m := range matched {
		if !m {
			names := make([]string, len(rec.Tables))
			for j, t := range rec.Tables {
				names[j] = t.Schema + "." + t.Table
			}
			return nil, invalidField(FieldTables, fmt.Errorf("table %s is not among the tables of verification run %s (%s)", patterns[i], rec.RunID, strings.Join(names, ", ")))
		}
	}
	return out, nil
}

// Differences returns the differences the verification run runID stored, across its
// tables' checker runs (TableRecord.DiffRunID), in the run's table order and each
// table's key order; tables ("schema.table" patterns) keeps those tables' only. A
// runID that is no verification run is read as a `parity diff` run kept in the meta
// schema (what repair takes too). Unknown: ErrRunNotFound; still running:
// checker.ErrRunRunning; a table the run did not compare: ErrInvalidRequest.
func (s *Service) Differences(ctx context.Context, runID string, tables []string) ([]checker.StoredDifference, error) {
	if err := s.serving(); err != nil {
		return nil, err
	}
	rec, err := s.hist.finished(ctx, runID)
	if errors.Is(err, ErrRunNotFound) {
		ds, err := checker.RunDifferences(ctx, s.db.meta, s.cfg.MetaSchema, runID, tables)
		switch {
		case errors.Is(err, checker.ErrRunNotFound):
			return nil, fmt.Errorf("run %s not found: neither a verification run (parity verify history) nor a diff run in meta schema %s: %w", runID, s.cfg.MetaSchema, ErrRunNotFound)
		case errors.Is(err, checker.ErrTableNotInRun):
			return nil, invalidField(FieldTables, err)
		}
		return ds, err
	}
	if err != nil {
		return nil, err
	}
	ts, err := runTables(rec, tables)
	if err != nil {
		return nil, err
	}
	var out []checker.StoredDifference
	for _, t := range ts {
		ds, err := checker.RunDifferences(ctx, s.db.meta, s.cfg.MetaSchema, t.DiffRunID, nil)
		if err != nil {
			return nil, fmt.Errorf("table %s.%s of verification run %s: %w", t.Schema, t.Table, runID, err)
		}
		out = append(out, ds...)
	}
	return out, nil
}

// FixSQL streams the fix SQL of the verification run runID's differences — what
// parity diff writes to its fix files (checker.RunFixSQL) — table by table: emit gets
// the fallback's table ("schema.table") and whole statements ending in ";\n", a table's
// header first. tables, errors: as Differences.
func (s *Service) FixSQL(ctx context.Context, runID string, tables []string, emit func(table, sql string) error) error {
	if err := s.serving(); err != nil {
		return err
	}
	rec, err := s.hist.finished(ctx, runID)
	if err != nil {
		return err
	}
	ts, err := runTables(rec, tables)
	if err != nil {
		return err
	}
	for _, t := range ts {
		if err := checker.RunFixSQL(ctx, s.db.meta, s.cfg.MetaSchema, t.DiffRunID, nil, emit); err != nil {
			return fmt.Errorf("table %s.%s of verification run %s: %w", t.Schema, t.Table, runID, err)
		}
	}
	return nil
}
