package reliability

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/testenv"
)

// diffWorld is a table of diffRows rows on an upstream and a downstream, equal but for
// five rows of the downstream (two changed, two deleted, one extra): what every diff of
// it must find, exactly.
type diffWorld struct {
	upDSN, downDSN string // root DSNs (the servers the data was written to)
	db             string
	snapshot       uint64 // a TSO after the upstream's rows were written, when it is TiDB
	want           []string
}

const diffRows = 40000

// newDiffWorld writes the table on both servers (dropped when the test ends); tidb says
// the upstream is TiDB (the diff then reads it at a TSO).
func newDiffWorld(t *testing.T, upDSN, downDSN string, tidb bool) *diffWorld {
	t.Helper()
	w := &diffWorld{upDSN: upDSN, downDSN: downDSN, db: testenv.UniqueName("reldiff")}
	for _, dsn := range []string{upDSN, downDSN} {
		db := openSchema(t, dsn, "")
		mustExec(t, db, "CREATE DATABASE "+ident.Quote(w.db),
			"CREATE TABLE "+ident.Table(w.db, "t")+" (id INT PRIMARY KEY, a VARCHAR(64) NOT NULL, b BIGINT, c DOUBLE)")
		for lo := 1; lo <= diffRows; lo += 5000 {
			var vals []string
			for i := lo; i < lo+5000 && i <= diffRows; i++ {
				vals = append(vals, fmt.Sprintf("(%d,'row %d',%d,%d.25)", i, i, int64(i)*7919, i))
			}
			mustExec(t, db, "INSERT INTO "+ident.Table(w.db, "t")+" VALUES "+strings.Join(vals, ","))
		}
		t.Cleanup(func() { _, _ = db.Exec("DROP DATABASE IF EXISTS " + ident.Quote(w.db)) })
	}
	down := openSchema(t, downDSN, w.db)
	mustExec(t, down, "UPDATE t SET a = 'changed' WHERE id IN (7, 20001)", "DELETE FROM t WHERE id IN (15000, 29999)",
		fmt.Sprintf("INSERT INTO t VALUES (%d, 'extra', 0, 0)", diffRows+5))
	w.want = []string{"7", "15000", "20001", "29999", strconv.Itoa(diffRows + 5)}
	if tidb {
		// A TSO whose snapshot holds every row. With many tests' DDL at once, the
		// snapshot schema of a TSO taken right after CREATE DATABASE returned has been
		// seen without it (Error 1049 at the snapshot): take another one then.
		up := openSchema(t, upDSN, "")
		for try := 0; ; try++ {
			w.snapshot = testenv.TiDBTSO(t, up)
			n, err := countAt(up, w.db, w.snapshot)
			if err == nil && n == diffRows {
				break
			}
			if try == 20 {
				t.Fatalf("TiDB at ts %d: %d rows, %v", w.snapshot, n, err)
			}
			t.Logf("TiDB at ts %d: %d rows, %v; taking another TSO", w.snapshot, n, err)
			time.Sleep(500 * time.Millisecond)
		}
	}
	return w
}

func mustExec(t *testing.T, db *sql.DB, stmts ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, s := range stmts {
		if _, err := db.ExecContext(ctx, s); err != nil {
			t.Fatalf("%.80s: %v", s, err)
		}
	}
}

// config is a diff of the world's table over upDSN and downDSN (the servers, or proxies
// in front of them), in chunks of about 1,000 rows, at most rate rows per second (0:
// any), with its run state in a meta schema of its own on the downstream (dropped at the
// end, over the world's downstream DSN).
func (w *diffWorld) config(t *testing.T, upDSN, downDSN string, rate int) (checker.Config, *logBuffer) {
	cfg := checker.DefaultConfig()
	cfg.Upstream.DSN, cfg.Downstream.DSN = upDSN, downDSN
	if w.snapshot != 0 {
		cfg.Upstream.Snapshot = strconv.FormatUint(w.snapshot, 10)
	}
	cfg.Tables = []string{w.db + ".t"}
	cfg.InitialChunkRows, cfg.MinChunkRows, cfg.MaxChunkRows, cfg.MinChunks = 1000, 500, 1000, 40
	cfg.Concurrency = 2
	cfg.MaxRowsPerSecond = rate
	cfg.QueryTimeout = 2 * time.Second
	cfg.MetaSchema = testenv.UniqueName("pdm")
	cfg.OutputDir = t.TempDir()
	lb := &logBuffer{}
	cfg.Logger = lb.logger()
	t.Cleanup(func() {
		if db, err := sql.Open("mysql", w.downDSN); err == nil {
			_, _ = db.Exec("DROP DATABASE IF EXISTS " + ident.Quote(cfg.MetaSchema))
			db.Close()
		}
	})
	return cfg, lb
}

