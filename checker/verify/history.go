package verify

// history.go owns the run history in the meta schema: the "verify" component of
// internal/metaschema (verify_runs, verify_pairs, verify_tables, and verify_fires, the
// schedules' claims, which fires.go writes), what a run records there as it goes, and
// reading it back. It must not compare anything.

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

// Tables of the history. verify_runs holds a row per run (and per skipped firing);
// verify_pairs the snapshot pairs a run read at; verify_tables each table's result and
// the checker's run (diff_runs.run_id) that compared it.
const (
	RunsTable   = "verify_runs"
	PairsTable  = "verify_pairs"
	TablesTable = "verify_tables"
	// FiresTable holds a row per schedule fire: the daemon (instance) that claimed it
	// and the run (or skipped firing) it recorded (fires.go).
	FiresTable = "verify_fires"
)

// Migrations are append-only: never edit or reorder one, add a new one. "%s" is the
// quoted meta schema.
var migrations = []metaschema.Step{
	{Name: "verification run history: runs, pairs, tables", Stmts: []string{
		`CREATE TABLE IF NOT EXISTS %s.` + RunsTable + ` (
			run_id VARCHAR(64) NOT NULL PRIMARY KEY,
			changefeed VARCHAR(128) NOT NULL,
			trigger_kind VARCHAR(16) NOT NULL,
			trigger_name VARCHAR(128) NOT NULL,
			scope VARCHAR(128) NOT NULL,
			tables TEXT NOT NULL,
			state VARCHAR(16) NOT NULL,
			result VARCHAR(16) NOT NULL DEFAULT '',
			started_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
			finished_at TIMESTAMP(6) NULL,
			first_ts BIGINT UNSIGNED NOT NULL DEFAULT 0,
			last_ts BIGINT UNSIGNED NOT NULL DEFAULT 0,
			pairs INT NOT NULL DEFAULT 0,
			max_pause_us BIGINT NOT NULL DEFAULT 0,
			tables_compared INT NOT NULL DEFAULT 0,
			rows_checked BIGINT NOT NULL DEFAULT 0,
			differences BIGINT NOT NULL DEFAULT 0,
			resolved BIGINT NOT NULL DEFAULT 0,
			recheck_rounds INT NOT NULL DEFAULT 0,
			throttled_us BIGINT NOT NULL DEFAULT 0,
			error TEXT NULL,
			KEY changefeed_started (changefeed, started_at)
		) ENGINE=InnoDB`,
		`CREATE TABLE IF NOT EXISTS %s.` + PairsTable + ` (
			run_id VARCHAR(64) NOT NULL,
			seq INT NOT NULL,
			upstream_ts BIGINT UNSIGNED NOT NULL,
			downstream_pos TEXT NOT NULL,
			pause_us BIGINT NOT NULL,
			opened_at TIMESTAMP(6) NOT NULL,
			closed_at TIMESTAMP(6) NULL,
			PRIMARY KEY (run_id, seq)
		) ENGINE=InnoDB`,
		`CREATE TABLE IF NOT EXISTS %s.` + TablesTable + ` (
			run_id VARCHAR(64) NOT NULL,
			seq INT NOT NULL,
			schema_name VARCHAR(64) NOT NULL,
			table_name VARCHAR(64) NOT NULL,
			diff_run_id VARCHAR(64) NOT NULL DEFAULT '',
			pairs VARCHAR(1024) NOT NULL DEFAULT '',
			rows_checked BIGINT NOT NULL DEFAULT 0,
			differences BIGINT NOT NULL DEFAULT 0,
			result VARCHAR(16) NOT NULL,
			error TEXT NULL,
			PRIMARY KEY (run_id, seq)
		) ENGINE=InnoDB`,
	}},
	{Name: "verification across daemons: the instance of each run, the claims of schedule fires", Stmts: []string{
		`ALTER TABLE %s.` + RunsTable + ` ADD COLUMN instance VARCHAR(128) NOT NULL DEFAULT '' AFTER trigger_name`,
		`ALTER TABLE %s.` + RunsTable + ` ADD KEY changefeed_state (changefeed, state, trigger_name)`,
		`CREATE TABLE IF NOT EXISTS %s.` + FiresTable + ` (
			changefeed VARCHAR(128) NOT NULL,
			schedule VARCHAR(128) NOT NULL,
			fire_at DATETIME NOT NULL,
			instance VARCHAR(128) NOT NULL,
			run_id VARCHAR(64) NOT NULL,
			claimed_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
			PRIMARY KEY (changefeed, schedule, fire_at)
		) ENGINE=InnoDB`,
	}},
	{Name: "verification run history: the run's differences by class", Stmts: []string{
		`ALTER TABLE %s.` + RunsTable + ` ADD COLUMN differences_by_class VARCHAR(512) NOT NULL DEFAULT '' AFTER differences`,
	}},
	{Name: "verification run history: differences gone when read again at the same pair", Stmts: []string{
		`ALTER TABLE %s.` + RunsTable + ` ADD COLUMN unconfirmed BIGINT NOT NULL DEFAULT 0 AFTER resolved`,
	}},
	{Name: "verification run history: a table's scope and whether writes that bypassed parity were among its keys", Stmts: []string{
		`ALTER TABLE %s.` + TablesTable + ` ADD COLUMN scope VARCHAR(16) NOT NULL DEFAULT '', ADD COLUMN scope_keys BIGINT NOT NULL DEFAULT 0,
			ADD COLUMN bypass VARCHAR(16) NOT NULL DEFAULT '', ADD COLUMN bypass_keys BIGINT NOT NULL DEFAULT 0, ADD COLUMN bypass_note TEXT NULL`,
	}},
}

