package checker

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"
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

	down, err := NewConnSource(ctx, "downstream snapshot", conns)
	if err != nil {
		t.Fatal(err)
	}
	up, err := OpenDSN(ctx, p.up.DSN, 2, "")
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	cfg := p.config(t, "cs")
	cfg.Concurrency = 2
	rep, err := RunWith(ctx, cfg, Sources{Upstream: up, Downstream: down, Meta: p.down.DB})
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
	src, err := OpenDSN(ctx, p.up.DSN, 2, "")
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
	own, err := OpenDSN(ctx, dsn, 2, "")
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	if paging, conc := read(own); paging != "0" || conc != "3" {
		t.Errorf("the DSN's own setting must win: paging %s, executor concurrency %s", paging, conc)
	}
	maria, err := OpenDSN(ctx, p.down.DSN, 1, "")
	if err != nil {
		t.Fatal(err)
	}
	defer maria.Close()
	if maria.Flavor() == FlavorTiDB {
		t.Fatal("the downstream should be MariaDB")
	}
}
