package cdc

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/segmentio/kafka-go"
	"golang.org/x/sync/errgroup"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/instance"
	"github.com/tidb-parity/parity/internal/position"
	"github.com/tidb-parity/parity/internal/retry"
	"github.com/tidb-parity/parity/internal/tlsauth"
	"github.com/tidb-parity/parity/internal/tso"
)

// ErrBarrierPassed is returned by Barrier when the applied checkpoint is already beyond
// the requested ts: the downstream can no longer be held exactly there.
var ErrBarrierPassed = errors.New("applied checkpoint is already past the barrier ts")

// ErrStopped is returned by Barrier when the replicator is not running.
var ErrStopped = errors.New("replicator is not running")

// RecordError names a Kafka record the replicator cannot use. Without dead-lettering it
// stops the partition (and the replicator) at that offset; the offset is never passed.
type RecordError struct {
	Topic     string
	Partition int
	Offset    int64
	Err       error
}

func (e *RecordError) Error() string {
	return fmt.Sprintf("topic %s partition %d offset %d: %v", e.Topic, e.Partition, e.Offset, e.Err)
}

func (e *RecordError) Unwrap() error { return e.Err }

// Replicator consumes a TiCDC open-protocol changefeed from Kafka and applies it to the
// downstream MySQL exactly once, in commit-ts order. Create it with New, run it with Run;
// Status, Barrier and AppliedNotify may be called from other goroutines.
type Replicator struct {
	cfg   Config
	log   *slog.Logger
	hooks *testHooks

	started atomic.Bool
	reqs    chan *barrierReq
	running chan struct{} // closed when Run started serving requests
	done    chan struct{} // closed when Run returned

	rows  *rowFetcher    // nil without upstream.dsn
	ctr   counters       // Status's counters, since New
	kafka *tlsauth.Kafka // TLS and SASL of every broker connection

	mu      sync.Mutex
	status  Status
	applied uint64
	waiters []waiter

	// meta is the meta schema of the running replicator (nil when not running), for
	// RecordTSMap.
	meta atomic.Pointer[meta]
	// apply is the running replicator's applier (nil when not running), for Repair: it
	// writes with the applier's sessions and statements, inside a barrier.
	apply atomic.Pointer[applier]

	// With ha.enabled (ha.go): this daemon's name, its role and lease, and whether it
	// stands by (Barrier refuses then).
	instance string
	ha       haState
	standby  atomic.Bool
}

type waiter struct {
	ts uint64
	ch chan struct{}
}

type barrierReq struct {
	ctx    context.Context
	ts     uint64
	fn     func(ctx context.Context) error
	result chan error
}

// New validates cfg and returns a Replicator. logger may be nil (slog.Default()).
func New(cfg Config, logger *slog.Logger) (*Replicator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.Default()
	}
	cfg, err := cfg.WithTLS()
	if err != nil {
		return nil, err
	}
	k, err := tlsauth.NewKafka("changefeed", cfg.Changefeed.TLS, cfg.Changefeed.SASL)
	if err != nil {
		return nil, err
	}
	name := cfg.HA.Instance
	if name == "" {
		name = instance.DefaultInstance()
	}
	return &Replicator{
		cfg:      cfg,
		kafka:    k,
		instance: name,
		log:      logger.With("changefeed", cfg.Changefeed.ID),
		reqs:     make(chan *barrierReq),
		running:  make(chan struct{}),
		done:     make(chan struct{}),
		status:   Status{Changefeed: cfg.Changefeed.ID, State: "starting"},
	}, nil
}

// AppliedNotify returns a channel closed once the applied checkpoint is >= ts.
func (r *Replicator) AppliedNotify(ts uint64) <-chan struct{} {
	ch := make(chan struct{})
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.applied >= ts {
		close(ch)
		return ch
	}
	r.waiters = append(r.waiters, waiter{ts, ch})
	return ch
}

