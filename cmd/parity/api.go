package main

// api.go adapts the daemon's parts to the gRPC API's backend (api.Backend):
// cdc.Replicator is its Replication, verify.Service its Verification, the repairer
// (repair.go) its Repairer.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/tidb-parity/parity/api"
	"github.com/tidb-parity/parity/cdc"
	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/checker/verify"
	"github.com/tidb-parity/parity/internal/tso"
)

// apiBackend returns the API's backend over the daemon's parts (vs nil without
// verification); close releases its upstream connection.
func apiBackend(cfg serveConfig, r *cdc.Replicator, vs *verify.Service, rp *repairer) (b api.Backend, close func()) {
	rep := &apiReplication{r: r, dsn: cfg.Upstream.DSN}
	host, _ := os.Hostname()
	b = api.Backend{Replication: rep, Instance: host}
	if vs != nil {
		b.Verification = &apiVerification{vs: vs, r: r}
		b.Repairer = apiRepairer{rp}
	}
	return b, rep.close
}

// apiReplication is the API's view of the replicator.
type apiReplication struct {
	r   *cdc.Replicator
	dsn string

	once sync.Once
	db   *sql.DB
	err  error
}

var _ api.Replication = (*apiReplication)(nil)

func (a *apiReplication) Status() cdc.Status { return a.r.Status() }

func (a *apiReplication) WaitApplied(ctx context.Context, ts uint64) error {
	return a.r.WaitApplied(ctx, ts)
}

// UpstreamTSO reads TiDB's current TSO on a connection of its own (opened at the first
// call).
func (a *apiReplication) UpstreamTSO(ctx context.Context) (uint64, error) {
	a.once.Do(func() {
		mc, err := mysql.ParseDSN(a.dsn)
		if err != nil {
			a.err = fmt.Errorf("upstream.dsn: %w", err)
			return
		}
		mc.DBName = ""
		conn, err := mysql.NewConnector(mc)
		if err != nil {
			a.err = fmt.Errorf("upstream.dsn: %w", err)
			return
		}
		a.db = sql.OpenDB(conn)
		a.db.SetMaxOpenConns(2)
		a.db.SetConnMaxIdleTime(time.Minute)
	})
	if a.err != nil {
		return 0, a.err
	}
	ts, err := tso.Current(ctx, a.db, 30*time.Second)
	var me *mysql.MySQLError
	if err != nil && ctx.Err() == nil && !errors.As(err, &me) { // not reached, rather than refused
		return 0, &api.ServerError{Server: "upstream", Err: err}
	}
	return ts, err
}

func (a *apiReplication) close() {
	if a.db != nil {
		_ = a.db.Close()
	}
}

// apiVerification is the API's view of the verification service.
type apiVerification struct {
	vs *verify.Service
	r  *cdc.Replicator
}

var _ api.Verification = (*apiVerification)(nil)

func (a *apiVerification) Stats() verify.Stats { return a.vs.Stats() }

func (a *apiVerification) Start(ctx context.Context, req api.DiffRequest) (string, error) {
	switch {
	case req.MaxViewAge > 0:
		return "", &api.FieldError{Field: "snapshot_policy.max_view_age", Err: api.ErrUnimplemented}
	case req.MinTS > 0:
		return "", &api.FieldError{Field: "snapshot_policy.min_ts", Err: api.ErrUnimplemented}
	case req.MaxRowsPerSecond > 0:
		return "", &api.FieldError{Field: "options.max_rows_per_second", Err: api.ErrUnimplemented}
	}
	st, err := a.vs.Trigger(ctx, verify.Request{Scope: req.Scope, Tables: req.Tables})
	if err != nil {
		return "", err
	}
	return st.RunID, nil
}

// active returns the run runID's progress while it is queued or running.
func (a *apiVerification) active(runID string) *verify.ActiveRun {
	for _, r := range a.vs.Stats().Active {
		if r.RunID == runID {
			return &r
		}
	}
	return nil
}

func (a *apiVerification) Get(ctx context.Context, runID string) (verify.RunRecord, *verify.ActiveRun, error) {
	act := a.active(runID)
	runs, err := a.vs.History(ctx, 1, runID)
	if err != nil {
		return verify.RunRecord{}, nil, err
	}
	if len(runs) == 0 {
		if act != nil { // queued: not in the history yet
			return verify.RunRecord{RunID: runID, Trigger: act.Trigger, State: verify.StateRunning}, act, nil
		}
		return verify.RunRecord{}, nil, fmt.Errorf("verification run %s: %w", runID, api.ErrRunNotFound)
	}
	if runs[0].State != verify.StateRunning {
		act = nil
	}
	return runs[0], act, nil
}

func (a *apiVerification) Cancel(ctx context.Context, runID string) (verify.RunRecord, error) {
	return verify.RunRecord{}, fmt.Errorf("cancelling a run: %w", api.ErrUnimplemented)
}

// listScan bounds the history read to filter runs.
const listScan = 10000

func (a *apiVerification) List(ctx context.Context, f api.RunFilter) ([]verify.RunRecord, error) {
	runs, err := a.vs.History(ctx, listScan, "")
	if err != nil {
		return nil, err
	}
	runs = slices.DeleteFunc(runs, func(r verify.RunRecord) bool {
		return (f.State != "" && r.State != f.State) || (f.Trigger != "" && r.Trigger != f.Trigger) ||
			(!f.StartedAfter.IsZero() && r.StartedAt.Before(f.StartedAfter)) ||
			(!f.StartedBefore.IsZero() && !r.StartedAt.Before(f.StartedBefore))
	})
	if f.Offset >= len(runs) {
		return nil, nil
	}
	runs = runs[f.Offset:]
	if f.Limit > 0 && len(runs) > f.Limit {
		runs = runs[:f.Limit]
	}
	return runs, nil
}

func (a *apiVerification) SnapshotPoint(ctx context.Context, atTS uint64) (api.Point, error) {
	return api.Point{}, fmt.Errorf("snapshot points: %w", api.ErrUnimplemented)
}

func (a *apiVerification) CutoverCheck(ctx context.Context, req api.CutoverRequest) (api.CutoverResult, error) {
	return api.CutoverResult{}, fmt.Errorf("cutover check: %w", api.ErrUnimplemented)
}

func (a *apiVerification) Differences(ctx context.Context, runID string, tables []string) ([]checker.StoredDifference, error) {
	return runDifferences(ctx, a.r, a.vs, runID, tables)
}

func (a *apiVerification) FixSQL(ctx context.Context, runID string, tables []string, emit func(table, sql string) error) error {
	return fmt.Errorf("fix SQL: %w", api.ErrUnimplemented)
}

// apiRepairer is the API's view of the repairer.
type apiRepairer struct{ rp *repairer }

func (a apiRepairer) Repair(ctx context.Context, runID string, tables []string, dry bool) (api.RepairResult, error) {
	resp, err := a.rp.Repair(ctx, runID, tables, dry)
	if resp == nil {
		return api.RepairResult{}, err
	}
	if err != nil {
		return api.RepairResult{}, fmt.Errorf("repair %s stopped part-way (what was done is recorded in the repairs table): %w", resp.ID, err)
	}
	return api.RepairResult{RepairResult: resp.RepairResult, Reverify: resp.Reverify}, nil
}
