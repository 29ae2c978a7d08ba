package main

// repair.go wires repair through the apply stream (docs/verify.md, "Repair") into
// parity serve: POST /repair (loopback only, mounted with verify.enabled) reads a run's
// stored differences from the meta schema (checker.RunDifferences; a verification run's
// tables each name their checker run), repairs their keys with cdc.Replicator.Repair
// (inside the applier's barrier, with its sessions and statements), then re-verifies
// the repaired tables with a full run of the verification service at a new snapshot
// pair. `parity repair` calls the gRPC API's Repair (client_cutover.go), served by the
// same code. cdc and checker do not know each other: the differences become
// cdc.RepairKeys here.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/tidb-parity/parity/api"
	"github.com/tidb-parity/parity/cdc"
	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/checker/verify"
	"github.com/tidb-parity/parity/internal/rowkey"
)

// repairResponse is POST /repair's answer.
type repairResponse struct {
	cdc.RepairResult
	// Differences is how many stored differences of the run (and --table) were read;
	// Tables the upstream tables they belong to.
	Differences int      `json:"differences"`
	Tables      []string `json:"tables"`
	// Reverify is the verification run that compared Tables again after the repair (not
	// for a dry run, nor when there was nothing to repair).
	Reverify *verify.RunRecord `json:"reverify,omitempty"`
	Error    string            `json:"error,omitempty"`
}

// repairer repairs runs' differences for POST /repair and the API's Repair: one repair
// at a time (a second is refused while one runs, as *verify.BusyError with trigger
// "repair").
type repairer struct {
	r  *cdc.Replicator
	vs *verify.Service

	mu      sync.Mutex // held while a repair runs
	current atomic.Value
}

func newRepairer(r *cdc.Replicator, vs *verify.Service) *repairer { return &repairer{r: r, vs: vs} }

// Repair repairs runID's differences (of tables, all when empty) and re-verifies their
// tables (see repair). Errors match checker.ErrRunNotFound (an unknown run),
// checker.ErrRunRunning (still running), *api.FieldError (a table not in the run),
// *verify.BusyError (a repair under way), cdc.ErrStopped or verify.ErrNotRunning.
func (rp *repairer) Repair(ctx context.Context, runID string, tables []string, dry bool) (*repairResponse, error) {
	if !rp.mu.TryLock() {
		cur, _ := rp.current.Load().(string)
		return nil, &verify.BusyError{Trigger: "repair", RunID: cur}
	}
	defer rp.mu.Unlock()
	rp.current.Store(runID)
	return repair(ctx, rp.r, rp.vs, runID, tables, dry)
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
	case errors.Is(err, checker.ErrRunNotFound):
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
func repairHandler(rp *repairer) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		q := req.URL.Query()
		runID := strings.TrimSpace(q.Get("run"))
		if runID == "" {
			writeJSON(w, http.StatusBadRequest, verifyError{Error: "run: the run whose differences to repair is required (run=ID)"})
			return
		}
		dry := false
		if v := q.Get("dry-run"); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				writeJSON(w, http.StatusBadRequest, verifyError{Error: "dry-run: want a boolean, got " + strconv.Quote(v)})
				return
			}
			dry = b
		}
		var tables []string
		for _, t := range q["table"] {
			for _, p := range strings.Split(t, ",") {
				if p = strings.TrimSpace(p); p != "" {
					if _, _, ok := strings.Cut(p, "."); !ok {
						writeJSON(w, http.StatusBadRequest, verifyError{Error: fmt.Sprintf("table: want schema.table, got %q", p)})
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
				writeJSON(w, code, verifyError{Error: err.Error()})
				return
			}
			resp.Error = err.Error()
			writeJSON(w, code, resp)
			return
		}
		writeJSON(w, http.StatusOK, resp)
	}
}

// repair reads the run's differences, repairs their keys and re-verifies their tables.
// A non-nil response with an error is a repair that failed part-way.
func repair(ctx context.Context, r *cdc.Replicator, vs *verify.Service, runID string, tables []string, dry bool) (*repairResponse, error) {
	diffs, err := runDifferences(ctx, r, vs, runID, tables)
	if err != nil {
		return nil, err
	}
	keys := make([]cdc.RepairKey, 0, len(diffs))
	seen := map[string]bool{}
	names := map[string]bool{}
	for _, d := range diffs {
		// A key reported twice (two copies of a keyless row are one entry; a keyed
		// row has one difference) is repaired once.
		exact, err := rowkey.Encode(d.KeyValues...)
		if err != nil {
			return nil, fmt.Errorf("table %s.%s: a stored key: %w", d.UpSchema, d.UpTable, err)
		}
		id := d.UpSchema + "\x00" + d.UpTable + "\x00" + string(exact)
		if seen[id] {
			continue
		}
		seen[id] = true
		names[d.UpSchema+"."+d.UpTable] = true
		keys = append(keys, cdc.RepairKey{Schema: d.UpSchema, Table: d.UpTable, DownSchema: d.DownSchema, DownTable: d.DownTable,
			Columns: d.KeyColumns, Values: d.KeyValues, Text: d.Key})
	}
	resp := &repairResponse{Differences: len(diffs), Tables: make([]string, 0, len(names))}
	for n := range names {
		resp.Tables = append(resp.Tables, n)
	}
	sort.Strings(resp.Tables)
	resp.RepairResult, err = r.Repair(ctx, cdc.RepairRequest{RunID: runID, Keys: keys, DryRun: dry})
	if err != nil {
		return resp, err
	}
	if dry || len(keys) == 0 {
		return resp, nil
	}
	rec, err := reverify(ctx, vs, resp.Tables)
	if err != nil {
		return resp, fmt.Errorf("re-verifying %s after repair %s: %w", strings.Join(resp.Tables, ", "), resp.ID, err)
	}
	resp.Reverify = &rec
	return resp, nil
}

