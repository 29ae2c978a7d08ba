package loadgen

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"golang.org/x/sync/errgroup"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/cdc/upstream"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/retry"
	"github.com/tidb-parity/parity/internal/tlsauth"
	"github.com/tidb-parity/parity/internal/tso"
)

// TiDB DDL action types carried in DDL events ("t").
const (
	ddlCreateSchema = 1
	ddlCreateTable  = 3
)

// Generator runs one load: set-up, optional import, workload, publishing.
type Generator struct {
	cfg    Config
	log    *slog.Logger
	up     *sql.DB // TiDB, database selected
	tables []*genTable
	seq    *sequencer
	prod   *producer
	limit  *limiter

	reserved, committed, rows, records, aborted atomic.Int64
	resolved                                    atomic.Uint64
}

// Run sets up the tables, imports if configured, runs the workload until its limit or
// until ctx ends, publishes a final resolved ts covering every committed transaction and
// returns what it did. Cancelling ctx stops the workload; the final publish still runs
// (bounded), so the changefeed ends complete. With Heartbeat, a workload that reached its
// limit is followed by a resolved ts every ResolvedInterval until ctx ends.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, fmt.Errorf("loadgen config: %w", err)
	}
	g := &Generator{cfg: cfg, log: cfg.Logger}
	if g.log == nil {
		g.log = slog.New(slog.DiscardHandler)
	}
	if cfg.Rate > 0 {
		g.limit = &limiter{interval: time.Duration(float64(time.Second) / cfg.Rate)}
	}
	return g.run(ctx)
}

// sessionDSN returns dsn with the database, the session settings the generator relies
// on and client-side parameter interpolation.
func sessionDSN(dsn, database, tz string, tidb bool) (string, error) {
	c, err := mysql.ParseDSN(dsn)
	if err != nil {
		return "", err
	}
	c.DBName = database
	c.InterpolateParams = true
	c.ParseTime = false
	c.MultiStatements = false
	if c.Params == nil {
		c.Params = map[string]string{}
	}
	c.Params["time_zone"] = "'" + tz + "'"
	if tidb {
		// Async commit and 1PC compute commit ts without asking the TSO: the resolved-ts
		// bound in sequencer needs every commit ts allocated after COMMIT is sent.
		c.Params["tidb_enable_async_commit"] = "0"
		c.Params["tidb_enable_1pc"] = "0"
		c.Params["tidb_txn_mode"] = "'pessimistic'"
	}
	return c.FormatDSN(), nil
}

func openDB(dsn string, conns int) (*sql.DB, error) {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	db.SetConnMaxLifetime(time.Hour)
	return db, nil
}

// currentTSO returns a fresh TSO from TiDB: the start ts of a new transaction.
func currentTSO(ctx context.Context, conn *sql.Conn) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := conn.ExecContext(ctx, "BEGIN"); err != nil {
		return 0, fmt.Errorf("fetch tso: %w", err)
	}
	var ts uint64
	err := conn.QueryRowContext(ctx, "SELECT @@tidb_current_ts").Scan(&ts)
	if _, rerr := conn.ExecContext(ctx, "ROLLBACK"); err == nil {
		err = rerr
	}
	if err != nil {
		return 0, fmt.Errorf("fetch tso: %w", err)
	}
	if ts == 0 {
		return 0, errors.New("fetch tso: TiDB returned 0")
	}
	return ts, nil
}

func (g *Generator) tso(ctx context.Context) (uint64, error) {
	conn, err := g.up.Conn(ctx)
	if err != nil {
		return 0, fmt.Errorf("fetch tso: %w", err)
	}
	defer conn.Close()
	return currentTSO(ctx, conn)
}

func (g *Generator) run(ctx context.Context) (res Result, err error) {
	res, err = g.setUp(ctx)
	defer g.closeSetUp()
	if err != nil {
		return res, err
	}
	for _, t := range g.tables {
		if t.idCol < 0 {
			continue
		}
		var max int64
		q := "SELECT IFNULL(MAX(" + ident.Quote(t.meta.Columns[t.idCol].Name) + "), 0) FROM " + t.meta.QualifiedName()
		if err := g.up.QueryRowContext(ctx, q).Scan(&max); err != nil {
			return res, fmt.Errorf("read max id of %s: %w", t.meta.QualifiedName(), err)
		}
		t.nextID.Store(max + 1)
	}

	g.seq = newSequencer(res.StartTs)
	err = g.workload(ctx)
	g.result(&res)
	if err != nil || !g.cfg.Heartbeat || ctx.Err() != nil {
		return res, err
	}
	if g.cfg.WorkloadEnded != nil {
		g.cfg.WorkloadEnded(res)
	}
	err = g.heartbeat(ctx)
	g.result(&res)
	return res, err
}

