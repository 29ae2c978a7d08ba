package cdc

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tidb-parity/parity/internal/tso"
)

// Status is a snapshot of the replicator's progress: the one place the lag values live.
// `parity status`, the /status endpoint, the Prometheus collector and later the gRPC API
// all read it.
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
	// RowsFetched counts handle-key-only events completed from the upstream.
	RowsFetched int64 `json:"rows_fetched_upstream"`
	// Rounds is how long each apply round took: rows up to a resolved ts (and the DDLs
	// due) applied and the checkpoint recorded.
	Rounds Histogram `json:"-"`

	Partitions []PartitionStatus `json:"partitions"`
	UpdatedAt  time.Time         `json:"updated_at"`

	// HA is the daemon's role and lease with ha.enabled (nil without).
	HA *HAStatus `json:"ha,omitempty"`
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
	fetched                         atomic.Int64

	mu     sync.Mutex
	rounds Histogram
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
	c.mu.Lock()
	st.Rounds = c.rounds
	st.Rounds.Counts = append([]uint64(nil), c.rounds.Counts...)
	c.mu.Unlock()
	if st.Rounds.Counts == nil {
		st.Rounds.Counts = make([]uint64, len(RoundBuckets))
	}
}

// Collector exports a Replicator's Status as Prometheus metrics: parity_cdc_*, each with
// the changefeed label (docs/serve.md lists them).
type Collector struct {
	r *Replicator

	checkpoint, checkpointLag, resolved, resolvedLag *prometheus.Desc
	partResolved, partLag                            *prometheus.Desc
	buffered, spilled, bufferedBytes, pendingDDLs    *prometheus.Desc
	rows, ddls, deadLetters, decodeErrors, retries   *prometheus.Desc
	fetched, state, rounds                           *prometheus.Desc
	haActive, haTakeovers, haEpoch                   *prometheus.Desc
}

var _ prometheus.Collector = (*Collector)(nil)

