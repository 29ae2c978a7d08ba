package verify

// history.go owns the run history's store (records.go: its tables and records): what a
// run records there as it goes, reading it back, the runs a list selects, each table's
// last clean full verification; retention.go prunes it. It must not compare anything.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/metaschema"
)

// history writes and reads the history tables.
type history struct {
	db         *sql.DB
	schema     string // quoted
	changefeed string
	timeout    time.Duration
}

func (h *history) q(s string) string { return metaschema.Q(h.schema, s) }

func (h *history) exec(ctx context.Context, q string, args ...any) error {
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	_, err := h.db.ExecContext(ctx, h.q(q), args...)
	return err
}

func newHistory(db *sql.DB, schema, changefeed string, timeout time.Duration) *history {
	return &history{db: db, schema: ident.Quote(schema), changefeed: changefeed, timeout: timeout}
}

func usec(d time.Duration) int64 { return d.Microseconds() }

func patternsText(p []string) string {
	b, _ := json.Marshal(p)
	return string(b)
}

// start records a run that starts (or, with state skipped, a firing that was skipped).
func (h *history) start(ctx context.Context, r *RunRecord) error {
	var fin any
	if !r.FinishedAt.IsZero() {
		fin = r.FinishedAt.UTC()
	}
	var msg any
	if r.Error != "" {
		msg = r.Error
	}
	err := h.exec(ctx, "INSERT INTO %s."+RunsTable+" (run_id, changefeed, trigger_kind, trigger_name, instance, scope, tables, state, result, started_at, finished_at, error) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
		r.RunID, h.changefeed, r.TriggerKind, r.Trigger, r.Instance, r.Scope, patternsText(r.Patterns), r.State, r.Result, r.StartedAt.UTC(), fin, msg)
	if err != nil {
		return fmt.Errorf("recording verification run %s: %w", r.RunID, err)
	}
	return nil
}

// pair records a pair of run id.
func (h *history) pair(ctx context.Context, runID string, p PairRecord) error {
	err := h.exec(ctx, "INSERT INTO %s."+PairsTable+" (run_id, seq, upstream_ts, downstream_pos, pause_us, opened_at) VALUES (?,?,?,?,?,?)",
		runID, p.Seq, p.TS, p.Position, usec(p.Pause), p.OpenedAt.UTC())
	if err != nil {
		return fmt.Errorf("recording snapshot pair %d of run %s: %w", p.Seq, runID, err)
	}
	return nil
}

// pairClosed records when a pair's read view ended.
func (h *history) pairClosed(ctx context.Context, runID string, p PairRecord) error {
	err := h.exec(ctx, "UPDATE %s."+PairsTable+" SET closed_at=? WHERE run_id=? AND seq=?", p.ClosedAt.UTC(), runID, p.Seq)
	if err != nil {
		return fmt.Errorf("recording snapshot pair %d of run %s: %w", p.Seq, runID, err)
	}
	return nil
}

// table records a table's result.
func (h *history) table(ctx context.Context, runID string, t TableRecord) error {
	var msg any
	if t.Error != "" {
		msg = t.Error
	}
	pairs := make([]string, len(t.Pairs))
	for i, p := range t.Pairs {
		pairs[i] = strconv.Itoa(p)
	}
	var note any
	if t.BypassNote != "" {
		note = t.BypassNote
	}
	err := h.exec(ctx, "INSERT INTO %s."+TablesTable+" (run_id, seq, schema_name, table_name, diff_run_id, pairs, rows_checked, differences, result, error,"+
		" scope, scope_keys, bypass, bypass_keys, bypass_note) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
		runID, t.Seq, t.Schema, t.Table, t.DiffRunID, strings.Join(pairs, ","), t.RowsChecked, t.Differences, t.Result, msg,
		t.Scope, t.ScopeKeys, t.Bypass, t.BypassKeys, note)
	if err != nil {
		return fmt.Errorf("recording table %s.%s of run %s: %w", t.Schema, t.Table, runID, err)
	}
	return nil
}

// finish records how a run ended.
func (h *history) finish(ctx context.Context, r *RunRecord) error {
	var msg any
	if r.Error != "" {
		msg = r.Error
	}
	byClass := ""
	if len(r.DifferencesByClass) > 0 {
		b, _ := json.Marshal(r.DifferencesByClass)
		byClass = string(b)
	}
	err := h.exec(ctx, "UPDATE %s."+RunsTable+" SET state=?, result=?, finished_at=?, first_ts=?, last_ts=?, pairs=?, max_pause_us=?, tables_compared=?, rows_checked=?, differences=?, differences_by_class=?, resolved=?, unconfirmed=?, recheck_rounds=?, throttled_us=?, error=? WHERE run_id=?",
		r.State, r.Result, r.FinishedAt.UTC(), r.FirstTS, r.LastTS, len(r.Pairs), usec(r.MaxPause), r.TablesCompared, r.RowsChecked,
		r.Differences, byClass, r.Resolved, r.Unconfirmed, r.RecheckRounds, usec(r.Throttled), msg, r.RunID)
	if err != nil {
		return fmt.Errorf("recording the end of verification run %s: %w", r.RunID, err)
	}
	return nil
}

