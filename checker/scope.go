package checker

// scope.go owns what units of work a table yields and in what order: rangeScope cuts a
// table's key space into chunks (index walk, value cutting, TiDB region starts, adaptive
// sizes from the comparer's feedback) and records them before handing them out, a
// resumed run's unfinished chunks first; keyScope hands out the keys of a table's stored
// differences in batches, for the re-check. A scope must not compare rows, store results
// or count what is done (the comparer and the tracker do). Modelled on spirit's chunker
// (pkg/table/chunker.go: Open, Next, Feedback).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"sync"
)

// scope yields the units of work of one table.
type scope interface {
	// next returns the next unit; ok is false when the table has no more.
	next(ctx context.Context) (u unit, ok bool, err error)
	// feedback tells the scope how a unit went (res.differences is final).
	feedback(u unit, res chunkResult)
}

var (
	_ scope = (*rangeScope)(nil)
	_ scope = (*keyScope)(nil)
)

// unit is one piece of a table's comparison: a key range (a chunk), or a list of keys.
type unit struct {
	keyChunk
	// grouped: the range is checksummed per key bucket of about size/bucketRows keys
	// (chunkSizer.plan, when the unit was handed out).
	grouped bool
	size    int
	// keys, for a key unit: only the rows of these keys are compared (keyRange is unused).
	keys []chunkBound
	// found, for a key unit of stored differences: the differences it re-reads.
	found *foundDiffs
}

// rangeScope cuts a table's key space into chunks (see the file comment).
type rangeScope struct {
	cfg   *Config
	t     *target
	pair  *sourcePair
	st    *store
	track *tracker
	log   *slog.Logger

	// Touched by next only (one producer).
	queue      []unit     // cut (or resumed) and recorded, not yet handed out
	lo         chunkBound // where the next cut starts
	seq        int        // the next cut chunk's seq
	split      bool       // the last chunk is cut
	regionKeys []chunkBound

	mu     sync.Mutex // the sizes, adapted by the workers' feedback
	sizer  *chunkSizer
	cutter *valueCutter // cuts a single integer key by value (nil: walk the index)
}

// openRangeScope prepares the cutting of a table: on resume, the chunks stored before
// (the unfinished ones are handed out first, and counted by the tracker), then TiDB's
// region starts and the key bounds for cutting by value.
func openRangeScope(ctx context.Context, cfg *Config, t *target, pair *sourcePair, st *store, track *tracker, log *slog.Logger) (*rangeScope, error) {
	s := &rangeScope{cfg: cfg, t: t, pair: pair, st: st, track: track, log: log, sizer: newChunkSizer(cfg)}
	if pair.anyTiDB() {
		s.sizer.drillCost = tidbDrillCostRows
	}
	if t.maxChunkRows > 0 {
		s.sizer.max = t.maxChunkRows
		s.sizer.cur = min(s.sizer.cur, s.sizer.max)
	}
	s.sizer.groupable = t.plan.intKey()
	if cfg.Resume != "" {
		stored, err := st.chunks(ctx, t.idx)
		if err != nil {
			return nil, err
		}
		track.restore(t.idx, stored)
		for _, c := range stored {
			s.lo, s.seq = c.keyRange.Hi, c.Seq+1
			s.split = s.split || c.Last
			if c.state != chunkDone {
				c.retry = true
				s.queue = append(s.queue, unit{keyChunk: c.keyChunk})
			}
		}
		if s.split {
			return s, nil
		}
	}
	p := t.plan
	if p.Flavor[upSide] == FlavorTiDB && len(p.Key) > 0 && !p.Keyless && p.numericKey() {
		s.loadRegions(ctx)
	}
	// Cut a single integer key by value (valueCutter), unless a row filter applies: its
	// MIN/MAX could scan the table, and the filtered keys' density is unknown.
	if p.intKey() && p.Where == "" {
		mn, mx, err := intKeyBounds(ctx, pair, t, keyRange{})
		switch {
		case errors.Is(err, errKeyBounds):
			// Only the chunk sizes depend on them: cut by rows instead.
			log.Warn("key bounds unusable: chunks cut by walking the key", "table", t.name, "err", err)
			mn = nil
		case err != nil:
			return nil, fmt.Errorf("table %s: %w", t.name, err)
		}
		if mn != nil {
			s.cutter = newValueCutter(mn, mx, t.estRows)
		}
	}
	return s, nil
}

