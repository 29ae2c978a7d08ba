package reliability

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/internal/testenv"
)

// TestRestarts restarts real servers under parity — never the shared ones: a private
// Kafka broker, MariaDB fallback or TiDB each test starts for itself — and fills the
// applier's spill directory. Each ends with the fallback equal to TiDB at the final
// resolved ts (the applier), or with exactly the known differences (a diff).
func TestRestarts(t *testing.T) {
	t.Parallel()
	upDSN := testenv.Require(t, testenv.EnvUpstream)
	downDSN := testenv.Require(t, testenv.EnvDownstream)

	// The broker is killed (SIGKILL) while the applier applies and started again on the
	// same log directory; loadgen's producer retries its writes meanwhile (some records
	// twice, as TiCDC may). The applier's reads wait (changefeed.retry-timeout) and go
	// on from their offsets.
	t.Run("kafka-broker-killed-mid-apply", func(t *testing.T) {
		t.Parallel()
		k := testenv.StartKafka(t, 0)
		topic := k.NewTopic(t, "rel", 3)
		l, importTs := startLoad(t, loadConfig(t, upDSN, downDSN, k.Addr, topic, 40, 21))
		r := startReplicator(t, replicatorConfig(t, k.Addr, topic, downDSN, downDSN, importTs))
		r.progressed(t, importTs)
		time.Sleep(time.Second)
		start := time.Now()
		k.Kill(t)
		k.Start(t)
		t.Logf("broker down for %v", fmtDur(time.Since(start)))
		up := openSchema(t, upDSN, "")
		r.waitApplied(t, testenv.TiDBTSO(t, up), 2*time.Minute)
		t.Logf("recovery: applied everything committed before the broker was back %v after it", fmtDur(time.Since(start)))
		finish(t, l, r, upDSN, downDSN)
		if r.log.Count("kafka unavailable; reconnecting") == 0 {
			t.Errorf("the applier logged no reconnect while the broker was down")
		}
	})

	// The fallback's mariadbd is SIGKILLed mid-apply (innodb-flush-log-at-trx-commit=1,
	// sync-binlog=1) and started again at once: its crash recovery runs; the applier's
	// statements fail with lost connections and are retried (applier.max-retries) until
	// it answers; rounds it had committed stay, the one in flight is applied again.
	t.Run("fallback-sigkill-mid-apply", func(t *testing.T) {
		t.Parallel()
		m := testenv.StartMariaDB(t)
		topic := testenv.NewTopic(t, "rel", 3)
		l, importTs := startLoad(t, loadConfig(t, upDSN, m.DSN, testenv.Kafka(t), topic, 40, 22))
		r := startReplicator(t, replicatorConfig(t, testenv.Kafka(t), topic, m.DSN, m.DSN, importTs))
		r.progressed(t, importTs)
		for i := range 2 {
			time.Sleep(1500 * time.Millisecond)
			start := time.Now()
			m.Kill(t)
			m.Start(t)
			t.Logf("kill %d: mariadbd back after %v", i+1, fmtDur(time.Since(start)))
		}
		if !strings.Contains(m.ErrorLog(), "crash recovery") {
			t.Errorf("mariadbd's error log does not mention crash recovery")
		}
		finish(t, l, r, upDSN, m.DSN)
		if r.log.Count("transient downstream error, retrying") == 0 {
			t.Errorf("the applier logged no retry while the fallback was down")
		}
	})

	// The fallback is SIGKILLed mid-diff and restarted: the chunks in flight fail; the
	// run either retries them (when the server is back within the chunk retry budget)
	// or fails naming the chunk, and --resume finishes the same run.
	t.Run("fallback-sigkill-mid-diff", func(t *testing.T) {
		t.Parallel()
		m := testenv.StartMariaDB(t)
		w := newDiffWorld(t, upDSN, m.DSN, true)
		cfg, _ := w.config(t, upDSN, m.DSN, 5000)
		diffThroughRestart(t, w, cfg, func() { m.Kill(t); m.Start(t) })
	})

	// TiDB (a private tidb-server on unistore) is killed mid-diff and started again on
	// its store: a restart outlasts the chunk retry budget, so the run fails naming the
	// chunk, and --resume finishes it, reading TiDB at the same TSO.
	t.Run("tidb-killed-mid-diff", func(t *testing.T) {
		t.Parallel()
		d := testenv.StartTiDB(t)
		w := newDiffWorld(t, d.DSN, downDSN, true)
		cfg, _ := w.config(t, d.DSN, downDSN, 5000)
		diffThroughRestart(t, w, cfg, func() {
			start := time.Now()
			d.Kill(t)
			d.Start(t)
			t.Logf("tidb-server back after %v", fmtDur(time.Since(start)))
		})
	})

	// The spill directory is a 64 KiB tmpfs and the applier's memory bound 1 KiB, with
	// resolved ts every 5 s: spilling fills the disk, and the applier stops with an error
	// naming the table and ENOSPC; nothing is applied beyond the checkpoint. With space
	// back (the tmpfs remounted larger), a new applier empties the directory and resumes.
	t.Run("spill-dir-full", func(t *testing.T) {
		t.Parallel()
		dir := filepath.Join(t.TempDir(), "spill")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", dir).CombinedOutput(); err != nil {
			t.Skipf("cannot mount a tmpfs for a full spill directory (needs root or CAP_SYS_ADMIN): %v %s", err, out)
		}
		t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
		topic := testenv.NewTopic(t, "rel", 3)
		lc := loadConfig(t, upDSN, downDSN, testenv.Kafka(t), topic, 100, 23)
		lc.ResolvedInterval = 5 * time.Second
		l, importTs := startLoad(t, lc)
		cfg := replicatorConfig(t, testenv.Kafka(t), topic, downDSN, downDSN, importTs)
		cfg.Applier.SpillDir = dir
		cfg.Applier.MemoryBytes = 1024 // the least Validate allows: nearly every row spills
		r := startReplicator(t, cfg)
		select {
		case <-r.done:
		case <-time.After(time.Minute):
			t.Fatalf("the applier still runs after a minute with a full spill directory (status %+v)", r.Status())
		}
		err := r.err
		if err == nil || !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "spilling") {
			t.Fatalf("want the applier stopped by ENOSPC while spilling, got %v", err)
		}
		t.Logf("the applier stopped: %v", err)
		if out, err := exec.Command("mount", "-o", "remount,size=64m", dir).CombinedOutput(); err != nil {
			t.Fatalf("remount: %v %s", err, out)
		}
		start := time.Now()
		r = startReplicator(t, cfg)
		up := openSchema(t, upDSN, "")
		r.waitApplied(t, testenv.TiDBTSO(t, up), 2*time.Minute)
		t.Logf("recovery: caught up %v after space returned", fmtDur(time.Since(start)))
		finish(t, l, r, upDSN, downDSN)
	})
}

