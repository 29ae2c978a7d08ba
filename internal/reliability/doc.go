// Package reliability holds no code of its own: its tests put parity's applier, its diff
// and `parity serve` through real faults (issue 20) and check that nothing is lost or
// applied twice. Network faults come from toxiproxy proxies (internal/testenv/proxy.go)
// between parity and Kafka, the fallback MariaDB and TiDB; restarts and crashes hit
// private servers the tests start themselves (internal/testenv/private.go), never the
// shared servers of scripts/env; every test ends with an independent comparison of TiDB
// at the final resolved ts against the fallback (testenv.AssertSame), or with the clear
// error docs/reliability.md documents for it. The soak test (TestSoakServe) runs the
// daemon at a steady load and fails when memory, goroutines or lag grow without bound.
//
// It is its own package because these tests wire several components together (cdc,
// checker, loadgen, the parity binary) and start private servers: kept apart, they run
// in parallel with the other packages' tests and can be selected as one group.
package reliability