// WaitApplied blocks until the applied checkpoint is >= ts or ctx ends.
func (r *Replicator) WaitApplied(ctx context.Context, ts uint64) error {
	select {
	case <-r.AppliedNotify(ts):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Barrier makes the applier stop exactly at ts: once every event with commit ts <= ts is
// committed downstream (checkpoint recorded) and before anything newer is applied, fn
// runs on the applier's goroutine; applying resumes when fn returns. Barrier returns fn's
// error, ErrBarrierPassed if the checkpoint is already beyond ts, ErrStopped if the
// replicator is not running, or ctx's error if ctx ends first (the barrier is dropped).
// A DDL with commit ts == ts that TiCDC delivers after the resolved ts is applied after
// the barrier.
func (r *Replicator) Barrier(ctx context.Context, ts uint64, fn func(ctx context.Context) error) error {
	req := &barrierReq{ctx: ctx, ts: ts, fn: fn, result: make(chan error, 1)}
	if r.standby.Load() {
		return ErrStandby
	}
	select {
	case <-r.running:
	case <-r.done:
		return ErrStopped
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case r.reqs <- req:
	case <-r.done:
		return ErrStopped
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-req.result:
		return err
	case <-r.done:
		select {
		case err := <-req.result:
			return err
		default:
			return ErrStopped
		}
	case <-ctx.Done():
		// The coordinator drops a barrier whose context ended; if fn is already
		// running it sees the same context.
		return ctx.Err()
	}
}

// RecordTSMap records in <meta-schema>.ts_map that the fallback, at its position pos
// (internal/position), held exactly the upstream at ts: for a caller that read pos
// inside Barrier(ts), such as verification's snapshot pairs (source "verify"). It
// returns ErrStopped when the replicator is not running.
func (r *Replicator) RecordTSMap(ctx context.Context, ts uint64, pos, source string) error {
	m := r.meta.Load()
	if m == nil {
		return ErrStopped
	}
	return m.recordTSMap(ctx, ts, pos, source, time.Now())
}

// record is one Kafka record handed from a partition reader to the coordinator.
type record struct {
	part   int
	offset int64
	hw     int64
	key    []byte
	value  []byte
	events []open.Event
	err    error
}

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

// coordinator owns all ingest and apply state; it runs on one goroutine.
type coordinator struct {
	r         *Replicator
	cfg       Config
	log       *slog.Logger
	meta      *meta
	ap        *applier
	buf       *buffer
	parts     []*partState
	applied   uint64
	startTs   uint64 // checkpoint at start: a DDL at this ts may have run before a crash
	seq       uint64
	ddls      []*pendingDDL
	ddlDone   map[ddlKey]bool
	barriers  []*barrierReq
	stopErr   error // an unusable record stopped a partition: apply what is possible, then fail
	lastPub   time.Time
	lastLog   time.Time
	lastTSMap time.Time // last ts-map row (afterCheckpoint)
	lastPrune time.Time // last ledger pruning
	// watch lists the changefeed's partitions before every round (see checkPartitions).
	watch       *partitionWatch
	lastListErr time.Time
	lastCheck   time.Time // last checkPartitions
}

// Run consumes and applies until ctx ends (then it finishes the round in progress and
// returns nil) or an error stops it.
//
// Run may be called once per Replicator.
func (r *Replicator) Run(ctx context.Context) (err error) {
	if !r.started.CompareAndSwap(false, true) {
		return errors.New("replicator: Run called twice")
	}
	defer func() {
		r.mu.Lock()
		if err != nil {
			r.status.State, r.status.Error = "failed", err.Error()
		} else {
			r.status.State = "stopped"
		}
		r.mu.Unlock()
		close(r.done)
	}()
	defer tuneGC(r.cfg, r.log)()
	var running sync.Once
	started := func() { running.Do(func() { close(r.running) }) }
	if r.cfg.HA.Enabled {
		return r.runHA(ctx, started)
	}
	return r.runEpoch(ctx, 0, started)
}

// runEpoch runs the replicator until ctx ends or an error stops it, restarting it when
// the changefeed's partitions change; epoch is the lease it applies under (ha; 0: none).
func (r *Replicator) runEpoch(ctx context.Context, epoch uint64, started func()) error {
	for {
		err := r.runOnce(ctx, epoch, started)
		var pc *partitionsChanged
		if !errors.As(err, &pc) {
			return err
		}
		// As after a restart: everything is read again from the stored offsets, and a new
		// partition from its first offset.
		r.log.Warn("the changefeed's partitions changed; restarting the replicator to read them", "added", pc.added, "removed", pc.removed)
	}
}

// runOnce runs the replicator on the partitions listed at its start, until ctx ends, an
// error stops it, or the partitions change (*partitionsChanged). started is called once
// it serves requests.
func (r *Replicator) runOnce(ctx context.Context, epoch uint64, started func()) error {
	cfg := r.cfg
	tz, _ := sessionTimeZone(cfg.Changefeed.TimeZone)
	session := map[string]string{
		"time_zone":          "'" + tz + "'",
		"foreign_key_checks": "0",
	}
	if cfg.Applier.SQLMode != "" {
		session["sql_mode"] = "'" + cfg.Applier.SQLMode + "'"
	}
	var metaSession map[string]string
	if epoch != 0 {
		metaSession = cfg.HA.session(nil)
		cfg.HA.session(session)
	}
	applyDB, err := openDB("downstream", cfg.Downstream.DSN, session, cfg.Applier.Workers+2)
	if err != nil {
		return err
	}
	defer applyDB.Close()
	cfg.HA.pool(applyDB)
	pctx, cancel := context.WithTimeout(ctx, cfg.Applier.QueryTimeout)
	err = applyDB.PingContext(pctx)
	cancel()
	if err != nil {
		return fmt.Errorf("connecting to the downstream with time_zone %s (changefeed.time-zone), sql_mode %q (applier.sql-mode): %w", tz, cfg.Applier.SQLMode, err)
	}
	metaDB, err := openDB("downstream", cfg.Downstream.DSN, metaSession, 4)
	if err != nil {
		return err
	}
	defer metaDB.Close()
	cfg.HA.pool(metaDB)
	m := newMeta(metaDB, cfg.Applier.MetaSchema, cfg.Changefeed.ID, cfg.Applier.QueryTimeout)
	m.epoch = epoch
	if err := m.migrate(ctx); err != nil {
		return err
	}
	r.meta.Store(m)
	defer r.meta.Store(nil) // before metaDB closes
	saved, err := m.load(ctx)
	if err != nil {
		return err
	}
	if !saved.hasCheckpoint {
		saved.appliedTs = cfg.Changefeed.StartTs
	}
	if err := m.markLedger(ctx, cfg.Applier.Ledger, saved.appliedTs); err != nil {
		return err
	}
	if cfg.Upstream.DSN != "" {
		if r.rows, err = newRowFetcher(cfg, r.log, &r.ctr); err != nil {
			return err
		}
		defer r.rows.close()
	}
	watch := newPartitionWatch(cfg.Changefeed, r.kafka)
	defer watch.close()
	parts, err := watch.list(ctx)
	if err != nil {
		return err
	}
	buf, err := newBuffer(cfg.spillDir(), cfg.Applier.MemoryBytes)
	if err != nil {
		return err
	}
	defer buf.close()
	dec, err := open.NewDecoder(open.DecoderConfig{
		Compression:     open.Compression(cfg.Changefeed.Compression),
		ClaimCheck:      claimCheckLoader(cfg.Changefeed.ClaimCheckDir),
		MaxPayloadBytes: cfg.Changefeed.MaxMessageBytes,
	})
	if err != nil {
		return err
	}
	c := &coordinator{
		r: r, cfg: cfg, log: r.log, meta: m, buf: buf, watch: watch,
		ap:      newApplier(applyDB, m, cfg, r.log, r.hooks, saved.tableProgress, &r.ctr),
		applied: saved.appliedTs, startTs: saved.appliedTs, ddlDone: saved.ddlApplied,
	}
	r.apply.Store(c.ap)
	defer r.apply.Store(nil) // before applyDB closes
	for _, pk := range parts {
		ps := &partState{key: pk, nextRead: -1, saved: -1, hw: -1}
		if off, ok := saved.offsets[pk]; ok {
			ps.nextRead, ps.saved = off, off
			ps.resolved = saved.appliedTs // everything <= checkpoint is applied
		}
		c.parts = append(c.parts, ps)
	}
	r.advance(saved.appliedTs)
	r.log.Info("replicator starting", "resolved_ts", saved.appliedTs, "partitions", len(parts),
		"workers", cfg.Applier.Workers, "spill_dir", cfg.spillDir())

	// Readers decode ahead while a round is applied, so the next round finds a backlog
	// already decoded and covers several resolved ts at once (larger statements, fewer
	// checkpoints). The read-ahead is bounded: readAhead records of at most
	// max-batch-size events each, about a quarter of applier.memory-bytes.
	records := make(chan record, readAhead(cfg.Applier.MemoryBytes))
	g, gctx := errgroup.WithContext(ctx)
	for i, ps := range c.parts {
		start := ps.nextRead
		g.Go(func() error { return r.consume(gctx, dec, i, ps.key, start, records) })
	}
	g.Go(func() error { return c.run(gctx, records) })
	started()
	err = g.Wait()
	if err == nil || (ctx.Err() != nil && errors.Is(err, context.Canceled)) {
		r.log.Info("replicator stopped", "resolved_ts", c.applied)
		return nil
	}
	return err
}

// tuneGC applies applier.gc-percent and its soft memory limit, unless it is 0 or the
// environment sets Go's own (GOGC, GOMEMLIMIT); the returned func restores the previous
// settings.
func tuneGC(cfg Config, log *slog.Logger) func() {
	if cfg.Applier.GCPercent == 0 || os.Getenv("GOGC") != "" || os.Getenv("GOMEMLIMIT") != "" {
		return func() {}
	}
	gc := debug.SetGCPercent(cfg.Applier.GCPercent)
	limit := debug.SetMemoryLimit(cfg.gcLimit())
	log.Debug("go runtime tuned", "gc_percent", cfg.Applier.GCPercent, "memory_limit", cfg.gcLimit())
	return func() {
		debug.SetGCPercent(gc)
		debug.SetMemoryLimit(limit)
	}
}

// readAhead is the number of decoded records the readers may hold ahead of the
// coordinator: a quarter of the memory bound at ~16 KiB per record (16 events),
// between 256 and 4096 (the default 256 MiB gives 4096).
func readAhead(memoryBytes int64) int {
	return int(min(max(memoryBytes/4/(16<<10), 256), 4096))
}

// openDB opens a pool of at most conns connections to the server of dsn (what names it
// in errors: "downstream", "upstream"), with params as session settings.
func openDB(what, dsn string, params map[string]string, conns int) (*sql.DB, error) {
	mc, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("parsing %s DSN: %w", what, err)
	}
	mc.DBName = ""
	if mc.Params == nil {
		mc.Params = map[string]string{}
	}
	for k, v := range params {
		mc.Params[k] = v
	}
	mc.InterpolateParams = true
	mc.MultiStatements = false
	mc.ParseTime = false
	db, err := sql.Open("mysql", mc.FormatDSN())
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", what, err)
	}
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	db.SetConnMaxLifetime(30 * time.Minute)
	return db, nil
}

