package verify

// histogram.go owns the durations Stats counts in buckets (the applier's pauses for
// pairs and points, the checker's chunk times) and their bounds.

import "time"

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
