package cdc

import (
	"context"
	"database/sql"
	"fmt"
	"hash/maphash"
	"log/slog"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/ledger"
	"github.com/tidb-parity/parity/internal/retry"
	"github.com/tidb-parity/parity/internal/rowkey"
)

// applier writes rows and DDLs into the downstream.
//
// Rows of a round (every buffered row with commit ts <= target) are spread over Workers
// connections. Each table of the round gets a lane: a set of workers sized by its share
// of the round's rows (one worker for a table with at most 1/Workers of the rows, all of
// them for a table holding all rows), least-loaded workers first, so that with several
// tables each connection writes one table in long statements (as a bulk load would)
// rather than every connection contending for the same table's pages.
//
// How a table's rows are written is decided by the table — its unique indexes and its
// key columns' collations, read from the downstream's schema (tableInfo) — never by the
// columns one event happens to carry (a handle-key-only delete carries no unique flags):
//   - tables whose handle is their only unique key: by a hash of the handle's
//     collation-aware key (internal/rowkey) over the table's lane, so every version of a
//     row, and every spelling the collation holds equal ('Ase', 'ASE', 'Asé', 'Ase '),
//     goes to one connection in commit-ts order; statements are idempotent
//     upserts/deletes and replaying a round converges. A key Go cannot fold safely
//     ('ß', a locale-tailored collation) may equal any key of the table: the table's
//     earlier rows of the round are waited for (a fence) and the rest go through one
//     connection;
//   - tables with other unique keys: by table (the lane's first worker), in order, with
//     REPLACE (TiCDC's safe mode), which also converges on replay;
//   - tables without a handle: the table's rows of the round and its table_progress row
//     commit in one transaction, so a replay skips them and duplicates never double.
//
// The round's checkpoint is written only after every worker finished.
type applier struct {
	db    *sql.DB // apply sessions: time_zone of the changefeed, foreign_key_checks=0
	meta  *meta
	cfg   Config
	log   *slog.Logger
	hooks *testHooks

	mu            sync.Mutex
	tableProgress map[tableKey]uint64

	rows atomic.Int64 // rows applied (statements' row images), for the round's log line
	// round counts the row events of the round in progress by open.Op - 1 (insert,
	// update, delete); they go to ctr once the round's rows are all written.
	round [3]atomic.Int64
	ctr   *counters

	tables *tableInfos // downstream tables: unique indexes, key collations
	// load is true when upserts may be written as LOAD DATA (applier.load-data and the
	// fallback's local_infile; load.go).
	load   bool
	seed   maphash.Seed // for hashKey
	texts  []stmtTexts  // per worker, kept between rounds (apply_write.go)
	chunks chan []op    // op chunks workers have finished with, for producers to fill again
}

func newApplier(db *sql.DB, m *meta, cfg Config, log *slog.Logger, hooks *testHooks, progress map[tableKey]uint64, ctr *counters) *applier {
	if ctr == nil {
		ctr = new(counters)
	}
	a := &applier{db: db, meta: m, cfg: cfg, log: log, hooks: hooks, tableProgress: progress, ctr: ctr, seed: maphash.MakeSeed(),
		texts: make([]stmtTexts, cfg.Applier.Workers), chunks: make(chan []op, spareChunks)}
	a.tables = newTableInfos(func(ctx context.Context, schema, table string) (t *tableInfo, err error) {
		err = a.retry(ctx, ident.Table(schema, table), func(ctx context.Context) error {
			t, err = loadTableInfo(ctx, db, schema, table)
			return err
		})
		return t, err
	})
	return a
}

// op is one unit of work for a worker.
type op struct {
	schema, table string // downstream names
	del           bool
	mode          writeMode
	cols          []open.Column // upsert: the row to write; delete: the handle columns
	info          *tableInfo    // upsert: the downstream table (nil when it has none)
	unit          *keylessUnit
	// fence asks the worker to write everything it was sent so far, then to send on
	// fence (see produce).
	fence chan<- struct{}
}

// keylessUnit applies a table without a handle in one transaction.
type keylessUnit struct {
	tb     *tableBuf
	target uint64
}

func (a *applier) progressOf(k tableKey) uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.tableProgress[k]
}

