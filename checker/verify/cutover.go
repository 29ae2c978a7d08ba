package verify

// cutover.go owns the cutover check: the gate a runbook calls before (or after) it
// moves traffic. It waits until the fallback has applied an upstream TSO, finds each
// table's last clean full verification in the history, and verifies in one run, at a
// snapshot pair at or after that TSO, every key that may have changed since the oldest
// of them: the keys the changefeed changed (the ledger) and the keys of writes that
// bypassed parity (the bypass detector's records, checker/bypasskeys.go). A table whose
// window the detector did not watch whole (detection off, started late, a gap) does not
// pass unless the check compares it whole (CutoverRequest.Full, FullTables), and neither
// does one with a DDL made straight in the fallback. The result is the evidence. The run
// is an ordinary run of the service (trigger "cutover-check"), recorded in the history
// and counted in Stats like the others. The gate starts it through the service
// (gateRuns). It must not compare anything itself.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"time"

	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/internal/tso"
)

// TriggerCutoverCheck is the trigger (and trigger kind) of a cutover check's run.
const TriggerCutoverCheck = "cutover-check"

// Cutover check defaults and bounds.
const (
	// DefaultMaxFullAge is CutoverRequest.MaxFullAge's default.
	DefaultMaxFullAge = 7 * 24 * time.Hour
	// DefaultCutoverWait bounds the wait for the TSO to be applied when neither
	// CutoverRequest.WaitTimeout nor the context's deadline does.
	DefaultCutoverWait = 10 * time.Minute
	// CutoverMaxDifferences bounds CutoverResult.Differences (the run has them all).
	CutoverMaxDifferences = 1000
)

// A table's result in a cutover check besides the run's (equal, different, failed).
const (
	// CutoverNoFullDiff: no clean full verification of the table is recorded.
	CutoverNoFullDiff = "no-full-diff"
	// CutoverFullDiffTooOld: its last clean full verification is older than MaxFullAge.
	CutoverFullDiffTooOld = "full-diff-too-old"
	// CutoverNotVerified: the table was selected but the run did not verify it (it no
	// longer exists upstream at the pair, or the run ended first).
	CutoverNotVerified = "not-verified"
	// CutoverBypassUnwatched: writes straight into the fallback since the table's last
	// clean full verification may have been missed (bypass detection off, started after
	// it, or a gap): its keys cannot be vouched for. Enable [bypass] and run a full
	// verification, or ask the check to compare the table whole.
	CutoverBypassUnwatched = "bypass-unwatched"
	// CutoverBypassDDL: a DDL was made straight in the fallback on the table since.
	CutoverBypassDDL = "bypass-ddl"
)

// CutoverRequest asks for a cutover check.
type CutoverRequest struct {
	// UpstreamTS is the upstream TSO the fallback must have applied; with Now, TiDB's
	// current TSO instead (the quiescent point once writes have stopped). Exactly one.
	UpstreamTS uint64
	Now        bool
	// MaxFullAge is the oldest a table's last clean full verification may be (its first
	// pair's time). 0: DefaultMaxFullAge.
	MaxFullAge time.Duration
	// Tables are schema.table patterns. Default: verify.tables.
	Tables []string
	// WaitTimeout bounds the wait for UpstreamTS to be applied. 0: the context's
	// deadline, else DefaultCutoverWait.
	WaitTimeout time.Duration
	// Full compares every selected table whole at the pair, FullTables (schema.table
	// patterns) those it matches: such a table needs no earlier full verification and no
	// watched window (the way out of bypass-unwatched when bypass detection was off or
	// had a gap). It costs a full comparison of those tables.
	Full       bool
	FullTables []string
	// ExactPair takes the check's pair at exactly UpstreamTS (with Now, the TSO read)
	// instead of at or after it: the fleet's one T, where every member is checked at the
	// same instant. The applier is held at the TSO when it gets there (the run waits
	// for it within the call's deadline); a fallback already applied beyond it refuses the check
	// (ErrPairPassed: ask again at a newer TSO).
	ExactPair bool
}

