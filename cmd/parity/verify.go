package main

// verify.go wires the verification service (checker/verify) into parity serve: the
// adapter through which cdc.Replicator is its applier, its Prometheus collector, its
// part of /status and the loopback-only endpoints that start a run and list the history
// (`parity verify` calls the gRPC API: client_diff.go).

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tidb-parity/parity/cdc"
	"github.com/tidb-parity/parity/cdc/bypass"
	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/checker/verify"
	"github.com/tidb-parity/parity/internal/tso"
)

// replicatorApplier is cdc.Replicator as verification's applier.
type replicatorApplier struct{ *cdc.Replicator }

var _ verify.Applier = replicatorApplier{}

func (a replicatorApplier) Watermarks() (applied, resolved uint64) {
	st := a.Status()
	return st.AppliedTs, st.ResolvedTs
}

// serveStatus is /status: the replicator's status and, with verification, its own.
type serveStatus struct {
	cdc.Status
	Verify *verifyStatus `json:"verify,omitempty"`
	// Bypass is the bypass detector's state (bypass.enabled).
	Bypass *bypass.Status `json:"bypass,omitempty"`
}

// verifyStatus is verification's part of /status.
type verifyStatus struct {
	// Instance is this daemon's verify.instance (the history names the daemon of each
	// run).
	Instance string `json:"instance"`
	// FreshnessSeconds is the age of the oldest applied change not covered by a clean
	// verification (an upper bound); null until a clean full run is known ("never").
	FreshnessSeconds *float64 `json:"freshness_seconds"`
	Verified         bool     `json:"verified"`
	// CoveredTs is the oldest pair TSO of the newest clean full run: every change at or
	// before it is verified.
	CoveredTs   uint64            `json:"covered_ts,omitempty"`
	CoveredTime time.Time         `json:"covered_time,omitzero"`
	CleanRunID  string            `json:"clean_run_id,omitempty"`
	Running     int               `json:"running"`
	Active      []verifyActive    `json:"active,omitempty"`
	LastRun     *verify.RunRecord `json:"last_run,omitempty"`
	Runs        []verify.RunCount `json:"runs,omitempty"`
	RowsChecked int64             `json:"rows_checked"`
	Differences int64             `json:"differences"`
	Pairs       int64             `json:"pairs"`
	Rotations   int64             `json:"view_rotations"`
	Passed      int64             `json:"barrier_passed"`
	PauseCount  uint64            `json:"pause_count"`
	PauseSum    float64           `json:"pause_seconds_sum"`
	Throttled   float64           `json:"throttled_seconds"`
	LastError   string            `json:"last_error,omitempty"`
}

type verifyActive struct {
	RunID          string  `json:"run_id"`
	Trigger        string  `json:"trigger"`
	Queued         bool    `json:"queued,omitempty"`
	Table          string  `json:"table,omitempty"`
	TablesDone     int     `json:"tables_done"`
	Tables         int     `json:"tables"`
	RowsChecked    int64   `json:"rows_checked"`
	PairTs         uint64  `json:"pair_ts,omitempty"`
	PairAgeSeconds float64 `json:"pair_age_seconds,omitempty"`
}

func verifyStatusOf(vs *verify.Service) *verifyStatus {
	if vs == nil {
		return nil
	}
	st := vs.Stats()
	out := &verifyStatus{
		Instance: st.Instance, Verified: st.Verified, CoveredTs: st.CoveredTS, CleanRunID: st.CleanRunID, Running: st.Running, LastRun: st.LastRun,
		Runs: st.Runs, RowsChecked: st.RowsChecked, Differences: st.Differences, Pairs: st.Pairs, Rotations: st.Rotations, Passed: st.BarrierPassed,
		PauseCount: st.Pause.Count, PauseSum: st.Pause.Sum.Seconds(), Throttled: st.Throttled.Seconds(), LastError: st.LastError,
	}
	if st.Verified {
		f := st.Freshness.Seconds()
		out.FreshnessSeconds = &f
		out.CoveredTime = tso.Time(st.CoveredTS).UTC()
	}
	for _, a := range st.Active {
		out.Active = append(out.Active, verifyActive{RunID: a.RunID, Trigger: a.Trigger, Queued: a.Queued, Table: a.Table,
			TablesDone: a.TablesDone, Tables: a.Tables, RowsChecked: a.RowsChecked, PairTs: a.PairTS, PairAgeSeconds: a.PairAge.Seconds()})
	}
	return out
}

