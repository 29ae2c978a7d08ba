package checker

// The randomized differential test's generator (random_test.go): the column types of
// its pool, random keys, tables and rows, and what a test expects parity to report.

import (
	"encoding/hex"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"
)

// rcol is a column type of the pool.
type rcol struct {
	def string
	// gen returns a non-NULL SQL literal.
	gen func(r *rand.Rand) string
	// mut returns an SQL expression of column c whose value, stored in c, differs from c's
	// current value (NULL included).
	mut func(c string, r *rand.Rand) string
	// keyless marks types whose generated literals are canonical (equal stored values
	// have equal literals), usable in keyless tables.
	keyless bool
}

var randomAlphabet = []string{"a", "b", "Z", "q", " ", ",", "'", "\\", "N", "é", "ü", "😀", "0", "7", "\t", "%", "_"}

func randomText(r *rand.Rand, maxChars int, alphabet []string) string {
	if r.IntN(10) == 0 {
		return [...]string{"", "NULL", "N", "a ", " ", "0"}[r.IntN(6)]
	}
	n := r.IntN(maxChars + 1)
	var b strings.Builder
	for range n {
		b.WriteString(alphabet[r.IntN(len(alphabet))])
	}
	return b.String()
}

func sqlString(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `''`).Replace(s) + "'"
}

func sqlBytes(b []byte) string {
	if len(b) == 0 {
		return "''"
	}
	return "X'" + strings.ToUpper(hex.EncodeToString(b)) + "'"
}

func randomBytes(r *rand.Rand, maxLen int) []byte {
	b := make([]byte, r.IntN(maxLen+1))
	for i := range b {
		b[i] = byte([]int{0, 0xff, ' ', ',', 'a', r.IntN(256)}[r.IntN(6)])
	}
	return b
}

func intGen(lo, hi int64) func(r *rand.Rand) string {
	return func(r *rand.Rand) string {
		switch r.IntN(6) {
		case 0:
			return strconv.FormatInt(lo, 10)
		case 1:
			return strconv.FormatInt(hi, 10)
		case 2:
			return strconv.FormatInt(r.Int64N(21)-10, 10)
		}
		return strconv.FormatInt(lo+r.Int64N(hi-lo), 10)
	}
}

// stringMut changes a string: a trailing space, a case change or another first character,
// whichever stays within max characters and changes the bytes.
func stringMut(max int) func(c string, r *rand.Rand) string {
	return func(c string, r *rand.Rand) string {
		return fmt.Sprintf("IF(%[1]s IS NULL, '', CASE "+
			"WHEN CHAR_LENGTH(%[1]s) < %[2]d AND %[3]d = 0 THEN CONCAT(%[1]s, ' ') "+
			"WHEN BINARY UPPER(%[1]s) <> BINARY %[1]s AND %[4]d = 0 THEN UPPER(%[1]s) "+
			"WHEN CHAR_LENGTH(%[1]s) = 0 THEN 'y' "+
			"WHEN BINARY LEFT(%[1]s, 1) = 'y' THEN CONCAT('x', SUBSTRING(%[1]s, 2)) "+
			"ELSE CONCAT('y', SUBSTRING(%[1]s, 2)) END)", c, max, r.IntN(3), r.IntN(2))
	}
}