// lastClean returns the newest clean full or cdc run over exactly patterns (the default
// table set), or nil.
func (h *history) lastClean(ctx context.Context, patterns []string) (*RunRecord, error) {
	qctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	var r RunRecord
	var fin sql.NullTime
	err := h.db.QueryRowContext(qctx, h.q("SELECT run_id, first_ts, finished_at FROM %s."+RunsTable+
		" WHERE changefeed=? AND scope IN (?, ?) AND result=? AND tables=? ORDER BY first_ts DESC, started_at DESC LIMIT 1"),
		h.changefeed, ScopeFull, ScopeCDC, ResultEqual, patternsText(patterns)).Scan(&r.RunID, &r.FirstTS, &fin)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the last clean verification: %w", err)
	}
	r.FinishedAt = fin.Time
	return &r, nil
}

// list returns the newest limit runs, newest first, with their pairs and tables.
func (h *history) list(ctx context.Context, limit int, runID string) ([]RunRecord, error) {
	qctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	where, args := "changefeed=?", []any{h.changefeed}
	if runID != "" {
		where, args = "run_id=?", []any{runID}
	}
	rows, err := h.db.QueryContext(qctx, h.q("SELECT run_id, changefeed, trigger_kind, trigger_name, instance, scope, tables, state, result, started_at, finished_at, "+
		"first_ts, last_ts, max_pause_us, tables_compared, rows_checked, differences, differences_by_class, resolved, unconfirmed, recheck_rounds, throttled_us, COALESCE(error, '') FROM %s."+RunsTable+
		" WHERE "+where+" ORDER BY started_at DESC, run_id DESC LIMIT ?"), append(args, limit)...)
	if err != nil {
		return nil, fmt.Errorf("reading the verification history: %w", err)
	}
	defer rows.Close()
	var out []RunRecord
	for rows.Next() {
		var r RunRecord
		var pats, byClass string
		var fin sql.NullTime
		var pause, throttled int64
		if err := rows.Scan(&r.RunID, &r.Changefeed, &r.TriggerKind, &r.Trigger, &r.Instance, &r.Scope, &pats, &r.State, &r.Result, &r.StartedAt, &fin,
			&r.FirstTS, &r.LastTS, &pause, &r.TablesCompared, &r.RowsChecked, &r.Differences, &byClass, &r.Resolved, &r.Unconfirmed, &r.RecheckRounds, &throttled, &r.Error); err != nil {
			return nil, fmt.Errorf("reading the verification history: %w", err)
		}
		_ = json.Unmarshal([]byte(pats), &r.Patterns)
		if byClass != "" {
			if err := json.Unmarshal([]byte(byClass), &r.DifferencesByClass); err != nil {
				return nil, fmt.Errorf("reading the verification history: run %s: differences_by_class %q: %w", r.RunID, byClass, err)
			}
		}
		r.FinishedAt, r.MaxPause, r.Throttled = fin.Time, time.Duration(pause)*time.Microsecond, time.Duration(throttled)*time.Microsecond
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading the verification history: %w", err)
	}
	rows.Close()
	for i := range out {
		if err := h.details(qctx, &out[i]); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// details reads a run's pairs and tables.
func (h *history) details(ctx context.Context, r *RunRecord) error {
	rows, err := h.db.QueryContext(ctx, h.q("SELECT seq, upstream_ts, downstream_pos, pause_us, opened_at, closed_at FROM %s."+PairsTable+" WHERE run_id=? ORDER BY seq"), r.RunID)
	if err != nil {
		return fmt.Errorf("reading the pairs of run %s: %w", r.RunID, err)
	}
	for rows.Next() {
		var p PairRecord
		var pause int64
		var closed sql.NullTime
		if err := rows.Scan(&p.Seq, &p.TS, &p.Position, &pause, &p.OpenedAt, &closed); err != nil {
			rows.Close()
			return fmt.Errorf("reading the pairs of run %s: %w", r.RunID, err)
		}
		p.Pause, p.ClosedAt = time.Duration(pause)*time.Microsecond, closed.Time
		r.Pairs = append(r.Pairs, p)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("reading the pairs of run %s: %w", r.RunID, err)
	}
	rows, err = h.db.QueryContext(ctx, h.q("SELECT seq, schema_name, table_name, diff_run_id, pairs, rows_checked, differences, result, COALESCE(error, ''),"+
		" scope, scope_keys, bypass, bypass_keys, COALESCE(bypass_note, '') FROM %s."+TablesTable+" WHERE run_id=? ORDER BY seq"), r.RunID)
	if err != nil {
		return fmt.Errorf("reading the tables of run %s: %w", r.RunID, err)
	}
	defer rows.Close()
	for rows.Next() {
		var t TableRecord
		var pairs string
		if err := rows.Scan(&t.Seq, &t.Schema, &t.Table, &t.DiffRunID, &pairs, &t.RowsChecked, &t.Differences, &t.Result, &t.Error,
			&t.Scope, &t.ScopeKeys, &t.Bypass, &t.BypassKeys, &t.BypassNote); err != nil {
			return fmt.Errorf("reading the tables of run %s: %w", r.RunID, err)
		}
		for _, s := range strings.Split(pairs, ",") {
			if n, err := strconv.Atoi(s); err == nil {
				t.Pairs = append(t.Pairs, n)
			}
		}
		r.Tables = append(r.Tables, t)
	}
	return rows.Err()
}

// column runs a query of one string column.
func (h *history) column(ctx context.Context, q string, args ...any) ([]string, error) {
	qctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	rows, err := h.db.QueryContext(qctx, h.q(q), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// ids returns the ids of the runs f selects, newest first.
func (h *history) ids(ctx context.Context, f ListFilter) ([]string, error) {
	where, args := []string{"changefeed=?"}, []any{h.changefeed}
	if f.State != "" {
		where, args = append(where, "state=?"), append(args, f.State)
	}
	if f.Trigger != "" {
		where, args = append(where, "trigger_name=?"), append(args, f.Trigger)
	}
	if !f.StartedAfter.IsZero() {
		where, args = append(where, "started_at>=?"), append(args, f.StartedAfter.UTC())
	}
	if !f.StartedBefore.IsZero() {
		where, args = append(where, "started_at<?"), append(args, f.StartedBefore.UTC())
	}
	ids, err := h.column(ctx, "SELECT run_id FROM %s."+RunsTable+" WHERE "+strings.Join(where, " AND ")+
		" ORDER BY started_at DESC, run_id DESC LIMIT ? OFFSET ?", append(args, f.Limit, f.Offset)...)
	if err != nil {
		return nil, fmt.Errorf("reading the verification history: %w", err)
	}
	return ids, nil
}

// finished returns the run runID from the history: ErrRunNotFound when unknown,
// checker.ErrRunRunning while it runs.
func (h *history) finished(ctx context.Context, runID string) (RunRecord, error) {
	runs, err := h.list(ctx, 1, runID)
	if err != nil {
		return RunRecord{}, err
	}
	if len(runs) == 0 {
		return RunRecord{}, fmt.Errorf("run %s: %w", runID, ErrRunNotFound)
	}
	if runs[0].State == StateRunning {
		return RunRecord{}, fmt.Errorf("verification run %s: %w: its differences are not final until it ends", runID, checker.ErrRunRunning)
	}
	return runs[0], nil
}

// fullRun is a table's last clean full verification.
type fullRun struct {
	runID   string
	firstTS uint64
}

// lastFull returns, by "schema.table", each table's newest clean full verification:
// the full run with the newest first pair in which the table was equal (whatever the
// run's other tables were). Runs that never recorded their end (interrupted) are not
// counted.
func (h *history) lastFull(ctx context.Context) (map[string]fullRun, error) {
	qctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	rows, err := h.db.QueryContext(qctx, h.q("SELECT t.schema_name, t.table_name, r.run_id, r.first_ts FROM %s."+TablesTable+" t JOIN %s."+RunsTable+
		" r ON r.run_id = t.run_id WHERE r.changefeed=? AND r.scope=? AND t.result=? AND r.first_ts > 0 ORDER BY r.first_ts DESC"),
		h.changefeed, ScopeFull, ResultEqual)
	if err != nil {
		return nil, fmt.Errorf("reading the last full verifications: %w", err)
	}
	defer rows.Close()
	out := map[string]fullRun{}
	for rows.Next() {
		var sc, t string
		var f fullRun
		if err := rows.Scan(&sc, &t, &f.runID, &f.firstTS); err != nil {
			return nil, fmt.Errorf("reading the last full verifications: %w", err)
		}
		if _, ok := out[sc+"."+t]; !ok {
			out[sc+"."+t] = f
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading the last full verifications: %w", err)
	}
	return out, nil
}
