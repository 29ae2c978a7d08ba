package api

// backend.go holds what the server needs of the daemon, as small interfaces that
// cmd/parity implements over cdc.Replicator, verify.Service and its repair: the server
// depends on these only, so its tests can give it their own.

import (
	"context"
	"time"

	"github.com/tidb-parity/parity/cdc"
	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/checker/verify"
)

// Backend is the daemon behind the server.
type Backend struct {
	// Replication is the applier. Required.
	Replication Replication
	// Verification is the verification service; nil when verify.enabled is off (the
	// diff calls then fail with VERIFICATION_DISABLED).
	Verification Verification
	// Repairer repairs a run's differences; nil: Repair fails with
	// VERIFICATION_DISABLED (it re-verifies through the verification service).
	Repairer Repairer
	// Instance is the daemon's instance name (Status.instance, Diff.instance).
	Instance string
}

// Replication is what the server needs of the applier (cdc.Replicator).
type Replication interface {
	// Status is the applier's progress now.
	Status() cdc.Status
	// WaitApplied blocks until the applied checkpoint is >= ts or ctx ends.
	WaitApplied(ctx context.Context, ts uint64) error
	// UpstreamTSO is TiDB's current TSO.
	UpstreamTSO(ctx context.Context) (uint64, error)
}

// Verification is what the server needs of the verification service (verify.Service).
// A run unknown to it is an error matching ErrRunNotFound, verify's or checker's
// sentinel.
type Verification interface {
	// Stats are the service's counters now (no query).
	Stats() verify.Stats
	// Start starts a manual run and returns its id; *verify.BusyError while the
	// previous manual run runs.
	Start(ctx context.Context, req DiffRequest) (runID string, err error)
	// Get returns a run and, while it is queued or running, its progress.
	Get(ctx context.Context, runID string) (verify.RunRecord, *verify.ActiveRun, error)
	// Ended returns a channel closed once the run has ended and Get returns it ended,
	// while this daemon runs it (queued or running); nil otherwise.
	Ended(runID string) <-chan struct{}
	// Cancel stops a running run and returns it as it ended (an ended run unchanged).
	Cancel(ctx context.Context, runID string) (verify.RunRecord, error)
	// List returns runs matching f, newest first, from f.Offset, at most f.Limit.
	List(ctx context.Context, f RunFilter) ([]verify.RunRecord, error)
	// SnapshotPoint holds the fallback at atTS (0: the global resolved ts), records
	// the pair in the ts-map and returns it.
	SnapshotPoint(ctx context.Context, atTS uint64) (Point, error)
	// CutoverCheck is the cutover gate (see the proto).
	CutoverCheck(ctx context.Context, req CutoverRequest) (CutoverResult, error)
	// Differences returns a run's stored differences of the tables matching tables
	// (all when empty), in table and key order; checker.ErrRunRunning while it runs.
	Differences(ctx context.Context, runID string, tables []string) ([]checker.StoredDifference, error)
	// FixSQL emits the fix SQL of a run's differences, table by table, statement by
	// statement (each ending in ";\n").
	FixSQL(ctx context.Context, runID string, tables []string, emit func(table, sql string) error) error
}

// Repairer repairs a run's differences through the apply stream, then re-verifies.
type Repairer interface {
	Repair(ctx context.Context, runID string, tables []string, dryRun bool) (RepairResult, error)
}

// DiffRequest is a run asked for; zero fields take the daemon's defaults.
type DiffRequest struct {
	Scope            string
	Tables           []string
	MaxViewAge       time.Duration
	MinTS            uint64
	MaxRowsPerSecond int64
}

// RunFilter selects runs for List.
type RunFilter struct {
	// State and Trigger: verify's state name and a trigger name; empty: any.
	State, Trigger              string
	StartedAfter, StartedBefore time.Time
	Offset, Limit               int
}

// Point is a snapshot point: the fallback held exactly at TS, at Position.
type Point struct {
	TS               uint64
	Position, Source string
	Pause            time.Duration
	CreatedAt        time.Time
}

// CutoverRequest asks for the cutover gate.
type CutoverRequest struct {
	UpstreamTS  uint64
	Now         bool
	MaxFullAge  time.Duration
	Tables      []string
	WaitTimeout time.Duration
	// Full compares every selected table whole, FullTables those matching its patterns.
	Full       bool
	FullTables []string
}

// CutoverResult is the gate's answer and its evidence.
type CutoverResult struct {
	Passed       bool
	Failures     []string
	UpstreamTS   uint64
	Pair         Point
	RunID        string
	Tables       []CutoverTable
	KeysVerified int64
	Differences  []checker.StoredDifference
	ByClass      map[string]int64
	Waited       time.Duration
	// Unconfirmed: rows different when first read at the pair, equal when read again.
	Unconfirmed int64
	// Bypass: "on" when bypass detection ran in the daemon, else "off".
	Bypass string
}

// CutoverTable is one table's evidence.
type CutoverTable struct {
	Table         string
	LastFullRunID string
	LastFullAge   time.Duration
	SinceTS       uint64
	KeysVerified  int64
	Differences   int64
	Result        string
	// Full: compared whole, as asked. The window verified by keys and its sources (see
	// verify.CutoverTable).
	Full               bool
	LedgerFromTS       uint64
	LedgerUntilTS      uint64
	LedgerKeys         int64
	Bypass             string
	BypassNote         string
	BypassSince        time.Time
	BypassWatchedSince time.Time
	BypassKeys         int64
	BypassDDL          []string
}

// RepairResult is what a repair did, and its re-verification.
type RepairResult struct {
	cdc.RepairResult
	// Reverify is the run that verified the repaired tables again (nil for a dry run
	// or when nothing was repaired).
	Reverify *verify.RunRecord
}
