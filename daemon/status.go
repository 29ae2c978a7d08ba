package daemon

// status.go: the status address — /status (JSON, read by `parity status` and the tests),
// /healthz, /metrics (metrics.go), pprof, and with verify.enabled the loopback-only HTTP
// endpoints POST /verify/run, GET /verify/runs and POST /repair. Those are thin calls of
// the same verification service and repairer the gRPC API serves (no command calls them:
// the CLI calls the API; they stay for scripts on the daemon's host).
//
// Under [ha] only the daemon holding the changefeed's lease reads the fallback's binlog
// (Run runs the detector through cdc.Replicator.WhileActive): one bypass.server-id
// serves every daemon of a changefeed, and two daemons never evict each other's binlog
// connection (ERROR 4052). A standby says so in /status (bypass.state "standby") and
// exports no parity_bypass_* series, so that the lag of a detector it does not run
// raises no alert.

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tidb-parity/parity/api"
	"github.com/tidb-parity/parity/cdc"
	"github.com/tidb-parity/parity/cdc/bypass"
	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/checker/verify"
	"github.com/tidb-parity/parity/internal/tso"
)

// Components are the daemon's running parts: Verify, Bypass and Repairer are nil when
// off (verify.enabled, bypass.enabled).
type Components struct {
	Replicator *cdc.Replicator
	Verify     *verify.Service
	Bypass     *bypass.Detector
	Repairer   *Repairer
}

// BuildInfo is parity_build_info's labels.
type BuildInfo struct{ Version, Commit string }

// Handler serves the status address over c: /status, /healthz, /metrics (with extra
// collectors, the API's), /debug/pprof/ when pprofOn, and with verification the loopback
// endpoints. A nil c.Repairer is one over c's replicator and verification service.
func Handler(c Components, build BuildInfo, pprofOn bool, extra ...prometheus.Collector) http.Handler {
	if c.Repairer == nil && c.Verify != nil {
		c.Repairer = NewRepairer(c.Replicator, c.Verify)
	}
	mux := http.NewServeMux()
	if pprofOn {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	mux.Handle("/metrics", metricsHandler(c, build, extra...))
	mux.HandleFunc("/status", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		st := Status{Status: c.Replicator.Status(), Verify: verifyStatusOf(c.Verify)}
		if c.Bypass != nil {
			st.Bypass = bypassStatus(st.Status, c.Bypass)
		}
		_ = enc.Encode(st)
	})
	if c.Verify != nil {
		mux.HandleFunc("POST /verify/run", loopbackOnly(verifyRunHandler(c.Verify)))
		mux.HandleFunc("GET /verify/runs", loopbackOnly(verifyRunsHandler(c.Verify)))
		mux.HandleFunc("POST /repair", loopbackOnly(repairHandler(c.Repairer)))
	}
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		st := c.Replicator.Status()
		if st.State == "failed" {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprintln(w, strings.ToLower(st.State))
	})
	return mux
}

// Applier returns r as the verification service's applier (verify.Deps.Applier).
func Applier(r *cdc.Replicator) verify.Applier { return replicatorApplier{r} }

// replicatorApplier is cdc.Replicator as verification's applier.
type replicatorApplier struct{ *cdc.Replicator }

var _ verify.Applier = replicatorApplier{}

func (a replicatorApplier) Watermarks() (applied, resolved uint64) {
	st := a.Status()
	return st.AppliedTs, st.ResolvedTs
}

// Status is /status: the replicator's status and, with verification, its own.
type Status struct {
	cdc.Status
	Verify *VerifyStatus `json:"verify,omitempty"`
	// Bypass is the bypass detector's state (bypass.enabled).
	Bypass *bypass.Status `json:"bypass,omitempty"`
}

