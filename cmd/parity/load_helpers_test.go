package main

import (
	"context"
	"database/sql"
	"log/slog"
	"net"
	"path/filepath"
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
