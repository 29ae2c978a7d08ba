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

// exitError carries a process exit code chosen by a subcommand (for example `parity diff`
// exits 1 when it found differences, 2 on error).
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
	os.Exit(2)
}