// CutoverResult is a cutover check's evidence. Passed is whether the fallback is proven
// equal to TiDB at Pair.TS for every selected table: each has a clean full verification
// no older than MaxFullAge, and every key changed since (the oldest of them) was found
// equal at Pair.
type CutoverResult struct {
	Passed bool
	// Failures say why it did not pass, one line each.
	Failures []string
	// UpstreamTS is the TSO waited for; Waited how long that took.
	UpstreamTS uint64
	Waited     time.Duration
	// Pair is the run's first snapshot pair (zero when no run was made); RunID the run.
	Pair  Point
	RunID string
	// Tables are each selected table's evidence, in name order.
	Tables []CutoverTable
	// KeysVerified counts the rows the run compared; Differences are the differences
	// it found (at most CutoverMaxDifferences), with their class, and ByClass counts
	// them all by class.
	KeysVerified int64
	Differences  []checker.StoredDifference
	ByClass      map[string]int64
	// Unconfirmed counts rows found different at the pair and equal when read again at
	// it: a snapshot read that was not repeatable (not differences; the check's result
	// stands, but the store deserves a look before cutting over).
	Unconfirmed int64
	// Bypass is "on" when bypass detection ran in this daemon (its records were among the
	// keys), "off" otherwise.
	Bypass string
}

// CutoverTable is one table's evidence in a cutover check.
type CutoverTable struct {
	// Table is schema.table (upstream names).
	Table string
	// LastFullRunID is its last clean full verification ("" when none), LastFullAge
	// that run's age (from its first pair's TSO) when the check started.
	LastFullRunID string
	LastFullAge   time.Duration
	// SinceTS is that run's first pair TSO: every change at or before it was verified
	// equal then. The check's run verifies the keys changed after the oldest SinceTS of
	// all tables (a superset for each).
	SinceTS      uint64
	KeysVerified int64
	Differences  int64
	// Result is equal, different or failed (the run's), or no-full-diff,
	// full-diff-too-old, not-verified, bypass-unwatched or bypass-ddl.
	Result string
	// Full: the table was compared whole, as asked (CutoverRequest.Full, FullTables).
	Full bool
	// The window verified by keys (a table not compared whole): the ledger's changes in
	// (LedgerFromTS, LedgerUntilTS] gave LedgerKeys keys; the bypass detector's records
	// gave BypassKeys more (checker.BypassReport: whether its window was watched, what was
	// not, the DDL made straight in the fallback on the table since).
	LedgerFromTS  uint64
	LedgerUntilTS uint64
	LedgerKeys    int64
	checker.BypassReport
}

// CutoverCheck runs a cutover check (see CutoverRequest and CutoverResult). A check that
// does not pass is a result, not an error; errors are a wait that timed out
// (context.DeadlineExceeded), a request that is none (ErrInvalidRequest), a cutover
// check already running (*BusyError), the service not running (ErrNotRunning), or the
// history or TiDB unreachable. Tables without a recent clean full verification fail the
// check before anything is verified (run a full verification first).
func (s *Service) CutoverCheck(ctx context.Context, req CutoverRequest) (CutoverResult, error) {
	if err := s.serving(); err != nil {
		return CutoverResult{}, err
	}
	return s.gate.check(ctx, req)
}

// UpstreamTables returns TiDB's tables that patterns (default verify.tables) select for
// verification, "schema.table" in name order: a fleet's ownership is checked against
// them. No table selected is ErrInvalidRequest.
func (s *Service) UpstreamTables(ctx context.Context, patterns []string) ([]string, error) {
	if err := s.serving(); err != nil {
		return nil, err
	}
	if len(patterns) == 0 {
		patterns = s.cfg.Tables
	}
	if err := s.cfg.checkRequest(Request{Tables: patterns}); err != nil {
		return nil, err
	}
	return s.gate.upstreamTables(ctx, patterns)
}

// gateRuns is what the gate needs of the service: a run started on a trigger of its
// own, and the differences a run stored.
type gateRuns interface {
	trigger(ctx context.Context, kind, name string, req Request) (*Started, error)
	Differences(ctx context.Context, runID string, tables []string) ([]checker.StoredDifference, error)
}

