package checker

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/tidb-parity/parity/internal/metaschema"
)

// Run state in the meta schema. A run moves running → done | failed | cancelled (a
// resumed run goes back to running). A chunk moves pending → running → done, written in
// batches by the run's journal (journal.go; a chunk whose start and result land in the
// same batch goes from pending to done with its attempt counted); on resume
// every chunk that is not done (at most the ones that were in flight, plus those cut but
// not started) is compared again. diff_tables.checkpoint_seq is the low watermark: every
// chunk with seq <= checkpoint_seq is done. Tables are prefixed diff_ because other parts
// of parity keep their own tables in the same schema.
//
// The tables are the "checker" component of internal/metaschema, the one migrator of the
// meta schema: migrations are append-only, one step each, "%s" is the quoted meta
// schema. Before the shared version table they were recorded in diff_schema_migrations,
// which the migrator adopts once.
var migrations = []string{
	`CREATE TABLE IF NOT EXISTS %s.diff_runs (
		run_id VARCHAR(64) NOT NULL PRIMARY KEY,
		state VARCHAR(16) NOT NULL,
		config LONGTEXT NOT NULL,
		created_at DATETIME(3) NOT NULL,
		updated_at DATETIME(3) NOT NULL,
		error TEXT NULL
	)`,
	`CREATE TABLE IF NOT EXISTS %s.diff_tables (
		run_id VARCHAR(64) NOT NULL,
		table_idx INT NOT NULL,
		up_schema VARCHAR(64) NOT NULL,
		up_table VARCHAR(64) NOT NULL,
		down_schema VARCHAR(64) NOT NULL,
		down_table VARCHAR(64) NOT NULL,
		split_done TINYINT NOT NULL DEFAULT 0,
		checkpoint_seq BIGINT NOT NULL DEFAULT -1,
		PRIMARY KEY (run_id, table_idx)
	)`,
	`CREATE TABLE IF NOT EXISTS %s.diff_chunks (
		run_id VARCHAR(64) NOT NULL,
		table_idx INT NOT NULL,
		seq BIGINT NOT NULL,
		lo_bound LONGTEXT NOT NULL,
		hi_bound LONGTEXT NOT NULL,
		is_last TINYINT NOT NULL,
		state VARCHAR(16) NOT NULL,
		up_count BIGINT NULL,
		down_count BIGINT NULL,
		up_sum VARCHAR(40) NULL,
		down_sum VARCHAR(40) NULL,
		differences BIGINT NOT NULL DEFAULT 0,
		attempts INT NOT NULL DEFAULT 0,
		updated_at DATETIME(3) NOT NULL,
		PRIMARY KEY (run_id, table_idx, seq)
	)`,
	`CREATE TABLE IF NOT EXISTS %s.diff_differences (
		run_id VARCHAR(64) NOT NULL,
		table_idx INT NOT NULL,
		chunk_seq BIGINT NOT NULL,
		n INT NOT NULL,
		kind VARCHAR(16) NOT NULL,
		diff LONGTEXT NOT NULL,
		fix_sql LONGTEXT NOT NULL,
		PRIMARY KEY (run_id, table_idx, chunk_seq, n)
	)`,
	// A difference longer than storedPieceBytes (a row of wide values) is stored in
	// pieces: its diff_differences row holds empty texts (a stored difference's JSON is
	// never empty otherwise). Every migration is idempotent (IF NOT EXISTS): two runs
	// starting at once may both apply it.
	`CREATE TABLE IF NOT EXISTS %s.diff_difference_parts (
		run_id VARCHAR(64) NOT NULL,
		table_idx INT NOT NULL,
		chunk_seq BIGINT NOT NULL,
		n INT NOT NULL,
		part INT NOT NULL,
		diff LONGTEXT NOT NULL,
		fix_sql LONGTEXT NOT NULL,
		PRIMARY KEY (run_id, table_idx, chunk_seq, n, part)
	)`,
	// The re-check (recheck.go): per chunk, how many of its differences were found equal
	// when read again. Updated in the transaction that drops them, so a resumed run never
	// counts one twice.
	`CREATE TABLE IF NOT EXISTS %s.diff_rechecks (
		run_id VARCHAR(64) NOT NULL,
		table_idx INT NOT NULL,
		chunk_seq BIGINT NOT NULL,
		resolved BIGINT NOT NULL,
		PRIMARY KEY (run_id, table_idx, chunk_seq)
	)`,
}