var randomPool = []rcol{
	{def: "INT", gen: intGen(math.MinInt32, math.MaxInt32), keyless: true,
		mut: func(c string, _ *rand.Rand) string {
			return fmt.Sprintf("IF(%[1]s IS NULL, 0, IF(%[1]s = 2147483647, %[1]s - 1, %[1]s + 1))", c)
		}},
	{def: "TINYINT", gen: intGen(-128, 127), keyless: true,
		mut: func(c string, _ *rand.Rand) string {
			return fmt.Sprintf("IF(%[1]s IS NULL, 0, IF(%[1]s = 127, %[1]s - 1, %[1]s + 1))", c)
		}},
	{def: "BIGINT UNSIGNED", keyless: true,
		gen: func(r *rand.Rand) string {
			switch r.IntN(4) {
			case 0:
				return "18446744073709551615"
			case 1:
				return "9223372036854775808"
			case 2:
				return strconv.Itoa(r.IntN(5))
			}
			return strconv.FormatUint(r.Uint64(), 10)
		},
		mut: func(c string, _ *rand.Rand) string {
			return fmt.Sprintf("IF(%[1]s IS NULL, 0, IF(%[1]s = 18446744073709551615, %[1]s - 1, %[1]s + 1))", c)
		}},
	{def: "DECIMAL(12,3)", keyless: true,
		gen: func(r *rand.Rand) string {
			v := r.Int64N(2_000_000_000_000-1) - (1_000_000_000_000 - 1)
			if r.IntN(5) == 0 {
				v = r.Int64N(3) - 1
			}
			s := ""
			if v < 0 {
				s, v = "-", -v
			}
			return fmt.Sprintf("%s%d.%03d", s, v/1000, v%1000)
		},
		mut: func(c string, _ *rand.Rand) string {
			return fmt.Sprintf("IF(%[1]s IS NULL, 0, IF(%[1]s > 0, %[1]s - 0.001, %[1]s + 0.001))", c)
		}},
	{def: "DOUBLE",
		gen: func(r *rand.Rand) string {
			switch r.IntN(8) {
			case 0:
				return [...]string{"0e0", "-0e0", "1e308", "-1.7976931348623157e308", "2.2250738585072014e-308", "0.1e0", "1e-300", "123456789012345678e0"}[r.IntN(8)]
			case 1:
				return doubleLit(float64(r.IntN(2000)-1000) / 8)
			}
			f := math.Float64frombits(r.Uint64())
			for math.IsNaN(f) || math.IsInf(f, 0) || (f != 0 && math.Abs(f) < 2.3e-308) {
				f = math.Float64frombits(r.Uint64())
			}
			return doubleLit(f)
		},
		mut: func(c string, _ *rand.Rand) string {
			return fmt.Sprintf("IF(%[1]s IS NULL OR %[1]s = 0, 1, IF(ABS(%[1]s) > 1e300, %[1]s / 2, %[1]s * 2))", c)
		}},
	{def: "FLOAT",
		gen: func(r *rand.Rand) string {
			var f float32
			switch r.IntN(6) {
			case 0:
				f = [...]float32{0, 3.4028234663852886e38, 1.1754943508222875e-38, -1, 0.1, 16777217}[r.IntN(6)]
			default:
				f = float32(math.Ldexp(r.Float64()*2-1, r.IntN(120)-60))
			}
			return doubleLit(float64(f))
		},
		mut: func(c string, _ *rand.Rand) string {
			return fmt.Sprintf("IF(%[1]s IS NULL OR %[1]s = 0, 1, IF(ABS(%[1]s) > 1e37, %[1]s / 2, %[1]s * 2))", c)
		}},
	{def: "VARCHAR(24) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin", keyless: true,
		gen: func(r *rand.Rand) string { return sqlString(randomText(r, 24, randomAlphabet)) }, mut: stringMut(24)},
	{def: "VARCHAR(24) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci",
		gen: func(r *rand.Rand) string { return sqlString(randomText(r, 24, randomAlphabet)) }, mut: stringMut(24)},
	{def: "CHAR(8) CHARACTER SET utf8mb4",
		gen: func(r *rand.Rand) string { return sqlString(randomText(r, 8, randomAlphabet)) },
		mut: func(c string, _ *rand.Rand) string {
			return fmt.Sprintf("IF(%[1]s IS NULL, '', IF(BINARY LEFT(%[1]s, 1) = 'y', CONCAT('x', SUBSTRING(%[1]s, 2)), CONCAT('y', SUBSTRING(%[1]s, 2))))", c)
		}},
	{def: "VARCHAR(16) CHARACTER SET latin1",
		gen: func(r *rand.Rand) string {
			return sqlString(randomText(r, 16, []string{"a", "B", "é", "ü", " ", ",", "'", "ß"}))
		}, mut: stringMut(16)},
	{def: "TEXT",
		gen: func(r *rand.Rand) string { return sqlString(randomText(r, 120, randomAlphabet)) }, mut: stringMut(1000)},
	{def: "BLOB", keyless: true,
		gen: func(r *rand.Rand) string { return sqlBytes(randomBytes(r, 40)) },
		mut: func(c string, _ *rand.Rand) string {
			return fmt.Sprintf("IF(%[1]s IS NULL, X'', CONCAT(%[1]s, X'00'))", c)
		}},
	{def: "VARBINARY(16)", keyless: true,
		gen: func(r *rand.Rand) string { return sqlBytes(randomBytes(r, 16)) },
		mut: func(c string, _ *rand.Rand) string {
			return fmt.Sprintf("IF(%[1]s IS NULL, X'', IF(LENGTH(%[1]s) < 16, CONCAT(%[1]s, X'00'), CONCAT(IF(LEFT(%[1]s, 1) = X'00', X'01', X'00'), SUBSTRING(%[1]s, 2))))", c)
		}},
	{def: "DATE", keyless: true, gen: func(r *rand.Rand) string { return "'" + randomTime(r).Format("2006-01-02") + "'" },
		mut: func(c string, _ *rand.Rand) string {
			return fmt.Sprintf("IF(%[1]s IS NULL, '2000-01-01', IF(%[1]s > '9000-01-01', %[1]s - INTERVAL 1 DAY, %[1]s + INTERVAL 1 DAY))", c)
		}},
	{def: "DATETIME(6)", gen: func(r *rand.Rand) string { return "'" + randomTime(r).Format("2006-01-02 15:04:05.000000") + "'" },
		mut: func(c string, _ *rand.Rand) string {
			return fmt.Sprintf("IF(%[1]s IS NULL, '2000-01-01', IF(%[1]s > '9000-01-01', %[1]s - INTERVAL 1 MICROSECOND, %[1]s + INTERVAL 1 MICROSECOND))", c)
		}},
	{def: "DATETIME", keyless: true, gen: func(r *rand.Rand) string { return "'" + randomTime(r).Format("2006-01-02 15:04:05") + "'" },
		mut: func(c string, _ *rand.Rand) string {
			return fmt.Sprintf("IF(%[1]s IS NULL, '2000-01-01', IF(%[1]s > '9000-01-01', %[1]s - INTERVAL 1 SECOND, %[1]s + INTERVAL 1 SECOND))", c)
		}},
	{def: "TIMESTAMP(3)",
		gen: func(r *rand.Rand) string {
			t := time.Unix(86400*2+r.Int64N(2_140_000_000-86400*4), int64(r.IntN(1000))*1e6).UTC()
			return "'" + t.Format("2006-01-02 15:04:05.000") + "'"
		},
		mut: func(c string, _ *rand.Rand) string {
			return fmt.Sprintf("IF(%[1]s IS NULL, '2000-01-01', IF(%[1]s > '2030-01-01', %[1]s - INTERVAL 1 SECOND, %[1]s + INTERVAL 1 SECOND))", c)
		}},
	{def: "TIME(3)",
		gen: func(r *rand.Rand) string {
			ms := r.Int64N(2*3_020_399_000+1) - 3_020_399_000
			s := ""
			if ms < 0 {
				s, ms = "-", -ms
			}
			return fmt.Sprintf("'%s%d:%02d:%02d.%03d'", s, ms/3_600_000, ms/60_000%60, ms/1000%60, ms%1000)
		},
		mut: func(c string, _ *rand.Rand) string {
			return fmt.Sprintf("IF(%[1]s IS NULL, '00:00:00', IF(%[1]s > '800:00:00', SUBTIME(%[1]s, '00:00:01'), ADDTIME(%[1]s, '00:00:01')))", c)
		}},
	{def: "YEAR", keyless: true, gen: func(r *rand.Rand) string { return strconv.Itoa(1901 + r.IntN(255)) },
		mut: func(c string, _ *rand.Rand) string {
			return fmt.Sprintf("IF(%[1]s IS NULL, 2000, IF(%[1]s >= 2155, %[1]s - 1, %[1]s + 1))", c)
		}},
	{def: "ENUM('a','B','c d')", gen: func(r *rand.Rand) string { return [...]string{"'a'", "'B'", "'c d'"}[r.IntN(3)] },
		mut: func(c string, _ *rand.Rand) string { return fmt.Sprintf("IF(%[1]s = 'a', 'B', 'a')", c) }},
	{def: "SET('x','y','z')", gen: func(r *rand.Rand) string { return [...]string{"''", "'x'", "'y,z'", "'x,y,z'", "'z'"}[r.IntN(5)] },
		mut: func(c string, _ *rand.Rand) string { return fmt.Sprintf("IF(%[1]s = 'x,y', 'z', 'x,y')", c) }},
	{def: "BIT(12)", gen: func(r *rand.Rand) string { return strconv.Itoa(r.IntN(4096)) },
		mut: func(c string, _ *rand.Rand) string { return fmt.Sprintf("IFNULL(%[1]s ^ 1, 0)", c) }},
	{def: "JSON",
		gen: func(r *rand.Rand) string {
			return sqlString(fmt.Sprintf(`{"n": %d, "s": %q, "a": [%d, 2.5, true, null], "o": {"k": "%s"}}`,
				9007199254740992+r.Int64N(5), randomText(r, 5, []string{"a", "é", " ", `"`}), r.IntN(10), []string{"x", "y"}[r.IntN(2)]))
		},
		mut: func(c string, _ *rand.Rand) string {
			return fmt.Sprintf("JSON_SET(IFNULL(%[1]s, '{}'), '$.mut', 1)", c)
		}},
}

