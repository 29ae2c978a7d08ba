package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	parityv1 "github.com/tidb-parity/parity/api/parity/v1"
	"github.com/tidb-parity/parity/internal/tso"
)

// runbookGrpcurl is what deploy/runbook.md says about grpcurl: its set-up block (the
// ```sh block defining pgrpc), its console commands calling grpcurl with what they
// print, and its `pgrpc …` lines in the order they appear.
type runbookGrpcurl struct {
	setup    string
	consoles []struct{ cmd, out string }
	lines    []string
}

func readRunbookGrpcurl(t *testing.T) runbookGrpcurl {
	t.Helper()
	raw, err := os.ReadFile("../../deploy/runbook.md")
	if err != nil {
		t.Fatal(err)
	}
	var r runbookGrpcurl
	for _, b := range regexp.MustCompile("(?s)```(sh|console)\n(.*?)```").FindAllStringSubmatch(string(raw), -1) {
		body := dedent(b[2])
		switch {
		case b[1] == "sh" && strings.Contains(body, "pgrpc()"):
			if r.setup != "" {
				t.Fatal("deploy/runbook.md defines pgrpc twice")
			}
			r.setup = body
		case b[1] == "console":
			var cur *struct{ cmd, out string }
			for _, l := range strings.SplitAfter(body, "\n") {
				if strings.HasPrefix(l, "$ ") {
					r.consoles = append(r.consoles, struct{ cmd, out string }{cmd: strings.TrimSpace(l[2:])})
					cur = &r.consoles[len(r.consoles)-1]
					continue
				}
				if cur != nil {
					cur.out += l
				}
			}
		}
	}
	for _, m := range regexp.MustCompile("`(pgrpc [^`]+)`").FindAllStringSubmatch(string(raw), -1) {
		r.lines = append(r.lines, m[1])
	}
	if r.setup == "" || len(r.lines) < 7 {
		t.Fatalf("deploy/runbook.md: set-up block %q, %d pgrpc lines: the runbook no longer has what this test reads", r.setup, len(r.lines))
	}
	return r
}

// dedent removes the indentation of a fenced block inside a list item.
func dedent(s string) string {
	lines := strings.Split(s, "\n")
	indent := -1
	for _, l := range lines {
		if strings.TrimSpace(l) == "" {
			continue
		}
		if n := len(l) - len(strings.TrimLeft(l, " ")); indent < 0 || n < indent {
			indent = n
		}
	}
	for i, l := range lines {
		if len(l) >= indent && indent > 0 {
			lines[i] = l[indent:]
		}
	}
	return strings.Join(lines, "\n")
}

// TestRunbookGrpcurlLines runs deploy/runbook.md's grpcurl as written, in bash, from
// the repository's root: its set-up block (grpcurl put on PATH by scripts/grpcurl.sh,
// the pgrpc function holding the token), then its console commands calling grpcurl
// (the daemon's address for 127.0.0.1:8391; each must print what the runbook shows),
// then every `pgrpc …` line in the runbook's order against a live daemon under load,
// the runbook's example run names replaced by the runs the lines before it started.
// Each must exit 0 with the answer the runbook describes. The runbook's earlier
// G="grpcurl … -H 'authorization: Bearer …'" followed by `$G …` failed so: grpcurl
// said "Too many arguments" (word splitting keeps the quotes).
func TestRunbookGrpcurlLines(t *testing.T) {
	r := readRunbookGrpcurl(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	grpcurlBin(t) // built once, before the daemon starts; the set-up finds it
	e := startRunbookEnv(t, ctx, "runbook_lines", true)

	bash := func(line string) (string, string, error) {
		cmd := exec.CommandContext(ctx, "bash", "-c", "set -eu\n"+r.setup+"\n"+line)
		cmd.Dir = "../.."
		cmd.Env = append(os.Environ(), "PARITY_API_ADDR="+e.apiAddr, "PARITY_API_TOKEN_FILE="+e.tokenFile)
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		return stdout.String(), stderr.String(), err
	}

	consoles := 0
	for _, c := range r.consoles {
		if !strings.HasPrefix(c.cmd, "grpcurl ") {
			continue
		}
		consoles++
		line := strings.ReplaceAll(c.cmd, "127.0.0.1:8391", e.apiAddr)
		out, errs, err := bash(line)
		if err != nil {
			t.Fatalf("%s: %v\n%s%s", line, err, out, errs)
		}
		if strings.TrimSpace(out) != strings.TrimSpace(c.out) {
			t.Errorf("%s printed\n%s\nthe runbook shows\n%s", line, out, c.out)
		}
	}
	if consoles < 2 {
		t.Errorf("the runbook shows %d grpcurl commands with their output, want list and the health check", consoles)
	}

	runName := regexp.MustCompile(`diffs/v\d{8}T\d{6}-[0-9a-f]{8}`)
	method := regexp.MustCompile(`parity\.v1\.Parity/(\w+)`)
	names := map[string]string{} // the runbook's example run → the run started here
	// started maps the next example run name not mapped yet, in the lines after i, to
	// name: the runbook's lines name the run the line before started.
	started := func(i int, name string) {
		for _, l := range r.lines[i+1:] {
			for _, ex := range runName.FindAllString(l, -1) {
				if _, ok := names[ex]; !ok {
					names[ex] = name
					return
				}
			}
		}
	}
	for i, line := range r.lines {
		for ex, real := range names {
			line = strings.ReplaceAll(line, ex, real)
		}
		m := method.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("runbook line %q calls no parity.v1.Parity method", line)
		}
		out, errs, err := bash(line)
		if err != nil {
			t.Fatalf("%s: %v\nstdout:\n%s\nstderr:\n%s", line, err, out, errs)
		}
		var msgs []json.RawMessage
		dec := json.NewDecoder(strings.NewReader(out))
		for dec.More() {
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				t.Fatalf("%s: %v\n%s", line, err, out)
			}
			msgs = append(msgs, raw)
		}
		if len(msgs) == 0 {
			t.Fatalf("%s printed no answer:\n%s", line, errs)
		}
		last := func(m proto.Message) {
			t.Helper()
			if err := protojson.Unmarshal(msgs[len(msgs)-1], m); err != nil {
				t.Fatalf("%s: %v\n%s", line, err, out)
			}
		}
		var problem string
		switch m[1] {
		case "GetStatus":
			var st parityv1.Status
			last(&st)
			if st.GetApplierState() != parityv1.ApplierState_APPLIER_STATE_RUNNING {
				problem = fmt.Sprintf("applier %v", st.GetApplierState())
			}
		case "WaitForApplied":
			var w parityv1.WaitForAppliedResponse
			last(&w)
			if w.GetAppliedTs() < w.GetTargetTs() {
				problem = fmt.Sprintf("applied %d < target %d", w.GetAppliedTs(), w.GetTargetTs())
			}
		case "StartDiff":
			var d parityv1.Diff
			last(&d)
			started(i, d.GetName())
		case "WatchDiff":
			var d parityv1.Diff
			last(&d)
			if d.GetState() != parityv1.DiffState_DIFF_STATE_DONE || d.GetResult() != parityv1.DiffResult_DIFF_RESULT_EQUAL || len(msgs) < 2 {
				problem = fmt.Sprintf("%d messages, the last %v %v; the runbook says a message at once and the last DONE and EQUAL", len(msgs), d.GetState(), d.GetResult())
			}
		case "CutoverCheck":
			var c parityv1.CutoverCheckResponse
			last(&c)
			if !c.GetPassed() {
				problem = fmt.Sprintf("not passed: %v", c.GetFailures())
			}
			started(i, c.GetDiff())
		case "Repair":
			var rep parityv1.RepairResponse
			last(&rep)
			if len(rep.GetKeys()) != 0 {
				problem = fmt.Sprintf("repaired %d keys of a clean run", len(rep.GetKeys()))
			}
		default:
			problem = "a method this test does not know"
		}
		if problem != "" {
			t.Errorf("%s: %s\n%s", line, problem, out)
		}
		t.Logf("ran %s: %d messages", line, len(msgs))
	}
	if len(names) < 2 {
		t.Errorf("the runbook's lines named %d example runs, want the full run's and the cutover check's: %v", len(names), names)
	}
}

