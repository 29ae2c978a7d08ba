package checker

// tracker.go owns what a run has done and found: the run's phase and its timings; per
// table the chunks cut and done, the rows and differing rows counted, the checkpoint (one
// rule: tally.reach), the difference budget (Config.MaxDifferences) and the sink that
// stores a chunk's differences within it; the journal that stores chunk states
// (journal.go); progress reports and Stats. report.go turns it into the Report and the fix
// SQL. It must not query the compared servers, nor decide what is compared or how.

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"
)

// tally is what is known of one table's chunks.
type tally struct {
	mu sync.Mutex
	// checkpoint is the low watermark of contiguous done chunks: every chunk with
	// seq <= checkpoint is stored as done (-1: none).
	checkpoint int
	done       map[int]bool
	chunks     int // chunks cut (stored) so far: the next chunk's seq
	chunksDone int
	splitDone  bool // the table's last chunk is cut
	upRows     int64
	downRows   int64
	// differences counts the differing rows stored (less those the re-check resolved);
	// drilled those of the chunks whose drill-down ended and kept them (the budget,
	// Config.MaxDifferences); undrilled the done chunks left undrilled by it.
	differences int64
	drilled     int64
	undrilled   int
}

// reach is the checkpoint rule: the highest seq up to which every chunk is done, counting
// as done those for which pending (when not nil) says so. The caller holds tl.mu.
func (tl *tally) reach(pending func(seq int) bool) int {
	cp := tl.checkpoint
	for tl.done[cp+1] || (pending != nil && pending(cp+1)) {
		cp++
	}
	return cp
}

// countDone counts a chunk stored as done and moves the checkpoint; the caller holds
// tl.mu.
func (tl *tally) countDone(seq int, res chunkResult) {
	tl.done[seq] = true
	tl.chunksDone++
	tl.upRows += res.up.count
	tl.downRows += res.down.count
	if res.differences == undrilledChunk {
		tl.undrilled++
	} else {
		tl.differences += res.differences
	}
	tl.checkpoint = tl.reach(nil)
}

// tracker is a run's account of its work (see the file comment).
type tracker struct {
	cfg   *Config
	st    *store
	log   *slog.Logger
	start time.Time

	mu         sync.Mutex // the fields below, set as the run goes
	phase      Phase
	phaseStart time.Time
	phaseTimes map[Phase]time.Duration
	state      string
	snapshot   [2]string
	targets    []*target
	tallies    []*tally // by target idx
	rechecks   int
	// scopes: what the run compares of each table (by target idx; nil until resolved);
	// classes: each table's differences per class, once classified (classify.go).
	scopes         []*tableScope
	classes        map[int]map[string]int64
	classification *Classification

	// foundHere: per table, the chunks whose differences this process found (and so at
	// this process's pair: the confirmation reads only those again).
	foundHere map[int]map[int]bool

	resolved    atomic.Int64 // rows the re-check resolved in this process
	unconfirmed atomic.Int64 // rows the confirmation found equal at the same pair, in this process
	retries     atomic.Int64 // chunks compared again after a transient error
	journal     *journal
	progressMu  sync.Mutex // Config.Progress is never called concurrently
}

// newTracker returns the tracker of the run stored in st, which started at start.
func newTracker(cfg *Config, st *store, log *slog.Logger, start time.Time) *tracker {
	return &tracker{cfg: cfg, st: st, log: log, start: start, phase: phaseStarting, phaseStart: start,
		phaseTimes: map[Phase]time.Duration{}, state: runRunning}
}

// enter starts a phase of the run.
func (tk *tracker) enter(p Phase) {
	tk.mu.Lock()
	defer tk.mu.Unlock()
	now := time.Now()
	tk.phaseTimes[tk.phase] += now.Sub(tk.phaseStart)
	tk.phase, tk.phaseStart = p, now
}

// finish records the run's end state.
func (tk *tracker) finish(state string) {
	tk.enter(phaseFinished)
	tk.mu.Lock()
	tk.state = state
	tk.mu.Unlock()
}

// opened records what the pair reads at.
func (tk *tracker) opened(p *sourcePair) {
	tk.mu.Lock()
	tk.snapshot = p.snapshot
	tk.mu.Unlock()
}

