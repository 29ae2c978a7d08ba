package checker

// chunksql.go owns ChunkSQL, the one way into the engine's per-chunk SQL from outside:
// tools that time the compare phase's queries alone (scripts/bench/diffbench's bare loop
// and its table of hash expressions) plan a table exactly as a run plans it and read the
// queries, without the plan's types joining the package's face.

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
)

// ChunkSQL is one table pair's per-chunk queries as a run with cfg would send them.
// The daemon does not use it.
type ChunkSQL struct {
	plan *tablePlan
}

// PlanChunkSQL plans upSchema.upTable (on up) against downSchema.downTable (on down) as a
// run with cfg plans it: both structures, each side's flavour, where a TiDB side computes
// its checksums (cfg.TiDBChecksum), string comparison, the servers' packet size, cfg.Hash
// and cfg's table settings. A structure problem that stops a run stops it too.
func PlanChunkSQL(ctx context.Context, up, down Source, cfg Config, upSchema, upTable, downSchema, downTable string) (*ChunkSQL, error) {
	log := slog.New(slog.DiscardHandler)
	pair, err := openPair(ctx, &cfg, up, down, log)
	if err != nil {
		return nil, err
	}
	pl := &planner{cfg: &cfg, pair: pair, log: log}
	t, err := pl.planTable(ctx, storedTable{upSchema: upSchema, upTable: upTable, downSchema: downSchema, downName: downTable})
	if err != nil {
		return nil, err
	}
	if t.fatal {
		var why []string
		for _, p := range t.problems {
			why = append(why, p.Problem)
		}
		return nil, fmt.Errorf("table %s: %s", t.name, strings.Join(why, "; "))
	}
	return &ChunkSQL{plan: t.plan}, nil
}

// Checksum returns the upstream's and the downstream's checksum query (count, checksum)
// over the chunk between lo and hi, bounds as stored in diff_chunks.lo_bound and
// hi_bound ("" is an open end).
func (c *ChunkSQL) Checksum(lo, hi string) ([2]string, error) {
	r, err := storedRange(lo, hi)
	if err != nil {
		return [2]string{}, err
	}
	return [2]string{c.plan.ChecksumSQL(upSide, r), c.plan.ChecksumSQL(downSide, r)}, nil
}

// LowerBound returns each side's query of a cost floor over the same chunk: kind "read"
// reads every compared column and hashes nothing; "crc32" sums a 32-bit CRC per row,
// below the 64 bits the engine requires. Only the first column (the count) is comparable.
func (c *ChunkSQL) LowerBound(kind, lo, hi string) ([2]string, error) {
	b := lowerBound(kind)
	if b != lowerBoundRead && b != lowerBoundCRC32 {
		return [2]string{}, fmt.Errorf("lower bound %q: want %s or %s", kind, lowerBoundRead, lowerBoundCRC32)
	}
	r, err := storedRange(lo, hi)
	if err != nil {
		return [2]string{}, err
	}
	return [2]string{c.plan.LowerBoundSQL(upSide, r, b), c.plan.LowerBoundSQL(downSide, r, b)}, nil
}

// storedRange decodes a chunk's stored bounds.
func storedRange(lo, hi string) (keyRange, error) {
	var r keyRange
	var err error
	if r.Lo, err = decodeBound(lo); err != nil {
		return r, fmt.Errorf("lo bound: %w", err)
	}
	if r.Hi, err = decodeBound(hi); err != nil {
		return r, fmt.Errorf("hi bound: %w", err)
	}
	return r, nil
}