var _ gateRuns = (*Service)(nil)

// gate is the cutover check.
type gate struct {
	cfg  Config
	deps Deps
	log  *slog.Logger
	db   *pools
	hist *history
	runs gateRuns
}

// check runs a cutover check (Service.CutoverCheck).
func (g *gate) check(ctx context.Context, req CutoverRequest) (CutoverResult, error) {
	switch {
	case req.Now == (req.UpstreamTS != 0):
		return CutoverResult{}, invalidField(FieldUpstreamTS, errors.New("cutover check: give either an upstream TSO or now"))
	case req.MaxFullAge < 0:
		return CutoverResult{}, invalidField(FieldMaxFullAge, fmt.Errorf("cutover check: max full age %v: must not be negative", req.MaxFullAge))
	case req.WaitTimeout < 0:
		return CutoverResult{}, invalidField(FieldWaitTimeout, fmt.Errorf("cutover check: wait timeout %v: must not be negative", req.WaitTimeout))
	}
	patterns := req.Tables
	if len(patterns) == 0 {
		patterns = g.cfg.Tables
	}
	if err := g.cfg.checkRequest(Request{Tables: patterns}); err != nil {
		return CutoverResult{}, err
	}
	for i, t := range req.FullTables {
		if err := checker.CheckTablePattern(t); err != nil {
			return CutoverResult{}, invalidField(FieldFullTables, fmt.Errorf("full tables[%d]: %w", i, err))
		}
	}
	maxAge := req.MaxFullAge
	if maxAge == 0 {
		maxAge = DefaultMaxFullAge
	}
	ts := req.UpstreamTS
	if req.Now {
		var err error
		if ts, err = g.db.upstreamTSO(ctx, g.cfg.QueryTimeout); err != nil {
			return CutoverResult{}, err
		}
	}
	log := g.log.With("trigger", TriggerCutoverCheck, "upstream_ts", ts)
	res := CutoverResult{UpstreamTS: ts, Bypass: "off"}
	if g.deps.Bypass != nil {
		res.Bypass = "on"
	}

	// The fallback has applied ts.
	wait := req.WaitTimeout
	if _, ok := ctx.Deadline(); !ok && wait == 0 {
		wait = DefaultCutoverWait
	}
	wctx, cancel := ctx, context.CancelFunc(func() {})
	if wait > 0 {
		wctx, cancel = context.WithTimeout(ctx, wait)
	}
	start := time.Now()
	var err error
	if req.ExactPair {
		// The run's pair holds the applier at ts when it arrives; it must not pass it.
		cancel()
		err = checkNotPassed(g.deps.Applier, ts)
	} else {
		err = g.deps.Applier.WaitApplied(wctx, ts)
		cancel()
	}
	res.Waited = time.Since(start)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			applied, _ := g.deps.Applier.Watermarks()
			return res, fmt.Errorf("cutover check: TSO %d (%s) not applied within %v (applied: %d, %s): %w",
				ts, tso.Format(ts), res.Waited.Round(time.Millisecond), applied, tso.Format(applied), err)
		}
		return res, fmt.Errorf("cutover check: waiting for TSO %d to be applied: %w", ts, err)
	}
	log.Info("cutover check: upstream TSO applied", "waited", res.Waited.Round(time.Millisecond))

	// Each table's last clean full verification.
	tables, err := g.upstreamTables(ctx, patterns)
	if err != nil {
		return res, err
	}
	full, err := g.hist.lastFull(ctx)
	if err != nil {
		return res, err
	}
	now := time.Now()
	var since uint64
	byName := map[string]int{}
	var whole []string
	for _, name := range tables {
		ct := CutoverTable{Table: name}
		sc, tb, _ := strings.Cut(name, ".")
		ct.Full = req.Full || g.cfg.verifiable(req.FullTables, sc, tb)
		if ct.Full {
			whole = append(whole, name)
			if f, ok := full[name]; ok {
				ct.LastFullRunID, ct.SinceTS, ct.LastFullAge = f.runID, f.firstTS, max(0, now.Sub(tso.Time(f.firstTS)))
			}
		} else if f, ok := full[name]; !ok {
			ct.Result = CutoverNoFullDiff
			res.Failures = append(res.Failures, name+": no clean full verification recorded: run a full verification first")
		} else {
			ct.LastFullRunID, ct.SinceTS, ct.LastFullAge = f.runID, f.firstTS, max(0, now.Sub(tso.Time(f.firstTS)))
			if ct.LastFullAge > maxAge {
				ct.Result = CutoverFullDiffTooOld
				res.Failures = append(res.Failures, fmt.Sprintf("%s: the last clean full verification (%s) is %v old, more than %v: run a full verification",
					name, f.runID, ct.LastFullAge.Round(time.Second), maxAge))
			}
			if since == 0 || f.firstTS < since {
				since = f.firstTS
			}
		}
		byName[name] = len(res.Tables)
		res.Tables = append(res.Tables, ct)
	}
	if len(res.Failures) > 0 {
		log.Warn("cutover check failed before verifying", "failures", len(res.Failures))
		return res, nil
	}

	// One run at a pair at or after ts: the keys changed since the oldest of them, and
	// the tables asked for whole compared whole (a full run when that is all of them).
	run := Request{Scope: fmt.Sprintf("%s:%d", checker.ScopeSince, since), Tables: patterns, MinTS: ts, WholeTables: whole}
	if len(whole) == len(tables) {
		run = Request{Scope: ScopeFull, Tables: patterns, MinTS: ts}
	}
	if req.ExactPair {
		run.MinTS, run.AtTS, run.AtTSWait = 0, ts, wait
		if run.AtTSWait == 0 {
			run.AtTSWait = DefaultCutoverWait
		}
	}
	started, err := g.runs.trigger(ctx, TriggerCutoverCheck, TriggerCutoverCheck, run)
	if err != nil {
		return res, err
	}
	res.RunID = started.RunID
	rec, err := started.Wait(ctx)
	if err != nil {
		// The caller is gone: the check's run is of no use to anyone.
		started.st.cancel(errCancelled)
		return res, err
	}
	if req.ExactPair && len(rec.Pairs) == 0 {
		// The applier passed ts before the run's barrier was set: the caller (a fleet)
		// asks again at a newer TSO; this is no answer about the fallback.
		if err := checkNotPassed(g.deps.Applier, ts); err != nil {
			return res, fmt.Errorf("cutover check: run %s: %w", rec.RunID, err)
		}
	}
	if len(rec.Pairs) > 0 {
		p := rec.Pairs[0]
		res.Pair = Point{TS: p.TS, Position: p.Position, Pause: p.Pause, CreatedAt: p.OpenedAt}
		_, res.Pair.Source = PositionSource(p.Position)
	}
	res.KeysVerified = rec.RowsChecked
	res.ByClass = rec.DifferencesByClass
	res.Unconfirmed = rec.Unconfirmed
	for _, tr := range rec.Tables {
		name := tr.Schema + "." + tr.Table
		i, ok := byName[name]
		if !ok { // created upstream after the tables were listed: no full verification known
			res.Failures = append(res.Failures, name+": no clean full verification recorded: run a full verification first")
			byName[name] = len(res.Tables)
			res.Tables = append(res.Tables, CutoverTable{Table: name, Result: CutoverNoFullDiff, KeysVerified: tr.RowsChecked, Differences: tr.Differences})
			continue
		}
		ct := &res.Tables[i]
		ct.KeysVerified, ct.Differences, ct.Result = tr.RowsChecked, tr.Differences, tr.Result
		ct.LedgerFromTS, ct.LedgerUntilTS, ct.LedgerKeys = tr.ScopeFromTs, tr.ScopeUntilTs, max(0, tr.ScopeKeys-tr.BypassKeys)
		ct.BypassReport = tr.BypassReport
		switch tr.Result {
		case ResultDifferent:
			res.Failures = append(res.Failures, fmt.Sprintf("%s: %d differences", name, tr.Differences))
		case ResultFailed:
			res.Failures = append(res.Failures, fmt.Sprintf("%s: not verified: %s", name, tr.Error))
		}
		if tr.Result == ResultFailed || ct.Full {
			continue
		}
		if len(tr.BypassDDL) > 0 {
			if ct.Result == ResultEqual {
				ct.Result = CutoverBypassDDL
			}
			res.Failures = append(res.Failures, fmt.Sprintf("%s: %s: %d DDL made straight in the fallback since its last clean full verification (%s): its structure may differ from what the changefeed built: repair the fallback's table and run a full verification",
				name, CutoverBypassDDL, len(tr.BypassDDL), strings.Join(tr.BypassDDL, "; ")))
		}
		// Verified by keys (a table compared whole proves itself): only the keys of what
		// was watched.
		if tr.Scope == "keys" && tr.Bypass != checker.BypassIncluded {
			why := tr.BypassNote
			if why == "" {
				why = "bypass detection did not report on the table's window"
			}
			if ct.Result == ResultEqual {
				ct.Result = CutoverBypassUnwatched
			}
			res.Failures = append(res.Failures, fmt.Sprintf("%s: %s: window from TSO %d (%s): %s; writes straight into the fallback in it would not be found — "+
				"enable [bypass] and run a full verification, or run the check with a full comparison of the table (--full-tables %s, or --full)",
				name, CutoverBypassUnwatched, tr.ScopeFromTs, tso.Format(tr.ScopeFromTs), why, name))
		}
	}
	for i := range res.Tables {
		if res.Tables[i].Result == "" {
			res.Tables[i].Result = CutoverNotVerified
			res.Failures = append(res.Failures, res.Tables[i].Table+": not verified by the run")
		}
	}
	sort.Slice(res.Tables, func(i, j int) bool { return res.Tables[i].Table < res.Tables[j].Table })
	switch rec.Result {
	case ResultEqual:
	case ResultDifferent:
		if rec.Differences > 0 {
			if res.Differences, err = g.runs.Differences(ctx, rec.RunID, nil); err != nil {
				return res, err
			}
			res.Differences = res.Differences[:min(len(res.Differences), CutoverMaxDifferences)]
		}
	default:
		msg := "the verification run " + rec.RunID + " ended " + rec.Result
		if rec.Error != "" {
			msg += ": " + rec.Error
		}
		res.Failures = append(res.Failures, msg)
	}
	res.Passed = rec.Result == ResultEqual && len(res.Failures) == 0
	attrs := []any{"run_id", rec.RunID, "passed", res.Passed, "pair_ts", res.Pair.TS, "since_ts", since, "bypass", res.Bypass, "full_tables", len(whole),
		"keys", res.KeysVerified, "differences", rec.Differences, "unconfirmed", rec.Unconfirmed, "waited", res.Waited.Round(time.Millisecond)}
	if res.Passed {
		log.Info("cutover check passed", attrs...)
	} else {
		log.Warn("cutover check failed", append(attrs, "failures", strings.Join(res.Failures, "; "))...)
	}
	return res, nil
}

// upstreamTables lists TiDB's tables now that patterns select for verification, as
// "schema.table", in name order.
func (g *gate) upstreamTables(ctx context.Context, patterns []string) ([]string, error) {
	qctx, cancel := context.WithTimeout(ctx, min(g.cfg.QueryTimeout, time.Minute))
	defer cancel()
	rows, err := g.db.up.QueryContext(qctx, "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_TYPE = 'BASE TABLE' ORDER BY TABLE_SCHEMA, TABLE_NAME")
	if err != nil {
		return nil, fmt.Errorf("listing upstream tables: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var sc, t string
		if err := rows.Scan(&sc, &t); err != nil {
			return nil, fmt.Errorf("listing upstream tables: %w", err)
		}
		if g.cfg.verifiable(patterns, sc, t) {
			out = append(out, sc+"."+t)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing upstream tables: %w", err)
	}
	if len(out) == 0 {
		return nil, invalidField(FieldTables, fmt.Errorf("no upstream table matches %s", strings.Join(patterns, ", ")))
	}
	return out, nil
}