// doubleLit writes f exactly as a DOUBLE literal (with an exponent, so not DECIMAL).
func doubleLit(f float64) string {
	s := strconv.FormatFloat(f, 'g', -1, 64)
	if !strings.Contains(s, "e") {
		s += "e0"
	}
	return s
}

func randomTime(r *rand.Rand) time.Time {
	switch r.IntN(8) {
	case 0:
		return time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC)
	case 1:
		return time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC)
	}
	return time.Date(1000+r.IntN(9000), time.Month(1+r.IntN(12)), 1+r.IntN(28), r.IntN(24), r.IntN(60), r.IntN(60), r.IntN(1_000_000)*1000, time.UTC)
}

// rkey is a key shape: its column definitions and a generator of unique key tuples.
type rkey struct {
	name string
	cols []string // "name TYPE"
	// gen returns the key's literals and a string that is equal for keys the table's
	// unique index considers equal.
	gen func(r *rand.Rand) (lits []string, norm string)
	// unique puts the key in a UNIQUE NOT NULL index instead of the primary key.
	unique bool
}

var randomKeys = []rkey{
	{name: "int", cols: []string{"id INT"}, gen: func(r *rand.Rand) ([]string, string) {
		v := intGen(math.MinInt32, math.MaxInt32)(r)
		return []string{v}, v
	}},
	{name: "bigint unsigned", cols: []string{"id BIGINT UNSIGNED"}, gen: func(r *rand.Rand) ([]string, string) {
		v := strconv.FormatUint(r.Uint64()>>uint(r.IntN(64)), 10)
		return []string{v}, v
	}},
	{name: "decimal", cols: []string{"id DECIMAL(20,4)"}, gen: func(r *rand.Rand) ([]string, string) {
		v := fmt.Sprintf("%d.%04d", r.Int64N(2e15)-1e15, r.IntN(10000))
		return []string{v}, v
	}},
	{name: "ci string + int", cols: []string{"s VARCHAR(12) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci", "n INT"},
		gen: func(r *rand.Rand) ([]string, string) {
			s := strings.TrimRight(randomText(r, 12, []string{"a", "B", "c", "-", "_", "0", " ", "x"}), " ")
			n := strconv.Itoa(r.IntN(7) - 3)
			return []string{sqlString(s), n}, strings.ToLower(s) + "\x00" + n
		}},
	{name: "bin string", cols: []string{"s VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"},
		gen: func(r *rand.Rand) ([]string, string) {
			s := strings.TrimRight(randomText(r, 20, randomAlphabet), " ")
			return []string{sqlString(s)}, s
		}},
	{name: "varbinary", cols: []string{"b VARBINARY(12)"}, gen: func(r *rand.Rand) ([]string, string) {
		b := randomBytes(r, 12)
		return []string{sqlBytes(b)}, string(b)
	}},
	{name: "date + smallint", cols: []string{"d DATE", "n SMALLINT"}, gen: func(r *rand.Rand) ([]string, string) {
		d := "'" + randomTime(r).Format("2006-01-02") + "'"
		n := strconv.Itoa(r.IntN(65536) - 32768)
		return []string{d, n}, d + n
	}},
	{name: "datetime(3)", cols: []string{"t DATETIME(3)"}, gen: func(r *rand.Rand) ([]string, string) {
		t := "'" + randomTime(r).Format("2006-01-02 15:04:05.000") + "'"
		return []string{t}, t
	}},
	{name: "unique bin string", unique: true, cols: []string{"u VARCHAR(16) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"},
		gen: func(r *rand.Rand) ([]string, string) {
			s := strings.TrimRight(randomText(r, 16, randomAlphabet), " ")
			return []string{sqlString(s)}, s
		}},
	{name: "double", cols: []string{"f DOUBLE"}, gen: func(r *rand.Rand) ([]string, string) {
		v := randomPool[4].gen(r) // the DOUBLE column's values: extremes, fractions, random bits
		f, _ := strconv.ParseFloat(v, 64)
		if f == 0 {
			v = "0e0" // -0 and 0 are one key
		}
		return []string{v}, strconv.FormatFloat(f+0, 'g', -1, 64)
	}},
	{name: "float + int", cols: []string{"f FLOAT", "n INT"}, gen: func(r *rand.Rand) ([]string, string) {
		v := randomPool[5].gen(r)
		f, _ := strconv.ParseFloat(v, 64)
		n := strconv.Itoa(r.IntN(3))
		return []string{v, n}, strconv.FormatFloat(f+0, 'g', -1, 64) + "," + n
	}},
	{name: "enum + int", cols: []string{"e ENUM('a','B','c d')", "n INT"}, gen: func(r *rand.Rand) ([]string, string) {
		e := [...]string{"'a'", "'B'", "'c d'"}[r.IntN(3)]
		n := strconv.Itoa(r.IntN(2000) - 1000)
		return []string{e, n}, e + n
	}},
	{name: "int + bigint + ci string", cols: []string{"a INT", "b BIGINT", "s VARCHAR(8) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci"},
		gen: func(r *rand.Rand) ([]string, string) {
			a, b := strconv.Itoa(r.IntN(3)), strconv.Itoa(r.IntN(5)-2)
			s := strings.TrimRight(randomText(r, 8, []string{"a", "B", "\t", " ", "é"}), " ")
			return []string{a, b, sqlString(s)}, a + "," + b + "," + strings.ToLower(s)
		}},
	{name: "keyless"},
}

