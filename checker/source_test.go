package checker

import (
	"context"
	"database/sql"
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
