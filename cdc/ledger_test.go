package cdc

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/internal/ledger"
	"github.com/tidb-parity/parity/internal/metaschema"
	"github.com/tidb-parity/parity/internal/testenv"
)

// readLedger returns, per table, each key's latest commit ts recorded in the ledger at or
// below the changefeed's checkpoint (what a reader may trust), with the keys' text.
func readLedger(t *testing.T, cfg Config) (map[string]map[string]uint64, uint64) {
	t.Helper()
	db := testenv.Downstream(t).DB
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var applied uint64
	if err := db.QueryRowContext(ctx, "SELECT applied_ts FROM "+metaschema.Table(cfg.Applier.MetaSchema, "checkpoint")+" WHERE changefeed=?", cfg.Changefeed.ID).Scan(&applied); err != nil {
		t.Fatal(err)
	}
	rows, err := db.QueryContext(ctx, "SELECT schema_name, table_name, max_ts, min_ts, key_count, entries FROM "+
		metaschema.Table(cfg.Applier.MetaSchema, ledger.Table)+" WHERE changefeed=? AND max_ts<=?", cfg.Changefeed.ID, applied)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]map[string]uint64{}
	for rows.Next() {
		var schema, table string
		var maxTs, minTs uint64
		var n int
		var blob []byte
		if err := rows.Scan(&schema, &table, &maxTs, &minTs, &n, &blob); err != nil {
			t.Fatal(err)
		}
		es, err := ledger.Decode(blob, minTs)
		if err != nil {
			t.Fatal(err)
		}
		if len(es) != n {
			t.Fatalf("%s.%s: key_count %d, %d entries", schema, table, n, len(es))
		}
		if out[table] == nil {
			out[table] = map[string]uint64{}
		}
		for _, e := range es {
			if e.CommitTs < minTs || e.CommitTs > maxTs {
				t.Fatalf("%s: entry at %d outside [%d, %d]", table, e.CommitTs, minTs, maxTs)
			}
			k := e.Key.String()
			out[table][k] = max(out[table][k], e.CommitTs)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out, applied
}

// TestLedgerRecordsEveryAppliedKey: after inserts, updates, key changes and deletes in
// several rounds — one of them crashed after its rows and ledger but before its
// checkpoint, and replayed — the ledger holds every changed key of every keyed table,
// old and new keys of a key change, with the commit ts of its last change, and nothing
// for the keyless table; the ts-map holds the fallback's GTID position.
func TestLedgerRecordsEveryAppliedKey(t *testing.T) {
	down := testenv.Downstream(t)
	f := newFeed(t, 2)
	s := down.Name
	exec(t, down.DB, "CREATE TABLE kv (id BIGINT PRIMARY KEY, v BIGINT)")
	exec(t, down.DB, "CREATE TABLE ck (a BIGINT, b VARCHAR(16), v BIGINT, PRIMARY KEY (a, b))")
	exec(t, down.DB, "CREATE TABLE nokey (v BIGINT)")
	want := map[string]map[string]uint64{"kv": {}, "ck": {}}
	t1, t2, t3 := f.next(), f.next(), f.next()
	var evs []open.Event
	for id := int64(1); id <= 20; id++ {
		evs = append(evs, ins(t1, s, "kv", ci("id", id, pk), ci("v", id, 0)))
		want["kv"][fmt.Sprint(id)] = t1
	}
	evs = append(evs, ins(t1, s, "ck", ci("a", 1, pk), strCol("b", "x'y", pk), ci("v", 1, 0)),
		ins(t1, s, "nokey", ci("v", 1, 0)))
	want["ck"]["1, 'x''y'"] = t1
	f.rows(0, evs...)
	f.resolved(t1)
	f.rows(1,
		upd(t2, s, "kv", []open.Column{ci("id", 3, pk), ci("v", 3, 0)}, []open.Column{ci("id", 3, pk), ci("v", 30, 0)}),
		upd(t2, s, "kv", []open.Column{ci("id", 4, pk), ci("v", 4, 0)}, []open.Column{ci("id", 40, pk), ci("v", 4, 0)}), // key change
		del(t2, s, "kv", ci("id", 5, pk)), // handle-key-only delete
		ins(t2, s, "nokey", ci("v", 2, 0)),
	)
	want["kv"]["3"], want["kv"]["4"], want["kv"]["40"], want["kv"]["5"] = t2, t2, t2, t2
	f.resolved(t2)
	f.rows(0, del(t3, s, "ck", ci("a", 1, pk), strCol("b", "x'y", pk)), ins(t3, s, "kv", ci("id", 3, pk), ci("v", 33, 0)))
	want["ck"]["1, 'x''y'"] = t3
	want["kv"]["3"] = t3
	f.resolved(t3)

	cfg := testConfig(t, f, down)
	cfg.Applier.TSMapInterval = time.Second
	crashes := 0
	hooks := &testHooks{f: func(p hookPoint) error {
		if p == hookAfterRows && crashes == 0 {
			crashes++
			return fmt.Errorf("%w after the ledger", errCrash)
		}
		return nil
	}}
	run := start(t, cfg, hooks)
	if err := run.result(t); !errors.Is(err, errCrash) {
		t.Fatalf("first run: %v", err)
	}
	run = start(t, cfg, nil)
	run.wait(t, t3)
	if err := run.stop(t); err != nil {
		t.Fatal(err)
	}
	got, applied := readLedger(t, cfg)
	if applied != t3 {
		t.Fatalf("checkpoint %d, want %d", applied, t3)
	}
	if _, ok := got["nokey"]; ok {
		t.Fatalf("the keyless table is in the ledger: %v", got["nokey"])
	}
	for table, keys := range want {
		for k, ts := range keys {
			if got[table][k] != ts {
				t.Errorf("%s key %s: ledger says ts %d, want %d", table, k, got[table][k], ts)
			}
		}
		if len(got[table]) != len(keys) {
			t.Errorf("%s: ledger has %d keys, want %d: %v", table, len(got[table]), len(keys), got[table])
		}
	}
	// The ledger starts at the changefeed's start, moved up to the retention horizon
	// (7 days back) by pruning: before every change here.
	if since := ledgerSince(t, cfg); since < int64(cfg.Changefeed.StartTs) || since >= int64(t1) {
		t.Fatalf("ledger_range since %d, want between the start %d and the first change %d", since, cfg.Changefeed.StartTs, t1)
	}
	var pos string
	var ts uint64
	if err := down.DB.QueryRow("SELECT upstream_ts, downstream_pos FROM "+metaschema.Table(cfg.Applier.MetaSchema, "ts_map")+" WHERE changefeed=? ORDER BY upstream_ts DESC LIMIT 1", cfg.Changefeed.ID).Scan(&ts, &pos); err != nil {
		t.Fatalf("ts_map: %v", err)
	}
	if ts == 0 || ts > t3 || !strings.HasPrefix(pos, "mariadb-gtid:") {
		t.Fatalf("ts_map row (%d, %q)", ts, pos)
	}
}

// ledgerSince reads where the changefeed's ledger starts (-1: no ledger_range row).
func ledgerSince(t *testing.T, cfg Config) int64 {
	t.Helper()
	var since int64 = -1
	err := testenv.Downstream(t).DB.QueryRow("SELECT since_ts FROM "+metaschema.Table(cfg.Applier.MetaSchema, ledger.RangeTable)+" WHERE changefeed=?", cfg.Changefeed.ID).Scan(&since)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		t.Fatal(err)
	}
	return since
}