// rtable is a generated table and its rows as inserted upstream.
type rtable struct {
	key     rkey
	keyCols []string
	cols    []rcol // the other columns, named c0, c1, ...
	notNull []bool // per column in cols
	rows    []rrow // upstream rows
	used    map[string]bool
}

type rrow struct {
	id   int      // rid, or g for keyless tables
	key  []string // key literals
	vals []string // literals of cols ("NULL" for NULL)
}

func (tb *rtable) ddl() string {
	var defs []string
	for _, c := range tb.key.cols {
		defs = append(defs, c+" NOT NULL")
	}
	col := "rid"
	if tb.key.cols == nil {
		col = "g"
	}
	defs = append(defs, col+" INT NOT NULL")
	for i, c := range tb.cols {
		d := fmt.Sprintf("c%d %s", i, c.def)
		switch {
		case tb.notNull[i] && strings.HasPrefix(c.def, "TIMESTAMP"):
			d += " NOT NULL DEFAULT '2000-01-01 00:00:00'" // no implicit ON UPDATE
		case tb.notNull[i]:
			d += " NOT NULL"
		case strings.HasPrefix(c.def, "TIMESTAMP"):
			d += " NULL"
		}
		defs = append(defs, d)
	}
	switch {
	case tb.key.cols == nil:
	case tb.key.unique:
		defs = append(defs, "UNIQUE KEY uk ("+strings.Join(tb.keyCols, ", ")+")")
	default:
		defs = append(defs, "PRIMARY KEY ("+strings.Join(tb.keyCols, ", ")+")")
	}
	return "CREATE TABLE rnd (" + strings.Join(defs, ", ") + ")"
}

