package main

import (
	"regexp"
	"strings"
	"testing"

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

func TestLoadgenCommand(t *testing.T) {
	up := testenv.Upstream(t)
	topic := testenv.NewTopic(t, "cli-loadgen", 2)
	code, stdout, stderr := runCLI(t, "loadgen",
		"--upstream-dsn", testenv.Require(t, testenv.EnvUpstream), "--brokers", testenv.Kafka(t),
		"--topic", topic, "--database", up.Name, "--tables", "1", "--transactions", "20",
		"--resolved-interval", "50ms", "--log-level", "warn")
	if code != 0 {
		t.Fatalf("exit code %d; stderr: %s", code, stderr)
	}
	for _, re := range []string{`(?m)^start_ts=\d+$`, `(?m)^resolved_ts=\d+$`, `(?m)^transactions=20 rows=\d+ records=\d+ aborted=\d+$`} {
		if !regexp.MustCompile(re).MatchString(stdout) {
			t.Errorf("stdout does not match %s:\n%s", re, stdout)
		}
	}
}
