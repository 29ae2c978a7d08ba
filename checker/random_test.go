package checker

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/testenv"
)

// The randomized differential test: for each seed, a random table (key shape and column
// types drawn from pools), random rows with edge values inserted alike on both sides, and
// random chunking settings. The sides must first compare equal. Then random changes are
// made downstream — single cells, rows deleted, rows added, keys moved — and parity must
// report exactly those rows, with the right kind and, for changed rows, exactly the changed
// column; its fix SQL must make the sides equal again.
//
// The truth is kept apart from parity: every row carries a column rid (never changed,
// never a key), and every reported key is looked up by its literal with plain SQL on the
// side that holds the row, so the report's key text is checked too. Keyless tables carry a
// group column g instead, equal for the copies of a row.
//
// PARITY_RANDOM_SEEDS=n runs seeds 1..n per pair (default 6), PARITY_RANDOM_SEEDS=a-b
// seeds a..b (a sweep past earlier ones); PARITY_RANDOM_SEED=s runs only seed s (to
// replay a failure, whose message names its seed).

func randomSeeds(t *testing.T) []uint64 {
	if s := os.Getenv("PARITY_RANDOM_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("PARITY_RANDOM_SEED: %v", err)
		}
		return []uint64{v}
	}
	from, n := uint64(1), 6
	if s := os.Getenv("PARITY_RANDOM_SEEDS"); s != "" {
		// n, or from-to (inclusive) to sweep seeds no earlier sweep ran.
		lo, hi, isRange := strings.Cut(s, "-")
		var err error
		if isRange {
			var a, b uint64
			if a, err = strconv.ParseUint(lo, 10, 64); err == nil {
				b, err = strconv.ParseUint(hi, 10, 64)
			}
			if err == nil && b < a {
				err = fmt.Errorf("range %d-%d is empty", a, b)
			}
			from, n = a, int(b-a+1)
		} else {
			n, err = strconv.Atoi(s)
		}
		if err != nil {
			t.Fatalf("PARITY_RANDOM_SEEDS %q: %v", s, err)
		}
	}
	seeds := make([]uint64, n)
	for i := range seeds {
		seeds[i] = from + uint64(i)
	}
	return seeds
}

func TestRandomDiffMariaDB(t *testing.T) {
	for _, seed := range randomSeeds(t) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) { testRandomDiff(t, mariaPair(t), seed, false, 0x5eed) })
	}
}

func TestRandomDiffTiDB(t *testing.T) {
	for _, seed := range randomSeeds(t) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) { testRandomDiff(t, tidbPair(t), seed, true, 0x71db) })
	}
}

// TestRandomDiffTiDBOldCollation runs the randomized test from a TiDB without new
// collations (strings compared as bytes whatever their collation) to the fallback MariaDB.
func TestRandomDiffTiDBOldCollation(t *testing.T) {
	for _, seed := range randomSeeds(t) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			testRandomDiff(t, pair{up: oldCollationTiDB(t), down: testenv.Downstream(t)}, seed, true, 0x01dc)
		})
	}
}

