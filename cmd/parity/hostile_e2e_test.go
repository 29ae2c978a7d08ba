package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/segmentio/kafka-go"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/testenv"
)

// hostileColumn is one column of a hostile table as the changefeed describes it.
type hostileColumn struct {
	name string
	tp   byte
	key  bool
}

// TestHostileIdentifiersEndToEnd (#20 item 6): a schema and two tables whose names hold a
// back-quote, single and double quotes, a dot, spaces, a reserved word and non-ASCII
// letters — one table name and one column name of the maximum 64 characters — with
// columns named likewise and values holding emoji, quotes, backslashes and SQL. Created
// in TiDB and changed there (inserts, updates, a key update, deletes, an ADD COLUMN in
// between); the same DDL and row events, as TiCDC's open protocol, go through real
// Kafka to `parity serve`, which applies them to the fallback; `parity diff` finds both
// sides equal; three divergences per table injected into the fallback are found, the
// fix SQL it writes is run on the fallback with the MySQL driver, and the next diff is
// equal again.
//
// Emoji (4-byte UTF-8) are in values only: TiDB accepts them in identifiers, MariaDB
// and MySQL do not (identifiers are limited to the BMP: Error 1300 "Invalid utf8mb4
// character string"), so such a table cannot exist on the fallback (docs/security.md).
func TestHostileIdentifiersEndToEnd(t *testing.T) {
	upRoot := testenv.Require(t, testenv.EnvUpstream)
	down := testenv.Downstream(t)
	broker := testenv.Kafka(t)
	topic := testenv.NewTopic(t, "hostile", 1)
	up, err := sql.Open("mysql", upRoot)
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	schema := "hx" + strings.TrimPrefix(testenv.UniqueName(""), "_") + " `q'\".select é"
	t1 := "t `q'\".from 中"
	t2 := "long `'\". select "
	t2 += strings.Repeat("x", 64-len([]rune(t2)))
	k2 := "k `'\". "
	k2 += strings.Repeat("y", 64-len([]rune(k2)))
	t.Cleanup(func() {
		for _, dsn := range []string{upRoot, down.Root} {
			if d, err := sql.Open("mysql", dsn); err == nil {
				_, _ = d.Exec("DROP DATABASE IF EXISTS " + ident.Quote(schema))
				d.Close()
			}
		}
	})
	q, tbl := ident.Quote, func(name string) string { return ident.Table(schema, name) }
	c1, w1, n1 := "c `'\". é", "where", "new `col'\". 中"
	cols := map[string][]hostileColumn{
		t1: {{"select", open.TypeLong, true}, {c1, open.TypeVarchar, false}, {w1, open.TypeLonglong, false}},
		t2: {{k2, open.TypeVarchar, true}, {"from", open.TypeLong, true}, {"v \"'`", open.TypeVarchar, false}},
	}

	conn, err := up.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var events []*open.Event
	startTs := testenv.TiDBTSO(t, up)
	ddl := func(table string, typ int, query string) {
		t.Helper()
		if _, err := conn.ExecContext(ctx, query); err != nil {
			t.Fatalf("TiDB: %s: %v", query, err)
		}
		events = append(events, &open.Event{Kind: open.KindDDL, CommitTs: testenv.TiDBTSO(t, up), Schema: schema, Table: table, DDLType: typ, Query: query})
	}
	// row makes a row event's columns from values by column name.
	row := func(table string, vals map[string]any) []open.Column {
		var out []open.Column
		for _, c := range cols[table] {
			col := open.Column{Name: c.name, Type: c.tp, Value: vals[c.name]}
			if c.tp != open.TypeVarchar {
				col.Flags |= open.FlagBinary
			}
			if c.key {
				col.Flags |= open.FlagPrimaryKey | open.FlagHandleKey
			} else {
				col.Flags |= open.FlagNullable
			}
			out = append(out, col)
		}
		return out
	}
	type change struct {
		table    string
		op       open.Op
		old, new map[string]any
	}
	// txn runs stmts in one TiDB transaction and records its row changes at its commit ts.
	txn := func(stmts []string, changes []change) {
		t.Helper()
		if _, err := conn.ExecContext(ctx, "BEGIN"); err != nil {
			t.Fatal(err)
		}
		for _, s := range stmts {
			if _, err := conn.ExecContext(ctx, s); err != nil {
				t.Fatalf("TiDB: %s: %v", s, err)
			}
		}
		if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
			t.Fatal(err)
		}
		var info string
		if err := conn.QueryRowContext(ctx, "SELECT @@tidb_last_txn_info").Scan(&info); err != nil {
			t.Fatal(err)
		}
		var last struct {
			CommitTS uint64 `json:"commit_ts"`
		}
		if err := json.Unmarshal([]byte(info), &last); err != nil || last.CommitTS == 0 {
			t.Fatalf("tidb_last_txn_info %q: %v", info, err)
		}
		for _, c := range changes {
			ev := &open.Event{Kind: open.KindRow, CommitTs: last.CommitTS, Schema: schema, Table: c.table, Op: c.op}
			switch c.op {
			case open.OpDelete:
				ev.Columns = row(c.table, c.old)
			case open.OpUpdate:
				ev.Columns, ev.OldColumns = row(c.table, c.new), row(c.table, c.old)
			default:
				ev.Columns = row(c.table, c.new)
			}
			events = append(events, ev)
		}
	}
	ins := func(table string, vals map[string]any) string {
		var names, values []string
		for _, c := range cols[table] {
			if v, ok := vals[c.name]; ok {
				names = append(names, q(c.name))
				values = append(values, sqlLiteral(v))
			}
		}
		return "INSERT INTO " + tbl(table) + " (" + strings.Join(names, ", ") + ") VALUES (" + strings.Join(values, ", ") + ")"
	}

	ddl("", 1, "CREATE DATABASE "+q(schema))
	ddl(t1, 3, fmt.Sprintf("CREATE TABLE %s (%s INT NOT NULL, %s VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL, %s BIGINT NULL, PRIMARY KEY (%s))",
		tbl(t1), q("select"), q(c1), q(w1), q("select")))
	ddl(t2, 3, fmt.Sprintf("CREATE TABLE %s (%s VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, %s INT NOT NULL, %s VARCHAR(100) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL, PRIMARY KEY (%s, %s))",
		tbl(t2), q(k2), q("from"), q("v \"'`"), q(k2), q("from")))
	values := []string{"emoji 😀🎉 here", `it's "q" ` + "`b`", `back\slash \\ \'`, "'); DROP TABLE x; -- ", "中文 é ü", ""}
	r1 := func(id int64, i int) map[string]any {
		return map[string]any{"select": id, c1: values[i%len(values)], w1: id * 1000}
	}
	r2 := func(k string, from int64, v string) map[string]any {
		return map[string]any{k2: k, "from": from, "v \"'`": v}
	}
	var stmts []string
	var changes []change
	for i := int64(1); i <= 8; i++ {
		stmts = append(stmts, ins(t1, r1(i, int(i))))
		changes = append(changes, change{table: t1, op: open.OpInsert, new: r1(i, int(i))})
	}
	keys2 := []string{"a`b", `q'"`, "😀 key", "sp ace.dot", `\`}
	for i, k := range keys2 {
		stmts = append(stmts, ins(t2, r2(k, int64(i), values[i])))
		changes = append(changes, change{table: t2, op: open.OpInsert, new: r2(k, int64(i), values[i])})
	}
	txn(stmts, changes)

	// A column added mid-stream; later row events carry it.
	ddl(t1, 5, fmt.Sprintf("ALTER TABLE %s ADD COLUMN %s VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL DEFAULT 'd''ef'", tbl(t1), q(n1)))
	cols[t1] = append(cols[t1], hostileColumn{n1, open.TypeVarchar, false})
	with := func(m map[string]any, k string, v any) map[string]any {
		out := map[string]any{}
		for a, b := range m {
			out[a] = b
		}
		out[k] = v
		return out
	}
	cur := func(id int64) map[string]any { return with(r1(id, int(id)), n1, "d'ef") }
	txn([]string{
		"UPDATE " + tbl(t1) + " SET " + q(c1) + " = 'upd 😀 ''x''', " + q(n1) + " = 'n\"1' WHERE " + q("select") + " = 2",
		"UPDATE " + tbl(t2) + " SET " + q("v \"'`") + " = 'v2 🎉' WHERE " + q(k2) + " = 'a`b' AND " + q("from") + " = 0",
		"DELETE FROM " + tbl(t1) + " WHERE " + q("select") + " = 3",
		"UPDATE " + tbl(t1) + " SET " + q("select") + " = 40 WHERE " + q("select") + " = 4",
		"DELETE FROM " + tbl(t2) + " WHERE " + q(k2) + " = 'sp ace.dot'",
		ins(t1, with(r1(9, 0), n1, "nine 😀")),
	}, []change{
		{table: t1, op: open.OpUpdate, old: cur(2), new: with(with(cur(2), c1, "upd 😀 'x'"), n1, `n"1`)},
		{table: t2, op: open.OpUpdate, old: r2("a`b", 0, values[0]), new: r2("a`b", 0, "v2 🎉")},
		{table: t1, op: open.OpDelete, old: cur(3)},
		// TiCDC splits a key update into a delete and an insert.
		{table: t1, op: open.OpDelete, old: cur(4)},
		{table: t1, op: open.OpInsert, new: with(cur(4), "select", int64(40))},
		{table: t2, op: open.OpDelete, old: r2("sp ace.dot", 3, values[3])},
		{table: t1, op: open.OpInsert, new: with(r1(9, 0), n1, "nine 😀")},
	})
	endTs := testenv.TiDBTSO(t, up)

	// The changefeed: every event in commit-ts order on the topic's one partition.
	enc, err := open.NewEncoder(open.EncoderConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []kafka.Message
	flush := func() {
		for _, m := range enc.Build() {
			msgs = append(msgs, kafka.Message{Key: m.Key, Value: m.Value})
		}
	}
	for _, ev := range events {
		if ev.Kind == open.KindDDL {
			flush()
			m, err := enc.EncodeDDL(ev)
			if err != nil {
				t.Fatal(err)
			}
			msgs = append(msgs, kafka.Message{Key: m.Key, Value: m.Value})
			continue
		}
		if err := enc.AppendRow(ev); err != nil {
			t.Fatal(err)
		}
	}
	flush()
	res := enc.EncodeResolved(endTs)
	msgs = append(msgs, kafka.Message{Key: res.Key, Value: res.Value})
	kc, err := kafka.DialLeader(ctx, "tcp", broker, topic, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kc.WriteMessages(msgs...); err != nil {
		t.Fatal(err)
	}
	kc.Close()

	cfg := verifyServeConfig(t, "hostile", upRoot, down, broker, topic, "x", startTs)
	cfg.Verify.Enabled, cfg.Verify.Tables = false, nil
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	srv := runServeInTest(t, ctx, cfg)
	defer srv.Close()
	srv.WaitApplied(endTs)

	// parity diff over the schema: its pattern escapes wildcards and matches the dot with
	// '?' (patterns split at dots).
	pattern := strings.NewReplacer("*", `\*`, "?", `\?`, "[", `\[`, "]", `\]`, `\`, `\\`, ".", "?").Replace(schema) + ".*"
	out := t.TempDir()
	dcfg := filepath.Join(out, "diff.toml")
	meta := testenv.UniqueName("pmd")
	t.Cleanup(func() { _, _ = down.Exec("DROP DATABASE IF EXISTS " + ident.Quote(meta)) })
	if err := os.WriteFile(dcfg, []byte(fmt.Sprintf("tables = [%q]\nmeta-schema = %q\n[upstream]\ndsn = %q\n[downstream]\ndsn = %q\n", pattern, meta, upRoot, down.Root)), 0o600); err != nil {
		t.Fatal(err)
	}
	diff := func(want int, output string) string {
		t.Helper()
		args := []string{"diff", "--config", dcfg}
		if output != "" {
			args = append(args, "--output", output)
		}
		code, stdout, stderr := runCLI(t, args...)
		if code != want {
			t.Fatalf("parity diff: exit %d, want %d\n%s\n%s", code, want, stdout, stderr)
		}
		for _, name := range []string{schema + "." + t1, schema + "." + t2} {
			if !strings.Contains(stdout, name+":") {
				t.Fatalf("parity diff did not compare %s:\n%s", name, stdout)
			}
		}
		return stdout
	}
	t.Logf("equal after replication:\n%s", diff(0, ""))

	// Divergences in the fallback: a changed, a missing and an extra row per table.
	for _, s := range []string{
		"UPDATE " + tbl(t1) + " SET " + q(n1) + " = 'diverged' WHERE " + q("select") + " = 2",
		"DELETE FROM " + tbl(t1) + " WHERE " + q("select") + " = 5",
		"INSERT INTO " + tbl(t1) + " (" + q("select") + ", " + q(c1) + ") VALUES (77, 'extra 😀')",
		"UPDATE " + tbl(t2) + " SET " + q("v \"'`") + " = 'diverged' WHERE " + q(k2) + " = '😀 key'",
		"DELETE FROM " + tbl(t2) + " WHERE " + q(k2) + " = 'q''\"'",
		"INSERT INTO " + tbl(t2) + " VALUES ('extra`''\"', 9, 'x')",
	} {
		if _, err := down.Exec(s); err != nil {
			t.Fatalf("fallback: %s: %v", s, err)
		}
	}
	report := filepath.Join(out, "report")
	found := diff(1, report)
	fixes, err := filepath.Glob(filepath.Join(report, "fix", "*.sql"))
	if err != nil || len(fixes) != 2 {
		t.Fatalf("fix SQL files %v (%v), want one per table\n%s", fixes, err, found)
	}
	mc, err := mysql.ParseDSN(down.Root)
	if err != nil {
		t.Fatal(err)
	}
	mc.MultiStatements = true
	fixDB, err := sql.Open("mysql", mc.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer fixDB.Close()
	for _, f := range fixes {
		text, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := fixDB.ExecContext(ctx, string(text)); err != nil {
			t.Fatalf("running %s on the fallback: %v\n%s", f, err, text)
		}
	}
	t.Logf("differences found and fixed:\n%s", found)
	diff(0, "")
}

// sqlLiteral writes v as a SQL literal for TiDB (strings with quotes and backslashes
// escaped, as under the default sql_mode).
func sqlLiteral(v any) string {
	switch v := v.(type) {
	case nil:
		return "NULL"
	case string:
		return "'" + strings.NewReplacer(`\`, `\\`, "'", "''").Replace(v) + "'"
	default:
		return fmt.Sprint(v)
	}
}