// NewCollector returns a collector for r; register it with a prometheus.Registry.
func NewCollector(r *Replicator) *Collector {
	l := []string{"changefeed"}
	pl := []string{"changefeed", "topic", "partition"}
	d := func(name, help string, labels []string) *prometheus.Desc {
		return prometheus.NewDesc("parity_cdc_"+name, help, labels, nil)
	}
	return &Collector{
		r:             r,
		checkpoint:    d("checkpoint_ts_seconds", "Physical time of the applied checkpoint TSO (Unix seconds).", l),
		checkpointLag: d("checkpoint_lag_seconds", "Wall clock minus the physical time of the applied checkpoint.", l),
		resolved:      d("resolved_ts_seconds", "Physical time of the global resolved ts (Unix seconds).", l),
		resolvedLag:   d("resolved_lag_seconds", "Wall clock minus the physical time of the global resolved ts.", l),
		partResolved:  d("partition_resolved_ts_seconds", "Physical time of a partition's resolved ts (Unix seconds).", pl),
		partLag:       d("kafka_lag_messages", "Records of a partition not yet read (high watermark minus next offset).", pl),
		buffered:      d("buffered_rows", "Row events waiting for the resolved ts (in memory and spilled).", l),
		spilled:       d("spilled_rows", "Row events waiting on disk.", l),
		bufferedBytes: d("buffered_bytes", "Approximate memory held by buffered row events.", l),
		pendingDDLs:   d("pending_ddls", "DDL events received and not yet applied.", l),
		rows:          d("applied_rows_total", "Row events applied since start, by type (insert, update, delete).", []string{"changefeed", "type"}),
		ddls:          d("applied_ddls_total", "DDL events applied (or recorded as skipped) since start.", l),
		deadLetters:   d("dead_letters_total", "Records copied to the dead letter table since start.", l),
		decodeErrors:  d("decode_errors_total", "Kafka records that could not be decoded since start (each stops its partition, or is dead-lettered with applier.dead-letter).", l),
		retries:       d("retries_total", "Transient errors retried since start, by target: downstream (the applier's statements) or upstream (row reads from TiDB).", []string{"changefeed", "target"}),
		fetched:       d("upstream_rows_fetched_total", "Handle-key-only row events completed by reading the row from the upstream TiDB since start.", l),
		state:         d("applier_state", "The replicator's state: 1 for the current one of starting, running, stopped, failed; 0 for the others.", []string{"changefeed", "state"}),
		rounds:        d("apply_round_duration_seconds", "How long each apply round took: the rows up to a resolved ts (and the DDLs due) applied and the checkpoint recorded.", l),
		haActive: prometheus.NewDesc("parity_ha_active", "With ha.enabled: 1 while this daemon holds the changefeed's lease and applies, 0 while it stands by.",
			[]string{"changefeed", "instance"}, nil),
		haTakeovers: prometheus.NewDesc("parity_ha_takeovers_total", "With ha.enabled: leases this daemon acquired since start (its first one included).",
			[]string{"changefeed", "instance"}, nil),
		haEpoch: prometheus.NewDesc("parity_ha_lease_epoch", "With ha.enabled: the lease's epoch, this daemon's while active, the holder's as last read while standing by.",
			[]string{"changefeed", "instance"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.checkpoint, c.checkpointLag, c.resolved, c.resolvedLag, c.partResolved,
		c.partLag, c.buffered, c.spilled, c.bufferedBytes, c.pendingDDLs, c.rows, c.ddls, c.deadLetters, c.decodeErrors,
		c.retries, c.fetched, c.state, c.rounds, c.haActive, c.haTakeovers, c.haEpoch} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	st := c.r.Status()
	cf := st.Changefeed
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append([]string{cf}, labels...)...)
	}
	ctr := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), append([]string{cf}, labels...)...)
	}
	g(c.checkpoint, tso.Seconds(st.AppliedTs))
	g(c.checkpointLag, st.AppliedLagSeconds)
	g(c.resolved, tso.Seconds(st.ResolvedTs))
	g(c.resolvedLag, st.ResolvedLagSeconds)
	for _, p := range st.Partitions {
		part := strconv.Itoa(p.Partition)
		g(c.partResolved, tso.Seconds(p.ResolvedTs), p.Topic, part)
		g(c.partLag, float64(p.Lag), p.Topic, part)
	}
	g(c.buffered, float64(st.BufferedRows))
	g(c.spilled, float64(st.SpilledRows))
	g(c.bufferedBytes, float64(st.BufferedBytes))
	g(c.pendingDDLs, float64(st.PendingDDLs))
	ctr(c.rows, st.RowsInserted, "insert")
	ctr(c.rows, st.RowsUpdated, "update")
	ctr(c.rows, st.RowsDeleted, "delete")
	ctr(c.ddls, st.DDLsApplied)
	ctr(c.deadLetters, st.DeadLetters)
	ctr(c.decodeErrors, st.DecodeErrors)
	ctr(c.retries, st.DownstreamRetries, "downstream")
	ctr(c.retries, st.UpstreamRetries, "upstream")
	ctr(c.fetched, st.RowsFetched)
	for _, s := range States {
		v := 0.0
		if s == st.State {
			v = 1
		}
		g(c.state, v, s)
	}
	buckets := make(map[float64]uint64, len(RoundBuckets))
	for i, b := range RoundBuckets {
		buckets[b] = st.Rounds.Counts[i]
	}
	ch <- prometheus.MustNewConstHistogram(c.rounds, st.Rounds.Count, st.Rounds.Sum, buckets, cf)
	if ha := st.HA; ha != nil {
		active := 0.0
		if ha.Role == "active" {
			active = 1
		}
		g(c.haActive, active, ha.Instance)
		ctr(c.haTakeovers, ha.Takeovers, ha.Instance)
		g(c.haEpoch, float64(ha.Epoch), ha.Instance)
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
