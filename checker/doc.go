// Package checker compares a table set between an upstream (TiDB or any MySQL-protocol
// server) and a downstream MySQL/MariaDB: it chunks every table by key range, compares
// pushed-down count+checksum aggregates per chunk, drills into mismatched chunks down to
// individual rows, and emits fix SQL. A run and its chunks are persisted in the meta
// schema (parity_meta.diff_*) so a killed run resumes where it stopped.
//
// The pieces, each in its own file:
//   - source.go: a Source is one side of the diff: a pool of connections that all read
//     the same snapshot (a TiDB TSO through tidb_snapshot, or transactions opened WITH
//     CONSISTENT SNAPSHOT that the caller hands in).
//   - schema.go: table structure, key choice and structure comparison.
//   - sqltext.go: the value-literal renderer (identifiers go through internal/ident).
//   - checksum.go: every checksum and row-streaming SQL statement.
//   - chunk.go: key ranges, boundary predicates, adaptive splitting.
//   - drill.go: narrowing a mismatched chunk (key buckets or bisection); rowdiff.go:
//     merge-comparing rows in Go, type-aware equality.
//   - fix.go: fix SQL; state.go: the persisted run state machine; run.go: the worker
//     pool and Run; throttle.go: rate cap and busy pause; report.go: the result.
package checker
