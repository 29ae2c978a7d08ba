package reliability

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/tidb-parity/parity/cdc"
	"github.com/tidb-parity/parity/cdc/loadgen"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/testenv"
)

// logBuffer collects a component's log for assertions (the retries it logged).
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuffer) Count(s string) int { return strings.Count(l.String(), s) }

func (l *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// load is loadgen running in the background.
type load struct {
	cfg    loadgen.Config
	cancel context.CancelFunc
	done   chan struct{}
	res    loadgen.Result
	err    error
}

// startLoad runs loadgen on cfg (its database dropped on both sides when the test ends)
// and waits for its import; it returns the load and the import TSO.
func startLoad(t *testing.T, cfg loadgen.Config) (*load, uint64) {
	t.Helper()
	cfg.ImportTSFile = filepath.Join(t.TempDir(), "import_ts")
	cfg.Logger = slog.New(slog.DiscardHandler)
	t.Cleanup(func() {
		if os.Getenv("PARITY_TEST_KEEP") == "1" {
			return
		}
		for _, dsn := range []string{cfg.Upstream, cfg.Downstream} {
			if d, err := sql.Open("mysql", dsn); err == nil {
				_, _ = d.Exec("DROP DATABASE IF EXISTS " + ident.Quote(cfg.Database))
				d.Close()
			}
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	l := &load{cfg: cfg, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		l.res, l.err = loadgen.Run(ctx, cfg)
	}()
	t.Cleanup(func() { l.stop() })
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if b, err := os.ReadFile(cfg.ImportTSFile); err == nil && len(b) > 0 {
			ts, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
			if err != nil {
				t.Fatalf("import ts file: %v", err)
			}
			return l, ts
		}
		select {
		case <-l.done:
			t.Fatalf("loadgen ended before its import finished: %v", l.err)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("the import did not finish within 2 minutes")
		}
	}
}

// stop ends the load: its final resolved ts is what the fallback must equal.
func (l *load) stop() (loadgen.Result, error) {
	l.cancel()
	<-l.done
	return l.res, l.err
}

// loadConfig is a steady workload: an import of 200 rows per table, then rate
// transactions per second over 3 tables (one keyless: a doubled row shows), until
// stopped.
func loadConfig(t *testing.T, upDSN, downDSN, broker, topic string, rate float64, seed uint64) loadgen.Config {
	cfg := loadgen.DefaultConfig()
	cfg.Upstream, cfg.Downstream = upDSN, downDSN
	cfg.Brokers, cfg.Topic = []string{broker}, topic
	cfg.Database = testenv.UniqueName("rel")
	cfg.Tables = 3
	cfg.Workers = 2
	cfg.ImportRows = 200
	cfg.Rate = rate
	cfg.Duration = 10 * time.Minute // stopped by the test
	cfg.FlushInterval, cfg.ResolvedInterval = 5*time.Millisecond, 100*time.Millisecond
	cfg.Dispatcher = loadgen.DispatchIndexValue
	cfg.Seed = seed
	return cfg
}

// replicator is a cdc.Replicator running in the background.
type replicator struct {
	*cdc.Replicator
	log    *logBuffer
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// replicatorConfig applies topic from broker into the fallback at downDSN from importTs,
// with a meta schema of its own (dropped when the test ends, over metaDSN).
func replicatorConfig(t *testing.T, broker, topic, downDSN, metaDSN string, importTs uint64) cdc.Config {
	cfg := cdc.DefaultConfig()
	cfg.Changefeed.ID = "rel"
	cfg.Changefeed.Brokers, cfg.Changefeed.Topics = []string{broker}, []string{topic}
	cfg.Changefeed.StartTs = importTs
	cfg.Downstream.DSN = downDSN
	cfg.Applier.MetaSchema = testenv.UniqueName("pm")
	cfg.Applier.SpillDir = t.TempDir()
	cfg.Applier.Workers = 4
	cfg.Applier.QueryTimeout = 5 * time.Second
	cfg.Applier.GCPercent = 0 // process-wide: leave the test binary's alone
	t.Cleanup(func() {
		if d, err := sql.Open("mysql", metaDSN); err == nil {
			_, _ = d.Exec("DROP DATABASE IF EXISTS " + ident.Quote(cfg.Applier.MetaSchema))
			d.Close()
		}
	})
	return cfg
}

func startReplicator(t *testing.T, cfg cdc.Config) *replicator {
	t.Helper()
	lb := &logBuffer{}
	r, err := cdc.New(cfg, lb.logger())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rp := &replicator{Replicator: r, log: lb, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(rp.done)
		rp.err = r.Run(ctx)
	}()
	t.Cleanup(func() {
		rp.stop()
		if t.Failed() {
			t.Logf("replicator log:\n%s", tail(lb.String(), 6000))
		}
	})
	return rp
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// stop cancels the replicator and returns what Run returned.
func (r *replicator) stop() error {
	r.cancel()
	<-r.done
	return r.err
}

// ended reports whether Run has returned, and its error.
func (r *replicator) ended() (bool, error) {
	select {
	case <-r.done:
		return true, r.err
	default:
		return false, nil
	}
}

// waitApplied waits until the applied checkpoint reaches ts, failing the test if Run
// ends first or within is over.
func (r *replicator) waitApplied(t *testing.T, ts uint64, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	waitErr := make(chan error, 1)
	go func() { waitErr <- r.WaitApplied(ctx, ts) }()
	select {
	case err := <-waitErr:
		if err != nil {
			t.Fatalf("ts %d not applied within %v (status %+v): %v", ts, within, r.Status(), err)
		}
	case <-r.done:
		cancel()
		<-waitErr
		t.Fatalf("the replicator stopped before applying ts %d: %v", ts, r.err)
	}
	return time.Since(start)
}

// progressed waits until the replicator has applied something past ts.
func (r *replicator) progressed(t *testing.T, ts uint64) {
	t.Helper()
	r.waitApplied(t, ts+1, time.Minute)
}

// openSchema opens dsn on schema with the comparator's session settings.
func openSchema(t *testing.T, dsn, schema string) *sql.DB {
	t.Helper()
	c, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	c.DBName = schema
	c.ParseTime = false
	if c.Params == nil {
		c.Params = map[string]string{}
	}
	c.Params["time_zone"] = "'+00:00'"
	db, err := sql.Open("mysql", c.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(4)
	t.Cleanup(func() { db.Close() })
	return db
}

// assertSameAt is the independent check: the fallback (downDSN) equals TiDB (upDSN) at
// ts, schema by schema, row for row (lost, extra and doubled rows included).
func assertSameAt(t *testing.T, upDSN, downDSN, schema string, ts uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep := testenv.AssertSame(t, ctx,
		testenv.Side{Label: "TiDB", DB: openSchema(t, upDSN, schema), Schema: schema, TS: ts},
		testenv.Side{Label: "the fallback", DB: openSchema(t, downDSN, schema), Schema: schema},
		testenv.Options{})
	if len(rep.Tables) == 0 || rep.Rows() == 0 {
		t.Fatalf("nothing compared in %s at ts %d", schema, ts)
	}
	t.Logf("the fallback equals TiDB at ts %d: %d tables, %d rows", ts, len(rep.Tables), rep.Rows())
}

// fmtDur rounds a duration for logs and docs.
func fmtDur(d time.Duration) string { return fmt.Sprint(d.Round(10 * time.Millisecond)) }
