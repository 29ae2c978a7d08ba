package cdc

// coordinator.go is the single goroutine that owns ingest and apply state: its loop, the
// global resolved ts, rounds of rows up to a target, DDLs at their barrier, barriers, and
// what follows a checkpoint (ts map, ledger pruning, the published status).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sort"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/tidb-parity/parity/cdc/simple"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/position"
	"github.com/tidb-parity/parity/internal/tso"
)

// coordinator owns all ingest and apply state; it runs on one goroutine.
type coordinator struct {
	r       *Replicator
	cfg     Config
	log     *slog.Logger
	meta    *meta
	ap      *applier
	buf     *buffer
	parts   []*partState
	applied uint64
	startTs uint64 // checkpoint at start: a DDL at this ts may have run before a crash
	seq     uint64
	ddls    []*pendingDDL
	ddlDone map[ddlKey]bool
	// simple is the simple protocol's decoder (nil for the others): its schema cache
	// is saved with every checkpoint from schemaMark on (simpleschema.go).
	simple     *simple.Decoder
	schemaMark int
	barriers   []*barrierReq
	stopErr    error // an unusable record stopped a partition: apply what is possible, then fail
	lastPub    time.Time
	lastLog    time.Time
	lastTSMap  time.Time // last ts-map row (afterCheckpoint)
	lastPrune  time.Time // last ledger pruning
	// watch lists the changefeed's partitions before every round (see checkPartitions).
	watch       *partitionWatch
	lastListErr time.Time
	lastCheck   time.Time // last checkPartitions
}

func (c *coordinator) run(ctx context.Context, records <-chan record) error {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	c.publish(true)
	for {
		select {
		case <-ctx.Done():
			c.failBarriers(ErrStopped)
			c.publish(true)
			return nil
		case rec := <-records:
			if err := c.ingest(ctx, rec); err != nil {
				c.failBarriers(err)
				return err
			}
			// Drain what is already queued before deciding on a round.
		drain:
			for i := 0; i < cap(records); i++ {
				select {
				case rec := <-records:
					if err := c.ingest(ctx, rec); err != nil {
						c.failBarriers(err)
						return err
					}
				default:
					break drain
				}
			}
		case req := <-c.r.reqs:
			if req.ts < c.applied {
				req.result <- fmt.Errorf("barrier at %d: %w (applied %d)", req.ts, ErrBarrierPassed, c.applied)
				break
			}
			c.barriers = append(c.barriers, req)
			sort.SliceStable(c.barriers, func(i, j int) bool { return c.barriers[i].ts < c.barriers[j].ts })
			c.publish(true)
		case <-tick.C:
			// Also while nothing is applied (no resolved ts arrives when a topic is gone).
			if time.Since(c.lastCheck) >= idleCheckInterval {
				if _, err := c.checkPartitions(ctx); err != nil {
					c.failBarriers(err)
					return err
				}
			}
		}
		if err := c.step(ctx); err != nil {
			c.failBarriers(err)
			return err
		}
		c.publish(false)
		c.logProgress()
		if c.stopErr != nil {
			c.failBarriers(c.stopErr)
			return c.stopErr
		}
	}
}

func (c *coordinator) failBarriers(err error) {
	for _, b := range c.barriers {
		b.result <- err
	}
	c.barriers = nil
}

func (c *coordinator) global() uint64 {
	g := uint64(math.MaxUint64)
	for _, p := range c.parts {
		g = min(g, p.resolved)
	}
	return g
}

// step applies what the resolved ts allows, stopping at barriers.
func (c *coordinator) step(ctx context.Context) error {
	for {
		// Drop barriers whose caller went away.
		live := c.barriers[:0]
		for _, b := range c.barriers {
			if b.ctx.Err() == nil {
				live = append(live, b)
			}
		}
		c.barriers = live
		if len(c.barriers) > 0 && c.barriers[0].ts == c.applied && !c.ddlDue(c.applied) {
			b := c.barriers[0]
			c.barriers = c.barriers[1:]
			c.publish(true)
			c.log.Info("barrier reached", "resolved_ts", b.ts)
			b.result <- b.fn(b.ctx)
			continue
		}
		target := c.global()
		if len(c.barriers) > 0 && c.barriers[0].ts < target {
			target = c.barriers[0].ts
		}
		if target <= c.applied && !c.ddlDue(target) {
			return nil
		}
		if ok, err := c.checkPartitions(ctx); err != nil || !ok {
			return err
		}
		if err := c.round(ctx, target); err != nil {
			return err
		}
	}
}

