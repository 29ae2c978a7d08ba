package cdc

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/testenv"
)

// TestApplyRowsInCommitOrder: inserts, updates, deletes, a primary-key change and a
// keyless table with duplicate rows, spread over 3 partitions, applied up to the
// resolved ts and no further.
func TestApplyRowsInCommitOrder(t *testing.T) {
	down := testenv.Downstream(t)
	f := newFeed(t, 3)
	s := down.Name
	exec(t, down.DB, "CREATE TABLE kv (id BIGINT PRIMARY KEY, v VARCHAR(32))")
	exec(t, down.DB, "CREATE TABLE nk (a BIGINT, b VARCHAR(32))")

	t1, t2, t3, t4 := f.next(), f.next(), f.next(), f.next()
	// Partition 0 holds ids 1 and 2, partition 1 id 3 (index-value dispatch).
	f.rows(0,
		ins(t1, s, "kv", ci("id", 1, pk), cs("v", "a")),
		ins(t1, s, "kv", ci("id", 2, pk), cs("v", "b")),
		upd(t2, s, "kv", []open.Column{ci("id", 2, pk), cs("v", "b")}, []open.Column{ci("id", 2, pk), cs("v", "b2")}),
		upd(t3, s, "kv", []open.Column{ci("id", 1, pk), cs("v", "a")}, []open.Column{ci("id", 10, pk), cs("v", "a10")}),
	)
	f.rows(1,
		ins(t1, s, "kv", ci("id", 3, pk), cs("v", "c")),
		del(t2, s, "kv", ci("id", 3, pk), cs("v", "c")),
		ins(t4, s, "kv", ci("id", 4, pk), cs("v", "after resolved")),
	)
	f.rows(2,
		ins(t1, s, "nk", ci("a", 1, 0), cs("b", "dup")),
		ins(t1, s, "nk", ci("a", 1, 0), cs("b", "dup")),
		ins(t1, s, "nk", ci("a", 1, 0), cs("b", nil)),
		del(t2, s, "nk", ci("a", 1, 0), cs("b", "dup")),
		upd(t3, s, "nk", []open.Column{ci("a", 1, 0), cs("b", nil)}, []open.Column{ci("a", 2, 0), cs("b", "x")}),
	)
	f.resolved(t3)

	cfg := testConfig(t, f, down)
	run := start(t, cfg, nil)
	run.wait(t, t3)
	equal(t, "kv", dump(t, down.DB, s, "kv"), []string{"10|a10", "2|b2"})
	equal(t, "nk", dump(t, down.DB, s, "nk"), []string{"1|dup", "2|x"})
	st := run.r.Status()
	if st.AppliedTs != t3 || st.ResolvedTs != t3 || st.BufferedRows != 1 {
		t.Fatalf("status after t3: %+v", st)
	}

	f.resolved(t4)
	run.wait(t, t4)
	equal(t, "kv", dump(t, down.DB, s, "kv"), []string{"10|a10", "2|b2", "4|after resolved"})
}

// TestCrashAtAnyStepConvergesExactlyOnce kills the applier (an error injected at each
// step boundary: rows applied but checkpoint not written; keyless rows applied but not
// committed; DDL executed but not recorded), restarts it from the meta schema, and
// checks that nothing is lost and nothing (in particular no keyless duplicate) is
// applied twice.
func TestCrashAtAnyStepConvergesExactlyOnce(t *testing.T) {
	for _, point := range []hookPoint{hookAfterRows, hookBeforeKeylessCommit, hookBeforeDDLRecord} {
		t.Run(string(point), func(t *testing.T) {
			down := testenv.Downstream(t)
			f := newFeed(t, 2)
			s := down.Name
			exec(t, down.DB, "CREATE TABLE kv (id BIGINT PRIMARY KEY, v VARCHAR(32))")
			exec(t, down.DB, "CREATE TABLE nk (a BIGINT, b VARCHAR(32))")
			t1, t2, t3 := f.next(), f.next(), f.next()
			f.rows(0,
				ins(t1, s, "kv", ci("id", 1, pk), cs("v", "a")),
				ins(t1, s, "kv", ci("id", 2, pk), cs("v", "b")),
			)
			f.rows(1,
				ins(t1, s, "nk", ci("a", 1, 0), cs("b", "dup")),
				ins(t1, s, "nk", ci("a", 1, 0), cs("b", "dup")),
				ins(t1, s, "kv", ci("id", 3, pk), cs("v", "c")),
			)
			f.resolved(t1)
			f.ddl(t2, s, "kv", "ALTER TABLE `kv` ADD COLUMN `w` BIGINT", 5)
			f.rows(0,
				upd(t3, s, "kv", []open.Column{ci("id", 1, pk), cs("v", "a"), ci("w", 0, open.FlagNullable)},
					[]open.Column{ci("id", 1, pk), cs("v", "a3"), ci("w", 7, open.FlagNullable)}),
			)
			f.rows(1,
				ins(t3, s, "nk", ci("a", 2, 0), cs("b", "dup")),
				ins(t3, s, "nk", ci("a", 2, 0), cs("b", "dup")),
				del(t3, s, "nk", ci("a", 1, 0), cs("b", "dup")),
			)
			f.resolved(t3)

			cfg := testConfig(t, f, down)
			run := start(t, cfg, crashAt(point))
			if err := run.result(t); !errors.Is(err, errCrash) {
				t.Fatalf("first run: %v, want the simulated crash", err)
			}
			run = start(t, cfg, nil)
			run.wait(t, t3)
			equal(t, "kv", dump(t, down.DB, s, "kv"), []string{"1|a3|7", "2|b|NULL", "3|c|NULL"})
			equal(t, "nk", dump(t, down.DB, s, "nk"), []string{"1|dup", "2|dup", "2|dup"})
			var n int
			if err := down.QueryRow("SELECT COUNT(*) FROM " + ident.Quote(cfg.Applier.MetaSchema) + ".ddl_applied").Scan(&n); err != nil || n != 1 {
				t.Fatalf("ddl_applied rows: %d, %v", n, err)
			}
			if err := run.stop(t); err != nil {
				t.Fatalf("stop: %v", err)
			}
			// A third start finds nothing to do and changes nothing.
			run = start(t, cfg, nil)
			run.wait(t, t3)
			f.resolved(f.next())
			run.wait(t, f.ts)
			equal(t, "nk after restart", dump(t, down.DB, s, "nk"), []string{"1|dup", "2|dup", "2|dup"})
		})
	}
}