func claimCheckLoader(dir string) func(string) ([]byte, error) {
	if dir == "" {
		return nil
	}
	return func(loc string) ([]byte, error) {
		return os.ReadFile(filepath.Join(dir, open.ClaimCheckFileName(loc)))
	}
}

// consume reads one partition from start (-1: the first offset) and hands decoded
// records to the coordinator. It never commits offsets to Kafka: progress lives in the
// meta schema.
func (r *Replicator) consume(ctx context.Context, dec *open.Decoder, idx int, pk partKey, start int64, out chan<- record) error {
	rd := kafka.NewReader(kafka.ReaderConfig{
		Brokers:         r.cfg.Changefeed.Brokers,
		Dialer:          r.kafka.Dialer(10 * time.Second),
		Topic:           pk.Topic,
		Partition:       pk.Partition,
		MinBytes:        1,
		MaxBytes:        32 << 20,
		MaxWait:         1500 * time.Millisecond, // the broker answers as soon as data arrives; must exceed kafka-go's 1s RTT allowance, and bounds Close
		ReadLagInterval: -1,
		// Never let the reader jump over records deleted by retention: fail instead.
		OffsetOutOfRangeError: true,
		ErrorLogger: kafka.LoggerFunc(func(f string, a ...any) {
			if ctx.Err() == nil { // errors while stopping are expected
				r.log.Warn("kafka reader", "partition", pk.String(), "msg", fmt.Sprintf(f, a...))
			}
		}),
	})
	defer rd.Close()
	if start < 0 {
		start = kafka.FirstOffset
	}
	if err := rd.SetOffset(start); err != nil {
		return fmt.Errorf("seeking %s to %d: %w", pk, start, err)
	}
	tables := tableCache{}     // upstream tables of this partition's handle-key-only events
	var failingSince time.Time // the first of consecutive transient read errors
	for {
		msg, err := rd.FetchMessage(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			// kafka-go's reader reconnects by itself (with backoff, from the next offset)
			// but reports the errors of its attempts: transient ones are waited out for
			// changefeed.retry-timeout.
			if kafkaTransient(err) {
				now := time.Now()
				if failingSince.IsZero() {
					failingSince = now
				}
				if d := now.Sub(failingSince); d < r.cfg.Changefeed.RetryTimeout {
					r.log.Warn("kafka unavailable; reconnecting", "partition", pk.String(), "failing_for", d.Round(time.Millisecond), "err", err)
					continue
				}
				return fmt.Errorf("reading %s: kafka unavailable for %v (changefeed.retry-timeout %v): %w",
					pk, now.Sub(failingSince).Round(time.Second), r.cfg.Changefeed.RetryTimeout, r.kafka.Explain(err))
			}
			return fmt.Errorf("reading %s: %w", pk, r.kafka.Explain(err))
		}
		failingSince = time.Time{}
		rec := record{part: idx, offset: msg.Offset, hw: msg.HighWaterMark}
		rec.events, err = dec.Decode(msg.Key, msg.Value)
		if err == nil {
			err = checkEvents(rec.events, r.rows != nil)
		}
		if err == nil && r.rows != nil {
			// Not a record error (the record is fine): stop, and read it again after a restart.
			if err := r.rows.complete(ctx, rec.events, tables); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("%s offset %d: %w", pk, msg.Offset, err)
			}
		}
		if err != nil {
			rec.events = nil
			rec.key, rec.value = msg.Key, msg.Value
			rec.err = &RecordError{Topic: pk.Topic, Partition: pk.Partition, Offset: msg.Offset, Err: open.WithRecord(err, pk.Topic, pk.Partition, msg.Offset)}
		}
		select {
		case out <- rec:
		case <-ctx.Done():
			return nil
		}
	}
}

