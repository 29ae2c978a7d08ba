package daemon

// api.go adapts the daemon's parts to the gRPC API's backend (api.Backend):
// cdc.Replicator is its Replication, verify.Service its Verification, the repairer
// (repair.go) its Repairer.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
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
func apiBackend(upstreamDSN, instance string, r *cdc.Replicator, vs *verify.Service, rp *Repairer) (b api.Backend, close func()) {
	rep := &apiReplication{r: r, dsn: upstreamDSN}
	b = api.Backend{Replication: rep, Instance: instance}
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
	st, err := a.vs.Trigger(ctx, verify.Request{Scope: req.Scope, Tables: req.Tables, MaxViewAge: req.MaxViewAge,
		MinTS: req.MinTS, MaxRowsPerSecond: req.MaxRowsPerSecond})
	if err != nil {
		return "", requestField(err, startDiffFields)
	}
	return st.RunID, nil
}

// startDiffFields and cutoverFields map the fields verify's request errors are about
// (verify.RequestError) to the API request's field paths.
var (
	startDiffFields = map[string]string{
		verify.FieldScope:            "scope",
		verify.FieldTables:           "tables",
		verify.FieldMaxViewAge:       "snapshot_policy.max_view_age",
		verify.FieldMinTS:            "snapshot_policy.min_ts",
		verify.FieldMaxRowsPerSecond: "options.max_rows_per_second",
	}
	cutoverFields = map[string]string{
		verify.FieldFullTables:  "full_tables",
		verify.FieldTables:      "tables",
		verify.FieldUpstreamTS:  "upstream", // the oneof: upstream_ts or now
		verify.FieldMaxFullAge:  "max_full_diff_age",
		verify.FieldWaitTimeout: "wait_timeout",
	}
)

// requestField names, for the API, the request field (through fields) of an invalid
// request's error (verify.RequestError); other errors are returned as they are.
func requestField(err error, fields map[string]string) error {
	var re *verify.RequestError
	if !errors.As(err, &re) {
		return err
	}
	if f, ok := fields[re.Field]; ok {
		return &api.FieldError{Field: f, Err: err}
	}
	return err
}

func (a *apiVerification) Get(ctx context.Context, runID string) (verify.RunRecord, *verify.ActiveRun, error) {
	return a.vs.Get(ctx, runID)
}

func (a *apiVerification) Ended(runID string) <-chan struct{} { return a.vs.Ended(runID) }

func (a *apiVerification) Cancel(ctx context.Context, runID string) (verify.RunRecord, error) {
	return a.vs.Cancel(ctx, runID)
}

func (a *apiVerification) List(ctx context.Context, f api.RunFilter) ([]verify.RunRecord, error) {
	return a.vs.List(ctx, verify.ListFilter{State: f.State, Trigger: f.Trigger, StartedAfter: f.StartedAfter,
		StartedBefore: f.StartedBefore, Offset: f.Offset, Limit: f.Limit})
}

func (a *apiVerification) SnapshotPoint(ctx context.Context, atTS uint64) (api.Point, error) {
	p, err := a.vs.SnapshotPoint(ctx, atTS)
	if err != nil {
		return api.Point{}, err
	}
	return api.Point{TS: p.TS, Position: p.Position, Source: p.Source, Pause: p.Pause, CreatedAt: p.CreatedAt}, nil
}

func (a *apiVerification) CutoverCheck(ctx context.Context, req api.CutoverRequest) (api.CutoverResult, error) {
	r, err := a.vs.CutoverCheck(ctx, verify.CutoverRequest{UpstreamTS: req.UpstreamTS, Now: req.Now, MaxFullAge: req.MaxFullAge,
		Tables: req.Tables, WaitTimeout: req.WaitTimeout, Full: req.Full, FullTables: req.FullTables})
	if err != nil {
		return api.CutoverResult{}, requestField(err, cutoverFields)
	}
	out := api.CutoverResult{Passed: r.Passed, Failures: r.Failures, UpstreamTS: r.UpstreamTS, RunID: r.RunID,
		Pair:         api.Point{TS: r.Pair.TS, Position: r.Pair.Position, Source: r.Pair.Source, Pause: r.Pair.Pause, CreatedAt: r.Pair.CreatedAt},
		KeysVerified: r.KeysVerified, Differences: r.Differences, ByClass: r.ByClass, Waited: r.Waited, Unconfirmed: r.Unconfirmed,
		Bypass: r.Bypass}
	for _, t := range r.Tables {
		out.Tables = append(out.Tables, api.CutoverTable{Table: t.Table, LastFullRunID: t.LastFullRunID, LastFullAge: t.LastFullAge,
			SinceTS: t.SinceTS, KeysVerified: t.KeysVerified, Differences: t.Differences, Result: t.Result, Full: t.Full,
			LedgerFromTS: t.LedgerFromTS, LedgerUntilTS: t.LedgerUntilTS, LedgerKeys: t.LedgerKeys, Bypass: t.Bypass, BypassNote: t.BypassNote,
			BypassSince: t.BypassSince, BypassWatchedSince: t.BypassWatchedSince, BypassKeys: t.BypassKeys, BypassDDL: t.BypassDDL})
	}
	return out, nil
}

func (a *apiVerification) Differences(ctx context.Context, runID string, tables []string) ([]checker.StoredDifference, error) {
	ds, err := a.vs.Differences(ctx, runID, tables)
	return ds, tablesField(err)
}

func (a *apiVerification) FixSQL(ctx context.Context, runID string, tables []string, emit func(table, sql string) error) error {
	return tablesField(a.vs.FixSQL(ctx, runID, tables, emit))
}

// tablesField names the table filter in an invalid request to Differences and FixSQL
// (the API's single table field).
func tablesField(err error) error {
	if errors.Is(err, verify.ErrInvalidRequest) {
		return &api.FieldError{Field: "table", Err: err}
	}
	return err
}

// apiRepairer is the API's view of the repairer.
type apiRepairer struct{ rp *Repairer }

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
