package checker

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strconv"

	"golang.org/x/sync/errgroup"
)

// drill narrows a mismatched range: bisect while it holds more than RowDiffRows rows,
// then merge-compare the rows.
func (r *runner) drill(ctx context.Context, ts *tableState, rng Range, up, down checksum, emit func(Difference) error, depth int) error {
	p := ts.plan
	if p.Keyless {
		return r.diffKeyless(ctx, ts, rng, emit)
	}
	n, side := up.count, Upstream
	if down.count > n {
		n, side = down.count, Downstream
	}
	if n <= int64(r.cfg.RowDiffRows) || depth > 64 {
		return r.mergeRows(ctx, ts, rng, emit)
	}
	if len(p.Key) == 1 && p.Columns[p.Key[0]].Kind == KindInt {
		return r.drillBuckets(ctx, ts, rng, n, emit, depth)
	}
	var mid Bound
	err := r.withSide(ctx, side, func(ctx context.Context, q Querier) error {
		row, err := firstRow(ctx, q, p.BoundarySQL(side, rng, int(n/2)-1), len(p.Key))
		mid = Bound(row)
		return err
	})
	if err != nil {
		return fmt.Errorf("bisect: %w", err)
	}
	if mid == nil || (rng.Hi != nil && p.compareKeys(mid, rng.Hi) == 0) {
		return r.mergeRows(ctx, ts, rng, emit)
	}
	for _, half := range []Range{{Lo: rng.Lo, Hi: mid}, {Lo: mid, Hi: rng.Hi}} {
		u, d, err := r.checksumBoth(ctx, ts, half)
		if err != nil {
			return err
		}
		if sameChecksum(u, d) {
			continue
		}
		if err := r.drill(ctx, ts, half, u, d, emit, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// drillBuckets narrows a mismatched range of a single integer key: it checksums
// ~n/(RowDiffRows/2) equal-width key buckets in one grouped query per side and follows only
// the buckets that differ.
func (r *runner) drillBuckets(ctx context.Context, ts *tableState, rng Range, n int64, emit func(Difference) error, depth int) error {
	p := ts.plan
	var lo, hi *big.Int
	known := false
	// Both ends known: the keys lie in [Lo+1, Hi], no MIN/MAX queries needed.
	a, ok1 := boundInt(rng.Lo)
	b, ok2 := boundInt(rng.Hi)
	if ok1 && ok2 && a.Cmp(b) < 0 {
		lo, hi, known = a.Add(a, big.NewInt(1)), b, true
	}
	if !known {
		var err error
		if lo, hi, err = r.intKeyBounds(ctx, ts, rng); err != nil {
			return err
		}
	}
	if lo == nil {
		return nil // both sides empty: cannot be
	}
	buckets := max(2, min(1024, n/int64(max(1, r.cfg.RowDiffRows/2))))
	span := new(big.Int).Add(new(big.Int).Sub(hi, lo), big.NewInt(1))
	width := new(big.Int).Div(new(big.Int).Add(span, big.NewInt(buckets-1)), big.NewInt(buckets))
	if width.Sign() <= 0 {
		width.SetInt64(1)
	}
	type bsum struct {
		cnt int64
		sum string
	}
	read := func(ctx context.Context, side Side) (map[string]bsum, error) {
		out := map[string]bsum{}
		err := r.withSide(ctx, side, func(ctx context.Context, q Querier) error {
			rows, err := q.QueryContext(ctx, p.BucketChecksumSQL(side, rng, lo.String(), width.String()))
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var b string
				var s bsum
				if err := rows.Scan(&b, &s.cnt, &s.sum); err != nil {
					return err
				}
				out[b] = s
			}
			return rows.Err()
		})
		if err != nil {
			return nil, fmt.Errorf("%s bucket checksums: %w", side, err)
		}
		return out, nil
	}
	var ub, db map[string]bsum
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() (err error) { ub, err = read(gctx, Upstream); return })
	g.Go(func() (err error) { db, err = read(gctx, Downstream); return })
	if err := g.Wait(); err != nil {
		return err
	}
	var differing []int64
	for b, u := range ub {
		if d, ok := db[b]; !ok || d != u {
			i, _ := strconv.ParseInt(b, 10, 64)
			differing = append(differing, i)
		}
	}
	for b := range db {
		if _, ok := ub[b]; !ok {
			i, _ := strconv.ParseInt(b, 10, 64)
			differing = append(differing, i)
		}
	}
	slices.Sort(differing)
	for _, b := range differing {
		// Bucket b holds keys in [lo + b*w, lo + (b+1)*w - 1] = (lo + b*w - 1, lo + (b+1)*w - 1],
		// cut at hi: the width is rounded up, so the last bucket's span can pass the range's
		// end, and a sub-range beyond it would read (and report) rows of the next range.
		start := new(big.Int).Add(lo, new(big.Int).Mul(big.NewInt(b), width))
		end := new(big.Int).Sub(new(big.Int).Add(start, width), big.NewInt(1))
		if end.Cmp(hi) > 0 {
			end = hi
		}
		sub := Range{Lo: Bound{StringValue(new(big.Int).Sub(start, big.NewInt(1)).String())}, Hi: Bound{StringValue(end.String())}}
		u, d := ub[strconv.FormatInt(b, 10)], db[strconv.FormatInt(b, 10)]
		if width.Cmp(big.NewInt(1)) == 0 {
			// One key value (several rows only where the downstream lacks the unique key):
			// bucketing it again cannot narrow it. Smaller buckets are left to drill, which
			// merges a range of up to RowDiffRows rows.
			if err := r.mergeRows(ctx, ts, sub, emit); err != nil {
				return err
			}
			continue
		}
		if err := r.drill(ctx, ts, sub, checksum{count: u.cnt, sum: u.sum}, checksum{count: d.cnt, sum: d.sum}, emit, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// boundInt reads a bound of a single integer key as an integer; ok is false for an open
// end (nil), NULL or a value that is not an integer.
func boundInt(b Bound) (v *big.Int, ok bool) {
	if b == nil || b[0].Null {
		return nil, false
	}
	return new(big.Int).SetString(string(b[0].Bytes), 10)
}

// intKeyBounds returns the smallest and largest value of a single integer key in rng over
// both sides (nil, nil when both sides are empty).
func (r *runner) intKeyBounds(ctx context.Context, ts *tableState, rng Range) (lo, hi *big.Int, err error) {
	p := ts.plan
	for _, side := range []Side{Upstream, Downstream} {
		err := r.withSide(ctx, side, func(ctx context.Context, q Querier) error {
			var mn, mx sql.NullString
			if err := queryRow(ctx, q, p.MinMaxSQL(side, rng), &mn, &mx); err != nil {
				return err
			}
			if !mn.Valid {
				return nil
			}
			a, ok1 := new(big.Int).SetString(mn.String, 10)
			b, ok2 := new(big.Int).SetString(mx.String, 10)
			if !ok1 || !ok2 {
				return errors.New("key bounds are not integers") // values stay out of logs
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

func queryRow(ctx context.Context, q Querier, query string, dest ...any) error {
	rows, err := q.QueryContext(ctx, query)
	if err != nil {
		return err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return sql.ErrNoRows
	}
	if err := rows.Scan(dest...); err != nil {
		return err
	}
	return rows.Err()
}

// firstRow returns the first row of query's n columns as values, or nil when it returns
// no row.
func firstRow(ctx context.Context, q Querier, query string, n int) ([]Value, error) {
	rows, err := q.QueryContext(ctx, query)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	s := newRowStream(rows, n)
	if err := s.next(); err != nil || s.done {
		return nil, err
	}
	return s.row(), nil
}

// diffSink persists a chunk's differences in batches, so memory stays bounded however
// many rows differ.
type diffSink struct {
	ctx   context.Context
	r     *runner
	chunk Chunk
	batch []storedDiff
	bytes int // size of batch (storedDiff.size)
	n     int // differences stored
	rows  int // differing rows (a keyless difference may stand for several copies)
}

func (s *diffSink) emit(d Difference) error {
	sd := newStoredDiff(s.chunk.Seq, s.n, d)
	if s.bytes+sd.size() > storedPieceBytes {
		if err := s.flush(s.ctx); err != nil {
			return err
		}
	}
	s.batch = append(s.batch, sd)
	s.bytes += sd.size()
	s.n++
	s.rows += max(1, d.Count)
	if len(s.batch) >= insertBatchRows || s.bytes > storedPieceBytes {
		return s.flush(s.ctx)
	}
	return nil
}

func (s *diffSink) flush(ctx context.Context) error {
	if err := s.r.st.addDifferences(ctx, s.chunk.Table, s.batch); err != nil {
		return err
	}
	s.batch = s.batch[:0]
	s.bytes = 0
	return nil
}
