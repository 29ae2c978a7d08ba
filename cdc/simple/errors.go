package simple

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors; test with errors.Is.
var (
	ErrSyntax       = errors.New("invalid JSON")                                            // the value is not one JSON object
	ErrVersion      = errors.New("unsupported simple-protocol message version")             // "version" is not 1
	ErrType         = errors.New("unknown message type")                                    // "type" is none of TiCDC's
	ErrMissingField = errors.New("missing required field")                                  // e.g. a row without "data"
	ErrNoSchema     = errors.New("no table schema for the row")                             // no DDL/BOOTSTRAP gave (table, schemaVersion)
	ErrSchema       = errors.New("invalid table schema")                                    // a tableSchema that cannot describe rows
	ErrUnknownType  = errors.New("unsupported column type")                                 // a mysqlType the decoder does not know
	ErrColumn       = errors.New("row does not match its table schema")                     // a missing or unknown column
	ErrValue        = errors.New("invalid column value")                                    // a value that does not parse as its type
	ErrRange        = errors.New("column value out of range")                               // an integer, ENUM, SET, BIT beyond its type
	ErrUnsupported  = errors.New("record uses a TiCDC option the decoder does not support") // claim-check, compression, Avro
	ErrChecksum     = errors.New("row checksum mismatch")                                   // wrapped by ChecksumError
	ErrCorrupted    = errors.New("TiCDC flagged the row corrupted")                         // wrapped by ChecksumError
)

// record holds the Kafka coordinates a caller attaches with WithRecord.
type record struct {
	HasRecord   bool
	Topic       string
	Partition   int
	KafkaOffset int64
}

func (r *record) set(topic string, partition int, offset int64) {
	r.HasRecord, r.Topic, r.Partition, r.KafkaOffset = true, topic, partition, offset
}

func (r *record) write(b *strings.Builder) {
	if r.HasRecord {
		fmt.Fprintf(b, " topic %s partition %d offset %d", r.Topic, r.Partition, r.KafkaOffset)
	}
}

// DecodeError says what in a record could not be decoded: Table ("schema.table", when
// known), Field (e.g. "data.c_int", "tableSchema.columns[3].dataType.mysqlType") and
// the cause. Callers add the Kafka coordinates with WithRecord.
type DecodeError struct {
	Table string
	Field string
	Err   error
	record
}

// WithRecord records the Kafka coordinates of the record that failed and returns e.
func (e *DecodeError) WithRecord(topic string, partition int, offset int64) *DecodeError {
	e.set(topic, partition, offset)
	return e
}

func (e *DecodeError) Error() string {
	var b strings.Builder
	b.WriteString("decode simple-protocol record")
	e.write(&b)
	if e.Table != "" {
		fmt.Fprintf(&b, ", table %s", e.Table)
	}
	if e.Field != "" {
		fmt.Fprintf(&b, ", field %s", e.Field)
	}
	b.WriteString(": ")
	if e.Err != nil {
		b.WriteString(e.Err.Error())
	} else {
		b.WriteString("unknown error")
	}
	return b.String()
}

func (e *DecodeError) Unwrap() error { return e.Err }

// ChecksumError is a row image whose values do not hash to the checksum TiCDC computed
// from the upstream row, or that TiCDC itself flagged corrupted. Key is the handle key
// as "col=value, …" (every column for a table without one). It wraps ErrChecksum or
// ErrCorrupted.
type ChecksumError struct {
	Schema, Table string
	Key           string
	Image         string // "new" (checksum.current) or "old" (checksum.previous)
	Op            string // insert, update, delete
	CommitTs      uint64
	Want, Got     uint32 // TiCDC's checksum, and the one of the decoded values
	Corrupted     bool   // TiCDC set "corrupted": true
	record
}

// WithRecord records the Kafka coordinates of the record and returns e.
func (e *ChecksumError) WithRecord(topic string, partition int, offset int64) *ChecksumError {
	e.set(topic, partition, offset)
	return e
}

func (e *ChecksumError) Error() string {
	var b strings.Builder
	if e.Corrupted {
		b.WriteString("corrupted row")
	} else {
		b.WriteString("row checksum mismatch")
	}
	e.write(&b)
	fmt.Fprintf(&b, ": table %s.%s key (%s), %s image of %s at commit ts %d: ", e.Schema, e.Table, e.Key, e.Image, e.Op, e.CommitTs)
	if e.Corrupted {
		fmt.Fprintf(&b, "TiCDC flagged it corrupted (checksum.corrupted = true; checksum %d, values hash to %d)", e.Want, e.Got)
	} else {
		fmt.Fprintf(&b, "TiCDC's checksum is %d, the decoded values hash to %d", e.Want, e.Got)
	}
	return b.String()
}

func (e *ChecksumError) Unwrap() error {
	if e.Corrupted {
		return ErrCorrupted
	}
	return ErrChecksum
}

// WithRecord attaches Kafka coordinates to err when it is (or wraps) a *DecodeError or
// a *ChecksumError and returns err; other errors are returned unchanged.
func WithRecord(err error, topic string, partition int, offset int64) error {
	var de *DecodeError
	if errors.As(err, &de) {
		de.WithRecord(topic, partition, offset)
	}
	var ce *ChecksumError
	if errors.As(err, &ce) {
		ce.WithRecord(topic, partition, offset)
	}
	return err
}
