package ledger

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/testenv"
	"github.com/tidb-parity/parity/internal/tso"
)

// TestReader reads a ledger laid out as the contract says (the applier's own tests check
// that it writes one): windows over many rounds (more rows than one page), other tables'
// rows between them, a key changed in several rounds, the refusal of windows outside
// (since_ts, applied_ts], and the caught-up point of a ts-map.
func TestReader(t *testing.T) {
	db := testenv.Downstream(t)
	schema := db.Name
	tbl := func(n string) string { return ident.Table(schema, n) }
	ctx := context.Background()
	for _, q := range []string{
		`CREATE TABLE ` + tbl(Table) + ` (changefeed VARCHAR(128) NOT NULL, max_ts BIGINT UNSIGNED NOT NULL,
			schema_name VARCHAR(64) NOT NULL, table_name VARCHAR(64) NOT NULL, part INT NOT NULL,
			min_ts BIGINT UNSIGNED NOT NULL, key_count INT NOT NULL, entries LONGBLOB NOT NULL,
			PRIMARY KEY (changefeed, max_ts, schema_name, table_name, part))`,
		`CREATE TABLE ` + tbl(RangeTable) + ` (changefeed VARCHAR(128) NOT NULL PRIMARY KEY, since_ts BIGINT UNSIGNED NOT NULL)`,
		`CREATE TABLE ` + tbl(CheckpointTable) + ` (changefeed VARCHAR(128) NOT NULL PRIMARY KEY, applied_ts BIGINT UNSIGNED NOT NULL)`,
		`CREATE TABLE ` + tbl(TSMapTable) + ` (changefeed VARCHAR(128) NOT NULL, upstream_ts BIGINT UNSIGNED NOT NULL,
			downstream_pos TEXT NOT NULL, wall_time TIMESTAMP(6) NOT NULL, source VARCHAR(32) NOT NULL, PRIMARY KEY (changefeed, upstream_ts))`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.ExecContext(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	r := Reader{Q: db.DB, MetaSchema: schema, Changefeed: "cf", Timeout: 10 * time.Second}
	if _, err := r.Bounds(ctx); !errors.Is(err, ErrNoLedger) {
		t.Fatalf("Bounds without a ledger_range row: %v", err)
	}
	exec("INSERT INTO " + tbl(RangeTable) + " VALUES ('cf', 1000)")
	if _, err := r.Bounds(ctx); !errors.Is(err, ErrNoLedger) || !strings.Contains(err.Error(), "no checkpoint") {
		t.Fatalf("Bounds without a checkpoint: %v", err)
	}
	exec("INSERT INTO " + tbl(CheckpointTable) + " VALUES ('cf', 2000)")
	// 600 rounds at max_ts 1001..1600 (and one at 2500, not checkpointed): key i%50 of t
	// changed at the round's ts; other rows of table u and changefeed other in between.
	round := func(cf, table string, maxTs uint64, es ...Entry) {
		minTs := es[0].CommitTs
		for _, e := range es {
			minTs = min(minTs, e.CommitTs)
		}
		blob, err := Encode(Compact(es), minTs)
		if err != nil {
			t.Fatal(err)
		}
		exec("INSERT INTO "+tbl(Table)+" VALUES (?, ?, 's', ?, 0, ?, ?, ?)", cf, maxTs, table, minTs, len(es), blob)
	}
	for i := range 600 {
		ts := uint64(1001 + i)
		round("cf", "t", ts, Entry{key(t, int64(i%50)), ts}, Entry{key(t, int64(1000+i)), ts - 1})
		if i%3 == 0 {
			round("cf", "u", ts, Entry{key(t, int64(i)), ts})
			round("other", "t", ts, Entry{key(t, int64(-i)), ts})
		}
	}
	round("cf", "t", 2500, Entry{key(t, int64(7)), 2500})

	got, err := Read(ctx, r, "s", "t", 1000, 2000)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]uint64{}
	for i := range 600 {
		ts := uint64(1001 + i)
		want[key(t, int64(i%50)).String()] = ts
		if ts-1 > 1000 { // the first round's second key is at since_ts: outside
			want[key(t, int64(1000+i)).String()] = ts - 1
		}
	}
	if len(got) != len(want) {
		t.Fatalf("Read: %d keys, want %d", len(got), len(want))
	}
	for i, e := range got {
		if want[e.Key.String()] != e.CommitTs {
			t.Errorf("key %s: last change %d, want %d", e.Key, e.CommitTs, want[e.Key.String()])
		}
		if i > 0 && string(got[i-1].Key) >= string(e.Key) {
			t.Fatalf("Read not sorted at %d", i)
		}
	}
	// A window inside: only the changes in (1550, 1560].
	got, err = Read(ctx, r, "s", "t", 1550, 1560)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, e := range got {
		if e.CommitTs <= 1550 || e.CommitTs > 1560 {
			t.Errorf("key %s at %d outside (1550, 1560]", e.Key, e.CommitTs)
		}
		keys = append(keys, e.Key.String())
	}
	if len(got) != 20 { // 10 rounds × 2 keys, the first round's second key at 1550 excluded, 1561's at 1560 included
		t.Errorf("(1550, 1560]: %d keys %v, want 20", len(got), keys)
	}
	if got, err := Read(ctx, r, "s", "t", 1600, 1600); err != nil || len(got) != 0 {
		t.Errorf("an empty window: %v, %v", got, err)
	}
	for _, w := range [][2]uint64{{999, 1500}, {1000, 2001}, {1000, 2500}} {
		if _, err := Read(ctx, r, "s", "t", w[0], w[1]); !errors.Is(err, ErrNotCovered) || !strings.Contains(err.Error(), "s.t") {
			t.Errorf("window (%d, %d]: %v, want ErrNotCovered naming the table", w[0], w[1], err)
		}
	}

	// The caught-up point.
	now := time.Now()
	ts := func(d time.Duration) uint64 { return tso.FromTime(now.Add(d)) }
	if c, err := r.CaughtUp(ctx, 30*time.Second); err != nil || c != (CaughtUp{}) {
		t.Fatalf("empty ts-map: %+v, %v", c, err)
	}
	for _, row := range []struct {
		ts  uint64
		lag time.Duration
	}{{ts(-time.Hour), 10 * time.Minute}, {ts(-50 * time.Minute), time.Minute}, {ts(-40 * time.Minute), 20 * time.Second}, {ts(-30 * time.Minute), time.Second}} {
		exec("INSERT INTO "+tbl(TSMapTable)+" VALUES ('cf', ?, '', ?, 'interval')", row.ts, tso.Time(row.ts).Add(row.lag).UTC().Format("2006-01-02 15:04:05.000000"))
	}
	for _, c := range []struct {
		lag  time.Duration
		want CaughtUp
	}{
		{30 * time.Second, CaughtUp{Ts: ts(-40 * time.Minute), Found: true, Rows: 3, First: ts(-time.Hour)}},
		{time.Hour, CaughtUp{Ts: ts(-time.Hour), Found: true, Rows: 1, First: ts(-time.Hour)}},
		{100 * time.Millisecond, CaughtUp{Rows: 4, First: ts(-time.Hour)}},
	} {
		got, err := r.CaughtUp(ctx, c.lag)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("CaughtUp(%v) = %+v, %v; want %+v", c.lag, got, err, c.want)
		}
	}
	// The session's time zone does not move wall_time.
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "SET time_zone = '+08:00'"); err != nil {
		t.Fatal(err)
	}
	rz := r
	rz.Q = conn
	if got, err := rz.CaughtUp(ctx, 30*time.Second); err != nil || got.Ts != ts(-40*time.Minute) {
		t.Errorf("CaughtUp in another time zone: %+v, %v", got, err)
	}

}