// steps are the migrations after the first (one CREATE TABLE each, named by init): named
// steps, append-only like migrations, each applied once (a statement that ran before but
// was not recorded is tolerated by the migrator).
var steps = []metaschema.Step{
	// The classification of each difference (classify.go): imported, post-import, cdc,
	// diverged or unclassified; '' until the run classifies it.
	{Name: "diff_differences.class: each difference's classification", Stmts: []string{
		`ALTER TABLE %s.diff_differences ADD COLUMN class VARCHAR(16) NOT NULL DEFAULT '' AFTER kind`,
	}},
	// What a run compares of each table (dirty.go): full, keys (a ledger window
	// (scope_from, scope_until] of scope_keys keys) or whole (scope_note says why), and
	// the point it compares at (scope_until, 0 when not at a snapshot pair), kept when
	// the run resumes.
	{Name: "diff_tables scope: what a run compares of each table", Stmts: []string{
		`ALTER TABLE %s.diff_tables ADD COLUMN scope VARCHAR(8) NOT NULL DEFAULT '',
			ADD COLUMN scope_from BIGINT UNSIGNED NOT NULL DEFAULT 0,
			ADD COLUMN scope_until BIGINT UNSIGNED NOT NULL DEFAULT 0,
			ADD COLUMN scope_keys BIGINT NOT NULL DEFAULT 0,
			ADD COLUMN scope_note VARCHAR(255) NOT NULL DEFAULT ''`,
	}},
	// Clean verifications (verified.go): per changefeed and upstream table, the newest
	// TSO at which a run at a snapshot pair found the table equal; scope cdc starts there.
	{Name: "create diff_verified", Stmts: []string{
		`CREATE TABLE IF NOT EXISTS %s.diff_verified (
			changefeed VARCHAR(128) NOT NULL,
			schema_name VARCHAR(64) NOT NULL,
			table_name VARCHAR(64) NOT NULL,
			verified_ts BIGINT UNSIGNED NOT NULL,
			run_id VARCHAR(64) NOT NULL,
			scope VARCHAR(128) NOT NULL,
			verified_at DATETIME(3) NOT NULL,
			PRIMARY KEY (changefeed, schema_name, table_name)
		)`,
	}},
	// The confirmation at a snapshot pair (recheck.go): per chunk, how many of the
	// differences it found were equal when read again at the same pair (a snapshot read
	// that was not repeatable: never counted as resolved, and not reported).
	{Name: "diff_rechecks.unconfirmed: differences gone when read again at the same pair", Stmts: []string{
		`ALTER TABLE %s.diff_rechecks ADD COLUMN unconfirmed BIGINT NOT NULL DEFAULT 0`,
	}},
}

// Run states.
const (
	RunRunning   = "running"
	RunDone      = "done"
	RunFailed    = "failed"
	RunCancelled = "cancelled"
)

// Chunk states.
const (
	chunkPending = "pending"
	chunkRunning = "running"
	chunkDone    = "done"
)

type store struct {
	db     *sql.DB
	raw    string // the meta schema's name
	schema string // quoted
	runID  string
	tmo    time.Duration
}

func (s *store) q(format string) string { return strings.ReplaceAll(format, "%s", s.schema) }

func (s *store) ctx(parent context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(parent, s.tmo)
}

func init() {
	all := make([]metaschema.Step, len(migrations), len(migrations)+len(steps))
	for i, m := range migrations {
		name := strings.Fields(strings.TrimPrefix(strings.TrimSpace(m), "CREATE TABLE IF NOT EXISTS %s."))[0]
		all[i] = metaschema.Step{Name: "create " + name, Stmts: []string{m}}
	}
	all = append(all, steps...)
	metaschema.Register(metaschema.Component{
		Name:   "checker",
		Legacy: "diff_schema_migrations",
		// Releases before parity_migrations kept no version guard for the diff tables;
		// the seal at least keeps them from re-running their migrations.
		LegacySeal: []string{
			`CREATE TABLE IF NOT EXISTS %s.diff_schema_migrations (version INT NOT NULL PRIMARY KEY, applied_at DATETIME(3) NOT NULL)`,
			`INSERT IGNORE INTO %s.diff_schema_migrations VALUES (%v, NOW(3))`,
		},
		Tables: []string{"diff_runs", "diff_tables", "diff_chunks", "diff_differences", "diff_difference_parts", "diff_rechecks", verifiedTable},
		Steps:  all,
	})
}

// migrate creates the meta schema and brings it up to date (every component this binary
// has, not only the checker's).
func (s *store) migrate(ctx context.Context) error {
	return metaschema.Migrate(ctx, s.db, s.raw, s.tmo)
}

func newRunID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return time.Now().UTC().Format("20060102T150405") + "-" + hex.EncodeToString(b[:])
}

