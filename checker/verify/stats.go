package verify

// stats.go owns what the service counts for its readers (Stats: the daemon's metrics
// collector, /status, parity status) and the freshness rule. It must not run queries.

import (
	"maps"
	"sort"
	"time"

	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/internal/tso"
)

// PauseBuckets are the upper bounds of Stats.Pause's buckets.
var PauseBuckets = []time.Duration{
	time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond,
	20 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond,
	500 * time.Millisecond, time.Second, 2500 * time.Millisecond, 5 * time.Second,
}

// ChunkBuckets are the upper bounds of Stats.ChunkTime's buckets.
var ChunkBuckets = []time.Duration{
	5 * time.Millisecond, 10 * time.Millisecond, 25 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond,
	250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2500 * time.Millisecond, 5 * time.Second,
	10 * time.Second, 30 * time.Second, time.Minute,
}

// Histogram counts durations: Counts[i] those at most its buckets' i-th bound
// (PauseBuckets or ChunkBuckets; cumulative, as Prometheus reads buckets), Count all of
// them, Sum their total.
type Histogram struct {
	Counts []uint64
	Count  uint64
	Sum    time.Duration
}

func (h *Histogram) observe(d time.Duration) { h.observeIn(PauseBuckets, d) }

func (h *Histogram) observeIn(bounds []time.Duration, d time.Duration) {
	if h.Counts == nil {
		h.Counts = make([]uint64, len(bounds))
	}
	for i, b := range bounds {
		if d <= b {
			h.Counts[i]++
		}
	}
	h.Count++
	h.Sum += d
}

func (h Histogram) clone() Histogram { return h.cloneN(len(PauseBuckets)) }

func (h Histogram) cloneN(n int) Histogram {
	h.Counts = append([]uint64(nil), h.Counts...)
	if h.Counts == nil {
		h.Counts = make([]uint64, n)
	}
	return h
}

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
// Service.mu.
type observed struct {
	since     time.Time // the service's start
	chunks    map[string]int64
	chunkTime Histogram
	byKind    map[[2]string]int64 // (kind, class) → rows
	// unconfirmed: rows found different at a pair and gone when read again at it.
	unconfirmed int64
	last        map[string]LastRun // by trigger
	// elsewhere is, by schedule, the newest fire another daemon claimed (fires.go): a
	// fire this daemon did not run because another one has it is not missed.
	elsewhere map[string]time.Time
	cleanAt   time.Time
}

// firedElsewhere records that another daemon claimed schedule's fire at.
func (o *observed) firedElsewhere(schedule string, at time.Time) {
	if o.elsewhere == nil {
		o.elsewhere = map[string]time.Time{}
	}
	if at.After(o.elsewhere[schedule]) {
		o.elsewhere[schedule] = at
	}
}

// ended records how rec's trigger's newest run ended.
func (o *observed) ended(rec *RunRecord) {
	if o.last == nil {
		o.last = map[string]LastRun{}
	}
	o.last[rec.Trigger] = LastRun{Trigger: rec.Trigger, Kind: rec.TriggerKind, Result: rec.Result,
		StartedAt: rec.StartedAt, FinishedAt: rec.FinishedAt}
}

// chunkDone counts a chunk comparison (checker.Config.ChunkDone).
func (s *Service) chunkDone(result string, took time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.obs.chunks == nil {
		s.obs.chunks = map[string]int64{}
	}
	s.obs.chunks[result]++
	s.obs.chunkTime.observeIn(ChunkBuckets, took)
}

// unconfirmed counts a table's differences gone when read again at the same pair.
func (s *Service) unconfirmed(tb checker.TableReport) {
	if tb.DifferencesUnconfirmed == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.obs.unconfirmed += tb.DifferencesUnconfirmed
}

// tableDifferences counts a table's differences by kind and class: the kinds of the
// listed ones, and the rest of each class (beyond the report's listing) as "unlisted".
func (s *Service) tableDifferences(tb checker.TableReport) {
	if tb.DifferencesTotal == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.obs.byKind == nil {
		s.obs.byKind = map[[2]string]int64{}
	}
	listed := map[string]int64{}
	var listedRows int64
	for _, d := range tb.Differences {
		n := int64(max(d.Count, 1))
		class := d.Class
		if class == "" {
			class = checker.ClassUnclassified
		}
		s.obs.byKind[[2]string{string(d.Kind), class}] += n
		listed[class] += n
		listedRows += n
	}
	rest := tb.DifferencesTotal - listedRows
	for class, n := range tb.DifferencesByClass {
		if class == checker.ClassInFlight || rest <= 0 {
			continue
		}
		if k := min(n-listed[class], rest); k > 0 {
			s.obs.byKind[[2]string{"unlisted", class}] += k
			rest -= k
		}
	}
	if rest > 0 {
		s.obs.byKind[[2]string{"unlisted", checker.ClassUnclassified}] += rest
	}
}

// fillStats adds observed's counts to st; the caller holds s.mu.
func (s *Service) fillStats(st *Stats, now time.Time) {
	o := &s.obs
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
	for i, sc := range s.cfg.Schedules {
		if i >= len(s.crons) {
			break
		}
		next := s.crons[i].Next(now) // a run under way: nothing missed
		if _, running := s.active[sc.Name]; !running {
			base := o.since
			if l, ok := o.last[sc.Name]; ok && l.StartedAt.After(base) {
				base = l.StartedAt
			}
			if at := o.elsewhere[sc.Name]; at.After(base) {
				base = at
			}
			next = s.crons[i].Next(base)
		}
		st.Schedules = append(st.Schedules, ScheduleNext{Trigger: sc.Name, Next: next})
	}
}
