package cdc

// ingest.go takes records into the coordinator: its view of each partition (partState,
// resolved ts, offsets, the records still holding rows), the replay detection of keyless
// tables (keylessRun), the DDLs waiting for their barrier, and ingest itself.

import (
	"context"
	"fmt"

	"github.com/tidb-parity/parity/cdc/open"
)

// partState is the coordinator's view of one partition.
type partState struct {
	key      partKey
	resolved uint64
	nextRead int64 // offset after the last ingested record
	saved    int64 // resume offset in the last checkpoint (-1 none)
	hw       int64
	pending  []pendingRec // records holding buffered rows, in offset order
	stopped  bool         // an unusable record was met; nothing after it is taken

	// Replay detection for tables without a handle key (see keylessRun).
	runs   map[runKey]*keylessRun
	lastTs map[tableKey]uint64 // commit ts of the last keyless row per table
}

type runKey struct {
	table tableKey
	ts    uint64
}

// keylessRun tells TiCDC's re-deliveries of a keyless table's transaction apart from
// genuine duplicate rows. On first delivery a transaction's rows of one table arrive in
// one partition as one run (TiCDC does not interleave transactions of a table). A run
// ends when a row of the same table with another commit ts, or a resolved ts >= its
// commit ts, arrives in the partition; rows of the same (table, ts) after that are a
// replay, which TiCDC sends from the start of the transaction: its first `count` rows
// repeat rows already taken and are dropped, any beyond (the first delivery was cut
// short) are taken.
type keylessRun struct {
	count int // rows taken
	cur   int // rows seen in the current run
	open  bool
}

// takeKeyless reports whether a keyless row is new (not a re-delivery).
func (p *partState) takeKeyless(ev *open.Event) bool {
	t := tableKey{ev.Schema, ev.Table}
	if p.runs == nil {
		p.runs, p.lastTs = map[runKey]*keylessRun{}, map[tableKey]uint64{}
	}
	if last, ok := p.lastTs[t]; ok && last != ev.CommitTs {
		if r := p.runs[runKey{t, last}]; r != nil {
			r.open = false
		}
	}
	p.lastTs[t] = ev.CommitTs
	k := runKey{t, ev.CommitTs}
	r := p.runs[k]
	if r == nil {
		r = &keylessRun{}
		p.runs[k] = r
	}
	if !r.open {
		r.open, r.cur = true, 0
	}
	r.cur++
	if r.cur <= r.count {
		return false
	}
	r.count = r.cur
	return true
}

// closeRuns ends the runs a resolved ts proves complete and forgets applied ones.
func (p *partState) closeRuns(resolved, applied uint64) {
	for k, r := range p.runs {
		switch {
		case k.ts <= applied:
			delete(p.runs, k)
		case k.ts <= resolved:
			r.open = false
		}
	}
}

// pendingRec: the record at offset holds buffered rows up to maxTs.
type pendingRec struct {
	offset int64
	maxTs  uint64
}

type pendingDDL struct {
	key     ddlKey
	ev      open.Event
	seen    uint64
	offsets map[int]int64 // partition index -> smallest offset of a copy
}

// ingest takes one record into the buffers.
func (c *coordinator) ingest(ctx context.Context, rec record) error {
	p := c.parts[rec.part]
	if p.stopped {
		return nil
	}
	if rec.err != nil {
		c.r.ctr.decodeErrors.Add(1)
		if !c.cfg.Applier.DeadLetter {
			// The partition goes no further; what the resolved ts already allows is
			// still applied before the replicator stops.
			p.stopped = true
			if c.stopErr == nil {
				c.stopErr = fmt.Errorf("partition stopped at an unusable record: %w", rec.err)
			}
			return nil
		}
		if err := c.meta.deadLetter(ctx, p.key, rec.offset, rec.key, rec.value, rec.err); err != nil {
			return err
		}
		c.r.ctr.deadLetters.Add(1)
		c.log.Error("record copied to dead letter table, continuing", "partition", p.key.String(), "offset", rec.offset, "err", rec.err)
		p.nextRead, p.hw = rec.offset+1, rec.hw
		return nil
	}
	var maxTs uint64
	rows := false
	for i := range rec.events {
		ev := &rec.events[i]
		switch ev.Kind {
		case open.KindResolved:
			if ev.CommitTs > p.resolved {
				p.resolved = ev.CommitTs
			}
			p.closeRuns(ev.CommitTs, c.applied)
		case open.KindDDL:
			k := newDDLKey(ev.CommitTs, ev.Query)
			if ev.CommitTs < c.applied || c.ddlDone[k] {
				continue // a copy from another partition, or a replay
			}
			found := false
			for _, d := range c.ddls {
				if d.key == k {
					if off, ok := d.offsets[rec.part]; !ok || rec.offset < off {
						d.offsets[rec.part] = rec.offset
					}
					found = true
					break
				}
			}
			if !found {
				c.seq++
				c.ddls = append(c.ddls, &pendingDDL{key: k, ev: *ev, seen: c.seq, offsets: map[int]int64{rec.part: rec.offset}})
			}
		case open.KindRow:
			if ev.CommitTs <= c.applied {
				continue // durably applied before (a replay)
			}
			if !hasHandle(ev.Columns) && !p.takeKeyless(ev) {
				c.log.Debug("dropping re-delivered row of a table without handle key", "table", ev.Schema+"."+ev.Table,
					"partition", p.key.String(), "offset", rec.offset, "resolved_ts", ev.CommitTs)
				continue
			}
			c.seq++
			if err := c.buf.add(ev, c.seq); err != nil {
				return err
			}
			rows = true
			maxTs = max(maxTs, ev.CommitTs)
		}
	}
	if rows {
		p.pending = append(p.pending, pendingRec{offset: rec.offset, maxTs: maxTs})
	}
	p.nextRead, p.hw = rec.offset+1, rec.hw
	return nil
}
