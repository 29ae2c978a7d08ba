package checker

// source.go owns the connections to one server: a Source hands them out (a pool opened
// from a DSN, or connections a caller holds at a snapshot), says what it reads at, and
// stops a query that outlives its timeout on the server. It must not know tables, chunks
// or the other side: pairing and timeouts are the pair's (pair.go).

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/tidb-parity/parity/internal/bufconn"
)

// Querier runs a read query. *sql.DB, *sql.Conn and *sql.Tx satisfy it.
type Querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

var (
	_ Querier = (*sql.DB)(nil)
	_ Querier = (*sql.Conn)(nil)
	_ Querier = (*sql.Tx)(nil)
)

// Flavor is the kind of server behind a source.
type Flavor int

const (
	flavorMySQL Flavor = iota
	flavorMariaDB
	FlavorTiDB
)

func (f Flavor) String() string { return [...]string{"mysql", "mariadb", "tidb"}[f] }

func flavorOf(version string) Flavor {
	v := strings.ToLower(version)
	switch {
	case strings.Contains(v, "tidb"):
		return FlavorTiDB
	case strings.Contains(v, "mariadb"):
		return flavorMariaDB
	}
	return flavorMySQL
}

// Source is one side of a diff: a bounded pool of connections that all read the same
// snapshot with session time_zone '+00:00'. Acquire blocks while all are in use, so the
// pool size is the per-side concurrency limit. Every query runs on the returned Querier
// and its rows are closed before release is called.
type Source interface {
	Acquire(ctx context.Context) (q Querier, release func(), err error)
	Flavor() Flavor
	// Describe names the source in logs and errors (never contains a password).
	Describe() string
}

// DSNSource is a Source opened from a DSN. When Snapshot is set (a TiDB TSO or datetime),
// every connection reads at it through tidb_snapshot.
type DSNSource struct {
	db       *sql.DB
	flavor   Flavor
	desc     string
	snapshot string

	// killDB runs KILL CONNECTION for queries whose context ended (killOnDone); ids maps each
	// physical connection (the driver's connection, as sql.Conn.Raw shows it) to its
	// server connection id.
	killDB *sql.DB
	mu     sync.Mutex
	ids    map[any]int64
	kills  sync.WaitGroup
}

var (
	_ Source         = (*DSNSource)(nil)
	_ queryKiller    = (*DSNSource)(nil)
	_ snapshotReader = (*DSNSource)(nil)
)

// OpenDSN opens a source on dsn with at most conns connections. snapshot, when not
// empty, is set as tidb_snapshot on every connection (TiDB only). statementTimeout, when
// positive, bounds every statement on the server as well (see statementLimit).
//
// The snapshot is a connection parameter rather than a session pinned by tso.At: every
// connection of the pool, including one it opens again after a KILL, reads at it for
// the whole run, and none is handed to another reader, so there is no session to reset.
// TiDB's error 8055 on a snapshot is explained by tso.Hint (snapshotHint).
func OpenDSN(ctx context.Context, dsn string, conns int, snapshot string, statementTimeout time.Duration) (*DSNSource, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse dsn: %w", err)
	}
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["time_zone"] = "'+00:00'"
	cfg.Params["charset"] = "utf8mb4"
	cfg.ParseTime = false
	cfg.InterpolateParams = true
	if snapshot != "" {
		cfg.Params["tidb_snapshot"] = "'" + strings.ReplaceAll(snapshot, "'", "") + "'"
	}
	desc := cfg.Addr
	// Parse the amended DSN again: the driver interprets some parameters (charset) only
	// when parsing.
	if cfg, err = mysql.ParseDSN(cfg.FormatDSN()); err != nil {
		return nil, fmt.Errorf("parse dsn: %w", err)
	}
	cfg.DialFunc = dialBuffered
	if conns < 1 {
		conns = 1
	}
	db, err := openPool(cfg, conns)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", desc, err)
	}
	var version string
	if err := db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version); err != nil {
		db.Close()
		return nil, fmt.Errorf("connect to %s: %w", desc, err)
	}
	s := &DSNSource{db: db, flavor: flavorOf(version), desc: desc, snapshot: snapshot, ids: map[any]int64{}}
	if snapshot != "" && s.flavor != FlavorTiDB {
		db.Close()
		return nil, fmt.Errorf("source %s: a snapshot TSO needs TiDB, the server is %s", desc, version)
	}
	vars := map[string]string{}
	if s.flavor == FlavorTiDB {
		if vars, err = tidbChunkVars(ctx, db, cfg.Params); err != nil {
			db.Close()
			return nil, fmt.Errorf("source %s: %w", desc, err)
		}
	}
	if name, value, ok := statementLimit(ctx, db, s.flavor, statementTimeout, cfg.Params); ok {
		vars[name] = value
	}
	if len(vars) > 0 {
		db.Close()
		for k, v := range vars {
			cfg.Params[k] = v
		}
		if s.db, err = openPool(cfg, conns); err != nil {
			return nil, fmt.Errorf("open %s: %w", desc, err)
		}
	}
	// KILL needs no snapshot and no statement limit: a pool of its own, from the DSN as
	// given (two connections, opened only when a query is killed).
	kcfg := cfg.Clone()
	for k := range vars {
		delete(kcfg.Params, k)
	}
	delete(kcfg.Params, "tidb_snapshot")
	if s.killDB, err = openPool(kcfg, 2); err != nil {
		s.db.Close()
		return nil, fmt.Errorf("open %s: %w", desc, err)
	}
	return s, nil
}

