package cdc

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tidb-parity/parity/cdc/simple"
	"github.com/tidb-parity/parity/internal/bypasslog"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/ledger"
	"github.com/tidb-parity/parity/internal/metaschema"
)

// The meta schema lives in the downstream so that progress becomes durable in the same
// server (and, for keyless tables, the same transaction) as the rows it covers.
//
// Its tables are the "cdc" component of internal/metaschema, the one migrator of the meta
// schema: migrations are append-only (never edit or reorder one, add a new one); "%s" is
// the quoted meta schema. Before the shared version table, versions were recorded in
// schema_migrations, which the migrator adopts once.
var migrations = []metaschema.Step{
	{Name: "create checkpoint, offsets, ddl and dead letter tables", Stmts: []string{
		`CREATE TABLE IF NOT EXISTS %s.checkpoint (
			changefeed VARCHAR(128) NOT NULL PRIMARY KEY,
			applied_ts BIGINT UNSIGNED NOT NULL,
			updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6)
		) ENGINE=InnoDB`,
		`CREATE TABLE IF NOT EXISTS %s.partition_offset (
			changefeed VARCHAR(128) NOT NULL,
			topic VARCHAR(249) NOT NULL,
			kafka_partition INT NOT NULL,
			next_offset BIGINT NOT NULL,
			PRIMARY KEY (changefeed, topic, kafka_partition)
		) ENGINE=InnoDB`,
		`CREATE TABLE IF NOT EXISTS %s.table_progress (
			changefeed VARCHAR(128) NOT NULL,
			schema_name VARCHAR(64) NOT NULL,
			table_name VARCHAR(64) NOT NULL,
			applied_ts BIGINT UNSIGNED NOT NULL,
			PRIMARY KEY (changefeed, schema_name, table_name)
		) ENGINE=InnoDB`,
		`CREATE TABLE IF NOT EXISTS %s.ddl_applied (
			changefeed VARCHAR(128) NOT NULL,
			commit_ts BIGINT UNSIGNED NOT NULL,
			query_hash CHAR(64) NOT NULL,
			query LONGTEXT NOT NULL,
			executed LONGTEXT NOT NULL,
			applied_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
			PRIMARY KEY (changefeed, commit_ts, query_hash)
		) ENGINE=InnoDB`,
		`CREATE TABLE IF NOT EXISTS %s.dead_letter (
			changefeed VARCHAR(128) NOT NULL,
			topic VARCHAR(249) NOT NULL,
			kafka_partition INT NOT NULL,
			kafka_offset BIGINT NOT NULL,
			record_key LONGBLOB,
			record_value LONGBLOB,
			error TEXT NOT NULL,
			created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
			PRIMARY KEY (changefeed, topic, kafka_partition, kafka_offset)
		) ENGINE=InnoDB`,
	}},
	{Name: "ddl_applied.skipped: why a DDL was recorded without running", Stmts: []string{
		`ALTER TABLE %s.ddl_applied ADD COLUMN skipped VARCHAR(1024) NOT NULL DEFAULT '' AFTER executed`,
	}},
	// The dirty-key ledger (its layout and rules are internal/ledger's contract with the
	// checker) and the ts-map.
	{Name: "dirty_keys ledger and ts_map", Stmts: []string{
		`CREATE TABLE IF NOT EXISTS %s.` + ledger.Table + ` (
			changefeed VARCHAR(128) NOT NULL,
			max_ts BIGINT UNSIGNED NOT NULL,
			schema_name VARCHAR(64) NOT NULL,
			table_name VARCHAR(64) NOT NULL,
			part INT NOT NULL,
			min_ts BIGINT UNSIGNED NOT NULL,
			key_count INT NOT NULL,
			entries LONGBLOB NOT NULL,
			PRIMARY KEY (changefeed, max_ts, schema_name, table_name, part)
		) ENGINE=InnoDB`,
		`CREATE TABLE IF NOT EXISTS %s.ts_map (
			changefeed VARCHAR(128) NOT NULL,
			upstream_ts BIGINT UNSIGNED NOT NULL,
			downstream_pos TEXT NOT NULL,
			wall_time TIMESTAMP(6) NOT NULL,
			source VARCHAR(32) NOT NULL,
			PRIMARY KEY (changefeed, upstream_ts)
		) ENGINE=InnoDB`,
	}},
	// Where the ledger starts: before since_ts it may lack changes (written by a release
	// without it, or while applier.ledger was off).
	{Name: "ledger_range: where the ledger starts", Stmts: []string{
		`CREATE TABLE IF NOT EXISTS %s.` + ledger.RangeTable + ` (
			changefeed VARCHAR(128) NOT NULL PRIMARY KEY,
			since_ts BIGINT UNSIGNED NOT NULL,
			updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6)
		) ENGINE=InnoDB`,
	}},
	// The marker of parity's own transactions in the fallback's binlog (internal/bypasslog's
	// contract with the bypass detector): one row per writer, upserted in every
	// transaction that writes replicated rows.
	{Name: "write_marker: parity's transactions in the binlog", Stmts: []string{
		`CREATE TABLE IF NOT EXISTS %s.` + bypasslog.MarkerTable + ` (
			changefeed VARCHAR(128) NOT NULL,
			writer VARCHAR(64) NOT NULL,
			writes BIGINT UNSIGNED NOT NULL,
			PRIMARY KEY (changefeed, writer)
		) ENGINE=InnoDB`,
	}},
	// Standby daemons: the lease, its takeovers, and each checkpoint's epoch (ha.go).
	haMigration,
	// The simple protocol's schema cache, saved with the checkpoints (simpleschema.go).
	simpleSchemaMigration,
}

