package checker

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata/")

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create)", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("%s differs (-want +got):\n%s", name, diff)
	}
}

func FuzzLiteral(f *testing.F) {
	f.Add([]byte("it's"), uint8(0))
	f.Add([]byte{0, 0xff}, uint8(1))
	f.Add([]byte("1.5e3"), uint8(2))
	f.Add([]byte("1; DROP TABLE t"), uint8(2))
	f.Fuzz(func(t *testing.T, b []byte, k uint8) {
		kind := colKind(int(k) % (int(kindJSON) + 1))
		lit := sqlLiteral(kind, sqlValue{Bytes: b})
		if strings.HasPrefix(lit, utf8Introducer) {
			// Text only, and only valid UTF-8: the server converts it from utf8mb4.
			if kind != kindString || !utf8.Valid(b) {
				t.Fatalf("%s for %q of kind %s", lit, b, kind)
			}
			lit = strings.TrimPrefix(lit, utf8Introducer)
		} else if strings.HasPrefix(lit, "X'") && kind == kindString && utf8.Valid(b) {
			t.Fatalf("UTF-8 text %q as a binary literal %s", b, lit)
		}
		switch {
		case strings.HasPrefix(lit, "X'"), strings.HasPrefix(lit, "CONVERT(X'"):
			h := strings.TrimSuffix(strings.TrimPrefix(lit, "CONVERT("), " USING utf8mb4)")
			raw, err := hex.DecodeString(h[2 : len(h)-1])
			if err != nil || !bytes.Equal(raw, b) {
				t.Fatalf("hex literal %s does not decode to %q", lit, b)
			}
		case strings.HasPrefix(lit, "'"):
			inner := lit[1 : len(lit)-1]
			if strings.ContainsAny(inner, "'\\") || inner != string(b) {
				t.Fatalf("quoted literal %s for %q", lit, b)
			}
		default:
			if !numericText.MatchString(lit) || lit != string(b) {
				t.Fatalf("bare literal %s for %q (kind %s)", lit, b, kind)
			}
		}
	})
}

// FuzzLiteralRoundTrip: parseLiteral (the re-check's reader of stored key literals) reads
// every literal Literal writes back to its value, and refuses, without panicking, what it
// did not write.
func FuzzLiteralRoundTrip(f *testing.F) {
	f.Add([]byte("o'k"), uint8(kindString))
	f.Add([]byte("-1.5e3"), uint8(kindDecimal))
	f.Add([]byte{0, 0xff}, uint8(kindBinary))
	f.Add([]byte(`{"a":1}`), uint8(kindJSON))
	f.Add([]byte("CONVERT(X'41' USING utf8mb4)"), uint8(kindString))
	f.Fuzz(func(t *testing.T, b []byte, kind uint8) {
		v := sqlValue{Bytes: b}
		lit := sqlLiteral(colKind(kind%uint8(kindJSON+1)), v)
		got, err := parseLiteral(lit)
		if err != nil {
			t.Fatalf("parseLiteral(%q) of %q: %v", lit, b, err)
		}
		if got.Null || !bytes.Equal(got.Bytes, b) {
			t.Fatalf("%q -> %s -> %+v", b, lit, got)
		}
		_, _ = parseLiteral(string(b)) // any text: a value or an error
	})
}

