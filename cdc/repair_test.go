package cdc

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tidb-parity/parity/internal/metaschema"
	"github.com/tidb-parity/parity/internal/testenv"
)

// TestRepairKeys repairs keys through a running replicator whose changefeed renders
// TIMESTAMPs in +08:00, reading a TiDB without new collations (a general_ci key is
// binary there, case-insensitive in the fallback): a dry run writes nothing; then a
// differing row is replaced (its TIMESTAMP key given in UTC, as the checker reads it), a
// row TiDB lacks is deleted, an equal row is left alone, 'ABC' (extra) and 'abc'
// (missing) end as TiDB's 'abc' whichever comes first (the delete of 'ABC' must not take
// the 'abc' the repair just wrote), and a keyless table, a key that is not the handle, a
// table the changefeed writes elsewhere and a table TiDB lacks are refused; every key is
// recorded in the repairs table.
func TestRepairKeys(t *testing.T) {
	up := testenv.TiDBOldCollation(t)
	down := testenv.Downstream(t)
	f := newFeed(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := up.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, q := range []string{
		"SET time_zone = '+08:00'",
		"CREATE TABLE tk (t TIMESTAMP(3) NOT NULL PRIMARY KEY, v INT)",
		"INSERT INTO tk VALUES ('2024-01-01 08:00:00.125', 1), ('2024-01-01 09:00:00.000', 2)",
		"CREATE TABLE ci (k VARCHAR(10) COLLATE utf8mb4_general_ci NOT NULL PRIMARY KEY, v INT)",
		"INSERT INTO ci VALUES ('abc', 1), ('xyz', 2)",
		"CREATE TABLE kl (a INT, b INT)",
		"CREATE TABLE uk (id INT PRIMARY KEY, u INT NOT NULL, UNIQUE KEY (u))",
	} {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	dconn, err := down.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		"SET time_zone = '+08:00'",
		"CREATE TABLE tk (t TIMESTAMP(3) NOT NULL PRIMARY KEY, v INT)",
		"INSERT INTO tk VALUES ('2024-01-01 08:00:00.125', 100), ('2024-01-01 09:00:00.000', 2), ('2024-01-01 10:00:00.000', 3)",
		"CREATE TABLE ci (k VARCHAR(10) COLLATE utf8mb4_general_ci NOT NULL PRIMARY KEY, v INT)",
		"INSERT INTO ci VALUES ('ABC', 1), ('xyz', 2)",
		"CREATE TABLE kl (a INT, b INT)",
		"INSERT INTO kl VALUES (1, 1)",
		"CREATE TABLE uk (id INT PRIMARY KEY, u INT NOT NULL, UNIQUE KEY (u))",
	} {
		if _, err := dconn.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	dconn.Close()
	// The changefeed's ts are TiDB's: the repair reads TiDB at the applied checkpoint.
	f.ts = testenv.TiDBTSO(t, up.DB)
	ts := f.next()
	f.resolved(ts)
	cfg := testConfig(t, f, down)
	cfg.Upstream.DSN = up.Root
	cfg.Changefeed.TimeZone = "+08:00"
	cfg.Changefeed.SchemaMap = map[string]string{up.Name: down.Name}
	run := start(t, cfg, nil)
	run.wait(t, ts)

	s := up.Name
	keys := []RepairKey{
		{Schema: s, Table: "tk", Columns: []string{"t"}, Values: []any{"2024-01-01 00:00:00.125"}, Text: "t='00:00:00.125'"}, // 08:00:00.125 +08:00
		{Schema: s, Table: "tk", Columns: []string{"t"}, Values: []any{"2024-01-01 01:00:00.000"}, Text: "t='01:00'"},
		{Schema: s, Table: "tk", Columns: []string{"t"}, Values: []any{"2024-01-01 02:00:00.000"}, Text: "t='02:00'"},
		{Schema: s, Table: "ci", Columns: []string{"k"}, Values: []any{"abc"}, Text: "k='abc'"},
		{Schema: s, Table: "ci", Columns: []string{"k"}, Values: []any{"ABC"}, Text: "k='ABC'"},
		{Schema: s, Table: "kl", Columns: []string{"a", "b"}, Values: []any{int64(1), int64(1)}, Text: "a=1, b=1"},
		{Schema: s, Table: "uk", Columns: []string{"u"}, Values: []any{int64(7)}, Text: "u=7"},
		{Schema: s, Table: "ci", DownSchema: down.Name, DownTable: "ci_copy", Columns: []string{"k"}, Values: []any{"xyz"}, Text: "k='xyz'"},
		{Schema: s, Table: "gone", Columns: []string{"id"}, Values: []any{int64(1)}, Text: "id=1"},
	}
	want := []RepairAction{RepairUpsert, RepairUnchanged, RepairDelete, RepairUpsert, RepairUnchanged,
		RepairRefused, RepairRefused, RepairRefused, RepairRefused}
	reasons := map[int]string{5: "no primary key or NOT NULL unique key", 6: "not the table's handle key", 7: "the changefeed writes it to", 8: "TiDB has no table"}
	rows := func() []string {
		return append(dump(t, down.DB, down.Name, "tk"), dump(t, down.DB, down.Name, "ci")...)
	}
	before := rows()
	check := func(res RepairResult, dry bool) {
		t.Helper()
		if len(res.Outcomes) != len(keys) || res.DryRun != dry || res.Barriers != 1 {
			t.Fatalf("repair: %+v", res)
		}
		for i, o := range res.Outcomes {
			// 'ABC' after 'abc': TiDB (binary) has no 'ABC', and the fallback's only
			// row of that key is now the 'abc' just written: nothing to delete. In the
			// dry run nothing was written: the fallback's 'ABC' would be deleted.
			w := want[i]
			if dry && i == 4 {
				w = RepairDelete
			}
			if o.Action != w || o.TS < ts || o.Key.Text != keys[i].Text || !strings.Contains(o.Reason, reasons[i]) {
				t.Errorf("key %d (%s): %s %d %q, want %s %q", i, keys[i].Text, o.Action, o.TS, o.Reason, w, reasons[i])
			}
		}
	}
	dry, err := run.r.Repair(ctx, RepairRequest{RunID: "run1", Keys: keys, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	check(dry, true)
	equal(t, "rows after the dry run", rows(), before)

	res, err := run.r.Repair(ctx, RepairRequest{RunID: "run1", Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	check(res, false)
	if res.Upserted != 2 || res.Deleted != 1 || res.Unchanged != 2 || res.Refused != 4 {
		t.Fatalf("repair counts: %+v", res)
	}
	equal(t, "rows after the repair", rows(), []string{"2024-01-01 08:00:00.125|1", "2024-01-01 09:00:00.000|2", "abc|1", "xyz|2"})

	var n, refused int
	q := "SELECT COUNT(*), COALESCE(SUM(action = 'refused' AND reason <> ''), 0) FROM " + metaschema.Table(cfg.Applier.MetaSchema, RepairsTable) +
		" WHERE changefeed = ? AND repair_id = ? AND run_id = 'run1' AND repair_ts >= ?"
	if err := down.QueryRowContext(ctx, q, cfg.Changefeed.ID, res.ID, ts).Scan(&n, &refused); err != nil {
		t.Fatal(err)
	}
	if n != len(keys) || refused != 4 {
		t.Fatalf("repairs table: %d rows (%d refused with a reason), want %d (4)", n, refused, len(keys))
	}
}