// next hands out the next chunk, cutting and recording a batch when none is queued.
func (s *rangeScope) next(ctx context.Context) (unit, bool, error) {
	if len(s.queue) == 0 && !s.split {
		if err := s.cut(ctx); err != nil {
			return unit{}, false, err
		}
	}
	if len(s.queue) == 0 {
		return unit{}, false, nil
	}
	u := s.queue[0]
	s.queue = s.queue[1:]
	s.mu.Lock()
	u.size, u.grouped = s.sizer.plan()
	s.mu.Unlock()
	return u, true, nil
}

// cut cuts the next chunks after s.lo, records them and queues them.
func (s *rangeScope) cut(ctx context.Context) error {
	his, widths, err := s.nextBoundaries(ctx, s.lo)
	if err != nil {
		return err
	}
	batch := make([]keyChunk, len(his))
	lo, err := s.t.plan.encodeBound(s.lo)
	if err != nil {
		return fmt.Errorf("table %s: %w", s.t.name, err)
	}
	for i, hi := range his {
		enc, err := s.t.plan.encodeBound(hi)
		if err != nil {
			return fmt.Errorf("table %s: %w", s.t.name, err)
		}
		batch[i] = keyChunk{Table: s.t.idx, Seq: s.seq, keyRange: keyRange{Lo: s.lo, Hi: hi}, Last: hi == nil, bounds: [2]string{lo, enc}}
		lo = enc
		if widths != nil {
			batch[i].width = widths[i]
		}
		s.lo, s.seq = hi, s.seq+1
		if hi == nil {
			batch = batch[:i+1]
			s.split = true
			break
		}
	}
	if err := s.st.addChunks(ctx, batch); err != nil {
		return err
	}
	s.track.cut(s.t.idx, batch)
	for _, c := range batch {
		s.queue = append(s.queue, unit{keyChunk: c})
	}
	return nil
}

// feedback adapts the chunk sizes to how long the chunk took on the slower side, how
// many rows its key width held, and how many of them differed.
func (s *rangeScope) feedback(u unit, res chunkResult) {
	rows := max(res.up.count, res.down.count)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sizer.observe(int(rows), max(res.up.dur, res.down.dur).Seconds())
	if s.cutter != nil && u.width > 0 {
		s.cutter.observe(u.width, rows)
	}
	s.sizer.observeDiffs(rows, max(res.differences, 0))
}

// loadRegions reads the table's TiDB region start keys; chunks never straddle them, so
// each chunk query stays within one region (a failure only loses that optimisation).
func (s *rangeScope) loadRegions(ctx context.Context) {
	p := s.t.plan
	err := s.pair.withSide(ctx, upSide, func(ctx context.Context, q Querier) error {
		rows, err := q.QueryContext(ctx, p.regionSampleSQL())
		if err != nil {
			return err
		}
		defer rows.Close()
		rs := newRowStream(rows, len(p.Key))
		for {
			if err := rs.next(); err != nil {
				return err
			}
			if rs.done {
				return nil
			}
			b := chunkBound(rs.row())
			if n := len(s.regionKeys); n == 0 || p.compareKeys(s.regionKeys[n-1], b) != 0 {
				s.regionKeys = append(s.regionKeys, b)
			}
		}
	})
	if err != nil {
		s.log.Warn("region boundaries unavailable; walking the index", "table", s.t.name, "err", err)
		s.regionKeys = nil
	}
}

// cutKeys bounds the keys one boundary query reads on TiDB: chunks smaller than this are
// cut several at a time (every size-th key of one index walk), so cutting a table of small
// chunks costs one round trip per cutKeys keys instead of one per chunk (TiDB skips an
// OFFSET in its SQL layer: 2.4 ms per 4,000-row chunk against 1.6 ms in a batch). MySQL
// and MariaDB skip an OFFSET inside the index for less than it costs to send and parse
// every key: per 1M keys cut into 256 chunks, 0.18 s of server CPU against 0.24 s of
// server plus 0.18 s of parity CPU for batches of 32,768 keys (MariaDB 10.11), so they
// are cut one chunk per query.
const cutKeys = 32768

