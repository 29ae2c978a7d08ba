package open

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Flavour selects which TiCDC encoder's bytes the Encoder reproduces.
type Flavour string

const (
	// FlavourClassic is tiflow's encoder (TiCDC ≤ v8.5 classic architecture):
	// encoding/json output, column maps sorted by name, "rid" in the key.
	FlavourClassic Flavour = "classic"
	// FlavourNewArch is pingcap/ticdc's new-architecture encoder: columns in the given
	// (table) order, no HTML escaping, no "rid", "scm"/"tbl" always written.
	FlavourNewArch Flavour = "newarch"
)

// LargeMessageHandle is TiCDC's large-message-handle-option.
type LargeMessageHandle string

const (
	LargeMessageNone          LargeMessageHandle = "none"
	LargeMessageHandleKeyOnly LargeMessageHandle = "handle-key-only"
	LargeMessageClaimCheck    LargeMessageHandle = "claim-check"
)

// MaxRecordOverhead is what TiCDC adds to a record's key and value lengths when it checks
// max-message-bytes (common.MaxRecordOverhead = 5*MaxVarintLen32 + MaxVarintLen64 + 1).
const MaxRecordOverhead = 36

// ErrMessageTooLarge is returned when one event does not fit in MaxMessageBytes and the
// large-message handling cannot make it fit.
var ErrMessageTooLarge = errors.New("message too large")

// EncoderConfig configures an Encoder (TiCDC's common.Config subset for open protocol).
type EncoderConfig struct {
	// MaxBatchSize is the most row events in one Kafka record. Default: 16.
	MaxBatchSize int
	// MaxMessageBytes is the Kafka record size limit used for batching. Default: 10 MiB.
	MaxMessageBytes int
	// Compression of row and DDL payloads. Default: "none".
	Compression Compression
	// Flavour chooses classic tiflow or new-architecture bytes. Default: "classic".
	Flavour Flavour
	// LargeMessageHandle decides what happens to a row event larger than
	// MaxMessageBytes. Default: "none" (ErrMessageTooLarge).
	LargeMessageHandle LargeMessageHandle
	// ClaimCheckStorageURI prefixes claim-check locations ("ccl"). Default: "".
	// Required with LargeMessageHandle "claim-check".
	ClaimCheckStorageURI string
	// ClaimCheckWrite stores a claim-check object under name. Default: nil.
	// Required with LargeMessageHandle "claim-check".
	ClaimCheckWrite func(name string, data []byte) error
	// ClaimCheckName returns a fresh object name. Default: "<random uuid v4>.json".
	ClaimCheckName func() string
}

// DefaultEncoderConfig returns the defaults documented on EncoderConfig.
func DefaultEncoderConfig() EncoderConfig {
	return EncoderConfig{
		MaxBatchSize:       16,
		MaxMessageBytes:    10 << 20,
		Compression:        CompressionNone,
		Flavour:            FlavourClassic,
		LargeMessageHandle: LargeMessageNone,
	}
}

// Validate reports every problem with the configuration.
func (c EncoderConfig) Validate() error {
	var errs []error
	if c.MaxBatchSize < 0 {
		errs = append(errs, fmt.Errorf("max-batch-size: must be positive, got %d", c.MaxBatchSize))
	}
	if c.MaxMessageBytes < 0 {
		errs = append(errs, fmt.Errorf("max-message-bytes: must be positive, got %d", c.MaxMessageBytes))
	}
	if err := c.Compression.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("compression: %w", err))
	}
	switch c.Flavour {
	case "", FlavourClassic, FlavourNewArch:
	default:
		errs = append(errs, fmt.Errorf("flavour: unknown %q (want classic or newarch)", c.Flavour))
	}
	switch c.LargeMessageHandle {
	case "", LargeMessageNone, LargeMessageHandleKeyOnly:
	case LargeMessageClaimCheck:
		if c.ClaimCheckStorageURI == "" {
			errs = append(errs, errors.New("claim-check-storage-uri: required with large-message-handle claim-check"))
		}
		if c.ClaimCheckWrite == nil {
			errs = append(errs, errors.New("claim-check-write: required with large-message-handle claim-check"))
		}
	default:
		errs = append(errs, fmt.Errorf("large-message-handle: unknown %q (want none, handle-key-only or claim-check)", c.LargeMessageHandle))
	}
	return errors.Join(errs...)
}

