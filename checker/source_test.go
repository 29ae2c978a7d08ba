package checker

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tidb-parity/parity/internal/testenv"
)

// TestConnSourceSnapshot: a downstream given as connections inside consistent-snapshot
// transactions is read at that snapshot; writes committed later are not seen.
func TestConnSourceSnapshot(t *testing.T) {
	p := mariaPair(t)
	p.both(t, "CREATE TABLE cs (id INT PRIMARY KEY, v INT)", "INSERT INTO cs VALUES (1, 1), (2, 2), (3, 3)")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var conns []*sql.Conn
	for range 2 {
		c, err := p.down.DB.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.ExecContext(ctx, "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY"); err != nil {
			t.Fatal(err)
		}
		// Touch the table so the read view exists before the write below.
		if _, err := c.ExecContext(ctx, "SELECT COUNT(*) FROM cs"); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	exec(t, p.down.DB, "UPDATE cs SET v = 99 WHERE id = 2", "DELETE FROM cs WHERE id = 3")

	down, err := newConnSource(ctx, conns, connSourceConfig{Desc: "downstream snapshot", Kill: p.down.DB})
	if err != nil {
		t.Fatal(err)
	}
	up, err := OpenDSN(ctx, p.up.DSN, 2, "", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	cfg := p.config(t, "cs")
	cfg.Concurrency = 2
	rep, err := NewDiff(cfg, &Sources{Upstream: up, Downstream: down, Meta: p.down.DB}).Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Equal {
		t.Fatalf("at the snapshot the tables are equal: %+v", rep.Tables)
	}
	// Without the snapshot, the changes show.
	rep = run(t, cfg)
	if rep.Equal || rep.Tables[0].DifferencesTotal != 2 {
		t.Fatalf("latest data: %+v", rep.Tables)
	}
}

// TestTiDBSessionVars: a TiDB source's connections run with the chunk-query settings
// (tidbSessionVars), except those the DSN sets itself; a MariaDB source gets none.
func TestTiDBSessionVars(t *testing.T) {
	p := tidbPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	read := func(src *DSNSource) (paging, conc string) {
		t.Helper()
		q, release, err := src.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer release()
		if err := queryRow(ctx, q, "SELECT @@tidb_enable_paging, @@tidb_executor_concurrency", &paging, &conc); err != nil {
			t.Fatal(err)
		}
		return paging, conc
	}
	src, err := OpenDSN(ctx, p.up.DSN, 2, "", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if paging, conc := read(src); paging != "0" || conc != "1" {
		t.Errorf("defaults: paging %s, executor concurrency %s", paging, conc)
	}
	dsn := p.up.DSN + "?tidb_executor_concurrency=3"
	if strings.Contains(p.up.DSN, "?") {
		dsn = p.up.DSN + "&tidb_executor_concurrency=3"
	}
	own, err := OpenDSN(ctx, dsn, 2, "", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	if paging, conc := read(own); paging != "0" || conc != "3" {
		t.Errorf("the DSN's own setting must win: paging %s, executor concurrency %s", paging, conc)
	}
	maria, err := OpenDSN(ctx, p.down.DSN, 1, "", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer maria.Close()
	if maria.Flavor() == FlavorTiDB {
		t.Fatal("the downstream should be MariaDB")
	}
}

// TestAbandonedQueryKilled: a query whose context ends (its timeout, or a cancelled run)
// is stopped on the server. The driver only closes the connection, and MariaDB and TiDB
// run the query on to its end (shown first, with the kill left out; the server's own
// limit ends it at 5 s); a DSNSource kills it, and bounds every statement on the server
// at the query timeout plus a second. The result is read inside the watch, as the engine
// does (TiDB sends a result's header before it runs the statement).
func TestAbandonedQueryKilled(t *testing.T) {
	for _, c := range []struct {
		name string
		dsn  func(t *testing.T) string
		vr   string // the statement limit variable and value for a 4 s timeout
		want string
	}{
		{"mariadb", func(t *testing.T) string { return testenv.Downstream(t).DSN }, "max_statement_time", "5"},
		{"tidb", func(t *testing.T) string { return testenv.Upstream(t).DSN }, "max_execution_time", "5000"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dsn := c.dsn(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			src, err := OpenDSN(ctx, dsn, 2, "", 4*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			running := func(marker string) bool {
				var n int
				if err := src.killDB.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE ?", "%"+marker+"%").Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n > 1 // the PROCESSLIST query itself holds the marker too
			}
			// abandon starts SLEEP(30) on a connection of src, abandons it after 300 ms,
			// and returns its marker and start time.
			abandon := func(kill bool) (string, time.Time) {
				marker := fmt.Sprintf("parity-kill-test-%d", time.Now().UnixNano())
				q, release, err := src.Acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer release()
				var v string
				if err := queryRow(ctx, q, "SELECT @@SESSION."+c.vr, &v); err != nil || v != c.want {
					t.Errorf("%s = %q (%v), want %s", c.vr, v, err, c.want)
				}
				qctx, qcancel := context.WithTimeout(ctx, 300*time.Millisecond)
				defer qcancel()
				stop := func() {}
				if kill {
					_, stop = src.killOnDone(qctx, q)
				}
				start := time.Now()
				// Read the result, as the engine does inside its watch: TiDB sends the
				// result's header before it runs SLEEP. (An interrupted SLEEP returns 1 on
				// TiDB: the result may come without an error when the kill is quicker than
				// the driver closing the connection.)
				var slept sql.NullInt64
				err = queryRow(qctx, q, "SELECT /* "+marker+" */ SLEEP(30)", &slept)
				stop()
				if qctx.Err() == nil {
					t.Fatalf("the query ended before its deadline: %v", err)
				}
				return marker, start
			}
			// gone waits up to d for the query to leave the server, and returns when it did.
			gone := func(marker string, d time.Duration) (time.Time, bool) {
				for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
					if !running(marker) {
						return time.Now(), true
					}
				}
				return time.Time{}, false
			}
			// Without the kill the query runs on; the server's own limit (5 s) ends it.
			marker, start := abandon(false)
			time.Sleep(200 * time.Millisecond)
			if !running(marker) {
				t.Fatal("the abandoned query is not running on the server: the case shows nothing")
			}
			if at, ok := gone(marker, 15*time.Second); !ok || at.Sub(start) < 4500*time.Millisecond {
				t.Errorf("without the kill: the query left the server after %v (%v), want the 5 s statement limit", at.Sub(start), ok)
			} else {
				t.Logf("without the kill: gone after %v", at.Sub(start))
			}
			// With it, the query leaves the server well before that limit.
			marker, start = abandon(true)
			if at, ok := gone(marker, 3500*time.Millisecond); !ok {
				var list []string
				if rows, err := src.killDB.QueryContext(ctx, "SELECT ID, COMMAND, TIME FROM information_schema.PROCESSLIST WHERE INFO LIKE ? AND INFO NOT LIKE '%PROCESSLIST%'", "%"+marker+"%"); err == nil {
					for rows.Next() {
						var id, cmd, tm string
						_ = rows.Scan(&id, &cmd, &tm)
						list = append(list, id+" "+cmd+" "+tm)
					}
					rows.Close()
				}
				src.mu.Lock()
				known := fmt.Sprint(src.ids)
				src.mu.Unlock()
				t.Errorf("the abandoned query still runs on the server %v after it started, with KillOnDone: %v; connection ids %s", time.Since(start), list, known)
			} else {
				t.Logf("with the kill: gone after %v", at.Sub(start))
			}
			// The source stays usable: the killed connection was discarded.
			q, release, err := src.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var one int
			if err := queryRow(ctx, q, "SELECT 1", &one); err != nil {
				t.Errorf("after a kill: %v", err)
			}
			release()
		})
	}
}

// TestConnSourceTimeout: a query on a snapshot connection (connSource) that outlives its
// timeout is killed on the server, and the connection stays usable at its snapshot: the
// next query on it succeeds and sees the snapshot, and the server shows no leftover query.
func TestConnSourceTimeout(t *testing.T) {
	for _, c := range []struct {
		name string
		db   func(t *testing.T) *testenv.DB
	}{
		{"mariadb", func(t *testing.T) *testenv.DB { return testenv.Downstream(t) }},
		{"tidb", func(t *testing.T) *testenv.DB { return testenv.Upstream(t) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			db := c.db(t)
			exec(t, db.DB, "CREATE TABLE ct (id INT PRIMARY KEY)", "INSERT INTO ct VALUES (1)")
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			conn, err := db.DB.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			exec1 := func(q string) {
				t.Helper()
				if _, err := conn.ExecContext(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			exec1("START TRANSACTION WITH CONSISTENT SNAPSHOT")
			exec1("SELECT COUNT(*) FROM ct")
			exec(t, db.DB, "INSERT INTO ct VALUES (2)") // after the snapshot
			src, err := newTestConnSource(ctx, db.DB, conn)
			if err != nil {
				t.Fatal(err)
			}
			sides := testSides(src, 200*time.Millisecond)
			marker := fmt.Sprintf("parity-conn-timeout-%d", time.Now().UnixNano())
			var slept sql.NullInt64
			err = sides.withSide(ctx, upSide, func(ctx context.Context, q Querier) error {
				return queryRow(ctx, q, "SELECT /* "+marker+" */ SLEEP(5)", &slept)
			})
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("SLEEP(5) with a 200ms timeout: want a timeout, got %v (slept %v)", err, slept)
			}
			// The kill has ended the query by the time withSide returns; TiDB drops it from
			// its process list a moment after it sent the result. Without the kill it stays
			// there for its 5 s.
			for settle := time.Now().Add(time.Second); ; time.Sleep(10 * time.Millisecond) {
				var left int
				if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE ? AND INFO NOT LIKE '%PROCESSLIST%'", "%"+marker+"%").Scan(&left); err != nil {
					t.Fatal(err)
				}
				if left == 0 {
					break
				}
				if time.Now().After(settle) {
					t.Fatal("the timed-out query is still running on the server")
				}
			}
			var n int
			err = sides.withSide(ctx, upSide, func(ctx context.Context, q Querier) error {
				return queryRow(ctx, q, "SELECT COUNT(*) FROM ct", &n)
			})
			if err != nil || n != 1 {
				t.Fatalf("the next query on the source: %d rows (want 1, the snapshot's), %v", n, err)
			}
		})
	}
}

// newTestConnSource wraps conn (inside a snapshot transaction) as a one-connection
// connSource whose kills go through db.
func newTestConnSource(ctx context.Context, db *sql.DB, conn *sql.Conn) (*connSource, error) {
	return newConnSource(ctx, []*sql.Conn{conn}, connSourceConfig{Desc: "test snapshot", Kill: db})
}

// testSides pairs src with itself, with the given query timeout.
func testSides(src Source, timeout time.Duration) *sourcePair {
	return newSourcePair(src, src, timeout)
}

// TestConnSourcePairAtSnapshot: a pair of ConnSources opened inside a barrier and
// labelled with its point (connSourceConfig.Snapshot) counts as read at a snapshot: the
// run does not re-check its differences (reading again reads the same data; here a live
// re-check would even see the downstream repaired after the snapshot) and the report and
// Stats name both points.
func TestConnSourcePairAtSnapshot(t *testing.T) {
	p := mariaPair(t)
	p.both(t, "CREATE TABLE ps (id INT PRIMARY KEY, v INT)", "INSERT INTO ps VALUES (1, 1), (2, 2), (3, 3)")
	exec(t, p.down.DB, "DELETE FROM ps WHERE id = 2")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	open := func(db *sql.DB, label string) *connSource {
		t.Helper()
		var conns []*sql.Conn
		for range 2 {
			c, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
			exec1 := func(q string) {
				if _, err := c.ExecContext(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			exec1("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
			exec1("SELECT COUNT(*) FROM ps")
			conns = append(conns, c)
		}
		src, err := newConnSource(ctx, conns, connSourceConfig{Desc: label, Snapshot: label, Kill: db})
		if err != nil {
			t.Fatal(err)
		}
		return src
	}
	up, down := open(p.up.DB, "barrier-up-42"), open(p.down.DB, "barrier-down-42")
	exec(t, p.down.DB, "INSERT INTO ps VALUES (2, 2)") // after the snapshot
	cfg := p.config(t, "ps")
	cfg.Concurrency = 2
	d := NewDiff(cfg, &Sources{Upstream: up, Downstream: down, Meta: p.down.DB})
	rep, err := d.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tr := tableReport(t, rep, "ps")
	if tr.DifferencesTotal != 1 || tr.DifferencesResolved != 0 || tr.DifferencesUnconfirmed != 0 || rep.RecheckRounds != 0 {
		t.Errorf("at the snapshot: %d differences, %d resolved, %d unconfirmed, %d re-check rounds; want 1, 0, 0, 0",
			tr.DifferencesTotal, tr.DifferencesResolved, tr.DifferencesUnconfirmed, rep.RecheckRounds)
	}
	if rep.UpstreamSnapshot != "barrier-up-42" || rep.DownstreamSnapshot != "barrier-down-42" {
		t.Errorf("report snapshots %q, %q", rep.UpstreamSnapshot, rep.DownstreamSnapshot)
	}
	st := d.Stats()
	if st.State != runDone || st.Phase != phaseFinished || st.UpstreamSnapshot != "barrier-up-42" || st.DownstreamSnapshot != "barrier-down-42" ||
		st.ChunksDone != tr.Chunks || st.Differences != 1 || st.RowsChecked != 3 {
		t.Errorf("stats %+v", st)
	}
}