// applyRows applies every buffered row with commit ts <= target. With the ledger on it
// returns the round's ledger parts: which keys of which tables it changed.
func (a *applier) applyRows(ctx context.Context, buf *buffer, target uint64) ([]ledgerPart, error) {
	tables := buf.tablesUpTo(target)
	if len(tables) == 0 {
		return nil, nil
	}
	counts := roundCounts(tables, target)
	// One collector per table, filled by the table's producer alone.
	var keys []*keyCollector
	if a.cfg.Applier.Ledger {
		keys = make([]*keyCollector, len(tables))
		for i, tb := range tables {
			keys[i] = newKeyCollector(tb.key, counts[i])
		}
	}
	w := a.cfg.Applier.Workers
	chans := make([]chan []op, w)
	for i := range chans {
		chans[i] = make(chan []op, 4*a.cfg.Applier.BatchRows/opChunk+1)
	}
	g, gctx := errgroup.WithContext(ctx)
	for i := range chans {
		ch := chans[i]
		g.Go(func() error {
			err := a.worker(gctx, ch, workerNames[i%len(workerNames)], &a.texts[i])
			if err != nil {
				for range ch { // let the producer finish
				}
			}
			return err
		})
	}
	for i := range a.round {
		a.round[i].Store(0)
	}
	lanes := assignLanes(counts, w)
	g.Go(func() error {
		defer func() {
			for _, ch := range chans {
				close(ch)
			}
		}()
		// One producer per table (a bounded number at a time): a worker never waits for
		// another table's rows to be read. A table's rows keep their order: one producer
		// reads them, and each row's versions go to one worker.
		pg, pctx := errgroup.WithContext(gctx)
		pg.SetLimit(2 * w)
		for i, tb := range tables {
			var kc *keyCollector
			if keys != nil {
				kc = keys[i]
			}
			pg.Go(func() error { return a.produce(pctx, tb, target, chans, lanes[i], kc) })
		}
		return pg.Wait()
	})
	if err := g.Wait(); err != nil {
		return nil, err
	}
	for i := range a.round {
		a.ctr.byOp[i].Add(a.round[i].Load())
	}
	var parts []ledgerPart
	for _, kc := range keys {
		if err := kc.flush(); err != nil {
			return nil, err
		}
		parts = append(parts, kc.parts...)
	}
	return parts, nil
}

// keyCollector gathers the keys one table's producer sends in a round, encoding them
// into ledger parts as they reach ledger.MaxPartKeys (a part holds its keys compressed,
// a few bytes each). Keys are kept in one buffer until a part is encoded: one
// allocation per part, not per row.
type keyCollector struct {
	table tableKey
	buf   []byte   // the keys, back to back
	refs  []keyRef // where each key ends in buf, and its commit ts
	parts []ledgerPart
}

type keyRef struct {
	end uint32 // offset in buf just past the key (it starts where the previous one ends)
	ts  uint64
}

// newKeyCollector returns a collector sized for rows keys (up to a part's), so that it
// does not grow its buffers row by row: they started empty every round, and their
// growing was 2 % of serve's CPU under the insert bench.
func newKeyCollector(table tableKey, rows int64) *keyCollector {
	n := int(min(max(rows, 1), ledger.MaxPartKeys))
	return &keyCollector{table: table, buf: make([]byte, 0, n*keyBytesGuess), refs: make([]keyRef, 0, n)}
}

// keyBytesGuess is the bytes of a typical key (an integer handle encodes in 9).
const keyBytesGuess = 10

// add records that the row with handle columns cols (among cols) changed at ts.
func (kc *keyCollector) add(cols []open.Column, ts uint64) error {
	if kc == nil {
		return nil
	}
	for i := range cols {
		if !cols[i].IsHandle() {
			continue
		}
		var ok bool
		if kc.buf, ok = rowkey.Append(kc.buf, cols[i].Value, rowkey.Exact); !ok {
			return fmt.Errorf("table %s: handle column %s holds a %T, which no key can", kc.table, cols[i].Name, cols[i].Value)
		}
	}
	kc.refs = append(kc.refs, keyRef{end: uint32(len(kc.buf)), ts: ts})
	if len(kc.refs) >= ledger.MaxPartKeys || len(kc.buf) >= 64<<20 {
		return kc.flush()
	}
	return nil
}

// flush encodes the keys gathered so far into a part.
func (kc *keyCollector) flush() error {
	if kc == nil || len(kc.refs) == 0 {
		return nil
	}
	es := make([]ledger.Entry, len(kc.refs))
	start := uint32(0)
	minTs := kc.refs[0].ts
	for i, r := range kc.refs {
		es[i] = ledger.Entry{Key: rowkey.Key(kc.buf[start:r.end:r.end]), CommitTs: r.ts}
		start = r.end
		minTs = min(minTs, r.ts)
	}
	es = ledger.Compact(es)
	blob, err := ledger.Encode(es, minTs)
	if err != nil {
		return fmt.Errorf("table %s: %w", kc.table, err)
	}
	kc.parts = append(kc.parts, ledgerPart{table: kc.table, part: len(kc.parts), minTs: minTs, count: len(es), entries: blob})
	kc.buf, kc.refs = kc.buf[:0], kc.refs[:0]
	return nil
}