// nextBoundaries returns the upper bounds of the next chunks after lo, in key order: keys
// `size` rows apart in key order, cut at the next region start, and nil last when the rest
// of the table fits (the last chunk is open-ended, so rows beyond the last upstream key,
// extra downstream, are still compared). It returns at least one bound, and for chunks
// cut by key value their key widths.
func (s *rangeScope) nextBoundaries(ctx context.Context, lo chunkBound) ([]chunkBound, []float64, error) {
	p := s.t.plan
	if len(p.Key) == 0 {
		return []chunkBound{nil}, nil, nil // nothing to cut on: one chunk
	}
	// Cut at the next region start key (the chunk ends with that key's row, so it reads
	// at most one row of the next region). Region keys are only used for numeric and
	// temporal keys, where Go and the server order keys the same way.
	var limit chunkBound
	for _, k := range s.regionKeys {
		if lo == nil || p.compareKeys(k, lo) > 0 {
			limit = k
			break
		}
	}
	s.mu.Lock()
	size := s.sizer.size()
	byValue := s.cutter != nil && !s.cutter.off
	s.mu.Unlock()
	if byValue {
		his, widths, ok := s.cutByValue(lo, limit, size)
		if ok {
			return his, widths, nil
		}
	}
	var his []chunkBound
	side := cutSide(p)
	rng := keyRange{Lo: lo, Hi: limit}
	batch := 1
	if p.Flavor[side] == FlavorTiDB {
		batch = max(1, cutKeys/size)
	}
	full := false
	err := s.pair.withSide(ctx, side, func(ctx context.Context, q Querier) error {
		query := p.boundarySQL(side, rng, size-1)
		if batch > 1 {
			query = p.keysSQL(side, rng, batch*size)
		}
		rows, err := q.QueryContext(ctx, query)
		if err != nil {
			return err
		}
		defer rows.Close()
		rs := newRowStream(rows, len(p.Key))
		for n := 1; ; n++ {
			if err := rs.next(); err != nil {
				return err
			}
			if rs.done {
				return nil
			}
			if batch == 1 {
				his, full = append(his, chunkBound(rs.row())), true
			} else if n%size == 0 {
				his = append(his, chunkBound(rs.row()))
				full = n == batch*size
			}
		}
	})
	if err != nil {
		return nil, nil, fmt.Errorf("cut chunk of %s: %w", s.t.name, err)
	}
	if !full {
		// Fewer than size rows are left before the limit (or the end): the next chunk
		// ends there.
		if limit == nil || len(his) == 0 || p.compareKeys(his[len(his)-1], limit) != 0 {
			his = append(his, limit)
		}
	}
	return his, nil, nil
}

// valueBatch is how many chunks are cut by value at once (one meta statement stores
// them): few, so that the chunks' observed density soon steers the cutting.
const valueBatch = 8

// cutByValue cuts the next valueBatch chunks of a table with a valueCutter (see there); ok
// is false when a bound is not an integer (the caller walks the index).
func (s *rangeScope) cutByValue(lo, limit chunkBound, size int) (his []chunkBound, widths []float64, ok bool) {
	var l, lim *big.Int // nil: open end
	if lo != nil {
		if l, ok = boundInt(lo); !ok {
			return nil, nil, false
		}
	}
	if limit != nil {
		if lim, ok = boundInt(limit); !ok {
			return nil, nil, false
		}
	}
	s.mu.Lock()
	ints, widths := s.cutter.cut(l, lim, size, valueBatch)
	s.mu.Unlock()
	his = make([]chunkBound, len(ints))
	for i, v := range ints {
		if v != nil {
			his[i] = chunkBound{stringValue(v.String())}
		}
	}
	return his, widths, true
}

// cutSide is the side whose key index is walked to cut chunks. Any side's keys make valid
// boundaries (the first chunk starts at the beginning of the key space, the last is
// open-ended). A TiDB upstream is cut on a MySQL/MariaDB downstream: an index walk there
// costs a fraction of TiDB's (20 ms against 50-90 ms for 62,500 keys here) and keeps the
// load off the production side; unless a key column's collations differ, when the
// downstream could not walk its index in the upstream's order.
func cutSide(p *tablePlan) pairSide {
	if p.Flavor[upSide] != FlavorTiDB || p.Flavor[downSide] == FlavorTiDB {
		return upSide
	}
	for _, k := range p.Key {
		if c := p.Columns[k]; c.Enum || (c.Kind == kindString && c.Collation[0] != c.Collation[1]) {
			return upSide
		}
	}
	return downSide
}

// recheckBatch is how many differences one key unit of a keyScope holds (one pair of
// rowsByKeysSQL queries re-reads them).
const recheckBatch = 256

// recheckBatchBytes ends a key unit early once the fix SQL of its differences (which holds
// their rows) reaches this size: the re-read rows are held until the batch is stored.
const recheckBatchBytes = 8 << 20

var errBatchFull = errors.New("re-check batch full")

