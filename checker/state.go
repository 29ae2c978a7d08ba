package checker

// state.go owns the persisted run state machine in the meta schema: the checker's
// migrations, the store and its query bounds, a run's row (created, resumed, finished),
// its tables and their scopes, its chunks and the journal's batched chunk updates with
// the checkpoints. The stored differences are differences.go's. It must not decide a
// chunk's result nor the checkpoint (the tracker does); it stores them.

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
	// The classification of each difference (classify.go): bypass, imported, post-import,
	// cdc, diverged or unclassified; '' until the run classifies it.
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
	runRunning   = "running"
	runDone      = "done"
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

func (s *store) q(format string) string { return metaschema.Q(s.schema, format) }

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
		s.runID, runRunning, string(data))
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
	same("scope", oldScope, cfg.scope)
	if len(changed) > 0 {
		return fmt.Errorf("resume %s: settings changed since the run started: %s (start a new run instead)", s.runID, strings.Join(changed, ", "))
	}
	if _, err := s.db.ExecContext(ctx, s.q("UPDATE %s.diff_runs SET state = ?, error = NULL, updated_at = NOW(3) WHERE run_id = ?"), runRunning, s.runID); err != nil {
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
func (s *store) addChunks(ctx context.Context, cs []keyChunk) error {
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
	keyChunk
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
		if c.keyRange.Lo, err = decodeBound(lo); err != nil {
			return nil, fmt.Errorf("chunk %d of table %d: %w", c.Seq, table, err)
		}
		if c.keyRange.Hi, err = decodeBound(hi); err != nil {
			return nil, fmt.Errorf("chunk %d of table %d: %w", c.Seq, table, err)
		}
		c.bounds = [2]string{lo, hi}
		out = append(out, c)
	}
	return out, rows.Err()
}

// startChunk marks a retried chunk (c.retry: resumed, or failed before) in flight and
// drops differences a previous attempt recorded; a first attempt goes through the journal.
func (s *store) startChunk(ctx context.Context, c keyChunk) error {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	if _, err := s.db.ExecContext(ctx, s.q("UPDATE %s.diff_chunks SET state = ?, attempts = attempts + 1, updated_at = NOW(3) WHERE run_id = ? AND table_idx = ? AND seq = ?"),
		chunkRunning, s.runID, c.Table, c.Seq); err != nil {
		return fmt.Errorf("start chunk %d of table %d: %w", c.Seq, c.Table, err)
	}
	return s.dropDifferences(ctx, c)
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
	chunk    keyChunk
	started  bool
	finished bool
	res      chunkResult
}
