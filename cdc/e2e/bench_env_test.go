package e2e

// bench_env_test.go is the applier benchmarks' set-up: the synthetic sysbench rows, the
// feed that publishes them as a TiCDC changefeed straight to Kafka, and benchEnv (the
// raw-write baseline, parity serve's config, profiles, logs, counts, and a quiet, clean
// fallback before each arm). bench_cpu_test.go reads what each arm cost; bench_test.go
// holds the benchmarks.

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/tidb-parity/parity/cdc/loadgen"
	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/testenv"
)

func benchRows() int {
	if v := os.Getenv("PARITY_BENCH_ROWS"); v != "" {
		var n int
		if _, err := fmt.Sscan(v, &n); err == nil && n > 0 {
			return n
		}
	}
	return 1_000_000
}

// benchRow is one sysbench row.
type benchRow struct {
	id, k  int64
	c, pad string
}

// benchData returns rows per table: table i holds ids 1..n/benchTables.
func benchData(n int, seed uint64) [][]benchRow {
	r := rand.New(rand.NewPCG(seed, seed))
	per := n / benchTables
	out := make([][]benchRow, benchTables)
	for t := range out {
		out[t] = make([]benchRow, per)
		for i := range out[t] {
			out[t][i] = benchRow{id: int64(i + 1), k: r.Int64N(int64(n)) + 1, c: loadgen.SysbenchC(r), pad: loadgen.SysbenchPad(r)}
		}
	}
	return out
}

func benchTableName(i int) string { return fmt.Sprintf("sbtest%d", i+1) }

const benchDDL = "CREATE TABLE %s (`id` INT NOT NULL, `k` INT NOT NULL DEFAULT '0', `c` CHAR(120) NOT NULL DEFAULT '', " +
	"`pad` CHAR(60) NOT NULL DEFAULT '', PRIMARY KEY (`id`), KEY `k_1` (`k`)) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"

// benchColumns renders a row as TiCDC would for sysbench's table.
func benchColumns(r benchRow) []open.Column {
	return []open.Column{
		{Name: "id", Type: open.TypeLong, Flags: open.FlagBinary | open.FlagHandleKey | open.FlagPrimaryKey, Value: r.id},
		{Name: "k", Type: open.TypeLong, Flags: open.FlagBinary | open.FlagMultipleKey, Value: r.k},
		{Name: "c", Type: open.TypeString, Value: r.c},
		{Name: "pad", Type: open.TypeString, Value: r.pad},
	}
}

// feed publishes synthetic transactions to a topic like TiCDC: rows dispatched by table,
// batched per partition, resolved events broadcast to every partition.
type feed struct {
	w          *kafka.Writer
	partitions int
	disp       loadgen.Dispatcher
	enc        *open.Encoder
	records    atomic.Int64
	lastTs     uint64
}

func newFeed(tb testing.TB, broker, topic string, partitions int) *feed {
	d, _ := loadgen.NewDispatcher(loadgen.DispatchTable)
	enc, err := open.NewEncoder(open.DefaultEncoderConfig())
	if err != nil {
		tb.Fatal(err)
	}
	// A transport of its own: kafka-go's shared one keeps topic metadata for 6 s and
	// answers "Unknown Topic Or Partition" for a topic created meanwhile, longer than
	// writeRetry waits (BenchmarkApplierLedger failed so at c178d03).
	tr := &kafka.Transport{}
	w := &kafka.Writer{
		Addr:         kafka.TCP(broker),
		Topic:        topic,
		Balancer:     kafka.BalancerFunc(func(m kafka.Message, _ ...int) int { return m.Partition }),
		BatchSize:    1000,
		BatchBytes:   12 << 20,
		BatchTimeout: time.Millisecond,
		RequiredAcks: kafka.RequireAll,
		Transport:    tr,
	}
	tb.Cleanup(func() {
		w.Close()
		tr.CloseIdleConnections()
	})
	return &feed{w: w, partitions: partitions, disp: d, enc: enc}
}

// nextTs returns a commit ts: the TSO of now, strictly above the previous one.
func (f *feed) nextTs() uint64 {
	ts := uint64(time.Now().UnixMilli()) << 18
	if ts <= f.lastTs {
		ts = f.lastTs + 1
	}
	f.lastTs = ts
	return ts
}