// check fails the test unless rep found exactly the world's five differences, having
// compared every row.
func (w *diffWorld) check(t *testing.T, rep *checker.Report) {
	t.Helper()
	if len(rep.Tables) != 1 {
		t.Fatalf("%d tables in the report", len(rep.Tables))
	}
	tr := rep.Tables[0]
	var got []string
	for _, d := range tr.Differences {
		if len(d.Key) != 1 {
			t.Fatalf("difference with key %v", d.Key)
		}
		got = append(got, d.Key[0].Value)
	}
	slices.SortFunc(got, func(a, b string) int { x, _ := strconv.Atoi(a); y, _ := strconv.Atoi(b); return x - y })
	if rep.Equal || tr.DifferencesTotal != 5 || !slices.Equal(got, w.want) {
		t.Fatalf("want exactly the differences %v, got %d: %v (equal %v)", w.want, tr.DifferencesTotal, got, rep.Equal)
	}
	if tr.RowsChecked != diffRows || tr.DownstreamRows != diffRows-1 {
		t.Fatalf("compared %d upstream and %d downstream rows, want %d and %d", tr.RowsChecked, tr.DownstreamRows, diffRows, diffRows-1)
	}
}

// runDiff runs a diff in the background; fault is called once it has stored 5 chunks,
// and it returns the report and error.
func runDiff(t *testing.T, cfg checker.Config, fault func(d *checker.Diff)) (*checker.Report, error, *checker.Diff) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	d := checker.NewDiff(cfg, nil)
	type result struct {
		rep *checker.Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := d.Run(ctx)
		done <- result{rep, err}
	}()
	if fault != nil {
		for d.Stats().ChunksDone < 5 {
			select {
			case r := <-done:
				t.Fatalf("the diff ended before the fault: %v", r.err)
			case <-time.After(20 * time.Millisecond):
			}
		}
		fault(d)
	}
	r := <-done
	return r.rep, r.err, d
}

// diffFault is a network fault between a diff and TiDB or the fallback.
type diffFault struct {
	name   string
	tidb   bool // on TiDB's connections; else on the fallback's (run state included)
	toxics []testenv.Toxic
	cut    bool
	hold   time.Duration
	// retries: chunks must have been compared again (a transient error); fails: the
	// run fails with a RunError naming each of wantErr and is resumed (--resume).
	retries bool
	fails   bool
	wantErr []string
}

var diffFaults = []diffFault{
	{name: "tidb+fallback/latency-jitter", hold: 4 * time.Second, toxics: []testenv.Toxic{
		{Type: "latency", Stream: "downstream", Attributes: map[string]any{"latency": 30, "jitter": 20}}}},
	{name: "tidb/bandwidth", tidb: true, hold: 4 * time.Second, toxics: []testenv.Toxic{
		{Type: "bandwidth", Stream: "downstream", Attributes: map[string]any{"rate": 4}}}},
	{name: "tidb/reset-mid-chunk", tidb: true, hold: 1500 * time.Millisecond, retries: true, toxics: []testenv.Toxic{
		{Type: "reset_peer", Stream: "downstream", Attributes: map[string]any{"timeout": 10}}}},
	{name: "fallback/reset-mid-chunk", hold: 1500 * time.Millisecond, retries: true, toxics: []testenv.Toxic{
		{Type: "reset_peer", Stream: "downstream", Attributes: map[string]any{"timeout": 10}}}},
	{name: "tidb/stops-answering", tidb: true, hold: 3 * time.Second, retries: true, toxics: []testenv.Toxic{
		{Type: "timeout", Stream: "downstream", Attributes: map[string]any{"timeout": 0}}}},
	{name: "tidb/cut-beyond-retry-budget", tidb: true, hold: 8 * time.Second, cut: true, fails: true,
		wantErr: []string{"failed", "chunk", "connection refused"}},
}

