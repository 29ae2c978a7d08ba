// Package e2e holds parity's end-to-end tests and the applier benchmark. They build the
// parity binary, run `parity serve` as a subprocess against the real test environment
// (TiDB, fallback MariaDB, Kafka) with `cdc/loadgen` standing in for TiCDC, and check the
// fallback against TiDB with their own full-row comparison, independent of the diff
// engine. The package has no non-test code; it is separate so the daemon's own package
// tests stay fast and these can be selected on their own.
package e2e