// planned sets the run's tables, each from its stored checkpoint.
func (tk *tracker) planned(targets []*target) {
	tallies := make([]*tally, len(targets))
	for i, t := range targets {
		tallies[i] = &tally{checkpoint: t.stored.checkpoint, splitDone: t.stored.splitDone, done: map[int]bool{}}
	}
	tk.mu.Lock()
	tk.targets, tk.tallies = targets, tallies
	tk.mu.Unlock()
}

func (tk *tracker) tally(table int) *tally {
	tk.mu.Lock()
	defer tk.mu.Unlock()
	return tk.tallies[table]
}

// countCut counts a chunk stored as cut; the caller holds tl.mu.
func (tl *tally) countCut(c keyChunk) {
	tl.chunks++
	tl.splitDone = tl.splitDone || c.Last
}

// restore counts the chunks a resumed run had stored for a table.
func (tk *tracker) restore(table int, stored []storedChunk) {
	tl := tk.tally(table)
	tl.mu.Lock()
	defer tl.mu.Unlock()
	for _, c := range stored {
		tl.countCut(c.keyChunk)
		if c.state == chunkDone {
			tl.countDone(c.Seq, c.res)
			tl.drilled = tl.differences
		}
	}
}

// cut counts chunks just stored as cut.
func (tk *tracker) cut(table int, batch []keyChunk) {
	tl := tk.tally(table)
	tl.mu.Lock()
	defer tl.mu.Unlock()
	for _, c := range batch {
		tl.countCut(c)
	}
}

// openJournal starts the journal of the run's chunk states; its run method must then be
// running until close.
func (tk *tracker) openJournal() *journal {
	tk.mu.Lock()
	checkpoints := map[int]int{}
	for i, tl := range tk.tallies {
		tl.mu.Lock()
		checkpoints[i] = tl.checkpoint
		tl.mu.Unlock()
	}
	tk.mu.Unlock()
	reach := func(table int, pending func(seq int) bool) int {
		tl := tk.tally(table)
		tl.mu.Lock()
		defer tl.mu.Unlock()
		return tl.reach(pending)
	}
	tk.journal = newJournal(tk.st, 4*tk.cfg.Concurrency, checkpoints, reach, tk.committed)
	return tk.journal
}

// committed counts the chunks a journal batch stored as done.
func (tk *tracker) committed(updates []chunkUpdate) {
	progressed := false
	for _, u := range updates {
		if !u.finished {
			continue
		}
		progressed = true
		tl := tk.tally(u.chunk.Table)
		tl.mu.Lock()
		tl.countDone(u.chunk.Seq, u.res)
		tl.mu.Unlock()
	}
	if progressed {
		tk.progress(false, 0)
	}
}

// started records that a chunk is being compared: a retried one (resumed, or failed
// before) at once, dropping what earlier attempts stored; a first attempt through the
// journal.
func (tk *tracker) started(ctx context.Context, ch keyChunk) error {
	if ch.retry {
		return tk.st.startChunk(ctx, ch)
	}
	return tk.journal.started(ctx, ch)
}

// finished records a chunk's result (its differences are stored): it counts as done once
// the journal has stored it.
func (tk *tracker) finished(ctx context.Context, ch keyChunk, res chunkResult) error {
	return tk.journal.finished(ctx, ch, res)
}

// retried counts a chunk compared again after a transient error.
func (tk *tracker) retried() { tk.retries.Add(1) }

// pending returns the tables holding differences, and how many rows differ in all.
func (tk *tracker) pending() (tables []*target, rows int64) {
	tk.mu.Lock()
	targets, tallies := tk.targets, tk.tallies
	tk.mu.Unlock()
	for i, t := range targets {
		tl := tallies[i]
		tl.mu.Lock()
		if t.plan != nil && !t.fatal && tl.differences > 0 {
			rows += tl.differences
			tables = append(tables, t)
		}
		tl.mu.Unlock()
	}
	return tables, rows
}