// TestDiffFaults runs a diff of 40,000 rows (TiDB at a TSO against the fallback, about
// 40 chunks, throttled to last ~8 s) through proxies while one network fault hits TiDB's
// or the fallback's connections mid-run: latency with jitter, a bandwidth limit,
// connections reset mid-chunk, a server that stops answering, a cut longer than the
// chunk retry budget. The diff must retry the chunks the fault hit and finish, or fail
// the run with a clear error and finish when resumed; either way it finds exactly the
// five rows that differ, having compared every row once.
//
// It is not a parallel test, so it runs before the package's parallel tests start: run
// beside TestApplierFaults, every diff's first connection to TiDB through its proxy was
// refused with Error 1049 (database doesn't exist) although the database was readable
// at the snapshot (cause not found yet; the check below names the server the proxy
// reaches if it happens again).
func TestDiffFaults(t *testing.T) {
	upDSN := testenv.Require(t, testenv.EnvUpstream)
	downDSN := testenv.Require(t, testenv.EnvDownstream)
	w := newDiffWorld(t, upDSN, downDSN, true)
	for _, f := range diffFaults {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			tp := testenv.NewProxy(t, "tidb-"+f.name, addrOf(t, upDSN))
			dp := testenv.NewProxy(t, "fallback-"+f.name, addrOf(t, downDSN))
			cfg, logs := w.config(t, tp.DSN(t, upDSN), dp.DSN(t, downDSN), 5000)
			if n, err := countAt(openSchema(t, cfg.Upstream.DSN, ""), w.db, w.snapshot); err != nil || n != diffRows {
				var port, version string
				_ = openSchema(t, cfg.Upstream.DSN, "").QueryRow("SELECT @@port, @@version").Scan(&port, &version)
				t.Fatalf("through the proxy %s (to %s): %d rows, %v; port %s, version %s", tp.Addr, tp.Upstream, n, err, port, version)
			}
			proxies := []*testenv.Proxy{dp}
			if f.tidb {
				proxies = []*testenv.Proxy{tp}
			} else if !strings.HasPrefix(f.name, "fallback/") {
				proxies = []*testenv.Proxy{tp, dp}
			}
			var faultEnd time.Time
			rep, err, d := runDiff(t, cfg, func(d *checker.Diff) {
				for _, p := range proxies {
					if f.cut {
						p.Cut()
					}
					for _, x := range f.toxics {
						p.Add(t, x)
					}
				}
				time.Sleep(f.hold)
				for _, p := range proxies {
					p.RemoveAll(t)
					if f.cut {
						p.Restore(t)
					}
				}
				faultEnd = time.Now()
			})
			st := d.Stats()
			if f.fails {
				var re *checker.RunError
				if !errors.As(err, &re) || re.State != checker.RunFailed {
					t.Fatalf("want a failed run, got %v", err)
				}
				for _, s := range append(f.wantErr, "t") {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("the run's error lacks %q: %v", s, err)
					}
				}
				t.Logf("the run failed after %d chunks, %d retries: %v", st.ChunksDone, st.ChunkRetries, err)
				cfg.Resume = re.RunID
				start := time.Now()
				rep, err, d = runDiff(t, cfg, nil)
				if err != nil {
					t.Fatalf("resumed run: %v", err)
				}
				if rep.RunID != re.RunID {
					t.Fatalf("resumed run has id %s, want %s", rep.RunID, re.RunID)
				}
				t.Logf("resumed run %s finished in %v, comparing %d rows in this process", rep.RunID, fmtDur(time.Since(start)), d.Stats().RowsChecked)
			} else {
				if err != nil {
					t.Fatalf("the run failed under the fault: %v\n%s", err, tail(logs.String(), 4000))
				}
				t.Logf("finished %v after the fault ended; %d chunks, %d retried", fmtDur(time.Since(faultEnd)), st.Chunks, st.ChunkRetries)
				if f.retries && st.ChunkRetries == 0 {
					t.Errorf("no chunk was retried under the fault")
				}
			}
			w.check(t, rep)
		})
	}
}

// countAt counts the rows of db.t in TiDB at ts.
func countAt(up *sql.DB, db string, ts uint64) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, closeConn, err := testenv.Side{Label: "TiDB", DB: up, TS: ts}.Session(ctx)
	if err != nil {
		return 0, err
	}
	defer closeConn()
	var n int
	err = conn.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+ident.Table(db, "t")).Scan(&n)
	return n, err
}