// meta reads and writes the meta schema.
type meta struct {
	db         *sql.DB
	raw        string // the meta schema's name
	schema     string // quoted
	changefeed string
	timeout    time.Duration
	// epoch is the lease this daemon applies under (ha.go): every write transaction
	// checks it (fence). 0 without ha: no check.
	epoch uint64
	// ddlSeq numbers parity's DDL marks (markDDL): each changes the marker row.
	ddlSeq atomic.Uint32
}

func newMeta(db *sql.DB, schema, changefeed string, timeout time.Duration) *meta {
	return &meta{db: db, raw: schema, schema: ident.Quote(schema), changefeed: changefeed, timeout: timeout}
}

func (m *meta) q(format string) string { return metaschema.Q(m.schema, format) }

func init() {
	metaschema.Register(metaschema.Component{
		Name:   "cdc",
		Legacy: "schema_migrations",
		// Releases before parity_migrations read only schema_migrations: the seal makes
		// them refuse a schema this one wrote (they would apply rows without the ledger).
		LegacySeal: []string{
			`CREATE TABLE IF NOT EXISTS %s.schema_migrations (
				version INT NOT NULL PRIMARY KEY,
				name VARCHAR(255) NOT NULL,
				applied_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
			) ENGINE=InnoDB`,
			`INSERT IGNORE INTO %s.schema_migrations (version, name) VALUES (%v, 'superseded by parity_migrations: run a parity that has it')`,
		},
		Tables: []string{"checkpoint", "partition_offset", "table_progress", "ddl_applied", "dead_letter", ledger.Table, ledger.RangeTable, "ts_map", bypasslog.MarkerTable, "ha_lease", "ha_epochs", simpleSchemaTable},
		Steps:  migrations,
	})
}

// migrate creates the meta schema and brings it up to date (every component this binary
// has, not only the applier's).
func (m *meta) migrate(ctx context.Context) error {
	return metaschema.Migrate(ctx, m.db, m.raw, m.timeout)
}

// partKey identifies a Kafka partition.
type partKey struct {
	Topic     string
	Partition int
}

func (p partKey) String() string { return fmt.Sprintf("%s/%d", p.Topic, p.Partition) }

// savedState is what a restart resumes from.
type savedState struct {
	appliedTs     uint64
	hasCheckpoint bool
	offsets       map[partKey]int64
	tableProgress map[tableKey]uint64 // keyless tables applied beyond appliedTs
	ddlApplied    map[ddlKey]bool     // DDLs with commit ts >= appliedTs already executed
}