// testRandomDiff: stream picks the generator's stream, so that the pairs test different
// tables for the same seed number.
func testRandomDiff(t *testing.T, p pair, seed uint64, tidb bool, stream uint64) {
	r := rand.New(rand.NewPCG(seed, stream))
	tb := generateTable(r)
	var colDefs []string
	for i, c := range tb.cols {
		colDefs = append(colDefs, fmt.Sprintf("c%d %s", i, c.def))
	}
	t.Logf("seed %d: key %s, %d rows, columns %s", seed, tb.key.name, len(tb.rows), strings.Join(colDefs, ", "))
	p.both(t, tb.ddl())
	for start := 0; start < len(tb.rows); start += 500 {
		var vals []string
		for _, row := range tb.rows[start:min(start+500, len(tb.rows))] {
			vals = append(vals, tb.values(row))
		}
		p.both(t, "INSERT INTO rnd VALUES "+strings.Join(vals, ", "))
	}

	if tidb && (tb.key.name == "int" || tb.key.name == "bigint unsigned") && r.IntN(2) == 0 {
		// Regions: chunks are cut at their boundaries too.
		n := 2 + r.IntN(7)
		if tb.key.name == "int" {
			exec(t, p.up.DB, fmt.Sprintf("SPLIT TABLE rnd BETWEEN (-2147483648) AND (2147483647) REGIONS %d", n))
		} else {
			exec(t, p.up.DB, fmt.Sprintf("SPLIT TABLE rnd BETWEEN (0) AND (9223372036854775807) REGIONS %d", n))
		}
		t.Logf("upstream split into %d regions", n)
	}

	cfg := p.config(t, "rnd")
	cfg.InitialChunkRows = []int{3, 40, 500, 10000}[r.IntN(4)]
	cfg.MinChunkRows = 1
	cfg.RowDiffRows = []int{1, 4, 50, 20000}[r.IntN(4)]
	cfg.Concurrency = 1 + r.IntN(4)
	if tidb && r.IntN(2) == 0 {
		cfg.TiDBChecksum = TiDBChecksumPushdown
	}
	// Options from a stream of their own, so that they do not change a seed's table.
	o := rand.New(rand.NewPCG(seed, stream^0xf11e))
	f := filter{ignored: "-"}
	if o.IntN(4) == 0 {
		f.where = tb.idCol() + " % 3 <> 1"
		cfg.TableConfigs = []TableConfig{{Table: p.up.Name + ".rnd", Where: f.where}}
	}
	if len(tb.cols) > 1 && o.IntN(4) == 0 {
		f.ignored = fmt.Sprintf("c%d", o.IntN(len(tb.cols)))
		cfg.IgnoreColumns = []string{p.up.Name + ".rnd." + f.ignored}
	}
	// Chunks checksummed per key bucket (the cost model picks that only for sparse
	// differences and costly drill-downs, which these small tables seldom have).
	cfg.groupedChunks = o.IntN(3) == 0
	t.Logf("initial_chunk_rows %d, row_diff_rows %d, concurrency %d, tidb_checksum %q, where %q, ignored column %s, grouped chunks %v",
		cfg.InitialChunkRows, cfg.RowDiffRows, cfg.Concurrency, cfg.TiDBChecksum, f.where, f.ignored, cfg.groupedChunks)
	compared := 0
	for _, row := range tb.rows {
		if f.keep(row.id) {
			compared++
		}
	}

	rep := run(t, cfg)
	if tr := tableReport(t, rep, "rnd"); !tr.Equal() || tr.RowsChecked != int64(compared) || tr.DifferencesResolved != 0 {
		// Nothing changes while the run reads: a difference the re-check resolves was never
		// there, and the first read must not have reported it.
		t.Fatalf("seed %d: equal data reported different: %d rows checked of %d, %d differences %+v (%d resolved by the re-check), structure %+v",
			seed, tr.RowsChecked, compared, tr.DifferencesTotal, tr.Differences, tr.DifferencesResolved, tr.StructureProblems)
	}

	want := mutate(t, p, tb, r)
	t.Logf("changed downstream: %d missing, %d extra, %d differing", len(want.missing), len(want.extra), len(want.columns))
	if tidb && o.IntN(3) == 0 {
		// The upstream read at a TSO taken now; what changes upstream afterwards must not
		// be seen (by the comparison, the re-check or the fix SQL).
		cfg.Upstream.Snapshot = fmt.Sprint(testenv.TiDBTSO(t, p.up.DB))
		n := mutateUpstream(t, p, tb, want, o)
		t.Logf("upstream read at TSO %s; %d upstream changes after it", cfg.Upstream.Snapshot, n)
	}
	if r.IntN(3) == 0 {
		// Stopped after a few progress reports (chunks, drill-downs, the re-check) and
		// resumed: the result must be the same.
		rep = runInterrupted(t, cfg, 1+r.IntN(4))
	} else {
		rep = run(t, cfg)
	}
	tr := tableReport(t, rep, "rnd")
	checkRandomReport(t, p, tb, tr, f.apply(want), seed)

	if tr.DifferencesTotal > 0 {
		applyFix(t, p.down.DB, readFix(t, cfg, tr))
	}
	rep = run(t, cfg)
	if tr := tableReport(t, rep, "rnd"); !tr.Equal() {
		t.Fatalf("seed %d: after the fix SQL: %d differences %+v", seed, tr.DifferencesTotal, tr.Differences)
	}
	if !tidb {
		// Same server kind on both sides: the tables must now be byte for byte alike.
		// (Rows outside the WHERE filter and the ignored column are not compared, so not
		// fixed.)
		if u, d := dumpTable(t, p.up.DB, tb, f), dumpTable(t, p.down.DB, tb, f); !slices.Equal(u, d) {
			t.Fatalf("seed %d: after the fix SQL parity reports equal, but the rows differ:\nupstream   %q\ndownstream %q", seed, u, d)
		}
	}
}