type benchTxn struct {
	ts     uint64
	events []*open.Event
}

// publish encodes transactions (commit-ts order) and writes them.
func (f *feed) publish(ctx context.Context, txns []benchTxn) error {
	type group struct {
		part int
		enc  *open.Encoder
	}
	groups := map[string]*group{}
	var order []*group
	for _, t := range txns {
		for _, ev := range t.events {
			p, key := f.disp.Dispatch(ev, f.partitions)
			g := groups[key]
			if g == nil {
				enc, err := open.NewEncoder(open.DefaultEncoderConfig())
				if err != nil {
					return err
				}
				g = &group{part: p, enc: enc}
				groups[key] = g
				order = append(order, g)
			}
			if err := g.enc.AppendRow(ev); err != nil {
				return err
			}
		}
	}
	var msgs []kafka.Message
	for _, g := range order {
		for _, m := range g.enc.Build() {
			msgs = append(msgs, kafka.Message{Partition: g.part, Key: m.Key, Value: m.Value})
		}
	}
	f.records.Add(int64(len(msgs)))
	return writeRetry(ctx, f.w, msgs)
}

// writeRetry writes until Kafka acknowledges every message (duplicates on retry are
// harmless: delivery is at-least-once, as with TiCDC).
func writeRetry(ctx context.Context, w *kafka.Writer, msgs []kafka.Message) error {
	var err error
	for attempt := 0; attempt < 10; attempt++ {
		if err = w.WriteMessages(ctx, msgs...); err == nil {
			return nil
		}
		time.Sleep(time.Duration(100*(attempt+1)) * time.Millisecond)
	}
	return err
}

func (f *feed) resolved(ctx context.Context, ts uint64) error {
	m := f.enc.EncodeResolved(ts)
	msgs := make([]kafka.Message, f.partitions)
	for i := range msgs {
		msgs[i] = kafka.Message{Partition: i, Key: m.Key, Value: m.Value}
	}
	f.records.Add(int64(len(msgs)))
	return writeRetry(ctx, f.w, msgs)
}

// benchEnv is a benchmark's downstream database, topic and serve configuration.
type benchEnv struct {
	*env
	down     *sql.DB
	noLedger bool // applier.ledger = false
	// fallbackPID and brokerPID are the fallback's and the broker's processes, found on
	// first use (bench_cpu_test.go); brokerPID is "-" when the broker is not a process of
	// this machine.
	fallbackPID, brokerPID string
}

func newBenchEnv(b *testing.B) *benchEnv {
	b.Helper()
	downDB := testenv.Downstream(b)
	e := &env{
		t:          b,
		db:         downDB.Name,
		downDSN:    testenv.Require(b, testenv.EnvDownstream),
		broker:     testenv.Kafka(b),
		topic:      testenv.NewTopic(b, "bench", 3),
		partitions: 3,
		meta:       testenv.UniqueName("pmeta"),
	}
	dir := b.TempDir()
	e.configPath = filepath.Join(dir, "parity.toml")
	e.logPath = filepath.Join(dir, "serve.log")
	e.statusAddr = freeAddr(b)
	b.Cleanup(func() { _, _ = downDB.Exec("DROP DATABASE IF EXISTS " + ident.Quote(e.meta)) })
	return &benchEnv{env: e, down: downDB.DB}
}

func (be *benchEnv) writeConfig(tb testing.TB) {
	level := "warn"
	if os.Getenv("PARITY_BENCH_LOG") != "" {
		level = "debug"
	}
	cfg := be.configTOML(filepath.Join(filepath.Dir(be.configPath), "spill"), level, "",
		fmt.Sprintf("workers = %d\nledger = %t\n%s%s%s%s", benchWorkers, !be.noLedger, benchBatchRowsKey(), benchTxnRowsKey(), benchMemoryKey(), benchLoadDataKey()),
		fmt.Sprintf("pprof = %t\n", os.Getenv("PARITY_BENCH_PPROF") != ""))
	if os.Getenv("PARITY_BENCH_HA") != "" {
		// The applier fenced by a lease (docs/reliability.md): every write transaction
		// checks it; measures the fence's cost.
		cfg += "\n[ha]\nenabled = true\n"
	}
	if err := os.WriteFile(be.configPath, []byte(cfg), 0o644); err != nil {
		tb.Fatal(err)
	}
}