func TestCanon(t *testing.T) {
	eq := []struct {
		k    colKind
		a, b string
	}{
		{kindFloat, "3.1415927410125732", "3.14159274101257320"},
		{kindFloat, "3.4028234663852886e38", "340282346638528860000000000000000000000"},
		{kindFloat, "-0", "0"},
		{kindDouble, "0.30000000000000004", "0.30000000000000004"},
		{kindDouble, "1e20", "100000000000000000000"},
		{kindDouble, "5e-324", "4.9406564584124654e-324"},
		{kindDouble, "1.7976931348623157e308", "1.7976931348623157E+308"},
		{kindDouble, "-0", "0"},
		{kindDecimal, "1.50", "1.5"},
		{kindDecimal, "-0.000", "0.000"},
		{kindJSON, `{"b":1, "a":[1, 2.0]}`, `{"a": [1, 2], "b": 1}`},
		{kindJSON, `{"x": 1.5e3}`, `{"x": 1500}`},
		{kindInt, "007", "7"},
	}
	for _, c := range eq {
		if canon(c.k, stringValue(c.a)) != canon(c.k, stringValue(c.b)) {
			t.Errorf("%s %q and %q should be equal", c.k, c.a, c.b)
		}
	}
	ne := []struct {
		k    colKind
		a, b sqlValue
	}{
		{kindString, stringValue("a"), stringValue("A")},
		{kindString, stringValue(""), nullValue},
		{kindString, stringValue("NULL"), nullValue},
		{kindString, stringValue("a "), stringValue("a")},
		{kindFloat, stringValue("1.2345"), stringValue("1.23457")},
		// MariaDB prints a FLOAT 3.1415927 as 3.14159: FLOAT is read widened, exactly.
		{kindFloat, stringValue("3.14159"), stringValue("3.1415927410125732")},
		{kindFloat, stringValue("3.1415927410125732"), stringValue("3.1415929794311523")}, // last bit
		{kindDouble, stringValue("0.3"), stringValue("0.30000000000001")},
		{kindDouble, stringValue("0.3"), stringValue("0.30000000000000004")},               // 17th digit
		{kindDouble, stringValue("1.2345678901234567"), stringValue("1.2345678901234569")}, // last bit
		{kindDouble, stringValue("5e-324"), stringValue("1e-323")},
		{kindDouble, stringValue("0"), stringValue("5e-324")},
		{kindJSON, stringValue(`{"a":1}`), stringValue(`{"a":"1"}`)},
		{kindJSON, stringValue(`[1,2]`), stringValue(`[2,1]`)},
		{kindBinary, sqlValue{Bytes: []byte{0}}, sqlValue{Bytes: []byte{}}},
	}
	for _, c := range ne {
		if canon(c.k, c.a) == canon(c.k, c.b) {
			t.Errorf("%s %+v and %+v should differ", c.k, c.a, c.b)
		}
	}
}

func testPlan() *tablePlan {
	return &tablePlan{
		Schema: [2]string{"up`db", "down"}, Table: [2]string{"t", "t`2"},
		Columns: []planColumn{
			{Name: "region", Kind: kindString, Collation: [2]string{"utf8mb4_bin", "utf8mb4_general_ci"}, Charset: [2]string{"utf8mb4", "utf8mb4"}},
			{Name: "id", Kind: kindInt},
			{Name: "v", Kind: kindString},
			{Name: "b", Kind: kindBinary},
			{Name: "f", Kind: kindFloat},
			{Name: "j", Kind: kindJSON},
		},
		Key:  []int{0, 1},
		Hash: HashSHA1,
	}
}

func TestRangePredicates(t *testing.T) {
	p := testPlan()
	lo := chunkBound{stringValue("a'b"), stringValue("10")}
	hi := chunkBound{stringValue("z"), stringValue("-5")}
	var out strings.Builder
	for _, s := range []pairSide{upSide, downSide} {
		for _, r := range []keyRange{{}, {Lo: lo}, {Hi: hi}, {Lo: lo, Hi: hi}} {
			out.WriteString(s.String() + ": " + p.rangePredicate(s, r) + "\n")
		}
	}
	single := &tablePlan{Columns: []planColumn{{Name: "id", Kind: kindInt}}, Key: []int{0}}
	out.WriteString("single: " + single.rangePredicate(upSide, keyRange{Lo: chunkBound{stringValue("1")}, Hi: chunkBound{stringValue("9")}}) + "\n")
	p.Where = "id > 0"
	out.WriteString("checksum: " + p.ChecksumSQL(downSide, keyRange{Lo: lo}) + "\n")
	out.WriteString("rows: " + p.rangeRowsSQL(upSide, keyRange{Hi: hi}) + "\n")
	out.WriteString("boundary: " + p.boundarySQL(downSide, keyRange{Lo: lo}, 999) + "\n")
	// A TiDB upstream without new collations compares bytes; a latin1 downstream column is
	// compared as the UTF-8 bytes TiDB holds, and looked up by key through its own index.
	b := testPlan()
	b.Columns[0].Collation[0] = binaryCollation
	b.Columns[0].Charset[1] = "latin1"
	out.WriteString("binary: " + b.rangePredicate(downSide, keyRange{Lo: lo, Hi: hi}) + "\n")
	out.WriteString("binary keys: " + b.rowsByKeysSQL(downSide, []chunkBound{lo}) + "\n")
	// A utf8mb4_general_ci downstream key: a range whose ends share a prefix gets the
	// index-served superset.
	b.Columns[0].Charset[1] = "utf8mb4"
	b.Columns[0].MaxBytes = 12
	out.WriteString("binary prefix: " + b.rangePredicate(downSide, keyRange{Lo: chunkBound{stringValue("ab\xc3\xa9x"), stringValue("1")},
		Hi: chunkBound{stringValue("ab\xc3\xa9z"), stringValue("2")}}) + "\n")
	golden(t, "predicates.golden", out.String())
}