// Message is one Kafka record: key and value bytes, and how many events it holds.
type Message struct {
	Key, Value []byte
	Events     int
}

// Length is the size TiCDC accounts for the record (common.Message.Length).
func (m Message) Length() int { return len(m.Key) + len(m.Value) + MaxRecordOverhead }

// Encoder produces TiCDC's open-protocol bytes. Row events are batched like tiflow's
// BatchEncoder.AppendRowChangedEvent; DDL and resolved events get records of their own.
// An Encoder is not safe for concurrent use.
type Encoder struct {
	cfg       EncoderConfig
	pending   []Message
	batchSize int
	buf       []byte
	order     []int
}

// NewEncoder returns an Encoder; zero fields of cfg take their defaults.
func NewEncoder(cfg EncoderConfig) (*Encoder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("open encoder config: %w", err)
	}
	def := DefaultEncoderConfig()
	if cfg.MaxBatchSize == 0 {
		cfg.MaxBatchSize = def.MaxBatchSize
	}
	if cfg.MaxMessageBytes == 0 {
		cfg.MaxMessageBytes = def.MaxMessageBytes
	}
	if cfg.Flavour == "" {
		cfg.Flavour = FlavourClassic
	}
	if cfg.LargeMessageHandle == "" {
		cfg.LargeMessageHandle = LargeMessageNone
	}
	if cfg.ClaimCheckName == nil {
		cfg.ClaimCheckName = newUUIDName
	}
	return &Encoder{cfg: cfg}, nil
}

func newUUIDName() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x.json", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// AppendRow adds a row event to the pending records.
func (e *Encoder) AppendRow(ev *Event) error {
	if ev.Kind != KindRow {
		return fmt.Errorf("append row: event kind is %s, want row", ev.Kind)
	}
	key, value, err := e.encodeRow(ev, ev.OnlyHandleKey, ev.ClaimCheckLocation)
	if err != nil {
		return err
	}
	if length := singleLength(key, value); length > e.cfg.MaxMessageBytes {
		switch e.cfg.LargeMessageHandle {
		case LargeMessageClaimCheck:
			name := e.cfg.ClaimCheckName()
			if err := e.cfg.ClaimCheckWrite(name, claimCheckObject(key, value)); err != nil {
				return fmt.Errorf("write claim-check object %s: %w", name, err)
			}
			location := strings.TrimSuffix(e.cfg.ClaimCheckStorageURI, "/") + "/" + name
			if key, value, err = e.encodeRow(ev, true, location); err != nil {
				return err
			}
		case LargeMessageHandleKeyOnly:
			if key, value, err = e.encodeRow(ev, true, ""); err != nil {
				return err
			}
			if length := singleLength(key, value); length > e.cfg.MaxMessageBytes {
				return fmt.Errorf("%w: %s.%s row at ts %d has %d bytes even with only handle-key columns, max-message-bytes %d",
					ErrMessageTooLarge, ev.Schema, ev.Table, ev.CommitTs, length, e.cfg.MaxMessageBytes)
			}
		default:
			return fmt.Errorf("%w: %s.%s row at ts %d has %d bytes, max-message-bytes %d",
				ErrMessageTooLarge, ev.Schema, ev.Table, ev.CommitTs, length, e.cfg.MaxMessageBytes)
		}
	}
	e.push(key, value)
	return nil
}

// singleLength is single(key, value).Length() without building the record: the size
// tiflow checks against max-message-bytes for one row event.
func singleLength(key, value []byte) int { return len(key) + len(value) + MaxRecordOverhead + 16 + 8 }

// claimCheckObject is the external-storage object TiCDC writes for claim-check:
// {"key":base64(version|len|key),"value":base64(len|value)}.
func claimCheckObject(key, value []byte) []byte {
	m := single(key, value)
	out := []byte(`{"key":"`)
	out = base64.StdEncoding.AppendEncode(out, m.Key)
	out = append(out, `","value":"`...)
	out = base64.StdEncoding.AppendEncode(out, m.Value)
	return append(out, `"}`...)
}