// statementLimit returns the session variable that makes the server itself stop a
// statement running longer than timeout, for the DSN's parameters: max_statement_time
// (seconds) on MariaDB, max_execution_time (milliseconds, SELECT statements) on MySQL and
// TiDB. A query abandoned by its client (its context timed out or was cancelled) otherwise
// runs on to its end on the server: the driver only closes the connection, which the
// server notices when it next writes. ok is false when timeout is not positive, the DSN
// sets the variable itself, or the server does not have it.
func statementLimit(ctx context.Context, db *sql.DB, f Flavor, timeout time.Duration, set map[string]string) (name, value string, ok bool) {
	if timeout <= 0 {
		return "", "", false
	}
	// One second over the client's timeout: the client's own error (which names the
	// query) normally comes first.
	timeout += time.Second
	name, value = "max_execution_time", strconv.FormatInt(timeout.Milliseconds(), 10)
	if f == flavorMariaDB {
		name, value = "max_statement_time", strconv.FormatFloat(timeout.Seconds(), 'f', 3, 64)
	}
	if _, user := set[name]; user {
		return "", "", false
	}
	var cur sql.NullString
	if err := db.QueryRowContext(ctx, "SELECT @@SESSION."+name).Scan(&cur); err != nil {
		return "", "", false // MySQL before 5.7.8
	}
	return name, value, true
}

// queryKiller is a Source that can stop a query on the server.
type queryKiller interface {
	// killOnDone kills the statement running on q, a connection the source gave out, if
	// ctx ends before stop is called. The statement runs under qctx: ctx itself when the
	// kill gives the connection up (the driver closes it when ctx ends, and it is
	// discarded when released), or a context that outlives ctx by a bound when the kill
	// keeps the connection (the driver must not close it first). stop waits for a kill
	// under way, so that none reaches the connection's next statement.
	killOnDone(ctx context.Context, q Querier) (qctx context.Context, stop func())
}

// snapshotReader is a Source that may read at a fixed point in time.
type snapshotReader interface {
	// readsAt names the point every connection of the source reads at (a TiDB TSO or
	// datetime, or the label its caller gave), or "" when they read the latest data.
	readsAt() string
}

// connKey returns the physical connection under c.
func connKey(c *sql.Conn) any {
	var key any
	_ = c.Raw(func(dc any) error { key = dc; return nil })
	return key
}