func (s *store) createRun(ctx context.Context, cfg *Config) error {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	data, _ := json.Marshal(cfg)
	_, err := s.db.ExecContext(ctx, s.q("INSERT INTO %s.diff_runs (run_id, state, config, created_at, updated_at) VALUES (?, ?, ?, NOW(3), NOW(3))"),
		s.runID, RunRunning, string(data))
	if err != nil {
		return fmt.Errorf("create run: %w", err)
	}
	return nil
}

// ErrRunNotFound is returned when --resume names an unknown run.
var ErrRunNotFound = errors.New("run not found")

// resumeRun moves a stored run back to running. Settings that decide what a chunk's
// result means (hash, row filters, ignored columns, routes) must not change on resume.
func (s *store) resumeRun(ctx context.Context, cfg *Config) error {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var state, stored string
	err := s.db.QueryRowContext(ctx, s.q("SELECT state, config FROM %s.diff_runs WHERE run_id = ?"), s.runID).Scan(&state, &stored)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("resume %s: %w", s.runID, ErrRunNotFound)
	}
	if err != nil {
		return fmt.Errorf("read run %s: %w", s.runID, err)
	}
	var old Config
	if err := json.Unmarshal([]byte(stored), &old); err != nil {
		return fmt.Errorf("read config of run %s: %w", s.runID, err)
	}
	var changed []string
	same := func(key string, a, b any) {
		x, _ := json.Marshal(a)
		y, _ := json.Marshal(b)
		if string(x) != string(y) {
			changed = append(changed, key)
		}
	}
	same("hash", old.Hash, cfg.Hash)
	same("table", old.TableConfigs, cfg.TableConfigs)
	same("ignore_columns", old.IgnoreColumns, cfg.IgnoreColumns)
	same("routes", old.Routes, cfg.Routes)
	same("upstream.snapshot", old.Upstream.Snapshot, cfg.Upstream.Snapshot)
	oldScope, _ := ParseScope(old.Scope)
	newScope, _ := ParseScope(cfg.Scope)
	same("scope", oldScope, newScope)
	if len(changed) > 0 {
		return fmt.Errorf("resume %s: settings changed since the run started: %s (start a new run instead)", s.runID, strings.Join(changed, ", "))
	}
	if _, err := s.db.ExecContext(ctx, s.q("UPDATE %s.diff_runs SET state = ?, error = NULL, updated_at = NOW(3) WHERE run_id = ?"), RunRunning, s.runID); err != nil {
		return fmt.Errorf("mark run %s running: %w", s.runID, err)
	}
	// Chunks that were in flight start over.
	if _, err := s.db.ExecContext(ctx, s.q("UPDATE %s.diff_chunks SET state = ? WHERE run_id = ? AND state = ?"), chunkPending, s.runID, chunkRunning); err != nil {
		return fmt.Errorf("reset in-flight chunks of %s: %w", s.runID, err)
	}
	return nil
}

func (s *store) finishRun(ctx context.Context, state string, runErr error) error {
	ctx, cancel := s.ctx(context.WithoutCancel(ctx))
	defer cancel()
	var msg any
	if runErr != nil {
		msg = runErr.Error()
	}
	_, err := s.db.ExecContext(ctx, s.q("UPDATE %s.diff_runs SET state = ?, error = ?, updated_at = NOW(3) WHERE run_id = ?"), state, msg, s.runID)
	if err != nil {
		return fmt.Errorf("mark run %s %s: %w", s.runID, state, err)
	}
	return nil
}

type storedTable struct {
	idx                  int
	upSchema, upTable    string
	downSchema, downName string
	splitDone            bool
	checkpoint           int
	// The table's scope as stored (setTableScope); scopeMode "" when not yet stored.
	scopeMode             string
	scopeFrom, scopeUntil uint64
	scopeKeys             int64
	scopeNote             string
}

func (s *store) addTable(ctx context.Context, t storedTable) error {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	_, err := s.db.ExecContext(ctx, s.q("INSERT INTO %s.diff_tables (run_id, table_idx, up_schema, up_table, down_schema, down_table) VALUES (?, ?, ?, ?, ?, ?)"),
		s.runID, t.idx, t.upSchema, t.upTable, t.downSchema, t.downName)
	if err != nil {
		return fmt.Errorf("record table %s.%s: %w", t.upSchema, t.upTable, err)
	}
	return nil
}

