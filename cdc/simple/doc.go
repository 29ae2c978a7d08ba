// Package simple decodes TiCDC's "simple" protocol (JSON encoding) into the event model
// of package open, so the consumer, applier and everything above them are unchanged.
// It is a leaf package like cdc/open: no Kafka client, no SQL.
//
// Why a package of its own: the simple protocol is stateful where the open protocol is
// not. Row messages carry no column types, only a schemaVersion; the types live in the
// tableSchema of DDL and BOOTSTRAP messages, so a Decoder keeps a schema cache keyed by
// (schema, table, schemaVersion). And simple carries TiCDC's row-level checksums
// (integrity-check-level = "correctness"), which the Decoder verifies on every row.
//
// # Record kinds
//
//	WATERMARK                      → one open.KindResolved event (commitTs)
//	CREATE/ALTER/ERASE/RENAME/     → one open.KindDDL event (sql, commitTs); its tableSchema
//	TRUNCATE/CINDEX/DINDEX/QUERY     and preTableSchema enter the schema cache. DDLType is 0
//	                                 (simple does not carry TiDB's action type); Schema and
//	                                 Table come from tableSchema (else preTableSchema), and
//	                                 are empty for a QUERY (CREATE/DROP DATABASE …).
//	BOOTSTRAP                      → no event; its tableSchema enters the schema cache
//	INSERT/UPDATE/DELETE           → one open.KindRow event: Columns is the new row (the
//	                                 deleted row for a DELETE, from "old"), OldColumns the
//	                                 old row of an UPDATE; columns in table order.
//
// # Rows before their table's schema
//
// A row whose (schema, table, schemaVersion) is not in the cache is an error
// (ErrNoSchema, naming the table and the version), not buffered. Buffering inside the
// decoder would hide a record from the consumer's offset ledger: its offset could be
// committed while the row sits in memory, and a crash would lose it. TiCDC sends a
// table's BOOTSTRAP before its first row on every partition and again after a TRUNCATE
// (and every send-bootstrap-interval-in-sec / send-bootstrap-in-msg-count), and every
// DDL to every partition, so a stream read from its beginning never hits this. A
// consumer that resumes mid-stream must first fill the cache: feed the partition's
// earlier DDL and BOOTSTRAP records to LearnSchema (or to Decode), re-read from an
// offset before the table's last BOOTSTRAP, or keep the cache beside its committed
// offsets and ImportSchemas it on start: ExportSchemas all of it, or SchemasSince
// only what records added since the last save (parity's replicator writes those in
// the transaction of each checkpoint, into <meta-schema>.simple_schema).
//
// # Row checksums
//
// Every row image that carries a checksum is verified on decode with TiCDC's algorithm
// (tiflow pkg/sink/codec/common/verify_checksum.go, TiDB rowcodec's checksum bytes):
// CRC-32 (IEEE) over the non-NULL columns in column-id order, each as
//
//	TINYINT…BIGINT, YEAR      uint64 little-endian (a signed value as its two's complement)
//	ENUM, SET, BIT            uint64 little-endian (index, bitmask, bits)
//	FLOAT, DOUBLE             the float64 bits, little-endian (FLOAT widened exactly)
//	everything else           uint32 little-endian length, then the bytes: the text of
//	                          DECIMAL, DATE, DATETIME, TIME, JSON; TIMESTAMP converted to
//	                          UTC; the bytes of CHAR/VARCHAR/TEXT/BINARY/BLOB
//
// A mismatch, or a row TiCDC flagged "corrupted": true, is a *ChecksumError naming the
// table, the handle key, the image (new or old) and both checksums; callers add the
// Kafka coordinates with WithRecord. A checksum of 0 means TiCDC sent none: checksums
// off, a row whose every column is NULL (the CRC of nothing is 0), or the two halves of
// an UPDATE TiCDC v8.5 split into DELETE + INSERT (cdc/model/sink.go SplitUpdateEvent
// zeroes both). Those images are counted in Stats.RowsWithoutChecksum, not failed.
//
// Column-id order is taken to be the order of tableSchema.columns, which holds as long
// as columns are only appended (CREATE, ADD COLUMN at the end, DROP COLUMN): simple
// does not carry column ids. A table whose columns were reordered (ADD COLUMN … FIRST or
// AFTER, MODIFY … AFTER) would fail verification; so would a VIRTUAL generated column if
// TiCDC left it out of the checksum (both untested: the TiCDC-made dataset has neither).
//
// # What simple does not say
//
// tableSchema carries no generated-column flag, so no column gets open.FlagGenerated: a
// consumer that writes rows must learn generated columns elsewhere (the downstream's
// information_schema). Claim-check, compressed and Avro-encoded records are refused
// with an error saying so.
//
// # What the consumer calls
//
//	d, err := simple.NewDecoder(simple.DecoderConfig{TimeZone: loc}) // once per changefeed; safe for all partitions
//	evs, err := d.Decode(msg.Key, msg.Value)                          // as open.Decoder.Decode
//	err = simple.WithRecord(err, topic, partition, offset)            // names the Kafka record (DecodeError and ChecksumError)
//	errors.Is(err, simple.ErrChecksum) / simple.ErrCorrupted / simple.ErrNoSchema
//	st := d.Stats()                                                   // RowsVerified, RowsWithoutChecksum, Mismatches (for metrics)
//	b, _ := d.ExportSchemas(); d.ImportSchemas(b)                     // resuming mid-stream
//	added, mark = d.SchemasSince(mark)                                // what to save with the next offsets
//
// A BOOTSTRAP record decodes to no events (and no error): its offset is done.
package simple
