package testenv_test

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/tidb-parity/parity/internal/testenv"
	"github.com/tidb-parity/parity/internal/tso"
)

// TestProbeTiDBSnapshotStability (PARITY_PROBE_SNAPSHOT=1 or a duration; not in make test: it probes
// the test environment's TiDB, it does not test parity): 12 writers run pessimistic
// transactions (async commit and 1PC off, as loadgen's) on a 3,000-row table while a
// reader takes a fresh TSO P, reads 512 random keys at tidb_snapshot=P at once, and
// reads them again at the same P 0.2-1 s later. The two reads must agree: a snapshot
// read is repeatable. On the embedded unistore (2026-11-28) one 3-minute run found 18 keys
// in one round absent from the first read and present in the second (rows inserted by a
// transaction committing just then), the next run none: a read at P soon after P can miss
// a transaction whose commit ts is below P. It is the prime suspect for the false
// mismatches seen twice under load (docs/verify.md).
func TestProbeTiDBSnapshotStability(t *testing.T) {
	if os.Getenv("PARITY_PROBE_SNAPSHOT") == "" {
		t.Skip("PARITY_PROBE_SNAPSHOT not set")
	}
	probeDuration := 3 * time.Minute // PARITY_PROBE_SNAPSHOT=1; or a duration: that long
	if d, err := time.ParseDuration(os.Getenv("PARITY_PROBE_SNAPSHOT")); err == nil {
		probeDuration = d
	}
	dsn := testenv.Require(t, testenv.EnvUpstream)
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DBName, cfg.Params = "", nil
	base := strings.TrimSuffix(cfg.FormatDSN(), "/")
	name := testenv.Upstream(t).Name // dropped when the test ends
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	db, err := sql.Open("mysql", base+"/"+name+"?tidb_enable_async_commit=0&tidb_enable_1pc=0&tidb_txn_mode='pessimistic'")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(20)
	if _, err := db.Exec("CREATE TABLE t (id BIGINT PRIMARY KEY, k INT NOT NULL, c CHAR(60) NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	const N = 3000
	for i := 0; i < N; i += 500 {
		var vals []string
		for j := i; j < i+500; j++ {
			vals = append(vals, fmt.Sprintf("(%d, 0, 'x')", j))
		}
		if _, err := db.Exec("INSERT INTO t VALUES " + strings.Join(vals, ",")); err != nil {
			t.Fatal(err)
		}
	}
	wctx, wstop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for w := 0; w < 12; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for wctx.Err() == nil {
				conn, err := db.Conn(wctx)
				if err != nil {
					return
				}
				conn.ExecContext(wctx, "BEGIN PESSIMISTIC")
				ok := true
				for j := 0; j < 20 && ok; j++ {
					id := r.IntN(N)
					var err error
					switch r.IntN(3) {
					case 0:
						_, err = conn.ExecContext(wctx, "UPDATE t SET k = k + 1, c = ? WHERE id = ?", fmt.Sprint(r.Int()), id)
					case 1:
						_, err = conn.ExecContext(wctx, "DELETE FROM t WHERE id = ?", id)
					default:
						_, err = conn.ExecContext(wctx, "INSERT INTO t VALUES (?, 1, 'y') ON DUPLICATE KEY UPDATE k = k + 1", id)
					}
					ok = err == nil
				}
				if ok {
					conn.ExecContext(context.Background(), "COMMIT")
				} else {
					conn.ExecContext(context.Background(), "ROLLBACK")
				}
				conn.Close()
			}
		}()
	}
	defer func() { wstop(); wg.Wait() }()
	read := func(ts uint64, q string) map[int64]string {
		sdb, _ := sql.Open("mysql", base+fmt.Sprintf("/%s?tidb_snapshot='%d'", name, ts))
		defer sdb.Close()
		rows, err := sdb.QueryContext(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		out := map[int64]string{}
		for rows.Next() {
			var id int64
			var k int
			var c string
			if err := rows.Scan(&id, &k, &c); err != nil {
				t.Fatal(err)
			}
			out[id] = fmt.Sprint(k, c)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	bad, rounds := 0, 0
	end := time.Now().Add(probeDuration)
	for time.Now().Before(end) {
		ts, err := tso.Current(ctx, db, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var terms []string
		for j := 0; j < 512; j++ {
			terms = append(terms, fmt.Sprintf("(id = %d)", rand.IntN(N)))
		}
		q := "SELECT id, k, c FROM t WHERE (" + strings.Join(terms, " OR ") + ") ORDER BY id"
		first := read(ts, q)
		time.Sleep(time.Duration(200+rand.IntN(800)) * time.Millisecond)
		again := read(ts, q)
		rounds++
		for id, v := range first {
			if again[id] != v {
				bad++
				t.Logf("ts %d id %d: first %q, again %q", ts, id, v, again[id])
			}
		}
		for id := range again {
			if _, ok := first[id]; !ok {
				bad++
				t.Logf("ts %d id %d: absent first, again %q", ts, id, again[id])
			}
		}
	}
	t.Logf("%d rounds, %d unstable keys", rounds, bad)
	if bad > 0 {
		t.Fail()
	}
}
