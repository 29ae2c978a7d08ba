package verify

// records.go owns what the run history holds: its tables in the meta schema (the
// "verify" component of internal/metaschema: verify_runs, verify_pairs, verify_tables,
// and verify_fires, the schedules' claims, which claims.go writes), their migrations,
// and the records read from them. history.go reads and writes them.

import (
	"time"

	"github.com/tidb-parity/parity/checker"
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
	// and the run (or skipped firing) it recorded (claims.go).
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
	// DifferencesByClass counts the run's differing rows by class (bypass, imported,
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
	Scope        string `json:"scope,omitempty"`
	ScopeFromTs  uint64 `json:"scope_from_ts,omitempty"`
	ScopeUntilTs uint64 `json:"scope_until_ts,omitempty"`
	ScopeKeys    int64  `json:"scope_keys,omitempty"`
	checker.BypassReport
}