// gone counts rows of a table found equal when read again: resolved by the re-check, or
// unconfirmed when read again at the same pair (the confirmation).
func (tk *tracker) gone(table int, rows int64, unconfirmed bool) {
	tl := tk.tally(table)
	tl.mu.Lock()
	tl.differences -= rows
	tl.mu.Unlock()
	if unconfirmed {
		tk.unconfirmed.Add(rows)
	} else {
		tk.resolved.Add(rows)
	}
}

// found records that this process found differences in a chunk of a table.
func (tk *tracker) found(table, seq int) {
	tk.mu.Lock()
	defer tk.mu.Unlock()
	if tk.foundHere == nil {
		tk.foundHere = map[int]map[int]bool{}
	}
	if tk.foundHere[table] == nil {
		tk.foundHere[table] = map[int]bool{}
	}
	tk.foundHere[table][seq] = true
}

// foundChunks returns the chunks of a table whose differences this process found.
func (tk *tracker) foundChunks(table int) map[int]bool {
	tk.mu.Lock()
	defer tk.mu.Unlock()
	return maps.Clone(tk.foundHere[table])
}

// scoped records what the run compares of each table.
func (tk *tracker) scoped(scopes []*tableScope) {
	tk.mu.Lock()
	tk.scopes = scopes
	tk.mu.Unlock()
}

// classified records a table's differences per class.
func (tk *tracker) classified(table int, counts map[string]int64) {
	tk.mu.Lock()
	defer tk.mu.Unlock()
	if tk.classes == nil {
		tk.classes = map[int]map[string]int64{}
	}
	m := map[string]int64{}
	for c, n := range counts {
		if n > 0 {
			m[c] = n
		}
	}
	tk.classes[table] = m
}

// reclassified moves a table's rows counted in the classes of moved (class → rows) to
// class to.
func (tk *tracker) reclassified(table int, moved map[string]int64, to string) {
	tk.mu.Lock()
	defer tk.mu.Unlock()
	if tk.classes == nil {
		tk.classes = map[int]map[string]int64{}
	}
	m := tk.classes[table]
	if m == nil {
		m = map[string]int64{}
		tk.classes[table] = m
	}
	for c, n := range moved {
		if c != "" {
			if m[c] -= n; m[c] <= 0 {
				delete(m, c)
			}
		}
		m[to] += n
	}
}

// rechecked counts a finished re-check round.
func (tk *tracker) rechecked(round int) {
	tk.mu.Lock()
	tk.rechecks = round
	tk.mu.Unlock()
}

// progress reports progress to Config.Progress, during the re-check when rechecking
// (lag: the changefeed lag it waits out).
func (tk *tracker) progress(rechecking bool, lag time.Duration) {
	if tk.cfg.Progress == nil {
		return
	}
	tk.progressMu.Lock()
	defer tk.progressMu.Unlock()
	s := tk.stats()
	tk.cfg.Progress(Progress{RunID: s.RunID, Tables: s.Tables, TablesDone: s.TablesDone, ChunksDone: s.ChunksDone,
		RowsChecked: s.RowsChecked, RowsEstimated: s.RowsEstimated, Differences: s.Differences, Elapsed: s.Elapsed,
		Rechecking: rechecking, ChangefeedLag: lag})
}

// stats returns the tracker's part of Stats.
func (tk *tracker) stats() Stats {
	tk.mu.Lock()
	now := time.Now()
	s := Stats{RunID: tk.st.runID, State: tk.state, Phase: tk.phase, Tables: len(tk.targets), RecheckRounds: tk.rechecks,
		Elapsed: now.Sub(tk.start), PhaseTimes: maps.Clone(tk.phaseTimes),
		UpstreamSnapshot: tk.snapshot[upSide], DownstreamSnapshot: tk.snapshot[downSide]}
	if tk.phase != phaseFinished {
		s.PhaseTimes[tk.phase] += now.Sub(tk.phaseStart)
	}
	targets, tallies, scopes := tk.targets, tk.tallies, tk.scopes
	if tk.classes != nil {
		s.DifferencesByClass = map[string]int64{}
		for _, m := range tk.classes {
			for c, n := range m {
				s.DifferencesByClass[c] += n
			}
		}
	}
	tk.mu.Unlock()
	s.Scope = tk.cfg.Scope
	for _, sc := range scopes {
		if sc != nil {
			s.ScopeKeys += int64(len(sc.keys))
		}
	}
	s.DifferencesResolved = tk.resolved.Load()
	s.DifferencesUnconfirmed = tk.unconfirmed.Load()
	if s.DifferencesByClass != nil && s.DifferencesResolved > 0 {
		s.DifferencesByClass[ClassInFlight] += s.DifferencesResolved
	}
	s.ChunkRetries = tk.retries.Load()
	for i, t := range targets {
		tl := tallies[i]
		tl.mu.Lock()
		s.Chunks += tl.chunks
		s.ChunksDone += tl.chunksDone
		s.RowsChecked += tl.upRows
		s.DownstreamRows += tl.downRows
		s.Differences += tl.differences
		s.UndrilledChunks += tl.undrilled
		s.RowsEstimated += max(t.estRows, tl.upRows)
		if t.fatal || (tl.splitDone && tl.chunksDone == tl.chunks) {
			s.TablesDone++
		}
		tl.mu.Unlock()
	}
	return s
}

