package open

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
)

// BatchVersion is the only key format version TiCDC writes (codec.BatchVersion1).
const BatchVersion = 1

// DecoderConfig configures a Decoder.
type DecoderConfig struct {
	// Compression of row and DDL payloads (TiCDC's large-message-handle-compression).
	// Default: "none".
	Compression Compression
	// ClaimCheck loads the claim-check object at location (the key's "ccl", e.g.
	// "file:///data/ticdc-claim-check-storage/<uuid>.json"). Default: nil, which makes
	// claim-check records an error unless KeepClaimCheck is set.
	ClaimCheck func(location string) ([]byte, error)
	// KeepClaimCheck decodes claim-check records as they are on Kafka (handle-key-only
	// columns, ClaimCheckLocation set) instead of loading the object. Default: false.
	KeepClaimCheck bool
	// MaxPayloadBytes bounds a decompressed payload and a claim-check object.
	// Default: 256 MiB.
	MaxPayloadBytes int
}

// DefaultDecoderConfig returns the defaults documented on DecoderConfig.
func DefaultDecoderConfig() DecoderConfig {
	return DecoderConfig{Compression: CompressionNone, MaxPayloadBytes: 256 << 20}
}

// Validate reports every problem with the configuration.
func (c DecoderConfig) Validate() error {
	var errs []error
	if err := c.Compression.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("compression: %w", err))
	}
	if c.MaxPayloadBytes < 0 {
		errs = append(errs, fmt.Errorf("max-payload-bytes: must not be negative, got %d", c.MaxPayloadBytes))
	}
	return errors.Join(errs...)
}

// Decoder decodes Kafka records written by TiCDC's open-protocol encoders (classic tiflow
// and new architecture). It is safe for concurrent use.
type Decoder struct {
	cfg DecoderConfig
	// states keeps the scratch of finished calls for the next ones (a few, for
	// concurrent callers): see decodeState.
	states chan *decodeState
}

// NewDecoder returns a Decoder; zero fields of cfg take their defaults.
func NewDecoder(cfg DecoderConfig) (*Decoder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("open decoder config: %w", err)
	}
	if cfg.MaxPayloadBytes == 0 {
		cfg.MaxPayloadBytes = DefaultDecoderConfig().MaxPayloadBytes
	}
	return &Decoder{cfg: cfg, states: make(chan *decodeState, min(max(2, runtime.GOMAXPROCS(0)), 8))}, nil
}

// Decode decodes one Kafka record into its events, in order. It returns either every
// event of the record or an error (a *DecodeError); never a partial batch.
//
// The events of one record share their memory: one slice holds the columns of all of
// them, one string the text of every string value, one slice the bytes of every []byte
// value, and one struct of all the boxed values (see decodeState.finish). Nothing
// aliases key, value or the decoder's scratch; a value kept after its event is dropped
// keeps its record's arenas alive.
func (d *Decoder) Decode(key, value []byte) ([]Event, error) {
	return d.decode(key, value, 0)
}

// countFrames counts the length-prefixed frames of a record part after skip bytes,
// checking that every length fits in what is left.
func countFrames(part string, b []byte, skip int) (int, error) {
	n := 0
	for pos := skip; pos < len(b); n++ {
		if len(b)-pos < 8 {
			return 0, &DecodeError{Part: part, Offset: pos, PayloadOffset: -1, Index: n, Field: "length",
				Err: fmt.Errorf("%w: %d bytes left, need 8 for a length", ErrTruncated, len(b)-pos)}
		}
		l := binary.BigEndian.Uint64(b[pos:])
		if l > uint64(len(b)-pos-8) {
			return 0, &DecodeError{Part: part, Offset: pos, PayloadOffset: -1, Index: n, Field: "length",
				Err: fmt.Errorf("%w: length %d, %d bytes left", ErrLength, l, len(b)-pos-8)}
		}
		pos += 8 + int(l)
	}
	return n, nil
}

