package verify

// stats.go owns what the service counts for its readers (Stats: the daemon's metrics
// collector, /status, parity status), under its own lock, and the freshness rule. It
// must not run queries nor reach into the runs it counts: they report into it.

import (
	"maps"
	"sort"
	"sync"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/internal/tso"
)

// LastRun is how a trigger's newest run ended (since the service started).
type LastRun struct {
	Trigger string
	// Kind is the trigger's kind: schedule, continuous or manual.
	Kind       string
	Result     string
	StartedAt  time.Time
	FinishedAt time.Time
}

// ScheduleNext is when a schedule should next fire: its cron's next time after its
// newest run started or the newest fire another daemon claimed (or the service started,
// before either). Past it by more than the
// scheduler's jitter with no run started, the firing was missed.
type ScheduleNext struct {
	Trigger string
	Next    time.Time
}

// DiffCount counts differing rows of one kind (missing, extra, differing; "unlisted"
// for rows beyond the report's listed differences, whose kind is not read) and class.
type DiffCount struct {
	Kind, Class string
	Rows        int64
}

// RunCount is how many runs of a trigger ended with a result, since the service
// started.
type RunCount struct {
	Trigger string `json:"trigger"`
	Result  string `json:"result"`
	Runs    int64  `json:"runs"`
}

// ActiveRun is a run in progress.
type ActiveRun struct {
	RunID   string
	Trigger string
	// Queued: waiting for a slot (verify.max-concurrent-runs).
	Queued      bool
	Table       string // the table being compared
	TablesDone  int
	Tables      int
	RowsChecked int64
	// PairTS is the current pair's TSO and PairAge its read view's age (0 between pairs).
	PairTS  uint64
	PairAge time.Duration
	// ChunksDone counts the chunks compared, ChunksTotal those cut so far, over the
	// tables done and the current one (a table's chunks are cut as it goes, so the total
	// grows until the last table's are cut).
	ChunksDone  int
	ChunksTotal int
	// Differences counts the differing rows found so far.
	Differences int64
	// StartedAt is when the run left the queue (zero while Queued): rows/s and an ETA
	// are measured from it.
	StartedAt time.Time
}

// Stats are the service's counters and gauges at one moment: a plain struct the daemon
// exports as metrics without this package knowing a metrics library.
type Stats struct {
	Changefeed string
	// Instance is this daemon's verify.instance.
	Instance string
	// Runs counts finished (and skipped) runs by trigger and result since start.
	Runs []RunCount
	// RowsChecked and Differences total the rows compared and the differences found by
	// runs since start; Pairs the snapshot pairs opened and Rotations those opened because
	// a read view reached verify.max-view-age (or half of it between tables).
	RowsChecked int64
	Differences int64
	// DifferencesByClass splits Differences by class (checker's classification).
	DifferencesByClass map[string]int64
	Pairs              int64
	Rotations          int64
	// BarrierPassed counts pairs the applier refused because it had applied beyond
	// their TSO before the barrier was set (each is tried again at a newer TSO).
	BarrierPassed int64
	// DifferencesByKind splits Differences by kind and class, counted as each table's
	// comparison ends (Differences counts them as the run ends).
	DifferencesByKind []DiffCount
	// Unconfirmed counts the rows found different at a pair and equal when read again
	// at the same pair (a snapshot read that was not repeatable: a store anomaly, not a
	// difference; not in Differences), counted as each table's comparison ends.
	Unconfirmed int64
	// Chunks counts chunk comparisons by result (checker.ChunkEqual, ChunkDifferent,
	// ChunkFailed) and ChunkTime how long each took (ChunkBuckets).
	Chunks    map[string]int64
	ChunkTime Histogram
	// Pause is how long replication waited for each pair.
	Pause Histogram
	// LastRuns is each trigger's newest ended run, by trigger; Schedules each
	// schedule's next expected firing.
	LastRuns  []LastRun
	Schedules []ScheduleNext
	// CleanAt is when the newest clean full run (CleanRunID) ended.
	CleanAt time.Time
	// Throttled is the time runs waited for the applier's lag (verify.max-lag) before
	// opening pairs.
	Throttled time.Duration
	// Running counts the runs started and not ended (Active lists them).
	Running int
	Active  []ActiveRun
	// LastRun is the newest run that ended (nil before one did).
	LastRun *RunRecord
	// Verified is whether a clean full run over verify.tables is known (from the
	// history: it survives restarts); CoveredTS is its oldest pair's TSO, CleanRunID its
	// run.
	Verified   bool
	CoveredTS  uint64
	CleanRunID string
	// AppliedTS is the applier's checkpoint when Stats was read.
	AppliedTS uint64
	// Freshness is the age of the oldest applied change not yet covered by a clean
	// verification (see Freshness); meaningful only when Verified.
	Freshness time.Duration
	// LastError is the service's own last problem (the meta schema unreachable, say),
	// not a run's.
	LastError string
}

