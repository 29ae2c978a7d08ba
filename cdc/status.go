package cdc

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidb-parity/parity/cdc/simple"
	"github.com/tidb-parity/parity/internal/tso"
)

// Status is a snapshot of the replicator's progress: the one place the lag values live.
// `parity status`, the /status endpoint, the daemon's Prometheus collector (parity_cdc_*,
// parity_ha_*) and the gRPC API all read it.
type Status struct {
	Changefeed string `json:"changefeed"`
	State      string `json:"state"` // starting, standby, running, stopped, failed
	Error      string `json:"error,omitempty"`

	// AppliedTs is the applied checkpoint: every event with commit ts <= AppliedTs is
	// durable downstream. (Rows of the next round may already be partly applied; use
	// Barrier to hold the downstream exactly at a ts.)
	AppliedTs uint64 `json:"applied_ts"`
	// ResolvedTs is the global resolved ts: the minimum over all partitions.
	ResolvedTs uint64 `json:"resolved_ts"`
	// Lag is wall clock minus the physical time of the TSO, in seconds.
	AppliedLagSeconds  float64   `json:"applied_lag_seconds"`
	ResolvedLagSeconds float64   `json:"resolved_lag_seconds"`
	AppliedTime        time.Time `json:"applied_time"`
	ResolvedTime       time.Time `json:"resolved_time"`

	BufferedRows  int64 `json:"buffered_rows"` // rows waiting for the resolved ts (memory + spill)
	SpilledRows   int64 `json:"spilled_rows"`
	BufferedBytes int64 `json:"buffered_bytes"` // approximate memory held by buffered rows
	PendingDDLs   int   `json:"pending_ddls"`
	Barriers      int   `json:"barriers"` // Barrier calls waiting for their ts
	// The counters below count since New (they survive the replicator's restarts when
	// the changefeed's partitions change).
	// RowsApplied counts the row events applied: RowsInserted + RowsUpdated + RowsDeleted.
	RowsApplied  int64 `json:"rows_applied"`
	RowsInserted int64 `json:"rows_inserted"`
	RowsUpdated  int64 `json:"rows_updated"`
	RowsDeleted  int64 `json:"rows_deleted"`
	DDLsApplied  int64 `json:"ddls_applied"` // DDLs applied or recorded as skipped
	DeadLetters  int64 `json:"dead_letters"`
	// DecodeErrors counts the Kafka records that could not be decoded (each stops its
	// partition, or is copied to the dead letter table with applier.dead-letter).
	DecodeErrors int64 `json:"decode_errors"`
	// Retries counts transient errors retried: DownstreamRetries of the applier's
	// statements, UpstreamRetries of the upstream row reads.
	DownstreamRetries int64 `json:"downstream_retries"`
	UpstreamRetries   int64 `json:"upstream_retries"`
	// LoadStatements counts the LOAD DATA statements committed (applier.load-data);
	// LoadFallbacks the transactions written again with INSERT because a load left
	// warnings (each also turns LOAD DATA off for its table until the next DDL).
	LoadStatements int64 `json:"load_statements"`
	LoadFallbacks  int64 `json:"load_fallbacks"`
	// RowsFetched counts handle-key-only events completed from the upstream.
	RowsFetched int64 `json:"rows_fetched_upstream"`
	// Rounds is how long each apply round took: rows up to a resolved ts (and the DDLs
	// due) applied and the checkpoint recorded.
	Rounds Histogram `json:"-"`
	// Checksums counts the row images whose TiCDC row checksum was verified on decode,
	// with changefeed.protocol = "simple" (nil with the others).
	Checksums *ChecksumStats `json:"checksums,omitempty"`

	Partitions []PartitionStatus `json:"partitions"`
	UpdatedAt  time.Time         `json:"updated_at"`

	// HA is the daemon's role and lease with ha.enabled (nil without).
	HA *HAStatus `json:"ha,omitempty"`
}

// ChecksumStats counts row images (an UPDATE has two) by their TiCDC row checksum,
// since New (cdc/simple's Stats, summed over the replicator's runs).
type ChecksumStats struct {
	// RowsVerified: images whose values hash to TiCDC's checksum.
	RowsVerified int64 `json:"rows_verified"`
	// RowsWithoutChecksum: images TiCDC sent no checksum for (checksums off, an all-NULL
	// row, a half of an UPDATE TiCDC split, a handle-key-only row).
	RowsWithoutChecksum int64 `json:"rows_without_checksum"`
	// Mismatches: images whose values do not hash to their checksum, or that TiCDC
	// flagged corrupted (each stops its partition, or is dead-lettered).
	Mismatches int64 `json:"mismatches"`
}

// PartitionStatus is one Kafka partition's progress.
type PartitionStatus struct {
	Topic            string `json:"topic"`
	Partition        int    `json:"partition"`
	ResolvedTs       uint64 `json:"resolved_ts"`
	NextOffset       int64  `json:"next_offset"`       // next offset to read (-1: from the first)
	CheckpointOffset int64  `json:"checkpoint_offset"` // resume offset in the meta schema (-1: none)
	HighWatermark    int64  `json:"high_watermark"`    // last seen end of the partition (-1: unknown)
	Lag              int64  `json:"lag"`               // HighWatermark - NextOffset: records not yet read
}