func init() {
	metaschema.Register(metaschema.Component{
		Name:   "verify",
		Tables: []string{RunsTable, PairsTable, TablesTable, FiresTable},
		Steps:  migrations,
	})
}

// Run states and results in the history.
const (
	StateRunning   = "running"
	StateDone      = "done"
	StateFailed    = "failed"
	StateCancelled = "cancelled"
	StateSkipped   = "skipped"

	ResultEqual     = "equal"
	ResultDifferent = "different"
	ResultFailed    = "failed"
	ResultCancelled = "cancelled"
	ResultSkipped   = "skipped"
)

// RunRecord is a run as the history holds it.
type RunRecord struct {
	RunID      string `json:"run_id"`
	Changefeed string `json:"changefeed"`
	// Trigger is the schedule's name, "continuous" or "manual"; TriggerKind "schedule",
	// "continuous" or "manual".
	Trigger     string `json:"trigger"`
	TriggerKind string `json:"trigger_kind"`
	// Instance is the daemon that ran it (verify.instance); empty in runs recorded
	// before daemons had one.
	Instance string   `json:"instance"`
	Scope    string   `json:"scope"`
	Patterns []string `json:"table_patterns"`
	// State is running, done, failed, cancelled or skipped; Result (once it ended)
	// equal, different, failed, cancelled or skipped.
	State      string    `json:"state"`
	Result     string    `json:"result,omitempty"`
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
	// FirstTS is the oldest pair's TSO: a clean run proves the fallback equal to TiDB
	// for every change at or before it. LastTS is the newest pair's.
	FirstTS uint64 `json:"first_ts,omitempty"`
	LastTS  uint64 `json:"last_ts,omitempty"`
	// MaxPause is the longest time replication waited for one of its pairs.
	MaxPause       time.Duration `json:"max_pause_ns"`
	TablesCompared int           `json:"tables_compared"`
	RowsChecked    int64         `json:"rows_checked"`
	Differences    int64         `json:"differences"`
	// DifferencesByClass counts the run's differing rows by class (imported,
	// post-import, cdc, diverged, unclassified; checker's classification).
	DifferencesByClass map[string]int64 `json:"differences_by_class,omitempty"`
	// Resolved counts differences a re-check found equal and RecheckRounds the
	// re-check rounds: both 0 at snapshot pairs (nothing is in flight).
	Resolved      int64 `json:"resolved"`
	RecheckRounds int   `json:"recheck_rounds"`
	// Unconfirmed counts differences found at a pair and gone when read again at the
	// same pair (checker's confirmation): a snapshot read that was not repeatable, a
	// store anomaly; they are not in Differences.
	Unconfirmed int64         `json:"unconfirmed,omitempty"`
	Throttled   time.Duration `json:"throttled_ns"`
	Error       string        `json:"error,omitempty"`
	Pairs       []PairRecord  `json:"pairs,omitempty"`
	Tables      []TableRecord `json:"tables,omitempty"`
}

