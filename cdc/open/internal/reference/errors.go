package reference

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors wrapped by DecodeError; test with errors.Is.
var (
	ErrVersion       = errors.New("unsupported key format version")           // key does not start with version 1
	ErrTruncated     = errors.New("truncated frame")                          // fewer than 8 bytes where a length prefix belongs
	ErrLength        = errors.New("frame length exceeds the remaining bytes") // a length prefix claims more than is there
	ErrCountMismatch = errors.New("key and value frame counts differ")        // keys without values or values without keys
	ErrSyntax        = errors.New("invalid JSON")                             // malformed JSON text
	ErrMissingField  = errors.New("missing required field")                   // e.g. a key without "ts" or "t"
	ErrKind          = errors.New("unknown event type")                       // key "t" is not 1, 2 or 3
	ErrUnknownType   = errors.New("unknown column type code")                 // column "t" is not a MySQL type TiCDC emits
	ErrValue         = errors.New("column value has the wrong JSON type")     // e.g. a string for an INT column
	ErrRange         = errors.New("number out of range")                      // integer beyond its column type, float beyond float32, ...
	ErrBase64        = errors.New("invalid base64")                           // TEXT/BLOB value is not standard padded base64
	ErrQuoted        = errors.New("invalid Go-quoted binary string")          // binary CHAR/VARCHAR value does not unquote
	ErrEmptyRow      = errors.New("row event has no columns")                 // a row value without "u" and "d"
	ErrCompression   = errors.New("cannot decompress value")                  // payload does not match the configured compression
	ErrTooLarge      = errors.New("payload exceeds the configured limit")     // decompressed payload larger than MaxPayloadBytes
	ErrClaimCheck    = errors.New("cannot resolve claim-check message")       // no loader, loader failed, or the object is malformed
	ErrNesting       = errors.New("JSON nested too deeply")                   // unknown fields nest beyond the depth limit
)

// DecodeError says what could not be decoded and where. Offset is a byte offset into the
// Kafka record part named by Part ("key" or "value"); for a compressed payload it points
// at the start of the payload and PayloadOffset gives the position in the decompressed
// JSON (-1 when not applicable). Index is the event's position in the batch (-1 when the
// error is not about one event). Field names the JSON field, e.g. "u.c_int.v".
//
// Callers that know where the record came from fill Topic/Partition/KafkaOffset (see
// WithRecord) so the error message names the Kafka record too.
type DecodeError struct {
	Part          string // "key" or "value"
	Offset        int
	PayloadOffset int
	Index         int
	Field         string
	Err           error

	HasRecord   bool
	Topic       string
	Partition   int
	KafkaOffset int64
}

// WithRecord records the Kafka coordinates of the record that failed and returns e.
func (e *DecodeError) WithRecord(topic string, partition int, offset int64) *DecodeError {
	e.HasRecord = true
	e.Topic, e.Partition, e.KafkaOffset = topic, partition, offset
	return e
}

func (e *DecodeError) Error() string {
	var b strings.Builder
	b.WriteString("decode open-protocol record")
	if e.HasRecord {
		fmt.Fprintf(&b, " topic %s partition %d offset %d", e.Topic, e.Partition, e.KafkaOffset)
	}
	if e.Part != "" {
		fmt.Fprintf(&b, ": %s byte %d", e.Part, e.Offset)
		if e.PayloadOffset >= 0 {
			fmt.Fprintf(&b, " (decompressed byte %d)", e.PayloadOffset)
		}
	}
	if e.Index >= 0 {
		fmt.Fprintf(&b, ", event %d", e.Index)
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

// WithRecord attaches Kafka coordinates to err when it is (or wraps) a *DecodeError and
// returns err; other errors are returned unchanged.
func WithRecord(err error, topic string, partition int, offset int64) error {
	var de *DecodeError
	if errors.As(err, &de) {
		de.WithRecord(topic, partition, offset)
	}
	return err
}
