package checker

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"golang.org/x/sync/errgroup"

	"github.com/tidb-parity/parity/internal/ident"
)

// Sources are the connections of a run: the two sides and the meta database (writable,
// normally the downstream server) that holds the run state.
type Sources struct {
	Upstream   Source
	Downstream Source
	Meta       *sql.DB
}

// Run opens the sources from cfg's DSNs (the upstream read at cfg.Upstream.Snapshot when
// set), runs the diff and closes them. The run state goes to cfg.MetaDSN (default: the
// downstream DSN).
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid config: %w", err)
	}
	if cfg.Upstream.DSN == "" || cfg.Downstream.DSN == "" {
		return nil, errors.New("invalid config: upstream.dsn and downstream.dsn are required")
	}
	upN, downN := cfg.Upstream.Concurrency, cfg.Downstream.Concurrency
	if upN == 0 {
		upN = cfg.Concurrency
	}
	if downN == 0 {
		downN = cfg.Concurrency
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	for _, s := range []struct {
		side          Side
		dsn, snapshot string
	}{{Upstream, cfg.Upstream.DSN, cfg.Upstream.Snapshot}, {Downstream, cfg.Downstream.DSN, cfg.Downstream.Snapshot}} {
		if s.snapshot == "" {
			continue
		}
		if err := checkSnapshotGC(ctx, s.dsn, s.snapshot, time.Now(), log.With("side", s.side.String())); err != nil {
			return nil, fmt.Errorf("%s: %w", s.side, err)
		}
	}
	up, err := OpenDSN(ctx, cfg.Upstream.DSN, upN, cfg.Upstream.Snapshot, cfg.QueryTimeout)
	if err != nil {
		return nil, fmt.Errorf("upstream: %w", snapshotHint(err, &cfg))
	}
	defer up.Close()
	down, err := OpenDSN(ctx, cfg.Downstream.DSN, downN, cfg.Downstream.Snapshot, cfg.QueryTimeout)
	if err != nil {
		return nil, fmt.Errorf("downstream: %w", snapshotHint(err, &cfg))
	}
	defer down.Close()
	metaDSN := cfg.MetaDSN
	if metaDSN == "" {
		metaDSN = cfg.Downstream.DSN
	}
	// The run state is written with a few short statements per chunk: interpolated
	// parameters make each one round trip instead of prepare, execute and close.
	mcfg, err := mysql.ParseDSN(metaDSN)
	if err != nil {
		return nil, fmt.Errorf("meta database: parse dsn: %w", err)
	}
	mcfg.InterpolateParams = true
	meta, err := sql.Open("mysql", mcfg.FormatDSN())
	if err != nil {
		return nil, fmt.Errorf("meta database: %w", err)
	}
	defer meta.Close()
	meta.SetMaxOpenConns(4)
	rep, err := RunWith(ctx, cfg, Sources{Upstream: up, Downstream: down, Meta: meta})
	return rep, snapshotHint(err, &cfg)
}

type checksum struct {
	count int64
	sum   string
	dur   time.Duration
}

type chunkResult struct {
	up, down checksum
	// differences counts the differing rows; undrilledChunk marks a mismatched chunk that
	// was not drilled down (Config.MaxDifferences).
	differences int64
}

// undrilledChunk is chunkResult.differences (and diff_chunks.differences) of a mismatched
// chunk whose rows were not compared.
const undrilledChunk = -1

type tableState struct {
	idx        int
	name       string // upstream schema.table, for logs and errors
	stored     storedTable
	plan       *TablePlan
	problems   []StructureProblem
	fatal      bool
	estRows    int64
	regionKeys []Bound      // TiDB region start keys (coarse boundaries), sorted
	cutter     *valueCutter // cuts a single integer key by value (nil: walk the index)

	mu          sync.Mutex
	sizer       *chunkSizer
	done        map[int]bool
	checkpoint  int
	chunks      int // chunks cut (stored) so far: the next chunk's seq
	chunksDone  int
	upRows      int64
	downRows    int64
	differences int64
	// drilled counts the differing rows of the chunks whose drill-down ended and kept
	// them (drillChunk, Config.MaxDifferences); undrilled the done chunks left undrilled
	// because of the limit.
	drilled   int64
	undrilled int
	splitDone bool
}

type runner struct {
	cfg     *Config
	src     Sources
	st      *store
	log     *slog.Logger
	tables  []*tableState
	start   time.Time
	limiter *rateLimiter
	busy    *busyGate

	journal    *journal
	progressMu sync.Mutex

	// pushdown, per side: a TiDB side computes checksums in the form its coprocessor
	// evaluates (see TablePlan.Pushdown).
	pushdown [2]bool
	// binaryStrings, per side: a TiDB bootstrapped without new collations, which compares
	// every string as binary bytes (NO PAD) whatever collation its columns declare.
	binaryStrings [2]bool
	// packet is the smaller max_allowed_packet of the two servers (TablePlan.FitEncoding).
	packet int64
	// rechecks counts the re-check rounds done (recheck.go).
	rechecks int
}