func (be *benchEnv) createTables(tb testing.TB, prefix string) {
	for i := 0; i < benchTables; i++ {
		if _, err := be.down.Exec(fmt.Sprintf(benchDDL, ident.Quote(prefix+benchTableName(i)))); err != nil {
			tb.Fatal(err)
		}
	}
}

// rawWrite writes rows with multi-row INSERTs (upsert: INSERT ... ON DUPLICATE KEY
// UPDATE when update is set), one connection per table, benchBatchRows per statement.
func (be *benchEnv) rawWrite(tb testing.TB, prefix string, data [][]benchRow, update bool) time.Duration {
	tb.Helper()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, len(data))
	for ti, rows := range data {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			conn, err := be.down.Conn(ctx)
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close()
			name := ident.Quote(prefix + benchTableName(ti))
			for lo := 0; lo < len(rows); lo += benchBatchRows {
				hi := min(lo+benchBatchRows, len(rows))
				var q strings.Builder
				q.WriteString("INSERT INTO " + name + " (`id`,`k`,`c`,`pad`) VALUES ")
				args := make([]any, 0, 4*(hi-lo))
				for i, r := range rows[lo:hi] {
					if i > 0 {
						q.WriteString(",")
					}
					q.WriteString("(?,?,?,?)")
					args = append(args, r.id, r.k, r.c, r.pad)
				}
				if update {
					q.WriteString(" ON DUPLICATE KEY UPDATE `k`=VALUES(`k`),`c`=VALUES(`c`),`pad`=VALUES(`pad`)")
				}
				if _, err := conn.ExecContext(ctx, q.String(), args...); err != nil {
					errs <- fmt.Errorf("raw write %s: %w", name, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		tb.Fatal(err)
	}
	return time.Since(start)
}

// publishChangefeed publishes data as transactions of benchTxnRows rows of one table,
// round-robin over the tables, with a resolved ts every resolvedEvery transactions and
// at the end. With old set, the events are updates from old to data.
func (be *benchEnv) publishChangefeed(tb testing.TB, f *feed, data, old [][]benchRow) (uint64, int) {
	tb.Helper()
	ctx := context.Background()
	const resolvedEvery = 300
	var batch []benchTxn
	rows, txns := 0, 0
	per := len(data[0])
	for lo := 0; lo < per; lo += benchTxnRows {
		hi := min(lo+benchTxnRows, per)
		for ti := range data {
			ts := f.nextTs()
			txn := benchTxn{ts: ts}
			for i := lo; i < hi; i++ {
				ev := &open.Event{Kind: open.KindRow, CommitTs: ts, Schema: be.db, Table: benchTableName(ti),
					Op: open.OpInsert, Columns: benchColumns(data[ti][i]), RowID: data[ti][i].id}
				if old != nil {
					ev.Op, ev.OldColumns = open.OpUpdate, benchColumns(old[ti][i])
				}
				txn.events = append(txn.events, ev)
				rows++
			}
			batch = append(batch, txn)
			txns++
			if txns%resolvedEvery == 0 {
				if err := f.publish(ctx, batch); err != nil {
					tb.Fatal(err)
				}
				batch = batch[:0]
				if err := f.resolved(ctx, ts); err != nil {
					tb.Fatal(err)
				}
			}
		}
	}
	if err := f.publish(ctx, batch); err != nil {
		tb.Fatal(err)
	}
	final := f.nextTs()
	if err := f.resolved(ctx, final); err != nil {
		tb.Fatal(err)
	}
	return final, rows
}

// profile, with PARITY_BENCH_PPROF set (a directory), fetches a CPU profile of serve
// (/debug/pprof/profile?seconds=10, or PARITY_BENCH_PPROF_SECONDS, starting 2 s into the
// apply) into $PARITY_BENCH_PPROF/serve-<kind>.pprof, then the allocations since serve
// started into serve-<kind>.allocs.pprof; the returned func waits for them.
func (be *benchEnv) profile(tb testing.TB, kind string) func() {
	dir := os.Getenv("PARITY_BENCH_PPROF")
	if dir == "" {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(2 * time.Second)
		secs := "10"
		if v := os.Getenv("PARITY_BENCH_PPROF_SECONDS"); v != "" {
			secs = v
		}
		err := be.savePprof("profile?seconds="+secs, filepath.Join(dir, "serve-"+kind+".pprof"))
		if err == nil {
			// The allocations since serve started, up to the end of the CPU profile.
			err = be.savePprof("allocs", filepath.Join(dir, "serve-"+kind+".allocs.pprof"))
		}
		if err != nil {
			fmt.Printf("pprof: %v\n", err)
		}
	}()
	return func() { <-done }
}

// savePprof writes serve's /debug/pprof/<what> to path.
func (be *benchEnv) savePprof(what, path string) error {
	resp, err := http.Get("http://" + be.statusAddr + "/debug/pprof/" + what)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return os.WriteFile(path, body, 0o644)
}

// saveLog, with PARITY_BENCH_LOG set (a directory), copies serve's log (debug level,
// one line per applied round) to $PARITY_BENCH_LOG/serve-<kind>.log.
func (be *benchEnv) saveLog(tb testing.TB, kind string) {
	dir := os.Getenv("PARITY_BENCH_LOG")
	if dir == "" {
		return
	}
	b, err := os.ReadFile(be.logPath)
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "serve-"+kind+".log"), b, 0o644)
	}
	if err != nil {
		tb.Log(err)
	}
}

