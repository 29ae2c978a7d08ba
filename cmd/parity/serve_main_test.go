package main

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// execMainEnv set to 1 makes the test binary run as the parity binary (main with its
// arguments): tests that need the real process (its stdout, stderr and exit status, as
// an operator sees them) run os.Args[0] with it.
const execMainEnv = "PARITY_TEST_EXEC_MAIN"

// serve starts goroutines (replicator, status server); every test of the package must
// leave none behind.
func TestMain(m *testing.M) {
	if os.Getenv(execMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
		// signal.NotifyContext's watcher lives for the process once installed.
		goleak.IgnoreTopFunction("os/signal.signal_recv"),
	)
}
