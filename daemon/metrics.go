package daemon

// metrics.go: the daemon's Prometheus collectors, each over one part's Stats or Status
// (docs/serve.md and docs/verify.md list the metrics; cmd/parity's metrics_lint_test.go,
// observability_test.go and deploy/'s promtool tests check their names, labels and help).

import (
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tidb-parity/parity/cdc"
	"github.com/tidb-parity/parity/cdc/bypass"
	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/checker/verify"
	"github.com/tidb-parity/parity/internal/tso"
)

// metricsHandler serves /metrics: the Go and process collectors, parity_build_info and
// the parts' collectors (c's nil parts have none), with extra (the API's).
func metricsHandler(c Components, build BuildInfo, extra ...prometheus.Collector) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		newCDCCollector(c.Replicator.Status))
	reg.MustRegister(extra...)
	if c.Bypass != nil {
		reg.MustRegister(activeCollector{status: c.Replicator.Status, c: newBypassCollector(c.Bypass.Stats().Changefeed, c.Bypass.Stats)})
	}
	if c.Verify != nil {
		reg.MustRegister(newVerifyCollector(c.Verify.Stats))
	}
	info := prometheus.NewGauge(prometheus.GaugeOpts{Name: "parity_build_info", Help: "Build information.",
		ConstLabels: prometheus.Labels{"version": build.Version, "commit": build.Commit}})
	info.Set(1)
	reg.MustRegister(info)
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
}

// cdcCollector exports a Replicator's Status as Prometheus metrics: parity_cdc_*, each with
// the changefeed label (docs/serve.md lists them).
type cdcCollector struct {
	status func() cdc.Status

	checkpoint, checkpointLag, resolved, resolvedLag *prometheus.Desc
	partResolved, partLag                            *prometheus.Desc
	buffered, spilled, bufferedBytes, pendingDDLs    *prometheus.Desc
	rows, ddls, deadLetters, decodeErrors, retries   *prometheus.Desc
	loads                                            *prometheus.Desc
	fetched, state, rounds                           *prometheus.Desc
	haActive, haTakeovers, haEpoch                   *prometheus.Desc
	csVerified, csWithout, csMismatches              *prometheus.Desc
}

var _ prometheus.Collector = (*cdcCollector)(nil)