func (s *store) tables(ctx context.Context) ([]storedTable, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	rows, err := s.db.QueryContext(ctx, s.q("SELECT table_idx, up_schema, up_table, down_schema, down_table, split_done, checkpoint_seq,"+
		" scope, scope_from, scope_until, scope_keys, scope_note FROM %s.diff_tables WHERE run_id = ? ORDER BY table_idx"), s.runID)
	if err != nil {
		return nil, fmt.Errorf("read tables of run %s: %w", s.runID, err)
	}
	defer rows.Close()
	var out []storedTable
	for rows.Next() {
		var t storedTable
		if err := rows.Scan(&t.idx, &t.upSchema, &t.upTable, &t.downSchema, &t.downName, &t.splitDone, &t.checkpoint,
			&t.scopeMode, &t.scopeFrom, &t.scopeUntil, &t.scopeKeys, &t.scopeNote); err != nil {
			return nil, fmt.Errorf("read tables of run %s: %w", s.runID, err)
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// setTableScope stores what the run compares of a table (kept when it resumes).
func (s *store) setTableScope(ctx context.Context, table int, sc *tableScope) error {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	_, err := s.db.ExecContext(ctx, s.q("UPDATE %s.diff_tables SET scope = ?, scope_from = ?, scope_until = ?, scope_keys = ?, scope_note = ? WHERE run_id = ? AND table_idx = ?"),
		sc.mode, sc.from, sc.until, len(sc.keys), truncateRunes(sc.note, 255), s.runID, table)
	if err != nil {
		return fmt.Errorf("record the scope of table %d: %w", table, err)
	}
	return nil
}

// truncateRunes cuts s to at most n characters.
func truncateRunes(s string, n int) string {
	for i := range s {
		if n == 0 {
			return s[:i]
		}
		n--
	}
	return s
}

// addChunks records newly cut chunks (pending) in one statement; the table's split is
// recorded with them when the batch holds its last chunk.
func (s *store) addChunks(ctx context.Context, cs []Chunk) error {
	if len(cs) == 0 {
		return nil
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	first, last := cs[0], cs[len(cs)-1]
	var sb strings.Builder
	args := make([]any, 0, len(cs)*7)
	sb.WriteString(s.q("INSERT INTO %s.diff_chunks (run_id, table_idx, seq, lo_bound, hi_bound, is_last, state, updated_at) VALUES "))
	for i, c := range cs {
		if i > 0 {
			sb.WriteString(", ")
		}
		sb.WriteString("(?, ?, ?, ?, ?, ?, ?, NOW(3))")
		args = append(args, s.runID, c.Table, c.Seq, c.bounds[0], c.bounds[1], c.Last, chunkPending)
	}
	fail := func(err error) error {
		return fmt.Errorf("record chunks %d-%d of table %d: %w", first.Seq, last.Seq, first.Table, err)
	}
	if !last.Last {
		// One autocommitted statement: chunks are cut every few thousand rows, so their
		// round trips count.
		if _, err := s.db.ExecContext(ctx, sb.String(), args...); err != nil {
			return fail(err)
		}
		return nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fail(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, sb.String(), args...); err != nil {
		return fail(err)
	}
	if _, err := tx.ExecContext(ctx, s.q("UPDATE %s.diff_tables SET split_done = 1 WHERE run_id = ? AND table_idx = ?"), s.runID, last.Table); err != nil {
		return fmt.Errorf("record split of table %d: %w", last.Table, err)
	}
	if err := tx.Commit(); err != nil {
		return fail(err)
	}
	return nil
}

type storedChunk struct {
	Chunk
	state string
	res   chunkResult // the counts of a done chunk (no sums, no durations)
}

func (s *store) chunks(ctx context.Context, table int) ([]storedChunk, error) {
	return s.chunksWhere(ctx, table, "")
}

// chunksWithDifferences returns the done chunks of a table that hold stored differences.
func (s *store) chunksWithDifferences(ctx context.Context, table int) ([]storedChunk, error) {
	return s.chunksWhere(ctx, table, " AND state = '"+chunkDone+"' AND differences > 0")
}

// chunksWhere returns the chunks of a table matching clause (an AND clause), in seq order.
func (s *store) chunksWhere(ctx context.Context, table int, clause string) ([]storedChunk, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	rows, err := s.db.QueryContext(ctx, s.q("SELECT seq, lo_bound, hi_bound, is_last, state, IFNULL(up_count,0), IFNULL(down_count,0), differences FROM %s.diff_chunks WHERE run_id = ? AND table_idx = ?"+clause+" ORDER BY seq"), s.runID, table)
	if err != nil {
		return nil, fmt.Errorf("read chunks of table %d: %w", table, err)
	}
	defer rows.Close()
	var out []storedChunk
	for rows.Next() {
		var c storedChunk
		var lo, hi string
		c.Table = table
		if err := rows.Scan(&c.Seq, &lo, &hi, &c.Last, &c.state, &c.res.up.count, &c.res.down.count, &c.res.differences); err != nil {
			return nil, fmt.Errorf("read chunks of table %d: %w", table, err)
		}
		if c.Range.Lo, err = decodeBound(lo); err != nil {
			return nil, fmt.Errorf("chunk %d of table %d: %w", c.Seq, table, err)
		}
		if c.Range.Hi, err = decodeBound(hi); err != nil {
			return nil, fmt.Errorf("chunk %d of table %d: %w", c.Seq, table, err)
		}
		c.bounds = [2]string{lo, hi}
		out = append(out, c)
	}
	return out, rows.Err()
}

// startChunk marks a retried chunk (c.retry: resumed, or failed before) in flight and
// drops differences a previous attempt recorded; a first attempt goes through the journal.
func (s *store) startChunk(ctx context.Context, c Chunk) error {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	if _, err := s.db.ExecContext(ctx, s.q("UPDATE %s.diff_chunks SET state = ?, attempts = attempts + 1, updated_at = NOW(3) WHERE run_id = ? AND table_idx = ? AND seq = ?"),
		chunkRunning, s.runID, c.Table, c.Seq); err != nil {
		return fmt.Errorf("start chunk %d of table %d: %w", c.Seq, c.Table, err)
	}
	return s.dropDifferences(ctx, c)
}

// dropDifferences deletes the differences stored for chunk c.
func (s *store) dropDifferences(ctx context.Context, c Chunk) error {
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

// commitChunks stores a batch of the journal in one statement, a multi-row upsert of
// chunk rows that exist (addChunks stored them): started chunks become running with one
// more attempt, finished ones done with their results (and one more attempt when their
// start is in the same batch). Then the tables' checkpoints, when given: a checkpoint is
// stored only once every chunk up to it is stored as done, so a failure in between leaves
// it behind, never ahead.
func (s *store) commitChunks(ctx context.Context, batch []chunkUpdate, checkpoints map[int]int) error {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	if len(batch) > 0 {
		var sb strings.Builder
		args := make([]any, 0, len(batch)*13)
		sb.WriteString(s.q("INSERT INTO %s.diff_chunks (run_id, table_idx, seq, lo_bound, hi_bound, is_last, state, up_count, down_count, up_sum, down_sum, differences, attempts, updated_at) VALUES "))
		for i, u := range batch {
			if i > 0 {
				sb.WriteString(", ")
			}
			sb.WriteString("(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NOW(3))")
			attempts := 0
			if u.started {
				attempts = 1
			}
			state := chunkRunning
			var upCount, downCount, upSum, downSum any // NULL while running
			if u.finished {
				state = chunkDone
				upCount, downCount, upSum, downSum = u.res.up.count, u.res.down.count, u.res.up.sum, u.res.down.sum
			}
			args = append(args, s.runID, u.chunk.Table, u.chunk.Seq, u.chunk.bounds[0], u.chunk.bounds[1], u.chunk.Last, state,
				upCount, downCount, upSum, downSum, u.res.differences, attempts)
		}
		sb.WriteString(" ON DUPLICATE KEY UPDATE state = VALUES(state), up_count = VALUES(up_count), down_count = VALUES(down_count)," +
			" up_sum = VALUES(up_sum), down_sum = VALUES(down_sum), differences = VALUES(differences)," +
			" attempts = attempts + VALUES(attempts), updated_at = VALUES(updated_at)")
		if _, err := s.db.ExecContext(ctx, sb.String(), args...); err != nil {
			return fmt.Errorf("store states of chunks %d-%d of table %d: %w", batch[0].chunk.Seq, batch[len(batch)-1].chunk.Seq, batch[0].chunk.Table, err)
		}
	}
	for t, cp := range checkpoints {
		if _, err := s.db.ExecContext(ctx, s.q("UPDATE %s.diff_tables SET checkpoint_seq = GREATEST(checkpoint_seq, ?) WHERE run_id = ? AND table_idx = ?"), cp, s.runID, t); err != nil {
			return fmt.Errorf("advance checkpoint of table %d: %w", t, err)
		}
	}
	return nil
}

// chunkUpdate is one chunk's row in a journal batch: started (running, one more
// attempt), finished (done, with res), or both.
type chunkUpdate struct {
	chunk    Chunk
	started  bool
	finished bool
	res      chunkResult
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
func (s *store) replaceDifferences(ctx context.Context, table int, old []diffRef, all bool, oldRows map[int]int64, news []storedDiff, confirm bool) (int64, error) {
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