// result fills res's counts and resolved ts from the generator's.
func (g *Generator) result(res *Result) {
	res.ResolvedTs = g.resolved.Load()
	res.Transactions = g.committed.Load()
	res.Rows = g.rows.Load()
	res.Records = g.records.Load()
	res.Aborted = g.aborted.Load()
}

// heartbeat publishes TiDB's current TSO as the resolved ts every ResolvedInterval until
// ctx ends (then it returns nil). The workload has ended and every transaction it
// committed is published, so a TSO fetched now is above all their commit ts.
func (g *Generator) heartbeat(ctx context.Context) error {
	g.log.Info("workload ended; publishing a resolved ts until stopped", "resolved_ts", g.resolved.Load(),
		"interval", g.cfg.ResolvedInterval)
	conn, err := g.up.Conn(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("heartbeat: upstream connection: %w", err)
	}
	defer conn.Close()
	t := time.NewTicker(g.cfg.ResolvedInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			g.log.Info("heartbeat stopped", "resolved_ts", g.resolved.Load())
			return nil
		case <-t.C:
		}
		ts, err := currentTSO(ctx, conn)
		if err == nil && ts > g.resolved.Load() {
			var n int
			if n, err = g.prod.resolved(ctx, ts); err == nil {
				g.records.Add(int64(n))
				g.resolved.Store(ts)
			}
		}
		if err != nil && ctx.Err() == nil {
			return fmt.Errorf("heartbeat: %w", err)
		}
	}
}

// workload runs the workers and the publisher; it returns after the final resolved ts
// is published (or publishing failed).
func (g *Generator) workload(ctx context.Context) error {
	cfg := &g.cfg
	wctx, cancelWorkers := context.WithCancel(ctx)
	defer cancelWorkers()
	if cfg.Duration > 0 {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(wctx, cfg.Duration)
		defer cancel()
	}
	// The publisher outlives a cancelled ctx long enough to publish what was committed.
	pctx, cancelPublisher := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelPublisher()
	stopAfter := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(30*time.Second, cancelPublisher)
		context.AfterFunc(pctx, func() { t.Stop() })
	})
	defer stopAfter()

	workersDone := make(chan struct{})
	var outer errgroup.Group
	outer.Go(func() error {
		err := g.publishLoop(pctx, workersDone)
		if err != nil {
			cancelWorkers()
		}
		return err
	})
	workers, gctx := errgroup.WithContext(wctx)
	seed := cfg.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	for i := 0; i < cfg.Workers; i++ {
		r := rand.New(rand.NewPCG(seed, uint64(i)))
		workers.Go(func() error { return g.worker(gctx, r) })
	}
	outer.Go(func() error { return g.progress(pctx, workersDone) })
	werr := workers.Wait()
	close(workersDone)
	perr := outer.Wait()
	return errors.Join(werr, perr)
}

func (g *Generator) reserve() bool {
	if g.cfg.Transactions == 0 {
		return true
	}
	if g.reserved.Add(1) > int64(g.cfg.Transactions) {
		g.reserved.Add(-1)
		return false
	}
	return true
}

func (g *Generator) unreserve() {
	if g.cfg.Transactions > 0 {
		g.reserved.Add(-1)
	}
}

func (g *Generator) worker(ctx context.Context, r *rand.Rand) error {
	var conn *sql.Conn
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	for ctx.Err() == nil {
		if conn == nil {
			var err error
			if conn, err = g.up.Conn(ctx); err != nil {
				conn = nil
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("upstream connection: %w", err)
			}
		}
		if !g.reserve() {
			return nil
		}
		if err := g.limit.wait(ctx); err != nil {
			g.unreserve()
			return nil
		}
		ok, err := g.runTxn(ctx, conn, r)
		if err != nil && conn.PingContext(ctx) != nil {
			conn.Close() // dropped (a failed ROLLBACK marks it bad): start a new session
			conn = nil
		}
		switch {
		case err == nil && ok:
			g.committed.Add(1)
		case err == nil:
			g.unreserve()
		case errors.Is(err, errUnknownCommit):
			return err
		case ctx.Err() != nil:
			g.unreserve()
			return nil
		case retry.Classify(err) == retry.Conflict:
			g.unreserve()
			g.aborted.Add(1)
		default:
			return err
		}
	}
	return nil
}