// Freshness returns the age at now of the oldest applied change that no clean full
// verification covers yet, as its upper bound: 0 when the applier has applied nothing
// beyond covered (the newest clean run's oldest pair TSO), else now minus covered's
// time — every change after covered may be uncovered, and the oldest could be just after
// it. ok is false when nothing was ever verified clean ("never": no bound exists).
func Freshness(now time.Time, applied, covered uint64) (age time.Duration, ok bool) {
	if covered == 0 {
		return 0, false
	}
	if applied <= covered {
		return 0, true
	}
	return max(0, now.Sub(tso.Time(covered))), true
}

func sortedCounts(m map[[2]string]int64) []RunCount {
	out := make([]RunCount, 0, len(m))
	for k, n := range m {
		out = append(out, RunCount{Trigger: k[0], Result: k[1], Runs: n})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Trigger != out[j].Trigger {
			return out[i].Trigger < out[j].Trigger
		}
		return out[i].Result < out[j].Result
	})
	return out
}

// observed is what the service counts for the metrics beyond its run counts; under
// stats.mu.
type observed struct {
	since     time.Time // the service's start
	chunks    map[string]int64
	chunkTime Histogram
	byKind    map[[2]string]int64 // (kind, class) → rows
	// unconfirmed: rows found different at a pair and gone when read again at it.
	unconfirmed int64
	last        map[string]LastRun // by trigger
	// elsewhere is, by schedule, the newest fire another daemon claimed (claims.go): a
	// fire this daemon did not run because another one has it is not missed.
	elsewhere map[string]time.Time
	cleanAt   time.Time
}

// stats is what the service counts, under its own lock: the executor reports into it
// as runs go (runCounters), the scheduler as runs end or are skipped and as fires go
// to other daemons; Stats reads it. It knows no other part of the service.
type stats struct {
	tables    []string // verify.tables: a clean run over them covers the applied changes
	schedules []Schedule
	crons     []cron.Schedule // parsed schedules, by index

	mu           sync.Mutex
	runs         map[[2]string]int64 // (trigger, result) → runs
	rows         int64
	diffs        int64
	diffsByClass map[string]int64
	pairs        int64
	rotations    int64
	passed       int64
	pause        Histogram
	throttled    time.Duration
	lastRun      *RunRecord
	covered      uint64
	cleanID      string
	lastErr      string
	obs          observed
}

var _ runCounters = (*stats)(nil)

func newStats(cfg Config, crons []cron.Schedule) *stats {
	return &stats{tables: cfg.Tables, schedules: cfg.Schedules, crons: crons,
		runs: map[[2]string]int64{}, diffsByClass: map[string]int64{}, obs: observed{since: time.Now()}}
}

// setErr records the service's own last problem (nil: none).
func (c *stats) setErr(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lastErr = ""
	if err != nil {
		c.lastErr = err.Error()
	}
}

// setClean records the newest clean run the history holds (at start).
func (c *stats) setClean(clean *RunRecord) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.covered, c.cleanID, c.obs.cleanAt = clean.FirstTS, clean.RunID, clean.FinishedAt
}

// pairOpened counts a snapshot pair and how long replication waited for it.
func (c *stats) pairOpened(pause time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pairs++
	c.pause.observe(pause)
}

// pointHeld counts how long replication waited for a snapshot point.
func (c *stats) pointHeld(pause time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pause.observe(pause)
}

// rotated counts a pair given up for a new one (its view's age).
func (c *stats) rotated() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rotations++
}

// barrierPassed counts a TSO the applier had applied beyond before its barrier.
func (c *stats) barrierPassed() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.passed++
}

// throttledFor counts a wait for the applier's lag (verify.max-lag).
func (c *stats) throttledFor(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.throttled += d
}

// firedElsewhere records that another daemon claimed schedule's fire at.
func (c *stats) firedElsewhere(schedule string, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.obs.elsewhere == nil {
		c.obs.elsewhere = map[string]time.Time{}
	}
	if at.After(c.obs.elsewhere[schedule]) {
		c.obs.elsewhere[schedule] = at
	}
}

// skipped counts a firing skipped because its trigger's previous run still ran.
func (c *stats) skipped(rec *RunRecord) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.runs[[2]string{rec.Trigger, ResultSkipped}]++
	c.obs.ended(rec)
}

// ended counts how a run ended.
func (c *stats) ended(rec *RunRecord) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.runs[[2]string{rec.Trigger, rec.Result}]++
	c.rows += rec.RowsChecked
	c.diffs += rec.Differences
	for class, n := range rec.DifferencesByClass {
		c.diffsByClass[class] += n
	}
	final := *rec
	c.lastRun = &final
	c.obs.ended(rec)
	// A clean full run covers every applied change up to its first pair; so does a clean
	// cdc run (it refuses a table without an earlier clean verification, and covers the
	// changes since it).
	if rec.Result == ResultEqual && (rec.Scope == ScopeFull || rec.Scope == ScopeCDC) && samePatterns(rec.Patterns, c.tables) && rec.FirstTS > c.covered {
		c.covered, c.cleanID, c.obs.cleanAt = rec.FirstTS, rec.RunID, rec.FinishedAt
	}
}

