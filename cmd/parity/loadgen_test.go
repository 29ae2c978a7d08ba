package main

import (
	"bytes"
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/tidb-parity/parity/internal/testenv"
)

func runLoadgenCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	cmd := newRoot()
	var out, errb bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errb)
	cmd.SetArgs(append([]string{"loadgen"}, args...))
	err := cmd.Execute()
	code := 0
	if err != nil {
		var ee *exitError
		if !errors.As(err, &ee) {
			t.Fatalf("loadgen: %v", err)
		}
		code = ee.code
		if ee.err != nil {
			errb.WriteString(ee.err.Error())
		}
	}
	return code, out.String(), errb.String()
}

func TestLoadgenRejectsBadFlags(t *testing.T) {
	code, _, stderr := runLoadgenCLI(t, "--workers", "0", "--dispatcher", "columns", "--import-rows", "5", "--compression", "zip")
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
	code, stdout, stderr := runLoadgenCLI(t,
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
