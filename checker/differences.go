package checker

// differences.go owns the stored differences (diff_differences, diff_difference_parts,
// diff_rechecks): how a run stores them (in batches, a long one in pieces), drops a
// retried chunk's, pages through them, and replaces them after a re-check; and how
// callers outside the checker (the daemon's repair) read a finished run's, each with its
// table's names on both sides and its key as typed values (RunDifferences), or delete a
// run (DeleteRun). It must not compare rows nor decide which differences exist (the
// comparer and the re-check do).

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/retry"
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
	if state == runRunning {
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
			return nil, nil, fmt.Errorf("table %s is %w %s (%s)", tables[i], ErrTableNotInRun, runID, strings.Join(names, ", "))
		}
	}
	return s, keep, nil
}

// ErrTableNotInRun is matched by the error of a reader of a finished run
// (RunDifferences, RunFixSQL) asked for a table the run did not compare.
var ErrTableNotInRun = errors.New("not among the tables of run")

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

// dropDifferences deletes the differences stored for chunk c.
func (s *store) dropDifferences(ctx context.Context, c keyChunk) error {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	for _, t := range []string{"diff_differences", "diff_difference_parts"} {
		if _, err := s.db.ExecContext(ctx, s.q("DELETE FROM %s."+t+" WHERE run_id = ? AND table_idx = ? AND chunk_seq = ?"), s.runID, c.Table, c.Seq); err != nil {
			return fmt.Errorf("drop differences of chunk %d of table %d: %w", c.Seq, c.Table, err)
		}
	}
	return nil
}

type storedDiff struct {
	seq  int // its chunk
	n    int
	diff Difference
	data string // diff as stored (storedDifference)
}

func newStoredDiff(seq, n int, d Difference) storedDiff {
	return storedDiff{seq: seq, n: n, diff: d, data: marshalDifference(d)}
}

// size is what the difference adds to an INSERT.
func (d storedDiff) size() int { return len(d.data) + len(d.diff.fix) + 64 }

// storedPieceBytes bounds what one statement of addDifferences carries: a batch of
// differences, or one piece of a longer difference. It stays far below any server's
// max_allowed_packet (1 MiB on the oldest MySQL defaults, 16 MiB on MariaDB).
const storedPieceBytes = 1 << 20

// execer runs statements: the meta pool, or one of its transactions.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

var (
	_ execer = (*sql.DB)(nil)
	_ execer = (*sql.Tx)(nil)
)

// addDifferences stores differences of a table (a long one in pieces).
func (s *store) addDifferences(ctx context.Context, table int, batch []storedDiff) error {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	return s.insertDifferences(ctx, s.db, table, batch)
}

// insertBatchRows and storedPieceBytes bound one INSERT of insertDifferences.
const insertBatchRows = 200

// insertDifferences is addDifferences on x, within ctx's deadline: one INSERT per run of
// at most insertBatchRows differences and storedPieceBytes.
func (s *store) insertDifferences(ctx context.Context, x execer, table int, diffs []storedDiff) error {
	for len(diffs) > 0 {
		n, bytes := 0, 0
		for n < len(diffs) && n < insertBatchRows && (n == 0 || bytes+diffs[n].size() <= storedPieceBytes) {
			bytes += diffs[n].size()
			n++
		}
		if err := s.insertStatement(ctx, x, table, diffs[:n]); err != nil {
			return err
		}
		diffs = diffs[n:]
	}
	return nil
}

// insertStatement stores batch in one INSERT (a long difference's pieces follow it).
func (s *store) insertStatement(ctx context.Context, x execer, table int, batch []storedDiff) error {
	var sb strings.Builder
	args := make([]any, 0, len(batch)*7)
	sb.WriteString(s.q("INSERT INTO %s.diff_differences (run_id, table_idx, chunk_seq, n, kind, diff, fix_sql) VALUES "))
	var long []storedDiff
	for i, d := range batch {
		if i > 0 {
			sb.WriteString(", ")
		}
		sb.WriteString("(?, ?, ?, ?, ?, ?, ?)")
		if d.size() <= storedPieceBytes {
			args = append(args, s.runID, table, d.seq, d.n, string(d.diff.Kind), d.data, d.diff.fix)
			continue
		}
		args = append(args, s.runID, table, d.seq, d.n, string(d.diff.Kind), "", "")
		long = append(long, d)
	}
	if _, err := x.ExecContext(ctx, sb.String(), args...); err != nil {
		return fmt.Errorf("record differences of chunk %d of table %d: %w", batch[0].seq, table, err)
	}
	for _, d := range long {
		// The JSON's pieces, then the fix SQL's, each a part row. Half of
		// storedPieceBytes: quotes and backslashes double when the driver escapes them.
		type part struct{ diff, fix string }
		var parts []part
		for _, t := range pieces(d.data, storedPieceBytes/2) {
			parts = append(parts, part{diff: t})
		}
		for _, t := range pieces(d.diff.fix, storedPieceBytes/2) {
			parts = append(parts, part{fix: t})
		}
		for i, p := range parts {
			if _, err := x.ExecContext(ctx, s.q("INSERT INTO %s.diff_difference_parts (run_id, table_idx, chunk_seq, n, part, diff, fix_sql) VALUES (?, ?, ?, ?, ?, ?, ?)"),
				s.runID, table, d.seq, d.n, i, p.diff, p.fix); err != nil {
				return fmt.Errorf("record difference %d of chunk %d of table %d (part %d): %w", d.n, d.seq, table, i, err)
			}
		}
	}
	return nil
}

