package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"golang.org/x/sync/errgroup"

	"github.com/tidb-parity/parity/internal/ident"
)

// Server is one database server of the benchmark.
type Server struct {
	Name string // fallback, peer, tidb
	DSN  string // go-sql-driver DSN without a database, e.g. root@tcp(127.0.0.1:13306)/
	DB   *sql.DB
	TiDB bool
}

// open connects to the server and detects whether it is TiDB.
func openServer(ctx context.Context, name, dsn string) (*Server, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse dsn of %s: %w", name, err)
	}
	cfg.DBName = ""
	cfg.MultiStatements = false
	cfg.InterpolateParams = true
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", name, err)
	}
	db.SetMaxOpenConns(16)
	db.SetMaxIdleConns(16)
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var version string
	if err := db.QueryRowContext(pctx, "SELECT VERSION()").Scan(&version); err != nil {
		db.Close()
		return nil, fmt.Errorf("connect to %s (%s): %w", name, cfg.Addr, err)
	}
	return &Server{Name: name, DSN: dsn, DB: db, TiDB: strings.Contains(strings.ToLower(version), "tidb")}, nil
}

// Addr returns host:port of the server.
func (s *Server) Addr() string {
	cfg, err := mysql.ParseDSN(s.DSN)
	if err != nil {
		return s.DSN
	}
	return cfg.Addr
}

// User returns the user name of the server's DSN.
func (s *Server) User() string {
	cfg, err := mysql.ParseDSN(s.DSN)
	if err != nil {
		return "root"
	}
	return cfg.User
}

// Table is one copy of the benchmark table on one server.
type Table struct {
	S     *Server
	DB    string // database, e.g. bench_diff
	Name  string // table, e.g. sbtest1
	Data  Dataset
	Batch int // rows per multi-row INSERT; Default: 1000
	Conns int // loading connections; Default: 4
}

func (t *Table) qname() string { return ident.Quote(t.DB) + "." + ident.Quote(t.Name) }

// markerTable records which dataset a table holds, so repeated runs do not reload.
const markerTable = "bench_marker"

const createSbtest = `CREATE TABLE %s (
  id INT NOT NULL,
  k INT NOT NULL DEFAULT '0',
  c CHAR(120) NOT NULL DEFAULT '',
  pad CHAR(60) NOT NULL DEFAULT '',
  PRIMARY KEY (id),
  KEY k_1 (k)
) DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`

// Ensure makes the table hold exactly the dataset: it keeps a table whose marker and
// checksum match, reverts the planned differences of an interrupted run if that suffices,
// and otherwise (re)loads it. It returns whether it loaded.
func (t *Table) Ensure(ctx context.Context, want Expected, plan []Difference) (loaded bool, err error) {
	if err := t.exec(ctx, 30*time.Second, "CREATE DATABASE IF NOT EXISTS "+ident.Quote(t.DB)); err != nil {
		return false, err
	}
	if err := t.exec(ctx, 30*time.Second, fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s.%s (tbl VARCHAR(64) NOT NULL PRIMARY KEY, seed BIGINT UNSIGNED NOT NULL, row_count BIGINT NOT NULL, holes INT NOT NULL, loaded_at DATETIME NOT NULL)",
		ident.Quote(t.DB), ident.Quote(markerTable))); err != nil {
		return false, err
	}
	if t.markerMatches(ctx) {
		got, err := t.Checksum(ctx)
		if err == nil && got == want {
			slog.Info("table reused", "server", t.S.Name, "table", t.DB+"."+t.Name, "rows", got.Count)
			return false, nil
		}
		if err == nil && len(plan) > 0 {
			slog.Info("table differs from the dataset; reverting the planned differences", "server", t.S.Name, "table", t.DB+"."+t.Name)
			if err := t.Revert(ctx, plan); err == nil {
				if got, err := t.Checksum(ctx); err == nil && got == want {
					return false, nil
				}
			}
		}
	}
	start := time.Now()
	if err := t.Load(ctx); err != nil {
		return true, err
	}
	got, err := t.Checksum(ctx)
	if err != nil {
		return true, err
	}
	if got != want {
		return true, fmt.Errorf("%s %s after loading: checksum %+v, want %+v", t.S.Name, t.qname(), got, want)
	}
	if err := t.exec(ctx, 30*time.Second, fmt.Sprintf("REPLACE INTO %s.%s VALUES (?, ?, ?, ?, NOW())", ident.Quote(t.DB), ident.Quote(markerTable)),
		t.Name, t.Data.Seed, t.Data.Rows, t.Data.Holes); err != nil {
		return true, err
	}
	slog.Info("table loaded", "server", t.S.Name, "table", t.DB+"."+t.Name, "rows", got.Count, "seconds", time.Since(start).Seconds())
	return true, nil
}

