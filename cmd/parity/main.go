// Command parity is the one binary of the project: it replicates a TiCDC open-protocol
// changefeed into a fallback MySQL (serve), verifies the fallback against upstream TiDB
// (diff), and offers the tools on-call needs (decode, status, loadgen, version).
//
// Each subcommand lives in its own file and registers itself with addCommand from an
// init function, so main stays a small dispatcher.
package main

import (
	"errors"
	"fmt"
	"os"
	"sort"

	"github.com/spf13/cobra"
)

// Set with -ldflags "-X main.version=... -X main.commit=...".
var (
	version = "dev"
	commit  = "unknown"
)

// Exit statuses: one rule for every command (README.md, "Exit status"), so that a
// runbook branches the same way on each: 0 go on, 1 act on what was printed, 2 fix the
// cause and try again.
const (
	// exitClean: the command did what was asked and the answer is clean (equal, passed,
	// applied, running; or it was done: started, cancelled, listed).
	exitClean = 0
	// exitNotClean: it did, and the answer is not clean: differences found or left, a
	// failed cutover check, a TSO not applied within the timeout, an applier not running,
	// an undecodable record, keys a dry run would repair. The output says which.
	exitNotClean = 1
	// exitNoAnswer: no answer: bad flags or configuration, a server or the daemon not
	// reachable, a gRPC error, a workload that could not run, or a run with no verdict
	// (failed, cancelled or skipped: it proved nothing and found nothing to act on; it
	// is run again, as after an error).
	exitNoAnswer = 2
	// exitServeFailed is `parity serve`'s status when replication failed while running.
	// The daemon answers nothing: its statuses are for the service manager, which
	// restarts it on this one and not on exitNoAnswer (a configuration error; systemd's
	// RestartPreventExitStatus=2).
	exitServeFailed = 1
)

// exitError carries a process exit code chosen by a subcommand (for example `parity diff`
// exits exitNotClean when it found differences, exitNoAnswer on error).
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

var commands []func() *cobra.Command

// addCommand registers a subcommand constructor; called from init functions.
func addCommand(f func() *cobra.Command) { commands = append(commands, f) }

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "parity",
		Short:         "Replication consistency checker for TiDB to MySQL cutovers",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	var subs []*cobra.Command
	for _, f := range commands {
		subs = append(subs, f())
	}
	sort.Slice(subs, func(i, j int) bool { return subs[i].Name() < subs[j].Name() })
	root.AddCommand(subs...)
	return root
}

func main() {
	err := newRoot().Execute()
	if err == nil {
		return
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintln(os.Stderr, "parity:", ee.err)
		}
		os.Exit(ee.code)
	}
	fmt.Fprintln(os.Stderr, "parity:", err)
	os.Exit(exitNoAnswer)
}
