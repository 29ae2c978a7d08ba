package daemon

// api.go adapts the daemon's parts to the gRPC API's backend (api.Backend):
// cdc.Replicator is its Replication and the repairer (repair.go) its Repairer;
// verify.Service is its Verification as it is.

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
	"github.com/tidb-parity/parity/checker/verify"
	"github.com/tidb-parity/parity/internal/tso"
)

// apiBackend returns the API's backend over the daemon's parts (vs nil without
// verification); close releases its upstream connection.
func apiBackend(upstreamDSN, instance string, r *cdc.Replicator, vs *verify.Service, rp *Repairer) (b api.Backend, close func()) {
	rep := &apiReplication{r: r, dsn: upstreamDSN}
	b = api.Backend{Replication: rep, Instance: instance}
	if vs != nil {
		b.Verification = vs // the service as it is: the API speaks its types
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
