// Package instance is the daemon's one name: what the HA lease records as its holder
// (ha_lease.holder) and verification's history as the daemon of each run
// (verify_runs.instance, verify_fires.instance).
//
// It is its own leaf package because cdc (the lease) and checker/verify (the history)
// both default an empty name the same way and neither may import the other; the daemon
// decides the name once and gives it to both.
package instance

import (
	"fmt"
	"os"
)

// MaxLen is the longest name the meta schema's columns hold (ha_lease.holder,
// verify_runs.instance, verify_fires.instance).
const MaxLen = 128

// DefaultInstance is the name of a daemon whose ha.instance and verify.instance are
// empty: "<hostname>:<pid>" (its last MaxLen bytes).
func DefaultInstance() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	id := fmt.Sprintf("%s:%d", host, os.Getpid())
	if len(id) > MaxLen {
		id = id[len(id)-MaxLen:]
	}
	return id
}
