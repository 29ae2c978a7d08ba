package main

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/tso"
)

// TestExitStatusNumbers: the rule's statuses are the numbers README.md documents, and
// the commands that answer nothing (bad flags, a workload that cannot run, an unknown
// flag seen by the real process) exit exitNoAnswer.
func TestExitStatusNumbers(t *testing.T) {
	if exitClean != 0 || exitNotClean != 1 || exitNoAnswer != 2 || exitServeFailed != 1 {
		t.Fatalf("exit statuses %d/%d/%d (serve %d), README.md documents 0/1/2 (serve 1)", exitClean, exitNotClean, exitNoAnswer, exitServeFailed)
	}
	if decodeExitUndecodable != exitNotClean || decodeExitUsage != exitNoAnswer {
		t.Fatalf("decode's statuses %d/%d do not follow the rule", decodeExitUndecodable, decodeExitUsage)
	}
	// A workload that cannot run (TiDB refuses the connection) has no answer.
	code, _, errs := runCLI(t, "loadgen", "--upstream-dsn", "root@tcp(127.0.0.1:1)/", "--brokers", "127.0.0.1:1",
		"--topic", "t", "--transactions", "1", "--log-level", "error")
	if code != exitNoAnswer || !strings.Contains(errs, "127.0.0.1:1") {
		t.Errorf("loadgen against a closed port: exit %d, want %d naming the address: %s", code, exitNoAnswer, errs)
	}
	if code, _, errs := runCLI(t, "cutover-check"); code != exitNoAnswer || !strings.Contains(errs, "--now") {
		t.Errorf("cutover-check without a TSO: exit %d, want %d: %s", code, exitNoAnswer, errs)
	}
	p := runParity(t, "status --no-such-flag", nil, "status", "--no-such-flag")
	if p.code != exitNoAnswer || !strings.Contains(p.stderr.String(), "no-such-flag") {
		t.Errorf("an unknown flag: exit %d, want %d: %s", p.code, exitNoAnswer, p.stderr.String())
	}
}

// TestExitStatusLive: the exit statuses of the daemon's client commands against a live
// daemon under load, by README.md's rule: 0 a clean answer, 1 an answer that is not
// clean (differences, a TSO not applied in time), 2 no answer — an unknown run, and a
// run with no verdict: a cancelled run exits 2 from `diff get` and `diff watch` (the
// cancel itself did what was asked: 0).
func TestExitStatusLive(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	e := startRunbookEnv(t, ctx, "exit_status", true)
	with := func(args ...string) []string { return append(args, "--addr", e.apiAddr, "--token-file", e.tokenFile) }
	exit := func(want int, args ...string) (string, string) {
		t.Helper()
		code, out, errs := runCLI(t, with(args...)...)
		if code != want {
			t.Fatalf("parity %s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, want, out, errs)
		}
		return out, errs
	}
	runOf := func(out string) string {
		t.Helper()
		m := regexp.MustCompile(`(?m)(?:^run:\s+|^started diffs/)(\S+)`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no run in:\n%s", out)
		}
		return m[1]
	}

	exit(exitClean, "status")
	exit(exitClean, "wait-applied", "--now", "--timeout", "2m")
	exit(exitNotClean, "wait-applied", "--ts", strconv.FormatUint(tso.FromTime(time.Now().Add(time.Hour)), 10), "--timeout", "2s")

	// Equal: 0 from the watched run, get and watch.
	out, _ := exit(exitClean, "diff", "start", "--scope", "full", "--watch")
	equal := runOf(out)
	exit(exitClean, "diff", "get", equal)
	exit(exitClean, "diff", "watch", equal)

	// A row only the fallback has (an id loadgen never reaches): 1 from the run, get and
	// watch.
	extra := func(id int) {
		t.Helper()
		if _, err := e.down.ExecContext(ctx, "INSERT INTO "+ident.Table(e.db, "sbtest2")+" (id, k, c, pad) VALUES (?, 1, 'x', 'y')", id); err != nil {
			t.Fatal(err)
		}
	}
	extra(2000000000)
	out, _ = exit(exitNotClean, "diff", "start", "--scope", "full", "--watch")
	different := runOf(out)
	exit(exitNotClean, "diff", "get", different)
	exit(exitNotClean, "diff", "watch", different)
	exit(exitNotClean, "repair", different, "--dry-run")
	// Repair re-verifies the repaired tables whole, not the repaired keys: another row of
	// the table that differs since the run is found, exit 1 (deploy/runbook.md says so);
	// repairing what that re-verification found leaves the tables equal: 0.
	extra(2000000001)
	out, _ = exit(exitNotClean, "repair", different)
	m := regexp.MustCompile(`(?m)^keys:\s+1: 0 upserted, 1 deleted.*\n(?s:.*)^re-verification:\s+(\S+) different$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("repair of the run's one key: want it deleted and the re-verification different:\n%s", out)
	}
	out, _ = exit(exitClean, "diff", "differences", m[1])
	if !strings.Contains(out, "id=2000000001") || strings.Contains(out, "id=2000000000") || !strings.Contains(out, "1 of 1 differences") {
		t.Errorf("the re-verification %s's differences: want the other row only:\n%s", m[1], out)
	}
	exit(exitClean, "repair", m[1])

	// Cancelled: no verdict.
	out, _ = exit(exitClean, "diff", "start", "--scope", "full", "--max-rows-per-second", "50")
	slow := runOf(out)
	out, _ = exit(exitClean, "diff", "cancel", slow)
	if !regexp.MustCompile(`state:\s+cancelled`).MatchString(out) {
		t.Fatalf("diff cancel printed:\n%s", out)
	}
	_, errs := exit(exitNoAnswer, "diff", "get", slow)
	if !strings.Contains(errs, "run "+slow+" cancelled") {
		t.Errorf("diff get of a cancelled run: stderr %q does not say it was cancelled", errs)
	}
	exit(exitNoAnswer, "diff", "watch", slow)

	// No such run.
	_, errs = exit(exitNoAnswer, "diff", "get", "v20000101T000000-00000000")
	if !strings.Contains(errs, "NotFound DIFF_NOT_FOUND") {
		t.Errorf("diff get of an unknown run: stderr %q", errs)
	}
	exit(exitClean, "diff", "list")
}
