package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidb-parity/parity/cdc/loadgen"
	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/checker/verify"
	"github.com/tidb-parity/parity/daemon"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/ledger"
	"github.com/tidb-parity/parity/internal/testenv"
	"github.com/tidb-parity/parity/internal/tso"
)

// testLoad is loadgen running on the real TiDB for a test: its tables imported into the
// fallback, then transactions published through Kafka until Stop.
type testLoad struct {
	ImportTs uint64
	cancel   context.CancelFunc
	done     chan struct{}
	res      loadgen.Result
	err      error
}

// startLoad runs loadgen into db through topic (database dropped on both sides when the
// test ends), with the tests' common settings edited by edit, and waits for its import
// (none without ImportRows: then it returns at once, ImportTs 0, and the changefeed
// carries the CREATE DATABASE and CREATE TABLE). The load is stopped when the test
// ends, if it was not before.
func startLoad(tb testing.TB, ctx context.Context, upDSN, downDSN, broker, topic, db string, edit func(*loadgen.Config)) *testLoad {
	tb.Helper()
	lg := loadgen.DefaultConfig()
	lg.Upstream, lg.Downstream = upDSN, downDSN
	lg.Brokers, lg.Topic, lg.Database = []string{broker}, topic, db
	lg.ImportTSFile = filepath.Join(tb.TempDir(), "import_ts")
	lg.FlushInterval, lg.ResolvedInterval = 5*time.Millisecond, 100*time.Millisecond
	lg.Logger = slog.New(slog.DiscardHandler)
	edit(&lg)
	tb.Cleanup(func() {
		for _, dsn := range []string{upDSN, downDSN} {
			if d, err := sql.Open("mysql", dsn); err == nil {
				_, _ = d.Exec("DROP DATABASE IF EXISTS " + ident.Quote(db))
				d.Close()
			}
		}
	})
	lctx, cancel := context.WithCancel(ctx)
	l := &testLoad{cancel: cancel, done: make(chan struct{})}
	ended := make(chan error, 1)
	go func() {
		l.res, l.err = loadgen.Run(lctx, lg)
		ended <- l.err
		close(l.done)
	}()
	tb.Cleanup(func() { l.Stop() })
	if lg.ImportRows > 0 {
		l.ImportTs = waitFile(tb, lg.ImportTSFile, ended)
	}
	return l
}

// Ended reports, without waiting, whether the load has ended, and its error.
func (l *testLoad) Ended() (bool, error) {
	select {
	case <-l.done:
		return true, l.err
	default:
		return false, nil
	}
}

// Stop ends the load and waits for it: its result (the final resolved ts) and error.
func (l *testLoad) Stop() (loadgen.Result, error) {
	l.cancel()
	<-l.done
	return l.res, l.err
}

// verifyServeConfig is `parity serve`'s configuration for a test: changefeed id applying
// topic from importTs into the fallback, a meta schema of its own (dropped when the test
// ends), the status server on a free loopback port, the gRPC API off, warnings only in
// the log, verification of db's tables and bypass detection of db on.
func verifyServeConfig(tb testing.TB, id, upDSN string, down *testenv.DB, broker, topic, db string, importTs uint64) daemon.Config {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cfg := daemon.DefaultConfig()
	cfg.Changefeed.ID = id
	cfg.Changefeed.Brokers, cfg.Changefeed.Topics = []string{broker}, []string{topic}
	cfg.Changefeed.StartTs = importTs
	cfg.Upstream.DSN, cfg.Downstream.DSN = upDSN, down.Root
	cfg.Applier.MetaSchema = testenv.UniqueName("pm")
	cfg.Applier.SpillDir = tb.TempDir()
	cfg.Status.Addr = addr
	cfg.API.Addr = "" // tests that call the API set a free port: the default is shared
	cfg.Log.Level = "warn"
	cfg.Verify.Enabled = true
	cfg.Verify.Tables = []string{db + ".*"}
	// Bypass detection of db, as a cutover needs it (a check without it cannot pass by
	// keys): with a server id of its own, tests sharing the fallback must not share one.
	var sid [4]byte
	_, _ = rand.Read(sid[:])
	cfg.Bypass.Enabled, cfg.Bypass.ServerID = true, 100000+binary.LittleEndian.Uint32(sid[:])%1000000000
	cfg.Bypass.Schemas = []string{db}
	tb.Cleanup(func() { _, _ = down.Exec("DROP DATABASE IF EXISTS " + ident.Quote(cfg.Applier.MetaSchema)) })
	return cfg
}

