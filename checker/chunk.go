package checker

// chunk.go owns key ranges and chunks: a chunkBound and a keyRange, how key values order in Go
// as the drill-down queries order them, a chunk (one unit of work), the chunk sizer fed
// by the comparer's timings and difference counts, and cutting a range by value. It
// must not query a server (the scopes cut through the pair) nor store chunks (state.go).

import (
	"bytes"
	"cmp"
	"math"
	"math/big"
	"strconv"
	"strings"
)

// chunkBound is a key tuple (one value per key column).
type chunkBound []sqlValue

// keyRange is the key range lo < key <= hi of a chunk. A nil Lo means from the start of the
// table, a nil Hi means to its end.
type keyRange struct {
	Lo, Hi chunkBound
}

// compareValue orders two non-NULL key values of kind k the way the drill-down queries
// order them (orderExpr): numbers by value, strings and binaries by bytes, temporal values
// by their fixed-width text. NULL sorts first, as in MySQL.
func compareValue(k colKind, a, b sqlValue) int {
	switch {
	case a.Null && b.Null:
		return 0
	case a.Null:
		return -1
	case b.Null:
		return 1
	}
	switch k {
	case kindInt, kindBit:
		// Fast path without allocation (the drill-down compares every row's key).
		if x, err1 := strconv.ParseInt(string(a.Bytes), 10, 64); err1 == nil {
			if y, err2 := strconv.ParseInt(string(b.Bytes), 10, 64); err2 == nil {
				return cmp.Compare(x, y)
			}
		}
		x, ok1 := new(big.Int).SetString(string(a.Bytes), 10)
		y, ok2 := new(big.Int).SetString(string(b.Bytes), 10)
		if ok1 && ok2 {
			return x.Cmp(y)
		}
	case kindDecimal:
		x, ok1 := new(big.Rat).SetString(string(a.Bytes))
		y, ok2 := new(big.Rat).SetString(string(b.Bytes))
		if ok1 && ok2 {
			return x.Cmp(y)
		}
	case kindFloat, kindDouble:
		x, err1 := strconv.ParseFloat(string(a.Bytes), 64)
		y, err2 := strconv.ParseFloat(string(b.Bytes), 64)
		if err1 == nil && err2 == nil {
			return cmp.Compare(x, y) // no NaN in MySQL; -0 and 0 compare equal
		}
	case kindTemporal:
		// TIME values (negative, or with more than two hour digits) do not order by text;
		// dates and datetimes (fixed width) do.
		if isTime(a.Bytes) && isTime(b.Bytes) {
			return compareTime(string(a.Bytes), string(b.Bytes))
		}
	}
	return bytes.Compare(a.Bytes, b.Bytes)
}

func isTime(b []byte) bool {
	return len(b) > 1 && !bytes.Contains(b[1:], []byte("-")) && bytes.Contains(b, []byte(":"))
}

