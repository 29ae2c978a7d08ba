package cdc

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tidb-parity/parity/internal/tso"
)

// Status is a snapshot of the replicator's progress: the one place the lag values live.
// `parity status`, the /status endpoint, the Prometheus collector and later the gRPC API
// all read it.
type Status struct {
	Changefeed string `json:"changefeed"`
	State      string `json:"state"` // starting, running, stopped, failed
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
	Barriers      int   `json:"barriers"`     // Barrier calls waiting for their ts
	RowsApplied   int64 `json:"rows_applied"` // since start
	DDLsApplied   int64 `json:"ddls_applied"` // since start
	DeadLetters   int64 `json:"dead_letters"` // since start
	// RowsFetched counts handle-key-only events completed from the upstream since start.
	RowsFetched int64 `json:"rows_fetched_upstream"`

	Partitions []PartitionStatus `json:"partitions"`
	UpdatedAt  time.Time         `json:"updated_at"`
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
	st.RowsFetched = r.rowsFetched.Load()
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

// Collector exports a Replicator's Status as Prometheus metrics.
type Collector struct {
	r *Replicator

	checkpoint, checkpointLag, resolved, resolvedLag *prometheus.Desc
	partResolved, partLag                            *prometheus.Desc
	buffered, spilled, bufferedBytes                 *prometheus.Desc
	rows, ddls, deadLetters, fetched, up             *prometheus.Desc
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
		buffered:      d("buffered_rows", "Row events waiting for the resolved ts.", l),
		spilled:       d("spilled_rows", "Row events waiting on disk.", l),
		bufferedBytes: d("buffered_bytes", "Approximate memory held by buffered row events.", l),
		rows:          d("applied_rows_total", "Row events applied since start.", l),
		ddls:          d("applied_ddls_total", "DDL events applied since start.", l),
		deadLetters:   d("dead_letters_total", "Records copied to the dead letter table since start.", l),
		fetched:       d("upstream_rows_fetched_total", "Handle-key-only row events completed by reading the row from the upstream TiDB since start.", l),
		up:            d("up", "1 while the replicator runs, 0 once it stopped or failed.", l),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.checkpoint, c.checkpointLag, c.resolved, c.resolvedLag, c.partResolved,
		c.partLag, c.buffered, c.spilled, c.bufferedBytes, c.rows, c.ddls, c.deadLetters, c.fetched, c.up} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	st := c.r.Status()
	cf := st.Changefeed
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	ctr := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, cf)
	}
	g(c.checkpoint, tso.Seconds(st.AppliedTs), cf)
	g(c.checkpointLag, st.AppliedLagSeconds, cf)
	g(c.resolved, tso.Seconds(st.ResolvedTs), cf)
	g(c.resolvedLag, st.ResolvedLagSeconds, cf)
	for _, p := range st.Partitions {
		part := strconv.Itoa(p.Partition)
		g(c.partResolved, tso.Seconds(p.ResolvedTs), cf, p.Topic, part)
		g(c.partLag, float64(p.Lag), cf, p.Topic, part)
	}
	g(c.buffered, float64(st.BufferedRows), cf)
	g(c.spilled, float64(st.SpilledRows), cf)
	g(c.bufferedBytes, float64(st.BufferedBytes), cf)
	ctr(c.rows, float64(st.RowsApplied))
	ctr(c.ddls, float64(st.DDLsApplied))
	ctr(c.deadLetters, float64(st.DeadLetters))
	ctr(c.fetched, float64(st.RowsFetched))
	up := 0.0
	if st.State == "running" || st.State == "starting" {
		up = 1
	}
	g(c.up, up, cf)
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