// filter is a run's row filter and ignored column ("-" for none).
type filter struct {
	where   string
	ignored string
}

// keep reports whether the row with that rid (or g) passes the filter (rid % 3 <> 1).
func (f filter) keep(id int) bool { return f.where == "" || id%3 != 1 }

// apply removes from want what the filter hides: rows it leaves out, and changes to the
// ignored column alone (for a keyless copy, its missing and its extra row).
func (f filter) apply(want expectation) expectation {
	out := expectation{missing: map[int]int{}, extra: map[int]int{}, columns: map[int]string{}}
	for id, col := range want.columns {
		if f.keep(id) && col != f.ignored {
			out.columns[id] = col
		}
	}
	for id, n := range want.missing {
		if f.keep(id) && want.keylessCol[id] != f.ignored {
			out.missing[id] = n
		}
	}
	for id, n := range want.extra {
		if f.keep(id) && want.keylessCol[id] != f.ignored {
			out.extra[id] = n
		}
	}
	return out
}

func (tb *rtable) idCol() string {
	if tb.key.cols == nil {
		return "g"
	}
	return "rid"
}

// mutateUpstream changes upstream rows that the downstream changes left alone (and adds
// some): after a snapshot, so none of it may show. It returns the number of changes.
func mutateUpstream(t *testing.T, p pair, tb *rtable, want expectation, r *rand.Rand) int {
	n := 0
	touched := func(id int) bool {
		_, a := want.missing[id]
		_, b := want.extra[id]
		_, c := want.columns[id]
		return a || b || c
	}
	for _, i := range r.Perm(len(tb.rows))[:min(len(tb.rows), r.IntN(10))] {
		row := tb.rows[i]
		if touched(row.id) {
			continue
		}
		where := " WHERE " + tb.idCol() + " = " + strconv.Itoa(row.id)
		if r.IntN(2) == 0 {
			exec(t, p.up.DB, "DELETE FROM rnd"+where)
		} else {
			k := r.IntN(len(tb.cols))
			exec(t, p.up.DB, fmt.Sprintf("UPDATE rnd SET c%d = %s%s", k, tb.cols[k].gen(r), where))
		}
		n++
	}
	if tb.key.cols != nil {
		for i := range r.IntN(3) {
			exec(t, p.up.DB, "INSERT INTO rnd VALUES "+tb.values(tb.newRow(r, 2_000_000+i)))
			n++
		}
	}
	return n
}

// runInterrupted runs cfg, cancels it at its after-th progress report and resumes it by
// its ID (if it had not finished by then).
func runInterrupted(t *testing.T, cfg Config, after int) *Report {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	n := 0
	c := cfg
	c.Progress = func(Progress) {
		mu.Lock()
		defer mu.Unlock()
		if n++; n == after {
			cancel()
		}
	}
	rep, err := NewDiff(c, nil).Run(ctx)
	if err == nil {
		t.Logf("the run ended before its progress report %d", after)
		return rep
	}
	var re *RunError
	if !asRunError(err, &re) || re.State != RunCancelled {
		t.Fatalf("want a cancelled run, got %v", err)
	}
	t.Logf("cancelled at progress report %d; resuming %s", after, re.RunID)
	c = cfg
	c.Resume = re.RunID
	return run(t, c)
}

