package cdc

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"golang.org/x/sync/errgroup"

	"github.com/tidb-parity/parity/cdc/simple"
	"github.com/tidb-parity/parity/internal/instance"
	"github.com/tidb-parity/parity/internal/tlsauth"
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

// New returns a Replicator; cfg is checked (Config.Checked) unless it already was.
// logger may be nil (slog.Default()).
func New(cfg Config, logger *slog.Logger) (*Replicator, error) {
	cfg, err := cfg.Checked()
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.Default()
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
		err = r.runHA(ctx, started)
	} else {
		err = r.runEpoch(ctx, 0, started)
	}
	if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
		// Stopped while starting (a lease just taken, the meta schema being created):
		// a clean stop, as one between rounds is.
		return nil
	}
	return err
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
	dec, err := newRecordDecoder(cfg)
	if err != nil {
		return err
	}
	sdec, _ := dec.(*simple.Decoder)
	if sdec != nil {
		// The schemas of the DDL and BOOTSTRAP records before the saved offsets.
		n, err := m.restoreSimpleSchemas(ctx, sdec)
		if err != nil {
			return err
		}
		r.log.Info("simple-protocol schemas restored", "schemas", n)
		defer r.ctr.checksumDecoder(sdec)()
	}
	var schemas *streamSchemas
	if cfg.Changefeed.Protocol == ProtocolCanal || cfg.Changefeed.Protocol == ProtocolSimple {
		// Neither says which columns are generated; canal-json not which form the key.
		schemas = newStreamSchemas(saved.appliedTs, r.schemaFallback(cfg, applyDB))
		// A DDL of a table the stream has not defined starts from its definition read
		// before the DDL (streamschema_base.go).
		schemas.defs, schemas.done = r.schemaDefs(cfg, applyDB), maps.Clone(saved.ddlApplied)
	}
	c := &coordinator{
		r: r, cfg: cfg, log: r.log, meta: m, buf: buf, watch: watch,
		ap:      newApplier(applyDB, m, cfg, r.log, r.hooks, saved.tableProgress, &r.ctr),
		applied: saved.appliedTs, startTs: saved.appliedTs, ddlDone: saved.ddlApplied,
		simple: sdec,
	}
	if cfg.Applier.LoadData {
		lctx, cancel := context.WithTimeout(ctx, cfg.Applier.QueryTimeout)
		on, err := localInfile(lctx, applyDB)
		cancel()
		if err != nil {
			return fmt.Errorf("connecting to the downstream: %w", err)
		}
		c.ap.load = on
		if !on {
			r.log.Info("the downstream's local_infile is OFF: rows are written with INSERT statements (applier.load-data)")
		}
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
	// With the open protocol the readers keep abreast by resolved ts (readgate.go).
	records := make(chan record, readAhead(cfg.Applier.MemoryBytes))
	resolved := make([]uint64, len(c.parts))
	for i, ps := range c.parts {
		resolved[i] = ps.resolved
	}
	var gate *readGate
	if schemas == nil { // see readGate: streamSchemas' readers wait for partition 0
		gate = newReadGate(resolved)
	}
	g, gctx := errgroup.WithContext(ctx)
	for i, ps := range c.parts {
		start := ps.nextRead
		g.Go(func() error { return r.consume(gctx, dec, schemas, gate, i, ps.key, start, records) })
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
