package main

import (
	"testing"

	"go.uber.org/goleak"
)

// serve starts goroutines (replicator, status server); every test of the package must
// leave none behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
		// signal.NotifyContext's watcher lives for the process once installed.
		goleak.IgnoreTopFunction("os/signal.signal_recv"),
	)
}