// newCDCCollector returns a collector of status (cdc.Replicator.Status).
func newCDCCollector(status func() cdc.Status) *cdcCollector {
	l := []string{"changefeed"}
	pl := []string{"changefeed", "topic", "partition"}
	d := func(name, help string, labels []string) *prometheus.Desc {
		return prometheus.NewDesc("parity_cdc_"+name, help, labels, nil)
	}
	return &cdcCollector{
		status:        status,
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
		loads:         d("load_statements_total", "Upserts written as LOAD DATA since start (applier.load-data), by outcome: loaded, or fell_back (a load left warnings: its transaction was written again with INSERT, and the table is written with INSERT until the next DDL).", []string{"changefeed", "outcome"}),
		fetched:       d("upstream_rows_fetched_total", "Handle-key-only row events completed by reading the row from the upstream TiDB since start.", l),
		state:         d("applier_state", "The replicator's state: 1 for the current one of starting, running, stopped, failed; 0 for the others.", []string{"changefeed", "state"}),
		rounds:        d("apply_round_duration_seconds", "How long each apply round took: the rows up to a resolved ts (and the DDLs due) applied and the checkpoint recorded.", l),
		csVerified:    d("checksum_rows_verified_total", "With changefeed.protocol simple: row images whose values hash to TiCDC's row checksum, since start.", l),
		csWithout:     d("checksum_rows_without_checksum_total", "With changefeed.protocol simple: row images TiCDC sent no checksum for (checksums off, an all-NULL row, a half of a split UPDATE, a handle-key-only row), since start.", l),
		csMismatches:  d("checksum_mismatches_total", "With changefeed.protocol simple: row images that do not hash to TiCDC's row checksum or that TiCDC flagged corrupted, since start (each stops its partition, or is dead-lettered).", l),
		haActive: prometheus.NewDesc("parity_ha_active", "With ha.enabled: 1 while this daemon holds the changefeed's lease and applies, 0 while it stands by.",
			[]string{"changefeed", "instance"}, nil),
		haTakeovers: prometheus.NewDesc("parity_ha_takeovers_total", "With ha.enabled: leases this daemon acquired since start (its first one included).",
			[]string{"changefeed", "instance"}, nil),
		haEpoch: prometheus.NewDesc("parity_ha_lease_epoch", "With ha.enabled: the lease's epoch, this daemon's while active, the holder's as last read while standing by.",
			[]string{"changefeed", "instance"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *cdcCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.checkpoint, c.checkpointLag, c.resolved, c.resolvedLag, c.partResolved,
		c.partLag, c.buffered, c.spilled, c.bufferedBytes, c.pendingDDLs, c.rows, c.ddls, c.deadLetters, c.decodeErrors,
		c.retries, c.loads, c.fetched, c.state, c.rounds, c.haActive, c.haTakeovers, c.haEpoch, c.csVerified, c.csWithout, c.csMismatches} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *cdcCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.status()
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
	ctr(c.loads, st.LoadStatements, "loaded")
	ctr(c.loads, st.LoadFallbacks, "fell_back")
	ctr(c.fetched, st.RowsFetched)
	for _, s := range cdc.States {
		v := 0.0
		if s == st.State {
			v = 1
		}
		g(c.state, v, s)
	}
	buckets := make(map[float64]uint64, len(cdc.RoundBuckets))
	for i, b := range cdc.RoundBuckets {
		buckets[b] = st.Rounds.Counts[i]
	}
	ch <- prometheus.MustNewConstHistogram(c.rounds, st.Rounds.Count, st.Rounds.Sum, buckets, cf)
	if cs := st.Checksums; cs != nil {
		ctr(c.csVerified, cs.RowsVerified)
		ctr(c.csWithout, cs.RowsWithoutChecksum)
		ctr(c.csMismatches, cs.Mismatches)
	}
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

// verifyCollector exports the verification service's Stats as Prometheus metrics: parity_verify_*,
// each with the changefeed label (docs/verify.md lists them).
type verifyCollector struct {
	stats func() verify.Stats

	freshness, covered, runs, differences, unconfirmed, rows, chunks, chunkTime, pairs, rotations, passed, pause, running, throttled *prometheus.Desc
	lastEnd, lastResult, cleanAt, viewAge, lastPair, scheduleNext                                                                    *prometheus.Desc
}

var _ prometheus.Collector = (*verifyCollector)(nil)

// verifyResults are the results a run ends with (the values of last_run_result's result
// label).
var verifyResults = []string{verify.ResultEqual, verify.ResultDifferent, verify.ResultFailed, verify.ResultCancelled, verify.ResultSkipped}

// diffKinds and diffClasses are the kind and class labels of differences_total.
var (
	diffKinds   = []string{string(checker.Missing), string(checker.Extra), string(checker.Differing), "unlisted"}
	diffClasses = []string{checker.ClassBypass, checker.ClassImported, checker.ClassPostImport, checker.ClassCDC, checker.ClassDiverged, checker.ClassUnclassified}
)

func newVerifyCollector(stats func() verify.Stats) *verifyCollector {
	l := []string{"changefeed"}
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("parity_verify_"+name, help, append(l, labels...), nil)
	}
	return &verifyCollector{
		stats: stats,
		freshness: d("freshness_seconds", "Age of the oldest applied change not covered by a clean full verification (an upper bound: "+
			"wall clock minus the clean run's oldest pair TSO, 0 when nothing was applied after it); +Inf until a clean run is known."),
		covered: d("covered_ts_seconds", "Physical time of the oldest pair TSO of the newest clean full verification (Unix seconds; 0: none)."),
		runs: d("runs_total", "Verification runs ended since start, by trigger (schedule name, continuous, manual, cutover-check) and "+
			"result (equal, different, failed, cancelled, skipped).", "trigger", "result"),
		differences: d("differences_total", "Differing rows found by verification runs since start, by kind (missing, extra, differing; "+
			"unlisted beyond the report's listed rows) and class (bypass, imported, post-import, cdc, diverged, unclassified).", "kind", "class"),
		unconfirmed: d("unconfirmed_differences_total", "Rows found different at a snapshot pair and equal when read again at the same pair since start: "+
			"a snapshot read that was not repeatable (a store anomaly, not a difference of the data; not in differences_total)."),
		rows:      d("rows_checked_total", "Upstream rows compared by verification runs since start."),
		chunks:    d("chunks_total", "Chunk comparisons since start, by result (equal, different, failed).", "result"),
		chunkTime: d("chunk_duration_seconds", "How long each chunk comparison took."),
		pairs:     d("pairs_total", "Snapshot pairs opened since start."),
		rotations: d("view_rotations_total", "Snapshot pairs replaced because their read view reached verify.max-view-age (or half of it between tables)."),
		passed:    d("barrier_passed_total", "Pair TSOs the applier had applied beyond before the pair's barrier was set (tried again at a newer TSO)."),
		pause:     d("pause_seconds", "How long replication waited for each snapshot pair (the applier's barrier)."),
		running:   d("running_runs", "Verification runs started and not ended (including those waiting for a slot)."),
		throttled: d("throttled_seconds_total", "Time runs waited for the applier's lag to fall within verify.max-lag before opening pairs."),
		lastEnd: d("last_run_end_timestamp_seconds", "When the newest run of a trigger ended (Unix seconds), by trigger and its kind "+
			"(schedule, continuous, manual, cutover-check); absent before one ended since start.", "trigger", "kind"),
		lastResult: d("last_run_result", "Result of the newest run of a trigger: 1 for its result (equal, different, failed, cancelled, skipped), 0 for the others.",
			"trigger", "kind", "result"),
		cleanAt:  d("last_clean_run_end_timestamp_seconds", "When the newest clean full verification over verify.tables ended (Unix seconds; 0: none known)."),
		viewAge:  d("pair_read_view_age_seconds", "Age of the oldest snapshot pair's read view open now (0 when none is): how long the fallback and TiDB keep its MVCC versions."),
		lastPair: d("last_pair_ts_seconds", "Physical time of the newest snapshot pair's TSO (Unix seconds): an open pair's, or the newest ended run's last pair (0: none since start)."),
		scheduleNext: d("schedule_next_run_timestamp_seconds", "When a schedule should next fire (Unix seconds): its cron's next time after its newest run started, or the service started; "+
			"past by more than a few seconds with no run, the firing was missed.", "trigger"),
	}
}

// Describe implements prometheus.Collector.
func (c *verifyCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.freshness, c.covered, c.runs, c.differences, c.unconfirmed, c.rows, c.chunks, c.chunkTime, c.pairs,
		c.rotations, c.passed, c.pause, c.running, c.throttled, c.lastEnd, c.lastResult, c.cleanAt, c.viewAge, c.lastPair, c.scheduleNext} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *verifyCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.stats()
	cf := st.Changefeed
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append([]string{cf}, labels...)...)
	}
	ctr := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, append([]string{cf}, labels...)...)
	}
	hist := func(d *prometheus.Desc, h verify.Histogram, bounds []time.Duration) {
		buckets := make(map[float64]uint64, len(bounds))
		for i, b := range bounds {
			buckets[b.Seconds()] = h.Counts[i]
		}
		ch <- prometheus.MustNewConstHistogram(d, h.Count, h.Sum.Seconds(), buckets, cf)
	}
	unix := func(t time.Time) float64 {
		if t.IsZero() {
			return 0
		}
		return float64(t.UnixNano()) / 1e9
	}
	fresh := math.Inf(1)
	if st.Verified {
		fresh = st.Freshness.Seconds()
	}
	g(c.freshness, fresh)
	g(c.covered, tso.Seconds(st.CoveredTS))
	for _, r := range st.Runs {
		ctr(c.runs, float64(r.Runs), r.Trigger, r.Result)
	}
	// Every kind and class from 0, so that increase() sees the first difference.
	diffs := map[[2]string]int64{}
	for _, k := range diffKinds {
		for _, cl := range diffClasses {
			diffs[[2]string{k, cl}] = 0
		}
	}
	for _, n := range st.DifferencesByKind {
		diffs[[2]string{n.Kind, n.Class}] += n.Rows
	}
	for k, n := range diffs {
		ctr(c.differences, float64(n), k[0], k[1])
	}
	ctr(c.unconfirmed, float64(st.Unconfirmed))
	ctr(c.rows, float64(st.RowsChecked))
	for _, res := range []string{checker.ChunkEqual, checker.ChunkDifferent, checker.ChunkFailed} {
		ctr(c.chunks, float64(st.Chunks[res]), res)
	}
	hist(c.chunkTime, st.ChunkTime, verify.ChunkBuckets)
	ctr(c.pairs, float64(st.Pairs))
	ctr(c.rotations, float64(st.Rotations))
	ctr(c.passed, float64(st.BarrierPassed))
	ctr(c.throttled, st.Throttled.Seconds())
	g(c.running, float64(st.Running))
	hist(c.pause, st.Pause, verify.PauseBuckets)
	for _, l := range st.LastRuns {
		g(c.lastEnd, unix(l.FinishedAt), l.Trigger, l.Kind)
		for _, res := range verifyResults {
			v := 0.0
			if res == l.Result {
				v = 1
			}
			g(c.lastResult, v, l.Trigger, l.Kind, res)
		}
	}
	g(c.cleanAt, unix(st.CleanAt))
	var age time.Duration
	var pair uint64
	if st.LastRun != nil {
		pair = st.LastRun.LastTS
	}
	for _, a := range st.Active {
		age, pair = max(age, a.PairAge), max(pair, a.PairTS)
	}
	g(c.viewAge, age.Seconds())
	g(c.lastPair, tso.Seconds(pair))
	for _, sc := range st.Schedules {
		g(c.scheduleNext, unix(sc.Next), sc.Trigger)
	}
}

