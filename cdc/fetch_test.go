package cdc

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/internal/testenv"
)

// TestRowFetcherSchemaChange completes handle-key-only events of a table that gains a
// column between them (TiDB): an event before the ALTER gets the old columns, one after
// it (past the DDL event in the stream) the new ones, and a re-delivered old event read
// after the new one gets the old columns again (the partition's table cache serves only
// events at or after the ts it was read at). A missing row is an error naming the table.
func TestRowFetcherSchemaChange(t *testing.T) {
	up := testenv.Upstream(t)
	ctx := context.Background()
	exec := func(q string) {
		t.Helper()
		if _, err := up.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec("CREATE TABLE big (id BIGINT PRIMARY KEY, v LONGTEXT)")
	exec("INSERT INTO big VALUES (1, 'one')")
	ts1 := testenv.TiDBTSO(t, up.DB)
	exec("ALTER TABLE big ADD COLUMN w INT NOT NULL DEFAULT 7")
	exec("UPDATE big SET v = 'uno' WHERE id = 1")
	ts2 := testenv.TiDBTSO(t, up.DB)

	cfg := DefaultConfig()
	cfg.Upstream.DSN = up.DSN
	var n counters
	f, err := newRowFetcher(cfg, slog.New(slog.DiscardHandler), &n)
	if err != nil {
		t.Fatal(err)
	}
	defer f.close()
	key := []open.Column{{Name: "id", Type: open.TypeLonglong, Flags: open.FlagHandleKey | open.FlagPrimaryKey | open.FlagBinary, Value: int64(1)}}
	row := func(op open.Op, ts uint64) open.Event {
		return open.Event{Kind: open.KindRow, Op: op, CommitTs: ts, Schema: up.Name, Table: "big", OnlyHandleKey: true,
			Columns: append([]open.Column(nil), key...)}
	}
	names := func(ev open.Event) string {
		var out []string
		for _, c := range ev.Columns {
			out = append(out, c.Name)
		}
		return strings.Join(out, ",")
	}
	cache := tableCache{}
	evs := []open.Event{
		row(open.OpInsert, ts1),
		{Kind: open.KindDDL, CommitTs: ts1 + 1, Schema: up.Name, Table: "big", Query: "ALTER TABLE big ADD COLUMN w INT NOT NULL DEFAULT 7"},
		row(open.OpUpdate, ts2),
		row(open.OpInsert, ts1), // a re-delivery after a TiCDC restart
	}
	if err := f.complete(ctx, evs, cache); err != nil {
		t.Fatal(err)
	}
	for i, want := range map[int]string{0: "id,v", 2: "id,v,w", 3: "id,v"} {
		if got := names(evs[i]); got != want || evs[i].OnlyHandleKey {
			t.Errorf("event %d: columns %s (only handle key %v), want %s", i, got, evs[i].OnlyHandleKey, want)
		}
	}
	if v := evs[2].Columns[1].Value; v != "uno" {
		t.Errorf("event 2: v = %v, want uno", v)
	}
	if v := evs[0].Columns[1].Value; v != "one" {
		t.Errorf("event 0: v = %v, want one", v)
	}
	if n.fetched.Load() != 3 {
		t.Errorf("%d rows counted, want 3", n.fetched.Load())
	}
	missing := []open.Event{row(open.OpInsert, ts2)}
	missing[0].Columns[0].Value = int64(2)
	err = f.complete(ctx, missing, cache)
	if err == nil || !strings.Contains(err.Error(), "big") || !strings.Contains(err.Error(), "row not found") {
		t.Errorf("missing row: %v", err)
	}
}
