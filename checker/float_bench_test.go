package checker

import (
	"context"
	"fmt"
	"math"
	"math/rand"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/testenv"
)

// decimalFloatText is the encoding floatText replaced, kept to be measured: an integer
// mantissa of `digits` significant decimal digits and a decimal exponent, computed with
// LOG10/POW(10)/division, which are neither exact nor computed identically by TiDB and
// MariaDB. With 6/15 digits it missed differences (0.3 vs 0.30000000000000004); with
// 9/17 it is injective, but equal values can encode differently on the two servers.
func decimalFloatText(id string, digits int) string {
	a := "ABS(" + id + ")"
	e0 := "FLOOR(LOG10(" + a + "))"
	p := "POW(10, " + e0 + ")"
	e := "(" + e0 + " + (" + a + " / 10 >= " + p + ") - (" + a + " < " + p + "))"
	m := "CAST(ROUND(" + id + " / POW(10, " + e + " - " + fmt.Sprint(digits-1) + ")) AS SIGNED)"
	return "CASE WHEN " + id + " = 0 THEN '0' ELSE IFNULL(CONCAT(" + m + ", 'e', " + e + "), CONCAT('raw', " + id + ")) END"
}

// randomFloatRows returns n rows (id, FLOAT, DOUBLE) of random values over the whole
// range of magnitudes, as literals both servers parse exactly.
func randomFloatRows(n int, seed int64) [][3]string {
	r := rand.New(rand.NewSource(seed))
	out := make([][3]string, n)
	for i := range out {
		var d float64
		switch i % 4 {
		case 0: // anything, subnormals included
			for {
				d = math.Float64frombits(r.Uint64())
				if !math.IsNaN(d) && !math.IsInf(d, 0) {
					break
				}
			}
		case 1: // money-like
			d = float64(r.Intn(10000000)) / 100
		default: // typical magnitudes
			d = (r.Float64() - 0.5) * math.Pow(10, float64(r.Intn(40)-20))
		}
		var f float32
		for {
			f = math.Float32frombits(r.Uint32())
			if !math.IsNaN(float64(f)) && !math.IsInf(float64(f), 0) {
				break
			}
		}
		if i%4 == 1 {
			f = float32(d)
		}
		out[i] = [3]string{strconv.Itoa(i + 1), strconv.FormatFloat(float64(f), 'g', -1, 32), strconv.FormatFloat(d, 'g', -1, 64)}
	}
	return out
}

// BenchmarkFloatChecksum times the checksum query of a (id, FLOAT, DOUBLE) table of
// PARITY_BENCH_ROWS (default 200000) random values on MariaDB and TiDB, with the exact
// binary encoding (floatText), the decimal encodings at 6/15 (the former one) and 9/17
// significant digits, and COUNT(*) alone; and it counts the rows whose encoding differs
// between the two servers for equal data (only a drill-down's cost, never a reported
// difference; the binary encoding must have none):
//
//	go test -run '^$' -bench FloatChecksum -benchtime 1x -v ./checker/
func BenchmarkFloatChecksum(b *testing.B) {
	n := 200000
	if v, err := strconv.Atoi(os.Getenv("PARITY_BENCH_ROWS")); err == nil && v > 0 {
		n = v
	}
	rows := randomFloatRows(n, 1)
	servers := []struct {
		name string
		db   *testenv.DB
	}{
		{"mariadb", testenv.Downstream(b)},
		{"tidb", testenv.Upstream(b)},
	}
	ctx := context.Background()
	encodings := []struct{ name, f, d string }{
		{"binary (floatText)", floatText("CAST(`f` AS DOUBLE)"), floatText("`d`")},
		{"decimal 6/15 (former)", decimalFloatText("`f`", 6), decimalFloatText("`d`", 15)},
		{"decimal 9/17", decimalFloatText("CAST(`f` AS DOUBLE)", 9), decimalFloatText("CAST(`d` AS DOUBLE)", 17)},
	}
	encoded := make([][]map[string]string, len(servers)) // [server][encoding] id -> text
	for si, s := range servers {
		exec(b, s.db.DB, "CREATE TABLE fl (id INT PRIMARY KEY, f FLOAT NOT NULL, d DOUBLE NOT NULL)")
		for start := 0; start < n; start += 2000 {
			var vals []string
			for _, r := range rows[start:min(n, start+2000)] {
				vals = append(vals, "("+r[0]+","+r[1]+","+r[2]+")")
			}
			exec(b, s.db.DB, "INSERT INTO fl VALUES "+strings.Join(vals, ","))
		}
		table := ident.Table(s.db.Name, "fl")
		type variant struct{ name, sql string }
		variants := []variant{{"count-only", "SELECT COUNT(*), 0 FROM " + table}}
		for _, e := range encodings {
			variants = append(variants, variant{e.name, "SELECT COUNT(*), IFNULL(SUM(" + hashExpr(HashSHA1, "CONCAT_WS(',',`id`,"+e.f+","+e.d+")", false) + "),0) FROM " + table})
		}
		best := make([]time.Duration, len(variants))
		for range 3 {
			for i, v := range variants {
				start := time.Now()
				var cnt int64
				var sum string
				if err := s.db.QueryRowContext(ctx, v.sql).Scan(&cnt, &sum); err != nil {
					b.Fatalf("%s: %v", v.sql, err)
				}
				if d := time.Since(start); best[i] == 0 || d < best[i] {
					best[i] = d
				}
			}
		}
		for i, v := range variants {
			b.Logf("%-8s %-22s %6.0f ms", s.name, v.name, best[i].Seconds()*1000)
		}
		for _, e := range encodings {
			m := map[string]string{}
			rs, err := s.db.QueryContext(ctx, "SELECT id, CONCAT_WS(',',"+e.f+","+e.d+") FROM "+table)
			if err != nil {
				b.Fatal(err)
			}
			for rs.Next() {
				var id, enc string
				if err := rs.Scan(&id, &enc); err != nil {
					b.Fatal(err)
				}
				m[id] = enc
			}
			rs.Close()
			encoded[si] = append(encoded[si], m)
		}
	}
	for ei, e := range encodings {
		diff := 0
		for id, x := range encoded[0][ei] {
			if encoded[1][ei][id] != x {
				if diff < 3 {
					b.Logf("%s: row %s encodes as %q on mariadb, %q on tidb", e.name, id, x, encoded[1][ei][id])
				}
				diff++
			}
		}
		b.Logf("%-22s rows encoded differently on tidb and mariadb: %d of %d", e.name, diff, n)
		if ei == 0 && diff > 0 {
			b.Errorf("the binary encoding must be identical on both servers")
		}
	}
}
