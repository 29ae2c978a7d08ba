package cdc

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/testenv"
)

// TestUndecodableRecordStopsAtItsOffset: without dead-lettering the replicator applies
// everything before the bad record, stops with an error naming topic, partition and
// offset, and keeps the resume offset at (not past) it. With dead-lettering the record is
// copied to the meta schema and replication continues.
func TestUndecodableRecordStopsAtItsOffset(t *testing.T) {
	down := testenv.Downstream(t)
	f := newFeed(t, 1)
	s := down.Name
	exec(t, down.DB, "CREATE TABLE kv (id BIGINT PRIMARY KEY, v VARCHAR(32))")
	t1, t2 := f.next(), f.next()
	f.rows(0, ins(t1, s, "kv", ci("id", 1, pk), cs("v", "a")))                       // offset 0
	f.resolved(t1)                                                                   // offset 1
	f.write(0, kafka.Message{Key: []byte("not open protocol"), Value: []byte("{}")}) // offset 2
	f.rows(0, ins(t2, s, "kv", ci("id", 2, pk), cs("v", "b")))                       // offset 3
	f.resolved(t2)                                                                   // offset 4

	cfg := testConfig(t, f, down)
	run := start(t, cfg, nil)
	err := run.result(t)
	var re *RecordError
	if !errors.As(err, &re) || re.Topic != f.topic || re.Partition != 0 || re.Offset != 2 {
		t.Fatalf("error %v: want a RecordError at %s/0 offset 2", err, f.topic)
	}
	for _, want := range []string{"topic " + f.topic, "partition 0", "offset 2"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	var de *open.DecodeError
	if !errors.As(err, &de) {
		t.Errorf("error %v does not wrap the codec's DecodeError", err)
	}
	equal(t, "kv before the bad record", dump(t, down.DB, s, "kv"), []string{"1|a"})
	metaOffset := func() int64 {
		var off int64
		if err := down.QueryRow("SELECT next_offset FROM " + ident.Quote(cfg.Applier.MetaSchema) + ".partition_offset").Scan(&off); err != nil {
			t.Fatal(err)
		}
		return off
	}
	if off := metaOffset(); off > 2 {
		t.Fatalf("resume offset %d is past the undecodable record at 2", off)
	}

	// Restarting without dead-lettering stops at the same record again.
	run = start(t, cfg, nil)
	if err := run.result(t); !errors.As(err, &re) || re.Offset != 2 {
		t.Fatalf("second run: %v", err)
	}

	cfg.Applier.DeadLetter = true
	run = start(t, cfg, nil)
	run.wait(t, t2)
	equal(t, "kv after dead-lettering", dump(t, down.DB, s, "kv"), []string{"1|a", "2|b"})
	var n int
	var key []byte
	var msg string
	if err := down.QueryRow("SELECT COUNT(*), MAX(record_key), MAX(error) FROM "+ident.Quote(cfg.Applier.MetaSchema)+
		".dead_letter WHERE kafka_offset=2 AND kafka_partition=0 AND topic=?", f.topic).Scan(&n, &key, &msg); err != nil {
		t.Fatal(err)
	}
	if n != 1 || string(key) != "not open protocol" || !strings.Contains(msg, "offset 2") {
		t.Fatalf("dead letter: %d rows, key %q, error %q", n, key, msg)
	}
	if st := run.r.Status(); st.DeadLetters != 1 || st.DecodeErrors != 1 {
		t.Fatalf("status: %d dead letters, %d decode errors; want 1 and 1", st.DeadLetters, st.DecodeErrors)
	}
	if off := metaOffset(); off != 5 {
		t.Fatalf("resume offset %d after applying everything, want 5", off)
	}
}

// TestDDLAtItsBarrier: a DDL broadcast to every partition runs once, after every row
// before it and before every row after it; TiDB-only syntax is stripped; a DDL that
// arrives after the resolved ts equal to its commit ts still runs before newer rows;
// TiDB-only DDLs are skipped; a DDL MySQL rejects stops the applier naming it.
func TestDDLAtItsBarrier(t *testing.T) {
	down := testenv.Downstream(t)
	f := newFeed(t, 2)
	s := down.Name
	exec(t, down.DB, "CREATE TABLE kv (id BIGINT PRIMARY KEY, v VARCHAR(32))")
	t1, t2, t3, t4, t5, t6, t7 := f.next(), f.next(), f.next(), f.next(), f.next(), f.next(), f.next()

	f.rows(0, ins(t1, s, "kv", ci("id", 1, pk), cs("v", "a")))
	f.rows(1, ins(t1, s, "kv", ci("id", 2, pk), cs("v", "b")))
	f.ddl(t2, s, "ar", "CREATE TABLE `ar` (`id` BIGINT NOT NULL AUTO_RANDOM(5), `v` VARCHAR(10), "+
		"PRIMARY KEY (`id`) /*T![clustered_index] CLUSTERED */) SHARD_ROW_ID_BITS = 4 PRE_SPLIT_REGIONS = 2 "+
		"/*T! PLACEMENT POLICY=`p1` */ COMMENT='AUTO_RANDOM stays in strings'", 3)
	f.rows(0, ins(t3, s, "ar", ci("id", 7, pk), cs("v", "x")))
	f.resolved(t3)
	// The resolved ts t4 arrives before the DDL with commit ts t4 (TiCDC allows this).
	f.resolved(t4)
	f.ddl(t4, s, "kv", "ALTER TABLE `kv` ADD COLUMN `w` BIGINT", 5)
	f.rows(1, ins(t5, s, "kv", ci("id", 3, pk), cs("v", "c"), ci("w", 9, open.FlagNullable)))
	f.ddl(t6, s, "kv", "ALTER TABLE `kv` SET TIFLASH REPLICA 1", 30)
	f.resolved(t6)

	cfg := testConfig(t, f, down)
	run := start(t, cfg, nil)
	run.wait(t, t6)
	equal(t, "kv", dump(t, down.DB, s, "kv"), []string{"1|a|NULL", "2|b|NULL", "3|c|9"})
	equal(t, "ar", dump(t, down.DB, s, "ar"), []string{"7|x"})
	var create string
	if err := down.QueryRow("SHOW CREATE TABLE "+ident.Table(s, "ar")).Scan(new(string), &create); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(create, "AUTO_RANDOM stays in strings") {
		t.Errorf("translation touched a string literal: %s", create)
	}
	var n int
	if err := down.QueryRow("SELECT COUNT(*) FROM " + ident.Quote(cfg.Applier.MetaSchema) + ".ddl_applied").Scan(&n); err != nil || n != 3 {
		t.Fatalf("ddl_applied has %d rows (%v), want 3 (each DDL once despite 2 partitions)", n, err)
	}
	if st := run.r.Status(); st.DDLsApplied != 3 || st.PendingDDLs != 0 {
		t.Fatalf("status: %+v", st)
	}

	// MariaDB 10.11 has no expression indexes (a VECTOR column is mapped to LONGTEXT now:
	// TestVectorTypeMapAndSkipDDL).
	const bad = "ALTER TABLE `kv` ADD INDEX `ix`((`id` + 1))"
	f.ddl(t7, s, "kv", bad, 7)
	f.resolved(t7)
	err := run.result(t)
	if err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), fmt.Sprintf("applier.skip-ddl]] commit-ts = %d", t7)) {
		t.Fatalf("rejected DDL: %v, want an error naming %q and the skip-ddl setting", err, bad)
	}
	if st := run.r.Status(); st.AppliedTs != t6 {
		t.Fatalf("applied %d after the rejected DDL, want %d", st.AppliedTs, t6)
	}
}

