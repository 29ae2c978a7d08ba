package daemon

// repair.go: repair through the apply stream (docs/verify.md, "Repair"). The repairer
// reads a run's stored differences — a verification run's through the verification
// service, or a `parity diff` run's kept in the daemon's meta schema — repairs their
// keys with cdc.Replicator.Repair (inside the applier's barrier, with its sessions and
// statements), then re-verifies the repaired tables with a full run of the verification
// service at a new snapshot pair. The gRPC API's Repair (`parity repair`) and POST
// /repair call it. cdc and checker do not know each other: the differences become
// cdc.RepairKeys here.

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidb-parity/parity/api"
	"github.com/tidb-parity/parity/cdc"
	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/checker/verify"
	"github.com/tidb-parity/parity/internal/rowkey"
)

// RepairResult is a repair's answer (POST /repair's body; the API's Repair).
type RepairResult struct {
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

// Repairer repairs runs' differences for POST /repair and the API's Repair: one repair
// at a time (a second is refused while one runs, as *verify.BusyError with trigger
// "repair").
type Repairer struct {
	r  *cdc.Replicator
	vs *verify.Service

	mu      sync.Mutex // held while a repair runs
	current atomic.Value
}

// NewRepairer returns the repairer of r and vs.
func NewRepairer(r *cdc.Replicator, vs *verify.Service) *Repairer { return &Repairer{r: r, vs: vs} }

// Repair repairs runID's differences (of tables, all when empty) and re-verifies their
// tables (see repair). Errors match verify.ErrRunNotFound (an unknown run),
// checker.ErrRunRunning (still running), *api.FieldError (a table not in the run),
// *verify.BusyError (a repair under way), cdc.ErrStopped or verify.ErrNotRunning.
func (rp *Repairer) Repair(ctx context.Context, runID string, tables []string, dry bool) (*RepairResult, error) {
	if !rp.mu.TryLock() {
		cur, _ := rp.current.Load().(string)
		return nil, &verify.BusyError{Trigger: "repair", RunID: cur}
	}
	defer rp.mu.Unlock()
	rp.current.Store(runID)
	return repair(ctx, rp.r, rp.vs, runID, tables, dry)
}

// repair reads the run's differences, repairs their keys and re-verifies their tables.
// A non-nil response with an error is a repair that failed part-way.
func repair(ctx context.Context, r *cdc.Replicator, vs *verify.Service, runID string, tables []string, dry bool) (*RepairResult, error) {
	diffs, err := vs.Differences(ctx, runID, tables)
	if errors.Is(err, verify.ErrInvalidRequest) {
		return nil, &api.FieldError{Field: "tables", Err: err}
	}
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
	resp := &RepairResult{Differences: len(diffs), Tables: make([]string, 0, len(names))}
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
