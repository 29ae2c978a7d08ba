package cdc

import (
	"context"
	"database/sql"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/internal/ident"
)

func TestAppendLoadField(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"plain", "plain"},
		{"a\tb", `a\tb`},
		{"a\nb\r", `a\nb\r`},
		{`back\slash`, `back\\slash`},
		{"nul\x00", `nul\0`},
		{`\N`, `\\N`},
		{"NULL", "NULL"},
		{"'\"", "'\""},
		{"é🎉", "é🎉"},
	} {
		if got := string(appendLoadField(nil, tc.in)); got != tc.want {
			t.Errorf("appendLoadField(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	rows := [][]open.Column{
		{ci("id", -1, pk), cs("s", nil), {Name: "u", Value: uint64(1 << 63)}},
		{ci("id", 2, pk), cs("s", "x\ty"), {Name: "u", Value: nil}},
	}
	if got, want := string(appendLoadData(nil, rows)), "-1\t\\N\t9223372036854775808\n2\tx\\ty\t\\N\n"; got != want {
		t.Errorf("appendLoadData = %q, want %q", got, want)
	}
}

// TestAppendLoadFieldReference compares appendLoadField with the plainest escaper over
// random strings dense in the bytes around the escaped ones, at every alignment.
func TestAppendLoadFieldReference(t *testing.T) {
	ref := func(s string) string {
		var b strings.Builder
		for i := 0; i < len(s); i++ {
			switch c := s[i]; c {
			case '\\':
				b.WriteString(`\\`)
			case '\t':
				b.WriteString(`\t`)
			case '\n':
				b.WriteString(`\n`)
			case '\r':
				b.WriteString(`\r`)
			case 0:
				b.WriteString(`\0`)
			default:
				b.WriteByte(c)
			}
		}
		return b.String()
	}
	alphabet := []byte{0, 1, '\t', '\n', '\r', 0x1f, ' ', '!', '[', '\\', ']', 'a', 0x7f, 0x80, 0xdc, 0xff}
	r := rand.New(rand.NewPCG(1, 2))
	for n := 0; n < 20000; n++ {
		b := make([]byte, r.IntN(40))
		for i := range b {
			b[i] = 'x'
			if r.IntN(8) == 0 {
				b[i] = alphabet[r.IntN(len(alphabet))]
			}
		}
		if got, want := string(appendLoadField([]byte("p"), string(b))), "p"+ref(string(b)); got != want {
			t.Fatalf("appendLoadField(%q) = %q, want %q", b, got, want)
		}
	}
}

func TestLoadColumnsAndValues(t *testing.T) {
	info := &tableInfo{exists: true, loadable: map[string]bool{"id": true, "s": true, "y": false}}
	trig := &tableInfo{exists: true, triggers: true, loadable: info.loadable}
	row := []open.Column{ci("id", 1, pk), cs("s", "x")}
	for _, tc := range []struct {
		name string
		info *tableInfo
		mode writeMode
		cols []open.Column
		want bool
	}{
		{"upsert", info, modeUpsert, row, true},
		{"replace", info, modeReplace, row, true},
		{"keyless insert", info, modeInsert, row, false},
		{"no downstream table", nil, modeUpsert, row, false},
		{"missing table", &tableInfo{}, modeUpsert, row, false},
		{"YEAR column", info, modeUpsert, []open.Column{ci("id", 1, pk), ci("y", 0, 0)}, false},
		{"column unknown downstream", info, modeUpsert, []open.Column{ci("id", 1, pk), cs("z", "x")}, false},
		{"upsert with triggers", trig, modeUpsert, row, false},
		{"replace with triggers", trig, modeReplace, row, true},
	} {
		if got := loadColumns(tc.info, tc.mode, tc.cols); got != tc.want {
			t.Errorf("%s: loadColumns = %t, want %t", tc.name, got, tc.want)
		}
	}
	for _, tc := range []struct {
		v    any
		want bool
	}{{nil, true}, {int64(1), true}, {uint64(1), true}, {"s", true}, {1.5, false}, {[]byte("b"), false}} {
		if got := loadValues([]open.Column{{Name: "c", Value: tc.v}}); got != tc.want {
			t.Errorf("loadValues(%T) = %t, want %t", tc.v, got, tc.want)
		}
	}
}

// loadTypesDDL is a table of every column type LOAD DATA writes.
const loadTypesDDL = `(id BIGINT NOT NULL PRIMARY KEY, s VARCHAR(64) NULL, c CHAR(16) NULL, tx TEXT NULL,
	d DECIMAL(20,6) NULL, dt DATETIME(6) NULL, ts TIMESTAMP(3) NULL, tm TIME(3) NULL, da DATE NULL,
	u BIGINT UNSIGNED NULL, ti TINYINT NULL, KEY (s))`

func loadTypesRow(id int64, s, c, tx, d, dt, ts, tm, da any, u any, ti any) []open.Column {
	str := func(name string, typ byte, v any) open.Column {
		return open.Column{Name: name, Type: typ, Flags: open.FlagNullable, Value: v}
	}
	return []open.Column{
		ci("id", id, pk), str("s", open.TypeVarchar, s), str("c", open.TypeString, c), str("tx", open.TypeBlob, tx),
		str("d", open.TypeNewDecimal, d), str("dt", open.TypeDatetime, dt), str("ts", open.TypeTimestamp, ts),
		str("tm", open.TypeDuration, tm), str("da", open.TypeDate, da),
		{Name: "u", Type: open.TypeLonglong, Flags: open.FlagNullable | open.FlagUnsigned | open.FlagBinary, Value: u},
		{Name: "ti", Type: open.TypeTiny, Flags: open.FlagNullable | open.FlagBinary, Value: ti},
	}
}

// comLoad is the server's count of LOAD DATA statements.
func comLoad(t *testing.T, db *sql.DB) int64 {
	t.Helper()
	var name string
	var n int64
	if err := db.QueryRow("SHOW GLOBAL STATUS LIKE 'Com_load'").Scan(&name, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestLoadDataEqualsInsert applies the same changefeed (inserts, a row written again,
// an update moving a row's key, deletes) to two tables of the real fallback, one with
// LOAD DATA and one with INSERT statements, values chosen to trip an escaper: the tables
// must end equal, NULLs and bytes alike, and hold exactly what the events said.
func TestLoadDataEqualsInsert(t *testing.T) {
	k := newKeylessRig(t)
	s := k.down.Name
	ctx := context.Background()
	on, err := localInfile(ctx, k.down.DB)
	if err != nil {
		t.Fatal(err)
	}
	if !on {
		t.Fatal("the test fallback's local_infile is OFF; scripts/env starts MariaDB with its default (ON)")
	}
	k.cfg.Applier.LoadRows = 3
	for _, tb := range []string{"via_load", "via_insert"} {
		exec(t, k.down.DB, "CREATE TABLE "+ident.Table(s, tb)+" "+loadTypesDDL)
	}
	tricky := []string{"a\tb", "line\nbreak", `back\slash`, "nul\x00byte", `\N`, "NULL", "", "cr\rx", "end\t", "'q\"", "é🎉", `\t`, "\\", " pad "}
	rows := func(tb string, base uint64) []open.Event {
		var evs []open.Event
		ts := base + 10
		for i, v := range tricky {
			evs = append(evs, ins(ts, s, tb, loadTypesRow(int64(i+1), v, v, v, "-12.345600", "2024-02-29 23:59:59.123456",
				"2038-01-19 03:14:07.999", "-838:59:59.000", "1000-01-01", uint64(18446744073709551615), int64(-128))...))
		}
		evs = append(evs, ins(ts, s, tb, loadTypesRow(100, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil)...))
		ts = base + 20
		// Written again (replaces), the key moved, deleted.
		evs = append(evs, ins(ts, s, tb, loadTypesRow(1, "again", "x", "y", "1", "2000-01-01 00:00:00", nil, "00:00:01", "2000-01-01", uint64(0), int64(127))...))
		old := loadTypesRow(2, tricky[1], tricky[1], tricky[1], "-12.345600", "2024-02-29 23:59:59.123456", "2038-01-19 03:14:07.999", "-838:59:59.000", "1000-01-01", uint64(18446744073709551615), int64(-128))
		evs = append(evs, upd(ts, s, tb, old, loadTypesRow(200, "moved", nil, nil, nil, nil, nil, nil, nil, nil, nil)))
		evs = append(evs, del(ts, s, tb, ci("id", 3, pk)))
		return evs
	}
	before := comLoad(t, k.down.DB)
	p := k.start(rows("via_load", 0)...)
	p.ap.load = true
	p.round(20, true)
	loads := p.ap.ctr.loads.Load()
	if loads < 5 { // 15 rows in loads of at most 3, and the rows written again
		t.Fatalf("%d LOAD DATA statements committed, want at least 5", loads)
	}
	if n := comLoad(t, k.down.DB) - before; n < loads {
		t.Fatalf("the server counted %d LOAD DATA statements, the applier %d", n, loads)
	}
	p = k.start(rows("via_insert", 100)...)
	p.ap.load = false
	p.round(120, true)
	if n := p.ap.ctr.loads.Load(); n != 0 {
		t.Fatalf("applier.load-data off: %d LOAD DATA statements", n)
	}

	cols := "id, s, c, tx, d, dt, ts, tm, da, u, ti"
	var diff int
	q := fmt.Sprintf(`SELECT COUNT(*) FROM %[1]s a LEFT JOIN %[2]s b ON a.id=b.id AND a.s <=> b.s AND BINARY a.s <=> BINARY b.s AND a.c <=> b.c AND BINARY a.tx <=> BINARY b.tx AND
		a.d <=> b.d AND a.dt <=> b.dt AND a.ts <=> b.ts AND a.tm <=> b.tm AND a.da <=> b.da AND a.u <=> b.u AND a.ti <=> b.ti WHERE b.id IS NULL`,
		ident.Table(s, "via_load"), ident.Table(s, "via_insert"))
	if err := k.down.DB.QueryRow(q).Scan(&diff); err != nil {
		t.Fatal(err)
	}
	gotLoad, gotInsert := dumpNullSafe(t, k.down.DB, s, "via_load", cols), dumpNullSafe(t, k.down.DB, s, "via_insert", cols)
	if diff != 0 {
		t.Fatalf("%d row(s) of via_load differ from via_insert:\nload   %q\ninsert %q", diff, gotLoad, gotInsert)
	}
	equal(t, "via_load against via_insert", gotLoad, gotInsert)
	// What the events said, read back exactly.
	var strs []string
	if err := func() error {
		rs, err := k.down.DB.Query("SELECT id, s, tx FROM " + ident.Table(s, "via_load") + " WHERE id BETWEEN 4 AND 99 ORDER BY id")
		if err != nil {
			return err
		}
		defer rs.Close()
		for rs.Next() {
			var id int64
			var sv, tx sql.NullString
			if err := rs.Scan(&id, &sv, &tx); err != nil {
				return err
			}
			if !sv.Valid || sv.String != tricky[id-1] || tx.String != tricky[id-1] {
				return fmt.Errorf("row %d holds %q / %q, want %q", id, sv.String, tx.String, tricky[id-1])
			}
			strs = append(strs, sv.String)
		}
		return rs.Err()
	}(); err != nil {
		t.Fatal(err)
	}
	if len(strs) != len(tricky)-3 {
		t.Fatalf("rows 4..%d: %d read back", len(tricky), len(strs))
	}
	want := []string{
		"1|again|x|y|1.000000|2000-01-01 00:00:00.000000|NULL|00:00:01.000|2000-01-01|0|127",
		"100|NULL|NULL|NULL|NULL|NULL|NULL|NULL|NULL|NULL|NULL",
		"200|moved|NULL|NULL|NULL|NULL|NULL|NULL|NULL|NULL|NULL",
	}
	for _, w := range want {
		if !slices.Contains(gotLoad, w) {
			t.Errorf("via_load lacks %q:\n%q", w, gotLoad)
		}
	}
	for _, gone := range []string{"2|", "3|"} {
		for _, r := range gotLoad {
			if strings.HasPrefix(r, gone) {
				t.Errorf("via_load still holds %q", r)
			}
		}
	}
}

// dumpNullSafe lists a table's rows with NULL apart from the text "NULL" (\N) and
// strings in hex.
func dumpNullSafe(t *testing.T, db *sql.DB, schema, table, cols string) []string {
	t.Helper()
	var exprs []string
	for _, c := range strings.Split(cols, ", ") {
		switch c {
		case "s", "c", "tx":
			exprs = append(exprs, fmt.Sprintf("IF(%[1]s IS NULL, 'NULL', CONCAT('0x', HEX(%[1]s)))", c))
		default:
			exprs = append(exprs, fmt.Sprintf("IFNULL(%s, 'NULL')", c))
		}
	}
	rs, err := db.Query("SELECT CONCAT_WS('|', " + strings.Join(exprs, ", ") + ") FROM " + ident.Table(schema, table) + " ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	var out []string
	for rs.Next() {
		var r string
		if err := rs.Scan(&r); err != nil {
			t.Fatal(err)
		}
		// Back from hex for the rows the test names by their text.
		out = append(out, unhexRow(r))
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// unhexRow writes the hex strings of a dumpNullSafe row as text when they are printable.
func unhexRow(r string) string {
	parts := strings.Split(r, "|")
	for i, p := range parts {
		if !strings.HasPrefix(p, "0x") {
			continue
		}
		b, err := hex.DecodeString(p[2:])
		if err != nil {
			continue
		}
		printable := true
		for _, c := range b {
			if c < 0x20 || c == '\\' || c == '|' {
				printable = false
			}
		}
		if printable {
			parts[i] = string(b)
		}
	}
	return strings.Join(parts, "|")
}

// TestLoadDataWarningsFallBackToInsert: under a non-strict sql_mode a value too long for
// its column is truncated with a warning, by LOAD DATA and INSERT alike. The worker sees
// the load's warning, rolls the transaction back and writes it again with INSERT (the
// rows end as INSERT leaves them), and the table is written with INSERT from then on.
// Under the strict mode the load fails as the INSERT would, naming the table.
func TestLoadDataWarningsFallBackToInsert(t *testing.T) {
	k := newKeylessRig(t)
	s := k.down.Name
	exec(t, k.down.DB, "CREATE TABLE "+ident.Table(s, "short")+" (id BIGINT NOT NULL PRIMARY KEY, v VARCHAR(4) NULL)")
	evs := []open.Event{
		ins(10, s, "short", ci("id", 1, pk), cs("v", "ok")),
		ins(10, s, "short", ci("id", 2, pk), cs("v", "much too long")),
	}
	db, err := openDB("downstream", k.down.Root, map[string]string{"time_zone": "'+00:00'", "sql_mode": "''"}, 5)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	p := k.start(evs...)
	p.ap = newApplier(db, k.meta, k.cfg, slog.New(slog.NewTextHandler(testWriter{t}, nil)), nil, p.saved.tableProgress, nil)
	p.ap.load = true
	before := comLoad(t, k.down.DB)
	p.round(10, true)
	if comLoad(t, k.down.DB) == before {
		t.Fatal("no LOAD DATA statement ran")
	}
	equal(t, "short after the fallback to INSERT", dump(t, k.down.DB, s, "short"), []string{"1|ok", "2|much"})
	info, err := p.ap.tables.get(context.Background(), s, "short")
	if err != nil {
		t.Fatal(err)
	}
	if !info.noLoad.Load() {
		t.Fatal("the table is still loaded after its load left warnings")
	}
	if n := p.ap.ctr.loadFallbacks.Load(); n != 1 {
		t.Fatalf("%d load fallbacks counted, want 1", n)
	}

	// Strict: the load's own error, as INSERT's would be.
	exec(t, k.down.DB, "CREATE TABLE "+ident.Table(s, "strict")+" (id BIGINT NOT NULL PRIMARY KEY, v VARCHAR(4) NULL)")
	p = k.start(ins(30, s, "strict", ci("id", 1, pk), cs("v", "much too long")))
	p.ap.load = true
	_, err = p.ap.applyRows(context.Background(), p.buf, 30)
	if err == nil || !strings.Contains(err.Error(), "strict") || !strings.Contains(err.Error(), "Data too long") {
		t.Fatalf("strict mode, a value too long: %v; want the table named and the server's error", err)
	}
}

// TestLoadDataSkipsTablesWithTriggers: a fallback table with a DELETE trigger is written
// with INSERT ... ON DUPLICATE KEY UPDATE (REPLACE would fire the trigger on every row
// written again), while a table beside it without triggers is loaded in the same round.
func TestLoadDataSkipsTablesWithTriggers(t *testing.T) {
	k := newKeylessRig(t)
	s := k.down.Name
	exec(t, k.down.DB, "CREATE TABLE "+ident.Table(s, "trig")+" (id BIGINT NOT NULL PRIMARY KEY, v VARCHAR(16) NULL)")
	exec(t, k.down.DB, "CREATE TABLE "+ident.Table(s, "plain")+" (id BIGINT NOT NULL PRIMARY KEY, v VARCHAR(16) NULL)")
	exec(t, k.down.DB, "CREATE TABLE "+ident.Table(s, "audit")+" (id BIGINT NOT NULL)")
	exec(t, k.down.DB, "CREATE TRIGGER "+ident.Table(s, "trig_del")+" AFTER DELETE ON "+ident.Table(s, "trig")+
		" FOR EACH ROW INSERT INTO "+ident.Table(s, "audit")+" (id) VALUES (OLD.id)")
	exec(t, k.down.DB, "INSERT INTO "+ident.Table(s, "trig")+" VALUES (1, 'old')")
	info, err := loadTableInfo(context.Background(), k.down.DB, s, "trig")
	if err != nil {
		t.Fatal(err)
	}
	if !info.triggers {
		t.Fatal("the table's trigger was not seen")
	}
	p := k.start(
		ins(10, s, "trig", ci("id", 1, pk), cs("v", "new")),
		ins(10, s, "trig", ci("id", 2, pk), cs("v", "two")),
		ins(10, s, "plain", ci("id", 1, pk), cs("v", "p")),
	)
	p.ap.load = true
	p.round(10, true)
	equal(t, "trig", dump(t, k.down.DB, s, "trig"), []string{"1|new", "2|two"})
	equal(t, "plain", dump(t, k.down.DB, s, "plain"), []string{"1|p"})
	equal(t, "audit (rows the trigger saw deleted)", dump(t, k.down.DB, s, "audit"), nil)
	if n := p.ap.ctr.loads.Load(); n != 1 {
		t.Fatalf("%d LOAD DATA statements, want 1 (plain's)", n)
	}
}
