package checker

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/tidb-parity/parity/internal/ident"
)

// tortureColumns: every MySQL type, with a typical non-NULL value.
var tortureColumns = []struct{ name, def, typical string }{
	{"ti", "TINYINT", "-128"},
	{"b1", "TINYINT(1)", "1"},
	{"su", "SMALLINT UNSIGNED", "65535"},
	{"mi", "MEDIUMINT", "-8388608"},
	{"i", "INT", "2147483647"},
	{"bi", "BIGINT", "-9223372036854775808"},
	{"bu", "BIGINT UNSIGNED", "18446744073709551615"},
	{"dc", "DECIMAL(30,6)", "123456789012345678.123456"},
	{"dz", "DECIMAL(5,0)", "-99999"},
	{"f", "FLOAT", "1.2345678"},
	{"d", "DOUBLE", "0.1e0+0.2e0"},
	{"bt", "BIT(10)", "b'1010101010'"},
	{"dt", "DATE", "'2024-02-29'"},
	{"dtm", "DATETIME(6)", "'9999-12-31 23:59:59.999999'"},
	{"ts", "TIMESTAMP(3) NULL", "'2020-06-01 00:00:00.123'"},
	{"tm", "TIME(2)", "'-838:59:59.00'"},
	{"yr", "YEAR", "2155"},
	{"ch", "CHAR(10)", "'abc'"},
	{"vc", "VARCHAR(40) COLLATE utf8mb4_general_ci", "'Hello World'"},
	{"vb", "VARCHAR(40) COLLATE utf8mb4_bin", "'trailing  '"},
	{"emo", "VARCHAR(20) CHARACTER SET utf8mb4", "'😀 ünï'"},
	{"lat", "VARCHAR(20) CHARACTER SET latin1", "'café'"},
	{"bin", "BINARY(4)", "X'00FF0010'"},
	{"vbin", "VARBINARY(20)", "X'000102FF'"},
	{"tt", "TINYTEXT", "'a,b'"},
	{"tx", "TEXT", "'NULL'"},
	{"mt", "MEDIUMTEXT", "''"},
	{"lt", "LONGTEXT", "'line1\\nline2'"},
	{"tb", "TINYBLOB", "X'00'"},
	{"bl", "BLOB", "X'DEADBEEF'"},
	{"mb", "MEDIUMBLOB", "''"},
	{"lb", "LONGBLOB", "X'FF'"},
	{"en", "ENUM('a','b','c')", "'b'"},
	{"st", "SET('x','y','z')", "'x,z'"},
	{"js", "JSON", `'{"b": [1, 2.5, "s"], "a": {"y": null, "x": true}}'`},
}

// tortureEqual are rows whose downstream spelling differs but whose data is equal.
var tortureEqualVariants = []struct{ col, up, down string }{
	{"js", `'{"b":1,"a":[1,2.0]}'`, `'{ "a" : [1, 2.0],  "b" : 1 }'`},
	{"f", "-0.0", "0.0"},
	{"d", "-0.0e0", "0e0"},
	{"dc", "1.5", "1.500000"},
	{"ch", "'pad'", "'pad   '"}, // CHAR strips trailing spaces on both sides
	{"dtm", "'0000-00-00 00:00:00'", "'0000-00-00 00:00:00.000000'"},
	{"dt", "'0000-00-00'", "'0000-00-00'"},
	{"d", "1e308", "1.0e308"},
	{"f", "3.4e38", "3.40e38"},
	{"bt", "0", "b'0'"},
}

// tortureChanges are single-cell changes applied downstream; each must be reported as
// exactly that row and column.
var tortureChanges = []struct{ col, down string }{
	{"ti", "127"}, {"b1", "0"}, {"su", "NULL"}, {"mi", "0"}, {"i", "2147483646"},
	{"bi", "-9223372036854775807"}, {"bu", "18446744073709551614"},
	{"dc", "123456789012345678.123457"}, {"dz", "99999"},
	{"f", "1.2345"}, {"d", "0.30000000000001e0"}, {"bt", "b'1010101011'"},
	{"dt", "'2024-02-28'"}, {"dtm", "'9999-12-31 23:59:59.999998'"}, {"ts", "'2020-06-01 00:00:01.123'"},
	{"tm", "'838:59:59.00'"}, {"yr", "2154"},
	{"ch", "'abd'"}, {"vc", "'hello world'"}, {"vb", "'trailing '"}, {"emo", "'😁 ünï'"},
	{"lat", "'cafe'"}, {"bin", "X'00FF0011'"}, {"vbin", "X'000102'"},
	{"tt", "'a;b'"}, {"tx", "NULL"}, {"mt", "NULL"}, {"lt", "'line1\\nline2 '"},
	{"tb", "''"}, {"bl", "X'DEADBEEE'"}, {"mb", "NULL"}, {"lb", "X'FF00'"},
	{"en", "'c'"}, {"st", "'x,y,z'"}, {"js", `'{"b": [1, 2.5, "s"], "a": {"y": null, "x": false}}'`},
}