func (m *meta) load(ctx context.Context) (savedState, error) {
	ctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	st := savedState{offsets: map[partKey]int64{}, tableProgress: map[tableKey]uint64{}, ddlApplied: map[ddlKey]bool{}}
	var err error
	if st.appliedTs, st.hasCheckpoint, err = m.checkpoint(ctx); err != nil {
		return st, err
	}
	err = m.scan(ctx, "offsets", m.q("SELECT topic, kafka_partition, next_offset FROM %s.partition_offset WHERE changefeed=?"),
		func(rows *sql.Rows) error {
			var p partKey
			var off int64
			if err := rows.Scan(&p.Topic, &p.Partition, &off); err != nil {
				return err
			}
			st.offsets[p] = off
			return nil
		}, m.changefeed)
	if err != nil {
		return st, err
	}
	err = m.scan(ctx, "table progress", m.q("SELECT schema_name, table_name, applied_ts FROM %s.table_progress WHERE changefeed=? AND applied_ts>?"),
		func(rows *sql.Rows) error {
			var t tableKey
			var ts uint64
			if err := rows.Scan(&t.Schema, &t.Table, &ts); err != nil {
				return err
			}
			st.tableProgress[t] = ts
			return nil
		}, m.changefeed, st.appliedTs)
	if err != nil {
		return st, err
	}
	err = m.scan(ctx, "applied DDLs", m.q("SELECT commit_ts, query_hash FROM %s.ddl_applied WHERE changefeed=? AND commit_ts>=?"),
		func(rows *sql.Rows) error {
			var k ddlKey
			if err := rows.Scan(&k.ts, &k.hash); err != nil {
				return err
			}
			st.ddlApplied[k] = true
			return nil
		}, m.changefeed, st.appliedTs)
	if err != nil {
		return st, err
	}
	return st, nil
}

// checkpoint reads the changefeed's applied checkpoint; ok is false when it has none.
func (m *meta) checkpoint(ctx context.Context) (appliedTs uint64, ok bool, err error) {
	err = m.db.QueryRowContext(ctx, m.q("SELECT applied_ts FROM %s.checkpoint WHERE changefeed=?"), m.changefeed).Scan(&appliedTs)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return 0, false, nil
	case err != nil:
		return 0, false, fmt.Errorf("reading checkpoint: %w", err)
	}
	return appliedTs, true, nil
}

// scan runs query and calls row for every row it returns; an error reading, scanning
// or ending the rows is wrapped as "reading <what>".
func (m *meta) scan(ctx context.Context, what, query string, row func(*sql.Rows) error, args ...any) error {
	rows, err := m.db.QueryContext(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("reading %s: %w", what, err)
	}
	for err == nil && rows.Next() {
		err = row(rows)
	}
	if err == nil {
		err = rows.Err()
	}
	if cerr := rows.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("reading %s: %w", what, err)
	}
	return nil
}

// saveCheckpoint records appliedTs, the resume offsets, the round's ledger parts and
// the simple-protocol schemas learned since the last checkpoint (simpleschema.go) in
// one transaction. It is called only after every row up to appliedTs is durable
// downstream.
func (m *meta) saveCheckpoint(ctx context.Context, appliedTs uint64, offsets map[partKey]int64, parts []ledgerPart, schemas []simple.SchemaEntry) error {
	ctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	tx, err := m.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("saving checkpoint: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after commit
	if err := m.fence(ctx, tx); err != nil {
		return fmt.Errorf("saving checkpoint: %w", err)
	}
	if _, err := tx.ExecContext(ctx, m.q(`INSERT INTO %s.checkpoint (changefeed, applied_ts, epoch) VALUES (?, ?, ?)
		ON DUPLICATE KEY UPDATE applied_ts=VALUES(applied_ts), epoch=VALUES(epoch)`), m.changefeed, appliedTs, m.epoch); err != nil {
		return fmt.Errorf("saving checkpoint: %w", err)
	}
	if len(offsets) > 0 {
		var b strings.Builder
		b.WriteString(m.q("INSERT INTO %s.partition_offset (changefeed, topic, kafka_partition, next_offset) VALUES "))
		args := make([]any, 0, 4*len(offsets))
		i := 0
		for p, off := range offsets {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString("(?,?,?,?)")
			args = append(args, m.changefeed, p.Topic, p.Partition, off)
			i++
		}
		b.WriteString(" ON DUPLICATE KEY UPDATE next_offset=VALUES(next_offset)")
		if _, err := tx.ExecContext(ctx, b.String(), args...); err != nil {
			return fmt.Errorf("saving offsets: %w", err)
		}
	}
	if err := m.writeLedger(ctx, tx, appliedTs, parts); err != nil {
		return err
	}
	if err := m.writeSimpleSchemas(ctx, tx, schemas); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("saving checkpoint: %w", err)
	}
	return nil
}

// recordDDL marks a DDL done: executed as the statement run downstream, or skipped with
// the reason ("" when it ran).
func (m *meta) recordDDL(ctx context.Context, k ddlKey, query, executed, skipped string) error {
	ctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	err := m.execFenced(ctx, m.db, m.q("INSERT IGNORE INTO %s.ddl_applied (changefeed, commit_ts, query_hash, query, executed, skipped) VALUES (?,?,?,?,?,?)"),
		m.changefeed, k.ts, k.hash, query, executed, truncate(skipped, 1024))
	if err != nil {
		return fmt.Errorf("recording DDL: %w", err)
	}
	return nil
}