// opChunk is the number of ops a producer hands to a worker at once (one channel
// operation per chunk rather than per row).
const opChunk = 64

// spareChunks bounds the op chunks kept for reuse (applier.chunks): a worker that has
// applied a chunk's ops hands it back cleared, so a round makes new chunks only while
// more are in flight than were kept (making them was 1.5 % of serve's CPU).
const spareChunks = 256

// newChunk returns an empty op chunk: a spare one, else a new one.
func (a *applier) newChunk() []op {
	select {
	case c := <-a.chunks:
		return c
	default:
		return make([]op, 0, opChunk)
	}
}

// spareChunk keeps c, whose ops have been applied, for newChunk (unless enough are kept).
func (a *applier) spareChunk(c []op) {
	clear(c) // no references to the round's rows
	select {
	case a.chunks <- c[:0]:
	default:
	}
}

// roundCounts returns the rows each table has up to target: the round's rows, counted
// once for the lanes and the key collectors.
func roundCounts(tables []*tableBuf, target uint64) []int64 {
	counts := make([]int64, len(tables))
	for i, tb := range tables {
		counts[i] = tb.countUpTo(target)
	}
	return counts
}

// assignLanes gives each table of a round (rows[i] its rows, roundCounts) the workers
// its rows are spread over: a table with n of the round's total rows gets
// round(n*workers/total) workers (at least one), the least loaded ones; the largest
// tables are placed first.
func assignLanes(rows []int64, workers int) [][]int {
	counts := make([]int64, len(rows))
	var total int64
	for i, n := range rows {
		counts[i] = max(n, 1)
		total += counts[i]
	}
	order := make([]int, len(rows))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(x, y int) bool { return counts[order[x]] > counts[order[y]] })
	load := make([]float64, workers)
	byLoad := make([]int, workers)
	lanes := make([][]int, len(rows))
	for _, ti := range order {
		k := int(math.Round(float64(counts[ti]) * float64(workers) / float64(total)))
		k = min(max(k, 1), workers)
		for i := range byLoad {
			byLoad[i] = i
		}
		sort.SliceStable(byLoad, func(x, y int) bool { return load[byLoad[x]] < load[byLoad[y]] })
		lane := append([]int(nil), byLoad[:k]...)
		sort.Ints(lane)
		for _, wi := range lane {
			load[wi] += float64(counts[ti]) / float64(k)
		}
		lanes[ti] = lane
	}
	return lanes
}