func (c *coordinator) ddlDue(target uint64) bool {
	for _, d := range c.ddls {
		if d.ev.CommitTs <= target {
			return true
		}
	}
	return false
}

// round applies everything up to target: rows up to each due DDL, the DDL, then the rest.
func (c *coordinator) round(ctx context.Context, target uint64) error {
	// A started round finishes even when ctx ends (SIGTERM drains), unless the lease
	// was lost (ha.go).
	actx, cancel := roundContext(ctx)
	defer cancel()
	sort.SliceStable(c.ddls, func(i, j int) bool {
		if c.ddls[i].ev.CommitTs != c.ddls[j].ev.CommitTs {
			return c.ddls[i].ev.CommitTs < c.ddls[j].ev.CommitTs
		}
		return c.ddls[i].seen < c.ddls[j].seen
	})
	for len(c.ddls) > 0 && c.ddls[0].ev.CommitTs <= target {
		d := c.ddls[0]
		if d.ev.CommitTs > c.applied {
			// The checkpoint at the DDL's ts is recorded before the DDL runs (its
			// copies' offsets stay in the resume offsets until it is recorded), but
			// announced only after it ran.
			if err := c.rowsUpTo(actx, d.ev.CommitTs, false); err != nil {
				return err
			}
		}
		if err := c.execDDL(actx, d); err != nil {
			return err
		}
		c.ddls = c.ddls[1:]
		c.ap.tables.forget() // the DDL may have changed any table's keys or indexes
		c.ddlDone[d.key] = true
		c.r.ctr.ddls.Add(1)
		if len(c.ddls) == 0 || c.ddls[0].ev.CommitTs != d.ev.CommitTs {
			c.publish(true) // before advance, as in rowsUpTo
			c.r.advance(c.applied)
		}
	}
	if target > c.applied {
		return c.rowsUpTo(actx, target, true)
	}
	return nil
}

// rowsUpTo applies all buffered rows with commit ts <= ts and records the checkpoint.
// Waiters are notified when announce is set.
func (c *coordinator) rowsUpTo(ctx context.Context, ts uint64, announce bool) error {
	start := time.Now()
	before := c.ap.rows.Load()
	parts, err := c.ap.applyRows(ctx, c.buf, ts)
	if err != nil {
		return err
	}
	if err := c.ap.hooks.fire(hookAfterRows); err != nil {
		return err
	}
	c.buf.release(ts)
	offsets := map[partKey]int64{}
	for i, p := range c.parts {
		n := 0
		for n < len(p.pending) && p.pending[n].maxTs <= ts {
			n++
		}
		p.pending = p.pending[n:]
		resume := p.nextRead
		if len(p.pending) > 0 {
			resume = p.pending[0].offset
		}
		for _, d := range c.ddls {
			if off, ok := d.offsets[i]; ok && off < resume {
				resume = off
			}
		}
		if resume >= 0 && resume != p.saved {
			offsets[p.key] = resume
		}
	}
	// The round's ledger commits with its checkpoint, after the rows it names
	// (internal/ledger); so do the schemas the simple protocol's records taught the
	// decoder, which every record below the offsets has been decoded by.
	var schemas []simple.SchemaEntry
	mark := c.schemaMark
	if c.simple != nil {
		schemas, mark = c.simple.SchemasSince(c.schemaMark)
	}
	err = c.ap.retry(ctx, "meta checkpoint", func(ctx context.Context) error {
		return c.meta.saveCheckpoint(ctx, ts, offsets, parts, schemas)
	})
	if err != nil {
		return err
	}
	c.schemaMark = mark
	c.r.ctr.observeRound(time.Since(start))
	c.afterCheckpoint(ctx, ts)
	for _, p := range c.parts {
		if off, ok := offsets[p.key]; ok {
			p.saved = off
		}
	}
	c.applied = ts
	for k := range c.ddlDone {
		if k.ts < ts {
			delete(c.ddlDone, k)
		}
	}
	// Publish first: whoever advance wakes must find the status of this checkpoint
	// (buffered rows released), not the one before it.
	c.publish(true)
	if announce {
		c.r.advance(ts)
	}
	if n := c.ap.rows.Load() - before; n > 0 {
		c.log.Debug("round applied", "resolved_ts", ts, "rows", n, "duration", time.Since(start),
			"buffered_rows", c.buf.memCount+c.buf.spilled, "buffered_bytes", c.buf.memBytes)
	}
	return nil
}