func compareTime(a, b string) int {
	sec := func(s string) float64 {
		neg := strings.HasPrefix(s, "-")
		s = strings.TrimPrefix(s, "-")
		var h, m int
		var f float64
		parts := strings.SplitN(s, ":", 3)
		if len(parts) == 3 {
			h, _ = strconv.Atoi(parts[0])
			m, _ = strconv.Atoi(parts[1])
			f, _ = strconv.ParseFloat(parts[2], 64)
		}
		v := float64(h*3600+m*60) + f
		if neg {
			v = -v
		}
		return v
	}
	x, y := sec(a), sec(b)
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

// compareKeys orders two key tuples.
func (p *tablePlan) compareKeys(a, b []sqlValue) int {
	for i, k := range p.Key {
		if c := compareValue(p.Columns[k].Kind, a[i], b[i]); c != 0 {
			return c
		}
	}
	return 0
}

// keyChunk is one unit of work: a key range of one table.
type keyChunk struct {
	Table    int // index into the run's tables
	Seq      int // 0-based position of the chunk in its table's key order
	keyRange keyRange
	// Last marks the final chunk of its table.
	Last bool

	retry bool    // from a resumed run: an earlier attempt may have stored differences
	width float64 // key values spanned, when cut by value (0: cut otherwise, or open-ended)
	// bounds are keyRange's ends as stored (diff_chunks.lo_bound, hi_bound; see
	// encodeBound), set when the chunk is cut or read back.
	bounds [2]string
}

// chunkSizer adapts the number of rows per chunk so that a checksum query takes about
// Target on the slower side, within [Min, Max] rows; and, once rows differ, to the rate of
// differences (see size).
type chunkSizer struct {
	target   float64 // seconds
	min, max int
	rate     float64 // rows per second, exponentially weighted
	cur      int

	rows, diffs int64   // rows compared and differences found so far
	drillCost   float64 // a chunk's own cost in drill-down rows (drillCostRows, tidbDrillCostRows)
	// groupable: chunks can be checksummed per key bucket (a single integer key).
	groupable bool
	// alwaysGrouped groups every groupable chunk (Config.groupedChunks, for tests).
	alwaysGrouped bool
}

func newChunkSizer(cfg *Config) *chunkSizer {
	return &chunkSizer{target: cfg.ChunkTargetTime.Seconds(), min: cfg.MinChunkRows, max: cfg.MaxChunkRows,
		cur: max(cfg.MinChunkRows, min(cfg.MaxChunkRows, cfg.InitialChunkRows)), drillCost: drillCostRows,
		alwaysGrouped: cfg.groupedChunks}
}

// observe records that rows took seconds on the slower side.
func (s *chunkSizer) observe(rows int, seconds float64) {
	if rows < 100 || seconds <= 0 {
		return
	}
	r := float64(rows) / seconds
	if s.rate == 0 {
		s.rate = r
	} else {
		s.rate = 0.7*s.rate + 0.3*r
	}
	n := int(s.rate * s.target)
	// Grow at most 2× at a time so one fast chunk does not produce a huge next one.
	if n > 2*s.cur {
		n = 2 * s.cur
	}
	s.cur = max(s.min, min(s.max, n))
}

// observeDiffs records that a chunk of rows held diffs differences.
func (s *chunkSizer) observeDiffs(rows, diffs int64) {
	s.rows += rows
	s.diffs += diffs
}

// drillCostRows is the fixed cost of a chunk (a checksum query on each side, its
// scheduling and state) in rows compared by a drill-down (read from both sides and
// merged): 0.8 ms of CPU per chunk against 3.1 µs per row, measured with sysbench rows on
// MariaDB 10.11 (both servers and parity on one 2-core machine). tidbDrillCostRows is the
// same when a side is TiDB, whose per-query cost dominates: 6.5 ms per chunk against
// 3.6 µs per row with the CONV checksum form, 3.7 ms against 2.35 µs with the batch form
// (about 1,600; the cost is flat near its minimum, TiDB v8.5, unistore).
const (
	drillCostRows     = 270
	tidbDrillCostRows = 1800
)

// size is the number of rows for the next chunk. While no row differs it is the time-based
// size. Once differences show up at a rate d per row, a chunk of n rows costs, per row
// compared, drillCost/n for itself plus the probability that it holds a difference,
// 1-exp(-d*n), times a drill-down row: smaller chunks drill fewer rows for each
// difference but cost more queries. The size minimising that, about sqrt(drillCost/d),
// is used when it is cheaper than the time-based size (it is not when differences are so
// dense that nearly every chunk differs anyway).
//
// With grouped chunks (see plan) the size stays the time-based one.
func (s *chunkSizer) size() int {
	n, _ := s.plan()
	return n
}

// plan returns the next chunks' size and whether they are checksummed per key bucket
// (bucketChecksumSQL, about bucketRows rows each) instead of as a whole: a grouped chunk
// query costs more (groupedExtra per row), but a mismatched chunk then reads only the
// rows of its differing buckets instead of the whole chunk. Grouping is chosen when, at
// the rate of differences seen so far, it costs less than the best ungrouped chunk size;
// a table without differences is never grouped, and one whose differences thin out goes
// back.
func (s *chunkSizer) plan() (n int, grouped bool) {
	n = s.cur
	if s.groupable && s.alwaysGrouped {
		return n, true
	}
	if s.diffs == 0 || s.rows == 0 {
		return n, false
	}
	d := float64(s.diffs) / float64(s.rows)
	cost := func(n float64) float64 { return s.drillCost/n + 1 - math.Exp(-d*n) }
	best := cost(float64(n))
	if r := math.Sqrt(s.drillCost / d); r < float64(n) && cost(r) < best {
		n, best = max(s.min, int(r)), cost(r)
	}
	// Grouped, at the time-based size c: a mismatched chunk reads the rows of its
	// differing buckets (about bucketRows per difference) in one row query per side,
	// counted like a chunk's own cost.
	c := float64(s.cur)
	if s.groupable && groupedExtra+(2-math.Exp(-d*c))*s.drillCost/c+d*bucketRows < best {
		return s.cur, true
	}
	return n, false
}

// bucketRows is the number of rows per key bucket of a grouped chunk.
const bucketRows = 64

// groupedExtra is what grouping a chunk checksum by key bucket adds per row, in drill-down
// rows: the GROUP BY costs 25-35 % more server CPU than the plain checksum query on
// MariaDB and 5-15 % on TiDB (per 1M sysbench rows: 2.15-2.45 s against 1.70-1.95 s on
// MariaDB, 4.5-5.6 s against 4.2-5.0 s on TiDB). Calibrated on make bench's MariaDB pair
// with 100 scattered differences per 1M rows, where grouped chunks took 2.64-3.28 s and
// ungrouped ones (shrunk to about 1,650 rows) 3.18-3.62 s in interleaved runs: a streamed
// drill-down costs parity and the servers more per row than the drill-down cost constants
// count, and this keeps both pairs grouped there.
const groupedExtra = 0.15

// valueCutter cuts a table with a single integer key by key value instead of walking its
// index (spirit's "optimistic" chunker): the next chunk is (lo, lo+width], with no query at
// all. A key that is unique holds at most width rows in such a range, so a chunk is never
// bigger than width; the width is the sizer's row count divided by the key density (rows
// per key value), first estimated from the table statistics and then observed, clamped to
// [minValueDensity, 1], so a chunk holds at most 1/minValueDensity times the rows asked
// for. A table whose observed density falls below stopValueDensity (keys with big gaps,
// or a WHERE that keeps few rows) goes back to the index walk, which never cuts an empty
// or sparse chunk.
type valueCutter struct {
	min, max *big.Int // smallest and largest key on either side when the run started
	density  float64  // rows per key value used for the width

	// Observed by the workers (under tableState.mu).
	rows  int64   // rows (the larger side) of the chunks cut by value so far
	width float64 // key values those chunks spanned
	seen  int     // such chunks
	off   bool    // switched back to the index walk
}

const (
	minValueDensity  = 0.5
	stopValueDensity = 0.25
)

// newValueCutter returns a cutter for keys in [mn, mx] when the estimated row count makes
// value cutting worthwhile (estRows <= 0: unknown, assume dense; the observed density
// decides), or nil.
func newValueCutter(mn, mx *big.Int, estRows int64) *valueCutter {
	span, _ := new(big.Float).SetInt(new(big.Int).Add(new(big.Int).Sub(mx, mn), big.NewInt(1))).Float64()
	d := 1.0
	if estRows > 0 {
		d = float64(estRows) / span
		if d < stopValueDensity {
			return nil
		}
	}
	return &valueCutter{min: mn, max: mx, density: min(1, max(minValueDensity, d))}
}

// observe records a finished chunk of the given key width; the caller holds the table's
// mutex. After a few chunks the observed density replaces the estimate.
func (c *valueCutter) observe(width float64, rows int64) {
	if width <= 0 {
		return
	}
	c.rows += rows
	c.width += width
	c.seen++
	if c.seen < 4 {
		return
	}
	d := float64(c.rows) / c.width
	if d < stopValueDensity {
		c.off = true
		return
	}
	c.density = min(1, max(minValueDensity, d))
}

// cut returns the upper bounds of up to n chunks of about size rows after lo (nil: the
// start of the table), stopping at limit (a region start, nil: none). The last bound is
// nil when the key range is exhausted (the last chunk is open-ended). widths holds each
// chunk's key width (0 for the open-ended last one).
func (c *valueCutter) cut(lo, limit *big.Int, size, n int) (his []*big.Int, widths []float64) {
	w := big.NewInt(max(1, int64(float64(size)/c.density+0.5)))
	cur := new(big.Int).Sub(c.min, big.NewInt(1))
	if lo != nil {
		cur.Set(lo)
	}
	wf, _ := new(big.Float).SetInt(w).Float64()
	for range n {
		hi := new(big.Int).Add(cur, w)
		if hi.Cmp(c.max) >= 0 && (limit == nil || limit.Cmp(c.max) > 0) {
			return append(his, nil), append(widths, 0)
		}
		if limit != nil && hi.Cmp(limit) >= 0 {
			d, _ := new(big.Float).SetInt(new(big.Int).Sub(limit, cur)).Float64()
			return append(his, limit), append(widths, d)
		}
		his, widths = append(his, hi), append(widths, wf)
		cur = hi
	}
	return his, widths
}
