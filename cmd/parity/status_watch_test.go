package main

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	parityv1 "github.com/tidb-parity/parity/api/parity/v1"
)

// TestStatusWatch: `parity status --watch` (the real process) watches until it is
// interrupted, not for --timeout's default of 10s (it once printed once and exited
// after 10s): SIGINT after 12s ends it with exit status 0 after a dozen updates, so
// does SIGTERM; a --timeout given ends the watch by itself, exit 0; a daemon that stops
// answering fails the watch (exit 2) once an update is the interval plus 10s late.
func TestStatusWatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	e := startRunbookEnv(t, ctx, "status_watch", false)
	conn := []string{"--addr", e.apiAddr, "--token-file", e.tokenFile}

	// A listener that accepts connections and never answers: a hung daemon.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held sync.WaitGroup
	held.Add(1)
	go func() {
		defer held.Done()
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	defer held.Wait()
	defer silent.Close()

	start := time.Now()
	human := startParity(t, "status --watch", nil, append([]string{"status", "--watch", "--interval", "1s"}, conn...)...)
	jsonl := startParity(t, "status --watch --json", nil, append([]string{"status", "--watch", "--interval", "1s", "--json"}, conn...)...)
	bounded := startParity(t, "status --watch --timeout 3s", nil, append([]string{"status", "--watch", "--interval", "1s", "--timeout", "3s"}, conn...)...)
	hung := startParity(t, "status --watch (hung daemon)", nil, "status", "--watch", "--interval", "1s", "--addr", silent.Addr().String())

	// --timeout given: the watch ends by itself, well before the others.
	if code := bounded.wait(t, 60*time.Second); code != 0 {
		t.Errorf("status --watch --timeout 3s: exit %d\n%s", code, bounded.stderr.String())
	}
	if el := time.Since(start); el < 3*time.Second {
		t.Errorf("status --watch --timeout 3s ended after %v", el)
	}
	if n := strings.Count(bounded.stdout.String(), "changefeed:"); n < 2 {
		t.Errorf("status --watch --timeout 3s printed %d updates, want 2 or more:\n%s", n, bounded.stdout.String())
	}

	// The hung daemon's watch waits for its first update for the interval plus 10s.
	time.Sleep(time.Until(start.Add(10 * time.Second)))
	select {
	case <-hung.done:
		t.Errorf("status --watch of a hung daemon gave up within 10s, before the interval plus 10s: exit %d\n%s", hung.code, hung.stderr.String())
	default:
	}
	// Past the old bound (the 10s --timeout default), still watching.
	time.Sleep(time.Until(start.Add(12 * time.Second)))
	for _, p := range []*parityProc{human, jsonl} {
		select {
		case <-p.done:
			t.Fatalf("parity %s ended after %v without being interrupted: exit %d\nstdout:\n%s\nstderr:\n%s", p.name,
				time.Since(start).Round(time.Second), p.code, p.stdout.String(), p.stderr.String())
		default:
		}
	}
	if err := human.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := jsonl.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*parityProc{human, jsonl} {
		if code := p.wait(t, 30*time.Second); code != 0 || p.stderr.Len() > 0 {
			t.Errorf("parity %s interrupted: exit %d, want 0 and nothing on stderr:\n%s", p.name, code, p.stderr.String())
		}
	}
	if n := strings.Count(human.stdout.String(), "changefeed:"); n < 8 {
		t.Errorf("status --watch printed %d updates in 12s at 1s, want about 12:\n%s", n, human.stdout.String())
	}
	if !strings.HasSuffix(human.stdout.String(), "\n\n") {
		t.Errorf("status --watch's output does not end with a whole update:\n%q", human.stdout.String())
	}
	lines := strings.Split(strings.TrimSpace(jsonl.stdout.String()), "\n")
	if len(lines) < 8 {
		t.Errorf("status --watch --json printed %d lines in 12s at 1s, want about 12", len(lines))
	}
	for i, l := range lines {
		var st parityv1.Status
		if !json.Valid([]byte(l)) {
			t.Fatalf("line %d of status --watch --json is not JSON: %q", i, l)
		}
		if err := protojson.Unmarshal([]byte(l), &st); err != nil || st.GetChangefeed() != e.cfg.Changefeed.ID {
			t.Fatalf("line %d of status --watch --json: %v, %v", i, &st, err)
		}
	}

	// A daemon that never answers: no update within the interval plus 10s.
	code := hung.wait(t, 60*time.Second)
	if code != 2 || !strings.Contains(hung.stderr.String(), "no status update from "+silent.Addr().String()) {
		t.Errorf("status --watch of a hung daemon: exit %d, want 2 naming the address:\n%s", code, hung.stderr.String())
	}
	t.Logf("hung daemon: exit %d: %s", code, strings.TrimSpace(hung.stderr.String()))
}