// execDDL runs one DDL downstream, translated for it (see ddl.go), or records it as
// skipped: a TiDB-only DDL, or one applier.skip-ddl names.
func (c *coordinator) execDDL(ctx context.Context, d *pendingDDL) error {
	log := c.log.With("resolved_ts", d.ev.CommitTs, "table", d.ev.Schema+"."+d.ev.Table)
	if rule, ok := c.cfg.Applier.skipRule(d.ev.CommitTs, d.ev.Query); ok {
		log.Warn("skipping DDL by configuration", "rule", rule, "query", d.ev.Query)
		return c.meta.recordDDL(ctx, d.key, d.ev.Query, "", rule)
	}
	schema := c.cfg.targetSchema(d.ev.Schema)
	var tr ddlTranslation
	attempt := 0
	err := c.ap.retry(ctx, "DDL", func(ctx context.Context) error {
		attempt++
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.Applier.DDLTimeout)
		defer cancel()
		conn, err := c.ap.db.Conn(ctx)
		if err != nil {
			return err
		}
		defer conn.Close()
		fl, err := downstreamFlavor(ctx, conn)
		if err != nil {
			return err
		}
		t, err := newDDLTranslator(c.cfg, fl)
		if err != nil {
			return err
		}
		if tr, err = t.translate(d.ev.Query, d.ev.DDLType, d.ev.Schema); err != nil || tr.Skip != "" {
			return err
		}
		if schema != "" && d.ev.Table != "" {
			if _, err := conn.ExecContext(ctx, "USE "+ident.Quote(schema)); err != nil {
				return err
			}
		}
		// A DDL commits implicitly: the lease is checked just before (ha.go).
		if err := c.meta.fence(ctx, conn); err != nil {
			return err
		}
		if err := c.meta.markDDL(ctx, conn); err != nil {
			return err
		}
		_, err = conn.ExecContext(ctx, tr.SQL)
		if err != nil && (attempt > 1 || d.ev.CommitTs == c.startTs) && alreadyApplied(err) {
			// The statement ran before a crash (or a lost connection) but was not
			// recorded; its effect is there.
			log.Warn("DDL was already applied before a restart", "err", err)
			return nil
		}
		return err
	})
	switch {
	case err != nil && tr.SQL == "": // not translated (or the downstream's version unread)
		return fmt.Errorf("DDL at commit ts %d: %q: %w; %s", d.ev.CommitTs, d.ev.Query, err, rejectHint(err, d.ev.CommitTs, tr))
	case err != nil:
		return fmt.Errorf("DDL at commit ts %d rejected by downstream: %q (executed as %q): %w; %s",
			d.ev.CommitTs, d.ev.Query, tr.SQL, err, rejectHint(err, d.ev.CommitTs, tr))
	case tr.Skip != "":
		log.Warn("skipping TiDB-only DDL", "reason", tr.Skip, "query", d.ev.Query)
		return c.meta.recordDDL(ctx, d.key, d.ev.Query, "", tr.Skip)
	}
	if err := c.ap.hooks.fire(hookBeforeDDLRecord); err != nil {
		return err
	}
	if len(tr.Changes) > 0 {
		log.Info("DDL applied", "translated", tr.Changes)
	} else {
		log.Info("DDL applied")
	}
	return c.meta.recordDDL(ctx, d.key, d.ev.Query, tr.SQL, "")
}

// alreadyApplied reports errors a repeated DDL produces.
func alreadyApplied(err error) bool {
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return false
	}
	switch me.Number {
	case 1007, // database exists
		1008, // database doesn't exist
		1050, // table exists
		1051, // unknown table
		1060, // duplicate column
		1061, // duplicate key name
		1068, // multiple primary key
		1091, // can't drop; check that it exists
		1146: // table doesn't exist
		return true
	}
	return false
}