// Status returns the current progress with lag computed against the wall clock now.
func (r *Replicator) Status() Status {
	r.mu.Lock()
	st := r.status
	st.Partitions = append([]PartitionStatus(nil), r.status.Partitions...)
	st.AppliedTs = r.applied
	r.mu.Unlock()
	r.ctr.fill(&st)
	if r.cfg.Changefeed.Protocol == ProtocolSimple {
		cs := r.ctr.checksumStats()
		st.Checksums = &cs
	}
	if r.cfg.HA.Enabled {
		ha := r.ha.get()
		st.HA = &ha
	}
	now := time.Now()
	if st.AppliedTs > 0 {
		st.AppliedTime = tso.Time(st.AppliedTs)
		st.AppliedLagSeconds = max(0, now.Sub(st.AppliedTime).Seconds())
	}
	if st.ResolvedTs > 0 {
		st.ResolvedTime = tso.Time(st.ResolvedTs)
		st.ResolvedLagSeconds = max(0, now.Sub(st.ResolvedTime).Seconds())
	}
	return st
}

// States are the values of Status.State.
var States = []string{"starting", "standby", "running", "stopped", "failed"}

// RoundBuckets are the upper bounds of Status.Rounds' buckets, in seconds.
var RoundBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// Histogram counts observations: Counts[i] those at most the i-th bound (cumulative, as
// Prometheus reads buckets), Count all of them, Sum their total.
type Histogram struct {
	Counts []uint64
	Count  uint64
	Sum    float64
}

// counters are the replicator's counts since New, shared by the coordinator, the
// applier and the row fetcher of every run of runOnce.
type counters struct {
	byOp                            [3]atomic.Int64 // by open.Op - 1: insert, update, delete
	ddls, deadLetters, decodeErrors atomic.Int64
	downRetries, upRetries          atomic.Int64
	loads, loadFallbacks            atomic.Int64
	fetched                         atomic.Int64

	mu     sync.Mutex
	rounds Histogram
	// The simple protocol's checksum counts: of the decoders of finished runs (csDone)
	// and of the running one (csDec, nil when none).
	csDone simple.Stats
	csDec  *simple.Decoder
}

// checksumDecoder makes d the running decoder whose counts Status adds; the returned
// func, called when its run ends, keeps them.
func (c *counters) checksumDecoder(d *simple.Decoder) (done func()) {
	c.mu.Lock()
	c.csDec = d
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		st := d.Stats()
		c.csDone.RowsVerified += st.RowsVerified
		c.csDone.RowsWithoutChecksum += st.RowsWithoutChecksum
		c.csDone.Mismatches += st.Mismatches
		c.csDec = nil
	}
}

func (c *counters) checksumStats() ChecksumStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.csDone
	if c.csDec != nil {
		live := c.csDec.Stats()
		st.RowsVerified += live.RowsVerified
		st.RowsWithoutChecksum += live.RowsWithoutChecksum
		st.Mismatches += live.Mismatches
	}
	return ChecksumStats{RowsVerified: int64(st.RowsVerified), RowsWithoutChecksum: int64(st.RowsWithoutChecksum), Mismatches: int64(st.Mismatches)}
}

func (c *counters) observeRound(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := &c.rounds
	if h.Counts == nil {
		h.Counts = make([]uint64, len(RoundBuckets))
	}
	s := d.Seconds()
	for i, b := range RoundBuckets {
		if s <= b {
			h.Counts[i]++
		}
	}
	h.Count++
	h.Sum += s
}

func (c *counters) fill(st *Status) {
	st.RowsInserted, st.RowsUpdated, st.RowsDeleted = c.byOp[0].Load(), c.byOp[1].Load(), c.byOp[2].Load()
	st.RowsApplied = st.RowsInserted + st.RowsUpdated + st.RowsDeleted
	st.DDLsApplied, st.DeadLetters, st.DecodeErrors = c.ddls.Load(), c.deadLetters.Load(), c.decodeErrors.Load()
	st.DownstreamRetries, st.UpstreamRetries = c.downRetries.Load(), c.upRetries.Load()
	st.RowsFetched = c.fetched.Load()
	st.LoadStatements, st.LoadFallbacks = c.loads.Load(), c.loadFallbacks.Load()
	c.mu.Lock()
	st.Rounds = c.rounds
	st.Rounds.Counts = append([]uint64(nil), c.rounds.Counts...)
	c.mu.Unlock()
	if st.Rounds.Counts == nil {
		st.Rounds.Counts = make([]uint64, len(RoundBuckets))
	}
}

// CheckpointLag reads a changefeed's applied checkpoint from its meta schema on the
// downstream and returns how far it is behind now: the time since the physical time of
// its commit ts. It is for readers outside the replicator, such as parity diff pausing
// while the changefeed lags.
func CheckpointLag(ctx context.Context, db *sql.DB, metaSchema, changefeed string, now time.Time) (time.Duration, error) {
	m := newMeta(db, metaSchema, changefeed, 0)
	ts, ok, err := m.checkpoint(ctx)
	if err != nil {
		return 0, fmt.Errorf("changefeed %q: %w", changefeed, err)
	}
	if !ok {
		return 0, fmt.Errorf("changefeed %q has no checkpoint in %s", changefeed, metaSchema)
	}
	return now.Sub(tso.Time(ts)), nil
}