// RunWith runs a diff on the given sources (for callers that hold snapshot connections,
// see NewConnSource). cfg's DSNs are not used.
func RunWith(ctx context.Context, cfg Config, src Sources) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid config: %w", err)
	}
	if src.Upstream == nil || src.Downstream == nil || src.Meta == nil {
		return nil, errors.New("invalid sources: upstream, downstream and meta are required")
	}
	if cfg.Changefeed.MaxLag > 0 && cfg.Lag == nil {
		return nil, errors.New("invalid config: changefeed.max_lag needs a lag source (Config.Lag)")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	r := &runner{
		cfg:     &cfg,
		src:     src,
		st:      &store{db: src.Meta, schema: ident.Quote(cfg.MetaSchema), tmo: cfg.QueryTimeout},
		start:   time.Now(),
		limiter: newRateLimiter(cfg.MaxRowsPerSecond),
	}
	if err := r.st.migrate(ctx); err != nil {
		return nil, err
	}
	if cfg.Resume != "" {
		r.st.runID = cfg.Resume
		if err := r.st.resumeRun(ctx, &cfg); err != nil {
			return nil, err
		}
	} else {
		r.st.runID = newRunID()
		if err := r.st.createRun(ctx, &cfg); err != nil {
			return nil, err
		}
	}
	r.log = log.With("run_id", r.st.runID)
	if cfg.Started != nil {
		cfg.Started(r.st.runID)
	}
	r.busy = newBusyGate(r)
	r.log.Info("diff started", "resume", cfg.Resume != "", "upstream", src.Upstream.Describe(), "downstream", src.Downstream.Describe())

	err := r.run(ctx)
	state := RunDone
	switch {
	case err == nil:
	case ctx.Err() != nil:
		state = RunCancelled
	default:
		state = RunFailed
	}
	if ferr := r.st.finishRun(ctx, state, err); ferr != nil && err == nil {
		err = ferr
	}
	if err != nil {
		r.log.Error("diff stopped", "state", state, "err", err)
		return nil, &RunError{RunID: r.st.runID, State: state, Err: err}
	}
	rep, err := r.report(context.WithoutCancel(ctx))
	if err != nil {
		return nil, err
	}
	r.log.Info("diff finished", "equal", rep.Equal, "elapsed", time.Since(r.start).Round(time.Millisecond))
	return rep, nil
}

// RunError is returned when a run stops before finishing; resume it with
// Config.Resume = RunID.
type RunError struct {
	RunID string
	State string // RunFailed or RunCancelled
	Err   error
}

func (e *RunError) Error() string { return fmt.Sprintf("run %s %s: %v", e.RunID, e.State, e.Err) }
func (e *RunError) Unwrap() error { return e.Err }

func (r *runner) run(ctx context.Context) error {
	if err := r.setupTables(ctx); err != nil {
		return err
	}
	// The journal's writer outlives the workers: it stores what they queued, even after
	// a cancellation, and stops the workers if it fails.
	r.journal = newJournal(r)
	wctx, stopWorkers := context.WithCancel(ctx)
	defer stopWorkers()
	var jg errgroup.Group
	jg.Go(func() error {
		err := r.journal.run(context.WithoutCancel(ctx))
		if err != nil {
			stopWorkers()
		}
		return err
	})
	err := r.compare(wctx)
	readEnd := time.Now()
	r.journal.close()
	jerr := jg.Wait()
	if jerr != nil && (err == nil || (ctx.Err() == nil && errors.Is(err, context.Canceled))) {
		err = jerr
	}
	// The re-check starts once the journal has stored every chunk's result: it updates
	// the chunks' difference counts itself.
	if err == nil && r.recheckEnabled() {
		err = r.recheck(ctx, readEnd)
	}
	return err
}

// compare runs the producer of chunks and the workers that compare them.
func (r *runner) compare(ctx context.Context) error {
	chunks := make(chan Chunk, r.cfg.Concurrency*2)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		defer close(chunks)
		for _, ts := range r.tables {
			if ts.fatal {
				continue
			}
			if err := r.produce(gctx, ts, chunks); err != nil {
				return err
			}
		}
		return nil
	})
	for range r.cfg.Concurrency {
		g.Go(func() error {
			for ch := range chunks {
				if err := r.processWithRetry(gctx, ch); err != nil {
					return err
				}
			}
			return nil
		})
	}
	return g.Wait()
}

// setupTables resolves the table list (new run) or reloads it (resume), loads and
// compares structures and plans every table.
func (r *runner) setupTables(ctx context.Context) error {
	var stored []storedTable
	if r.cfg.Resume != "" {
		var err error
		if stored, err = r.st.tables(ctx); err != nil {
			return err
		}
	} else {
		names, err := r.listTables(ctx)
		if err != nil {
			return err
		}
		for i, n := range names {
			ds, dt := r.cfg.route(n[0], n[1])
			t := storedTable{idx: i, upSchema: n[0], upTable: n[1], downSchema: ds, downName: dt, checkpoint: -1}
			if err := r.st.addTable(ctx, t); err != nil {
				return err
			}
			stored = append(stored, t)
		}
	}
	if err := r.choosePushdown(ctx); err != nil {
		return err
	}
	if err := r.readCollations(ctx); err != nil {
		return err
	}
	if err := r.readPacket(ctx); err != nil {
		return err
	}
	for _, t := range stored {
		ts := &tableState{idx: t.idx, name: t.upSchema + "." + t.upTable, stored: t, done: map[int]bool{},
			checkpoint: t.checkpoint, splitDone: t.splitDone, sizer: newChunkSizer(r.cfg)}
		if r.src.Upstream.Flavor() == FlavorTiDB || r.src.Downstream.Flavor() == FlavorTiDB {
			ts.sizer.drillCost = tidbDrillCostRows
		}
		if err := r.planTable(ctx, ts); err != nil {
			return err
		}
		ts.sizer.groupable = ts.plan != nil && ts.plan.intKey()
		r.tables = append(r.tables, ts)
	}
	return nil
}