// publishLoop publishes committed transactions every FlushInterval and a resolved ts
// every ResolvedInterval; after workersDone it publishes everything left and a final
// resolved ts, then returns.
func (g *Generator) publishLoop(ctx context.Context, workersDone <-chan struct{}) error {
	conn, err := g.up.Conn(ctx)
	if err != nil {
		return fmt.Errorf("upstream connection: %w", err)
	}
	defer conn.Close()
	tick := time.NewTicker(g.cfg.FlushInterval)
	defer tick.Stop()
	announced := g.resolved.Load()
	published := announced
	lastAnnounce := time.Now()
	for {
		final := false
		select {
		case <-ctx.Done():
			return fmt.Errorf("publish: %w", ctx.Err())
		case <-tick.C:
		case <-workersDone:
			final = true
		}
		n, err := currentTSO(ctx, conn)
		if err != nil {
			return err
		}
		txns, bound := g.seq.take(n)
		recs, rows, err := g.prod.publishTxns(ctx, txns)
		if err != nil {
			return err
		}
		g.records.Add(int64(recs))
		g.rows.Add(int64(rows))
		published = max(published, bound)
		if final && g.seq.inflight() > 0 {
			// A worker stopped with an unknown commit outcome; never claim it.
			return errors.New("publish: transactions with unknown commit outcome remain; no final resolved ts")
		}
		if (final || time.Since(lastAnnounce) >= g.cfg.ResolvedInterval) && published > announced {
			n, err := g.prod.resolved(ctx, published)
			if err != nil {
				return err
			}
			g.records.Add(int64(n))
			announced = published
			g.resolved.Store(announced)
			lastAnnounce = time.Now()
		}
		if final {
			return nil
		}
	}
}

func (g *Generator) progress(ctx context.Context, done <-chan struct{}) error {
	t := time.NewTicker(g.cfg.ProgressInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-done:
			return nil
		case <-t.C:
			r := g.resolved.Load()
			g.log.Info("loadgen progress", "transactions", g.committed.Load(), "rows", g.rows.Load(),
				"aborted", g.aborted.Load(), "resolved_ts", r, "resolved_lag", time.Since(tso.Time(r)).Round(time.Millisecond))
		}
	}
}

// reset drops the schemas on both sides.
func (g *Generator) reset(ctx context.Context, up *sql.DB) error {
	for _, schema := range g.cfg.Schemas() {
		if err := execTimeout(ctx, up, "DROP DATABASE IF EXISTS "+ident.Quote(schema)); err != nil {
			return fmt.Errorf("upstream: drop database %s: %w", schema, err)
		}
	}
	if g.cfg.Downstream == "" {
		return nil
	}
	dsn, err := sessionDSN(g.cfg.Downstream, "", g.cfg.TimeZone, false)
	if err != nil {
		return fmt.Errorf("downstream dsn: %w", err)
	}
	down, err := openDB(dsn, 1)
	if err != nil {
		return fmt.Errorf("open downstream: %w", err)
	}
	defer down.Close()
	for _, schema := range g.cfg.Schemas() {
		if err := execTimeout(ctx, down, "DROP DATABASE IF EXISTS "+ident.Quote(schema)); err != nil {
			return fmt.Errorf("downstream: drop database %s: %w", schema, err)
		}
	}
	return nil
}

func createDatabase(ctx context.Context, db *sql.DB, name string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var n int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?", name).Scan(&n); err != nil {
		return false, fmt.Errorf("look up database %s: %w", name, err)
	}
	if n > 0 {
		return false, nil
	}
	if _, err := db.ExecContext(ctx, "CREATE DATABASE "+ident.Quote(name)); err != nil {
		return false, fmt.Errorf("create database %s: %w", name, err)
	}
	return true, nil
}

func tableExists(ctx context.Context, db *sql.DB, schema, table string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var n int
	err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
		schema, table).Scan(&n)
	if err != nil {
		return false, fmt.Errorf("look up table %s.%s: %w", schema, table, err)
	}
	return n > 0, nil
}

func execTimeout(ctx context.Context, db *sql.DB, q string, args ...any) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	_, err := db.ExecContext(ctx, q, args...)
	return err
}

func writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// setUp is the part of run before the workload: reset, database and tables (with their
// DDL events when the changefeed carries them), the producer, the optional import, and
// the first resolved ts at the changefeed's start. closeSetUp releases what it opened.
func (g *Generator) setUp(ctx context.Context) (res Result, err error) {
	cfg := &g.cfg
	if cfg.Upstream, err = tlsauth.DSN(cfg.Upstream, cfg.UpstreamTLS, "upstream-tls"); err != nil {
		return res, err
	}
	if cfg.Downstream != "" {
		if cfg.Downstream, err = tlsauth.DSN(cfg.Downstream, cfg.DownstreamTLS, "downstream-tls"); err != nil {
			return res, err
		}
	}
	cfg.UpstreamTLS, cfg.DownstreamTLS = tlsauth.TLS{}, tlsauth.TLS{}
	rootDSN, err := sessionDSN(cfg.Upstream, "", cfg.TimeZone, true)
	if err != nil {
		return res, fmt.Errorf("upstream dsn: %w", err)
	}
	root, err := openDB(rootDSN, 2)
	if err != nil {
		return res, fmt.Errorf("open upstream: %w", err)
	}
	defer root.Close()
	if cfg.Reset {
		if err := g.reset(ctx, root); err != nil {
			return res, err
		}
	}
	schemas := cfg.Schemas()
	// The session's default schema is the first; every statement names its schema.
	dsn, _ := sessionDSN(cfg.Upstream, schemas[0], cfg.TimeZone, true)
	var ddls []*open.Event
	var wireTables map[string]*wireTable
	if cfg.Protocol == ProtocolCanal || cfg.Protocol == ProtocolSimple {
		wireTables = map[string]*wireTable{}
	}
	for _, schema := range schemas {
		createdDB, err := createDatabase(ctx, root, schema)
		if err != nil {
			return res, fmt.Errorf("upstream: %w", err)
		}
		if g.up == nil {
			if g.up, err = openDB(dsn, cfg.Workers+4); err != nil {
				return res, fmt.Errorf("open upstream: %w", err)
			}
		}
		if createdDB {
			ts, err := g.tso(ctx)
			if err != nil {
				return res, err
			}
			ddls = append(ddls, &open.Event{Kind: open.KindDDL, CommitTs: ts, Schema: schema,
				Query: "CREATE DATABASE " + ident.Quote(schema), DDLType: ddlCreateSchema})
		}
		for _, s := range specs(cfg) {
			exists, err := tableExists(ctx, g.up, schema, s.name)
			if err != nil {
				return res, fmt.Errorf("upstream: %w", err)
			}
			if !exists {
				if err := execTimeout(ctx, g.up, s.ddlIn(schema)); err != nil {
					return res, fmt.Errorf("upstream: create table %s.%s: %w", schema, s.name, err)
				}
				ts, err := g.tso(ctx)
				if err != nil {
					return res, err
				}
				ddls = append(ddls, &open.Event{Kind: open.KindDDL, CommitTs: ts, Schema: schema, Table: s.name,
					Query: s.ddl, DDLType: ddlCreateTable})
			}
			meta, err := upstream.LoadTable(ctx, g.up, schema, s.name)
			if err != nil {
				return res, fmt.Errorf("upstream: %w", err)
			}
			if wireTables != nil {
				wt, err := g.loadWireTable(ctx, meta)
				if err != nil {
					return res, err
				}
				wireTables[schema+"."+s.name] = wt
			}
			gt := &genTable{spec: s, meta: meta, idCol: meta.Col("id")}
			if s.kind == kindKeyless {
				gt.idCol = -1
			}
			g.tables = append(g.tables, gt)
		}
	}
	if g.prod, err = newProducer(ctx, cfg, wireTables); err != nil {
		return res, err
	}
	if cfg.ImportRows > 0 {
		if res.ImportTs, err = g.importData(ctx); err != nil {
			return res, err
		}
		res.StartTs = res.ImportTs
		g.log.Info("import finished", "import_ts", res.ImportTs, "rows_per_table", cfg.ImportRows)
	} else {
		for _, ev := range ddls {
			n, err := g.prod.ddl(ctx, ev)
			if err != nil {
				return res, err
			}
			g.records.Add(int64(n))
		}
		if res.StartTs, err = g.tso(ctx); err != nil {
			return res, err
		}
	}
	n, err := g.prod.resolved(ctx, res.StartTs)
	if err != nil {
		return res, err
	}
	g.records.Add(int64(n))
	g.resolved.Store(res.StartTs)
	g.log.Info("changefeed started", "start_ts", res.StartTs, "topic", g.prod.topicNames(), "partitions", g.prod.allPartitions(),
		"schemas", len(schemas), "dispatcher", cfg.Dispatcher)
	return res, nil
}

// loadWireTable reads what canal-json and simple say of a table (wiretable.go); a table
// whose version the DDL history does not give gets a TSO taken now.
func (g *Generator) loadWireTable(ctx context.Context, meta *upstream.Table) (*wireTable, error) {
	wt, err := loadWireTable(ctx, g.up, meta.Schema, meta.Name)
	if err != nil {
		return nil, fmt.Errorf("upstream: %w", err)
	}
	if err := wt.check(meta); err != nil {
		return nil, fmt.Errorf("upstream: %w", err)
	}
	if wt.version == 0 {
		if wt.version, err = g.tso(ctx); err != nil {
			return nil, err
		}
	}
	return wt, nil
}

func (g *Generator) closeSetUp() {
	if g.prod != nil {
		_ = g.prod.Close()
	}
	if g.up != nil {
		_ = g.up.Close()
	}
}