// pruneInterval spaces the deletion of ledger and ts-map rows past their retention.
const pruneInterval = 10 * time.Minute

// afterCheckpoint does what the applier does between rounds, while the fallback is
// exactly at ts: records the ts-map every verify.ts-map-interval and prunes the ledger
// every pruneInterval. Neither may stop replication: a failure is logged and tried
// again at the next round.
func (c *coordinator) afterCheckpoint(ctx context.Context, ts uint64) {
	now := time.Now()
	if iv := c.cfg.Applier.TSMapInterval; iv > 0 && now.Sub(c.lastTSMap) >= iv {
		c.lastTSMap = now
		if err := c.recordTSMap(ctx, ts, "interval"); err != nil {
			c.log.Warn("could not record the ts-map", "resolved_ts", ts, "err", err)
		}
	}
	if now.Sub(c.lastPrune) >= pruneInterval {
		c.lastPrune = now
		horizon := tso.FromTime(now.Add(-c.cfg.Applier.LedgerRetention))
		if n, err := c.meta.prune(ctx, horizon); err != nil {
			c.log.Warn("could not prune the ledger", "err", err)
		} else if n > 0 {
			c.log.Info("pruned ledger and ts-map rows past their retention", "rows", n, "retention", c.cfg.Applier.LedgerRetention)
		}
	}
}

// recordTSMap reads the fallback's position and records it with ts: the caller
// guarantees the fallback holds exactly the upstream at ts (between rounds, or inside a
// barrier).
func (c *coordinator) recordTSMap(ctx context.Context, ts uint64, source string) error {
	qctx, cancel := context.WithTimeout(ctx, c.cfg.Applier.QueryTimeout)
	defer cancel()
	pos, err := position.Read(qctx, c.meta.db)
	if err != nil {
		return err
	}
	return c.meta.recordTSMap(ctx, ts, pos, source, time.Now())
}

// logProgress logs the lag every 30 seconds.
func (c *coordinator) logProgress() {
	if time.Since(c.lastLog) < 30*time.Second {
		return
	}
	c.lastLog = time.Now()
	st := c.r.Status()
	c.log.Info("progress", "resolved_ts", st.AppliedTs, "applied_lag_seconds", st.AppliedLagSeconds,
		"global_resolved_ts", st.ResolvedTs, "resolved_lag_seconds", st.ResolvedLagSeconds,
		"buffered_rows", st.BufferedRows, "spilled_rows", st.SpilledRows, "rows_applied", st.RowsApplied)
}

// publish refreshes the status snapshot (at most every 100ms unless forced).
func (c *coordinator) publish(force bool) {
	now := time.Now()
	if !force && now.Sub(c.lastPub) < 100*time.Millisecond {
		return
	}
	c.lastPub = now
	g := c.global()
	if g == math.MaxUint64 {
		g = 0
	}
	// AppliedTs is not set here: Status reports the announced checkpoint (r.applied),
	// which lags c.applied while a DDL at the checkpoint's ts has not run yet.
	st := Status{
		Changefeed:    c.cfg.Changefeed.ID,
		State:         "running",
		ResolvedTs:    g,
		BufferedRows:  c.buf.memCount + c.buf.spilled,
		SpilledRows:   c.buf.spilled,
		BufferedBytes: c.buf.memBytes,
		PendingDDLs:   len(c.ddls),
		Barriers:      len(c.barriers),
		UpdatedAt:     now,
	}
	for _, p := range c.parts {
		ps := PartitionStatus{Topic: p.key.Topic, Partition: p.key.Partition, ResolvedTs: p.resolved,
			NextOffset: p.nextRead, CheckpointOffset: p.saved, HighWatermark: p.hw}
		if p.hw >= 0 && p.nextRead >= 0 {
			ps.Lag = max(0, p.hw-p.nextRead)
		}
		st.Partitions = append(st.Partitions, ps)
	}
	c.r.mu.Lock()
	c.r.status = st
	c.r.mu.Unlock()
}