func TestCompareKeys(t *testing.T) {
	p := &tablePlan{Columns: []planColumn{{Name: "a", Kind: kindInt}, {Name: "s", Kind: kindString}, {Name: "d", Kind: kindDecimal}, {Name: "t", Kind: kindTemporal}}, Key: []int{0, 1, 2, 3}}
	k := func(a, s, d, tm string) []sqlValue {
		return []sqlValue{stringValue(a), stringValue(s), stringValue(d), stringValue(tm)}
	}
	cases := []struct {
		a, b []sqlValue
		want int
	}{
		{k("9", "a", "1", "00:00:00"), k("10", "a", "1", "00:00:00"), -1},
		{k("-10", "a", "1", "00:00:00"), k("-9", "a", "1", "00:00:00"), -1},
		{k("18446744073709551615", "a", "1", "00:00:00"), k("18446744073709551614", "a", "1", "00:00:00"), 1},
		{k("1", "B", "1", "00:00:00"), k("1", "a", "1", "00:00:00"), -1}, // bytes, not collation
		{k("1", "a", "1.50", "00:00:00"), k("1", "a", "1.5", "00:00:00"), 0},
		{k("1", "a", "1", "-01:00:00"), k("1", "a", "1", "-00:30:00"), -1},
		{k("1", "a", "1", "100:00:00"), k("1", "a", "1", "20:00:00"), 1},
	}
	for i, c := range cases {
		if got := p.compareKeys(c.a, c.b); got != c.want {
			t.Errorf("case %d: got %d, want %d", i, got, c.want)
		}
	}
}

func TestFixSQL(t *testing.T) {
	p := testPlan()
	row := []sqlValue{stringValue("eu'west"), stringValue("42"), nullValue, {Bytes: []byte{0, 0xff, '\''}}, stringValue("-1.5e-3"), stringValue(`{"a": "x\\y"}`)}
	row2 := []sqlValue{stringValue("back\\slash\n"), stringValue("-7"), stringValue(""), {Bytes: []byte{}}, nullValue, stringValue("null")}
	var out strings.Builder
	for _, d := range []Difference{p.missing(row, 1), p.differing(row2, []string{"v", "j"}), p.extra(row2, 1)} {
		out.WriteString(d.fix + "\n")
	}
	p.PartialColumns = true
	out.WriteString(p.missing(row, 1).fix + "\n")
	p.PartialColumns = false
	p.Keyless = true
	out.WriteString(p.missing(row, 2).fix + "\n")
	out.WriteString(p.extra(row2, 3).fix + "\n")
	golden(t, "fix.golden", out.String())
}

