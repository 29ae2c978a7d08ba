// Package canal decodes TiCDC's canal-json protocol (with the TiDB extension) into the
// event model of cdc/open, so that the consumer, the applier and everything above them
// handle every protocol alike.
//
// It is a leaf package like cdc/open (no Kafka client, no SQL), so it can be fuzzed and
// reused by the consumer and `parity decode`. What a canal-json message lacks — which
// columns form the handle key when the table has no primary key, which are generated,
// which belong to other unique indexes — is not guessed here: the decoder reports what
// the message says (pkNames as the handle, types from mysqlType) and the consumer
// completes the flags from the table's schema (cdc/streamschema.go).
package canal

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"

	"github.com/tidb-parity/parity/cdc/internal/slots"

	"github.com/tidb-parity/parity/cdc/open"
)

// Sentinel errors wrapped by DecodeError; test with errors.Is.
var (
	ErrSyntax       = errors.New("invalid JSON")
	ErrNoExtension  = errors.New("no TiDB extension (_tidb): parity needs the commit ts and the watermarks it carries; create the changefeed with enable-tidb-extension=true in its sink URI")
	ErrMissingField = errors.New("missing required field")
	ErrKind         = errors.New("unknown message type")
	ErrUnknownType  = errors.New("unknown mysqlType")
	ErrValue        = errors.New("invalid column value")
	ErrTooLarge     = errors.New("message exceeds the configured limit")
)

// DecodeError says what could not be decoded: Field names the JSON member ("data[0].c_int",
// "_tidb.commitTs"), Row the row's index in data (-1 when not about a row).
type DecodeError struct {
	Field string
	Row   int
	Err   error
}

func (e *DecodeError) Error() string {
	var b strings.Builder
	b.WriteString("decode canal-json record")
	if e.Field != "" {
		fmt.Fprintf(&b, ": field %s", e.Field)
	}
	b.WriteString(": ")
	b.WriteString(e.Err.Error())
	return b.String()
}

func (e *DecodeError) Unwrap() error { return e.Err }

func fail(field string, err error, format string, a ...any) *DecodeError {
	if format != "" {
		err = fmt.Errorf("%w: %s", err, fmt.Sprintf(format, a...))
	}
	return &DecodeError{Field: field, Row: -1, Err: err}
}

// DecoderConfig configures a Decoder.
type DecoderConfig struct {
	// MaxMessageBytes bounds one record's value.
	// Default: 0 (64 MiB)
	MaxMessageBytes int
}

// Decoder decodes canal-json records. It is safe for concurrent use; what it keeps
// between records is scratch (buffers, interned names, the column types of recent
// tables), never anything a record's events depend on.
type Decoder struct {
	max    int
	states *slots.Slots[state] // scratch of finished calls, for the next ones
}

// NewDecoder returns a decoder.
func NewDecoder(cfg DecoderConfig) (*Decoder, error) {
	if cfg.MaxMessageBytes < 0 {
		return nil, fmt.Errorf("canal decoder config: max-message-bytes must not be negative")
	}
	if cfg.MaxMessageBytes == 0 {
		cfg.MaxMessageBytes = 64 << 20
	}
	return &Decoder{max: cfg.MaxMessageBytes, states: slots.New[state](max(2, runtime.GOMAXPROCS(0)))}, nil
}

// Decode decodes one Kafka record (TiCDC writes canal-json records with an empty key and
// one message in the value) into its events: a resolved event for a TIDB_WATERMARK, a
// DDL event, or one row event per element of data.
func (d *Decoder) Decode(key, value []byte) ([]open.Event, error) {
	if len(value) > d.max {
		return nil, fail("", ErrTooLarge, "%d bytes, limit %d", len(value), d.max)
	}
	st := d.state()
	evs, ok := st.decode(value)
	d.release(st)
	if ok {
		return evs, nil
	}
	return decodeSlow(value)
}

// colType is what mysqlType says of a column.
type colType struct {
	code  byte
	flags open.Flag
	kind  valueKind
}

type valueKind uint8

const (
	kindSigned valueKind = iota
	kindUnsigned
	kindFloat
	kindDouble
	kindText
	kindBytes
	kindUint // BIT, ENUM index, SET bitmask
)