// mutate changes the downstream copy and returns what parity must report.
func mutate(t *testing.T, p pair, tb *rtable, r *rand.Rand) expectation {
	want := expectation{missing: map[int]int{}, extra: map[int]int{}, columns: map[int]string{}, keylessCol: map[int]string{}}
	if tb.key.cols == nil {
		return mutateKeyless(t, p, tb, r, want)
	}
	order := r.Perm(len(tb.rows))
	changes := r.IntN(min(len(tb.rows), 25) + 1)
	for _, i := range order[:changes] {
		row := tb.rows[i]
		where := " WHERE rid = " + strconv.Itoa(row.id)
		switch k := r.IntN(10); {
		case k < 6: // one cell
			c := r.IntN(len(tb.cols))
			name := fmt.Sprintf("c%d", c)
			expr := tb.cols[c].mut(name, r)
			if !tb.notNull[c] && row.vals[c] != "NULL" && r.IntN(5) == 0 {
				expr = "NULL"
			}
			exec(t, p.down.DB, "UPDATE rnd SET "+name+" = "+expr+where)
			want.columns[row.id] = name
		case k < 8:
			exec(t, p.down.DB, "DELETE FROM rnd"+where)
			want.missing[row.id] = 1
		default: // the key moves: the old key is missing, the new one extra
			nr := tb.newRow(r, row.id)
			var sets []string
			for j, c := range tb.keyCols {
				sets = append(sets, c+" = "+nr.key[j])
			}
			exec(t, p.down.DB, "UPDATE rnd SET "+strings.Join(sets, ", ")+where)
			want.missing[row.id], want.extra[row.id] = 1, 1
		}
	}
	for i := range r.IntN(4) {
		row := tb.newRow(r, 1_000_000+i)
		exec(t, p.down.DB, "INSERT INTO rnd VALUES "+tb.values(row))
		want.extra[row.id] = 1
	}
	return want
}

// mutateKeyless deletes and adds copies of rows and changes one cell of a copy (which
// makes that copy missing and the changed row extra). Each group is touched once.
func mutateKeyless(t *testing.T, p pair, tb *rtable, r *rand.Rand, want expectation) expectation {
	byG := map[int]rrow{}
	var gs []int
	for _, row := range tb.rows {
		if _, ok := byG[row.id]; !ok {
			gs = append(gs, row.id)
		}
		byG[row.id] = row
	}
	r.Shuffle(len(gs), func(i, j int) { gs[i], gs[j] = gs[j], gs[i] })
	for _, g := range gs[:r.IntN(min(len(gs), 20)+1)] {
		row := byG[g]
		match := keylessMatch(tb, row)
		switch k := r.IntN(3); k {
		case 0:
			exec(t, p.down.DB, "DELETE FROM rnd WHERE "+match+" LIMIT 1")
			want.missing[g] = 1
		case 1:
			exec(t, p.down.DB, "INSERT INTO rnd VALUES "+tb.values(row))
			want.extra[g] = 1
		case 2:
			c := r.IntN(len(tb.cols))
			name := fmt.Sprintf("c%d", c)
			exec(t, p.down.DB, "UPDATE rnd SET "+name+" = "+tb.cols[c].mut(name, r)+" WHERE "+match+" LIMIT 1")
			want.missing[g], want.extra[g] = 1, 1
			want.keylessCol[g] = name
		}
	}
	for i := range r.IntN(3) {
		row := tb.newRow(r, 1_000_000+i)
		exec(t, p.down.DB, "INSERT INTO rnd VALUES "+tb.values(row))
		want.extra[row.id] = 1
	}
	return want
}

// keylessMatch is a WHERE condition matching the copies of row exactly (binary
// comparison, so trailing spaces and case count).
func keylessMatch(tb *rtable, row rrow) string {
	conds := []string{"g = " + strconv.Itoa(row.id)}
	for i, v := range row.vals {
		name := fmt.Sprintf("c%d", i)
		if v == "NULL" {
			conds = append(conds, name+" IS NULL")
		} else {
			conds = append(conds, "BINARY "+name+" = BINARY "+v)
		}
	}
	return strings.Join(conds, " AND ")
}