func (d *Decoder) decode(key, value []byte, depth int) ([]Event, error) {
	if len(key) < 8 {
		return nil, &DecodeError{Part: "key", PayloadOffset: -1, Index: -1, Field: "version",
			Err: fmt.Errorf("%w: key has %d bytes, need 8 for the version", ErrTruncated, len(key))}
	}
	if v := binary.BigEndian.Uint64(key); v != BatchVersion {
		return nil, &DecodeError{Part: "key", PayloadOffset: -1, Index: -1, Field: "version",
			Err: fmt.Errorf("%w %d", ErrVersion, v)}
	}
	nk, err := countFrames("key", key, 8)
	if err != nil {
		return nil, err
	}
	nv, err := countFrames("value", value, 0)
	if err != nil {
		return nil, err
	}
	if nk != nv {
		return nil, &DecodeError{Part: "value", Offset: 0, PayloadOffset: -1, Index: min(nk, nv),
			Err: fmt.Errorf("%w: %d keys, %d values", ErrCountMismatch, nk, nv)}
	}
	if nk == 0 {
		return nil, &DecodeError{Part: "key", Offset: 8, PayloadOffset: -1, Index: -1,
			Err: fmt.Errorf("%w: record holds no events", ErrTruncated)}
	}
	st := d.state()
	defer d.release(st)
	events := make([]Event, nk)
	st.begin(nk, len(value))
	kpos, vpos := 8, 0
	for i := range events {
		kl := int(binary.BigEndian.Uint64(key[kpos:]))
		vl := int(binary.BigEndian.Uint64(value[vpos:]))
		kjson := key[kpos+8 : kpos+8+kl]
		payload := value[vpos+8 : vpos+8+vl]
		ev := &events[i]
		if err := st.keyOf(kjson, ev); err != nil {
			return nil, locate(err, "key", kpos+8, -1, i)
		}
		if err := st.value(ev, payload, kpos+8, vpos+8, i, depth); err != nil {
			return nil, err
		}
		kpos += 8 + kl
		vpos += 8 + vl
	}
	st.finish(events)
	return events, nil
}

// state returns scratch for one call: a kept one, or a new one.
func (d *Decoder) state() *decodeState {
	select {
	case st := <-d.states:
		return st
	default:
		return &decodeState{d: d}
	}
}

// release keeps st for a later call unless enough are kept; scratch that grew beyond
// keepScratchBytes for a huge record is dropped rather than kept.
func (d *Decoder) release(st *decodeState) {
	st.reset()
	select {
	case d.states <- st:
	default:
	}
}

// locate turns a scanner or value error into a DecodeError at base+position.
func locate(err error, part string, base, payloadBase, index int) error {
	var de *DecodeError
	if errors.As(err, &de) {
		return err
	}
	err = fromScan(err)
	pe := &DecodeError{Part: part, Offset: base, PayloadOffset: -1, Index: index, Err: err}
	var fe *fieldError
	if errors.As(err, &fe) {
		pe.Field = fe.field
		err = fromScan(fe.err)
		pe.Err = err
	}
	if se, ok := asSyntax(err); ok {
		if payloadBase >= 0 {
			pe.PayloadOffset = se.pos
		} else {
			pe.Offset = base + se.pos
		}
	}
	return pe
}

// fieldError names the JSON field an error belongs to.
type fieldError struct {
	field string
	err   error
}

func (e *fieldError) Error() string { return e.field + ": " + e.err.Error() }
func (e *fieldError) Unwrap() error { return e.err }

func inField(field string, err error) error {
	if err == nil {
		return nil
	}
	var fe *fieldError
	if errors.As(err, &fe) {
		return err
	}
	return &fieldError{field: field, err: err}
}