// pieces cuts s into pieces of at most n bytes, at UTF-8 character starts (the texts are
// stored in utf8mb4 columns, which refuse a split character).
func pieces(s string, n int) []string {
	var out []string
	for len(s) > n {
		cut := n
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		if cut == 0 {
			cut = n
		}
		out = append(out, s[:cut])
		s = s[cut:]
	}
	if s != "" {
		out = append(out, s)
	}
	return out
}

// differencePieces reads the parts of a long difference.
func (s *store) differencePieces(ctx context.Context, table int, seq, n int64) (data, fix string, err error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	rows, err := s.db.QueryContext(ctx, s.q("SELECT diff, fix_sql FROM %s.diff_difference_parts WHERE run_id = ? AND table_idx = ? AND chunk_seq = ? AND n = ? ORDER BY part"),
		s.runID, table, seq, n)
	if err != nil {
		return "", "", err
	}
	defer rows.Close()
	var d, f strings.Builder
	for rows.Next() {
		var a, b string
		if err := rows.Scan(&a, &b); err != nil {
			return "", "", err
		}
		d.WriteString(a)
		f.WriteString(b)
	}
	return d.String(), f.String(), rows.Err()
}

// differences streams the stored differences of a table in key order (extra rows first
// when deletesFirst) to fn. limit < 0 means all.
func (s *store) differences(ctx context.Context, table int, limit int, deletesFirst bool, fn func(Difference, string) error) error {
	passes := []string{""}
	if deletesFirst {
		passes = []string{" AND kind = 'extra'", " AND kind <> 'extra'"}
	}
	for _, kinds := range passes {
		if err := s.differencesWhere(ctx, table, kinds, &limit, fn); err != nil {
			return err
		}
	}
	return nil
}

// differencesPage is how many differences one query reads: pages follow the primary key,
// each query with its own timeout, so a report of millions of differences is not one
// query that must finish within the query timeout.
const differencesPage = 5000

// differencesPageBytes ends a page early when its differences hold this many bytes, so
// that pages of wide rows stay bounded in memory too.
const differencesPageBytes = 16 << 20

// differencesWhere streams the differences of a table matching kinds (an AND clause) in
// (chunk_seq, n) order, at most *limit of them (< 0: all), counting *limit down.
func (s *store) differencesWhere(ctx context.Context, table int, kinds string, limit *int, fn func(Difference, string) error) error {
	return s.scanDifferences(ctx, table, kinds, -1, -1, limit, func(_, _ int64, d Difference, fix string) error { return fn(d, fix) })
}