func checkRandomReport(t *testing.T, p pair, tb *rtable, tr TableReport, want expectation, seed uint64) {
	t.Helper()
	got := expectation{missing: map[int]int{}, extra: map[int]int{}, columns: map[int]string{}}
	for _, d := range tr.Differences {
		db := p.up.DB
		if d.Kind == Extra {
			db = p.down.DB
		}
		id := lookupReported(t, db, tb, d, seed)
		n := max(d.Count, 1)
		switch d.Kind {
		case Missing:
			got.missing[id] += n
		case Extra:
			got.extra[id] += n
		case Differing:
			if _, dup := got.columns[id]; dup || len(d.Columns) != 1 {
				t.Errorf("seed %d: row %d reported differing in columns %v (again: %v)", seed, id, d.Columns, dup)
			}
			got.columns[id] = strings.Join(d.Columns, ",")
		}
	}
	if tr.DifferencesTruncated || tr.UndrilledChunks > 0 || tr.DifferencesResolved > 0 {
		t.Fatalf("seed %d: report truncated (%v), chunks undrilled (%d) or differences that were never there resolved by the re-check (%d)",
			seed, tr.DifferencesTruncated, tr.UndrilledChunks, tr.DifferencesResolved)
	}
	total := int64(len(want.columns))
	for _, n := range want.missing {
		total += int64(n)
	}
	for _, n := range want.extra {
		total += int64(n)
	}
	if !mapsEqual(got.missing, want.missing) || !mapsEqual(got.extra, want.extra) || !mapsEqual(got.columns, want.columns) || tr.DifferencesTotal != total {
		t.Fatalf("seed %d: report does not match the changes made:\n missing got %v want %v\n extra   got %v want %v\n differing got %v want %v\n total got %d want %d",
			seed, got.missing, want.missing, got.extra, want.extra, got.columns, want.columns, tr.DifferencesTotal, total)
	}
}

func mapsEqual[V comparable](a, b map[int]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// lookupReported finds the rid (or g) of a reported row by its key literals, with plain
// SQL on the side that holds it: the literals must select exactly that row.
func lookupReported(t *testing.T, db *sql.DB, tb *rtable, d Difference, seed uint64) int {
	t.Helper()
	var conds []string
	for _, kv := range d.Key {
		if kv.Value == "NULL" {
			conds = append(conds, ident.Quote(kv.Column)+" IS NULL")
			continue
		}
		// Binary comparison for the key of a keyless row (every column): the literal must
		// hold the exact bytes. Keys are unique under their own collation.
		if tb.key.cols == nil {
			conds = append(conds, "BINARY "+ident.Quote(kv.Column)+" = BINARY "+kv.Value)
		} else {
			conds = append(conds, ident.Quote(kv.Column)+" = "+kv.Value)
		}
	}
	col := "rid"
	if tb.key.cols == nil {
		col = "g"
	}
	q := "SELECT DISTINCT " + col + " FROM rnd WHERE " + strings.Join(conds, " AND ")
	ids := firstColumn(t, db, q)
	if len(ids) != 1 {
		t.Fatalf("seed %d: reported %s row %v selects %v on its side (%s)", seed, d.Kind, d.Key, ids, q)
	}
	id, err := strconv.Atoi(ids[0])
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// dumpTable returns every row's bytes, in a fixed order.
func dumpTable(t *testing.T, db *sql.DB, tb *rtable, f filter) []string {
	t.Helper()
	var cols []string
	for _, c := range tb.keyCols {
		cols = append(cols, "IFNULL(HEX("+c+"),'N')")
	}
	cols = append(cols, tb.idCol())
	for i := range tb.cols {
		if c := fmt.Sprintf("c%d", i); c != f.ignored {
			cols = append(cols, "IFNULL(HEX("+c+"),'N')")
		}
	}
	where := ""
	if f.where != "" {
		where = " WHERE " + f.where
	}
	return firstColumn(t, db, "SELECT CONCAT_WS('|', "+strings.Join(cols, ", ")+") AS r FROM rnd"+where+" ORDER BY r")
}