// TestLedgerOffThenOn: applier.ledger = false writes no ledger rows and no ledger_range
// (nothing a reader may trust); turned on later, the ledger starts at the checkpoint the
// applier starts from, and holds what it applies from there.
func TestLedgerOffThenOn(t *testing.T) {
	down := testenv.Downstream(t)
	f := newFeed(t, 1)
	exec(t, down.DB, "CREATE TABLE kv (id BIGINT PRIMARY KEY)")
	t1 := f.next()
	f.rows(0, ins(t1, down.Name, "kv", ci("id", 1, pk)))
	f.resolved(t1)
	cfg := testConfig(t, f, down)
	cfg.Applier.Ledger = false
	run := start(t, cfg, nil)
	run.wait(t, t1)
	if err := run.stop(t); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := down.DB.QueryRow("SELECT COUNT(*) FROM " + metaschema.Table(cfg.Applier.MetaSchema, ledger.Table)).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d ledger rows with the ledger off (%v)", n, err)
	}
	if since := ledgerSince(t, cfg); since != -1 {
		t.Fatalf("ledger_range since %d with the ledger off, want no row", since)
	}
	t2 := f.next()
	f.rows(0, ins(t2, down.Name, "kv", ci("id", 2, pk)))
	f.resolved(t2)
	cfg.Applier.Ledger = true
	run = start(t, cfg, nil)
	run.wait(t, t2)
	if err := run.stop(t); err != nil {
		t.Fatal(err)
	}
	if since := ledgerSince(t, cfg); since != int64(t1) {
		t.Fatalf("ledger_range since %d, want the checkpoint %d the ledger was turned on at", since, t1)
	}
	got, _ := readLedger(t, cfg)
	if len(got["kv"]) != 1 || got["kv"]["2"] != t2 {
		t.Fatalf("ledger after turning it on: %v, want only id 2 at %d", got["kv"], t2)
	}
}