// killOnDone implements queryKiller: the connection is killed (KILL CONNECTION) and
// discarded; the pool opens another, at the same snapshot.
func (s *DSNSource) killOnDone(ctx context.Context, q Querier) (context.Context, func()) {
	c, ok := q.(*sql.Conn)
	if !ok {
		return ctx, func() {}
	}
	key := connKey(c)
	s.mu.Lock()
	id, ok := s.ids[key]
	s.mu.Unlock()
	if !ok {
		return ctx, func() {}
	}
	kill := func() {
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		// KILL CONNECTION, not KILL QUERY: the client has given the connection up, and a
		// KILL QUERY that reaches the server before the statement starts executing is
		// lost. 1094: already gone.
		var me *mysql.MySQLError
		if _, err := s.killDB.ExecContext(kctx, "KILL CONNECTION "+strconv.FormatInt(id, 10)); err != nil && !(errors.As(err, &me) && me.Number == 1094) {
			slog.Warn("cannot kill an abandoned query", "source", s.desc, "connection_id", id, "err", err)
		}
		// The driver has closed the connection, or will: never hand it out again.
		s.mu.Lock()
		delete(s.ids, key)
		s.mu.Unlock()
		_ = c.Raw(func(any) error { return driver.ErrBadConn })
	}
	done := make(chan struct{})
	s.kills.Add(1)
	stop := context.AfterFunc(ctx, func() {
		defer close(done)
		defer s.kills.Done()
		kill()
	})
	return ctx, func() {
		if !stop() {
			<-done // the kill ran, or runs: wait for it
			return
		}
		defer s.kills.Done()
		// ctx may have ended with the query (the driver saw it first) before its
		// cancellation reached the AfterFunc, which stop then prevented: kill here.
		if ctx.Err() != nil {
			kill()
		}
	}
}

func openPool(cfg *mysql.Config, conns int) (*sql.DB, error) {
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	return db, nil
}

// tidbSessionVars are the TiDB session settings of a source's connections, for queries
// over one bounded chunk each, `concurrency` of them at once:
//   - tidb_enable_paging=OFF: paging reads a range in coprocessor requests of 128 rows,
//     then doubling, which only adds round trips for a chunk of a few thousand rows;
//   - tidb_executor_concurrency=1: no intra-query worker pools; parity runs its
//     concurrency in queries, and the production server gets no extra threads.
//
// Per 250 checksum queries of 4,000 sysbench rows, one at a time: 3.33-3.63 s of TiDB CPU
// against 3.48-4.03 s without them (TiDB v8.5, unistore).
var tidbSessionVars = map[string]string{
	"tidb_enable_paging":        "OFF",
	"tidb_executor_concurrency": "1",
}

// tidbChunkVars returns those tidbSessionVars the server has and the DSN does not set.
func tidbChunkVars(ctx context.Context, db *sql.DB, set map[string]string) (map[string]string, error) {
	rows, err := db.QueryContext(ctx, "SELECT LOWER(VARIABLE_NAME) FROM information_schema.SESSION_VARIABLES WHERE LOWER(VARIABLE_NAME) IN ('tidb_enable_paging', 'tidb_executor_concurrency')")
	if err != nil {
		return nil, fmt.Errorf("read session variables: %w", err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, fmt.Errorf("read session variables: %w", err)
		}
		if _, user := set[name]; !user {
			out[name] = tidbSessionVars[name]
		}
	}
	return out, rows.Err()
}

// readBufferSize is the read buffer between a server connection and the driver, which
// reads 4 KiB at a time on its own: drill-down streams rows at tens of MB/s, and a
// syscall per 4 KiB was a fifth of parity's CPU while it did.
const readBufferSize = 64 << 10

// dialBuffered dials like the driver does and puts a read buffer in front of the
// connection.
func dialBuffered(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer // TCP keep-alives are on by default
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return bufconn.New(c, readBufferSize), nil
}

func (s *DSNSource) Acquire(ctx context.Context) (Querier, func(), error) {
	c, err := s.db.Conn(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to %s: %w", s.desc, err)
	}
	// A new physical connection: read its id, for killOnDone.
	key := connKey(c)
	s.mu.Lock()
	_, known := s.ids[key]
	s.mu.Unlock()
	if !known {
		var id int64
		if err := c.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
			_ = c.Close()
			return nil, nil, fmt.Errorf("connect to %s: %w", s.desc, err)
		}
		s.mu.Lock()
		s.ids[key] = id
		s.mu.Unlock()
	}
	return c, func() { _ = c.Close() }, nil
}

func (s *DSNSource) Flavor() Flavor   { return s.flavor }
func (s *DSNSource) Describe() string { return s.desc }

// readsAt implements snapshotReader: the tidb_snapshot the source was opened at.
func (s *DSNSource) readsAt() string { return s.snapshot }