// runbookErrorCommands are the commands whose errors deploy/runbook.md shows, by the
// start of the error; future is a TSO an hour ahead.
func runbookErrorCommands(future string) map[string][]string {
	return map[string][]string{
		"parity: GetDiff: ":                            {"diff", "get", "x"},
		"parity: WaitForApplied: ":                     {"wait-applied", "--ts", future, "--timeout", "2s"},
		"parity: cutover check FAILED: CutoverCheck: ": {"cutover-check", "--ts", future, "--wait-timeout", "2s"},
	}
}

var (
	textTime     = regexp.MustCompile(`\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{3} UTC`)
	textDuration = regexp.MustCompile(`\b(?:\d+(?:\.\d+)?(?:ms|µs|ns|h|m|s))+\b`)
	textNumber   = regexp.MustCompile(`\d+`)
)

// textShape is an error text with its times, durations and numbers made placeholders:
// what must be the same in the runbook and in a real run.
func textShape(s string) string {
	s = textTime.ReplaceAllString(strings.TrimSpace(s), "<time>")
	s = textDuration.ReplaceAllString(s, "<duration>")
	return textNumber.ReplaceAllString(s, "<n>")
}

// TestRunbookErrorTexts: every error deploy/runbook.md shows (an inline `parity: …`) is
// what the command really prints on stderr, the real process against a live daemon,
// but for its times, durations and numbers. The runbook once showed `… verification
// run not found: x` where parity prints `… run x: verification run not found`.
func TestRunbookErrorTexts(t *testing.T) {
	raw, err := os.ReadFile("../../deploy/runbook.md")
	if err != nil {
		t.Fatal(err)
	}
	shown := regexp.MustCompile("`(parity: [^`]+)`").FindAllStringSubmatch(string(raw), -1)
	if len(shown) < 3 {
		t.Fatalf("deploy/runbook.md shows %d error texts: the test no longer finds them", len(shown))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	e := startRunbookEnv(t, ctx, "runbook_errors", true)
	future := strconv.FormatUint(tso.FromTime(time.Now().Add(time.Hour)), 10)
	commands := runbookErrorCommands(future)
	for _, m := range shown {
		text := m[1]
		if text == "parity: RPC: Code REASON (metadata): message" {
			continue // the form, not an error
		}
		var args []string
		for prefix, a := range commands {
			if strings.HasPrefix(text, prefix) {
				args = a
			}
		}
		if args == nil {
			t.Errorf("the runbook shows %q, an error of a command this test does not know: add it to runbookErrorCommands", text)
			continue
		}
		p := runParity(t, strings.Join(args, " "), nil, append(args, "--addr", e.apiAddr, "--token-file", e.tokenFile)...)
		got := strings.TrimSpace(p.stderr.String())
		if p.code == exitClean || textShape(got) != textShape(text) {
			t.Errorf("parity %s (exit %d) printed\n  %s\nthe runbook shows\n  %s", strings.Join(args, " "), p.code, got, text)
		}
	}
}
