package checker

// drill.go is the comparer's drill-down: it narrows a mismatched range (key buckets for a
// single integer key, bisection otherwise) until its parts are small enough to merge row
// by row. It must not store or count what it finds: differences go to the emit it is given.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"time"

	"golang.org/x/sync/errgroup"
)

// drill narrows a mismatched range: bisect while it holds more than RowDiffRows rows,
// then merge-compare the rows.
func (c *comparer) drill(ctx context.Context, t *target, rng keyRange, up, down checksum, emit func(Difference) error, depth int) error {
	p := t.plan
	if p.Keyless {
		return c.diffKeyless(ctx, t, rng, emit, nil)
	}
	n, side := up.count, upSide
	if down.count > n {
		n, side = down.count, downSide
	}
	if n <= int64(c.rowDiffRows) || depth > 64 {
		return c.mergeRows(ctx, t, rng, emit)
	}
	if p.intKey() {
		return c.drillBuckets(ctx, t, rng, n, emit, depth)
	}
	var mid chunkBound
	err := c.pair.withSide(ctx, side, func(ctx context.Context, q Querier) error {
		row, err := firstRow(ctx, q, p.boundarySQL(side, rng, int(n/2)-1), len(p.Key))
		mid = chunkBound(row)
		return err
	})
	if err != nil {
		return fmt.Errorf("bisect: %w", err)
	}
	if mid == nil || (rng.Hi != nil && p.compareKeys(mid, rng.Hi) == 0) {
		return c.mergeRows(ctx, t, rng, emit)
	}
	for _, half := range []keyRange{{Lo: rng.Lo, Hi: mid}, {Lo: mid, Hi: rng.Hi}} {
		u, d, err := c.checksumBoth(ctx, t, half)
		if err != nil {
			return err
		}
		if sameChecksum(u, d) {
			continue
		}
		if err := c.drill(ctx, t, half, u, d, emit, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// drillBuckets narrows a mismatched range of a single integer key: it checksums
// ~n/(RowDiffRows/2) equal-width key buckets in one grouped query per side and follows only
// the buckets that differ.
func (c *comparer) drillBuckets(ctx context.Context, t *target, rng keyRange, n int64, emit func(Difference) error, depth int) error {
	lo, hi, ok := rangeInts(rng)
	if !ok {
		var err error
		lo, hi, err = intKeyBounds(ctx, c.pair, t, rng)
		switch {
		case errors.Is(err, errKeyBounds):
			// The servers' MIN/MAX contradict themselves; the rows decide.
			c.log.Warn("key bounds unusable: comparing the range's rows", "table", t.name, "err", err)
			return c.mergeRows(ctx, t, rng, emit)
		case err != nil:
			return err
		case lo == nil:
			// No rows by MIN/MAX, though the checksums differ: the rows decide.
			return c.mergeRows(ctx, t, rng, emit)
		}
	}
	width := bucketWidth(lo, hi, max(2, min(1024, n/int64(max(1, c.rowDiffRows/2)))))
	ub, db, err := c.readBuckets(ctx, t, rng, lo, hi, width)
	if err != nil {
		return err
	}
	return c.followBuckets(ctx, t, rng, lo, hi, width, ub, db, differingBuckets(ub, db), emit, depth)
}

// rangeInts returns the keys a range of a single integer key can hold, [Lo+1, Hi], when
// both ends are known integers (ok false otherwise: an open end needs MIN/MAX queries).
func rangeInts(rng keyRange) (lo, hi *big.Int, ok bool) {
	a, ok1 := boundInt(rng.Lo)
	b, ok2 := boundInt(rng.Hi)
	if !ok1 || !ok2 || a.Cmp(b) >= 0 {
		return nil, nil, false
	}
	return a.Add(a, big.NewInt(1)), b, true
}

// bucketWidth is the key width of buckets that cut [lo, hi] into about n buckets (at
// least 1).
func bucketWidth(lo, hi *big.Int, n int64) *big.Int {
	span := new(big.Int).Add(new(big.Int).Sub(hi, lo), big.NewInt(1))
	width := new(big.Int).Div(new(big.Int).Add(span, big.NewInt(n-1)), big.NewInt(max(1, n)))
	if width.Sign() <= 0 {
		width.SetInt64(1)
	}
	return width
}

// bucketSums are the per-bucket checksums of one side, by bucket number (as the server
// prints it), and the time their query took.
type bucketSums struct {
	sums map[string]checksum
	dur  time.Duration
}

// readBuckets checksums the key buckets of [lo, hi] (within rng) on both sides at once:
// bucket b holds the keys lo + b*width .. lo + (b+1)*width - 1. lo and hi only place the
// buckets: a row of rng below lo counts in bucket 0 and one above hi in the last bucket
// (bucketSums.add), whose ranges followBuckets opens to rng's ends, so every row of rng is
// in a bucket even when MIN/MAX were wrong (TiDB's unistore reads a descending scan, and
// so MAX, at a snapshot from the newest data: a row deleted after the snapshot is missing
// from MAX while the ranges still hold it).
func (c *comparer) readBuckets(ctx context.Context, t *target, rng keyRange, lo, hi, width *big.Int) (ub, db bucketSums, err error) {
	p := t.plan
	// Integer arithmetic when every key - lo fits a signed BIGINT (both servers then
	// compute (key - lo) DIV width without overflow); DECIMAL otherwise.
	intMath := new(big.Int).Sub(hi, lo).IsInt64()
	last := lastBucket(lo, hi, width)
	read := func(ctx context.Context, side pairSide) (bucketSums, error) {
		out := bucketSums{sums: map[string]checksum{}}
		err := c.pair.withSide(ctx, side, func(ctx context.Context, q Querier) error {
			start := time.Now()
			rows, err := q.QueryContext(ctx, p.bucketChecksumSQL(side, rng, lo.String(), width.String(), intMath))
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var b string
				var s checksum
				if err := rows.Scan(&b, &s.count, &s.sum); err != nil {
					return err
				}
				if err := out.add(b, s, last); err != nil {
					return err
				}
			}
			out.dur = time.Since(start)
			return rows.Err()
		})
		if err != nil {
			return bucketSums{}, fmt.Errorf("%s bucket checksums of %s: %w", side, t.name, err)
		}
		return out, nil
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() (err error) { ub, err = read(gctx, upSide); return })
	g.Go(func() (err error) { db, err = read(gctx, downSide); return })
	if err := g.Wait(); err != nil {
		return bucketSums{}, bucketSums{}, err
	}
	return ub, db, nil
}

// lastBucket is the number of the bucket holding hi.
func lastBucket(lo, hi, width *big.Int) int64 {
	return new(big.Int).Div(new(big.Int).Sub(hi, lo), width).Int64()
}

// add counts bucket b's checksum s, clamped into buckets 0..last (readBuckets).
func (bs bucketSums) add(b string, s checksum, last int64) error {
	n, err := strconv.ParseInt(b, 10, 64)
	if err != nil {
		v, ok := new(big.Int).SetString(b, 10)
		if !ok {
			return fmt.Errorf("bucket number %q is not an integer", b)
		}
		n = int64(v.Sign()) * (last + 1) // far outside: clamped below
	}
	n = min(max(n, 0), last)
	key := strconv.FormatInt(n, 10)
	if prev, ok := bs.sums[key]; ok {
		a, ok1 := new(big.Int).SetString(prev.sum, 10)
		c, ok2 := new(big.Int).SetString(s.sum, 10)
		if !ok1 || !ok2 {
			return fmt.Errorf("bucket checksum %q or %q is not an integer", prev.sum, s.sum)
		}
		s = checksum{count: prev.count + s.count, sum: a.Add(a, c).String()}
	}
	bs.sums[key] = s
	return nil
}

// total adds up the buckets of one side into the range's checksum: the row count, the
// exact sum of the per-row hashes (the aggregate the chunk query computes) and the
// query's time.
func (bs bucketSums) total() (checksum, error) {
	c := checksum{dur: bs.dur}
	sum := new(big.Int)
	for _, s := range bs.sums {
		v, ok := new(big.Int).SetString(s.sum, 10)
		if !ok {
			return c, fmt.Errorf("bucket checksum %q is not an integer", s.sum)
		}
		sum.Add(sum, v)
		c.count += s.count
	}
	c.sum = sum.String()
	return c, nil
}

// differingBuckets returns the numbers of the buckets whose checksums differ, in key order.
func differingBuckets(ub, db bucketSums) []int64 {
	var out []int64
	for b, u := range ub.sums {
		if d, ok := db.sums[b]; !ok || !sameChecksum(d, u) {
			i, _ := strconv.ParseInt(b, 10, 64)
			out = append(out, i)
		}
	}
	for b := range db.sums {
		if _, ok := ub.sums[b]; !ok {
			i, _ := strconv.ParseInt(b, 10, 64)
			out = append(out, i)
		}
	}
	slices.Sort(out)
	return out
}

// followBuckets drills the buckets of [lo, hi] (within rng) whose checksums differ
// (differing, from differingBuckets). Buckets of at most RowDiffRows rows on both sides are
// merge-compared together, one row query per side over all of them; larger ones are
// drilled further.
func (c *comparer) followBuckets(ctx context.Context, t *target, rng keyRange, lo, hi, width *big.Int, ub, db bucketSums, differing []int64, emit func(Difference) error, depth int) error {
	var small []keyRange
	last := lastBucket(lo, hi, width)
	for _, b := range differing {
		// Bucket b holds keys in [lo + b*w, lo + (b+1)*w - 1] = (lo + b*w - 1, lo + (b+1)*w - 1],
		// cut at hi: the width is rounded up, so the last bucket's span can pass the range's
		// end, and a sub-range beyond it would read (and report) rows of the next range.
		// The first and last buckets reach to rng's ends, which hold the rows clamped into
		// them (readBuckets); where lo and hi are rng's own ends this is the same range.
		start := new(big.Int).Add(lo, new(big.Int).Mul(big.NewInt(b), width))
		end := new(big.Int).Sub(new(big.Int).Add(start, width), big.NewInt(1))
		if end.Cmp(hi) > 0 {
			end = hi
		}
		sub := keyRange{Lo: chunkBound{stringValue(new(big.Int).Sub(start, big.NewInt(1)).String())}, Hi: chunkBound{stringValue(end.String())}}
		if b == 0 {
			sub.Lo = rng.Lo
		}
		if b == last {
			sub.Hi = rng.Hi
		}
		key := strconv.FormatInt(b, 10)
		u, d := ub.sums[key], db.sums[key]
		// One key value (several rows only where the downstream lacks the unique key)
		// cannot be narrowed by bucketing it again: merged, as small buckets are.
		if max(u.count, d.count) <= int64(c.rowDiffRows) || width.Cmp(big.NewInt(1)) == 0 {
			if n := len(small); n > 0 && rangesAdjoin(small[n-1], sub) {
				small[n-1].Hi = sub.Hi
			} else {
				small = append(small, sub)
			}
			continue
		}
		// Differences go out in key order: the small buckets before this one first.
		if err := c.mergeRanges(ctx, t, small, emit); err != nil {
			return err
		}
		small = small[:0]
		if err := c.drill(ctx, t, sub, u, d, emit, depth+1); err != nil {
			return err
		}
	}
	return c.mergeRanges(ctx, t, small, emit)
}

// rangesAdjoin reports whether b starts where a ends (a bucket range's bounds are the
// integers the buckets computed, so equal text is an equal key).
func rangesAdjoin(a, b keyRange) bool {
	return a.Hi != nil && b.Lo != nil && string(a.Hi[0].Bytes) == string(b.Lo[0].Bytes)
}

// boundInt reads a bound of a single integer key as an integer; ok is false for an open
// end (nil), NULL or a value that is not an integer.
func boundInt(b chunkBound) (v *big.Int, ok bool) {
	if b == nil || b[0].Null {
		return nil, false
	}
	return new(big.Int).SetString(string(b[0].Bytes), 10)
}

// errKeyBounds: a server's MIN and MAX of a key contradict each other (a NULL beside a
// value, MIN above MAX). They only place buckets and size chunks, so callers go on
// without them.
var errKeyBounds = errors.New("key bounds unusable")

// intKeyBounds returns the smallest and largest value of a single integer key in rng over
// both sides (nil, nil when both sides are empty).
func intKeyBounds(ctx context.Context, pair *sourcePair, t *target, rng keyRange) (lo, hi *big.Int, err error) {
	p := t.plan
	for _, side := range []pairSide{upSide, downSide} {
		err := pair.withSide(ctx, side, func(ctx context.Context, q Querier) error {
			var mn, mx sql.NullString
			if err := queryRow(ctx, q, p.minMaxSQL(side, rng), &mn, &mx); err != nil {
				return err
			}
			if !mn.Valid && !mx.Valid {
				return nil
			}
			if mn.Valid != mx.Valid {
				return fmt.Errorf("%w: %s returned MIN without MAX or MAX without MIN", errKeyBounds, side)
			}
			a, ok1 := new(big.Int).SetString(mn.String, 10)
			b, ok2 := new(big.Int).SetString(mx.String, 10)
			if !ok1 || !ok2 {
				return fmt.Errorf("%w: %s returned bounds that are not integers", errKeyBounds, side) // values stay out of logs
			}
			if a.Cmp(b) > 0 {
				return fmt.Errorf("%w: %s returned MIN above MAX", errKeyBounds, side)
			}
			if lo == nil || a.Cmp(lo) < 0 {
				lo = a
			}
			if hi == nil || b.Cmp(hi) > 0 {
				hi = b
			}
			return nil
		})
		if err != nil {
			return nil, nil, fmt.Errorf("key bounds: %w", err)
		}
	}
	return lo, hi, nil
}