// VerifyStatus is verification's part of /status.
type VerifyStatus struct {
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
	Active      []VerifyActive    `json:"active,omitempty"`
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

// VerifyActive is a run started and not ended, in /status.
type VerifyActive struct {
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

func verifyStatusOf(vs *verify.Service) *VerifyStatus {
	if vs == nil {
		return nil
	}
	st := vs.Stats()
	out := &VerifyStatus{
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
		out.Active = append(out.Active, VerifyActive{RunID: a.RunID, Trigger: a.Trigger, Queued: a.Queued, Table: a.Table,
			TablesDone: a.TablesDone, Tables: a.Tables, RowsChecked: a.RowsChecked, PairTs: a.PairTS, PairAgeSeconds: a.PairAge.Seconds()})
	}
	return out
}

// bypassStateStandby is /status bypass.state on a daemon that does not hold the lease.
const bypassStateStandby = "standby"

// standingBy reports whether r, with ha.enabled, does not hold the lease (a standby, or
// not yet known: the detector does not run either way).
func standingBy(st cdc.Status) bool {
	return st.HA != nil && st.HA.Role != "active"
}

// bypassStatus is the detector's /status on a daemon whose replicator status is st. A
// standby's says state standby and keeps only what this process detected while it was
// active (detections, the newest ones, the newest's time): no position, binlog end or
// lag, which belong to the daemon reading (a detector that does not run has a lag that
// only grows).
func bypassStatus(st cdc.Status, bd *bypass.Detector) *bypass.Status {
	b := bd.Status()
	if standingBy(st) {
		b = bypass.Status{State: bypassStateStandby, Detections: b.Detections, Recent: b.Recent, LastDetectionTime: b.LastDetectionTime}
	}
	return &b
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

// VerifyError is an endpoint's error body.
type VerifyError struct {
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
			writeJSON(w, http.StatusConflict, VerifyError{Error: err.Error(), RunID: busy.RunID})
			return
		case errors.Is(err, verify.ErrNotRunning):
			writeJSON(w, http.StatusServiceUnavailable, VerifyError{Error: err.Error()})
			return
		case err != nil:
			writeJSON(w, http.StatusBadRequest, VerifyError{Error: err.Error()})
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
				writeJSON(w, http.StatusBadRequest, VerifyError{Error: "limit: want 1 to 10000, got " + v})
				return
			}
			limit = n
		}
		runs, err := vs.History(r.Context(), limit, r.URL.Query().Get("run_id"))
		switch {
		case errors.Is(err, verify.ErrNotRunning):
			writeJSON(w, http.StatusServiceUnavailable, VerifyError{Error: err.Error()})
		case err != nil:
			writeJSON(w, http.StatusInternalServerError, VerifyError{Error: err.Error()})
		default:
			if runs == nil {
				runs = []verify.RunRecord{}
			}
			writeJSON(w, http.StatusOK, runs)
		}
	}
}

// repairHTTPCode is the HTTP status of a repair's error.
func repairHTTPCode(err error) int {
	var (
		fe   *api.FieldError
		busy *verify.BusyError
	)
	switch {
	case errors.As(err, &fe):
		return http.StatusBadRequest
	case errors.Is(err, verify.ErrRunNotFound), errors.Is(err, checker.ErrRunNotFound):
		return http.StatusNotFound
	case errors.Is(err, checker.ErrRunRunning), errors.As(err, &busy):
		return http.StatusConflict
	case errors.Is(err, cdc.ErrStopped), errors.Is(err, verify.ErrNotRunning):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// repairHandler is POST /repair?run=ID[&table=schema.table...][&dry-run=1]: it repairs
// the run's differences and answers the result (200), with the re-verification's run
// unless dry-run; 400 for a bad request or a table not in the run, 404 for an unknown
// run, 409 while the run (or another repair) is running, 503 when the replicator or the
// verification service does not run, 500 when the repair failed part-way (what was done
// is in the body and in the meta schema).
func repairHandler(rp *Repairer) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		q := req.URL.Query()
		runID := strings.TrimSpace(q.Get("run"))
		if runID == "" {
			writeJSON(w, http.StatusBadRequest, VerifyError{Error: "run: the run whose differences to repair is required (run=ID)"})
			return
		}
		dry := false
		if v := q.Get("dry-run"); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				writeJSON(w, http.StatusBadRequest, VerifyError{Error: "dry-run: want a boolean, got " + strconv.Quote(v)})
				return
			}
			dry = b
		}
		var tables []string
		for _, t := range q["table"] {
			for _, p := range strings.Split(t, ",") {
				if p = strings.TrimSpace(p); p != "" {
					if _, _, ok := strings.Cut(p, "."); !ok {
						writeJSON(w, http.StatusBadRequest, VerifyError{Error: fmt.Sprintf("table: want schema.table, got %q", p)})
						return
					}
					tables = append(tables, p)
				}
			}
		}
		resp, err := rp.Repair(req.Context(), runID, tables, dry)
		if err != nil {
			var busy *verify.BusyError
			if errors.As(err, &busy) {
				err = errors.New("another repair is running; try again when it ended")
			}
			code := repairHTTPCode(err)
			if busy != nil {
				code = http.StatusConflict
			}
			if resp == nil {
				writeJSON(w, code, VerifyError{Error: err.Error()})
				return
			}
			resp.Error = err.Error()
			writeJSON(w, code, resp)
			return
		}
		writeJSON(w, http.StatusOK, resp)
	}
}