// truncate cuts s to at most n runes.
func truncate(s string, n int) string {
	for i := range s {
		if n == 0 {
			return s[:i]
		}
		n--
	}
	return s
}

// deadLetter stores an undecodable record before its offset is passed.
func (m *meta) deadLetter(ctx context.Context, p partKey, offset int64, key, value []byte, cause error) error {
	ctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	err := m.execFenced(ctx, m.db, m.q(`INSERT IGNORE INTO %s.dead_letter
		(changefeed, topic, kafka_partition, kafka_offset, record_key, record_value, error) VALUES (?,?,?,?,?,?,?)`),
		m.changefeed, p.Topic, p.Partition, offset, key, value, cause.Error())
	if err != nil {
		return fmt.Errorf("writing dead letter: %w", err)
	}
	return nil
}

// mark upserts writer's marker row inside tx, so that the bypass detector knows the
// transaction for parity's (internal/bypasslog). It is the transaction's first write:
// the detector then knows it before the rows.
func (m *meta) mark(ctx context.Context, tx *sql.Tx, writer string) error {
	if _, err := tx.ExecContext(ctx, m.q(bypasslog.MarkSQL), m.changefeed, writer); err != nil {
		return fmt.Errorf("writing the marker of %s: %w", writer, err)
	}
	return nil
}

// markDDL marks conn as the connection of parity's next DDL (bypasslog.MarkDDLSQL): a
// DDL is its own transaction and cannot carry the marker row itself.
func (m *meta) markDDL(ctx context.Context, conn *sql.Conn) error {
	var id uint64
	if err := conn.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
		return fmt.Errorf("marking the DDL's connection: %w", err)
	}
	mark := bypasslog.DDLMark(m.ddlSeq.Add(1), id)
	if _, err := conn.ExecContext(ctx, m.q(bypasslog.MarkDDLSQL), m.changefeed, mark); err != nil {
		return fmt.Errorf("marking the DDL's connection: %w", err)
	}
	return nil
}

// txnStmt is one statement of an apply transaction, and the table it writes.
type txnStmt struct {
	table string
	q     string
	args  []any
	text  []byte    // q's bytes (or load's file) when they belong to an apply worker's stmtTexts
	load  *loadData // a LOAD DATA statement (load.go); nil for others
}

// execMarked runs stmts in one transaction that writer's marker opens (after the lease's
// fence with ha): all of them commit or none. between (nil: none) runs after each
// statement that another follows, inside the transaction (the tests' crash point).
func (m *meta) execMarked(ctx context.Context, db *sql.DB, writer string, stmts []txnStmt, between func() error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // no-op after commit
	// The lease first (ha.go), then the marker.
	if err := m.fence(ctx, tx); err != nil {
		return err
	}
	if err := m.mark(ctx, tx, writer); err != nil {
		return err
	}
	for i := range stmts {
		s := &stmts[i]
		if s.load != nil {
			if err := execLoad(ctx, tx, s); err != nil {
				return err
			}
		} else if _, err := tx.ExecContext(ctx, s.q, s.args...); err != nil {
			return fmt.Errorf("%s: %w", s.table, err)
		}
		if between != nil && i < len(stmts)-1 {
			if err := between(); err != nil {
				return err
			}
		}
	}
	return tx.Commit()
}

// tableProgressSQL is executed inside the transaction that applies a keyless table's
// rows up to ts, so those rows and the fact they were applied commit together. The
// progress never moves back: a lower ts would make a later round apply rows again.
func (m *meta) tableProgressSQL() string {
	return m.q(`INSERT INTO %s.table_progress (changefeed, schema_name, table_name, applied_ts) VALUES (?,?,?,?)
		ON DUPLICATE KEY UPDATE applied_ts=GREATEST(applied_ts, VALUES(applied_ts))`)
}

// tableProgress reads a keyless table's progress inside tx, locking its row (0: none).
func (m *meta) tableProgress(ctx context.Context, tx *sql.Tx, k tableKey) (uint64, error) {
	var ts uint64
	err := tx.QueryRowContext(ctx, m.q("SELECT applied_ts FROM %s.table_progress WHERE changefeed=? AND schema_name=? AND table_name=? FOR UPDATE"),
		m.changefeed, k.Schema, k.Table).Scan(&ts)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	return ts, err
}

// ddlKey dedupes a DDL that TiCDC broadcast to every partition (and may replay).
type ddlKey struct {
	ts   uint64
	hash string
}