// scanDifferences streams the differences of a table matching clause (an AND clause) that
// come after position (seq, n), in (chunk_seq, n) order, at most *limit of them (< 0:
// all), counting *limit down, with their positions.
func (s *store) scanDifferences(ctx context.Context, table int, clause string, seq, n int64, limit *int, fn func(seq, n int64, d Difference, fix string) error) error {
	for *limit != 0 {
		page := differencesPage
		if *limit > 0 {
			page = min(page, *limit)
		}
		q := s.q("SELECT chunk_seq, n, class, diff, fix_sql FROM %s.diff_differences WHERE run_id = ? AND table_idx = ?"+clause+
			" AND (chunk_seq > ? OR (chunk_seq = ? AND n > ?)) ORDER BY chunk_seq, n LIMIT ") + fmt.Sprint(page)
		type row struct {
			seq, n int64
			class  string
			data   string
			fix    string
		}
		var got []row
		full := false // the page stopped at differencesPageBytes
		err := func() error {
			qctx, cancel := s.ctx(ctx)
			defer cancel()
			rows, err := s.db.QueryContext(qctx, q, s.runID, table, seq, seq, n)
			if err != nil {
				return err
			}
			defer rows.Close()
			bytes := 0
			for rows.Next() {
				var r row
				if err := rows.Scan(&r.seq, &r.n, &r.class, &r.data, &r.fix); err != nil {
					return err
				}
				got = append(got, r)
				if bytes += len(r.data) + len(r.fix); bytes >= differencesPageBytes {
					full = true
					break
				}
			}
			return rows.Err()
		}()
		if err != nil {
			return fmt.Errorf("read differences of table %d: %w", table, err)
		}
		for _, r := range got {
			seq, n = r.seq, r.n
			if r.data == "" { // stored in pieces
				if r.data, r.fix, err = s.differencePieces(ctx, table, r.seq, r.n); err != nil {
					return fmt.Errorf("read difference %d of chunk %d of table %d: %w", r.n, r.seq, table, err)
				}
			}
			d, err := unmarshalDifference(r.data)
			if err != nil {
				return fmt.Errorf("decode difference %d of chunk %d of table %d: %w", r.n, r.seq, table, err)
			}
			d.Class = r.class
			if err := fn(r.seq, r.n, d, r.fix); err != nil {
				return err
			}
		}
		if *limit > 0 {
			*limit -= len(got)
		}
		if len(got) < page && !full {
			return nil
		}
	}
	return nil
}

// maxDifferenceNs returns, per chunk of a table, the largest n of its stored differences.
func (s *store) maxDifferenceNs(ctx context.Context, table int) (map[int]int, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	rows, err := s.db.QueryContext(ctx, s.q("SELECT chunk_seq, MAX(n) FROM %s.diff_differences WHERE run_id = ? AND table_idx = ? GROUP BY chunk_seq"), s.runID, table)
	if err != nil {
		return nil, fmt.Errorf("read differences of table %d: %w", table, err)
	}
	defer rows.Close()
	out := map[int]int{}
	for rows.Next() {
		var seq, n int
		if err := rows.Scan(&seq, &n); err != nil {
			return nil, fmt.Errorf("read differences of table %d: %w", table, err)
		}
		out[seq] = n
	}
	return out, rows.Err()
}

// diffRef names a stored difference: its chunk and number.
type diffRef struct{ seq, n int }

// replaceDifferences swaps stored differences of a table for what a re-check found, in
// one transaction: it deletes the differences old (all the differences of old's chunks
// when all is set), which stood for oldRows[chunk] differing rows per chunk, stores news,
// and counts the rows that are no longer different (oldRows less the rows of news, per
// chunk) in diff_chunks.differences and in diff_rechecks: as resolved, or as unconfirmed
// when confirm is set (read again at the same snapshot pair). A failure changes nothing;
// after a commit the old differences are gone, so a resumed re-check never counts them
// again. It returns the rows no longer different.
//
// Tables are re-checked concurrently, and MariaDB may pick one of two such transactions
// as a deadlock victim (their deletes lock neighbouring index ranges of the same tables):
// a transaction rolled back for a conflict is run again, as it changed nothing.
func (s *store) replaceDifferences(ctx context.Context, table int, old []diffRef, all bool, oldRows map[int]int64, news []storedDiff, confirm bool) (int64, error) {
	var n int64
	err := conflictRetry.Do(ctx, func(ctx context.Context) error {
		var err error
		n, err = s.replaceDifferencesOnce(ctx, table, old, all, oldRows, news, confirm)
		return err
	}, nil)
	return n, err
}

// conflictRetry runs a store transaction again when the server rolled it back for a
// conflict with another (deadlock, lock wait timeout).
var conflictRetry = retry.Policy{MaxRetries: 5, Backoff: 20 * time.Millisecond, MaxBackoff: time.Second,
	Retryable: func(err error) bool { return retry.Classify(err) == retry.Conflict }}