func samePatterns(a, b []string) bool { return patternsText(a) == patternsText(b) }

// ended records how rec's trigger's newest run ended.
func (o *observed) ended(rec *RunRecord) {
	if o.last == nil {
		o.last = map[string]LastRun{}
	}
	o.last[rec.Trigger] = LastRun{Trigger: rec.Trigger, Kind: rec.TriggerKind, Result: rec.Result,
		StartedAt: rec.StartedAt, FinishedAt: rec.FinishedAt}
}

// chunkDone counts a chunk comparison (checker.Config.ChunkDone).
func (c *stats) chunkDone(result string, took time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.obs.chunks == nil {
		c.obs.chunks = map[string]int64{}
	}
	c.obs.chunks[result]++
	c.obs.chunkTime.observeIn(ChunkBuckets, took)
}

// tableCompared counts a table's differences by kind and class — the kinds of the
// listed ones, and the rest of each class (beyond the report's listing) as "unlisted" —
// and those gone when read again at the same pair.
func (c *stats) tableCompared(tb checker.TableReport) {
	if tb.DifferencesTotal == 0 && tb.DifferencesUnconfirmed == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.obs.unconfirmed += tb.DifferencesUnconfirmed
	if tb.DifferencesTotal == 0 {
		return
	}
	if c.obs.byKind == nil {
		c.obs.byKind = map[[2]string]int64{}
	}
	listed := map[string]int64{}
	var listedRows int64
	for _, d := range tb.Differences {
		n := int64(max(d.Count, 1))
		class := d.Class
		if class == "" {
			class = checker.ClassUnclassified
		}
		c.obs.byKind[[2]string{string(d.Kind), class}] += n
		listed[class] += n
		listedRows += n
	}
	rest := tb.DifferencesTotal - listedRows
	for class, n := range tb.DifferencesByClass {
		if class == checker.ClassInFlight || rest <= 0 {
			continue
		}
		if k := min(n-listed[class], rest); k > 0 {
			c.obs.byKind[[2]string{"unlisted", class}] += k
			rest -= k
		}
	}
	if rest > 0 {
		c.obs.byKind[[2]string{"unlisted", checker.ClassUnclassified}] += rest
	}
}

// read returns the counters at now with the applier's checkpoint applied and the runs
// under way (the scheduler holds its lock, so no run ends meanwhile).
func (c *stats) read(now time.Time, applied uint64, active []ActiveRun) Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := Stats{
		Runs: sortedCounts(c.runs), RowsChecked: c.rows, Differences: c.diffs, DifferencesByClass: maps.Clone(c.diffsByClass),
		Pairs: c.pairs, Rotations: c.rotations, BarrierPassed: c.passed, Pause: c.pause.clone(), Throttled: c.throttled,
		Verified: c.covered > 0, CoveredTS: c.covered, CleanRunID: c.cleanID, AppliedTS: applied, LastError: c.lastErr,
		Active: active, Running: len(active),
	}
	if c.lastRun != nil {
		r := *c.lastRun
		r.Pairs, r.Tables = nil, nil
		st.LastRun = &r
	}
	st.Freshness, _ = Freshness(now, applied, c.covered)
	o := &c.obs
	st.Chunks = maps.Clone(o.chunks)
	st.ChunkTime = o.chunkTime.cloneN(len(ChunkBuckets))
	st.CleanAt = o.cleanAt
	st.Unconfirmed = o.unconfirmed
	for k, n := range o.byKind {
		st.DifferencesByKind = append(st.DifferencesByKind, DiffCount{Kind: k[0], Class: k[1], Rows: n})
	}
	sort.Slice(st.DifferencesByKind, func(i, j int) bool {
		a, b := st.DifferencesByKind[i], st.DifferencesByKind[j]
		return a.Kind < b.Kind || (a.Kind == b.Kind && a.Class < b.Class)
	})
	for _, l := range o.last {
		st.LastRuns = append(st.LastRuns, l)
	}
	sort.Slice(st.LastRuns, func(i, j int) bool { return st.LastRuns[i].Trigger < st.LastRuns[j].Trigger })
	running := map[string]bool{}
	for _, a := range active {
		running[a.Trigger] = true
	}
	for i, sc := range c.schedules {
		if i >= len(c.crons) {
			break
		}
		next := c.crons[i].Next(now) // a run under way: nothing missed
		if !running[sc.Name] {
			base := o.since
			if l, ok := o.last[sc.Name]; ok && l.StartedAt.After(base) {
				base = l.StartedAt
			}
			if at := o.elsewhere[sc.Name]; at.After(base) {
				base = at
			}
			next = c.crons[i].Next(base)
		}
		st.Schedules = append(st.Schedules, ScheduleNext{Trigger: sc.Name, Next: next})
	}
	return st
}