// DB returns the underlying pool (for callers that need to run their own queries).
func (s *DSNSource) DB() *sql.DB { return s.db }

// Close closes the pool, once kills under way have ended.
func (s *DSNSource) Close() error {
	s.kills.Wait()
	return errors.Join(s.db.Close(), s.killDB.Close())
}

// connSource is a Source over connections the caller has already placed inside
// transactions at the same snapshot (START TRANSACTION WITH CONSISTENT SNAPSHOT, opened
// while the applier was paused at a resolved ts). The checker only reads through them and
// never commits, rolls back or closes them. A query that outlives its timeout is stopped
// with KILL QUERY through connSourceConfig.Kill, and its connection stays in its
// transaction for the next query; a connection that is lost all the same (the server
// went away, or the killed query did not end within KillWait) is never handed out again,
// and Acquire fails once none is left.
type connSource struct {
	pool     chan *sql.Conn
	flavor   Flavor
	desc     string
	snapshot string
	kill     *sql.DB
	killWait time.Duration
	ids      map[*sql.Conn]int64 // each connection's server connection id

	mu   sync.Mutex
	live int           // connections not lost
	lost chan struct{} // closed when live reaches 0
}

var (
	_ Source         = (*connSource)(nil)
	_ queryKiller    = (*connSource)(nil)
	_ snapshotReader = (*connSource)(nil)
)

// connSourceConfig says what newConnSource wraps.
type connSourceConfig struct {
	// Desc names the source in logs and errors (never a password). Default: "snapshot".
	Desc string
	// Snapshot names the point the transactions read at: for connections opened inside
	// the applier's barrier, the barrier's resolved ts. When both sides of a run read at
	// a snapshot, the run does not re-check its differences (reading again would read the
	// same data) and the report names both points. Default: "" (the connections may see
	// later writes: the side reads live data).
	Snapshot string
	// Kill is a pool on the same server, outside those transactions, on which a query
	// that outlives its timeout is stopped (KILL QUERY <connection id>). A pool of its
	// own: a kill must not wait for the connections it is meant to free. Default: none
	// (required).
	Kill *sql.DB
	// KillWait bounds how long a killed query may take to end; past it the connection is
	// given up (the driver closes it) and dropped from the source. Default: 5s.
	KillWait time.Duration
}

// defaultConnSourceConfig returns a connSourceConfig with every default filled in.
func defaultConnSourceConfig() connSourceConfig {
	return connSourceConfig{Desc: "snapshot", KillWait: 5 * time.Second}
}

// Validate reports every problem with its key path.
func (c connSourceConfig) Validate() error {
	var errs []error
	if c.Kill == nil {
		errs = append(errs, errors.New("kill: a pool to stop timed-out queries is required"))
	}
	if c.KillWait < 0 {
		errs = append(errs, fmt.Errorf("kill_wait: must not be negative, got %s", c.KillWait))
	}
	return errors.Join(errs...)
}

// newConnSource wraps conns. It sets time_zone '+00:00' and the utf8mb4 connection
// character set on each (session settings do not end the transaction) and reads their
// connection ids. Zero fields of cfg take their defaults.
func newConnSource(ctx context.Context, conns []*sql.Conn, cfg connSourceConfig) (*connSource, error) {
	def := defaultConnSourceConfig()
	if cfg.Desc == "" {
		cfg.Desc = def.Desc
	}
	if cfg.KillWait == 0 {
		cfg.KillWait = def.KillWait
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("snapshot source %s: %w", cfg.Desc, err)
	}
	desc := cfg.Desc
	if len(conns) == 0 {
		return nil, errors.New("snapshot source " + desc + ": no connections")
	}
	s := &connSource{pool: make(chan *sql.Conn, len(conns)), desc: desc, snapshot: cfg.Snapshot, kill: cfg.Kill,
		killWait: cfg.KillWait, ids: make(map[*sql.Conn]int64, len(conns)), live: len(conns), lost: make(chan struct{})}
	for i, c := range conns {
		if _, err := c.ExecContext(ctx, "SET SESSION time_zone = '+00:00', NAMES utf8mb4"); err != nil {
			return nil, fmt.Errorf("snapshot source %s: connection %d: %w", desc, i, err)
		}
		var id int64
		if err := c.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
			return nil, fmt.Errorf("snapshot source %s: connection %d: %w", desc, i, err)
		}
		s.ids[c] = id
		if i == 0 {
			var version string
			if err := c.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version); err != nil {
				return nil, fmt.Errorf("snapshot source %s: %w", desc, err)
			}
			s.flavor = flavorOf(version)
		}
		s.pool <- c
	}
	return s, nil
}