func (t *Table) markerMatches(ctx context.Context) bool {
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var seed uint64
	var rows int64
	var holes int
	err := t.S.DB.QueryRowContext(qctx, fmt.Sprintf("SELECT seed, row_count, holes FROM %s.%s WHERE tbl = ?", ident.Quote(t.DB), ident.Quote(markerTable)), t.Name).
		Scan(&seed, &rows, &holes)
	return err == nil && seed == t.Data.Seed && rows == t.Data.Rows && holes == t.Data.Holes
}

// Checksum computes count, BIT_XOR and SUM of per-row CRC32 on the server (see verifySQL).
func (t *Table) Checksum(ctx context.Context) (Expected, error) {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	var e Expected
	var xor, sum string
	if err := t.S.DB.QueryRowContext(qctx, verifySQL(t.DB, t.Name)).Scan(&e.Count, &xor, &sum); err != nil {
		return e, fmt.Errorf("checksum %s on %s: %w", t.qname(), t.S.Name, err)
	}
	var err1, err2 error
	e.Xor, err1 = strconv.ParseUint(xor, 10, 64)
	e.Sum, err2 = strconv.ParseUint(sum, 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return e, fmt.Errorf("checksum %s on %s: %w", t.qname(), t.S.Name, err)
	}
	return e, nil
}

// Load drops and recreates the table and fills it with the dataset using multi-row
// INSERTs over several connections, then runs ANALYZE TABLE.
func (t *Table) Load(ctx context.Context) error {
	batch, conns := t.Batch, t.Conns
	if batch <= 0 {
		batch = 1000
	}
	if conns <= 0 {
		conns = 4
	}
	slog.Info("loading table", "server", t.S.Name, "table", t.DB+"."+t.Name, "rows", t.Data.Rows, "connections", conns)
	if err := t.exec(ctx, time.Minute, fmt.Sprintf("DELETE FROM %s.%s WHERE tbl = ?", ident.Quote(t.DB), ident.Quote(markerTable)), t.Name); err != nil {
		return err
	}
	if err := t.exec(ctx, time.Minute, "DROP TABLE IF EXISTS "+t.qname()); err != nil {
		return err
	}
	if err := t.exec(ctx, time.Minute, fmt.Sprintf(createSbtest, t.qname())); err != nil {
		return err
	}
	// Ranges of ids, one INSERT each (a range holds at most batch ids, fewer around holes).
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(conns)
	maxID := t.Data.MaxID()
	for from := int64(1); from <= maxID; from += int64(batch) {
		to := min(from+int64(batch)-1, maxID)
		g.Go(func() error {
			var sb strings.Builder
			sb.Grow(batch * 200)
			sb.WriteString("INSERT INTO ")
			sb.WriteString(t.qname())
			sb.WriteString(" (id,k,c,pad) VALUES ")
			n := 0
			t.Data.ForEachID(from, to, func(id int64) {
				if n > 0 {
					sb.WriteByte(',')
				}
				n++
				writeRowValues(&sb, t.Data.Row(id))
			})
			if n == 0 {
				return nil
			}
			return t.execNoBinlog(gctx, 2*time.Minute, sb.String())
		})
	}
	if err := g.Wait(); err != nil {
		return fmt.Errorf("load %s on %s: %w", t.qname(), t.S.Name, err)
	}
	return t.exec(ctx, 10*time.Minute, "ANALYZE TABLE "+t.qname())
}

