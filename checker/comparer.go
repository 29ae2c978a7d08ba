package checker

// comparer.go owns comparing one unit of a table on both sides: a range's checksums
// (whole, or per key bucket), the drill-down of a mismatched range to its differing rows
// (drill.go), the merge of two row streams and the keyless multiset comparison
// (rowdiff.go), and a key list's rows. It reports each difference to the sink it is given
// and returns the unit's result. It must not store run state, count totals, pace itself
// or decide what is compared next.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"time"

	"golang.org/x/sync/errgroup"
)

// checksum is one side's aggregate of a range: its row count, the sum of its row hashes
// and the query's time.
type checksum struct {
	count int64
	sum   string
	dur   time.Duration
}

func sameChecksum(a, b checksum) bool { return a.count == b.count && a.sum == b.sum }

type chunkResult struct {
	up, down checksum
	// differences counts the differing rows; undrilledChunk marks a mismatched chunk that
	// was not drilled down (Config.MaxDifferences).
	differences int64
}

// undrilledChunk is chunkResult.differences (and diff_chunks.differences) of a mismatched
// chunk whose rows were not compared.
const undrilledChunk = -1

// differenceSink receives a unit's differences.
type differenceSink interface {
	// full reports that no more differences are wanted (the table's budget is spent): a
	// mismatched range is then left undrilled.
	full() bool
	// emit takes one difference; errMaxDifferences ends the drill-down (undrilled).
	emit(Difference) error
}

// comparer compares units on a pair.
type comparer struct {
	pair *sourcePair
	// rowDiffRows: a mismatched range of at most this many rows is merged row by row
	// (Config.RowDiffRows); maxDifferences bounds the differing row groups a keyless
	// comparison holds in memory (Config.MaxDifferences, 0: none).
	rowDiffRows    int
	maxDifferences int64
	log            *slog.Logger
}

func newComparer(cfg *Config, pair *sourcePair, log *slog.Logger) *comparer {
	return &comparer{pair: pair, rowDiffRows: cfg.RowDiffRows, maxDifferences: cfg.MaxDifferences, log: log}
}

// compare compares unit u of table t and reports its differences to sink. A key unit's
// rows are merged; a range's checksums are compared and, when they differ, the range is
// drilled down unless sink is full. The result's differences are undrilledChunk for a
// mismatched range left undrilled; the caller counts the others from what sink received.
func (c *comparer) compare(ctx context.Context, t *target, u unit, sink differenceSink) (chunkResult, error) {
	if u.keys != nil {
		var res chunkResult
		if len(u.keys) == 0 {
			return res, nil // a scoped table without keys in its window
		}
		p := t.plan
		start := time.Now()
		rows, err := c.mergeCounted(ctx, t, p.rowsByKeysSQL(upSide, u.keys), p.rowsByKeysSQL(downSide, u.keys), sink.emit)
		res.up = checksum{count: rows[upSide], dur: time.Since(start)}
		res.down = checksum{count: rows[downSide], dur: res.up.dur}
		if errors.Is(err, errMaxDifferences) {
			res.differences = undrilledChunk
			return res, nil
		}
		return res, err
	}
	var lo, hi, width *big.Int
	grouped := u.grouped
	if grouped {
		// Both ends must be known keys (the first and last chunks are open-ended).
		if lo, hi, grouped = rangeInts(u.keyRange); grouped {
			width = bucketWidth(lo, hi, max(1, int64(u.size)/bucketRows))
		}
	}
	var res chunkResult
	var ub, db bucketSums
	var err error
	if grouped {
		if ub, db, err = c.readBuckets(ctx, t, u.keyRange, lo, hi, width); err == nil {
			if res.up, err = ub.total(); err == nil {
				res.down, err = db.total()
			}
		}
	} else {
		res.up, res.down, err = c.checksumBoth(ctx, t, u.keyRange)
	}
	if err != nil {
		return res, fmt.Errorf("chunk %d: %w", u.Seq, err)
	}
	differs := !sameChecksum(res.up, res.down)
	var differing []int64
	if grouped {
		// The buckets decide: the totals differ only where a bucket does, and buckets can
		// differ where the totals happen to agree.
		differing = differingBuckets(ub, db)
		differs = len(differing) > 0
	}
	if !differs {
		return res, nil
	}
	c.log.Debug("chunk differs", "table", t.name, "chunk", u.Seq, "up_count", res.up.count, "down_count", res.down.count, "grouped", grouped)
	if sink.full() {
		res.differences = undrilledChunk
		return res, nil
	}
	if grouped {
		err = c.followBuckets(ctx, t, u.keyRange, lo, hi, width, ub, db, differing, sink.emit, 1)
	} else {
		err = c.drill(ctx, t, u.keyRange, res.up, res.down, sink.emit, 0)
	}
	switch {
	case errors.Is(err, errMaxDifferences):
		res.differences = undrilledChunk
	case err != nil:
		return res, fmt.Errorf("chunk %d of %s: %w", u.Seq, t.name, err)
	}
	return res, nil
}

func (c *comparer) checksumSide(ctx context.Context, t *target, s pairSide, rng keyRange) (checksum, error) {
	var sum checksum
	err := c.pair.withSide(ctx, s, func(ctx context.Context, q Querier) error {
		start := time.Now()
		err := queryRow(ctx, q, t.plan.ChecksumSQL(s, rng), &sum.count, &sum.sum)
		sum.dur = time.Since(start)
		return err
	})
	if err != nil {
		return sum, fmt.Errorf("%s checksum of %s: %w", s, t.name, err)
	}
	return sum, nil
}

// checksumBoth runs the range's checksum on both sides at once.
func (c *comparer) checksumBoth(ctx context.Context, t *target, rng keyRange) (up, down checksum, err error) {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		var err error
		up, err = c.checksumSide(gctx, t, upSide, rng)
		return err
	})
	g.Go(func() error {
		var err error
		down, err = c.checksumSide(gctx, t, downSide, rng)
		return err
	})
	err = g.Wait()
	return up, down, err
}
