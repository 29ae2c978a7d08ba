package e2e

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/testenv"
)

// BenchmarkApplierBigTransaction shows issue 4's memory bound: ONE upstream TiDB
// transaction of PARITY_BENCH_BIG_ROWS rows (default 1,000,000) into a sysbench table,
// published by `parity loadgen --big-transaction-rows` with its real commit ts (table
// dispatcher, 3 partitions, then a resolved ts after it), applied by `parity serve` with
// applier.memory-bytes = bigMemoryBytes. The transaction is far bigger than the bound,
// so serve must spill it to applier.spill-dir instead of holding it in memory.
//
// It prints the rows, the apply time and rate (serve start until its applied checkpoint
// reaches the commit ts), serve's peak RSS (VmHWM, read before it exits), the peak of
// the spilled rows (/status) and of the spill directory's size (sampled every 100 ms),
// and checks the fallback table against TiDB at the commit ts: the row count and the
// digest of every row on both sides (internal/testenv's comparator, streamed).
//
// The RSS verdict is PASS when peak RSS <= 2 x memory-bytes + 64 MiB: the bound counts
// buffered row events; Go's collector (GOGC=100) lets the heap grow to about twice its
// live data before collecting, and the rest of the process (runtime, Kafka fetch
// buffers of up to 32 MiB, decoded records in flight, SQL batches) gets 64 MiB.
func BenchmarkApplierBigTransaction(b *testing.B) {
	const bigMemoryBytes = 64 << 20
	n := 1_000_000
	if v := os.Getenv("PARITY_BENCH_BIG_ROWS"); v != "" {
		if x, err := strconv.Atoi(v); err == nil && x > 0 {
			n = x
		}
	}
	for i := 0; i < b.N; i++ {
		be := newBenchEnv(b)
		be.writeConfig(b)
		spillDir := filepath.Join(filepath.Dir(be.configPath), "spill")
		setMemoryBytes(b, be.configPath, bigMemoryBytes)
		upDSN := testenv.Require(b, testenv.EnvUpstream)
		up := openTB(b, upDSN)
		b.Cleanup(func() {
			if os.Getenv("PARITY_TEST_KEEP") != "1" {
				_, _ = up.Exec("DROP DATABASE IF EXISTS " + ident.Quote(be.db))
			}
		})

		// The upstream transaction and its changefeed. --reset drops the downstream
		// database too: serve creates it from the changefeed's DDL.
		genStart := time.Now()
		out := runLoadgen(b, filepath.Dir(be.configPath), "--upstream-dsn", upDSN, "--downstream-dsn", be.downDSN,
			"--brokers", be.broker, "--topic", be.topic, "--partitions", "3", "--database", be.db, "--reset",
			"--tables", "1", "--all-types=false", "--keyless=false", "--dispatcher", "table",
			"--big-transaction-rows", strconv.Itoa(n), "--seed", "4", "--log-level", "info")
		genTime := time.Since(genStart)
		if log, err := os.ReadFile(filepath.Join(filepath.Dir(be.configPath), "loadgen.log")); err == nil {
			for _, l := range strings.Split(string(log), "\n") {
				if strings.Contains(l, "big transaction committed") || strings.Contains(l, "big transaction published") {
					fmt.Println("loadgen:", l)
				}
			}
		}
		commitTs, records := out["commit_ts"], out["records"]
		if commitTs == 0 || out["rows"] != uint64(n) || out["transactions"] != 1 {
			b.Fatalf("loadgen printed %v: want one transaction of %d rows with a commit ts", out, n)
		}

		b.ResetTimer()
		start := time.Now()
		s := be.startServe()
		stopProf := be.profile(b, "big-transaction")
		smp := startSampler(be, s.cmd.Process.Pid, spillDir)
		be.waitApplied(s, commitTs, 30*time.Minute)
		applyTime := time.Since(start)
		b.StopTimer()
		hwm, hwmErr := procStatusKB(s.cmd.Process.Pid, "VmHWM")
		peak := smp.stop()
		stopProf()
		s.kill()
		if hwmErr != nil {
			b.Fatalf("peak RSS of parity serve: %v", hwmErr)
		}

		want, got := tableDigests(b, up, be.down, be.db, "sbtest1", commitTs)

		const mib = 1 << 20
		rss := float64(hwm<<10) / mib
		limit := float64(2*bigMemoryBytes+64*mib) / mib
		rate := float64(n) / applyTime.Seconds()
		verdict := func(ok bool) string {
			if ok {
				return "PASS"
			}
			return "MISS"
		}
		perRow := 0.0
		if peak.bufRows > 0 {
			perRow = float64(peak.bufBytes) / float64(peak.bufRows)
		}
		fmt.Printf("applier big transaction: %d rows in ONE upstream transaction (commit ts %d; loadgen insert+commit+publish %v, %d records), "+
			"applied in %v (serve start to checkpoint >= commit ts): %.0f rows/s\n",
			n, commitTs, genTime.Round(time.Second), records, applyTime.Round(time.Millisecond), rate)
		fmt.Printf("applier big transaction: memory-bytes %d MiB, peak RSS %.1f MiB (VmHWM; threshold 2 x bound + 64 MiB = %.0f MiB): %s; "+
			"without spilling its rows would need ~%.0f MiB (%.0f bytes/row as buffered)\n",
			bigMemoryBytes/mib, rss, limit, verdict(rss <= limit), perRow*float64(n)/mib, perRow)
		fmt.Printf("applier big transaction: spilled to disk: peak %d rows, peak spill dir %.1f MiB (sampled every 100 ms): %s\n",
			peak.spilledRows, float64(peak.spillBytes)/mib, verdict(peak.spilledRows > 0))
		same := got == want && got.Rows == int64(n)
		fmt.Printf("applier big transaction: fallback %s; TiDB at the commit ts %s: %s\n", got, want, verdict(same))
		b.ReportMetric(rate, "rows/s")
		b.ReportMetric(rss, "peak-rss-MiB")
		b.ReportMetric(float64(peak.spilledRows), "peak-spilled-rows")
		if !same {
			b.Errorf("fallback sbtest1 (%s) differs from TiDB at ts %d (%s), want %d rows", got, commitTs, want, n)
		}
	}
}