func (tb *rtable) values(r rrow) string {
	vals := append(append(slices.Clone(r.key), strconv.Itoa(r.id)), r.vals...)
	return "(" + strings.Join(vals, ", ") + ")"
}

func (tb *rtable) newRow(r *rand.Rand, id int) rrow {
	row := rrow{id: id}
	if tb.key.gen != nil {
		for {
			lits, norm := tb.key.gen(r)
			if !tb.used[norm] {
				tb.used[norm] = true
				row.key = lits
				break
			}
		}
	}
	for i, c := range tb.cols {
		if !tb.notNull[i] && r.IntN(7) == 0 {
			row.vals = append(row.vals, "NULL")
		} else {
			row.vals = append(row.vals, c.gen(r))
		}
	}
	return row
}

func generateTable(r *rand.Rand) *rtable {
	tb := &rtable{key: randomKeys[r.IntN(len(randomKeys))], used: map[string]bool{}}
	for _, c := range tb.key.cols {
		tb.keyCols = append(tb.keyCols, strings.Fields(c)[0])
	}
	pool := randomPool
	if tb.key.cols == nil {
		pool = nil
		for _, c := range randomPool {
			if c.keyless {
				pool = append(pool, c)
			}
		}
	}
	for range 1 + r.IntN(6) {
		tb.cols = append(tb.cols, pool[r.IntN(len(pool))])
		tb.notNull = append(tb.notNull, r.IntN(3) == 0)
	}
	n := []int{0, 1, 2, 50, 300, 1200, 2500}[r.IntN(7)]
	if tb.key.cols == nil {
		// Keyless: a pool of distinct rows (distinct g), each inserted 1-3 times.
		for g := 1; len(tb.rows) < n; g++ {
			row := tb.newRow(r, g)
			for range 1 + r.IntN(3) {
				tb.rows = append(tb.rows, row)
			}
		}
		return tb
	}
	for i := range n {
		tb.rows = append(tb.rows, tb.newRow(r, i+1))
	}
	return tb
}

// expectation is what the report must hold: per kind, the rids (keyed tables) or g values
// with their copy counts (keyless), and the changed column per rid.
type expectation struct {
	missing, extra map[int]int
	columns        map[int]string
	// keylessCol names the column changed in a copy of keyless group g (which makes the
	// copy missing and the changed row extra).
	keylessCol map[int]string
}