// string reads a JSON string.
func (st *decodeState) string() (string, error) {
	b, err := st.stringBytes()
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// name reads a JSON string that names something (a schema, a table): interned.
func (st *decodeState) name() (string, error) {
	b, err := st.stringBytes()
	if err != nil {
		return "", err
	}
	return st.names.Intern(b), nil
}

func (st *decodeState) stringBytes() ([]byte, error) {
	return st.sc.Str()
}

func (st *decodeState) number() ([]byte, error) {
	s := &st.sc
	c := s.Peek()
	if c != '-' && (c < '0' || c > '9') {
		return nil, s.WrongType("a number")
	}
	return s.Number()
}

func (st *decodeState) int64() (int64, error) {
	if v, ok := st.sc.SmallUint(); ok {
		return int64(v), nil
	}
	raw, err := st.number()
	if err != nil {
		return 0, err
	}
	v, err := atoi64(raw)
	if err != nil || !isInteger(raw) {
		return 0, &syntaxError{pos: st.sc.Pos - len(raw), msg: fmt.Sprintf("%s is not an int64", raw), err: ErrRange}
	}
	return v, nil
}

// value decodes the value frame of event i (payload starts at byte base of the value,
// the key JSON at keyBase of the key).
func (st *decodeState) value(ev *Event, payload []byte, keyBase, base, i, depth int) error {
	if ev.Kind == KindResolved {
		return nil // TiCDC writes an empty value; nothing in it is defined
	}
	cfg := &st.d.cfg
	data := payload
	payloadBase := -1
	if !cfg.Compression.none() {
		var err error
		data, err = st.decompress(cfg.Compression, payload, cfg.MaxPayloadBytes)
		if err != nil {
			return &DecodeError{Part: "value", Offset: base, PayloadOffset: -1, Index: i, Field: "payload", Err: err}
		}
		payloadBase = 0
	}
	var err error
	if ev.Kind == KindDDL {
		err = st.ddl(data, ev)
	} else {
		err = st.row(data, ev, i)
	}
	if err != nil {
		return locate(err, "value", base, payloadBase, i)
	}
	if ev.Kind == KindRow && ev.ClaimCheckLocation != "" && !cfg.KeepClaimCheck {
		if err := st.d.claimCheck(ev, depth); err != nil {
			return &DecodeError{Part: "key", Offset: keyBase, PayloadOffset: -1, Index: i, Field: "ccl", Err: err}
		}
		st.rows[i].claimed = true // ev is the object's event now, with memory of its own
	}
	return nil
}

func (st *decodeState) ddl(data []byte, ev *Event) error {
	s := &st.sc
	s.Data, s.Pos = data, 0
	if err := s.Expect('{'); err != nil {
		return err
	}
	var haveQ, haveT bool
	for first := true; ; first = false {
		name, ok, err := s.Member(first)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		switch string(name) {
		case "q":
			if ev.Query, err = st.string(); err != nil {
				return inField("q", err)
			}
			haveQ = true
		case "t":
			t, err := st.int64()
			if err != nil {
				return inField("t", err)
			}
			if t < 0 || t > 1<<31-1 {
				return inField("t", fmt.Errorf("%w: DDL type %d", ErrRange, t))
			}
			ev.DDLType = int(t)
			haveT = true
		default:
			if err := s.Skip(); err != nil {
				return inField(string(name), err)
			}
		}
	}
	if err := s.End(); err != nil {
		return err
	}
	if !haveQ {
		return inField("q", ErrMissingField)
	}
	if !haveT {
		return inField("t", ErrMissingField)
	}
	return nil
}

func (st *decodeState) row(data []byte, ev *Event, i int) error {
	s := &st.sc
	s.Data, s.Pos = data, 0
	if err := s.Expect('{'); err != nil {
		return err
	}
	var u, p, del span
	for first := true; ; first = false {
		name, ok, err := s.Member(first)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		switch string(name) {
		case "u":
			u, err = st.columns("u", ev)
		case "p":
			p, err = st.columns("p", ev)
		case "d":
			del, err = st.columns("d", ev)
		default:
			err = inField(string(name), s.Skip())
		}
		if err != nil {
			return err
		}
	}
	if err := s.End(); err != nil {
		return err
	}
	r := &st.rows[i]
	switch {
	case del.len() > 0:
		if u.len() > 0 || p.len() > 0 {
			return inField("d", fmt.Errorf("%w: a delete must not carry u or p", ErrSyntax))
		}
		ev.Op, r.cols = OpDelete, del
	case u.len() > 0 && p.len() > 0:
		ev.Op, r.cols, r.old = OpUpdate, u, p
	case u.len() > 0:
		ev.Op, r.cols = OpInsert, u
	default:
		return inField("u", ErrEmptyRow)
	}
	return nil
}

// columns reads a name → column object map into the record's columns and returns where
// they are.
func (st *decodeState) columns(section string, ev *Event) (span, error) {
	s := &st.sc
	if c := s.Peek(); c == 'n' {
		return span{}, inField(section, s.Literal("null"))
	} else if c != '{' {
		return span{}, inField(section, s.WrongType("an object"))
	}
	s.Pos++
	sp := span{start: len(st.cols)}
	for first := true; ; first = false {
		name, ok, err := s.Member(first)
		if err != nil {
			return span{}, inField(section, err)
		}
		if !ok {
			break
		}
		if s.Peek() != '{' {
			// The new-architecture encoder writes the old value of a column that became
			// NULL without its name when only-output-updated-columns is on: the members
			// "t", "f", "v" land directly in the map. Skip them and say so.
			if err := s.Skip(); err != nil {
				return span{}, inField(section+"."+string(name), err)
			}
			ev.Malformed = append(ev.Malformed, section+"."+string(name))
			continue
		}
		// The section before (of the same table, mostly) names its columns in the same
		// order: compare with its name at this position before looking in the map.
		var col Column
		if j := len(st.cols) - sp.start; j < st.last.len() && st.cols[st.last.start+j].Name == string(name) {
			col.Name = st.cols[st.last.start+j].Name
		} else {
			col.Name = st.names.Intern(name)
		}
		v, err := st.column(&col, len(st.cols)-sp.start)
		if err != nil {
			var fe *fieldError
			if errors.As(err, &fe) {
				return span{}, &fieldError{field: section + "." + col.Name + "." + fe.field, err: fe.err}
			}
			return span{}, inField(section+"."+col.Name, err)
		}
		if st.cols == nil {
			st.cols = make([]Column, 0, st.colsHint) // handed out whole by finish
		}
		st.cols = append(st.cols, col)
		st.vals = append(st.vals, v)
	}
	sp.end = len(st.cols)
	st.last = sp
	return sp, nil
}

// column reads one {"t","h","f","v"} object into col and returns its value, still to be
// boxed by finish.
func (st *decodeState) column(col *Column, j int) (pending, error) {
	s := &st.sc
	start := s.Pos
	s.Pos++ // '{'
	var c colHead
	var haveV bool
	vKind, vPos := tokNull, -1
	var vRaw []byte
	first := true
	// When the column begins with the bytes the last column at position j (mostly the
	// same column of the same table) had up to its value, the parse resumes at the value
	// with what those members said (colHeads).
	var h colHead // what the members before "v" said, when they were only "t", "h", "f"
	hEnd := -1    // and where "v"'s value starts
	onlyHead := true
	if hd := st.heads.at(j); hd != nil && bytes.HasPrefix(s.Data[start:], st.heads.buf[hd.off:hd.end]) {
		c, first, haveV, onlyHead = hd.c, false, true, false
		s.Pos = start + hd.end - hd.off
		vPos = s.Pos
		var err error
		if vKind, vRaw, err = st.columnV(); err != nil {
			return pending{}, inField("v", err)
		}
	}
	for ; ; first = false {
		name, ok, err := s.Member(first)
		if err != nil {
			return pending{}, err
		}
		if !ok {
			break
		}
		switch string(name) {
		case "t":
			if c.t, err = st.int64(); err != nil {
				return pending{}, inField("t", err)
			}
			if c.t < 0 || c.t > 255 || !KnownType(byte(c.t)) {
				return pending{}, inField("t", &syntaxError{pos: s.Pos, msg: fmt.Sprintf("%v %d", ErrUnknownType, c.t), err: ErrUnknownType})
			}
			c.haveT = true
		case "f":
			c.haveF = true
			var ok bool
			if c.f, ok = s.SmallUint(); ok {
				break
			}
			raw, err := st.number()
			if err != nil {
				return pending{}, inField("f", err)
			}
			if c.f, err = atou64(raw); err != nil || !isInteger(raw) {
				return pending{}, inField("f", fmt.Errorf("%w: flags %s", ErrRange, raw))
			}
		case "h":
			if c.handle, err = boolean(s); err != nil {
				return pending{}, inField("h", err)
			}
		case "v":
			if onlyHead {
				h, hEnd, onlyHead = c, s.Pos, false
			}
			haveV = true
			vPos = s.Pos
			if vKind, vRaw, err = st.columnV(); err != nil {
				return pending{}, inField("v", err)
			}
		default:
			onlyHead = false
			if err := s.Skip(); err != nil {
				return pending{}, inField(string(name), err)
			}
		}
	}
	if hEnd > 0 {
		st.heads.set(j, s.Data[start:hEnd], h)
	}
	if !c.haveT {
		return pending{}, inField("t", ErrMissingField)
	}
	if !c.haveF {
		return pending{}, inField("f", ErrMissingField)
	}
	if !haveV {
		return pending{}, inField("v", ErrMissingField)
	}
	col.Type = byte(c.t)
	col.Flags = Flag(c.f)
	if c.handle {
		col.Flags |= FlagHandleKey
	}
	v, err := st.columnValue(col.Type, col.Flags, vKind, vRaw)
	if err != nil {
		return pending{}, inField("v", &syntaxError{pos: vPos, msg: err.Error(), err: unwrapSentinel(err)})
	}
	return v, nil
}

// columnV reads the value of a column's "v" member.
func (st *decodeState) columnV() (kind tokenKind, raw []byte, err error) {
	s := &st.sc
	switch c := s.Peek(); {
	case c == '"':
		raw, err = s.Str()
		return tokString, raw, err
	case c == '-' || (c >= '0' && c <= '9'):
		raw, err = s.Number()
		return tokNumber, raw, err
	case c == 'n':
		return tokNull, nil, s.Literal("null")
	case c == 't' || c == 'f':
		_, err = boolean(s)
		return tokBool, nil, err
	default:
		return tokOther, nil, s.Skip()
	}
}

// unwrapSentinel returns the package sentinel an error wraps.
func unwrapSentinel(err error) error {
	for _, s := range []error{ErrUnknownType, ErrValue, ErrRange, ErrBase64, ErrQuoted} {
		if errors.Is(err, s) {
			return s
		}
	}
	return err
}

// claimCheck replaces ev (a claim-check reference) with the event stored in the object.
func (d *Decoder) claimCheck(ev *Event, depth int) error {
	if depth > 0 {
		return fmt.Errorf("%w: the claim-check object itself refers to a claim-check object", ErrClaimCheck)
	}
	if d.cfg.ClaimCheck == nil {
		return fmt.Errorf("%w: record refers to claim-check object %s but no claim-check storage is configured", ErrClaimCheck, ev.ClaimCheckLocation)
	}
	data, err := d.cfg.ClaimCheck(ev.ClaimCheckLocation)
	if err != nil {
		return fmt.Errorf("%w: load %s: %w", ErrClaimCheck, ev.ClaimCheckLocation, err)
	}
	if len(data) > d.cfg.MaxPayloadBytes {
		return fmt.Errorf("%w: claim-check object %s has %d bytes, limit %d", ErrTooLarge, ev.ClaimCheckLocation, len(data), d.cfg.MaxPayloadBytes)
	}
	var obj struct {
		Key   *string `json:"key"`
		Value *string `json:"value"`
	}
	if err := json.Unmarshal(data, &obj); err != nil || obj.Key == nil || obj.Value == nil {
		return fmt.Errorf("%w: object %s is not {\"key\":base64,\"value\":base64}", ErrClaimCheck, ev.ClaimCheckLocation)
	}
	k, err1 := base64.StdEncoding.DecodeString(*obj.Key)
	v, err2 := base64.StdEncoding.DecodeString(*obj.Value)
	if err1 != nil || err2 != nil {
		return fmt.Errorf("%w: object %s: %w", ErrClaimCheck, ev.ClaimCheckLocation, ErrBase64)
	}
	inner, err := d.decode(k, v, depth+1)
	if err != nil {
		return fmt.Errorf("%w: object %s: %w", ErrClaimCheck, ev.ClaimCheckLocation, err)
	}
	if len(inner) != 1 || inner[0].Kind != KindRow || inner[0].CommitTs != ev.CommitTs ||
		inner[0].Schema != ev.Schema || inner[0].Table != ev.Table {
		return fmt.Errorf("%w: object %s does not hold the row event of the record (ts %d %s.%s)",
			ErrClaimCheck, ev.ClaimCheckLocation, ev.CommitTs, ev.Schema, ev.Table)
	}
	loc := ev.ClaimCheckLocation
	*ev = inner[0]
	ev.ClaimCheckLocation = loc
	return nil
}

// ClaimCheckFileName returns the object name of a claim-check location (what tiflow's
// consumer passes to its storage: the last path element).
func ClaimCheckFileName(location string) string {
	if i := strings.LastIndexAny(location, "/\\"); i >= 0 {
		return location[i+1:]
	}
	return location
}