func (e *Encoder) push(key, value []byte) {
	n := len(e.pending)
	if n == 0 || e.batchSize >= e.cfg.MaxBatchSize ||
		e.pending[n-1].Length()+len(key)+len(value)+16 > e.cfg.MaxMessageBytes {
		e.pending = append(e.pending, Message{Key: binary.BigEndian.AppendUint64(nil, BatchVersion)})
		e.batchSize = 0
		n++
	}
	m := &e.pending[n-1]
	m.Key = appendFrame(m.Key, key)
	m.Value = appendFrame(m.Value, value)
	m.Events++
	e.batchSize++
}

// Build returns the pending row records and starts over.
func (e *Encoder) Build() []Message {
	out := e.pending
	e.pending = nil
	e.batchSize = 0
	return out
}

// EncodeDDL encodes a DDL event as a record of its own.
func (e *Encoder) EncodeDDL(ev *Event) (Message, error) {
	if ev.Kind != KindDDL {
		return Message{}, fmt.Errorf("encode ddl: event kind is %s, want ddl", ev.Kind)
	}
	key := e.appendKey(nil, ev, KindDDL, false, "")
	v := append([]byte(nil), `{"q":`...)
	v = e.appendString(v, ev.Query)
	v = append(v, `,"t":`...)
	v = strconv.AppendInt(v, int64(ev.DDLType), 10)
	v = append(v, '}')
	value, err := compress(e.cfg.Compression, v)
	if err != nil {
		return Message{}, err
	}
	return single(key, value), nil
}

// EncodeResolved encodes a resolved ts as a record of its own.
func (e *Encoder) EncodeResolved(ts uint64) Message {
	key := e.appendKey(nil, &Event{Kind: KindResolved, CommitTs: ts}, KindResolved, false, "")
	return single(key, nil)
}

// single is a record holding one event.
func single(key, value []byte) Message {
	k := appendFrame(binary.BigEndian.AppendUint64(nil, BatchVersion), key)
	return Message{Key: k, Value: appendFrame(nil, value), Events: 1}
}

// appendFrame appends p with its 8-byte big-endian length prefix.
func appendFrame(b, p []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(len(p)))
	return append(b, p...)
}

func (e *Encoder) appendKey(b []byte, ev *Event, kind Kind, ohk bool, ccl string) []byte {
	b = append(b, `{"ts":`...)
	b = strconv.AppendUint(b, ev.CommitTs, 10)
	if e.cfg.Flavour == FlavourNewArch {
		if kind != KindResolved {
			b = append(b, `,"scm":`...)
			b = e.appendString(b, ev.Schema)
			b = append(b, `,"tbl":`...)
			b = e.appendString(b, ev.Table)
		}
		b = append(b, `,"t":`...)
		b = strconv.AppendInt(b, int64(kind), 10)
		if ohk || ccl != "" {
			b = append(b, `,"ohk":true`...)
		}
		if ccl != "" {
			b = append(b, `,"ohk":false,"ccl":`...)
			b = e.appendString(b, ccl)
		}
		if ev.Partition != 0 && kind == KindRow {
			b = append(b, `,"ptn":`...)
			b = strconv.AppendInt(b, ev.Partition, 10)
		}
		return append(b, '}')
	}
	if ev.Schema != "" {
		b = append(b, `,"scm":`...)
		b = e.appendString(b, ev.Schema)
	}
	if ev.Table != "" {
		b = append(b, `,"tbl":`...)
		b = e.appendString(b, ev.Table)
	}
	if ev.RowID != 0 {
		b = append(b, `,"rid":`...)
		b = strconv.AppendInt(b, ev.RowID, 10)
	}
	if ev.Partition != 0 {
		b = append(b, `,"ptn":`...)
		b = strconv.AppendInt(b, ev.Partition, 10)
	}
	b = append(b, `,"t":`...)
	b = strconv.AppendInt(b, int64(kind), 10)
	if ohk {
		b = append(b, `,"ohk":true`...)
	}
	if ccl != "" {
		b = append(b, `,"ccl":`...)
		b = e.appendString(b, ccl)
	}
	return append(b, '}')
}

