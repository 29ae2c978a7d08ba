package checker

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"math/rand"
	"strconv"
	"strings"
	"testing"
)

// dbl is the exact SQL text of a float64 (shortest round trip; both servers parse it to
// the same double).
func dbl(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }

// wantFloatText is floatText's encoding computed in Go: the integer mantissa m and the
// binary exponent E with x = m × 2^(E-52), E >= -1022.
func wantFloatText(x float64) string {
	if x == 0 {
		return "0"
	}
	_, exp := math.Frexp(x) // |x| = frac × 2^exp, frac in [0.5, 1)
	e := max(exp-1, -1022)
	return fmt.Sprintf("%dp%d", int64(math.Ldexp(x, 52-e)), e)
}

// floatEdgeValues: every power of two of the double range and its two neighbours, the
// extremes, subnormals, and random doubles of every magnitude.
func floatEdgeValues() []float64 {
	var out []float64
	for k := -1074; k <= 1023; k++ {
		p := math.Ldexp(1, k)
		out = append(out, p, math.Nextafter(p, 0), math.Nextafter(p, math.Inf(1)), -p)
	}
	out = append(out, 0, math.Copysign(0, -1), math.MaxFloat64, -math.MaxFloat64, math.SmallestNonzeroFloat64, 0.1+0.2, 0.3,
		1e20, 1e-300, 1e308, 2.2250738585072014e-308, 2.225073858507201e-308, 1e15, 1e16, 1e17, 123456789012345678)
	r := rand.New(rand.NewSource(5))
	for len(out) < 12000 {
		x := math.Float64frombits(r.Uint64())
		if !math.IsNaN(x) && !math.IsInf(x, 0) {
			out = append(out, x)
		}
	}
	return out
}

// float32EdgeValues: the same for FLOAT.
func float32EdgeValues() []float32 {
	var out []float32
	for k := -149; k <= 127; k++ {
		p := float32(math.Ldexp(1, k))
		out = append(out, p, math.Nextafter32(p, 0), math.Nextafter32(p, float32(math.Inf(1))), -p)
	}
	out = append(out, math.MaxFloat32, -math.MaxFloat32, math.SmallestNonzeroFloat32, 3.1415927, 1.2345678, 16777217)
	r := rand.New(rand.NewSource(6))
	for len(out) < 3000 {
		x := math.Float32frombits(r.Uint32())
		if !math.IsNaN(float64(x)) && !math.IsInf(float64(x), 0) {
			out = append(out, x)
		}
	}
	return out
}