// bypassCollector exports a bypass detector's Stats as Prometheus metrics.
type bypassCollector struct {
	stats                     func() bypass.Stats
	writes, last, upDesc, lag *prometheus.Desc
}

var _ prometheus.Collector = (*bypassCollector)(nil)

// newBypassCollector returns the metrics of a detector: parity_bypass_writes_total{changefeed,table}
// (row changes recorded since the process started, by schema.table),
// parity_bypass_last_write_timestamp_seconds{changefeed} (binlog commit time of the
// newest recorded change, kept across restarts; 0 when none) and
// parity_bypass_up{changefeed} (1 while the binlog is being read) and
// parity_bypass_lag_seconds{changefeed} (how long ago the detector last had read
// everything the fallback's binlog held: it grows while it falls behind or cannot read).
func newBypassCollector(changefeed string, stats func() bypass.Stats) *bypassCollector {
	cf := prometheus.Labels{"changefeed": changefeed}
	return &bypassCollector{
		stats: stats,
		writes: prometheus.NewDesc("parity_bypass_writes_total",
			"Row changes of replicated tables by transactions parity did not write, recorded from the fallback's binlog since the process started.",
			[]string{"table"}, cf),
		last: prometheus.NewDesc("parity_bypass_last_write_timestamp_seconds",
			"Binlog commit time of the newest recorded write that bypassed parity (0: none).", nil, cf),
		upDesc: prometheus.NewDesc("parity_bypass_up",
			"1 while the bypass detector reads the fallback's binlog, 0 while it reconnects or is stopped.", nil, cf),
		lag: prometheus.NewDesc("parity_bypass_lag_seconds",
			"Seconds since the bypass detector last had read everything the fallback's binlog held (asked every bypass.save-interval); grows while it falls behind or cannot read.", nil, cf),
	}
}

