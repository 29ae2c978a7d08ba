package checker

// differences.go exports a finished run's stored differences for callers outside the
// checker (the daemon's repair): each with its table's names on both sides and its key
// as typed values. It only reads what the run stored; it must not compare, re-check or
// change anything.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tidb-parity/parity/internal/ident"
)

// ErrRunRunning is returned by RunDifferences for a run that is still running.
var ErrRunRunning = errors.New("the run is still running")

// StoredDifference is one difference a run stored, as RunDifferences returns it.
type StoredDifference struct {
	// RunID is the checker run (diff_runs.run_id) that stored it.
	RunID string
	// UpSchema, UpTable are the upstream table's names; DownSchema, DownTable the
	// downstream table the run compared it with.
	UpSchema, UpTable     string
	DownSchema, DownTable string
	Kind                  DiffKind
	// KeyColumns name the columns that identify the row: the table's key as the run
	// chose it, or every compared column of a keyless table. KeyValues are their values
	// typed as internal/rowkey decodes a key (nil, int64, uint64, float64, string,
	// []byte; see keys.go): the upstream row's for a missing or differing row, the
	// downstream row's for an extra one.
	KeyColumns []string
	KeyValues  []any
	// Key is the key's report form: column=literal pairs, as report.json shows it.
	Key string
	// Columns name the differing columns of a differing row.
	Columns []string
	// Count is how many copies of a keyless row are missing or extra (1 otherwise).
	Count int
	// Class is the difference's classification when the run classified it.
	Class string
}

// finishedRun opens the stored state of the finished checker run runID and returns its
// tables that match tables (all when empty): ErrRunNotFound, ErrRunRunning, or a pattern
// matching none of the run's tables are errors (RunDifferences, RunFixSQL).
func finishedRun(ctx context.Context, db *sql.DB, metaSchema, runID string, tables []string) (*store, []storedTable, error) {
	s := &store{db: db, raw: metaSchema, schema: ident.Quote(metaSchema), runID: runID, tmo: time.Minute}
	qctx, cancel := s.ctx(ctx)
	var state string
	err := db.QueryRowContext(qctx, s.q("SELECT state FROM %s.diff_runs WHERE run_id = ?"), runID).Scan(&state)
	cancel()
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil, fmt.Errorf("run %s in meta schema %s: %w", runID, metaSchema, ErrRunNotFound)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read run %s: %w", runID, err)
	}
	if state == RunRunning {
		return nil, nil, fmt.Errorf("run %s: %w: its differences are not final until it ends (resume it if it was interrupted)", runID, ErrRunRunning)
	}
	stored, err := s.tables(ctx)
	if err != nil {
		return nil, nil, err
	}
	matched := make([]bool, len(tables))
	var keep []storedTable
	for _, t := range stored {
		ok := len(tables) == 0
		for i, p := range tables {
			if matchName(p, t.upSchema, t.upTable) {
				matched[i], ok = true, true
			}
		}
		if ok {
			keep = append(keep, t)
		}
	}
	for i, m := range matched {
		if !m {
			names := make([]string, len(stored))
			for j, t := range stored {
				names[j] = t.upSchema + "." + t.upTable
			}
			return nil, nil, fmt.Errorf("table %s is not among the tables of run %s (%s)", tables[i], runID, strings.Join(names, ", "))
		}
	}
	return s, keep, nil
}

// RunDifferences returns the stored differences of the checker run runID in the meta
// schema metaSchema of db, in table and key order. tables, when not empty, keeps the
// differences of the upstream tables matching one of its "schema.table" patterns (* and
// ? wildcards as in the run's own table patterns); a pattern matching none of the run's
// tables is an error that names the run's tables. An unknown run is ErrRunNotFound, one
// still running ErrRunRunning. A
// difference stored by a release before exact keys (no "rk") is an error: its typed
// key cannot be recovered without the run's plan; verify again to store it anew.
func RunDifferences(ctx context.Context, db *sql.DB, metaSchema, runID string, tables []string) ([]StoredDifference, error) {
	s, keep, err := finishedRun(ctx, db, metaSchema, runID, tables)
	if err != nil {
		return nil, err
	}
	var out []StoredDifference
	for _, t := range keep {
		all := -1
		err := s.differences(ctx, t.idx, all, false, func(d Difference, _ string) error {
			if d.rk == nil {
				return fmt.Errorf("table %s.%s: run %s stored its differences without exact keys (an earlier release): verify again", t.upSchema, t.upTable, runID)
			}
			vals, err := d.rk.Values()
			if err != nil {
				return fmt.Errorf("table %s.%s: a stored key of run %s: %w", t.upSchema, t.upTable, runID, err)
			}
			if len(vals) != len(d.Key) {
				return fmt.Errorf("table %s.%s: a stored key of run %s has %d values for %d columns", t.upSchema, t.upTable, runID, len(vals), len(d.Key))
			}
			sd := StoredDifference{RunID: runID, UpSchema: t.upSchema, UpTable: t.upTable, DownSchema: t.downSchema, DownTable: t.downName,
				Kind: d.Kind, KeyValues: vals, Columns: d.Columns, Count: max(d.Count, 1), Class: d.Class}
			text := make([]string, len(d.Key))
			for i, kv := range d.Key {
				sd.KeyColumns = append(sd.KeyColumns, kv.Column)
				text[i] = kv.Column + "=" + kv.Value
			}
			sd.Key = strings.Join(text, ", ")
			out = append(out, sd)
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// runTables are the checker's tables that hold a run's rows, each keyed by run_id,
// children before diff_runs: a deletion stopped half-way leaves the run findable, and
// deleting it again finishes it.
var runTables = []string{"diff_difference_parts", "diff_differences", "diff_rechecks", "diff_chunks", "diff_tables", "diff_runs"}

// DeleteRun deletes every row of the checker run runID from the meta schema (its chunks,
// differences, re-checks, tables and the run); an unknown run deletes nothing. It does
// not look at the run's state: the caller deletes runs that ended (verification's
// history retention). Clean verifications (diff_verified) are kept: they record a
// table's state, not the run's. It returns how many rows it deleted.
func DeleteRun(ctx context.Context, db *sql.DB, metaSchema, runID string) (int64, error) {
	s := &store{db: db, raw: metaSchema, schema: ident.Quote(metaSchema), runID: runID, tmo: time.Minute}
	var n int64
	for _, t := range runTables {
		qctx, cancel := s.ctx(ctx)
		res, err := db.ExecContext(qctx, s.q("DELETE FROM %s."+t+" WHERE run_id = ?"), runID)
		cancel()
		if err != nil {
			return n, fmt.Errorf("deleting run %s from %s: %w", runID, t, err)
		}
		k, _ := res.RowsAffected()
		n += k
	}
	return n, nil
}