func newDDLKey(ts uint64, query string) ddlKey {
	h := sha256.Sum256([]byte(query))
	return ddlKey{ts: ts, hash: hex.EncodeToString(h[:])}
}

// ledgerPart is one encoded ledger row of a round (see internal/ledger).
type ledgerPart struct {
	table   tableKey
	part    int
	minTs   uint64
	count   int
	entries []byte
}

// writeLedger records a round's ledger parts (maxTs: the round's target) through x (the
// checkpoint's transaction). Rows are replaced by their key, so a replayed round writes
// them again harmlessly.
func (m *meta) writeLedger(ctx context.Context, x interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}, maxTs uint64, parts []ledgerPart) error {
	for len(parts) > 0 {
		var b strings.Builder
		b.WriteString(m.q("REPLACE INTO %s." + ledger.Table + " (changefeed, max_ts, schema_name, table_name, part, min_ts, key_count, entries) VALUES "))
		var args []any
		size := 0
		n := 0
		for n < len(parts) && (n == 0 || size+len(parts[n].entries) < maxStatementBytes) {
			p := parts[n]
			if n > 0 {
				b.WriteByte(',')
			}
			b.WriteString("(?,?,?,?,?,?,?,?)")
			args = append(args, m.changefeed, maxTs, p.table.Schema, p.table.Table, p.part, p.minTs, p.count, p.entries)
			size += len(p.entries) + 64
			n++
		}
		if _, err := x.ExecContext(ctx, b.String(), args...); err != nil {
			return fmt.Errorf("writing the ledger: %w", err)
		}
		parts = parts[n:]
	}
	return nil
}

// prune deletes ledger and ts-map rows that cover commit ts below horizon, in bounded
// batches.
func (m *meta) prune(ctx context.Context, horizon uint64) (int64, error) {
	// First move where the ledger starts: from here on it no longer holds what is
	// deleted below (a crash in between leaves since_ts conservative).
	if err := m.exec(ctx, m.q("UPDATE %s."+ledger.RangeTable+" SET since_ts=GREATEST(since_ts, ?) WHERE changefeed=?"), horizon, m.changefeed); err != nil {
		return 0, fmt.Errorf("pruning the ledger: %w", err)
	}
	var total int64
	for _, q := range []string{
		"DELETE FROM %s." + ledger.Table + " WHERE changefeed=? AND max_ts<? LIMIT 5000",
		"DELETE FROM %s.ts_map WHERE changefeed=? AND upstream_ts<? LIMIT 5000",
	} {
		for {
			qctx, cancel := context.WithTimeout(ctx, m.timeout)
			res, err := m.db.ExecContext(qctx, m.q(q), m.changefeed, horizon)
			cancel()
			if err != nil {
				return total, fmt.Errorf("pruning the ledger: %w", err)
			}
			n, _ := res.RowsAffected()
			total += n
			if n < 5000 {
				break
			}
		}
	}
	return total, nil
}

// recordTSMap records that the fallback, at its position pos, holds the upstream at ts.
func (m *meta) recordTSMap(ctx context.Context, ts uint64, pos, source string, at time.Time) error {
	ctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	err := m.execFenced(ctx, m.db, m.q("INSERT INTO %s.ts_map (changefeed, upstream_ts, downstream_pos, wall_time, source) VALUES (?,?,?,?,?) ON DUPLICATE KEY UPDATE downstream_pos=VALUES(downstream_pos), wall_time=VALUES(wall_time), source=VALUES(source)"),
		m.changefeed, ts, pos, at.UTC(), source)
	if err != nil {
		return fmt.Errorf("recording the ts-map: %w", err)
	}
	return nil
}

func (m *meta) exec(ctx context.Context, q string, args ...any) error {
	ctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	_, err := m.db.ExecContext(ctx, q, args...)
	return err
}

// markLedger records where the ledger starts when it is on (since: the checkpoint the
// applier starts from; an existing start is kept), and forgets it when it is off, so a
// reader never trusts a ledger with a gap.
func (m *meta) markLedger(ctx context.Context, on bool, since uint64) error {
	q := "DELETE FROM %s." + ledger.RangeTable + " WHERE changefeed=?"
	args := []any{m.changefeed}
	if on {
		q = "INSERT IGNORE INTO %s." + ledger.RangeTable + " (changefeed, since_ts) VALUES (?, ?)"
		args = append(args, since)
	}
	if err := m.exec(ctx, m.q(q), args...); err != nil {
		return fmt.Errorf("recording where the ledger starts: %w", err)
	}
	return nil
}