// ChecksumPushdown reports whether a source of flavour f computes its checksums in the form
// TiDB pushes down to its coprocessor, under mode (Config.TiDBChecksum; "auto" or "" reads
// TiDB's store through q: pushdown unless it is the embedded unistore). When the store
// cannot be read (hidden under TiDB's security-enhanced mode, as on TiDB Cloud, which runs
// on TiKV) it assumes TiKV: pushdown is true and storeErr says why, for the caller to log.
func ChecksumPushdown(ctx context.Context, q Querier, f Flavor, mode TiDBChecksum) (pushdown bool, storeErr error) {
	if f != FlavorTiDB {
		return false, nil
	}
	switch mode {
	case TiDBChecksumPushdown:
		return true, nil
	case TiDBChecksumTiDB:
		return false, nil
	}
	var store sql.NullString
	if err := queryRow(ctx, q, "SELECT JSON_UNQUOTE(JSON_EXTRACT(@@tidb_config, '$.store'))", &store); err != nil {
		return true, fmt.Errorf("read the TiDB store type: %w", err)
	}
	return store.String != "unistore", nil
}

// tidbSides returns the sides whose server is TiDB.
func (r *runner) tidbSides() []Side {
	var out []Side
	if r.src.Upstream.Flavor() == FlavorTiDB {
		out = append(out, Upstream)
	}
	if r.src.Downstream.Flavor() == FlavorTiDB {
		out = append(out, Downstream)
	}
	return out
}

// choosePushdown decides, for each TiDB side, where its checksums are computed
// (Config.TiDBChecksum): "auto" pushes them down to the coprocessor when TiDB's store is
// TiKV (or when the store cannot be read), and keeps them in TiDB on the embedded
// unistore.
func (r *runner) choosePushdown(ctx context.Context) error {
	for _, side := range r.tidbSides() {
		var storeErr error
		err := r.withSide(ctx, side, func(ctx context.Context, q Querier) error {
			r.pushdown[side], storeErr = ChecksumPushdown(ctx, q, FlavorTiDB, r.cfg.TiDBChecksum)
			return nil
		})
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil: // no connection: as when the store cannot be read
			r.pushdown[side], storeErr = true, err
		}
		if storeErr != nil {
			r.log.Warn("cannot read the TiDB store type; assuming TiKV", "side", side.String(), "err", storeErr)
		}
		r.log.Info("tidb checksum form", "side", side.String(), "pushdown", r.pushdown[side], "tidb_checksum", string(r.cfg.TiDBChecksum))
	}
	return nil
}

// readCollations finds the TiDB sides that run without new collations
// (new_collations_enabled_on_first_bootstrap = false, the default of clusters bootstrapped
// before v6.0): they compare every string as its binary bytes, without padding, whatever
// collation a column declares. Asking the server to compare 'a' and 'A' under
// utf8mb4_general_ci needs no privilege (mysql.tidb's new_collation_enabled row does).
func (r *runner) readCollations(ctx context.Context) error {
	for _, side := range r.tidbSides() {
		var same int
		err := r.withSide(ctx, side, func(ctx context.Context, q Querier) error {
			return queryRow(ctx, q, "SELECT _utf8mb4'a' = _utf8mb4'A' COLLATE utf8mb4_general_ci", &same)
		})
		if err != nil {
			return fmt.Errorf("%s: read the collation framework: %w", side, err)
		}
		r.binaryStrings[side] = same == 0
		if same == 0 {
			r.log.Warn("TiDB runs without new collations: it compares strings as binary bytes whatever their collation",
				"side", side.String())
		}
	}
	return nil
}

// readPacket reads both servers' max_allowed_packet (the session value, fixed when the
// session started) into r.packet.
func (r *runner) readPacket(ctx context.Context) error {
	r.packet = 0
	for _, side := range []Side{Upstream, Downstream} {
		var n int64
		err := r.withSide(ctx, side, func(ctx context.Context, q Querier) error {
			return queryRow(ctx, q, "SELECT @@max_allowed_packet", &n)
		})
		if err != nil {
			return fmt.Errorf("%s: read max_allowed_packet: %w", side, err)
		}
		if r.packet == 0 || n < r.packet {
			r.packet = n
		}
	}
	return nil
}

var systemSchemas = map[string]bool{"mysql": true, "information_schema": true, "performance_schema": true,
	"sys": true, "metrics_schema": true}