// encodeRow returns the key JSON and the (compressed) value payload of a row event.
func (e *Encoder) encodeRow(ev *Event, onlyHandle bool, ccl string) (key, value []byte, err error) {
	ohk := onlyHandle && ccl == ""
	key = e.appendKey(nil, ev, KindRow, ohk, ccl)
	v := e.buf[:0]
	v = append(v, '{')
	first := true
	section := func(name string, cols []Column, present bool) error {
		if !present {
			return nil
		}
		if onlyHandle {
			cols = handleColumns(cols)
		}
		if len(cols) == 0 && (e.cfg.Flavour == FlavourClassic || cols == nil) {
			return nil // omitempty
		}
		if !first {
			v = append(v, ',')
		}
		first = false
		v = append(v, '"')
		v = append(v, name...)
		v = append(v, `":{`...)
		var err error
		v, err = e.appendColumns(v, cols)
		if err != nil {
			return fmt.Errorf("encode %s.%s row at ts %d, %s: %w", ev.Schema, ev.Table, ev.CommitTs, name, err)
		}
		v = append(v, '}')
		return nil
	}
	switch ev.Op {
	case OpInsert:
		err = section("u", ev.Columns, true)
	case OpUpdate:
		if err = section("u", ev.Columns, true); err == nil {
			err = section("p", ev.OldColumns, ev.OldColumns != nil)
		}
	case OpDelete:
		err = section("d", ev.Columns, true)
	default:
		err = fmt.Errorf("encode %s.%s row at ts %d: unknown op %d", ev.Schema, ev.Table, ev.CommitTs, ev.Op)
	}
	if err != nil {
		return nil, nil, err
	}
	v = append(v, '}')
	e.buf = v
	value, err = compress(e.cfg.Compression, v)
	if err != nil {
		return nil, nil, err
	}
	if e.cfg.Compression.none() {
		value = append([]byte(nil), v...)
	}
	return key, value, nil
}

func handleColumns(cols []Column) []Column {
	out := make([]Column, 0, 2)
	for _, c := range cols {
		if c.IsHandle() {
			out = append(out, c)
		}
	}
	return out
}

func (e *Encoder) appendColumns(b []byte, cols []Column) ([]byte, error) {
	e.order = e.order[:0]
	for i := range cols {
		e.order = append(e.order, i)
	}
	if e.cfg.Flavour == FlavourClassic {
		slices.SortStableFunc(e.order, func(i, j int) int { return strings.Compare(cols[i].Name, cols[j].Name) })
	}
	for n, i := range e.order {
		if n > 0 {
			b = append(b, ',')
		}
		c := &cols[i]
		b = e.appendString(b, c.Name)
		b = append(b, `:{"t":`...)
		b = strconv.AppendUint(b, uint64(c.Type), 10)
		if c.IsHandle() {
			b = append(b, `,"h":true`...)
		}
		b = append(b, `,"f":`...)
		b = strconv.AppendUint(b, uint64(c.Flags), 10)
		b = append(b, `,"v":`...)
		var err error
		if b, err = e.appendValue(b, c); err != nil {
			return nil, fmt.Errorf("column %s: %w", c.Name, err)
		}
		b = append(b, '}')
	}
	return b, nil
}

