package cdc

// readgate.go keeps the partition readers abreast by resolved ts.

import (
	"context"
	"sync"

	"github.com/tidb-parity/parity/cdc/open"
)

// readGate holds back a partition reader that has read past the resolved ts of the
// slowest partition. Nothing above the smallest resolved ts can be applied, so rows a
// reader reads past it only wait in the buffer, costing memory (and the collector's
// time to mark them) or spill files, until the slowest partition's reader catches up.
// In a catch-up the readers run unevenly; without the gate the buffer held 400,000 rows
// of the faster partitions and spilled (a 3,000,000-row insert bench).
//
// A reader waits, before it fetches its next record, while the resolved ts it has read
// is above every other reader's: each partition reads at most one resolved interval past
// the slowest, and the slowest (the one every round waits for) never waits. Records
// without a resolved ts (one transaction larger than the memory bound) do not move the
// gate, so the buffer's bound and spill cover them as before.
//
// Not for canal-json and simple: there a row read from another partition waits until
// partition 0 has been read to its ts (streamschema.go), so holding partition 0 back
// while another partition is the slowest would stop both (runOnce passes a nil gate).
type readGate struct {
	mu       sync.Mutex
	resolved []uint64      // per partition: the largest resolved ts its reader has handed on
	min      uint64        // the smallest of resolved
	changed  chan struct{} // closed when min grows
}

// newReadGate starts the gate at each partition's resolved ts (the checkpoint for a
// partition that resumes from saved offsets, 0 for one read from its start).
func newReadGate(resolved []uint64) *readGate {
	g := &readGate{resolved: resolved, changed: make(chan struct{})}
	g.min = g.lowest()
	return g
}

func (g *readGate) lowest() uint64 {
	var m uint64
	for i, ts := range g.resolved {
		if i == 0 || ts < m {
			m = ts
		}
	}
	return m
}

// wait returns when partition i may read on, or when ctx ends (its error). A nil gate
// never waits.
func (g *readGate) wait(ctx context.Context, i int) error {
	if g == nil {
		return nil
	}
	for {
		g.mu.Lock()
		if g.resolved[i] <= g.min {
			g.mu.Unlock()
			return nil
		}
		ch := g.changed
		g.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// passed records the resolved ts among evs, which partition i's reader has handed on.
func (g *readGate) passed(i int, evs []open.Event) {
	if g == nil {
		return
	}
	var ts uint64
	for k := range evs {
		if evs[k].Kind == open.KindResolved {
			ts = max(ts, evs[k].CommitTs)
		}
	}
	if ts == 0 {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if ts <= g.resolved[i] {
		return
	}
	was := g.resolved[i]
	g.resolved[i] = ts
	if was != g.min {
		return // i was not the slowest: min unchanged
	}
	if m := g.lowest(); m > g.min {
		g.min = m
		close(g.changed)
		g.changed = make(chan struct{})
	}
}
