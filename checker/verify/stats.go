package verify

// stats.go owns what the service counts for its readers (Stats: the daemon's metrics
// collector, /status, parity status) and the freshness rule. It must not run queries.

import (
	"sort"
	"time"

	"github.com/tidb-parity/parity/internal/tso"
)

// PauseBuckets are the upper bounds of Stats.Pause's buckets.
var PauseBuckets = []time.Duration{
	time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond,
	20 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond,
	500 * time.Millisecond, time.Second, 2500 * time.Millisecond, 5 * time.Second,
}

// Histogram counts durations: Counts[i] those at most PauseBuckets[i] (cumulative, as
// Prometheus reads buckets), Count all of them, Sum their total.
type Histogram struct {
	Counts []uint64
	Count  uint64
	Sum    time.Duration
}

func (h *Histogram) observe(d time.Duration) {
	if h.Counts == nil {
		h.Counts = make([]uint64, len(PauseBuckets))
	}
	for i, b := range PauseBuckets {
		if d <= b {
			h.Counts[i]++
		}
	}
	h.Count++
	h.Sum += d
}

func (h Histogram) clone() Histogram {
	h.Counts = append([]uint64(nil), h.Counts...)
	if h.Counts == nil {
		h.Counts = make([]uint64, len(PauseBuckets))
	}
	return h
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
}

// Stats are the service's counters and gauges at one moment: a plain struct the daemon
// exports as metrics without this package knowing a metrics library.
type Stats struct {
	Changefeed string
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
	// Pause is how long replication waited for each pair.
	Pause Histogram
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