// finish stops the load, waits until its final resolved ts is applied, and compares.
func finish(t *testing.T, l *load, r *replicator, upDSN, downDSN string) {
	t.Helper()
	time.Sleep(time.Second)
	res, err := l.stop()
	if err != nil {
		t.Fatalf("loadgen: %v", err)
	}
	r.waitApplied(t, res.ResolvedTs, 2*time.Minute)
	if err := r.stop(); err != nil {
		t.Fatalf("the applier's Run: %v", err)
	}
	t.Logf("loadgen: %d transactions, %d rows", res.Transactions, res.Rows)
	assertSameAt(t, upDSN, downDSN, l.cfg.Database, res.ResolvedTs)
}

// diffThroughRestart runs a diff, restarts a server with restart once 5 chunks are
// stored, and resumes the run if it failed; the result must be exact.
func diffThroughRestart(t *testing.T, w *diffWorld, cfg checker.Config, restart func()) {
	t.Helper()
	var back time.Time
	rep, err, d := runDiff(t, cfg, func(*checker.Diff) { restart(); back = time.Now() })
	if err != nil {
		var re *checker.RunError
		if !errors.As(err, &re) || re.State != checker.RunFailed || !strings.Contains(err.Error(), "chunk") {
			t.Fatalf("want a failed run naming the chunk, got %v", err)
		}
		t.Logf("the run failed after %d chunks (%d retries): %v", d.Stats().ChunksDone, d.Stats().ChunkRetries, err)
		cfg.Resume = re.RunID
		if rep, err, _ = runDiff(t, cfg, nil); err != nil {
			t.Fatalf("resumed run: %v", err)
		}
		t.Logf("resumed and finished %v after the server was back", fmtDur(time.Since(back)))
	} else {
		t.Logf("the run rode through the restart (%d chunks retried), finished %v after the server was back", d.Stats().ChunkRetries, fmtDur(time.Since(back)))
	}
	w.check(t, rep)
}
