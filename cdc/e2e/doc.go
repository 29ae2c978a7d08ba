// Package e2e holds parity's end-to-end tests and the applier benchmark. They build the
// parity binary, run `parity serve` as a subprocess against the real test environment
// (TiDB, fallback MariaDB, Kafka), and check the fallback with their own comparisons in
// plain SQL, independent of the diff engine. What feeds the changefeed:
//   - records made by TiCDC's own code, unchanged: the corpus of ../shared/ticdc-corpus
//     (TestCorpusReplay, compared with a model built from each record's expected.json)
//     and the random changefeeds of ../shared/ticdc-random (TestRandomReplay, compared
//     with TiDB's final tables) — what no one here wrote, so a misunderstanding of
//     TiCDC shared by parity's encoder and decoder cannot pass them;
//   - real TiDB transactions turned into TiCDC-shaped events (TestCollationKeys, and
//     `cdc/loadgen` for the workload, crash and benchmark tests), compared with TiDB.
//
// The package has no non-test code; it is separate so the daemon's own package tests
// stay fast and these can be selected on their own.
package e2e
