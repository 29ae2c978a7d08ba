package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/internal/testenv"
)

func TestLoadgenRejectsBadFlags(t *testing.T) {
	code, _, stderr := runCLI(t, "loadgen", "--workers", "0", "--dispatcher", "columns", "--import-rows", "5", "--compression", "zip")
	if code != 2 {
		t.Fatalf("exit code %d, want 2 (configuration error); stderr: %s", code, stderr)
	}
	for _, key := range []string{"workers:", "dispatcher:", "downstream:", "encoder:"} {
		if !strings.Contains(stderr, key) {
			t.Errorf("error does not name %s: %s", key, stderr)
		}
	}
}

// TestLoadgenCommand: with --heartbeat=false, loadgen exits when its workload ends,
// having printed what it did.
func TestLoadgenCommand(t *testing.T) {
	up := testenv.Upstream(t)
	topic := testenv.NewTopic(t, "cli-loadgen", 2)
	code, stdout, stderr := runCLI(t, "loadgen",
		"--upstream-dsn", testenv.Require(t, testenv.EnvUpstream), "--brokers", testenv.Kafka(t),
		"--topic", topic, "--database", up.Name, "--tables", "1", "--transactions", "20",
		"--resolved-interval", "50ms", "--heartbeat=false", "--log-level", "warn")
	if code != 0 {
		t.Fatalf("exit code %d; stderr: %s", code, stderr)
	}
	for _, re := range []string{`(?m)^start_ts=\d+$`, `(?m)^resolved_ts=\d+$`, `(?m)^transactions=20 rows=\d+ records=\d+ aborted=\d+$`} {
		if !regexp.MustCompile(re).MatchString(stdout) {
			t.Errorf("stdout does not match %s:\n%s", re, stdout)
		}
	}
}

// TestLoadgenHeartbeat: `parity loadgen --transactions N` (the real process) prints its
// summary when the workload ends and keeps running, publishing a resolved ts past it
// every --resolved-interval on every partition (as TiCDC does while TiDB is idle), until
// SIGINT, which ends it with exit status 0; the summary is printed once.
func TestLoadgenHeartbeat(t *testing.T) {
	up := testenv.Upstream(t)
	topic := testenv.NewTopic(t, "cli-beat", 2)
	dir := t.TempDir()
	stdout, stderr := filepath.Join(dir, "stdout"), filepath.Join(dir, "stderr")
	outf, err := os.Create(stdout)
	if err != nil {
		t.Fatal(err)
	}
	defer outf.Close()
	errf, err := os.Create(stderr)
	if err != nil {
		t.Fatal(err)
	}
	defer errf.Close()
	cmd := exec.Command(os.Args[0], "loadgen", "--upstream-dsn", testenv.Require(t, testenv.EnvUpstream), "--brokers", testenv.Kafka(t),
		"--topic", topic, "--database", up.Name, "--tables", "1", "--all-types=false", "--keyless=false", "--workers", "2",
		"--transactions", "10", "--resolved-interval", "100ms", "--log-level", "info")
	cmd.Env = append(os.Environ(), execMainEnv+"=1")
	cmd.Stdout, cmd.Stderr = outf, errf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var waitErr error
	done := make(chan struct{}) // closed when the process has ended (waitErr set)
	go func() {
		defer close(done)
		waitErr = cmd.Wait()
	}()
	defer func() {
		select {
		case <-done:
		default:
			_ = cmd.Process.Kill()
			<-done
		}
	}()
	read := func(path string) string {
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return string(raw)
	}
	resolvedRE := regexp.MustCompile(`(?m)^resolved_ts=(\d+)$`)
	var final uint64
	deadline := time.Now().Add(2 * time.Minute)
	for final == 0 {
		select {
		case <-done:
			t.Fatalf("loadgen ended (%v) before printing its summary:\n%s\n%s", waitErr, read(stdout), read(stderr))
		default:
		}
		if out := read(stdout); strings.Contains(out, "transactions=10 ") {
			m := resolvedRE.FindStringSubmatch(out)
			if m == nil {
				t.Fatalf("loadgen's summary has no resolved_ts:\n%s", out)
			}
			final, _ = strconv.ParseUint(m[1], 10, 64)
		}
		if time.Now().After(deadline) {
			t.Fatalf("loadgen printed no summary within 2 minutes:\n%s\n%s", read(stdout), read(stderr))
		}
		time.Sleep(100 * time.Millisecond)
	}

	// The workload ended; resolved events past its final resolved ts follow on every
	// partition while the process runs.
	dec, err := open.NewDecoder(open.DefaultDecoderConfig())
	if err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(60 * time.Second)
	for {
		past := 0
		for p, msgs := range testenv.ReadTopic(t, testenv.Kafka(t), topic, 2) {
			n := 0
			for _, m := range msgs {
				evs, err := dec.Decode(m.Key, m.Value)
				if err != nil {
					t.Fatalf("partition %d offset %d: %v", p, m.Offset, err)
				}
				for _, ev := range evs {
					if ev.Kind == open.KindResolved && ev.CommitTs > final {
						n++
					}
				}
			}
			if n >= 3 {
				past++
			}
		}
		if past == 2 {
			break
		}
		select {
		case <-done:
			t.Fatalf("loadgen ended (%v) after its workload, before SIGINT:\n%s", waitErr, read(stderr))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("60s after the workload, not every partition has 3 resolved events past %d", final)
		}
		time.Sleep(300 * time.Millisecond)
	}

	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
		if waitErr != nil {
			t.Fatalf("loadgen after SIGINT: %v\n%s", waitErr, read(stderr))
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("loadgen did not end within 30s of SIGINT:\n%s", read(stderr))
	}
	if n := len(resolvedRE.FindAllString(read(stdout), -1)); n != 1 {
		t.Errorf("loadgen printed resolved_ts %d times, want once:\n%s", n, read(stdout))
	}
	if !strings.Contains(read(stderr), "heartbeat stopped") {
		t.Errorf("loadgen's log does not say the heartbeat stopped:\n%s", read(stderr))
	}
}