// Describe implements prometheus.Collector.
func (c *bypassCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.writes
	ch <- c.last
	ch <- c.upDesc
	ch <- c.lag
}

// Collect implements prometheus.Collector.
func (c *bypassCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.stats()
	for table, n := range st.WritesByTable {
		ch <- prometheus.MustNewConstMetric(c.writes, prometheus.CounterValue, float64(n), table)
	}
	var last float64
	if !st.LastDetectionTime.IsZero() {
		last = float64(st.LastDetectionTime.UnixNano()) / 1e9
	}
	ch <- prometheus.MustNewConstMetric(c.last, prometheus.GaugeValue, last)
	up := 0.0
	if st.Up {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(c.upDesc, prometheus.GaugeValue, up)
	ch <- prometheus.MustNewConstMetric(c.lag, prometheus.GaugeValue, st.Lag.Seconds())
}

// activeCollector collects c only while the replicator is not standing by (bypass.go).
type activeCollector struct {
	status func() cdc.Status
	c      prometheus.Collector
}

var _ prometheus.Collector = activeCollector{}

func (a activeCollector) Describe(ch chan<- *prometheus.Desc) { a.c.Describe(ch) }

func (a activeCollector) Collect(ch chan<- prometheus.Metric) {
	if !standingBy(a.status()) {
		a.c.Collect(ch)
	}
}
