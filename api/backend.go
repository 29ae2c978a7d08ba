package api

// backend.go holds what the server needs of the daemon, as small interfaces in the
// service's own types: verify.Service is the Verification as it is (one shape of a
// request from the proto's conversion down), the daemon adapts cdc.Replicator and its
// repairer. The server maps the service's request errors to the API's field paths
// (fields.go), once.

import (
	"context"

	"github.com/tidb-parity/parity/cdc"
	"github.com/tidb-parity/parity/cdc/bypass"
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
	// Bypass is the bypass detector's status now; nil without [bypass].
	Bypass func() *bypass.Status
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
	// Trigger starts a manual run; *verify.BusyError while the previous manual run
	// runs, an error matching verify.ErrInvalidRequest (a *verify.RequestError naming
	// the field) for a request it refuses.
	Trigger(ctx context.Context, req verify.Request) (*verify.Started, error)
	// Get returns a run and, while it is queued or running, its progress.
	Get(ctx context.Context, runID string) (verify.RunRecord, *verify.ActiveRun, error)
	// Ended returns a channel closed once the run has ended and Get returns it ended,
	// while this daemon runs it (queued or running); nil otherwise.
	Ended(runID string) <-chan struct{}
	// Cancel stops a running run and returns it as it ended (an ended run unchanged).
	Cancel(ctx context.Context, runID string) (verify.RunRecord, error)
	// List returns runs matching f, newest first, from f.Offset, at most f.Limit.
	List(ctx context.Context, f verify.ListFilter) ([]verify.RunRecord, error)
	// SnapshotPoint holds the fallback at atTS (0: the global resolved ts), records
	// the pair in the ts-map and returns it.
	SnapshotPoint(ctx context.Context, atTS uint64) (verify.Point, error)
	// CutoverCheck is the cutover gate (see the proto).
	CutoverCheck(ctx context.Context, req verify.CutoverRequest) (verify.CutoverResult, error)
	// UpstreamTables lists TiDB's tables that patterns select for verification.
	UpstreamTables(ctx context.Context, patterns []string) ([]string, error)
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

// RepairResult is what a repair did, and its re-verification.
type RepairResult struct {
	cdc.RepairResult
	// Reverify is the run that verified the repaired tables again (nil for a dry run
	// or when nothing was repaired).
	Reverify *verify.RunRecord
}