// purgeBinlogs drops the fallback's binary logs written so far (best effort): a
// 1,000,000-row update pair writes about 2 GB of them, and the environment's 15-minute
// expiry let `make bench` fill a small disk (Kafka stopped on the full disk).
func (be *benchEnv) purgeBinlogs(tb testing.TB) {
	if _, err := be.down.Exec("PURGE BINARY LOGS BEFORE NOW()"); err != nil {
		tb.Logf("purge the fallback's binary logs: %v", err)
	}
}

func (be *benchEnv) truncate(tb testing.TB, prefix string) {
	for i := 0; i < benchTables; i++ {
		if _, err := be.down.Exec("TRUNCATE TABLE " + ident.Quote(prefix+benchTableName(i))); err != nil {
			tb.Fatal(err)
		}
	}
}

func (be *benchEnv) count(tb testing.TB, table string) int {
	var n int
	if err := be.down.QueryRow("SELECT COUNT(*) FROM " + ident.Quote(table)).Scan(&n); err != nil {
		tb.Fatal(err)
	}
	return n
}

// quiesce waits until the fallback is idle and clean: InnoDB has written every dirty
// page and checkpointed its redo log, and its CPU over two consecutive 200ms windows was
// at most 10ms each (5% of a core); at most 120s. An arm otherwise pays for the work the
// arm before it left in the server. Measured at c7ba560 (SHOW GLOBAL STATUS around each
// arm): the raw arm before the applier ran on a clean buffer pool and wrote no page, and
// left 15,000 dirty pages and 268 MB of checkpoint age; the applier's arm that followed
// wrote 9,568 pages (159 MB) of them while it applied. The raw arm before the applier
// is the faster raw arm in most pairs, so the ratio compared a clean arm with a
// burdened one. While it waits, innodb_max_dirty_pages_pct is 0 (flush everything now)
// and innodb_io_capacity is raised; both are put back before it returns. It returns how
// long it waited.
func (be *benchEnv) quiesce(tb testing.TB) time.Duration {
	tb.Helper()
	start := time.Now()
	var pct float64
	var capacity, capacityMax int64
	if err := be.down.QueryRow("SELECT @@GLOBAL.innodb_max_dirty_pages_pct, @@GLOBAL.innodb_io_capacity, @@GLOBAL.innodb_io_capacity_max").
		Scan(&pct, &capacity, &capacityMax); err != nil {
		tb.Fatalf("the fallback's flushing settings: %v", err)
	}
	// io_capacity_max first: io_capacity may not exceed it.
	if _, err := be.down.Exec("SET GLOBAL innodb_io_capacity_max = 100000, innodb_io_capacity = 50000, innodb_max_dirty_pages_pct = 0"); err != nil {
		tb.Fatalf("flushing the fallback's dirty pages: %v", err)
	}
	defer func() {
		q := fmt.Sprintf("SET GLOBAL innodb_io_capacity = %d, innodb_io_capacity_max = %d, innodb_max_dirty_pages_pct = %g", capacity, capacityMax, pct)
		if _, err := be.down.Exec(q); err != nil {
			tb.Errorf("restoring the fallback's flushing settings (%s): %v", q, err)
		}
	}()
	quiet := 0
	prev := be.fallbackCPU(tb)
	for quiet < 2 && time.Since(start) < 120*time.Second {
		time.Sleep(200 * time.Millisecond)
		now := be.fallbackCPU(tb)
		if now-prev <= 10*time.Millisecond && be.clean(tb) {
			quiet++
		} else {
			quiet = 0
		}
		prev = now
	}
	if quiet < 2 {
		tb.Logf("the fallback did not go idle and clean within 120s; measuring anyway")
	}
	return time.Since(start)
}

