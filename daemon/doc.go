// Package daemon is the process `parity serve` runs: it derives every component's
// config once from serve's configuration (one identity — the changefeed, the instance,
// both servers' DSNs with their TLS, the meta schema — given to the applier, the
// verification service, the bypass detector and the API alike), starts the parts in one
// errgroup and stops them (cancel, then wait), serves the status address (/status,
// /healthz, /metrics with the Prometheus collectors over each part's Stats or Status,
// pprof) and holds the repairer, which reads a run's differences through the
// verification service and repairs them through the applier.
//
// It is a top-level package, not internal/: it is a layer (cmd → daemon → api, checker,
// cdc → internal), where internal/ holds the leaves every layer may import. It is the
// one place where cdc and checker meet (cdc never imports checker, neither imports api
// or daemon) and the only package besides api that imports Prometheus: the domain
// packages expose plain structs (cdc.Status, bypass.Stats, verify.Stats, as kafka-go's
// Reader.Stats does) and know no metrics library. cmd/parity is flags and printing.
package daemon