func (s *store) replaceDifferencesOnce(ctx context.Context, table int, old []diffRef, all bool, oldRows map[int]int64, news []storedDiff, confirm bool) (int64, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	fail := func(err error) (int64, error) {
		return 0, fmt.Errorf("re-check differences of table %d: %w", table, err)
	}
	// The old differences, per chunk, as one condition.
	var seqs []int
	byChunk := map[int][]int{}
	for _, d := range old {
		if _, ok := byChunk[d.seq]; !ok {
			seqs = append(seqs, d.seq)
		}
		byChunk[d.seq] = append(byChunk[d.seq], d.n)
	}
	if len(seqs) == 0 {
		return 0, nil
	}
	var cond strings.Builder
	args := []any{s.runID, table}
	for i, seq := range seqs {
		if i > 0 {
			cond.WriteString(" OR ")
		}
		if all {
			cond.WriteString("chunk_seq = ?")
			args = append(args, seq)
			continue
		}
		cond.WriteString("(chunk_seq = ? AND n IN (" + strings.TrimSuffix(strings.Repeat("?, ", len(byChunk[seq])), ", ") + "))")
		args = append(args, seq)
		for _, n := range byChunk[seq] {
			args = append(args, n)
		}
	}
	where := " WHERE run_id = ? AND table_idx = ? AND (" + cond.String() + ")"
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fail(err)
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, s.q("DELETE FROM %s.diff_differences"+where), args...)
	if err != nil {
		return fail(err)
	}
	if !all {
		if got, err := res.RowsAffected(); err != nil {
			return fail(err)
		} else if got != int64(len(old)) {
			return fail(fmt.Errorf("%d of %d differences were gone (another process changed the run?)", int64(len(old))-got, len(old)))
		}
	}
	if _, err := tx.ExecContext(ctx, s.q("DELETE FROM %s.diff_difference_parts"+where), args...); err != nil {
		return fail(err)
	}
	resolved := map[int]int64{}
	for seq, n := range oldRows {
		resolved[seq] = n
	}
	for _, d := range news {
		resolved[d.seq] -= int64(max(1, d.diff.Count))
	}
	if err := s.insertDifferences(ctx, tx, table, news); err != nil {
		return fail(err)
	}
	var total int64
	var cases strings.Builder
	var cargs, rargs, sargs []any
	var rvals []string
	for _, seq := range seqs {
		n := resolved[seq]
		if n == 0 {
			continue
		}
		total += n
		cases.WriteString(" WHEN ? THEN ?")
		cargs = append(cargs, seq, n)
		sargs = append(sargs, seq)
		rvals = append(rvals, "(?, ?, ?, ?, ?)")
		if confirm {
			rargs = append(rargs, s.runID, table, seq, 0, n)
		} else {
			rargs = append(rargs, s.runID, table, seq, n, 0)
		}
	}
	if len(rvals) > 0 {
		// The chunks' counts and the re-check tally, one statement each.
		args := append(append(cargs, s.runID, table), sargs...)
		in := strings.TrimSuffix(strings.Repeat("?, ", len(sargs)), ", ")
		if _, err := tx.ExecContext(ctx, s.q("UPDATE %s.diff_chunks SET differences = differences - CASE seq"+cases.String()+" ELSE 0 END, updated_at = NOW(3) WHERE run_id = ? AND table_idx = ? AND seq IN ("+in+")"), args...); err != nil {
			return fail(err)
		}
		col := "resolved"
		if confirm {
			col = "unconfirmed"
		}
		if _, err := tx.ExecContext(ctx, s.q("INSERT INTO %s.diff_rechecks (run_id, table_idx, chunk_seq, resolved, unconfirmed) VALUES "+strings.Join(rvals, ", ")+
			" ON DUPLICATE KEY UPDATE "+col+" = "+col+" + VALUES("+col+")"), rargs...); err != nil {
			return fail(err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fail(err)
	}
	return total, nil
}

// rechecksByTable returns, per table, the differing rows a re-check found equal
// (resolved) and those gone when read again at the same snapshot pair (unconfirmed).
func (s *store) rechecksByTable(ctx context.Context) (resolved, unconfirmed map[int]int64, err error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	rows, err := s.db.QueryContext(ctx, s.q("SELECT table_idx, SUM(resolved), SUM(unconfirmed) FROM %s.diff_rechecks WHERE run_id = ? GROUP BY table_idx"), s.runID)
	if err != nil {
		return nil, nil, fmt.Errorf("read re-check results: %w", err)
	}
	defer rows.Close()
	resolved, unconfirmed = map[int]int64{}, map[int]int64{}
	for rows.Next() {
		var t int
		var r, u int64
		if err := rows.Scan(&t, &r, &u); err != nil {
			return nil, nil, fmt.Errorf("read re-check results: %w", err)
		}
		resolved[t], unconfirmed[t] = r, u
	}
	return resolved, unconfirmed, rows.Err()
}
