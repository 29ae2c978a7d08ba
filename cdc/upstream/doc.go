// Package upstream reads upstream TiDB tables and rows as a TiCDC open-protocol changefeed
// carries them: the type codes and column flags TiCDC computes from TiDB's schema
// (Table, LoadTable) and row images with the Go values cdc/open decodes to (ScanRows,
// FetchRow).
//
// It is its own package because two sides need exactly the same view: the load generator
// (cdc/loadgen), which publishes what TiCDC would, and the replicator, which completes
// handle-key-only events (TiCDC's large-message-handle-option) by reading the row from
// TiDB at the event's commit ts. It uses SQL, never Kafka, and does not import cdc.
package upstream