func (s *connSource) Acquire(ctx context.Context) (Querier, func(), error) {
	select {
	case c := <-s.pool:
		return c, func() { s.release(c) }, nil
	case <-s.lost:
		return nil, nil, fmt.Errorf("snapshot source %s: every connection was lost", s.desc)
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
}

// release hands c out again, unless the driver has given it up.
func (s *connSource) release(c *sql.Conn) {
	if connValid(c) {
		s.pool <- c
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.live--
	slog.Warn("snapshot source lost a connection", "source", s.desc, "connection_id", s.ids[c], "left", s.live)
	if s.live == 0 {
		close(s.lost)
	}
}

// connValid reports whether the driver still holds c's connection open.
func connValid(c *sql.Conn) bool {
	valid := true
	err := c.Raw(func(dc any) error {
		if v, ok := dc.(driver.Validator); ok {
			valid = v.IsValid()
		}
		return nil
	})
	return err == nil && valid
}

func (s *connSource) Flavor() Flavor   { return s.flavor }
func (s *connSource) Describe() string { return s.desc }

// readsAt implements snapshotReader: connSourceConfig.Snapshot.
func (s *connSource) readsAt() string { return s.snapshot }

// killOnDone implements queryKiller: KILL QUERY, and the connection stays in its
// transaction (see killQueryOnDone).
func (s *connSource) killOnDone(ctx context.Context, q Querier) (context.Context, func()) {
	c, ok := q.(*sql.Conn)
	if !ok {
		return ctx, func() {}
	}
	id, ok := s.ids[c]
	if !ok {
		return ctx, func() {}
	}
	return killQueryOnDone(ctx, s.kill, id, s.killWait, s.desc)
}

// killRetry is how often a KILL QUERY is sent again while the killed query has not
// returned; killTimeout bounds one KILL statement.
const (
	killRetry   = 100 * time.Millisecond
	killTimeout = 5 * time.Second
)

// killQueryOnDone runs a query under a context that outlives ctx by wait and, once ctx
// ends, stops the statement on server connection id with KILL QUERY through kill: the
// statement ends with an error (1317) or, for SLEEP, early, and the connection stays open
// and in its transaction. The KILL is sent again every killRetry until the query returns:
// one that reaches the server before the statement starts is lost (on an idle connection
// KILL QUERY does nothing, on MariaDB and TiDB alike). When the query has not returned
// wait after ctx ended, its context ends too and the driver gives the connection up. stop
// waits for a KILL under way, so none reaches the connection's next statement.
func killQueryOnDone(ctx context.Context, kill *sql.DB, id int64, wait time.Duration, desc string) (context.Context, func()) {
	qctx, giveUp := context.WithCancel(context.WithoutCancel(ctx))
	returned := make(chan struct{}) // closed by stop
	killed := make(chan struct{})   // closed when the killer has ended
	stopKiller := context.AfterFunc(ctx, func() {
		defer close(killed)
		deadline := time.NewTimer(wait)
		defer deadline.Stop()
		retry := time.NewTicker(killRetry)
		defer retry.Stop()
		for {
			kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), killTimeout)
			_, err := kill.ExecContext(kctx, "KILL QUERY "+strconv.FormatInt(id, 10))
			cancel()
			var me *mysql.MySQLError
			if err != nil && !(errors.As(err, &me) && me.Number == 1094) { // 1094: no such thread
				slog.Warn("cannot kill a timed-out query", "source", desc, "connection_id", id, "err", err)
			}
			select {
			case <-returned:
				return
			case <-deadline.C:
				giveUp()
				return
			case <-retry.C:
			}
		}
	})
	return qctx, func() {
		close(returned)
		if !stopKiller() {
			<-killed
		}
		giveUp()
	}
}