func (r *runner) listTables(ctx context.Context) ([][2]string, error) {
	var out [][2]string
	err := r.withSide(ctx, Upstream, func(ctx context.Context, q Querier) error {
		rows, err := q.QueryContext(ctx, "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_TYPE = 'BASE TABLE' ORDER BY TABLE_SCHEMA, TABLE_NAME")
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var s, t string
			if err := rows.Scan(&s, &t); err != nil {
				return err
			}
			if systemSchemas[strings.ToLower(s)] || strings.EqualFold(s, r.cfg.MetaSchema) {
				continue
			}
			if r.cfg.selected(s, t) {
				out = append(out, [2]string{s, t})
			}
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("list upstream tables: %w", err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no upstream table matches %s", strings.Join(r.cfg.Tables, ", "))
	}
	return out, nil
}

// planTable loads both structures, compares them and builds the plan. Structure
// differences are recorded, not returned as errors.
func (r *runner) planTable(ctx context.Context, ts *tableState) error {
	t := ts.stored
	var up, down *Table
	err := r.withSide(ctx, Upstream, func(ctx context.Context, q Querier) error {
		var err error
		up, err = LoadTable(ctx, q, t.upSchema, t.upTable)
		if err == nil && up != nil {
			var n sql.NullInt64
			rows, qerr := q.QueryContext(ctx, "SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?", t.upSchema, t.upTable)
			if qerr == nil {
				if rows.Next() {
					_ = rows.Scan(&n)
				}
				rows.Close()
			}
			ts.estRows = n.Int64
			// Cut at least MinChunks chunks (TiDBMinChunks from TiDB), and 4 per worker,
			// from a table (when its size is known): the workers share the table's tail
			// instead of waiting for one big chunk, and a difference costs a drill-down of
			// one small chunk.
			if n.Int64 > 0 {
				chunks := r.cfg.MinChunks
				if r.src.Upstream.Flavor() == FlavorTiDB {
					chunks = r.cfg.TiDBMinChunks
				}
				ts.sizer.max = max(r.cfg.MinChunkRows, min(r.cfg.MaxChunkRows, int(n.Int64/int64(max(chunks, 4*r.cfg.Concurrency)))))
				ts.sizer.cur = min(ts.sizer.cur, ts.sizer.max)
			}
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("table %s: upstream structure: %w", ts.name, err)
	}
	err = r.withSide(ctx, Downstream, func(ctx context.Context, q Querier) error {
		var err error
		down, err = LoadTable(ctx, q, t.downSchema, t.downName)
		return err
	})
	if err != nil {
		return fmt.Errorf("table %s: downstream structure: %w", ts.name, err)
	}
	switch {
	case up == nil:
		ts.problems = append(ts.problems, StructureProblem{Problem: "table missing upstream", Fatal: true})
		ts.fatal = true
		return nil
	case down == nil:
		ts.problems = append(ts.problems, StructureProblem{Problem: fmt.Sprintf("table %s.%s missing downstream", t.downSchema, t.downName), Fatal: true})
		ts.fatal = true
		return nil
	}
	ignored := r.cfg.ignoredFunc(t.upSchema, t.upTable)
	ts.problems = compareStructure(up, down, ignored)
	plan, err := NewPlan(up, down, ignored)
	if err != nil {
		ts.problems = append(ts.problems, StructureProblem{Problem: err.Error(), Fatal: true})
		ts.fatal = true
		return nil
	}
	plan.Flavor = [2]Flavor{r.src.Upstream.Flavor(), r.src.Downstream.Flavor()}
	for s, binary := range r.binaryStrings {
		if binary {
			plan.compareBytes(Side(s))
		}
	}
	plan.Referenced = down.Referenced
	plan.Pushdown = r.pushdown
	for _, k := range plan.Key {
		c := plan.Columns[k]
		if c.Kind == KindString && c.Collation[0] != c.Collation[1] {
			r.log.Warn("key column collations differ: the downstream compares chunk ranges with the upstream collation and may not use its index",
				"table", ts.name, "column", c.Name, "upstream", c.Collation[0], "downstream", c.Collation[1])
		}
	}
	plan.Hash = r.cfg.Hash
	plan.Where = r.cfg.where(t.upSchema, t.upTable)
	if cols := plan.FitEncoding(r.packet); len(cols) > 0 {
		r.log.Info("long columns enter the row hash as their SHA1", "table", ts.name, "columns", cols, "max_allowed_packet", r.packet)
	}
	ts.plan = plan
	return nil
}

// NewPlan builds the comparison plan of a table pair: the compared columns are the
// upstream's columns that exist on both sides, are not ignored and are not generated
// downstream (the downstream computes those, fix SQL cannot write them). A column
// generated upstream but plain downstream is compared: the downstream stores its values
// like any other column's. It fails only when nothing can be compared.
func NewPlan(up, down *Table, ignored func(string) bool) (*TablePlan, error) {
	if ignored == nil {
		ignored = func(string) bool { return false }
	}
	p := &TablePlan{Schema: [2]string{up.Schema, down.Schema}, Table: [2]string{up.Name, down.Name}, Hash: HashSHA1}
	for _, uc := range up.Columns {
		dc, ok := down.Column(uc.Name)
		if !ok || dc.Generated {
			continue
		}
		if ignored(uc.Name) {
			// Not compared, but carried into the rows fix SQL inserts. Long ones too (a
			// LONGBLOB, a JSON document): a NOT NULL column without a default refuses an
			// insert without it, and only the rows of mismatched ranges are read.
			p.Carried = append(p.Carried, PlanColumn{Name: uc.Name, Kind: uc.Kind, Charset: [2]string{uc.Charset, dc.Charset},
				Collation: [2]string{uc.Collation, dc.Collation}, MaxBytes: max(uc.MaxBytes, dc.MaxBytes)})
			continue
		}
		p.Columns = append(p.Columns, PlanColumn{Name: uc.Name, Kind: uc.Kind, NotNull: !uc.Nullable && !dc.Nullable,
			Enum:    uc.DataType == "enum" || uc.DataType == "set",
			Charset: [2]string{uc.Charset, dc.Charset}, Collation: [2]string{uc.Collation, dc.Collation},
			MaxBytes: max(uc.MaxBytes, dc.MaxBytes)})
	}
	for _, dc := range down.Columns {
		if _, ok := up.Column(dc.Name); !ok || ignored(dc.Name) || dc.Generated {
			if !dc.Generated {
				p.PartialColumns = true
			}
		}
	}
	if len(p.Columns) == 0 {
		return nil, errors.New("no column in common: data not compared")
	}
	index := func(name string) int {
		for i, c := range p.Columns {
			if strings.EqualFold(c.Name, name) {
				return i
			}
		}
		return -1
	}
	key, keyless := chooseKey(up, down, ignored)
	if !keyless {
		for _, k := range key {
			p.Key = append(p.Key, index(k))
		}
		return p, nil
	}
	p.Keyless = true
	// Chunks of a keyless table are cut on the columns of an index (so cutting walks the
	// index instead of sorting the table) whose columns are NOT NULL, of orderable types
	// and collated alike on both sides. Equal rows always fall into the same chunk, so
	// duplicates are counted correctly. Without such an index the table is one chunk.
	for _, ix := range up.Indexes {
		var cols []int
		for _, name := range ix {
			i := index(name)
			if i < 0 {
				break
			}
			c := p.Columns[i]
			uc, _ := up.Column(c.Name)
			dc, _ := down.Column(c.Name)
			if uc.Nullable || dc.Nullable || uc.Kind != dc.Kind {
				break
			}
			ok := false
			switch c.Kind {
			case KindInt, KindDecimal, KindTemporal:
				ok = true
			case KindString:
				ok = !strings.Contains(uc.DataType, "text") && c.Collation[0] == c.Collation[1]
			}
			if !ok {
				break
			}
			cols = append(cols, i)
		}
		if len(cols) > 0 {
			p.Key = cols
			break
		}
	}
	return p, nil
}

// withSide runs fn on a connection of one side under the per-query timeout.
func (r *runner) withSide(ctx context.Context, s Side, fn func(context.Context, Querier) error) error {
	src := r.src.Upstream
	if s == Downstream {
		src = r.src.Downstream
	}
	q, release, err := src.Acquire(ctx)
	if err != nil {
		return err
	}
	defer release()
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	if k, ok := src.(queryKiller); ok {
		// A query abandoned at its timeout or by cancellation is killed on the server,
		// which would otherwise run it to its end.
		stop := k.KillOnDone(ctx, q)
		defer stop()
	}
	err = fn(ctx, q)
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil && parent.Err() == nil {
		return fmt.Errorf("%w (%s query_timeout %s)", err, s, r.cfg.QueryTimeout)
	}
	return err
}

// withBoth holds one connection of each side (always acquired upstream first, so workers
// cannot deadlock on the per-side pools).
func (r *runner) withBoth(ctx context.Context, fn func(ctx context.Context, up, down Querier) error) error {
	return r.withSide(ctx, Upstream, func(ctx context.Context, uq Querier) error {
		return r.withSide(ctx, Downstream, func(ctx context.Context, dq Querier) error {
			return fn(ctx, uq, dq)
		})
	})
}

func (r *runner) checksumSide(ctx context.Context, ts *tableState, s Side, rng Range) (checksum, error) {
	var c checksum
	err := r.withSide(ctx, s, func(ctx context.Context, q Querier) error {
		start := time.Now()
		err := queryRow(ctx, q, ts.plan.ChecksumSQL(s, rng), &c.count, &c.sum)
		c.dur = time.Since(start)
		return err
	})
	if err != nil {
		return c, fmt.Errorf("%s checksum of %s: %w", s, ts.name, err)
	}
	return c, nil
}

// checksumBoth runs the chunk checksum on both sides at once.
func (r *runner) checksumBoth(ctx context.Context, ts *tableState, rng Range) (up, down checksum, err error) {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		var err error
		up, err = r.checksumSide(gctx, ts, Upstream, rng)
		return err
	})
	g.Go(func() error {
		var err error
		down, err = r.checksumSide(gctx, ts, Downstream, rng)
		return err
	})
	err = g.Wait()
	return up, down, err
}

func sameChecksum(a, b checksum) bool { return a.count == b.count && a.sum == b.sum }

// produce sends the table's chunks: on resume first those not yet done, then newly cut
// ones until the table is split.
func (r *runner) produce(ctx context.Context, ts *tableState, out chan<- Chunk) error {
	send := func(c Chunk) error {
		select {
		case out <- c:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	var lo Bound
	if r.cfg.Resume != "" {
		stored, err := r.st.chunks(ctx, ts.idx)
		if err != nil {
			return err
		}
		for _, c := range stored {
			ts.mu.Lock()
			ts.chunks++
			if c.state == chunkDone {
				ts.countDone(c.Seq, c.res)
				ts.drilled = ts.differences
			}
			if c.Last {
				ts.splitDone = true
			}
			ts.mu.Unlock()
			lo = c.Range.Hi
		}
		ts.mu.Lock()
		ts.advanceCheckpoint()
		ts.mu.Unlock()
		for _, c := range stored {
			if c.state != chunkDone {
				c.retry = true
				if err := send(c.Chunk); err != nil {
					return err
				}
			}
		}
		if ts.splitDone {
			return nil
		}
	}
	if ts.plan.Flavor[Upstream] == FlavorTiDB && len(ts.plan.Key) > 0 && !ts.plan.Keyless && ts.plan.numericKey() {
		if err := r.loadRegions(ctx, ts); err != nil {
			return err
		}
	}
	// Cut a single integer key by value (valueCutter), unless a row filter applies: its
	// MIN/MAX could scan the table, and the filtered keys' density is unknown.
	if p := ts.plan; p.intKey() && p.Where == "" {
		mn, mx, err := r.intKeyBounds(ctx, ts, Range{})
		switch {
		case errors.Is(err, errKeyBounds):
			// Only the chunk sizes depend on them: cut by rows instead.
			r.log.Warn("key bounds unusable: chunks cut by walking the key", "table", ts.name, "err", err)
			mn = nil
		case err != nil:
			return fmt.Errorf("table %s: %w", ts.name, err)
		}
		if mn != nil {
			ts.cutter = newValueCutter(mn, mx, ts.estRows)
		}
	}
	seq := ts.chunks
	for {
		his, widths, err := r.nextBoundaries(ctx, ts, lo)
		if err != nil {
			return err
		}
		batch := make([]Chunk, len(his))
		for i, hi := range his {
			batch[i] = Chunk{Table: ts.idx, Seq: seq, Range: Range{Lo: lo, Hi: hi}, Last: hi == nil}
			if widths != nil {
				batch[i].width = widths[i]
			}
			lo, seq = hi, seq+1
		}
		if err := r.st.addChunks(ctx, batch); err != nil {
			return err
		}
		for _, c := range batch {
			ts.mu.Lock()
			ts.chunks++
			if c.Last {
				ts.splitDone = true
			}
			ts.mu.Unlock()
			if err := send(c); err != nil {
				return err
			}
			if c.Last {
				return nil
			}
		}
	}
}

// loadRegions reads the table's TiDB region start keys; chunks never straddle them, so
// each chunk query stays within one region (a failure only loses that optimisation).
func (r *runner) loadRegions(ctx context.Context, ts *tableState) error {
	p := ts.plan
	err := r.withSide(ctx, Upstream, func(ctx context.Context, q Querier) error {
		rows, err := q.QueryContext(ctx, p.RegionSampleSQL())
		if err != nil {
			return err
		}
		defer rows.Close()
		s := newRowStream(rows, len(p.Key))
		for {
			if err := s.next(); err != nil {
				return err
			}
			if s.done {
				return nil
			}
			b := Bound(s.row())
			if n := len(ts.regionKeys); n == 0 || p.compareKeys(ts.regionKeys[n-1], b) != 0 {
				ts.regionKeys = append(ts.regionKeys, b)
			}
		}
	})
	if err != nil {
		r.log.Warn("region boundaries unavailable; walking the index", "table", ts.name, "err", err)
		ts.regionKeys = nil
	}
	return nil
}

// cutKeys bounds the keys one boundary query reads on TiDB: chunks smaller than this are
// cut several at a time (every size-th key of one index walk), so cutting a table of small
// chunks costs one round trip per cutKeys keys instead of one per chunk (TiDB skips an
// OFFSET in its SQL layer: 2.4 ms per 4,000-row chunk against 1.6 ms in a batch). MySQL
// and MariaDB skip an OFFSET inside the index for less than it costs to send and parse
// every key: per 1M keys cut into 256 chunks, 0.18 s of server CPU against 0.24 s of
// server plus 0.18 s of parity CPU for batches of 32,768 keys (MariaDB 10.11), so they
// are cut one chunk per query.
const cutKeys = 32768

// nextBoundaries returns the upper bounds of the next chunks after lo, in key order: keys
// `size` rows apart in key order, cut at the next region start, and nil last when the rest
// of the table fits (the last chunk is open-ended, so rows beyond the last upstream key,
// extra downstream, are still compared). It returns at least one bound, and for chunks
// cut by key value their key widths.
func (r *runner) nextBoundaries(ctx context.Context, ts *tableState, lo Bound) ([]Bound, []float64, error) {
	p := ts.plan
	if len(p.Key) == 0 {
		return []Bound{nil}, nil, nil // nothing to cut on: one chunk
	}
	// Cut at the next region start key (the chunk ends with that key's row, so it reads
	// at most one row of the next region). Region keys are only used for numeric and
	// temporal keys, where Go and the server order keys the same way.
	var limit Bound
	for _, k := range ts.regionKeys {
		if lo == nil || p.compareKeys(k, lo) > 0 {
			limit = k
			break
		}
	}
	ts.mu.Lock()
	size := ts.sizer.size()
	byValue := ts.cutter != nil && !ts.cutter.off
	ts.mu.Unlock()
	if byValue {
		his, widths, ok := cutByValue(ts, lo, limit, size)
		if ok {
			return his, widths, nil
		}
	}
	var his []Bound
	side := cutSide(p)
	rng := Range{Lo: lo, Hi: limit}
	batch := 1
	if p.Flavor[side] == FlavorTiDB {
		batch = max(1, cutKeys/size)
	}
	full := false
	err := r.withSide(ctx, side, func(ctx context.Context, q Querier) error {
		query := p.BoundarySQL(side, rng, size-1)
		if batch > 1 {
			query = p.KeysSQL(side, rng, batch*size)
		}
		rows, err := q.QueryContext(ctx, query)
		if err != nil {
			return err
		}
		defer rows.Close()
		s := newRowStream(rows, len(p.Key))
		for n := 1; ; n++ {
			if err := s.next(); err != nil {
				return err
			}
			if s.done {
				return nil
			}
			if batch == 1 {
				his, full = append(his, Bound(s.row())), true
			} else if n%size == 0 {
				his = append(his, Bound(s.row()))
				full = n == batch*size
			}
		}
	})
	if err != nil {
		return nil, nil, fmt.Errorf("cut chunk of %s: %w", ts.name, err)
	}
	if !full {
		// Fewer than size rows are left before the limit (or the end): the next chunk
		// ends there.
		if limit == nil || len(his) == 0 || p.compareKeys(his[len(his)-1], limit) != 0 {
			his = append(his, limit)
		}
	}
	return his, nil, nil
}

// valueBatch is how many chunks are cut by value at once (one meta statement stores
// them): few, so that the chunks' observed density soon steers the cutting.
const valueBatch = 8

// cutByValue cuts the next valueBatch chunks of a table with a valueCutter (see there); ok
// is false when a bound is not an integer (the caller walks the index).
func cutByValue(ts *tableState, lo, limit Bound, size int) (his []Bound, widths []float64, ok bool) {
	var l, lim *big.Int // nil: open end
	if lo != nil {
		if l, ok = boundInt(lo); !ok {
			return nil, nil, false
		}
	}
	if limit != nil {
		if lim, ok = boundInt(limit); !ok {
			return nil, nil, false
		}
	}
	ts.mu.Lock()
	ints, widths := ts.cutter.cut(l, lim, size, valueBatch)
	ts.mu.Unlock()
	his = make([]Bound, len(ints))
	for i, v := range ints {
		if v != nil {
			his[i] = Bound{StringValue(v.String())}
		}
	}
	return his, widths, true
}

// cutSide is the side whose key index is walked to cut chunks. Any side's keys make valid
// boundaries (the first chunk starts at the beginning of the key space, the last is
// open-ended). A TiDB upstream is cut on a MySQL/MariaDB downstream: an index walk there
// costs a fraction of TiDB's (20 ms against 50-90 ms for 62,500 keys here) and keeps the
// load off the production side; unless a key column's collations differ, when the
// downstream could not walk its index in the upstream's order.
func cutSide(p *TablePlan) Side {
	if p.Flavor[Upstream] != FlavorTiDB || p.Flavor[Downstream] == FlavorTiDB {
		return Upstream
	}
	for _, k := range p.Key {
		if c := p.Columns[k]; c.Enum || (c.Kind == KindString && c.Collation[0] != c.Collation[1]) {
			return Upstream
		}
	}
	return Downstream
}

// chunkRetries is how often a failed chunk (a timeout, a lost connection, a lock wait)
// is compared again before the run fails.
const chunkRetries = 2

func (r *runner) processWithRetry(ctx context.Context, ch Chunk) error {
	for attempt := 0; ; attempt++ {
		err := r.process(ctx, ch)
		if err == nil || ctx.Err() != nil || attempt == chunkRetries {
			return err
		}
		r.log.Warn("chunk failed; retrying", "table", r.tables[ch.Table].name, "chunk", ch.Seq, "attempt", attempt+1, "err", err)
		ch.retry = true
		if err := sleep(ctx, time.Duration(attempt+1)*time.Second); err != nil {
			return err
		}
	}
}

// process compares one chunk and records the result.
func (r *runner) process(ctx context.Context, ch Chunk) error {
	ts := r.tables[ch.Table]
	log := r.log.With("table", ts.name, "chunk", ch.Seq)
	if err := r.busy.wait(ctx); err != nil {
		return err
	}
	if ch.retry {
		// Earlier attempts may have stored differences: drop them before adding any.
		if err := r.st.startChunk(ctx, ch); err != nil {
			return err
		}
	} else if err := r.journal.started(ctx, ch); err != nil {
		return err
	}
	ts.mu.Lock()
	size, grouped := ts.sizer.plan()
	ts.mu.Unlock()
	var lo, hi, width *big.Int
	if grouped {
		// Both ends must be known keys (the first and last chunks are open-ended).
		if lo, hi, grouped = rangeInts(ch.Range); grouped {
			width = bucketWidth(lo, hi, max(1, int64(size)/bucketRows))
		}
	}
	var up, down checksum
	var ub, db bucketSums
	var err error
	if grouped {
		if ub, db, err = r.readBuckets(ctx, ts, ch.Range, lo, hi, width); err == nil {
			if up, err = ub.total(); err == nil {
				down, err = db.total()
			}
		}
	} else {
		up, down, err = r.checksumBoth(ctx, ts, ch.Range)
	}
	if err != nil {
		return fmt.Errorf("chunk %d: %w", ch.Seq, err)
	}
	ts.mu.Lock()
	ts.sizer.observe(int(max(up.count, down.count)), max(up.dur, down.dur).Seconds())
	if ts.cutter != nil && ch.width > 0 {
		ts.cutter.observe(ch.width, max(up.count, down.count))
	}
	ts.mu.Unlock()
	res := chunkResult{up: up, down: down}
	differs := !sameChecksum(up, down)
	var differing []int64
	if grouped {
		// The buckets decide: the totals differ only where a bucket does, and buckets can
		// differ where the totals happen to agree.
		differing = differingBuckets(ub, db)
		differs = len(differing) > 0
	}
	if differs {
		log.Debug("chunk differs", "up_count", up.count, "down_count", down.count, "grouped", grouped)
		drill := func(emit func(Difference) error) error { return r.drill(ctx, ts, ch.Range, up, down, emit, 0) }
		if grouped {
			drill = func(emit func(Difference) error) error {
				return r.followBuckets(ctx, ts, ch.Range, lo, hi, width, ub, db, differing, emit, 1)
			}
		}
		if res.differences, err = r.drillChunk(ctx, ts, ch, drill); err != nil {
			return err
		}
	}
	ts.mu.Lock()
	ts.sizer.observeDiffs(max(up.count, down.count), max(res.differences, 0))
	ts.mu.Unlock()
	// The chunk counts as done only once the journal has stored its result (after its
	// differences, stored above).
	if err := r.journal.finished(ctx, ch, res); err != nil {
		return err
	}
	return r.limiter.take(ctx, int(max(up.count, down.count)))
}

// errMaxDifferences ends a drill-down when its table reached Config.MaxDifferences.
var errMaxDifferences = errors.New("max_differences reached")

// drillChunk drills a mismatched chunk down to its differing rows, stores them and returns
// how many rows differ. With Config.MaxDifferences, a chunk whose drill-down starts, or
// goes on, after the table's kept differences reached the limit stops, drops what it
// stored and returns undrilledChunk: a chunk's differences are kept whole or not at all,
// and the table keeps the limit plus at most the differences of the chunks whose
// drill-downs were under way when it was reached (one per worker).
func (r *runner) drillChunk(ctx context.Context, ts *tableState, ch Chunk, drill func(emit func(Difference) error) error) (int64, error) {
	limit := r.cfg.MaxDifferences
	full := func() bool {
		if limit <= 0 {
			return false
		}
		ts.mu.Lock()
		defer ts.mu.Unlock()
		return ts.drilled >= limit
	}
	if full() {
		return undrilledChunk, nil
	}
	sink := &diffSink{ctx: ctx, r: r, chunk: ch}
	emit := func(d Difference) error {
		if full() {
			return errMaxDifferences
		}
		return sink.emit(d)
	}
	err := drill(emit)
	if err == nil {
		err = sink.flush(ctx)
	}
	switch {
	case errors.Is(err, errMaxDifferences):
		// Drop what the chunk stored before the limit was reached.
		if err := r.st.dropDifferences(ctx, ch); err != nil {
			return 0, err
		}
		return undrilledChunk, nil
	case err != nil:
		return 0, fmt.Errorf("chunk %d of %s: %w", ch.Seq, ts.name, err)
	}
	ts.mu.Lock()
	before := ts.drilled
	ts.drilled += int64(sink.rows)
	reached := limit > 0 && before < limit && ts.drilled >= limit
	ts.mu.Unlock()
	if reached {
		r.log.Warn("max_differences reached: the table's further mismatched chunks are not drilled down",
			"table", ts.name, "chunk", ch.Seq, "max_differences", limit)
	}
	return int64(sink.rows), nil
}

// countDone counts a chunk stored as done in the table's tallies; the caller holds ts.mu.
func (ts *tableState) countDone(seq int, res chunkResult) {
	ts.done[seq] = true
	ts.chunksDone++
	ts.upRows += res.up.count
	ts.downRows += res.down.count
	if res.differences == undrilledChunk {
		ts.undrilled++
		return
	}
	ts.differences += res.differences
}

func (ts *tableState) advanceCheckpoint() {
	for ts.done[ts.checkpoint+1] {
		ts.checkpoint++
	}
}

func (r *runner) reportProgress() { r.reportPhase(false, 0) }

// reportPhase reports progress, during the re-check when rechecking (lag: the changefeed
// lag it waits out).
func (r *runner) reportPhase(rechecking bool, lag time.Duration) {
	if r.cfg.Progress == nil {
		return
	}
	r.progressMu.Lock()
	defer r.progressMu.Unlock()
	p := Progress{RunID: r.st.runID, Tables: len(r.tables), Elapsed: time.Since(r.start), Rechecking: rechecking, ChangefeedLag: lag}
	for _, ts := range r.tables {
		ts.mu.Lock()
		p.ChunksDone += ts.chunksDone
		p.RowsChecked += ts.upRows
		p.Differences += ts.differences
		p.RowsEstimated += max(ts.estRows, ts.upRows)
		if ts.fatal || (ts.splitDone && ts.chunksDone == ts.chunks) {
			p.TablesDone++
		}
		ts.mu.Unlock()
	}
	r.cfg.Progress(p)
}

// report assembles the report from the run state and writes the output directory.
func (r *runner) report(ctx context.Context) (*Report, error) {
	rep := &Report{RunID: r.st.runID, State: RunDone, StartedAt: r.start.UTC(), FinishedAt: time.Now().UTC(),
		Upstream: r.src.Upstream.Describe(), Downstream: r.src.Downstream.Describe(), Equal: true,
		UpstreamSnapshot: r.cfg.Upstream.Snapshot, DownstreamSnapshot: r.cfg.Downstream.Snapshot,
		RecheckRounds: r.rechecks}
	resolved, err := r.st.resolvedByTable(ctx)
	if err != nil {
		return nil, err
	}
	for _, ts := range r.tables {
		tr := TableReport{Schema: ts.stored.upSchema, Table: ts.stored.upTable, DownstreamSchema: ts.stored.downSchema,
			DownstreamTable: ts.stored.downName, StructureEqual: structureEqual(ts.problems), StructureProblems: ts.problems,
			DataCompared: !ts.fatal, Differences: []Difference{}}
		if ts.plan != nil {
			tr.Keyless = ts.plan.Keyless
			if !ts.plan.Keyless {
				tr.Key = ts.plan.KeyNames()
			}
		}
		ts.mu.Lock()
		tr.RowsChecked, tr.DownstreamRows, tr.Chunks, tr.DifferencesTotal = ts.upRows, ts.downRows, ts.chunksDone, ts.differences
		tr.UndrilledChunks = ts.undrilled
		ts.mu.Unlock()
		tr.DifferencesResolved = resolved[ts.idx]
		if tr.DifferencesTotal > 0 {
			err := r.st.differences(ctx, ts.idx, r.cfg.MaxReportedDifferences, false, func(d Difference, _ string) error {
				tr.Differences = append(tr.Differences, d)
				return nil
			})
			if err != nil {
				return nil, err
			}
			tr.DifferencesTruncated = int64(len(tr.Differences)) < tr.DifferencesTotal
			if r.cfg.OutputDir != "" {
				name, err := r.writeFix(ctx, ts)
				if err != nil {
					return nil, err
				}
				tr.FixSQLFile = name
			}
		}
		if !tr.Equal() {
			rep.Equal = false
		}
		rep.Tables = append(rep.Tables, tr)
	}
	if r.cfg.OutputDir != "" {
		if err := writeReport(r.cfg.OutputDir, rep); err != nil {
			return nil, err
		}
	}
	return rep, nil
}

func fileSafe(s string) string {
	var b strings.Builder
	for _, c := range s {
		if c == '-' || c == '_' || c == '.' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') {
			b.WriteRune(c)
		} else {
			b.WriteString("%" + strconv.FormatInt(int64(c), 16))
		}
	}
	return b.String()
}

// writeFix writes fix/<schema>.<table>.sql from the stored differences (streamed).
func (r *runner) writeFix(ctx context.Context, ts *tableState) (string, error) {
	name := filepath.Join("fix", fileSafe(ts.stored.downSchema)+"."+fileSafe(ts.stored.downName)+".sql")
	full := filepath.Join(r.cfg.OutputDir, name)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		return "", fmt.Errorf("write fix sql: %w", err)
	}
	f, err := os.Create(full)
	if err != nil {
		return "", fmt.Errorf("write fix sql: %w", err)
	}
	defer f.Close()
	if _, err := f.WriteString(ts.plan.fixHeader(r.st.runID)); err != nil {
		return "", fmt.Errorf("write fix sql %s: %w", full, err)
	}
	err = r.st.differences(ctx, ts.idx, -1, true, func(_ Difference, fix string) error {
		_, err := f.WriteString(fix + "\n")
		return err
	})
	if err != nil {
		return "", fmt.Errorf("write fix sql %s: %w", full, err)
	}
	return name, f.Close()
}
