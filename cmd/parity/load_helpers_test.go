package main

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/tidb-parity/parity/cdc/loadgen"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/testenv"
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
// the log, and verification of db's tables on.
func verifyServeConfig(tb testing.TB, id, upDSN string, down *testenv.DB, broker, topic, db string, importTs uint64) serveConfig {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cfg := defaultServeConfig()
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
func runServeInTest(tb testing.TB, ctx context.Context, cfg serveConfig) *testServe {
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
func (s *testServe) Status() serveStatus {
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