// kafkaTransient reports whether a read error is worth waiting out: a broker's
// retriable error code, or the network (refused, reset, timed out, closed). Other Kafka
// errors (an offset out of range: records deleted by retention) are not.
func kafkaTransient(err error) bool {
	var (
		cv *tls.CertificateVerificationError
		ua x509.UnknownAuthorityError
		hn x509.HostnameError
		ci x509.CertificateInvalidError
		al tls.AlertError
		ra *tls.RecordHeaderError
	)
	if errors.As(err, &cv) || errors.As(err, &ua) || errors.As(err, &hn) || errors.As(err, &ci) || errors.As(err, &al) || errors.As(err, &ra) {
		return false // TLS refused: waiting does not help
	}
	var ke kafka.Error
	if errors.As(err, &ke) {
		return ke.Temporary()
	}
	return retry.Classify(err) == retry.Connection
}

// checkEvents rejects events the applier cannot apply correctly. fetch says whether
// handle-key-only inserts and updates can be completed from the upstream.
func checkEvents(evs []open.Event, fetch bool) error {
	for i := range evs {
		ev := &evs[i]
		if ev.Kind == open.KindRow && ev.OnlyHandleKey && ev.Op != open.OpDelete && !fetch {
			return fmt.Errorf("event %d (%s of %s.%s, commit ts %d) carries only handle-key columns (TiCDC large-message-handle-option handle-key-only): set upstream.dsn so parity can read the row from TiDB", i, ev.Op, ev.Schema, ev.Table, ev.CommitTs)
		}
		if ev.Kind == open.KindRow && ev.Table == "" {
			return fmt.Errorf("row event %d has no table", i)
		}
	}
	return nil
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
	// (internal/ledger).
	err = c.ap.retry(ctx, "meta checkpoint", func(ctx context.Context) error {
		return c.meta.saveCheckpoint(ctx, ts, offsets, parts)
	})
	if err != nil {
		return err
	}
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
		c.log.Debug("round applied", "resolved_ts", ts, "rows", n, "duration", time.Since(start))
	}
	return nil
}

func (r *Replicator) advance(ts uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.applied = ts
	keep := r.waiters[:0]
	for _, w := range r.waiters {
		if w.ts <= ts {
			close(w.ch)
		} else {
			keep = append(keep, w)
		}
	}
	r.waiters = keep
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
