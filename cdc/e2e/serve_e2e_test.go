package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/tidb-parity/parity/cdc/loadgen"
	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/internal/ident"
)

// loadResult is what a background generator run ended with.
type loadResult struct {
	res loadgen.Result
	err error
}

// startLoadgen runs the generator in the background; the returned channel yields its result.
func startLoadgen(ctx context.Context, cfg loadgen.Config) <-chan loadResult {
	ch := make(chan loadResult, 1)
	go func() {
		res, err := loadgen.Run(ctx, cfg)
		ch <- loadResult{res, err}
	}()
	return ch
}

// waitImport waits for the generator's import TSO file.
func waitImport(t testing.TB, path string, load <-chan loadResult) uint64 {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(path); err == nil && len(b) > 0 {
			ts, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
			if err != nil {
				t.Fatalf("import ts file %s: %v", path, err)
			}
			return ts
		}
		select {
		case lr := <-load:
			t.Fatalf("loadgen ended before the import finished: %v", lr.err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatal("the import did not finish within 2 minutes")
	return 0
}

// TestServeCatchesUp is issue 4's integration test: a few thousand transactions across 3
// partitions (index-value dispatcher, so one transaction's rows spread over partitions,
// and primary-key updates split into delete + insert on different partitions), tables
// created through the changefeed's DDL; parity serve applies while the load runs and
// the fallback then equals TiDB at the final resolved ts, row for row. It runs once per
// protocol loadgen publishes (issue 34): open-protocol; canal-json, whose DDLs reach
// partition 0 only and whose rows name no handle when the table has no primary key (the
// keyless table); simple, whose rows need each table's BOOTSTRAP and carry checksums
// that serve verifies.
func TestServeCatchesUp(t *testing.T) {
	for _, tc := range []struct {
		protocol     string
		transactions int
	}{
		{loadgen.ProtocolOpen, 2500},
		{loadgen.ProtocolCanal, 1000},
		{loadgen.ProtocolSimple, 1000},
	} {
		t.Run(tc.protocol, func(t *testing.T) {
			e := newEnv(t, 3, true)
			e.writeConfig(fmt.Sprintf("protocol = %q\n", tc.protocol), "")
			s := e.startServe()
			cfg := e.loadgenConfig()
			cfg.Protocol = tc.protocol
			cfg.Dispatcher = loadgen.DispatchIndexValue
			cfg.Transactions = tc.transactions
			cfg.MultiTable = 0.3
			cfg.Seed = 4
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			start := time.Now()
			lr := <-startLoadgen(ctx, cfg)
			if lr.err != nil {
				t.Fatalf("loadgen: %v", lr.err)
			}
			loadEnd := time.Now()
			t.Logf("loadgen: %d transactions (%d aborted on lock conflicts), %d row events, %d records in %v; final resolved ts %d",
				lr.res.Transactions, lr.res.Aborted, lr.res.Rows, lr.res.Records, loadEnd.Sub(start).Round(time.Millisecond), lr.res.ResolvedTs)
			e.waitApplied(s, lr.res.ResolvedTs, time.Minute)
			t.Logf("applied the final resolved ts %v after the load ended", time.Since(loadEnd).Round(time.Millisecond))
			e.compareAt(lr.res.ResolvedTs)
			s.stop(t)
		})
	}
}

// TestServeCrashRestart kills parity serve with SIGKILL at random moments at least 10
// times while the workload runs (after an import, with a keyless table whose duplicate
// rows would show any double apply, and raw primary-key-changing updates), restarts it
// each time, and checks at the end that the fallback equals TiDB: no row lost, none
// applied twice.
func TestServeCrashRestart(t *testing.T) {
	e := newEnv(t, 3, false)
	cfg := e.loadgenConfig()
	cfg.ImportRows = 300
	cfg.Dispatcher = loadgen.DispatchTable
	cfg.RawPKUpdates = true
	cfg.Rate = 150
	cfg.Transactions = 2000
	cfg.Seed = 7
	e.crashRestart(cfg, crashPlan{minKills: 10, minWait: 300 * time.Millisecond, maxWait: 2 * time.Second, seed: 7})
}

// TestServeCrashRestartKeyless aims the crashes at tables without a key: the keyless
// table is in most transactions, next to keyed tables (so a round applies several
// tables and a kill often lands between a keyless table's commit and the round's
// checkpoint), and serve is killed at least 30 times, often shortly after a restart
// (while it re-reads what it had applied beyond its checkpoint). The keyed rows use the
// index-value dispatcher; the keyless table stays in its table's partition, as in TiCDC.
// PARITY_E2E_KILLS raises the number of kills.
func TestServeCrashRestartKeyless(t *testing.T) {
	e := newEnv(t, 3, false)
	cfg := e.loadgenConfig()
	cfg.ImportRows = 200
	cfg.Tables = 2
	cfg.AllTypes = false
	cfg.MultiTable = 0.7
	cfg.Dispatcher = loadgen.DispatchIndexValue
	cfg.Rate = 200
	cfg.Transactions = 3000
	cfg.ResolvedInterval = 50 * time.Millisecond
	cfg.Seed = 9
	kills := 30
	if v, err := strconv.Atoi(os.Getenv("PARITY_E2E_KILLS")); err == nil && v > kills {
		kills = v
	}
	e.crashRestart(cfg, crashPlan{minKills: kills, minWait: 150 * time.Millisecond, maxWait: 900 * time.Millisecond, seed: 9})
}

// crashPlan: kill serve at least minKills times, each after a random wait in
// [minWait, maxWait), and until the workload ended.
type crashPlan struct {
	minKills         int
	minWait, maxWait time.Duration
	seed             uint64
}

func (e *env) crashRestart(cfg loadgen.Config, plan crashPlan) {
	t := e.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cfg.ImportTSFile = filepath.Join(t.TempDir(), "import_ts")
	load := startLoadgen(ctx, cfg)

	// As with a changefeed created at the import's TSO, serve starts from it.
	importTs := waitImport(t, cfg.ImportTSFile, load)
	e.writeConfig(fmt.Sprintf("start-ts = %d\n", importTs), "")
	r := rand.New(rand.NewPCG(plan.seed, plan.seed))
	s := e.startServe()
	kills, progressed := 0, 0
	var lastApplied uint64
	var lr loadResult
	for done := false; !done || kills < plan.minKills; {
		select {
		case lr = <-load:
			done = true
			if lr.err != nil {
				t.Fatalf("loadgen: %v", lr.err)
			}
		case <-time.After(plan.minWait + time.Duration(r.Int64N(int64(plan.maxWait-plan.minWait)))):
		}
		if ok, err := s.exited(); ok {
			t.Fatalf("parity serve exited by itself (%v); log:\n%s", err, e.serveLog())
		}
		sctx, scancel := context.WithTimeout(context.Background(), time.Second)
		if st, err := e.status(sctx); err == nil && st.AppliedTs > lastApplied {
			lastApplied = st.AppliedTs
			progressed++ // this instance applied something before it dies
		}
		scancel()
		s.kill()
		kills++
		s = e.startServe()
	}
	t.Logf("killed parity serve %d times (%d of them after it had advanced the checkpoint); loadgen: %d transactions, %d rows, final resolved ts %d",
		kills, progressed, lr.res.Transactions, lr.res.Rows, lr.res.ResolvedTs)
	if progressed < 5 {
		t.Fatalf("only %d of %d kills hit a serve that was applying; the test did not exercise crashes mid-stream", progressed, kills)
	}
	e.waitApplied(s, lr.res.ResolvedTs, time.Minute)
	e.compareAt(lr.res.ResolvedTs)
	s.stop(t)
}

// TestServeReplay re-delivers the changefeed the way TiCDC does after a restart: old
// records again at newer offsets (older commit ts after newer ones, resolved ts going
// back), shuffled, both before parity serve first starts and while it applies the next
// workload; it re-reads old offsets after a SIGKILL, and finally the whole topic after
// its stored offsets are rewound to 0. The fallback must end equal each time.
func TestServeReplay(t *testing.T) {
	e := newEnv(t, 3, true)
	cfg := e.loadgenConfig()
	cfg.Dispatcher = loadgen.DispatchIndexValue
	cfg.Transactions = 600
	cfg.Seed = 11
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	first, err := loadgen.Run(ctx, cfg)
	if err != nil {
		t.Fatalf("loadgen: %v", err)
	}
	r := rand.New(rand.NewPCG(11, 11))
	// Phase 1: every record once more, shuffled within its partition, after the originals.
	var again []kafka.Message
	for _, recs := range e.readRaw() {
		again = append(again, recs...)
	}
	r.Shuffle(len(again), func(i, j int) { again[i], again[j] = again[j], again[i] })
	e.republish(again)
	s := e.startServe()
	e.waitApplied(s, first.ResolvedTs, time.Minute)
	e.compareAt(first.ResolvedTs)

	// Phase 2: a second workload while earlier records (both phases) are re-published
	// between the new ones, and a SIGKILL makes serve re-read from its checkpoint.
	cfg.Seed = 12
	load := startLoadgen(ctx, cfg)
	var lr loadResult
	for round := 0; ; round++ {
		var done bool
		select {
		case lr = <-load:
			done = true
		case <-time.After(400 * time.Millisecond):
		}
		recs := e.readRaw()
		var pick []kafka.Message
		for _, part := range recs {
			for i := 0; i < 20 && len(part) > 0; i++ {
				pick = append(pick, part[r.IntN(len(part))])
			}
		}
		e.republish(pick)
		if round == 2 {
			s.kill()
			s = e.startServe()
		}
		if done {
			break
		}
	}
	if lr.err != nil {
		t.Fatalf("loadgen: %v", lr.err)
	}
	e.waitApplied(s, lr.res.ResolvedTs, time.Minute)
	e.compareAt(lr.res.ResolvedTs)
	s.stop(t)

	// Phase 3: the consumer's offsets are lost (rewound to 0 in the meta schema), so
	// serve re-reads the whole topic; only the durably applied checkpoint may stop it
	// from applying anything twice.
	down := e.open(e.downDSN, "")
	res, err := down.Exec("UPDATE "+ident.Quote(e.meta)+".partition_offset SET next_offset = 0 WHERE changefeed = ?", e.meta)
	if err != nil {
		t.Fatalf("rewind offsets: %v", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		t.Fatalf("no offsets to rewind in %s.partition_offset", e.meta)
	}
	s = e.startServe()
	e.waitRead(s, time.Minute)
	e.waitApplied(s, lr.res.ResolvedTs, time.Minute)
	e.compareAt(lr.res.ResolvedTs)
	s.stop(t)
}

// TestServeHandleKeyOnly runs a changefeed whose large rows arrive with their handle key
// only, as TiCDC sends them with large-message-handle-option = "handle-key-only": the
// all-types table's rows exceed max-message-bytes, the sysbench rows do not. Without
// upstream.dsn parity serve must stop at the first such insert or update with an error
// naming the table, having applied nothing past it; restarted with upstream.dsn it reads
// those rows from TiDB at their commit ts, and the fallback then equals TiDB row for row.
func TestServeHandleKeyOnly(t *testing.T) {
	e := newEnv(t, 2, false)
	cfg := e.loadgenConfig()
	cfg.Tables = 1
	cfg.Keyless = false // TiCDC cannot send a keyless row by its handle key
	cfg.ImportRows = 100
	cfg.Dispatcher = loadgen.DispatchIndexValue
	cfg.PKUpdate = 0.2
	cfg.RawPKUpdates = true // key-changing updates as one event: its old key is all "p" keeps
	cfg.Transactions = 400
	cfg.Seed = 21
	cfg.Encoder.MaxMessageBytes = 1024
	cfg.Encoder.LargeMessageHandle = open.LargeMessageHandleKeyOnly
	importTs, lr := loadAfterImport(t, cfg)
	e.writeConfig(fmt.Sprintf("start-ts = %d\n", importTs), "")

	s := e.startServe()
	select {
	case <-s.done:
	case <-time.After(time.Minute):
		t.Fatalf("parity serve without upstream.dsn did not stop at a handle-key-only event; log:\n%s", e.serveLog())
	}
	log := e.serveLog()
	if s.err == nil || !strings.Contains(log, "carries only handle-key columns") || !strings.Contains(log, "set upstream.dsn") ||
		!strings.Contains(log, "alltypes") {
		t.Fatalf("parity serve without upstream.dsn: exit %v; want an error naming the handle-key-only event of alltypes and upstream.dsn; log:\n%s", s.err, log)
	}

	e.serveUpstream = e.upDSN
	e.writeConfig(fmt.Sprintf("start-ts = %d\n", importTs), "")
	s = e.startServe()
	e.waitApplied(s, lr.res.ResolvedTs, 2*time.Minute)
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	st, err := e.status(sctx)
	scancel()
	if err != nil {
		t.Fatal(err)
	}
	if st.Fetched == 0 {
		t.Fatalf("no row was read from the upstream: the workload sent no handle-key-only insert or update (%d rows applied)", st.Rows)
	}
	t.Logf("loadgen: %d transactions, %d row events; serve read %d handle-key-only rows from TiDB and applied %d rows",
		lr.res.Transactions, lr.res.Rows, st.Fetched, st.Rows)
	e.compareAt(lr.res.ResolvedTs)
	s.stop(t)
}

// TestServeClaimCheck runs a changefeed with large-message-handle-option = "claim-check":
// the all-types table's rows exceed max-message-bytes and go to claim-check files, Kafka
// carries their locations; parity serve reads them from changefeed.claim-check-dir and the
// fallback ends equal to TiDB.
func TestServeClaimCheck(t *testing.T) {
	e := newEnv(t, 2, false)
	dir := t.TempDir()
	cfg := e.loadgenConfig()
	cfg.Tables = 1
	cfg.Keyless = false
	cfg.ImportRows = 100
	cfg.Transactions = 300
	cfg.Seed = 22
	cfg.Encoder.MaxMessageBytes = 1024
	cfg.Encoder.LargeMessageHandle = open.LargeMessageClaimCheck
	cfg.Encoder.ClaimCheckStorageURI = "file://" + dir
	var files atomic.Int64
	cfg.Encoder.ClaimCheckWrite = func(name string, data []byte) error {
		files.Add(1)
		return os.WriteFile(filepath.Join(dir, name), data, 0o644)
	}
	importTs, lr := loadAfterImport(t, cfg)
	if files.Load() == 0 {
		t.Fatal("the workload wrote no claim-check file")
	}
	e.writeConfig(fmt.Sprintf("start-ts = %d\nclaim-check-dir = %q\n", importTs, dir), "")
	s := e.startServe()
	e.waitApplied(s, lr.res.ResolvedTs, 2*time.Minute)
	t.Logf("loadgen: %d transactions, %d row events, %d of them in claim-check files", lr.res.Transactions, lr.res.Rows, files.Load())
	e.compareAt(lr.res.ResolvedTs)
	s.stop(t)
}

// loadAfterImport runs the generator with an import to its end and returns the import
// TSO (where the changefeed starts) and the result.
func loadAfterImport(t *testing.T, cfg loadgen.Config) (uint64, loadResult) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg.ImportTSFile = filepath.Join(t.TempDir(), "import_ts")
	load := startLoadgen(ctx, cfg)
	importTs := waitImport(t, cfg.ImportTSFile, load)
	lr := <-load
	if lr.err != nil {
		t.Fatalf("loadgen: %v", lr.err)
	}
	return importTs, lr
}

// TestServeNewPartition adds a partition to the changefeed's topic while parity serve
// runs, as an operator does before raising a TiCDC changefeed's partition-num. The next
// workload dispatches rows to all three partitions; serve must notice the new partition
// before applying past any of its rows (it restarts its replicator on the new list), and
// the fallback must end equal to TiDB. Without that check the checkpoint would pass the
// new partition's rows and they would never be applied.
func TestServeNewPartition(t *testing.T) {
	e := newEnv(t, 2, true)
	s := e.startServe()
	cfg := e.loadgenConfig()
	cfg.Dispatcher = loadgen.DispatchIndexValue
	cfg.Transactions = 300
	cfg.Seed = 31
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	first, err := loadgen.Run(ctx, cfg)
	if err != nil {
		t.Fatalf("loadgen: %v", err)
	}
	e.waitApplied(s, first.ResolvedTs, time.Minute)

	client := &kafka.Client{Addr: kafka.TCP(e.broker), Timeout: 10 * time.Second}
	resp, err := client.CreatePartitions(ctx, &kafka.CreatePartitionsRequest{
		Topics: []kafka.TopicPartitionsConfig{{Name: e.topic, Count: 3}}})
	if err == nil && len(resp.Errors) > 0 {
		err = resp.Errors[e.topic]
	}
	if err != nil {
		t.Fatalf("add a partition to %s: %v", e.topic, err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		if n, err := loadgen.TopicPartitions(ctx, []string{e.broker}, e.topic); err == nil && n == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the topic does not show 3 partitions")
		}
		time.Sleep(100 * time.Millisecond)
	}
	e.partitions = 3

	cfg.Seed = 32
	second, err := loadgen.Run(ctx, cfg)
	if err != nil {
		t.Fatalf("loadgen: %v", err)
	}
	e.waitApplied(s, second.ResolvedTs, time.Minute)
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	st, err := e.status(sctx)
	scancel()
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Partitions) != 3 {
		t.Errorf("serve reads %d partitions, want 3", len(st.Partitions))
	}
	if !strings.Contains(e.serveLog(), "partitions changed") {
		t.Errorf("serve did not log the partition change; log:\n%s", e.serveLog())
	}
	e.compareAt(second.ResolvedTs)
	s.stop(t)
}

// TestServeTopicDeleted: when the changefeed's topic is deleted while parity serve runs,
// serve stops with an error naming the topic instead of waiting for it.
func TestServeTopicDeleted(t *testing.T) {
	e := newEnv(t, 1, true)
	s := e.startServe()
	cfg := e.loadgenConfig()
	cfg.Transactions = 50
	cfg.Seed = 41
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := loadgen.Run(ctx, cfg)
	if err != nil {
		t.Fatalf("loadgen: %v", err)
	}
	e.waitApplied(s, res.ResolvedTs, time.Minute)
	client := &kafka.Client{Addr: kafka.TCP(e.broker), Timeout: 10 * time.Second}
	resp, err := client.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{e.topic}})
	if err == nil {
		err = resp.Errors[e.topic]
	}
	if err != nil {
		t.Fatalf("delete topic %s: %v", e.topic, err)
	}
	select {
	case <-s.done:
	case <-time.After(time.Minute):
		t.Fatalf("parity serve still runs a minute after its topic was deleted; log:\n%s", e.serveLog())
	}
	if s.err == nil || !strings.Contains(e.serveLog(), e.topic) {
		t.Fatalf("exit %v; want an error naming topic %s; log:\n%s", s.err, e.topic, e.serveLog())
	}
}