// oneTransactionOfThreeStatements writes, at one commit ts t1, rows 1|a and 2|b of kv
// and 1|c of kv2 (tables it creates) to a changefeed whose config applies them with one
// worker in statements of one row: one transaction of three statements.
func oneTransactionOfThreeStatements(t *testing.T) (down *testenv.DB, cfg Config, t1 uint64) {
	t.Helper()
	down = testenv.Downstream(t)
	f := newFeed(t, 1)
	s := down.Name
	exec(t, down.DB, "CREATE TABLE kv (id BIGINT PRIMARY KEY, v VARCHAR(32))")
	exec(t, down.DB, "CREATE TABLE kv2 (id BIGINT PRIMARY KEY, v VARCHAR(32))")
	t1 = f.next()
	f.rows(0,
		ins(t1, s, "kv", ci("id", 1, pk), cs("v", "a")),
		ins(t1, s, "kv", ci("id", 2, pk), cs("v", "b")),
		ins(t1, s, "kv2", ci("id", 1, pk), cs("v", "c")),
	)
	f.resolved(t1)
	cfg = testConfig(t, f, down)
	cfg.Applier.Workers, cfg.Applier.BatchRows = 1, 1
	return down, cfg, t1
}

// TestConnectionLostMidTransactionReplays (#32): a worker's statements of a round share
// one transaction. When its connection dies between two of them (killed here, as a
// fallback restart or a network cut does), the server rolls the transaction back, and the
// worker runs all of its statements again in a new one: every row lands once, and the
// retry is counted.
func TestConnectionLostMidTransactionReplays(t *testing.T) {
	down, cfg, t1 := oneTransactionOfThreeStatements(t)
	s := down.Name
	// The replicator connects as a user of its own, which tells its connections apart
	// from the other tests' on the shared server.
	user := testenv.NewUser(t, down.Root, "pk")
	cfg.Downstream.DSN = user.DSN
	var killed int64
	hooks := &testHooks{f: func(p hookPoint) error {
		if p != hookBetweenStatements || killed != 0 {
			return nil
		}
		// The first statement wrote kv's row 1 in the worker's open transaction.
		id, err := writingConnection(down.DB, user.Name)
		if err != nil {
			return err
		}
		if _, err := down.Exec(fmt.Sprintf("KILL CONNECTION %d", id)); err != nil {
			return fmt.Errorf("killing the worker's connection %d: %w", id, err)
		}
		killed = id
		return nil
	}}
	run := start(t, cfg, hooks)
	run.wait(t, t1)
	if killed == 0 {
		t.Fatal("the worker's connection was not killed")
	}
	equal(t, "kv", dump(t, down.DB, s, "kv"), []string{"1|a", "2|b"})
	equal(t, "kv2", dump(t, down.DB, s, "kv2"), []string{"1|c"})
	if st := run.r.Status(); st.DownstreamRetries < 1 {
		t.Errorf("downstream retries %d after the worker's connection was killed, want at least 1", st.DownstreamRetries)
	}
}

// writingConnection returns the id of the one connection of user whose transaction has
// written rows, as the server lists its connections and its transactions (the latter
// refreshed at most every 100 ms, hence the polling).
func writingConnection(db *sql.DB, user string) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		var ids []int64
		rows, err := db.QueryContext(ctx, `SELECT p.ID FROM information_schema.PROCESSLIST p
			JOIN information_schema.INNODB_TRX x ON x.trx_mysql_thread_id = p.ID
			WHERE p.USER = ? AND x.trx_rows_modified > 0`, user)
		if err != nil {
			return 0, fmt.Errorf("reading the connections and transactions: %w", err)
		}
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return 0, err
			}
			ids = append(ids, id)
		}
		if err := rows.Close(); err != nil {
			return 0, err
		}
		switch {
		case len(ids) == 1:
			return ids[0], nil
		case len(ids) > 1:
			return 0, fmt.Errorf("connections %v of %s all have written transactions, want one", ids, user)
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("no connection of %s with a written transaction within 10s", user)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestCrashBetweenStatementsLeavesNeither (#32): a worker's statements of a round share
// one transaction; a crash between two of them leaves neither in the fallback (nothing
// of the round is visible), and the restarted applier applies both, once.
func TestCrashBetweenStatementsLeavesNeither(t *testing.T) {
	down, cfg, t1 := oneTransactionOfThreeStatements(t)
	s := down.Name
	run := start(t, cfg, crashAt(hookBetweenStatements))
	if err := run.result(t); !errors.Is(err, errCrash) {
		t.Fatalf("first run: %v, want the simulated crash", err)
	}
	equal(t, "kv after the crash", dump(t, down.DB, s, "kv"), nil)
	equal(t, "kv2 after the crash", dump(t, down.DB, s, "kv2"), nil)
	run = start(t, cfg, nil)
	run.wait(t, t1)
	equal(t, "kv", dump(t, down.DB, s, "kv"), []string{"1|a", "2|b"})
	equal(t, "kv2", dump(t, down.DB, s, "kv2"), []string{"1|c"})
}