// appendValue writes a column value the way TiCDC renders it (internal.Column).
func (e *Encoder) appendValue(b []byte, c *Column) ([]byte, error) {
	if c.Value == nil {
		return append(b, "null"...), nil
	}
	switch typeClasses[c.Type] {
	case classInt, classYear, classUint:
		switch v := c.Value.(type) {
		case int64:
			return strconv.AppendInt(b, v, 10), nil
		case uint64:
			return strconv.AppendUint(b, v, 10), nil
		case int:
			return strconv.AppendInt(b, int64(v), 10), nil
		case int32:
			return strconv.AppendInt(b, int64(v), 10), nil
		case int16:
			return strconv.AppendInt(b, int64(v), 10), nil
		case int8:
			return strconv.AppendInt(b, int64(v), 10), nil
		case uint:
			return strconv.AppendUint(b, uint64(v), 10), nil
		case uint32:
			return strconv.AppendUint(b, uint64(v), 10), nil
		case uint16:
			return strconv.AppendUint(b, uint64(v), 10), nil
		case uint8:
			return strconv.AppendUint(b, uint64(v), 10), nil
		}
	case classFloat:
		switch v := c.Value.(type) {
		case float64:
			return appendFloat(b, v, 32)
		case float32:
			return appendFloat(b, float64(v), 32)
		}
	case classDouble:
		switch v := c.Value.(type) {
		case float64:
			return appendFloat(b, v, 64)
		case float32:
			return appendFloat(b, float64(v), 64)
		}
	case classText:
		switch v := c.Value.(type) {
		case string:
			return e.appendString(b, v), nil
		case []byte:
			return e.appendString(b, string(v)), nil
		}
	case classChar:
		var s string
		switch v := c.Value.(type) {
		case string:
			s = v
		case []byte:
			s = string(v)
		default:
			return nil, fmt.Errorf("type %d cannot carry a %T", c.Type, c.Value)
		}
		if c.Flags&FlagBinary != 0 {
			s = strconv.Quote(s)
			s = s[1 : len(s)-1]
		}
		return e.appendString(b, s), nil
	case classBlob:
		b = append(b, '"')
		switch v := c.Value.(type) {
		case []byte:
			b = base64.StdEncoding.AppendEncode(b, v)
		case string:
			b = base64.StdEncoding.AppendEncode(b, []byte(v))
		default:
			return nil, fmt.Errorf("type %d cannot carry a %T", c.Type, c.Value)
		}
		return append(b, '"'), nil
	case classUnknown:
		return nil, fmt.Errorf("%w %d", ErrUnknownType, c.Type)
	}
	return nil, fmt.Errorf("type %d cannot carry a %T", c.Type, c.Value)
}

// appendFloat formats like encoding/json (TiCDC marshals float32/float64 values).
func appendFloat(b []byte, f float64, bits int) ([]byte, error) {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return nil, fmt.Errorf("unsupported float value %v", f)
	}
	abs := math.Abs(f)
	format := byte('f')
	if abs != 0 {
		if bits == 64 && (abs < 1e-6 || abs >= 1e21) || bits == 32 && (float32(abs) < 1e-6 || float32(abs) >= 1e21) {
			format = 'e'
		}
	}
	b = strconv.AppendFloat(b, f, format, -1, bits)
	if format == 'e' {
		// clean up e-09 to e-9
		n := len(b)
		if n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b, nil
}

const hexDigits = "0123456789abcdef"

// appendString writes a JSON string: encoding/json's escaping (HTML-safe, U+2028/9
// escaped, invalid UTF-8 as U+FFFD) for classic; jsoniter's with EscapeHTML off (raw
// non-ASCII, \u00XX for controls other than \n \r \t) for the new architecture.
func (e *Encoder) appendString(b []byte, s string) []byte {
	if e.cfg.Flavour == FlavourNewArch {
		return appendStringNewArch(b, s)
	}
	return appendStringClassic(b, s)
}

func appendStringClassic(b []byte, s string) []byte { return appendStringJSON(b, s, true) }

// appendStringJSON is encoding/json's string encoder, with or without HTML escaping.
func appendStringJSON(b []byte, s string, html bool) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && (!html || (c != '<' && c != '>' && c != '&')) {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			b = appendEscape(b, c, true)
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// appendEscape writes the escape of the ASCII byte c: \" \\ \n \r \t, \b and \f when bf is
// set (encoding/json; jsoniter writes them as \u0008 and \u000c), else \u00XX.
func appendEscape(b []byte, c byte, bf bool) []byte {
	switch c {
	case '\\', '"':
		return append(b, '\\', c)
	case '\n':
		return append(b, '\\', 'n')
	case '\r':
		return append(b, '\\', 'r')
	case '\t':
		return append(b, '\\', 't')
	case '\b':
		if bf {
			return append(b, '\\', 'b')
		}
	case '\f':
		if bf {
			return append(b, '\\', 'f')
		}
	}
	return append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
}

func appendStringNewArch(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b = append(b, s[start:i]...)
		b = appendEscape(b, c, false)
		start = i + 1
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