// clean reports whether the fallback's buffer pool holds no dirty page and its
// checkpoint age is under 1 MiB.
func (be *benchEnv) clean(tb testing.TB) bool {
	tb.Helper()
	rows, err := be.down.Query("SHOW GLOBAL STATUS WHERE Variable_name IN ('Innodb_buffer_pool_pages_dirty', 'Innodb_checkpoint_age')")
	if err != nil {
		tb.Fatalf("the fallback's dirty pages: %v", err)
	}
	defer rows.Close()
	dirty, age := int64(-1), int64(-1)
	for rows.Next() {
		var k string
		var v int64
		if err := rows.Scan(&k, &v); err != nil {
			tb.Fatalf("the fallback's dirty pages: %v", err)
		}
		switch k {
		case "Innodb_buffer_pool_pages_dirty":
			dirty = v
		case "Innodb_checkpoint_age":
			age = v
		}
	}
	if err := rows.Err(); err != nil {
		tb.Fatalf("the fallback's dirty pages: %v", err)
	}
	return dirty == 0 && age >= 0 && age < 1<<20
}

// benchTxnRowsKey sets applier.txn-rows from PARITY_BENCH_TXN_ROWS ("" keeps the
// default): txn-rows = 1 is the transaction shape before #32 (each statement its own
// transaction with its marker and fence), the baseline of the change.
func benchTxnRowsKey() string {
	if v := os.Getenv("PARITY_BENCH_TXN_ROWS"); v != "" {
		return "txn-rows = " + v + "\n"
	}
	return ""
}

// benchBatchRowsKey sets applier.batch-rows from PARITY_BENCH_BATCH_ROWS, or to
// benchBatchRows (the raw arm's rows per INSERT, which the variable does not change). A
// value serve cannot take fails its start with the key's name, as the keys below do.
func benchBatchRowsKey() string {
	if v := os.Getenv("PARITY_BENCH_BATCH_ROWS"); v != "" {
		return "batch-rows = " + v + "\n"
	}
	return fmt.Sprintf("batch-rows = %d\n", benchBatchRows)
}

// benchMemoryKey sets applier.memory-bytes from PARITY_BENCH_MEMORY_BYTES ("" keeps the
// default).
func benchMemoryKey() string {
	if v := os.Getenv("PARITY_BENCH_MEMORY_BYTES"); v != "" {
		return "memory-bytes = " + v + "\n"
	}
	return ""
}

// benchLoadDataKey sets applier.load-data from PARITY_BENCH_LOAD_DATA ("" keeps the
// default, true), so the INSERT statements it replaces are measured in the same binary.
func benchLoadDataKey() string {
	if v := os.Getenv("PARITY_BENCH_LOAD_DATA"); v != "" {
		return "load-data = " + v + "\n"
	}
	return ""
}

// waitAppliedKeepAlive is env.waitApplied over one kept-alive connection: the applier's
// arm polls /status every 20ms, and a new TCP connection per poll (httpClient) cost
// the bench and serve CPU that the raw arm does not pay. The connection is closed on
// return.
func (be *benchEnv) waitAppliedKeepAlive(s *serve, ts uint64, timeout time.Duration) {
	be.t.Helper()
	tr := &http.Transport{MaxIdleConnsPerHost: 1}
	defer tr.CloseIdleConnections()
	be.waitAppliedVia(&http.Client{Transport: tr, Timeout: 5 * time.Second}, s, ts, timeout)
}
