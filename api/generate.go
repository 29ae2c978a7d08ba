// Package api holds the parity API: its protobuf definitions (parity/v1), their
// generated Go code (committed; `make generate` regenerates it, CI fails when it is
// stale) and the gRPC server that `parity serve` runs. It is the only package that
// maps errors to gRPC status codes; checker and cdc never import it.
package api

//go:generate ../scripts/protoc/generate.sh