func TestConfigValidate(t *testing.T) {
	c := DefaultConfig()
	c.Tables = []string{"db", "a.b.c"}
	c.Routes = []Route{{From: "x.y", To: "*"}}
	c.Concurrency = 0
	c.Hash = "crc"
	c.IgnoreColumns = []string{"a.b"}
	c.Changefeed.MaxLag = time.Second // without an id
	c.TiDBMinChunks = 0
	c.TiDBChecksum = "tikv"
	c.RecheckRounds = -1
	c.RecheckDelay = -time.Second
	err := c.Validate()
	if err == nil {
		t.Fatal("want errors")
	}
	for _, key := range []string{"tables[0]", "tables[1]", "routes[0].to", "concurrency", "hash", "ignore-columns[0]", "changefeed.id", "tidb-min-chunks", "tidb-checksum", "recheck-rounds", "recheck-delay"} {
		if !strings.Contains(err.Error(), key+":") {
			t.Errorf("error does not name %s: %v", key, err)
		}
	}
	c = DefaultConfig()
	c.Tables = []string{"shop.*"}
	c.Exclude = []string{"shop.tmp_*"}
	c.Routes = []Route{{From: "shop.orders", To: "fallback.orders_v2"}, {From: "sh?p", To: "fallback"}}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if !c.selected("shop", "orders") || c.selected("shop", "tmp_x") || c.selected("other", "orders") {
		t.Error("selection")
	}
	if s, tb := c.route("shop", "orders"); s != "fallback" || tb != "orders_v2" {
		t.Errorf("route orders: %s.%s", s, tb)
	}
	if s, tb := c.route("shop", "users"); s != "fallback" || tb != "users" {
		t.Errorf("route users: %s.%s", s, tb)
	}
}

func TestChunkSizer(t *testing.T) {
	cfg := DefaultConfig()
	s := newChunkSizer(&cfg)
	if s.size() != 10000 {
		t.Fatal(s.size())
	}
	s.observe(10000, 0.1) // 100k rows/s: target 50k, but grow at most 2x
	if s.size() != 20000 {
		t.Errorf("after fast chunk: %d", s.size())
	}
	for range 20 {
		s.observe(20000, 4) // 5k rows/s: 2.5k rows per 0.5 s
	}
	if s.size() < cfg.MinChunkRows || s.size() > 3000 {
		t.Errorf("after slow chunks: %d", s.size())
	}
	for range 50 {
		s.observe(1000, 0.0001)
	}
	if s.size() != cfg.MaxChunkRows {
		t.Errorf("bounded by max: %d", s.size())
	}
}

