package checker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/tidb-parity/parity/internal/testenv"
	"github.com/tidb-parity/parity/internal/tso"
)

func TestSnapshotTime(t *testing.T) {
	at := time.Date(2026, 11, 21, 12, 30, 0, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Time
		ok   bool
	}{
		{fmt.Sprint(tso.FromTime(at) | 7), at, true},
		{"2026-11-21 12:30:00", at, true},
		{"2026-11-21 12:30:00.25", at.Add(250 * time.Millisecond), true},
		{"2026-11-21", time.Date(2026, 11, 21, 0, 0, 0, 0, time.UTC), true},
		{"yesterday", time.Time{}, false},
		{"", time.Time{}, false},
	} {
		got, ok := snapshotTime(tc.in)
		if ok != tc.ok || !got.Equal(tc.want) {
			t.Errorf("snapshotTime(%q) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestSnapshotHint(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Upstream.Snapshot = "470617288867840000"
	gc := fmt.Errorf("chunk 3: %w", &mysql.MySQLError{Number: 8055, Message: "snapshot is older than GC safe point"})
	if err := snapshotHint(gc, &cfg); !errors.Is(err, gc) || !strings.Contains(err.Error(), "tidb_gc_life_time") ||
		!strings.Contains(err.Error(), cfg.Upstream.Snapshot) {
		t.Errorf("8055: %v", err)
	}
	other := &mysql.MySQLError{Number: 1146, Message: "no such table"}
	if err := snapshotHint(other, &cfg); err != error(other) {
		t.Errorf("1146 changed: %v", err)
	}
	if snapshotHint(nil, &cfg) != nil {
		t.Error("nil changed")
	}
}

// TestSnapshotGC moves TiDB's GC safe point (mysql.tidb tikv_gc_safe_point, which TiDB
// checks tidb_snapshot against; restored afterwards) to 30 minutes ago: a diff at a
// snapshot of an hour ago stops before reading anything with an error naming the safe
// point; one taken now runs, and the log says until when GC keeps it. It moves the safe
// point of the second TiDB (the one without new collations), which only this package's
// tests use, never that of the TiDB every package reads at snapshots; and it holds
// oldCollationTiDB's lock, so no test of this package runs on that server meanwhile.
func TestSnapshotGC(t *testing.T) {
	p := pair{up: oldCollationTiDB(t), down: testenv.Downstream(t)}
	p.both(t, "CREATE TABLE g (id INT PRIMARY KEY)", "INSERT INTO g VALUES (1)")
	var old string
	if err := p.up.QueryRow("SELECT VARIABLE_VALUE FROM mysql.tidb WHERE VARIABLE_NAME = 'tikv_gc_safe_point'").Scan(&old); err != nil {
		t.Fatal(err)
	}
	safe, err := time.Parse(tidbSafePointLayout, old)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if safe.After(now.Add(-30 * time.Minute)) {
		t.Skipf("TiDB's GC safe point is %s: GC runs on this server", old)
	}
	set := func(v string) {
		t.Helper()
		exec(t, p.up.DB, "UPDATE mysql.tidb SET VARIABLE_VALUE = '"+v+"' WHERE VARIABLE_NAME = 'tikv_gc_safe_point'")
	}
	set(now.Add(-30 * time.Minute).UTC().Format(tidbSafePointLayout))
	t.Cleanup(func() { set(old) })
	snapshot := func(at time.Time) string { return fmt.Sprint(tso.FromTime(at)) }

	cfg := p.config(t, "g")
	cfg.Upstream.Snapshot = snapshot(now.Add(-time.Hour))
	_, err = NewDiff(cfg, nil).Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "older than TiDB's GC safe point") {
		t.Fatalf("snapshot an hour old: %v", err)
	}

	// A snapshot taken now (the table exists) passes, and the log says until when GC
	// keeps it.
	var logs bytes.Buffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	cfg.Upstream.Snapshot = fmt.Sprint(testenv.TiDBTSO(t, p.up.DB))
	rep, err := NewDiff(cfg, nil).Run(context.Background())
	if err != nil {
		t.Fatalf("snapshot of now: %v", err)
	}
	if !rep.Equal {
		t.Errorf("the table did not change: %+v", rep.Tables)
	}
	if !strings.Contains(logs.String(), "snapshot readable until about") {
		t.Errorf("no GC deadline in the log:\n%s", logs.String())
	}
}

func TestGCDeadline(t *testing.T) {
	now := time.Date(2026, 11, 21, 13, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		age  time.Duration
		soon bool
	}{{0, false}, {4 * time.Minute, false}, {5*time.Minute + time.Second, true}, {9 * time.Minute, true}, {20 * time.Minute, true}} {
		until, soon := gcDeadline(now.Add(-tc.age), 10*time.Minute, now)
		if soon != tc.soon || !until.Equal(now.Add(-tc.age).Add(10*time.Minute)) {
			t.Errorf("snapshot %v old, life 10m: until %v, soon %v; want soon %v", tc.age, until, soon, tc.soon)
		}
	}
}