// PairRecord is one snapshot pair of a run.
type PairRecord struct {
	Seq      int           `json:"seq"`
	TS       uint64        `json:"upstream_ts"`
	Position string        `json:"downstream_position"`
	Pause    time.Duration `json:"pause_ns"`
	OpenedAt time.Time     `json:"opened_at"`
	ClosedAt time.Time     `json:"closed_at,omitzero"`
}

// TableRecord is one table's result in a run.
type TableRecord struct {
	Seq       int    `json:"seq"`
	Schema    string `json:"schema"`
	Table     string `json:"table"`
	DiffRunID string `json:"diff_run_id,omitempty"`
	// Pairs are the Seq of the pairs its chunks were compared at.
	Pairs       []int  `json:"pairs"`
	RowsChecked int64  `json:"rows_checked"`
	Differences int64  `json:"differences"`
	Result      string `json:"result"`
	Error       string `json:"error,omitempty"`
	// What the run compared of the table (checker.TableReport's fields of the same
	// names): its scope, the keys' window and how many, and whether the writes that
	// bypassed parity are among them. The history keeps Scope, ScopeKeys, Bypass,
	// BypassKeys and BypassNote; the others are the running service's only.
	Scope         string    `json:"scope,omitempty"`
	ScopeFromTs   uint64    `json:"scope_from_ts,omitempty"`
	ScopeUntilTs  uint64    `json:"scope_until_ts,omitempty"`
	ScopeKeys     int64     `json:"scope_keys,omitempty"`
	Bypass        string    `json:"bypass,omitempty"`
	BypassNote    string    `json:"bypass_note,omitempty"`
	BypassKeys    int64     `json:"bypass_keys,omitempty"`
	BypassDDL     []string  `json:"bypass_ddl,omitempty"`
	BypassSince   time.Time `json:"bypass_since,omitzero"`
	BypassWatched time.Time `json:"bypass_watched_since,omitzero"`
}

// history writes and reads the history tables.
type history struct {
	db         *sql.DB
	schema     string // quoted
	changefeed string
	timeout    time.Duration
}

func (h *history) q(s string) string { return strings.ReplaceAll(s, "%s", h.schema) }

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

// pruneBatch bounds the runs one query of prune selects; prune goes on until none is left.
const pruneBatch = 100

// prune deletes the runs of the changefeed that finished before horizon, except the run
// keep, with the checker runs of their tables (checker.DeleteRun), and returns how many
// runs it deleted. Each table of a run has its own checker run (run.go starts one per
// table and run), so no other run's rows go with them. The history row goes last: a
// prune stopped half-way is finished by the next.
func (h *history) prune(ctx context.Context, metaSchema string, horizon time.Time, keep string) (int, error) {
	total := 0
	for {
		ids, err := h.column(ctx, "SELECT run_id FROM %s."+RunsTable+" WHERE changefeed=? AND state<>? AND finished_at IS NOT NULL AND finished_at < ? AND run_id<>? ORDER BY finished_at LIMIT "+strconv.Itoa(pruneBatch),
			h.changefeed, StateRunning, horizon.UTC(), keep)
		if err != nil {
			return total, fmt.Errorf("listing runs past the history's retention: %w", err)
		}
		for _, id := range ids {
			diffIDs, err := h.column(ctx, "SELECT DISTINCT diff_run_id FROM %s."+TablesTable+" WHERE run_id=? AND diff_run_id<>''", id)
			if err != nil {
				return total, fmt.Errorf("reading the checker runs of run %s: %w", id, err)
			}
			for _, d := range diffIDs {
				dctx, cancel := context.WithTimeout(ctx, h.timeout)
				_, err := checker.DeleteRun(dctx, h.db, metaSchema, d)
				cancel()
				if err != nil {
					return total, fmt.Errorf("pruning run %s: %w", id, err)
				}
			}
			for _, t := range []string{TablesTable, PairsTable, RunsTable} {
				if err := h.exec(ctx, "DELETE FROM %s."+t+" WHERE run_id=?", id); err != nil {
					return total, fmt.Errorf("pruning run %s from %s: %w", id, t, err)
				}
			}
			total++
		}
		if len(ids) < pruneBatch {
			return total, nil
		}
	}
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