func tortureDDL() string {
	var cols []string
	for _, c := range tortureColumns {
		cols = append(cols, ident.Quote(c.name)+" "+c.def)
	}
	return "CREATE TABLE torture (id INT PRIMARY KEY, " + strings.Join(cols, ", ") + ")"
}

func tortureInsert(id int, override map[string]string, allNull bool) string {
	vals := []string{fmt.Sprint(id)}
	for _, c := range tortureColumns {
		v := c.typical
		if allNull {
			v = "NULL"
		}
		if o, ok := override[c.name]; ok {
			v = o
		}
		vals = append(vals, v)
	}
	return "INSERT INTO torture VALUES (" + strings.Join(vals, ", ") + ")"
}

// execSession runs statements on one connection with the given session settings.
func execSession(t *testing.T, p *pair, up bool, setup string, stmts ...string) {
	t.Helper()
	db := p.down.DB
	if up {
		db = p.up.DB
	}
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, s := range append([]string{setup}, stmts...) {
		if _, err := conn.ExecContext(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

func testTorture(t *testing.T, p pair, mod ...func(*Config)) {
	p.both(t, tortureDDL())
	var up, down []string
	add := func(id int, upO, downO map[string]string, allNull bool) {
		up = append(up, tortureInsert(id, upO, allNull))
		if downO != nil {
			down = append(down, tortureInsert(id, downO, allNull))
		}
	}
	add(1, nil, map[string]string{}, false)
	add(2, nil, map[string]string{}, true) // all NULL
	empty := map[string]string{"ch": "''", "vc": "''", "vb": "''", "emo": "''", "lat": "''", "vbin": "''", "tt": "''", "tx": "''", "lt": "''", "tb": "''", "bl": "''", "lb": "''", "st": "''", "js": "'\"\"'", "bin": "''"}
	add(3, empty, empty, false)
	nullStr := map[string]string{"ch": "'NULL'", "vc": "'NULL'", "vb": "'N'", "tt": "'NULL'", "tx": "'\\\\N'", "js": "'null'"}
	add(4, nullStr, nullStr, false)
	for i, v := range tortureEqualVariants {
		add(100+i, map[string]string{v.col: v.up}, map[string]string{v.col: v.down}, false)
	}
	for i, c := range tortureChanges {
		add(200+i, nil, map[string]string{c.col: c.down}, false)
	}
	add(300, nil, nil, false)                           // missing downstream
	down = append(down, tortureInsert(301, nil, false)) // extra downstream

	// TIMESTAMP written in different session time zones, the same instant.
	execSession(t, &p, true, "SET SESSION sql_mode = '', time_zone = '+00:00'", up...)
	execSession(t, &p, false, "SET SESSION sql_mode = '', time_zone = '+00:00'", down...)
	execSession(t, &p, true, "SET SESSION sql_mode = '', time_zone = '+08:00'", "INSERT INTO torture (id, ts) VALUES (5, '2021-03-04 13:00:00.5')")
	execSession(t, &p, false, "SET SESSION sql_mode = '', time_zone = '-05:00'", "INSERT INTO torture (id, ts) VALUES (5, '2021-03-04 00:00:00.5')")

	cfg := p.config(t, "torture")
	for _, m := range mod {
		m(&cfg)
	}
	rep := run(t, cfg)
	tr := tableReport(t, rep, "torture")
	if !tr.StructureEqual {
		t.Errorf("structure: %+v", tr.StructureProblems)
	}
	got := map[string]string{}
	for _, d := range tr.Differences {
		got[d.Key[0].Value] = string(d.Kind) + ":" + strings.Join(d.Columns, ",")
	}
	want := map[string]string{"300": "missing:", "301": "extra:"}
	for i, c := range tortureChanges {
		want[fmt.Sprint(200+i)] = "differing:" + c.col
	}
	var problems []string
	for k, v := range want {
		if got[k] != v {
			problems = append(problems, fmt.Sprintf("id %s: got %q, want %q", k, got[k], v))
		}
	}
	for k, v := range got {
		if _, ok := want[k]; !ok {
			problems = append(problems, fmt.Sprintf("id %s: unexpected difference %q", k, v))
		}
	}
	sort.Strings(problems)
	for _, pr := range problems {
		t.Error(pr)
	}
	if int(tr.DifferencesTotal) != len(want) {
		t.Errorf("differences_total %d, want %d", tr.DifferencesTotal, len(want))
	}
	// The fix SQL makes the downstream equal.
	fix := readFix(t, cfg, tr)
	execSession(t, &p, false, "SET SESSION sql_mode = '', time_zone = '+00:00'")
	applyFix(t, p.down.DB, fix)
	if rep := run(t, cfg); !rep.Equal {
		t.Fatalf("after applying fix SQL: %+v", tableReport(t, rep, "torture"))
	}
}

func TestTortureMariaDB(t *testing.T) { testTorture(t, mariaPair(t)) }
func TestTortureTiDB(t *testing.T)    { testTorture(t, tidbPair(t)) }

// TestTortureTiDBPushdown: the same with TiDB's checksums in the form its coprocessor
// evaluates (tidb_checksum = "pushdown", the choice on TiKV stores).
func TestTortureTiDBPushdown(t *testing.T) {
	testTorture(t, tidbPair(t), func(c *Config) { c.TiDBChecksum = TiDBChecksumPushdown })
}

// TestDriverRowStream: rows read straight from the driver (newDriverRowStream, which
// prints the numbers the driver parsed) equal rows read through database/sql's RawBytes,
// value for value, for every type and edge value of the torture table, on TiDB and
// MariaDB.
func TestDriverRowStream(t *testing.T) {
	p := tidbPair(t)
	p.both(t, tortureDDL())
	ins := []string{tortureInsert(1, nil, false), tortureInsert(2, nil, true)}
	for i, v := range tortureEqualVariants {
		ins = append(ins, tortureInsert(100+i, map[string]string{v.col: v.up}, false))
	}
	for i, c := range tortureChanges {
		ins = append(ins, tortureInsert(200+i, map[string]string{c.col: c.down}, false))
	}
	execSession(t, &p, true, "SET SESSION sql_mode = ''", ins...)
	execSession(t, &p, false, "SET SESSION sql_mode = ''", ins...)
	plan := p.plan(t, "torture", FlavorTiDB)
	ctx := context.Background()
	for side, db := range map[pairSide]*sql.DB{upSide: p.up.DB, downSide: p.down.DB} {
		q := plan.rangeRowsSQL(side, keyRange{})
		read := func(s *rowStream) [][]sqlValue {
			var out [][]sqlValue
			for {
				if err := s.next(); err != nil {
					t.Fatal(err)
				}
				if s.done {
					return out
				}
				out = append(out, s.row())
			}
		}
		rows, err := db.QueryContext(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		want := read(newRowStream(rows, len(plan.Columns)))
		rows.Close()
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var got [][]sqlValue
		err = conn.Raw(func(dc any) error {
			drows, err := dc.(driver.QueryerContext).QueryContext(ctx, q, nil)
			if err != nil {
				return err
			}
			defer drows.Close()
			got = read(newDriverRowStream(drows, len(plan.Columns)))
			return nil
		})
		conn.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(ins) || len(got) != len(want) {
			t.Fatalf("%s: %d rows from the driver, %d through database/sql, %d inserted", side, len(got), len(want), len(ins))
		}
		for i := range want {
			for j, c := range plan.Columns {
				if !reflect.DeepEqual(got[i][j], want[i][j]) {
					t.Errorf("%s row %d column %s: driver %q (null %v), database/sql %q (null %v)", side, i, c.Name,
						got[i][j].Bytes, got[i][j].Null, want[i][j].Bytes, want[i][j].Null)
				}
			}
		}
	}
}