// Inject applies the planned differences to this (downstream) copy.
func (t *Table) Inject(ctx context.Context, plan []Difference) error {
	for _, d := range plan {
		var err error
		switch d.Kind {
		case Changed:
			r := t.Data.changedRow(d)
			err = t.execNoBinlog(ctx, 30*time.Second, fmt.Sprintf("UPDATE %s SET k = ?, c = ?, pad = ? WHERE id = ?", t.qname()), r.K, r.C, r.Pad, r.ID)
		case Missing:
			err = t.execNoBinlog(ctx, 30*time.Second, fmt.Sprintf("DELETE FROM %s WHERE id = ?", t.qname()), d.ID)
		case Extra:
			r := t.Data.Row(d.ID)
			err = t.execNoBinlog(ctx, 30*time.Second, fmt.Sprintf("INSERT INTO %s (id,k,c,pad) VALUES (?,?,?,?)", t.qname()), r.ID, r.K, r.C, r.Pad)
		}
		if err != nil {
			return fmt.Errorf("inject %s row id=%d into %s on %s: %w", d.Kind, d.ID, t.qname(), t.S.Name, err)
		}
	}
	return nil
}

// Revert undoes Inject (it is idempotent, so it also repairs a half-injected table).
func (t *Table) Revert(ctx context.Context, plan []Difference) error {
	for _, d := range plan {
		var err error
		switch d.Kind {
		case Changed, Missing:
			r := t.Data.Row(d.ID)
			err = t.execNoBinlog(ctx, 30*time.Second, fmt.Sprintf("REPLACE INTO %s (id,k,c,pad) VALUES (?,?,?,?)", t.qname()), r.ID, r.K, r.C, r.Pad)
		case Extra:
			err = t.execNoBinlog(ctx, 30*time.Second, fmt.Sprintf("DELETE FROM %s WHERE id = ?", t.qname()), d.ID)
		}
		if err != nil {
			return fmt.Errorf("revert %s row id=%d in %s on %s: %w", d.Kind, d.ID, t.qname(), t.S.Name, err)
		}
	}
	return nil
}

func (t *Table) exec(ctx context.Context, timeout time.Duration, query string, args ...any) error {
	qctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := t.S.DB.ExecContext(qctx, query, args...); err != nil {
		return fmt.Errorf("%s: %s: %w", t.S.Name, firstWords(query), err)
	}
	return nil
}

// execNoBinlog runs a write without writing MariaDB's binary log: the benchmark's bulk
// data has no business in a binlog other tests may read.
func (t *Table) execNoBinlog(ctx context.Context, timeout time.Duration, query string, args ...any) error {
	if t.S.TiDB {
		return t.exec(ctx, timeout, query, args...)
	}
	qctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := t.S.DB.Conn(qctx)
	if err != nil {
		return fmt.Errorf("%s: connect: %w", t.S.Name, err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(qctx, "SET SESSION sql_log_bin = 0"); err != nil {
		return fmt.Errorf("%s: set sql_log_bin: %w", t.S.Name, err)
	}
	_, err = conn.ExecContext(qctx, query, args...)
	// Leave the pooled connection as we found it.
	_, _ = conn.ExecContext(context.WithoutCancel(qctx), "SET SESSION sql_log_bin = 1")
	if err != nil {
		return fmt.Errorf("%s: %s: %w", t.S.Name, firstWords(query), err)
	}
	return nil
}

func writeRowValues(sb *strings.Builder, r Row) {
	// Values are digits and '-' only, so literal SQL is safe and keeps the statement small.
	sb.WriteByte('(')
	sb.WriteString(strconv.FormatInt(r.ID, 10))
	sb.WriteByte(',')
	sb.WriteString(strconv.FormatInt(r.K, 10))
	sb.WriteString(",'")
	sb.WriteString(r.C)
	sb.WriteString("','")
	sb.WriteString(r.Pad)
	sb.WriteString("')")
}

func firstWords(q string) string {
	f := strings.Fields(q)
	if len(f) > 3 {
		f = f[:3]
	}
	return strings.Join(f, " ")
}