func (a *applier) produce(ctx context.Context, tb *tableBuf, target uint64, chans []chan []op, lane []int, keys *keyCollector) error {
	schema, table := a.cfg.targetSchema(tb.key.Schema), tb.key.Table
	tableWorker := lane[0]
	// Ops wait in a per-worker chunk; a worker receives them in the order they were
	// produced, since every chunk of this table for it comes from here.
	pend := make([][]op, len(chans))
	flush := func(w int) error {
		if len(pend[w]) == 0 {
			return nil
		}
		select {
		case chans[w] <- pend[w]:
			pend[w] = a.newChunk()
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	send := func(w int, o op) error {
		if pend[w] == nil {
			pend[w] = a.newChunk()
		}
		pend[w] = append(pend[w], o)
		if len(pend[w]) >= opChunk {
			return flush(w)
		}
		return nil
	}
	// fence waits until every worker of the lane but the table's own has written what
	// it was sent of this round: from then on the table's rows all go to tableWorker.
	fence := func() error {
		acks := make(chan struct{}, len(lane))
		n := 0
		for _, w := range lane {
			if w == tableWorker {
				continue
			}
			if err := send(w, op{fence: acks}); err != nil {
				return err
			}
			if err := flush(w); err != nil {
				return err
			}
			n++
		}
		for ; n > 0; n-- {
			select {
			case <-acks:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
	var info *tableInfo
	ordered := len(lane) == 1
	mode := modeUpsert
	var key []byte
	// route picks the worker of a row by its handle columns (among cols): every
	// version of a key, and every spelling the downstream's collation holds equal,
	// goes to one worker. A key that cannot be folded safely in Go may equal any other
	// key of the table: the table's earlier rows of the round are waited for and the
	// rest go through tableWorker.
	route := func(cols []open.Column) (int, error) {
		if ordered {
			return tableWorker, nil
		}
		var ok bool
		key, ok = info.routeKey(key[:0], cols)
		if !ok {
			if err := fence(); err != nil {
				return 0, err
			}
			ordered = true
			return tableWorker, nil
		}
		return lane[a.hashKey(key)%uint64(len(lane))], nil
	}
	first := true
	for ev, err := range tb.events(target) {
		if err != nil {
			return err
		}
		cols := writable(ev.Columns)
		keyed := hasHandle(cols)
		if first {
			first = false
			if !keyed {
				if err := send(tableWorker, op{unit: &keylessUnit{tb: tb, target: target}}); err != nil {
					return err
				}
				return flush(tableWorker)
			}
			// The table decides how its rows are written, never the columns one event
			// happens to carry.
			if info, err = a.tables.get(ctx, schema, table); err != nil {
				return err
			}
			if info.exists && info.otherUnique(cols) {
				ordered, mode = true, modeReplace
			}
		}
		if !keyed {
			return fmt.Errorf("table %s: row at commit ts %d has no handle key while earlier rows of the round had one", tb.key, ev.CommitTs)
		}
		m := mode
		if !info.exists {
			// No downstream table to read: one ordered connection, REPLACE when the
			// row shows another unique key; the statement's error names the table.
			ordered = true
			if hasOtherUnique(cols) {
				m = modeReplace
			}
		}
		a.countOp(ev.Op)
		switch ev.Op {
		case open.OpDelete:
			handle := handleCols(cols)
			if err := keys.add(handle, ev.CommitTs); err != nil {
				return err
			}
			w, err := route(handle)
			if err != nil {
				return err
			}
			if err := send(w, op{schema: schema, table: table, del: true, cols: handle}); err != nil {
				return err
			}
		case open.OpUpdate:
			if ev.OldColumns != nil && handleChanged(ev, cols) {
				old := handleCols(writable(oldRow(ev)))
				if err := keys.add(old, ev.CommitTs); err != nil {
					return err
				}
				w, err := route(old)
				if err != nil {
					return err
				}
				if err := send(w, op{schema: schema, table: table, del: true, cols: old}); err != nil {
					return err
				}
			}
			fallthrough
		default:
			if err := keys.add(cols, ev.CommitTs); err != nil {
				return err
			}
			w, err := route(cols)
			if err != nil {
				return err
			}
			if err := send(w, op{schema: schema, table: table, mode: m, cols: cols, info: info}); err != nil {
				return err
			}
		}
	}
	for w := range pend {
		if err := flush(w); err != nil {
			return err
		}
	}
	return nil
}

// countOp counts a row event of the round by its type.
func (a *applier) countOp(op open.Op) {
	if i := int(op) - 1; i >= 0 && i < len(a.round) {
		a.round[i].Add(1)
	}
}

// retry runs f with a per-attempt timeout, retrying transient errors with backoff
// (internal/retry's policy, bounded by applier.max-retries).
func (a *applier) retry(ctx context.Context, what string, f func(context.Context) error) error {
	p := retry.Policy{MaxRetries: a.cfg.Applier.MaxRetries, Backoff: a.cfg.Applier.RetryBackoff, Timeout: a.cfg.Applier.QueryTimeout}
	err := p.Do(ctx, f, func(attempt int, wait time.Duration, err error) {
		a.ctr.downRetries.Add(1)
		a.log.Warn("transient downstream error, retrying", "table", what, "attempt", attempt, "backoff", wait, "err", err)
	})
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("applying to %s: %w", what, err)
	}
	return err
}

// hashKey hashes a row key (tableInfo.routeKey) for routing. The seed is the applier's:
// a key hashes alike for the applier's life, which is all routing needs (each round's
// workers finish before the next round).
func (a *applier) hashKey(key []byte) uint64 {
	return maphash.Bytes(a.seed, key)
}

// Test hooks inject failures at named points, to prove crash convergence.
type hookPoint string

const (
	hookBeforeKeylessCommit hookPoint = "before-keyless-commit"
	hookAfterRows           hookPoint = "after-rows"         // rows of a round applied, checkpoint not written
	hookBetweenStatements   hookPoint = "between-statements" // inside a worker's transaction, between two statements
	hookBeforeDDLRecord     hookPoint = "before-ddl-record"
)

type testHooks struct {
	f func(hookPoint) error
}

func (h *testHooks) fire(p hookPoint) error {
	if h == nil || h.f == nil {
		return nil
	}
	return h.f(p)
}