func TestBusyGatePauses(t *testing.T) {
	var mu sync.Mutex
	threads, probes := 50, 0
	g := &busyGate{limit: 10, own: 4, every: 5 * time.Millisecond, probe: func(context.Context) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		probes++
		if probes == 3 {
			threads = 12 // 12 - 4 own = 8 <= 10: no longer busy
		}
		return threads, nil
	}}
	start := time.Now()
	if err := g.wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if probes != 3 || time.Since(start) < 10*time.Millisecond {
		t.Fatalf("gate opened after %d probes, %s", probes, time.Since(start))
	}
	// Busy forever: the wait ends with the context.
	threads, probes = 100, 10
	g.checked = time.Time{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if err := g.wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want deadline exceeded, got %v", err)
	}
	// Disabled gate never probes.
	off := &busyGate{probe: func(context.Context) (int, error) { t.Fatal("probed"); return 0, nil }}
	if err := off.wait(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestRateLimiter(t *testing.T) {
	l := newRateLimiter(1000)
	start := time.Now()
	for range 3 {
		if err := l.take(context.Background(), 50); err != nil {
			t.Fatal(err)
		}
	}
	if el := time.Since(start); el < 140*time.Millisecond {
		t.Fatalf("150 rows at 1000 rows/s took %s", el)
	}
	if err := newRateLimiter(0).take(context.Background(), 1e9); err != nil {
		t.Fatal(err)
	}
}

// FuzzRangePredicate: whatever the key bytes, a chunk predicate has balanced parentheses
// and quotes, no control bytes, and non-ASCII only inside quotes (values only ever appear
// hex-encoded, as validated numbers, or quoted without quotes or backslashes).
func FuzzRangePredicate(f *testing.F) {
	f.Add([]byte("a'b"), []byte("10"), []byte("z"), []byte("-5"))
	f.Add([]byte{0, '`', ')'}, []byte("1e5"), []byte{}, []byte("x"))
	f.Fuzz(func(t *testing.T, s1, n1, s2, n2 []byte) {
		p := testPlan()
		for _, side := range []pairSide{upSide, downSide} {
			pred := p.rangePredicate(side, keyRange{Lo: chunkBound{{Bytes: s1}, {Bytes: n1}}, Hi: chunkBound{{Bytes: s2}, {Bytes: n2}}})
			depth := 0
			inQuote := false
			for _, c := range []byte(pred) {
				if c < 0x20 || c == 0x7f || (c > 0x7e && !inQuote) {
					t.Fatalf("unexpected byte %#x in %q", c, pred)
				}
				switch {
				case c == '\'':
					inQuote = !inQuote
				case inQuote:
				case c == '(':
					depth++
				case c == ')':
					depth--
					if depth < 0 {
						t.Fatalf("unbalanced: %s", pred)
					}
				}
			}
			if depth != 0 || inQuote {
				t.Fatalf("unbalanced: %s", pred)
			}
		}
	})
}

// FuzzCompareValue: key order is a total order per kind (reflexive, antisymmetric).
func FuzzCompareValue(f *testing.F) {
	f.Add([]byte("10"), []byte("9"), uint8(2))
	f.Add([]byte("-838:59:59"), []byte("100:00:00"), uint8(6))
	f.Add([]byte("1.50"), []byte("1.5"), uint8(3))
	f.Fuzz(func(t *testing.T, a, b []byte, k uint8) {
		kind := colKind(int(k) % (int(kindJSON) + 1))
		x, y := sqlValue{Bytes: a}, sqlValue{Bytes: b}
		if compareValue(kind, x, x) != 0 {
			t.Fatalf("%s %q not equal to itself", kind, a)
		}
		if compareValue(kind, x, y) != -compareValue(kind, y, x) {
			t.Fatalf("%s: compare(%q, %q) not antisymmetric", kind, a, b)
		}
	})
}

// TestChunkSizerDifferences: once rows differ, chunks shrink to about
// sqrt(drillCostRows/rate), unless differences are so dense that every chunk differs; a
// single-integer-key table behind a costly drill-down (TiDB) is grouped by key bucket at
// its time-based size instead while differences are sparse but frequent enough.
func TestChunkSizerDifferences(t *testing.T) {
	for _, tc := range []struct {
		name        string
		rows, diffs int64
		lo, hi      int     // expected size range
		cost        float64 // drill cost (default: drillCostRows)
		cur         int     // time-based size (default: 4000)
		groupable   bool
		grouped     bool // expected
	}{
		{"grouped: TiDB, 1 in 10,000", 1_000_000, 100, 16000, 16000, tidbDrillCostRows, 16000, true, true},
		{"grouped: TiDB, 1 in 2,000", 1_000_000, 500, 16000, 16000, tidbDrillCostRows, 16000, true, true},
		{"groupable: TiDB, no differences", 1_000_000, 0, 16000, 16000, tidbDrillCostRows, 16000, true, false},
		{"groupable: TiDB, 1 in 1,000,000", 1_000_000, 1, 16000, 16000, tidbDrillCostRows, 16000, true, false},
		{"groupable: TiDB, 1 in 10", 10_000, 1000, 1000, 16000, tidbDrillCostRows, 16000, true, false},
		{"grouped: MariaDB, 1 in 10,000", 1_000_000, 100, 4000, 4000, 0, 0, true, true},
		{"groupable: MariaDB, 1 in 100,000", 1_000_000, 10, 4000, 4000, 0, 0, true, false},
		{"grouped: MariaDB, 1 in 1,000", 100_000, 100, 4000, 4000, 0, 0, true, true},
		{"no differences", 1_000_000, 0, 4000, 4000, 0, 0, false, false},
		{"1 in 10,000", 1_000_000, 100, 1600, 1700, 0, 0, false, false},  // sqrt(270e4) = 1643
		{"1 in 1,000,000", 1_000_000, 1, 4000, 4000, 0, 0, false, false}, // sqrt(270e6) > 4000
		{"1 in 1,000", 100_000, 100, 1000, 1000, 0, 0, false, false},     // 520 rows, bounded by min 1000
		{"1 in 10: every chunk differs", 10_000, 1000, 4000, 4000, 0, 0, false, false},
		{"TiDB, 1 in 10,000", 1_000_000, 100, 4200, 4300, tidbDrillCostRows, 16000, false, false}, // sqrt(1800e4) = 4243
	} {
		cfg := DefaultConfig()
		s := newChunkSizer(&cfg)
		s.cur = 4000
		if tc.cur > 0 {
			s.cur = tc.cur
		}
		if tc.cost > 0 {
			s.drillCost = tc.cost
		}
		s.groupable = tc.groupable
		s.observeDiffs(tc.rows, tc.diffs)
		if n := s.size(); n < tc.lo || n > tc.hi {
			t.Errorf("%s: size %d, want [%d, %d]", tc.name, n, tc.lo, tc.hi)
		}
		if _, g := s.plan(); g != tc.grouped {
			t.Errorf("%s: grouped %v, want %v", tc.name, g, tc.grouped)
		}
	}
}

// TestValueCutter: chunks of a single integer key cut by value: width = size/density,
// stops at a region limit, ends with an open-ended chunk, and gives up on sparse keys.
func TestValueCutter(t *testing.T) {
	bi := func(v int64) *big.Int { return big.NewInt(v) }
	str := func(his []*big.Int) string {
		var parts []string
		for _, h := range his {
			if h == nil {
				parts = append(parts, "nil")
			} else {
				parts = append(parts, h.String())
			}
		}
		return strings.Join(parts, " ")
	}
	for _, tc := range []struct {
		name       string
		min, max   int64
		est        int64
		lo, limit  *big.Int
		size, n    int
		want       string
		wantWidths []float64
		wantNil    bool // newValueCutter declines
	}{
		{name: "dense from the start", min: 1, max: 1000, est: 1000, size: 100, n: 3,
			want: "100 200 300", wantWidths: []float64{100, 100, 100}},
		{name: "open-ended last chunk", min: 1, max: 1000, est: 1000, lo: bi(850), size: 100, n: 5,
			want: "950 nil", wantWidths: []float64{100, 0}},
		{name: "half dense: double width", min: 1, max: 2000, est: 1000, size: 100, n: 2,
			want: "200 400", wantWidths: []float64{200, 200}},
		{name: "density below the clamp still cut at 1/0.5", min: 1, max: 3000, est: 1000, size: 100, n: 1,
			want: "200", wantWidths: []float64{200}},
		{name: "region limit", min: 1, max: 1000, est: 1000, lo: bi(100), limit: bi(150), size: 100, n: 3,
			want: "150", wantWidths: []float64{50}},
		{name: "limit past the end", min: 1, max: 1000, est: 1000, lo: bi(950), limit: bi(5000), size: 100, n: 3,
			want: "nil", wantWidths: []float64{0}},
		{name: "negative keys", min: -500, max: -1, est: 500, size: 200, n: 3,
			want: "-301 -101 nil", wantWidths: []float64{200, 200, 0}},
		{name: "unknown row count: assume dense", min: 1, max: 1000, est: 0, size: 400, n: 3,
			want: "400 800 nil", wantWidths: []float64{400, 400, 0}},
		{name: "sparse: index walk", min: 1, max: 1_000_000, est: 1000, wantNil: true},
	} {
		c := newValueCutter(bi(tc.min), bi(tc.max), tc.est)
		if tc.wantNil {
			if c != nil {
				t.Errorf("%s: want no value cutter, got density %v", tc.name, c.density)
			}
			continue
		}
		his, widths := c.cut(tc.lo, tc.limit, tc.size, tc.n)
		if got := str(his); got != tc.want || !slices.Equal(widths, tc.wantWidths) {
			t.Errorf("%s: got %s %v, want %s %v", tc.name, got, widths, tc.want, tc.wantWidths)
		}
	}
	// Unsigned BIGINT keys near 2^64 do not overflow.
	top, _ := new(big.Int).SetString("18446744073709551615", 10)
	c := newValueCutter(new(big.Int).Sub(top, bi(999)), top, 1000)
	if his, _ := c.cut(nil, nil, 400, 5); str(his) != "18446744073709551015 18446744073709551415 nil" {
		t.Errorf("unsigned bigint: %s", str(his))
	}
	// Observed density replaces the estimate after 4 chunks; below 1/4 the cutter stops.
	c = newValueCutter(bi(1), bi(100000), 0)
	for range 4 {
		c.observe(1000, 700)
	}
	if c.off || c.density != 0.7 {
		t.Errorf("after 70%% dense chunks: off %v density %v", c.off, c.density)
	}
	for range 20 {
		c.observe(1000, 0)
	}
	if !c.off {
		t.Errorf("after empty chunks the cutter should stop (density %v)", float64(c.rows)/c.width)
	}
}

// TestBusyGateLag: with a max lag the gate also holds chunks while the changefeed lags,
// and a lag that cannot be read stops the wait with an error.
func TestBusyGateLag(t *testing.T) {
	var mu sync.Mutex
	lags := []time.Duration{time.Hour, 2 * time.Second, 500 * time.Millisecond}
	probes := 0
	g := &busyGate{maxLag: time.Second, every: 5 * time.Millisecond, lag: func(context.Context) (time.Duration, error) {
		mu.Lock()
		defer mu.Unlock()
		l := lags[min(probes, len(lags)-1)]
		probes++
		return l, nil
	}}
	if err := g.wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if probes != 3 {
		t.Fatalf("gate opened after %d lag probes, want 3", probes)
	}
	bad := &busyGate{maxLag: time.Second, every: time.Millisecond, lag: func(context.Context) (time.Duration, error) {
		return 0, errors.New("no checkpoint")
	}}
	if err := bad.wait(context.Background()); err == nil || !strings.Contains(err.Error(), "changefeed lag") {
		t.Fatalf("want a changefeed lag error, got %v", err)
	}
}

func TestFitEncoding(t *testing.T) {
	col := func(name string, k colKind, maxBytes int64) planColumn {
		return planColumn{Name: name, Kind: k, MaxBytes: maxBytes}
	}
	plan := func() *tablePlan {
		return &tablePlan{Columns: []planColumn{
			col("id", kindInt, 0), col("name", kindString, 400), col("body", kindString, 65535),
			col("doc", kindJSON, unboundedBytes), col("img", kindBinary, 16777215), col("note", kindString, 16777215),
		}}
	}
	for _, c := range []struct {
		packet int64
		want   []string
	}{
		{1 << 41, nil}, // everything fits, even the unbounded JSON
		{256 << 20, []string{"doc"}},
		{32 << 20, []string{"doc", "img"}}, // two MEDIUMs do not fit in 32 MiB
		{16 << 20, []string{"doc", "img", "note"}},
		{64 << 10, []string{"doc", "img", "note", "body"}},
		{0, []string{"doc", "img", "note", "body", "name"}}, // all the long ones; id is short
	} {
		p := plan()
		got := p.fitEncoding(c.packet)
		if !slices.Equal(got, c.want) {
			t.Errorf("packet %d: digested %v, want %v", c.packet, got, c.want)
		}
		if c.packet > 0 && p.encodingBound() > c.packet-encodingSlack {
			t.Errorf("packet %d: encoding bound %d", c.packet, p.encodingBound())
		}
		for _, pc := range p.Columns {
			if in := strings.Contains(p.rowEncoding(upSide), "SHA1("+p.text(upSide, pc)+")"); in != slices.Contains(got, pc.Name) {
				t.Errorf("packet %d: %s digested %v, its SHA1 in the encoding %v: %s", c.packet, pc.Name, !in, in, p.rowEncoding(upSide))
			}
		}
	}
}

func TestPieces(t *testing.T) {
	s := strings.Repeat("aé€😀", 1000)
	for _, n := range []int{1, 2, 3, 4, 5, 7, 100, len(s), len(s) + 1} {
		ps := pieces(s, n)
		if strings.Join(ps, "") != s {
			t.Fatalf("n=%d: pieces do not join to the text", n)
		}
		for _, p := range ps {
			if len(p) > max(n, 4) || (n >= 4 && !utf8.ValidString(p)) {
				t.Fatalf("n=%d: piece of %d bytes, valid %v", n, len(p), utf8.ValidString(p))
			}
		}
	}
	if pieces("", 10) != nil {
		t.Error("pieces of an empty text")
	}
}

// TestFixLongValues: a value whose literal is longer than fixLiteralBytes is built in a
// user variable from pieces, each SET well under a packet, then used and cleared.
func TestFixLongValues(t *testing.T) {
	p := testPlan()
	big := bytes.Repeat([]byte{0xff, 'x'}, fixPieceBytes) // 2 pieces, a 4x longer hex literal
	row := []sqlValue{stringValue("k"), stringValue("1"), nullValue, {Bytes: big}, nullValue, stringValue(strings.Repeat("y", fixLiteralBytes+1))}
	fix := p.missing(row, 1).fix
	lines := strings.Split(fix, "\n")
	if len(lines) != 2+5+1+1 { // v0: 2 pieces, v1: 5 (512 KiB + 1 byte), the statement, the clearing
		t.Fatalf("%d lines:\n%.300s", len(lines), fix)
	}
	var built []byte
	for _, l := range lines[:2] {
		i := strings.Index(l, "X'")
		b, err := hex.DecodeString(l[i+2 : strings.LastIndex(l, "'")])
		if err != nil {
			t.Fatal(err)
		}
		built = append(built, b...)
		if len(l) > 2*fixPieceBytes+100 {
			t.Errorf("a piece statement of %d bytes", len(l))
		}
	}
	if !bytes.Equal(built, big) {
		t.Error("the pieces do not rebuild the value")
	}
	if !strings.HasPrefix(lines[7], "REPLACE INTO") || !strings.HasSuffix(lines[7], "@parity_v0, NULL, CONVERT(@parity_v1 USING utf8mb4));") {
		t.Errorf("statement %q", lines[7])
	}
	if lines[8] != "SET @parity_v0 = NULL, @parity_v1 = NULL;" {
		t.Errorf("last line %q", lines[8])
	}
}

// TestParseLiteral: every literal Literal writes (the stored keys of differences) reads
// back to the value it was written from, so the re-check reads the same row again.
func TestParseLiteral(t *testing.T) {
	cases := []struct {
		kind colKind
		v    sqlValue
		lit  string
	}{
		{kindInt, stringValue("-42"), "-42"},
		{kindDecimal, stringValue("1.50"), "1.50"},
		{kindDouble, stringValue("1.5e-300"), "1.5e-300"},
		{kindString, stringValue("plain text é"), "'plain text é'"},
		{kindString, stringValue("o'k"), "_utf8mb4 X'6F276B'"},
		{kindString, stringValue("tab\there"), "_utf8mb4 X'7461620968657265'"},
		{kindString, sqlValue{Bytes: []byte{'a', 0xff}}, "X'61FF'"}, // not UTF-8: the bytes as read
		{kindString, stringValue(""), "''"},
		{kindString, stringValue("NULL"), "'NULL'"},
		{kindString, nullValue, "NULL"},
		{kindBinary, sqlValue{Bytes: []byte{0, 0xff, '\''}}, "X'00FF27'"},
		{kindJSON, stringValue(`{"a": "it's"}`), "CONVERT(X'7B2261223A202269742773227D' USING utf8mb4)"},
		{kindTemporal, stringValue("2024-02-29 23:59:59.123456"), "'2024-02-29 23:59:59.123456'"},
	}
	for _, c := range cases {
		lit := sqlLiteral(c.kind, c.v)
		if lit != c.lit {
			t.Errorf("Literal(%v, %q) = %s, want %s", c.kind, c.v.Bytes, lit, c.lit)
		}
		got, err := parseLiteral(lit)
		if err != nil {
			t.Errorf("parseLiteral(%s): %v", lit, err)
			continue
		}
		if got.Null != c.v.Null || !bytes.Equal(got.Bytes, c.v.Bytes) {
			t.Errorf("parseLiteral(%s) = %+v, want %+v", lit, got, c.v)
		}
	}
	for _, bad := range []string{"", "'a'b'", "X'0G'", "abc", "CONVERT(X'41' USING latin1)", "'back\\slash'", "_utf8mb4 X'4G'", "_latin1 X'41'"} {
		if _, err := parseLiteral(bad); err == nil {
			t.Errorf("parseLiteral(%q) accepted", bad)
		}
	}
}