// baseTypes maps TiDB's type names (types.TypeToStr, as TiCDC's canal-json encoder writes
// them in mysqlType) to the open protocol's type code and value kind.
var baseTypes = map[string]colType{
	"tinyint": {code: open.TypeTiny}, "smallint": {code: open.TypeShort},
	"mediumint": {code: open.TypeInt24}, "int": {code: open.TypeLong}, "bigint": {code: open.TypeLonglong},
	"year":  {code: open.TypeYear},
	"float": {code: open.TypeFloat, kind: kindFloat}, "double": {code: open.TypeDouble, kind: kindDouble},
	"decimal": {code: open.TypeNewDecimal, kind: kindText},
	"date":    {code: open.TypeDate, kind: kindText}, "datetime": {code: open.TypeDatetime, kind: kindText},
	"timestamp": {code: open.TypeTimestamp, kind: kindText}, "time": {code: open.TypeDuration, kind: kindText},
	"json": {code: open.TypeJSON, kind: kindText},
	"bit":  {code: open.TypeBit, kind: kindUint}, "enum": {code: open.TypeEnum, kind: kindUint},
	"set":  {code: open.TypeSet, kind: kindUint},
	"char": {code: open.TypeString, kind: kindText}, "varchar": {code: open.TypeVarchar, kind: kindText},
	"tinytext": {code: open.TypeTinyBlob, kind: kindText}, "text": {code: open.TypeBlob, kind: kindText},
	"mediumtext": {code: open.TypeMediumBlob, kind: kindText}, "longtext": {code: open.TypeLongBlob, kind: kindText},
	"binary": {code: open.TypeString, kind: kindBytes}, "varbinary": {code: open.TypeVarchar, kind: kindBytes},
	"tinyblob": {code: open.TypeTinyBlob, kind: kindBytes}, "blob": {code: open.TypeBlob, kind: kindBytes},
	"mediumblob": {code: open.TypeMediumBlob, kind: kindBytes}, "longblob": {code: open.TypeLongBlob, kind: kindBytes},
}

// columnTypes reads mysqlType: a base type name, then " unsigned" and " zerofill" (with
// content-compatible, the full type "varchar(40)": the length is dropped).
func columnTypes(mt map[string]string) (map[string]colType, error) {
	if len(mt) == 0 {
		return nil, fail("mysqlType", ErrMissingField, "")
	}
	out := make(map[string]colType, len(mt))
	for name, s := range mt {
		t, err := columnType(name, s)
		if err != nil {
			return nil, err
		}
		out[name] = t
	}
	return out, nil
}

// columnType reads the mysqlType s of column name.
func columnType(name, s string) (colType, error) {
	words := strings.Fields(strings.ToLower(s))
	if len(words) == 0 {
		return colType{}, fail("mysqlType."+name, ErrUnknownType, "%q", s)
	}
	base := words[0]
	if i := strings.IndexByte(base, '('); i > 0 {
		base = base[:i]
	}
	t, ok := baseTypes[base]
	if !ok {
		return colType{}, fail("mysqlType."+name, ErrUnknownType, "%q", s)
	}
	for _, w := range words[1:] {
		switch w {
		case "unsigned":
			if t.kind != kindSigned {
				return colType{}, fail("mysqlType."+name, ErrUnknownType, "%q: unsigned on a non-integer type", s)
			}
			t.kind = kindUnsigned
			t.flags |= open.FlagUnsigned
		case "zerofill":
		default:
			return colType{}, fail("mysqlType."+name, ErrUnknownType, "%q", s)
		}
	}
	if hasCharset := (t.kind == kindText && t.code != open.TypeNewDecimal && t.code != open.TypeDate &&
		t.code != open.TypeDatetime && t.code != open.TypeTimestamp && t.code != open.TypeDuration &&
		t.code != open.TypeJSON) || t.code == open.TypeEnum || t.code == open.TypeSet; !hasCharset {
		t.flags |= open.FlagBinary // TiCDC's binary flag: every type without a character set
	}
	return t, nil
}

// latin1 reverses TiCDC's rendering of binary values as ISO-8859-1 text: every byte is
// the code point of one character.
func latin1(s string) ([]byte, error) {
	b := make([]byte, 0, len(s))
	for i, r := range s {
		if r > 0xff { // U+FFFD too: what invalid UTF-8 decodes to
			return nil, fmt.Errorf("character %U at byte %d is not ISO-8859-1", r, i)
		}
		b = append(b, byte(r))
	}
	return b, nil
}

func signedRange(code byte) (int64, int64) {
	switch code {
	case open.TypeTiny:
		return math.MinInt8, math.MaxInt8
	case open.TypeShort:
		return math.MinInt16, math.MaxInt16
	case open.TypeInt24:
		return -1 << 23, 1<<23 - 1
	case open.TypeLong:
		return math.MinInt32, math.MaxInt32
	case open.TypeYear:
		return 0, 2155
	}
	return math.MinInt64, math.MaxInt64
}

func unsignedMax(code byte) uint64 {
	switch code {
	case open.TypeTiny:
		return math.MaxUint8
	case open.TypeShort:
		return math.MaxUint16
	case open.TypeInt24:
		return 1<<24 - 1
	case open.TypeLong:
		return math.MaxUint32
	case open.TypeYear:
		return 2155
	}
	return math.MaxUint64
}