// testServe is `parity serve` running in the test's process (runServeInTest).
type testServe struct {
	tb       testing.TB
	ctx      context.Context // the test's: status requests use it
	addr     string          // status.addr
	cancel   context.CancelFunc
	done     chan error
	once     sync.Once
	err      error
	reported bool
}

// serveStopBound bounds how long Stop waits for serve to end once cancelled.
const serveStopBound = 2 * time.Minute

// runServeInTest starts runServe(cfg) under a context derived from ctx. It is stopped
// (its error reported with t.Errorf) when the test ends, if it was not before; a test
// that must stop it before its other deferred calls defers Close itself.
func runServeInTest(tb testing.TB, ctx context.Context, cfg daemon.Config) *testServe {
	tb.Helper()
	sctx, cancel := context.WithCancel(ctx)
	s := &testServe{tb: tb, ctx: ctx, addr: cfg.Status.Addr, cancel: cancel, done: make(chan error, 1)}
	go func() { s.done <- runServe(sctx, cfg) }()
	tb.Cleanup(s.Close)
	return s
}

// Ended reports, without waiting, whether serve has ended, and its error.
func (s *testServe) Ended() (bool, error) {
	select {
	case err := <-s.done:
		s.once.Do(func() { s.err = err })
		return true, s.err
	default:
		return false, nil
	}
}

// Stop cancels serve and waits for it (at most serveStopBound): its error.
func (s *testServe) Stop() error {
	s.cancel()
	s.once.Do(func() {
		select {
		case s.err = <-s.done:
		case <-time.After(serveStopBound):
			s.err = fmt.Errorf("did not stop within %v of its cancellation", serveStopBound)
		}
	})
	return s.err
}

// Close stops serve and reports its error with t.Errorf ("serve: …"), once.
func (s *testServe) Close() {
	s.tb.Helper()
	if err := s.Stop(); err != nil && !s.reported {
		s.reported = true
		s.tb.Errorf("serve: %v", err)
	}
}

// Status is serve's /status (each request bounded by 5 s); an error fails the test.
func (s *testServe) Status() daemon.Status {
	s.tb.Helper()
	c, cancel := context.WithTimeout(s.ctx, 5*time.Second)
	defer cancel()
	st, _, err := fetchStatus(c, s.addr)
	if err != nil {
		s.tb.Fatal(err)
	}
	return st
}

