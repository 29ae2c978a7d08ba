package verify

// pools.go owns the service's connection pools (opened by Run, closed when it returns)
// and the one query on TiDB outside a pair: its current TSO.

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/tidb-parity/parity/internal/tso"
)

// pools are the service's connection pools.
type pools struct {
	down *sql.DB // the pairs' snapshot transactions on the fallback
	kill *sql.DB // KILL QUERY of a timed-out snapshot query; snapshot points
	meta *sql.DB // the checker's run state
	hist *sql.DB // the history, read as UTC times
	lock *sql.DB // the instance lock's connection
	up   *sql.DB // TiDB's current TSO, its table list
}

// open opens the pools (no connection yet); close closes those it opened even when it
// fails.
func (p *pools) open(cfg Config) error {
	mc, err := mysql.ParseDSN(cfg.DownstreamDSN)
	if err != nil {
		return fmt.Errorf("downstream.dsn: %w", err)
	}
	mc.DBName = ""
	mc.InterpolateParams = true
	pool := func(c *mysql.Config, n int) (*sql.DB, error) {
		conn, err := mysql.NewConnector(c)
		if err != nil {
			return nil, fmt.Errorf("downstream.dsn: %w", err)
		}
		db := sql.OpenDB(conn)
		db.SetMaxOpenConns(n)
		db.SetMaxIdleConns(n)
		db.SetConnMaxLifetime(30 * time.Minute)
		return db, nil
	}
	runs := cfg.MaxConcurrentRuns
	// The snapshot transactions: verify.max-connections per run.
	if p.down, err = pool(mc, runs*cfg.MaxConnections); err != nil {
		return err
	}
	p.kill, _ = pool(mc, 2)
	// The checker's journal writes a few statements per chunk.
	p.meta, _ = pool(mc, 2*runs+1)
	hc := mc.Clone()
	hc.ParseTime, hc.Loc = true, time.UTC
	if hc.Params == nil {
		hc.Params = map[string]string{}
	}
	hc.Params["time_zone"] = "'+00:00'"
	p.hist, _ = pool(hc, 2)
	p.lock, _ = pool(mc, 1)
	uc, err := mysql.ParseDSN(cfg.UpstreamDSN)
	if err != nil {
		return fmt.Errorf("upstream.dsn: %w", err)
	}
	uc.DBName = ""
	if p.up, err = pool(uc, 1); err != nil {
		return err
	}
	return nil
}

func (p *pools) close() {
	for _, db := range []*sql.DB{p.down, p.kill, p.meta, p.hist, p.up, p.lock} {
		if db != nil {
			_ = db.Close()
		}
	}
}

// upstreamTSO returns TiDB's current TSO: the start ts of a new transaction.
func (p *pools) upstreamTSO(ctx context.Context, timeout time.Duration) (uint64, error) {
	return tso.Current(ctx, p.up, min(timeout, 30*time.Second))
}