// foundDiffs are the stored differences a key unit re-reads.
type foundDiffs struct {
	refs []diffRef
	rows map[int]int64 // chunk → differing rows of the refs in it
	// The chunk each stored key was found in (the first, if several), by its exact key,
	// by its form under the collations (sameKey), and by its values outside character
	// columns (looseKey) for every key and for the keys without a sameKey form: a row read
	// again by key may come back spelled otherwise ('ABC' for 'abc' in a _ci column), and
	// is still the row of one of the unit's keys.
	exact, same, loose, unfolded map[string]int
}

func newFoundDiffs() *foundDiffs {
	return &foundDiffs{rows: map[int]int64{}, exact: map[string]int{}, same: map[string]int{}, loose: map[string]int{}, unfolded: map[string]int{}}
}

// add records stored difference ref, of key values vals and rows differing rows.
func (f *foundDiffs) add(p *tablePlan, ref diffRef, vals []any, rows int64) error {
	k, err := exactKey(vals)
	if err != nil {
		return err
	}
	f.refs = append(f.refs, ref)
	f.rows[ref.seq] += rows
	first := func(m map[string]int, k string) {
		if _, dup := m[k]; !dup {
			m[k] = ref.seq
		}
	}
	first(f.exact, k)
	loose := p.looseKey(vals)
	first(f.loose, loose)
	if s, ok := p.sameKey(vals); ok {
		first(f.same, s)
	} else {
		first(f.unfolded, loose)
	}
	return nil
}

// chunkOf returns the chunk in which the key of a difference found again (d.rk) was
// stored: the chunk of the same exact key, else of a key the collations hold equal (by
// sameKey; a key with a form that no stored key's form matches can only equal a stored
// key without one), else of a key equal outside its character columns, else the unit's
// first chunk (a row read by the unit's keys is the row of one of them).
func (f *foundDiffs) chunkOf(p *tablePlan, d Difference) (int, bool) {
	if c, ok := f.exact[string(d.rk)]; ok {
		return c, true
	}
	if vals, err := d.rk.Values(); err == nil && len(vals) == len(p.diffKeyColumns()) {
		loose := p.looseKey(vals)
		if s, ok := p.sameKey(vals); ok {
			if c, ok := f.same[s]; ok {
				return c, true
			}
			if c, ok := f.unfolded[loose]; ok {
				return c, true
			}
		}
		if c, ok := f.loose[loose]; ok {
			return c, true
		}
	}
	if len(f.refs) == 0 {
		return 0, false
	}
	return f.refs[0].seq, true
}

// keyScope hands out the keys of a keyed table's stored differences, in (chunk, n)
// order, recheckBatch at a time across chunks. Differences stored after the scope opened
// (numbered above their chunk's largest then) are skipped: each is read once.
type keyScope struct {
	t     *target
	st    *store
	maxN  map[int]int // chunk → its largest difference number when the scope opened
	seq   int64       // where the next batch starts: after (seq, n)
	after int64
	ended bool
}

func openKeyScope(ctx context.Context, t *target, st *store) (*keyScope, error) {
	maxN, err := st.maxDifferenceNs(ctx, t.idx)
	if err != nil {
		return nil, err
	}
	return &keyScope{t: t, st: st, maxN: maxN, seq: -1, after: -1}, nil
}

// next returns the next batch of keys.
func (s *keyScope) next(ctx context.Context) (unit, bool, error) {
	p := s.t.plan
	for !s.ended {
		u := unit{keyChunk: keyChunk{Table: s.t.idx}, found: newFoundDiffs()}
		bytes := 0
		limit := recheckBatch
		err := s.st.scanDifferences(ctx, s.t.idx, "", s.seq, s.after, &limit, func(sq, n int64, d Difference, fix string) error {
			s.seq, s.after = sq, n
			c, ok := s.maxN[int(sq)]
			if !ok || int(n) > c {
				return nil // stored after the scope opened
			}
			vals, err := p.keyValues(d)
			if err == nil {
				err = u.found.add(p, diffRef{seq: int(sq), n: int(n)}, vals, int64(max(1, d.Count)))
			}
			if err != nil {
				return fmt.Errorf("difference %d of chunk %d: %w", n, sq, err)
			}
			u.keys = append(u.keys, boundOf(vals))
			if bytes += len(fix); bytes >= recheckBatchBytes {
				return errBatchFull
			}
			return nil
		})
		full := errors.Is(err, errBatchFull)
		if err != nil && !full {
			return unit{}, false, err
		}
		// The scan reached the table's last difference.
		s.ended = !full && limit > 0
		if len(u.keys) > 0 {
			return u, true, nil
		}
	}
	return unit{}, false, nil
}

// feedback: key units are not sized.
func (s *keyScope) feedback(unit, chunkResult) {}