// setMemoryBytes sets applier.memory-bytes in a serve config written by writeConfig.
func setMemoryBytes(tb testing.TB, path string, n int64) {
	tb.Helper()
	cfg, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	patched := bytes.Replace(cfg, []byte("[applier]\n"), []byte(fmt.Sprintf("[applier]\nmemory-bytes = %d\n", n)), 1)
	if bytes.Equal(patched, cfg) {
		tb.Fatalf("%s has no [applier] section", path)
	}
	if err := os.WriteFile(path, patched, 0o644); err != nil {
		tb.Fatal(err)
	}
}

func openTB(tb testing.TB, dsn string) *sql.DB {
	tb.Helper()
	c, err := mysql.ParseDSN(dsn)
	if err != nil {
		tb.Fatal(err)
	}
	c.DBName = ""
	db, err := sql.Open("mysql", c.FormatDSN())
	if err != nil {
		tb.Fatal(err)
	}
	db.SetMaxOpenConns(2)
	tb.Cleanup(func() { db.Close() })
	return db
}

// runLoadgen runs `parity loadgen` and returns its key=value output lines as numbers.
func runLoadgen(tb testing.TB, dir string, args ...string) map[string]uint64 {
	tb.Helper()
	logPath := filepath.Join(dir, "loadgen.log")
	logf, err := os.Create(logPath)
	if err != nil {
		tb.Fatal(err)
	}
	defer logf.Close()
	var stdout bytes.Buffer
	cmd := exec.Command(parityBin, append([]string{"loadgen"}, args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, logf
	if err := cmd.Run(); err != nil {
		log, _ := os.ReadFile(logPath)
		tb.Fatalf("parity loadgen: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), log)
	}
	out := map[string]uint64{}
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		for _, f := range strings.Fields(sc.Text()) {
			k, v, ok := strings.Cut(f, "=")
			if !ok {
				continue
			}
			if x, err := strconv.ParseUint(v, 10, 64); err == nil {
				out[k] = x
			}
		}
	}
	return out
}

// tableDigests reads a table of TiDB at ts and of the fallback into digests
// (testenv.CompareDigests: row count and a hash of every canonical row, streamed).
func tableDigests(tb testing.TB, up, down *sql.DB, schema, table string, ts uint64) (tidb, fallback testenv.Digest) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	tidb, fallback, err := testenv.CompareDigests(ctx,
		testenv.Side{Label: "TiDB", DB: up, Schema: schema, TS: ts},
		testenv.Side{Label: "the fallback", DB: down, Schema: schema}, table)
	if err != nil {
		tb.Fatalf("digest %s.%s: %v", schema, table, err)
	}
	return tidb, fallback
}

// procStatusKB returns a "<key>: <n> kB" value of /proc/<pid>/status.
func procStatusKB(pid int, key string) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), key+":"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", key, pid)
}

// peaks are the largest values a sampler saw.
type peaks struct {
	spilledRows, bufRows, bufBytes int64 // from the same /status sample for bufRows/bufBytes
	spillBytes                     int64
}

type sampler struct {
	mu   sync.Mutex
	p    peaks
	done chan struct{}
	wg   sync.WaitGroup
}

// startSampler polls serve's /status and the spill directory every 100 ms.
func startSampler(be *benchEnv, pid int, spillDir string) *sampler {
	smp := &sampler{done: make(chan struct{})}
	smp.wg.Add(1)
	go func() {
		defer smp.wg.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-smp.done:
				return
			case <-t.C:
			}
			var st struct {
				BufferedRows  int64 `json:"buffered_rows"`
				SpilledRows   int64 `json:"spilled_rows"`
				BufferedBytes int64 `json:"buffered_bytes"`
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			ok := getJSON(ctx, httpClient, "http://"+be.statusAddr+"/status", &st) == nil
			cancel()
			size := dirSize(spillDir)
			smp.mu.Lock()
			if ok {
				smp.p.spilledRows = max(smp.p.spilledRows, st.SpilledRows)
				// bytes per in-memory row, from the sample holding the most rows in memory
				if mem := st.BufferedRows - st.SpilledRows; mem > smp.p.bufRows {
					smp.p.bufRows, smp.p.bufBytes = mem, st.BufferedBytes
				}
			}
			smp.p.spillBytes = max(smp.p.spillBytes, size)
			smp.mu.Unlock()
		}
	}()
	return smp
}

func (s *sampler) stop() peaks {
	close(s.done)
	s.wg.Wait()
	return s.p
}

// dirSize sums the sizes of the regular files under dir (0 if it does not exist).
func dirSize(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}
