package reliability

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/testenv"
)

// EnvSoakDuration sets TestSoakServe's duration (a Go duration); make soak-serve sets it
// from SOAK_DURATION (30m by default). Unset, the test runs its 3-minute version.
const EnvSoakDuration = "PARITY_SOAK_DURATION"

// soakSample is one minute (or interval) of the soak: the daemon's resident memory,
// goroutines, open file descriptors and fallback connections, and its lag.
type soakSample struct {
	at         time.Duration
	rssMiB     float64
	goroutines float64
	fds        float64
	conns      float64 // the daemon's user's connections in SHOW PROCESSLIST
	lagSeconds float64 // applied lag
	verifyRuns int
}

// Growth bounds over the second half of the soak (Theil-Sen slopes, per minute): above them a resource grows without bound, or the applier falls behind.
const (
	maxRSSSlopeMiB     = 4.0 // MiB per minute
	maxGoroutineSlope  = 3.0
	maxFDSlope         = 2.0
	maxConnSlope       = 1.0
	maxLagSlopeSeconds = 1.0 // seconds of lag per minute
	maxLagSeconds      = 30.0
	// RSS climbs while the heap warms up (the 30-minute soak levels off by minute 10;
	// a 3-minute one failed once at 4.06 MiB/min, still warming): its slope is judged
	// only in soaks of at least rssSlopeSoak, and shorter ones bound RSS itself.
	rssSlopeSoak = 10 * time.Minute
	maxRSSMiB    = 256.0
)

// TestSoakServe runs `parity serve` (the built binary, with continuous verification) at
// a steady loadgen rate for PARITY_SOAK_DURATION (3 minutes unset; make soak-serve: 30
// minutes) and samples its RSS (/proc), goroutines (/metrics), open file descriptors
// (/proc), connections to the fallback (SHOW PROCESSLIST of a user of its own) and lag
// (/status), each printed as it is taken. It fails when, over the second half, any of
// them grows faster than its bound (a robust slope per minute; RSS only in soaks of
// rssSlopeSoak or more, shorter ones bound RSS by maxRSSMiB), the lag exceeds 30 s, or
// continuous verification never completed a run; it ends with the fallback equal to TiDB
// at the final resolved ts.
func TestSoakServe(t *testing.T) {
	t.Parallel()
	duration := 3 * time.Minute
	if v := os.Getenv(EnvSoakDuration); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("%s: %v", EnvSoakDuration, err)
		}
		duration = d
	}
	interval := min(max(duration/12, 10*time.Second), time.Minute)
	upDSN := testenv.Require(t, testenv.EnvUpstream)
	downDSN := testenv.Require(t, testenv.EnvDownstream)
	broker := testenv.Kafka(t)
	bin := buildParity(t)

	// A user of its own, so its connections can be counted in PROCESSLIST.
	own := testenv.NewUser(t, downDSN, "soak")
	user := own.Name
	down := openSchema(t, downDSN, "")
	serveDown := own.DSN

	topic := testenv.NewTopic(t, "soak", 3)
	lc := loadConfig(t, upDSN, downDSN, broker, topic, 50, 31)
	// The load outlasts the soak (loadConfig's ten-minute safety stop ended a 30-minute
	// soak's load at minute 10: nothing resolved after it, and the lag the soak watches
	// grew 60 s a minute with the applier idle). The test stops it.
	lc.Duration = duration + 10*time.Minute
	l, importTs := startLoad(t, lc)
	meta := testenv.UniqueName("pm")
	t.Cleanup(func() { _, _ = down.Exec("DROP DATABASE IF EXISTS " + ident.Quote(meta)) })
	status := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "parity.toml")
	cfg := fmt.Sprintf(`[changefeed]
id = "soak"
brokers = [%q]
topics = [%q]
start-ts = %d

[upstream]
dsn = %q

[downstream]
dsn = %q

[applier]
meta-schema = %q
spill-dir = %q
workers = 4

[verify]
enabled = true
tables = [%q]
continuous-interval = "20s"

[log]
level = "warn"

[status]
addr = %q

# The gRPC API is off: its default port is shared with every other daemon on the host.
[api]
addr = ""
`, broker, topic, importTs, upDSN, serveDown, meta, filepath.Join(dir, "spill"), l.cfg.Database+".*", status)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "serve.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, "serve", "--config", cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// exited is closed once serve has exited, waitErr then holds Wait's error: the
	// sampling loop and the cleanup both wait on it (a value sent once was taken by the
	// loop, and the cleanup waited forever).
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "serve.log"))
			t.Logf("parity serve log:\n%s", tail(string(b), 6000))
		}
	})

	var samples []soakSample
	start := time.Now()
	t.Logf("soak: %v, a sample every %v; loadgen at 50 transactions/s", duration, interval)
	t.Logf("%8s %9s %10s %5s %6s %8s %7s", "t", "RSS MiB", "goroutines", "fds", "conns", "lag s", "verify")
	for next := start.Add(interval); ; next = next.Add(interval) {
		select {
		case <-exited:
			t.Fatalf("parity serve exited: %v", waitErr)
		case <-time.After(time.Until(next)):
		}
		s := sample(t, cmd.Process.Pid, status, down, user, meta)
		s.at = time.Since(start)
		samples = append(samples, s)
		t.Logf("%8s %9.1f %10.0f %5.0f %6.0f %8.2f %7d", s.at.Round(time.Second), s.rssMiB, s.goroutines, s.fds, s.conns, s.lagSeconds, s.verifyRuns)
		if s.at >= duration {
			break
		}
	}
	half := samples[len(samples)/2:]
	check := func(what string, v func(soakSample) float64, bound float64) {
		slope := slopePerMinute(half, v)
		t.Logf("%s: slope %.2f per minute over the second half (bound %.1f)", what, slope, bound)
		if slope > bound {
			t.Errorf("%s grows %.2f per minute over the second half of the soak (bound %.1f): growth without bound", what, slope, bound)
		}
	}
	if duration >= rssSlopeSoak {
		check("RSS MiB", func(s soakSample) float64 { return s.rssMiB }, maxRSSSlopeMiB)
	} else {
		t.Logf("RSS MiB: slope %.2f per minute over the second half (not judged: warm-up; soaks of %v or more are)",
			slopePerMinute(half, func(s soakSample) float64 { return s.rssMiB }), rssSlopeSoak)
		for _, s := range samples {
			if s.rssMiB > maxRSSMiB {
				t.Errorf("RSS %.1f MiB at %v exceeds %.0f MiB", s.rssMiB, s.at.Round(time.Second), maxRSSMiB)
			}
		}
	}
	check("goroutines", func(s soakSample) float64 { return s.goroutines }, maxGoroutineSlope)
	check("open fds", func(s soakSample) float64 { return s.fds }, maxFDSlope)
	check("fallback connections", func(s soakSample) float64 { return s.conns }, maxConnSlope)
	check("lag seconds", func(s soakSample) float64 { return s.lagSeconds }, maxLagSlopeSeconds)
	for _, s := range half {
		if s.lagSeconds > maxLagSeconds {
			t.Errorf("lag %.1f s at %v exceeds %.0f s", s.lagSeconds, s.at.Round(time.Second), maxLagSeconds)
		}
	}
	if last := samples[len(samples)-1]; last.verifyRuns == 0 {
		t.Errorf("continuous verification recorded no run in %v", duration)
	}

	res, err := l.stop()
	if err != nil {
		t.Fatalf("loadgen: %v", err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var st struct {
			AppliedTs uint64 `json:"applied_ts"`
		}
		if err := getJSON(status, "/status", &st); err == nil && st.AppliedTs >= res.ResolvedTs {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the final resolved ts %d was not applied within 2 minutes", res.ResolvedTs)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("loadgen: %d transactions, %d rows in %v", res.Transactions, res.Rows, time.Since(start).Round(time.Second))
	assertSameAt(t, upDSN, downDSN, l.cfg.Database, res.ResolvedTs)
}

// sample reads the daemon's resources and lag.
func sample(t *testing.T, pid int, status string, down *sql.DB, user, meta string) soakSample {
	t.Helper()
	var s soakSample
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("read /proc/%d/status: %v", pid, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			s.rssMiB = kb / 1024
		}
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatalf("read /proc/%d/fd: %v", pid, err)
	}
	s.fds = float64(len(fds))
	s.goroutines = metric(t, status, "go_goroutines")
	var st struct {
		AppliedLagSeconds float64 `json:"applied_lag_seconds"`
	}
	if err := getJSON(status, "/status", &st); err != nil {
		t.Fatalf("/status: %v", err)
	}
	s.lagSeconds = st.AppliedLagSeconds
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := down.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = ?", user).Scan(&s.conns); err != nil {
		t.Fatalf("processlist: %v", err)
	}
	_ = down.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+ident.Table(meta, "verify_runs")).Scan(&s.verifyRuns)
	return s
}

var httpClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}

func getJSON(addr, path string, v any) error {
	resp, err := httpClient.Get("http://" + addr + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// metric returns the value of an unlabelled metric from /metrics.
func metric(t *testing.T, addr, name string) float64 {
	t.Helper()
	resp, err := httpClient.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == name {
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			return v
		}
	}
	t.Fatalf("no %s in /metrics", name)
	return 0
}

// slopePerMinute is the Theil-Sen slope of v over time, per minute: the median of the
// slopes between every two samples, which a single spike (a verification run's
// goroutines in flight at one sample) does not move, unlike a least-squares fit.
func slopePerMinute(ss []soakSample, v func(soakSample) float64) float64 {
	var slopes []float64
	for i := range ss {
		for j := i + 1; j < len(ss); j++ {
			if dx := ss[j].at.Minutes() - ss[i].at.Minutes(); dx > 0 {
				slopes = append(slopes, (v(ss[j])-v(ss[i]))/dx)
			}
		}
	}
	if len(slopes) == 0 {
		return 0
	}
	slices.Sort(slopes)
	if n := len(slopes); n%2 == 0 {
		return (slopes[n/2-1] + slopes[n/2]) / 2
	}
	return slopes[len(slopes)/2]
}

// buildParity builds the parity binary once for the test binary's run.
func buildParity(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "parity-rel-")
		if err != nil {
			buildErr = err
			return
		}
		builtDir = dir
		builtBin = filepath.Join(dir, "parity")
		cmd := exec.Command("go", "build", "-o", builtBin, "github.com/tidb-parity/parity/cmd/parity")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin
}

var (
	buildOnce          sync.Once
	builtBin, builtDir string
	buildErr           error
)