// WaitApplied waits (90 s at most) until serve's applied checkpoint reaches ts; serve
// ending first fails the test.
func (s *testServe) WaitApplied(ts uint64) {
	s.tb.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		c, cancel := context.WithTimeout(s.ctx, 2*time.Second)
		st, _, err := fetchStatus(c, s.addr)
		cancel()
		if err == nil && st.AppliedTs >= ts {
			return
		}
		if ended, err := s.Ended(); ended {
			s.tb.Fatalf("serve ended: %v", err)
		}
		if time.Now().After(deadline) {
			s.tb.Fatalf("serve did not apply up to %d within 90s: %+v %v", ts, st, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// verifiedTables returns each table's last clean verification TSO for cfg's changefeed,
// by "schema.table".
func verifiedTables(t testing.TB, ctx context.Context, meta *sql.DB, cfg daemon.Config) map[string]uint64 {
	t.Helper()
	vs, err := checker.Verifications(ctx, meta, cfg.Applier.MetaSchema, cfg.Changefeed.ID)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, v := range vs {
		out[v.Schema+"."+v.Table] = v.Ts
	}
	return out
}

// explainRun logs, for a run that reported differences where the sides hold the same
// data (a false mismatch), what tells its causes apart: for every reported key, every
// change the ledger holds relative to the run's last pair (ms), the table's last clean
// verification before the run (froms, from verifiedTables), the row upstream at the pair
// and now, and downstream now. A change after the pair on every key points at sides read
// at different points, none at changes the fallback lost; the upstream row at the pair
// equal to the downstream's now (no change since) points at the run's reads.
func explainRun(t testing.TB, ctx context.Context, up, down *sql.DB, cfg daemon.Config, srv *testServe, r verify.RunRecord, froms map[string]uint64) {
	t.Helper()
	if len(r.Pairs) == 0 {
		return
	}
	pt := r.Pairs[len(r.Pairs)-1].TS
	ms := func(ts uint64) string { return strconv.FormatInt(int64(ts>>18)-int64(pt>>18), 10) + "ms" }
	rd := ledger.Reader{Q: down, MetaSchema: cfg.Applier.MetaSchema, Changefeed: cfg.Changefeed.ID, Timeout: time.Minute}
	t.Logf("diagnosis: run %s scope %s pairs %+v", r.RunID, r.Scope, r.Pairs)
	for _, tr := range r.Tables {
		if tr.DiffRunID == "" || tr.Differences == 0 {
			continue
		}
		name := tr.Schema + "." + tr.Table
		t.Logf("diagnosis: %s last verified before the run at %s from the pair", name, ms(froms[name]))
		diffs, err := checker.RunDifferences(ctx, down, cfg.Applier.MetaSchema, tr.DiffRunID, nil)
		if err != nil {
			t.Logf("diagnosis: %s differences: %v", name, err)
			continue
		}
		changes := map[string][]string{}
		if b, err := rd.Bounds(ctx); err != nil {
			t.Logf("diagnosis: ledger bounds: %v", err)
		} else if err := rd.Scan(ctx, tr.Schema, tr.Table, b.Since, srv.Status().AppliedTs, func(e ledger.Entry) error {
			if vals, err := e.Key.Values(); err == nil {
				k := fmt.Sprint(vals...)
				changes[k] = append(changes[k], ms(e.CommitTs))
			}
			return nil
		}); err != nil {
			t.Logf("diagnosis: ledger scan: %v", err)
		}
		for _, d := range diffs {
			t.Logf("diagnosis: %s %s %s %v class %s: changes %v; upstream at the pair %s, now %s; downstream now %s",
				name, d.Key, d.Kind, d.Columns, d.Class, changes[fmt.Sprint(d.KeyValues...)],
				rowAt(ctx, up, tr.Schema, tr.Table, d, pt), rowAt(ctx, up, tr.Schema, tr.Table, d, 0), rowAt(ctx, down, tr.Schema, tr.Table, d, 0))
		}
	}
}

// rowAt reads the row of difference d in schema.table through db (at TiDB TSO snapshot
// when not 0), each value cut to 16 bytes.
func rowAt(ctx context.Context, db *sql.DB, schema, table string, d checker.StoredDifference, snapshot uint64) string {
	c, err := db.Conn(ctx)
	if err != nil {
		return err.Error()
	}
	defer c.Close()
	if snapshot > 0 {
		release, err := tso.At(ctx, c, snapshot)
		if err != nil {
			return err.Error()
		}
		defer release()
	}
	conds := make([]string, len(d.KeyColumns))
	for i, k := range d.KeyColumns {
		conds[i] = ident.Quote(k) + " <=> ?"
	}
	rows, err := c.QueryContext(ctx, "SELECT * FROM "+ident.Table(schema, table)+" WHERE "+strings.Join(conds, " AND "), d.KeyValues...)
	if err != nil {
		return err.Error()
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var out []string
	for rows.Next() {
		vals := make([]sql.RawBytes, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return err.Error()
		}
		parts := make([]string, len(cols))
		for i, v := range vals {
			parts[i] = fmt.Sprintf("%s=%.16q", cols[i], v)
		}
		out = append(out, "("+strings.Join(parts, " ")+")")
	}
	if len(out) == 0 {
		return "<none>"
	}
	return strings.Join(out, " ")
}

// explainAndStop explains run r's differences (explainRun), then stops the load, waits
// until the fallback has applied all of it and runs a full verification: equal then
// means r read the sides at different points; still different (a lost change never
// heals: loadgen never reuses a key) means the fallback lost changes.
func explainAndStop(t *testing.T, ctx context.Context, upDSN string, down *testenv.DB, cfg daemon.Config, srv *testServe, load *testLoad, r verify.RunRecord, froms map[string]uint64) {
	t.Helper()
	up, err := sql.Open("mysql", upDSN)
	if err != nil {
		t.Logf("diagnosis: %v", err)
		return
	}
	defer up.Close()
	explainRun(t, ctx, up, down.DB, cfg, srv, r, froms)
	res, err := load.Stop()
	t.Logf("diagnosis: load stopped at resolved ts %d (%v)", res.ResolvedTs, err)
	srv.WaitApplied(res.ResolvedTs)
	quiet := verifyCLI(t, cfg.Status.Addr)
	t.Logf("diagnosis: full run %s with the load stopped: %s, %d differences", quiet.RunID, quiet.Result, quiet.Differences)
	if quiet.Differences > 0 {
		explainRun(t, ctx, up, down.DB, cfg, srv, quiet, verifiedTables(t, ctx, down.DB, cfg))
	}
}