// errMaxDifferences ends a drill-down when its table reached Config.MaxDifferences.
var errMaxDifferences = errors.New("max_differences reached")

// sink returns the sink of a chunk's differences.
func (tk *tracker) sink(ctx context.Context, t *target, ch keyChunk) *diffSink {
	return &diffSink{ctx: ctx, st: tk.st, tl: tk.tally(ch.Table), limit: tk.cfg.MaxDifferences, chunk: ch, table: t.name, log: tk.log}
}

// diffSink stores a chunk's differences in batches, so memory stays bounded however many
// rows differ, within its table's difference budget (Config.MaxDifferences): a chunk
// whose drill-down starts, or goes on, after the table's kept differences reached the
// limit stops and drops what it stored, and is left undrilled. A chunk's differences are
// kept whole or not at all, and the table keeps the limit plus at most the differences
// of the chunks whose drill-downs were under way when it was reached (one per worker).
type diffSink struct {
	ctx   context.Context
	st    *store
	tl    *tally
	limit int64
	chunk keyChunk
	table string
	log   *slog.Logger

	drilling bool // the budget allowed the drill-down to start
	batch    []storedDiff
	bytes    int // size of batch (storedDiff.size)
	n        int // differences emitted
	rows     int // differing rows (a keyless difference may stand for several copies)
}

var _ differenceSink = (*diffSink)(nil)

// full reports whether the table's budget is spent.
func (s *diffSink) full() bool {
	if s.limit <= 0 {
		s.drilling = true
		return false
	}
	s.tl.mu.Lock()
	defer s.tl.mu.Unlock()
	full := s.tl.drilled >= s.limit
	s.drilling = s.drilling || !full
	return full
}

func (s *diffSink) emit(d Difference) error {
	if s.full() {
		return errMaxDifferences
	}
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
	if len(s.batch) == 0 {
		return nil
	}
	if err := s.st.addDifferences(ctx, s.chunk.Table, s.batch); err != nil {
		return err
	}
	s.batch = s.batch[:0]
	s.bytes = 0
	return nil
}

// close ends the chunk's differences: res is the comparer's result, whose differences
// are set to the rows stored, or are undrilledChunk (then what the chunk stored is
// dropped). The rows kept count against the budget.
func (s *diffSink) close(ctx context.Context, res chunkResult) (chunkResult, error) {
	if res.differences == undrilledChunk {
		if s.drilling {
			if err := s.st.dropDifferences(ctx, s.chunk); err != nil {
				return res, err
			}
		}
		return res, nil
	}
	if err := s.flush(ctx); err != nil {
		return res, err
	}
	res.differences = int64(s.rows)
	if s.rows == 0 {
		return res, nil
	}
	s.tl.mu.Lock()
	before := s.tl.drilled
	s.tl.drilled += int64(s.rows)
	reached := s.limit > 0 && before < s.limit && s.tl.drilled >= s.limit
	s.tl.mu.Unlock()
	if reached {
		s.log.Warn("max_differences reached: the table's further mismatched chunks are not drilled down",
			"table", s.table, "chunk", s.chunk.Seq, "max_differences", s.limit)
	}
	return res, nil
}