// TestBarrierHoldsDownstreamExactlyAtTs: Barrier(T) runs its function when every row
// <= T is committed and nothing newer is applied, then replication resumes.
func TestBarrierHoldsDownstreamExactlyAtTs(t *testing.T) {
	down := testenv.Downstream(t)
	f := newFeed(t, 2)
	s := down.Name
	exec(t, down.DB, "CREATE TABLE kv (id BIGINT PRIMARY KEY, v VARCHAR(32))")
	var ts []uint64
	for i := 0; i < 6; i++ {
		ts = append(ts, f.next())
	}
	f.rows(0, ins(ts[0], s, "kv", ci("id", 1, pk), cs("v", "a")))
	f.resolved(ts[0])
	cfg := testConfig(t, f, down)
	run := start(t, cfg, nil)
	run.wait(t, ts[0])

	barrier := ts[3] // not itself a resolved ts: the applier cuts the round there
	type result struct {
		rows    []string
		applied uint64
		err     error
	}
	got := make(chan result, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	go func() {
		var res result
		res.err = run.r.Barrier(ctx, barrier, func(context.Context) error {
			res.rows = dump(t, down.DB, s, "kv")
			res.applied = run.r.Status().AppliedTs
			return nil
		})
		got <- res
	}()
	deadline := time.Now().Add(30 * time.Second)
	for run.r.Status().Barriers != 1 {
		if time.Now().After(deadline) {
			t.Fatal("barrier was not registered")
		}
		time.Sleep(10 * time.Millisecond)
	}
	passed := run.r.AppliedNotify(ts[5])
	for i := 1; i < 6; i++ {
		f.rows(i%2, ins(ts[i], s, "kv", ci("id", int64(i+1), pk), cs("v", fmt.Sprint("r", i))))
		if i == 1 {
			f.rows(0, upd(ts[i], s, "kv", []open.Column{ci("id", 1, pk), cs("v", "a")}, []open.Column{ci("id", 1, pk), cs("v", "a1")}))
		}
		if i == 4 {
			f.rows(0, del(ts[i], s, "kv", ci("id", 1, pk), cs("v", "a1")))
		}
	}
	f.resolved(ts[5])
	res := <-got
	if res.err != nil {
		t.Fatal(res.err)
	}
	equal(t, "rows at the barrier", res.rows, []string{"1|a1", "2|r1", "3|r2", "4|r3"})
	if res.applied != barrier {
		t.Fatalf("applied checkpoint at the barrier %d, want %d", res.applied, barrier)
	}
	select {
	case <-passed:
	case <-time.After(60 * time.Second):
		t.Fatal("no notification that the checkpoint passed the last resolved ts")
	}
	equal(t, "rows after resuming", dump(t, down.DB, s, "kv"), []string{"2|r1", "3|r2", "4|r3", "5|r4", "6|r5"})
	if st := run.r.Status(); st.RowsInserted != 6 || st.RowsUpdated != 1 || st.RowsDeleted != 1 || st.RowsApplied != 8 ||
		st.Rounds.Count < 2 || st.Rounds.Counts[len(st.Rounds.Counts)-1] > st.Rounds.Count {
		t.Fatalf("status counts %d inserted, %d updated, %d deleted, %d applied, %d rounds; want 6, 1, 1, 8, at least 2",
			st.RowsInserted, st.RowsUpdated, st.RowsDeleted, st.RowsApplied, st.Rounds.Count)
	}
	if err := run.r.Barrier(ctx, ts[2], func(context.Context) error { return nil }); !errors.Is(err, ErrBarrierPassed) {
		t.Fatalf("barrier in the past: %v, want ErrBarrierPassed", err)
	}
	fnErr := errors.New("snapshot failed")
	if err := run.r.Barrier(ctx, ts[5], func(context.Context) error { return fnErr }); !errors.Is(err, fnErr) {
		t.Fatalf("barrier at the checkpoint: %v, want fn's error", err)
	}
}

// TestLargeTransactionSpillsToDisk: one upstream transaction far larger than the memory
// bound waits on disk and is applied completely.
func TestLargeTransactionSpillsToDisk(t *testing.T) {
	down := testenv.Downstream(t)
	f := newFeed(t, 2)
	s := down.Name
	exec(t, down.DB, "CREATE TABLE big (id BIGINT PRIMARY KEY, v VARCHAR(64))")
	exec(t, down.DB, "CREATE TABLE bag (a BIGINT, v VARCHAR(64))")
	const n, m = 20000, 2000
	tx, after := f.next(), f.next()
	cfg := testConfig(t, f, down)
	cfg.Applier.MemoryBytes = 256 << 10
	cfg.Applier.BatchRows = 200
	run := start(t, cfg, nil)

	var evs []open.Event
	for i := 0; i < n; i++ {
		evs = append(evs, ins(tx, s, "big", ci("id", int64(i), pk), cs("v", strings.Repeat("x", 40))))
	}
	f.enc, _ = open.NewEncoder(open.EncoderConfig{MaxBatchSize: 16})
	f.rows(0, evs...)
	evs = evs[:0]
	for i := 0; i < m; i++ {
		evs = append(evs, ins(tx, s, "bag", ci("a", int64(i%10), 0), cs("v", "dup")))
	}
	f.rows(1, evs...)
	f.rows(1, ins(after, s, "big", ci("id", -1, pk), cs("v", "after")))
	deadline := time.Now().Add(60 * time.Second)
	var st Status
	for st = run.r.Status(); st.BufferedRows < n+m+1; st = run.r.Status() {
		if time.Now().After(deadline) {
			t.Fatalf("rows not buffered: %+v", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st.SpilledRows < n/2 || st.BufferedBytes > cfg.Applier.MemoryBytes {
		t.Fatalf("expected most rows spilled and memory within the bound: %+v", st)
	}
	f.resolved(tx)
	run.wait(t, tx)
	var cnt, sum int64
	if err := down.QueryRow("SELECT COUNT(*), SUM(id) FROM "+ident.Table(s, "big")).Scan(&cnt, &sum); err != nil {
		t.Fatal(err)
	}
	if cnt != n || sum != int64(n)*(n-1)/2 {
		t.Fatalf("big: %d rows, sum %d", cnt, sum)
	}
	if err := down.QueryRow("SELECT COUNT(*) FROM " + ident.Table(s, "bag")).Scan(&cnt); err != nil || cnt != m {
		t.Fatalf("bag: %d rows (%v), want %d", cnt, err, m)
	}
	if st = run.r.Status(); st.BufferedRows != 1 {
		t.Fatalf("after the round only the row after the resolved ts should remain: %+v", st)
	}
	f.resolved(after)
	run.wait(t, after)
	if st = run.r.Status(); st.BufferedRows != 0 || st.SpilledRows != 0 {
		t.Fatalf("rows left after the last round: %+v", st)
	}
	files, _ := os.ReadDir(cfg.Applier.SpillDir)
	if len(files) != 0 {
		t.Fatalf("spill files left after release: %d", len(files))
	}
}

// TestReplaysAreJudgedByWhatIsApplied: TiCDC re-delivers old rows (older commit ts at
// newer offsets) and stale resolved ts; rows at or below the applied checkpoint are
// dropped, newer duplicates collapse, and an older version re-delivered after a newer
// one does not win.
func TestReplaysAreJudgedByWhatIsApplied(t *testing.T) {
	down := testenv.Downstream(t)
	f := newFeed(t, 2)
	s := down.Name
	exec(t, down.DB, "CREATE TABLE kv (id BIGINT PRIMARY KEY, v VARCHAR(32))")
	t1, t2, t3, t4 := f.next(), f.next(), f.next(), f.next()
	f.rows(0, ins(t1, s, "kv", ci("id", 1, pk), cs("v", "a")))
	f.rows(0, upd(t2, s, "kv", []open.Column{ci("id", 1, pk), cs("v", "a")}, []open.Column{ci("id", 1, pk), cs("v", "b")}))
	f.resolved(t2)
	cfg := testConfig(t, f, down)
	run := start(t, cfg, nil)
	run.wait(t, t2)

	// Replay from an old offset: t1's insert again, and a stale resolved.
	f.rows(0, ins(t1, s, "kv", ci("id", 1, pk), cs("v", "a")))
	f.resolved(t1)
	// Not yet applied: t3, then t4, then a replay of t3 at a newer offset.
	f.rows(1, ins(t3, s, "kv", ci("id", 2, pk), cs("v", "x")))
	f.rows(1, upd(t4, s, "kv", []open.Column{ci("id", 2, pk), cs("v", "x")}, []open.Column{ci("id", 2, pk), cs("v", "y")}))
	f.rows(1, ins(t3, s, "kv", ci("id", 2, pk), cs("v", "x")))
	f.rows(0, ins(t3, s, "kv", ci("id", 3, pk), cs("v", "z")))
	f.rows(0, ins(t3, s, "kv", ci("id", 3, pk), cs("v", "z")))
	f.resolved(t4)
	run.wait(t, t4)
	equal(t, "kv", dump(t, down.DB, s, "kv"), []string{"1|b", "2|y", "3|z"})
}

// TestUniqueKeysBesidesTheHandle: a table with a unique key besides its primary key is
// applied with REPLACE so a stale holder of a unique value is evicted, and converges
// when the round is replayed after a crash.
func TestUniqueKeysBesidesTheHandle(t *testing.T) {
	down := testenv.Downstream(t)
	f := newFeed(t, 2)
	s := down.Name
	exec(t, down.DB, "CREATE TABLE uk (id BIGINT PRIMARY KEY, u BIGINT NOT NULL, UNIQUE KEY (u))")
	const ukf = open.FlagUniqueKey
	t1, t2, t3 := f.next(), f.next(), f.next()
	f.rows(0,
		ins(t1, s, "uk", ci("id", 1, pk), ci("u", 10, ukf)),
		ins(t1, s, "uk", ci("id", 2, pk), ci("u", 20, ukf)),
	)
	f.resolved(t1)
	// Swap the unique values through a third, then give 10 to a new row.
	f.rows(1,
		upd(t2, s, "uk", []open.Column{ci("id", 1, pk), ci("u", 10, ukf)}, []open.Column{ci("id", 1, pk), ci("u", 30, ukf)}),
		upd(t2, s, "uk", []open.Column{ci("id", 2, pk), ci("u", 20, ukf)}, []open.Column{ci("id", 2, pk), ci("u", 10, ukf)}),
		upd(t3, s, "uk", []open.Column{ci("id", 1, pk), ci("u", 30, ukf)}, []open.Column{ci("id", 1, pk), ci("u", 20, ukf)}),
		ins(t3, s, "uk", ci("id", 3, pk), ci("u", 30, ukf)),
	)
	f.resolved(t3)
	cfg := testConfig(t, f, down)
	run := start(t, cfg, crashAt(hookAfterRows))
	if err := run.result(t); !errors.Is(err, errCrash) {
		t.Fatalf("first run: %v", err)
	}
	run = start(t, cfg, crashAt(hookAfterRows))
	if err := run.result(t); !errors.Is(err, errCrash) {
		t.Fatalf("second run: %v", err)
	}
	run = start(t, cfg, nil)
	run.wait(t, t3)
	equal(t, "uk", dump(t, down.DB, s, "uk"), []string{"1|20", "2|10", "3|30"})
}

// TestKeylessReplayInsideARound: TiCDC re-delivers a keyless table's transactions before
// they were applied; the re-delivered run is dropped while genuine duplicate rows of one
// transaction are kept, and a first delivery cut short is completed by the replay.
func TestKeylessReplayInsideARound(t *testing.T) {
	down := testenv.Downstream(t)
	f := newFeed(t, 2)
	s := down.Name
	exec(t, down.DB, "CREATE TABLE nk (a BIGINT, b VARCHAR(32))")
	t1, t2, t3 := f.next(), f.next(), f.next()
	a := ins(t1, s, "nk", ci("a", 1, 0), cs("b", "dup"))
	b := ins(t2, s, "nk", ci("a", 2, 0), cs("b", "two"))
	c1 := ins(t3, s, "nk", ci("a", 3, 0), cs("b", "x"))
	c2 := ins(t3, s, "nk", ci("a", 3, 0), cs("b", "y"))
	f.rows(0, a, a, b)
	f.resolved(t1) // only partition 0 gets it: nothing is applied yet
	f.rows(0, c1)  // first delivery of t3 cut short
	// TiCDC restarts and replays from its checkpoint (t1 already acked): t2, t3 again.
	f.rows(0, b, c1, c2)
	f.resolved(t3)
	cfg := testConfig(t, f, down)
	run := start(t, cfg, nil)
	run.wait(t, t3)
	equal(t, "nk", dump(t, down.DB, s, "nk"), []string{"1|dup", "1|dup", "2|two", "3|x", "3|y"})
	if st := run.r.Status(); st.RowsInserted != 5 || st.RowsApplied != 5 {
		t.Fatalf("status counts %d rows inserted, %d applied; want 5 (a keyless table's replays are not applied)", st.RowsInserted, st.RowsApplied)
	}
}

// TestValueTypesTimeZoneAndGeneratedColumns: every value kind the codec produces binds
// without loss, TIMESTAMP text is read in the changefeed's time zone, and generated
// columns are never written.
func TestValueTypesTimeZoneAndGeneratedColumns(t *testing.T) {
	down := testenv.Downstream(t)
	f := newFeed(t, 1)
	s := down.Name
	exec(t, down.DB, "CREATE TABLE ty (id BIGINT UNSIGNED PRIMARY KEY, ts TIMESTAMP(3) NULL, dt DATETIME, d DECIMAL(20,6), "+
		"fl FLOAT, db DOUBLE, bin VARBINARY(8), bl BLOB, tx TEXT, e ENUM('a','b','c'), st SET('x','y','z'), bt BIT(10), "+
		"j JSON, n VARCHAR(5), g VARCHAR(20) AS (CONCAT(e, '-g')) STORED)")
	t1 := f.next()
	cols := []open.Column{
		{Name: "id", Type: open.TypeLonglong, Flags: pk | open.FlagUnsigned, Value: uint64(math.MaxUint64)},
		{Name: "ts", Type: open.TypeTimestamp, Value: "2024-01-01 08:00:00.125"},
		{Name: "dt", Type: open.TypeDatetime, Value: "2024-01-01 08:00:00"},
		{Name: "d", Type: open.TypeNewDecimal, Value: "-12345678901234.123456"},
		{Name: "fl", Type: open.TypeFloat, Value: float64(float32(1.1))},
		{Name: "db", Type: open.TypeDouble, Value: 2.2250738585072014e-308},
		{Name: "bin", Type: open.TypeVarchar, Flags: open.FlagBinary, Value: []byte{0, 'a', 0xff}},
		{Name: "bl", Type: open.TypeBlob, Flags: open.FlagBinary, Value: []byte("\x00blob")},
		{Name: "tx", Type: open.TypeBlob, Value: "tëxt"},
		{Name: "e", Type: open.TypeEnum, Value: uint64(2)},
		{Name: "st", Type: open.TypeSet, Value: uint64(5)},
		{Name: "bt", Type: open.TypeBit, Value: uint64(682)},
		{Name: "j", Type: open.TypeJSON, Value: `{"k": [1, 2]}`},
		{Name: "n", Type: open.TypeVarchar, Flags: open.FlagNullable, Value: nil},
		{Name: "g", Type: open.TypeLonglong, Flags: open.FlagGenerated, Value: int64(12345)},
	}
	f.rows(0, open.Event{Kind: open.KindRow, CommitTs: t1, Schema: s, Table: "ty", Op: open.OpInsert, Columns: cols})
	f.resolved(t1)
	cfg := testConfig(t, f, down)
	cfg.Changefeed.TimeZone = "+08:00"
	cfg.Applier.SQLMode = "STRICT_TRANS_TABLES,NO_ENGINE_SUBSTITUTION"
	run := start(t, cfg, nil)
	run.wait(t, t1)
	var unix, dt, d, bin, bl, tx, e, st, j string
	var fl float32
	var db float64
	var bt uint64
	var n *string
	var g string
	err := down.QueryRow("SELECT UNIX_TIMESTAMP(ts), dt, d, fl, db, HEX(bin), HEX(bl), tx, e, st, bt+0, j, n, CAST(g AS CHAR) FROM "+
		ident.Table(s, "ty")+" WHERE id = 18446744073709551615").Scan(&unix, &dt, &d, &fl, &db, &bin, &bl, &tx, &e, &st, &bt, &j, &n, &g)
	if err != nil {
		t.Fatal(err)
	}
	got := []any{unix, dt, d, fl, db, bin, bl, tx, e, st, bt, j, n, g}
	want := []any{"1704067200.125", "2024-01-01 08:00:00", "-12345678901234.123456", float32(1.1), 2.2250738585072014e-308,
		"0061FF", "00626C6F62", "tëxt", "b", "x,z", uint64(682), `{"k": [1, 2]}`, (*string)(nil), "b-g"}
	for i := range want {
		if !reflect.DeepEqual(got[i], want[i]) {
			t.Errorf("column %d: got %#v, want %#v", i, got[i], want[i])
		}
	}
}

// TestDownstreamErrors: a statement blocked by a lock past the query timeout is retried
// until the lock goes away; an error that retrying cannot fix stops the replicator with
// an error naming the table.
func TestDownstreamErrors(t *testing.T) {
	down := testenv.Downstream(t)
	f := newFeed(t, 1)
	s := down.Name
	exec(t, down.DB, "CREATE TABLE kv (id BIGINT PRIMARY KEY, v VARCHAR(32))")
	exec(t, down.DB, "INSERT INTO kv VALUES (1, 'locked')")
	ctx := context.Background()
	lock, err := down.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock.ExecContext(ctx, "SELECT * FROM kv WHERE id=1 FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	t1, t2 := f.next(), f.next()
	f.rows(0, upd(t1, s, "kv", []open.Column{ci("id", 1, pk), cs("v", "locked")}, []open.Column{ci("id", 1, pk), cs("v", "free")}))
	f.resolved(t1)
	cfg := testConfig(t, f, down)
	cfg.Applier.QueryTimeout = 300 * time.Millisecond
	run := start(t, cfg, nil)
	time.Sleep(1500 * time.Millisecond)
	if st := run.r.Status(); st.AppliedTs == t1 {
		t.Fatal("applied through a held lock")
	}
	if err := lock.Rollback(); err != nil {
		t.Fatal(err)
	}
	run.wait(t, t1)
	equal(t, "kv", dump(t, down.DB, s, "kv"), []string{"1|free"})
	if st := run.r.Status(); st.DownstreamRetries == 0 || st.RowsUpdated != 1 {
		t.Fatalf("status counts %d downstream retries, %d rows updated; want some retries (a held lock) and 1", st.DownstreamRetries, st.RowsUpdated)
	}

	f.rows(0, ins(t2, s, "missing", ci("id", 1, pk)))
	f.resolved(t2)
	err = run.result(t)
	if err == nil || !strings.Contains(err.Error(), "`missing`") || !strings.Contains(err.Error(), "1146") {
		t.Fatalf("missing table: %v", err)
	}
}

// TestStartTsSkipsWhatTheImportHolds: at the first start the checkpoint is
// changefeed.start-ts; events at or below it are already in the fallback.
func TestStartTsSkipsWhatTheImportHolds(t *testing.T) {
	down := testenv.Downstream(t)
	f := newFeed(t, 1)
	s := down.Name
	exec(t, down.DB, "CREATE TABLE kv (id BIGINT PRIMARY KEY, v VARCHAR(32))")
	exec(t, down.DB, "INSERT INTO kv VALUES (1, 'imported')")
	t1, t2 := f.next(), f.next()
	f.rows(0, ins(t1, s, "kv", ci("id", 1, pk), cs("v", "before import")), ins(t2, s, "kv", ci("id", 2, pk), cs("v", "after")))
	f.resolved(t2)
	cfg := testConfig(t, f, down)
	cfg.Changefeed.StartTs = t1
	run := start(t, cfg, nil)
	run.wait(t, t2)
	equal(t, "kv", dump(t, down.DB, s, "kv"), []string{"1|imported", "2|after"})
}