// verifyCollector exports the service's Stats as Prometheus metrics: parity_verify_*,
// each with the changefeed label (docs/verify.md lists them).
type verifyCollector struct {
	s *verify.Service

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

func newVerifyCollector(s *verify.Service) *verifyCollector {
	l := []string{"changefeed"}
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("parity_verify_"+name, help, append(l, labels...), nil)
	}
	return &verifyCollector{
		s: s,
		freshness: d("freshness_seconds", "Age of the oldest applied change not covered by a clean full verification (an upper bound: "+
			"wall clock minus the clean run's oldest pair TSO, 0 when nothing was applied after it); +Inf until a clean run is known."),
		covered: d("covered_ts_seconds", "Physical time of the oldest pair TSO of the newest clean full verification (Unix seconds; 0: none)."),
		runs: d("runs_total", "Verification runs ended since start, by trigger (schedule name, continuous, manual, cutover-check) and "+
			"result (equal, different, failed, cancelled, skipped).", "trigger", "result"),
		differences: d("differences_total", "Differing rows found by verification runs since start, by kind (missing, extra, differing; "+
			"unlisted beyond the report's listed rows) and class (imported, post-import, cdc, diverged, unclassified).", "kind", "class"),
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
	st := c.s.Stats()
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

// loopbackOnly serves h to clients on the loopback interface only: the endpoints that
// start work are for the host's own CLI, as pprof is (keep status.addr on loopback).
func loopbackOnly(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
			http.Error(w, "verification endpoints answer loopback clients only", http.StatusForbidden)
			return
		}
		h(w, r)
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// verifyError is an endpoint's error body.
type verifyError struct {
	Error string `json:"error"`
	RunID string `json:"run_id,omitempty"` // the run in the way (409)
}

// verifyRunHandler is POST /verify/run?scope=full&table=schema.table...&wait=true: it
// starts a manual run and answers 202 with its run_id, or with wait the run's record
// once it ended (200); 409 while the previous manual run runs, 400 for a scope or
// table it cannot run, 503 when the service does not run.
func verifyRunHandler(vs *verify.Service) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		req := verify.Request{Scope: q.Get("scope")}
		for _, t := range q["table"] {
			for _, p := range strings.Split(t, ",") {
				if p = strings.TrimSpace(p); p != "" {
					req.Tables = append(req.Tables, p)
				}
			}
		}
		wait, _ := strconv.ParseBool(q.Get("wait"))
		st, err := vs.Trigger(r.Context(), req)
		var busy *verify.BusyError
		switch {
		case errors.As(err, &busy):
			writeJSON(w, http.StatusConflict, verifyError{Error: err.Error(), RunID: busy.RunID})
			return
		case errors.Is(err, verify.ErrNotRunning):
			writeJSON(w, http.StatusServiceUnavailable, verifyError{Error: err.Error()})
			return
		case err != nil:
			writeJSON(w, http.StatusBadRequest, verifyError{Error: err.Error()})
			return
		}
		if !wait {
			writeJSON(w, http.StatusAccepted, map[string]string{"run_id": st.RunID})
			return
		}
		rec, err := st.Wait(r.Context())
		if err != nil {
			return // the client went away; the run goes on
		}
		// The record with its pairs and tables, as the history holds it.
		if runs, err := vs.History(r.Context(), 1, rec.RunID); err == nil && len(runs) == 1 {
			rec = runs[0]
		}
		writeJSON(w, http.StatusOK, rec)
	}
}

// verifyRunsHandler is GET /verify/runs?limit=20[&run_id=ID]: the history, newest first.
func verifyRunsHandler(vs *verify.Service) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		limit := 20
		if v := r.URL.Query().Get("limit"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 10000 {
				writeJSON(w, http.StatusBadRequest, verifyError{Error: "limit: want 1 to 10000, got " + v})
				return
			}
			limit = n
		}
		runs, err := vs.History(r.Context(), limit, r.URL.Query().Get("run_id"))
		switch {
		case errors.Is(err, verify.ErrNotRunning):
			writeJSON(w, http.StatusServiceUnavailable, verifyError{Error: err.Error()})
		case err != nil:
			writeJSON(w, http.StatusInternalServerError, verifyError{Error: err.Error()})
		default:
			if runs == nil {
				runs = []verify.RunRecord{}
			}
			writeJSON(w, http.StatusOK, runs)
		}
	}
}

func fmtTS(ts uint64) string {
	if ts == 0 {
		return "-"
	}
	return fmt.Sprintf("%d (%s)", ts, tso.Format(ts))
}