// runDifferences returns the stored differences of runID: a verification run's (each
// of its tables was compared by a checker run) or a checker run's (parity diff with the
// daemon's meta schema).
func runDifferences(ctx context.Context, r *cdc.Replicator, vs *verify.Service, runID string, tables []string) ([]checker.StoredDifference, error) {
	cfg := r.Config()
	mc, err := mysql.ParseDSN(cfg.Downstream.DSN)
	if err != nil {
		return nil, fmt.Errorf("downstream.dsn: %w", err)
	}
	mc.DBName = ""
	conn, err := mysql.NewConnector(mc)
	if err != nil {
		return nil, fmt.Errorf("downstream.dsn: %w", err)
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	db.SetMaxOpenConns(2)
	schema := cfg.Applier.MetaSchema

	runs, err := vs.History(ctx, 1, runID)
	if err != nil {
		return nil, err
	}
	if len(runs) == 0 {
		diffs, err := checker.RunDifferences(ctx, db, schema, runID, tables)
		switch {
		case errors.Is(err, checker.ErrRunNotFound):
			return nil, fmt.Errorf("run %s not found: neither a verification run (parity verify history) nor a diff run in meta schema %s: %w", runID, schema, checker.ErrRunNotFound)
		case err != nil && strings.Contains(err.Error(), "is not among the tables"):
			return nil, &api.FieldError{Field: "tables", Err: err}
		}
		return diffs, err
	}
	run := runs[0]
	if run.State == verify.StateRunning {
		return nil, fmt.Errorf("verification run %s: %w: repair its differences once it ended", runID, checker.ErrRunRunning)
	}
	matched := make([]bool, len(tables))
	var out []checker.StoredDifference
	for _, t := range run.Tables {
		keep := len(tables) == 0
		for i, p := range tables {
			if checker.MatchTable(p, t.Schema, t.Table) {
				matched[i], keep = true, true
			}
		}
		if !keep || t.DiffRunID == "" {
			continue
		}
		diffs, err := checker.RunDifferences(ctx, db, schema, t.DiffRunID, nil)
		if err != nil {
			return nil, fmt.Errorf("table %s.%s of run %s: %w", t.Schema, t.Table, runID, err)
		}
		out = append(out, diffs...)
	}
	for i, m := range matched {
		if !m {
			names := make([]string, len(run.Tables))
			for j, t := range run.Tables {
				names[j] = t.Schema + "." + t.Table
			}
			return nil, &api.FieldError{Field: "tables", Err: fmt.Errorf("table %s is not among the tables of verification run %s (%s)", tables[i], runID, strings.Join(names, ", "))}
		}
	}
	return out, nil
}

// reverify runs a full verification of tables at a new snapshot pair and returns its
// record. A manual run already under way is waited for (a trigger never overlaps
// itself).
func reverify(ctx context.Context, vs *verify.Service, tables []string) (verify.RunRecord, error) {
	req := verify.Request{Scope: verify.ScopeFull}
	for _, t := range tables {
		s, tb, _ := strings.Cut(t, ".")
		p, err := checker.ExactTablePattern(s, tb)
		if err != nil {
			return verify.RunRecord{}, err
		}
		req.Tables = append(req.Tables, p)
	}
	for {
		st, err := vs.Trigger(ctx, req)
		var busy *verify.BusyError
		if errors.As(err, &busy) {
			select {
			case <-time.After(500 * time.Millisecond):
				continue
			case <-ctx.Done():
				return verify.RunRecord{}, ctx.Err()
			}
		}
		if err != nil {
			return verify.RunRecord{}, err
		}
		rec, err := st.Wait(ctx)
		if err != nil {
			return verify.RunRecord{}, err
		}
		if runs, err := vs.History(ctx, 1, rec.RunID); err == nil && len(runs) == 1 {
			rec = runs[0]
		}
		return rec, nil
	}
}