// TestFloatEncodingExact checks floatText against the encoding computed in Go, on TiDB and
// on MariaDB, for the values where LOG2 guesses wrong (powers of two and their
// neighbours, the extremes, subnormals) and random doubles and floats: so equal data
// encodes equally on both servers and different values never encode alike.
func TestFloatEncodingExact(t *testing.T) {
	ds, fs := floatEdgeValues(), float32EdgeValues()
	ctx := context.Background()
	p := tidbPair(t)
	for si, conn := range []*sql.DB{p.up.DB, p.down.DB} {
		server := [...]string{"tidb", "mariadb"}[si]
		exec(t, conn, "CREATE TABLE enc (id INT PRIMARY KEY, d DOUBLE, f FLOAT)")
		for start := 0; start < len(ds); start += 1000 {
			var vals []string
			for i := start; i < min(len(ds), start+1000); i++ {
				f := "NULL"
				if i < len(fs) {
					f = dbl(float64(fs[i])) // exact: stored into FLOAT unchanged
				}
				vals = append(vals, fmt.Sprintf("(%d,%s,%s)", i, dbl(ds[i]), f))
			}
			exec(t, conn, "INSERT INTO enc VALUES "+strings.Join(vals, ","))
		}
		q := "SELECT id, " + floatText("`d`") + ", IFNULL(" + floatText("CAST(`f` AS DOUBLE)") + ", 'N') FROM enc ORDER BY id"
		rows, err := conn.QueryContext(ctx, q)
		if err != nil {
			t.Fatalf("%s: %v", server, err)
		}
		bad, n := 0, 0
		for rows.Next() {
			n++
			var id int
			var d, f string
			if err := rows.Scan(&id, &d, &f); err != nil {
				t.Fatal(err)
			}
			wf := "N"
			if id < len(fs) {
				wf = wantFloatText(float64(fs[id]))
			}
			if w := wantFloatText(ds[id]); d != w || f != wf {
				if bad++; bad <= 10 {
					t.Errorf("%s: DOUBLE %s encodes as %q, want %q; FLOAT %v as %q, want %q", server, dbl(ds[id]), d, w, fs[min(id, len(fs)-1)], f, wf)
				}
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		rows.Close()
		if bad > 0 || n != len(ds) {
			t.Errorf("%s: %d of %d rows encoded wrongly, %d rows read", server, bad, len(ds), n)
		}
	}
}

// floatRows: rows (id, FLOAT, DOUBLE) as upstream and downstream SQL literals. Rows 1–9
// hold equal data (-0 and 0 are equal); rows from 10 differ in one column by as little as
// a FLOAT or DOUBLE can: the 17th significant digit, the last bit of the mantissa, one
// subnormal step.
var floatRows = []struct {
	id           int
	upF, upD     string
	downF, downD string
	differs      string // the differing column, "" when equal
}{
	{1, "3.402823466e38", "1e20", "3.4028234663852886e38", "100000000000000000000", ""},
	{2, "1e-45", "1e-300", "1.401298464324817e-45", "1.0e-300", ""},
	{3, "-0e0", "-0e0", "0e0", "0e0", ""},
	{4, "-3.402823466e38", "1.7976931348623157e308", "-3.402823466e38", "1.7976931348623157e308", ""},
	{5, "1.1754942e-38", "4.9e-324", "1.1754942106924411e-38", "5e-324", ""},
	{6, "3.1415927", "0.1e0+0.2e0", "3.1415927410125732", "0.30000000000000004", ""},
	{7, "16777216", "2.225073858507201e-308", "16777216", "2.225073858507201e-308", ""},
	{8, "1.2345678", "123456789012345678", "1.2345678", "123456789012345680", ""},
	{9, "NULL", "NULL", "NULL", "NULL", ""},
	{10, "1", "0.30000000000000004", "1", "0.3", "d"},                       // 17th digit
	{11, "1", "1.2345678901234567", "1", "1.2345678901234569", "d"},         // last bit
	{12, "3.1415927", "1", "3.1415929794311523", "1", "f"},                  // last bit of a FLOAT
	{13, "1", "5e-324", "1", "1e-323", "d"},                                 // one subnormal step
	{14, "1e-45", "1", "3e-45", "1", "f"},                                   // one FLOAT subnormal step
	{15, "1", "1.7976931348623157e308", "1", "1.7976931348623155e308", "d"}, // last bit at the top
	{16, "16777216", "1e20", "16777216", "100000000000000016384", "d"},      // last bit, printed differently
	{17, "0.1", "0.1", "0.10000000149011612", "0.1", ""},                    // FLOAT 0.1, exactly
}

// TestFloatExactMariaDB / TestFloatExactTiDB: FLOAT and DOUBLE compare exactly. Equal data
// (1e20 against 100000000000000000000, -0 against 0, the extremes, subnormals) checksums
// equal on both servers and is found equal; a DOUBLE changed in its 16th–17th significant
// digit or its last bit and a FLOAT changed in its last bit are found, by the checksum
// and by the drill-down, as exactly that row and column, keyed and keyless; the fix SQL
// (exact literals) makes the sides equal.
func TestFloatExactMariaDB(t *testing.T) { testFloatExact(t, mariaPair(t), flavorMariaDB) }
func TestFloatExactTiDB(t *testing.T)    { testFloatExact(t, tidbPair(t), FlavorTiDB) }

func testFloatExact(t *testing.T, p pair, upFlavor Flavor) {
	p.both(t, "CREATE TABLE fl (id INT PRIMARY KEY, f FLOAT, d DOUBLE)", "CREATE TABLE flk (f FLOAT, d DOUBLE)")
	var up, down, upK, downK []string
	for _, r := range floatRows {
		up = append(up, fmt.Sprintf("(%d,%s,%s)", r.id, r.upF, r.upD))
		down = append(down, fmt.Sprintf("(%d,%s,%s)", r.id, r.downF, r.downD))
		upK = append(upK, fmt.Sprintf("(%s,%s)", r.upF, r.upD))
		downK = append(downK, fmt.Sprintf("(%s,%s)", r.downF, r.downD))
	}
	exec(t, p.up.DB, "INSERT INTO fl VALUES "+strings.Join(up, ","), "INSERT INTO flk VALUES "+strings.Join(upK, ","))
	exec(t, p.down.DB, "INSERT INTO fl VALUES "+strings.Join(down, ","), "INSERT INTO flk VALUES "+strings.Join(downK, ","))

	// The checksum SQL alone: equal rows checksum equal, every changed row differently.
	plan := p.plan(t, "fl", upFlavor)
	for _, r := range floatRows {
		up, down := p.rowChecksums(t, plan, r.id)
		if up.count != 1 || down.count != 1 || (up.sum == down.sum) != (r.differs == "") {
			t.Errorf("row %d (f %s/%s, d %s/%s): checksums %s and %s, differing column %q", r.id, r.upF, r.downF, r.upD, r.downD, up.sum, down.sum, r.differs)
		}
	}

	cfg := p.config(t, "fl", "flk")
	rep := run(t, cfg)
	tr := tableReport(t, rep, "fl")
	got := map[string]string{}
	for _, d := range tr.Differences {
		got[d.Key[0].Value] = string(d.Kind) + ":" + strings.Join(d.Columns, ",")
	}
	want := map[string]string{}
	wantKeyless := 0
	for _, r := range floatRows {
		if r.differs != "" {
			want[fmt.Sprint(r.id)] = "differing:" + r.differs
			wantKeyless += 2 // one missing and one extra row
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("keyed differences:\n got %v\nwant %v", got, want)
	}
	kr := tableReport(t, rep, "flk")
	if !kr.Keyless || int(kr.DifferencesTotal) != wantKeyless {
		t.Errorf("keyless: %d differences, want %d: %+v", kr.DifferencesTotal, wantKeyless, kr.Differences)
	}
	applyFix(t, p.down.DB, readFix(t, cfg, tr))
	applyFix(t, p.down.DB, readFix(t, cfg, kr))
	if rep := run(t, cfg); !rep.Equal {
		t.Fatalf("after applying fix SQL: %+v", rep.Tables)
	}
}
