package simple

import (
	"encoding/base64"
	"encoding/binary"
	"hash/crc32"
	"math"
	"strconv"
	"time"

	"github.com/tidb-parity/parity/cdc/internal/jsonscan"
	"github.com/tidb-parity/parity/cdc/internal/rowbuf"
	"github.com/tidb-parity/parity/cdc/open"
)

// strictBase64 is what decodeValue decodes binary values with (made once: Strict
// returns a new Encoding).
var strictBase64 = base64.StdEncoding.Strict()

// image reads the row image (an object) at the scanner's position into the builder, in
// table column order, as Decoder.image does, and returns its checksum.
func (st *state) image(d *Decoder, t *table, handleOnly bool, out *byteRange) (uint32, bool) {
	if handleOnly && len(t.handle) == 0 {
		return 0, false
	}
	sc := &st.sc
	b := &st.b
	base := len(b.Cols)
	for i := range t.cols {
		c := &t.cols[i]
		b.Add(c.name, c.typ, c.flags)
	}
	if cap(st.present) < len(t.cols) {
		st.present = make([]bool, len(t.cols))
	}
	present := st.present[:len(t.cols)]
	clear(present)
	st.tsHash, st.tsSpans = st.tsHash[:0], st.tsSpans[:0]
	if sc.Expect('{') != nil {
		return 0, false
	}
	next := 0 // the member expected next: t.sorted[next]
	for first := true; ; first = false {
		i := -1
		if next < len(t.sorted) {
			i = t.sorted[next]
		}
		// The expected column, written as TiCDC writes it, is recognized by comparing
		// bytes; anything else is read and looked up.
		if i < 0 || !t.cols[i].plain || !sc.MemberIs(first, t.cols[i].name) {
			name, more, err := sc.Member(first)
			if err != nil {
				return 0, false
			}
			if !more {
				break
			}
			if i < 0 || t.cols[i].name != string(name) {
				var ok bool
				if i, ok = t.byName[string(name)]; !ok {
					return 0, false
				}
			}
		}
		next = t.rank[i] + 1
		if present[i] {
			return 0, false
		}
		present[i] = true
		if sc.Null() {
			continue
		}
		if !st.value(d, &t.cols[i], base+i) {
			return 0, false
		}
	}
	// The checksum, over the non-NULL values in table order.
	h := st.hash[:0]
	for i := range t.cols {
		if !present[i] {
			if handleOnly && t.cols[i].flags&open.FlagHandleKey == 0 {
				continue
			}
			return 0, false
		}
		h = st.appendHash(h, &t.cols[i], base+i, b.Vals[base+i])
	}
	st.hash = h
	sum := crc32.ChecksumIEEE(h)
	// Columns a handle-key-only image does not carry are not in the event.
	n := base
	for i := range t.cols {
		if present[i] {
			b.Cols[n], b.Vals[n] = b.Cols[base+i], b.Vals[base+i]
			n++
		}
	}
	b.Truncate(n)
	*out = byteRange{base, n}
	return sum, true
}

// appendHash is appendChecksumBytes for value v of builder column at.
func (st *state) appendHash(h []byte, c *column, at int, v rowbuf.Value) []byte {
	b := &st.b
	switch v.Kind {
	case rowbuf.Null:
		return h
	case rowbuf.Int, rowbuf.Uint, rowbuf.Float:
		return binary.LittleEndian.AppendUint64(h, v.Num)
	case rowbuf.Bytes:
		h = binary.LittleEndian.AppendUint32(h, uint32(v.End-v.Off))
		return append(h, b.Bin[v.Off:v.End]...)
	}
	text := b.Text[v.Off:v.End]
	if c.class == classTimestamp {
		for _, s := range st.tsSpans {
			if s.col == at {
				text = st.tsHash[s.off:s.end]
			}
		}
	}
	h = binary.LittleEndian.AppendUint32(h, uint32(len(text)))
	return append(h, text...)
}

// value reads column c's non-null value into b.Vals[at], as decodeValue converts it.
func (st *state) value(d *Decoder, c *column, at int) bool {
	sc := &st.sc
	b := &st.b
	v := &b.Vals[at]
	switch c.class {
	case classTimestamp:
		return st.timestamp(d, c, at)
	case classText:
		off := len(b.Text)
		var err error
		if b.Text, err = sc.AppendStr(b.Text); err != nil {
			return false
		}
		*v = rowbuf.Value{Kind: rowbuf.Text, Off: off, End: len(b.Text)}
		return true
	case classString:
		if c.flags&open.FlagBinary == 0 {
			off := len(b.Text)
			var err error
			if b.Text, err = sc.AppendStr(b.Text); err != nil {
				return false
			}
			*v = rowbuf.Value{Kind: rowbuf.Text, Off: off, End: len(b.Text)}
			return true
		}
		s, err := sc.Str()
		if err != nil {
			return false
		}
		off := len(b.Bin)
		b.Bin = append(b.Bin, make([]byte, strictBase64.DecodedLen(len(s)))...)
		n, err := strictBase64.Decode(b.Bin[off:], s)
		if err != nil || base64.StdEncoding.EncodedLen(n) != len(s) {
			return false
		}
		b.Bin = b.Bin[:off+n]
		*v = rowbuf.Value{Kind: rowbuf.Bytes, Off: off, End: off + n}
		return true
	}
	s, err := sc.Str()
	if err != nil {
		return false
	}
	switch c.class {
	case classInt, classYear:
		if !plainDecimalBytes(s) {
			return false
		}
		minS, maxS, maxU := intRange(c.typ)
		if c.flags&open.FlagUnsigned != 0 && c.class == classInt {
			x, ok := jsonscan.ParseUint(s)
			if !ok || x > maxU {
				return false
			}
			*v = rowbuf.Value{Kind: rowbuf.Uint, Num: x}
			return true
		}
		x, ok := jsonscan.ParseInt(s)
		if !ok || x < minS || x > maxS {
			return false
		}
		*v = rowbuf.Value{Kind: rowbuf.Int, Num: uint64(x)}
	case classUint:
		if !plainDecimalBytes(s) || s[0] == '-' {
			return false
		}
		x, ok := jsonscan.ParseUint(s)
		if !ok || x > uintLimit(c) {
			return false
		}
		*v = rowbuf.Value{Kind: rowbuf.Uint, Num: x}
	case classFloat, classDouble:
		bits := 64
		if c.class == classFloat {
			bits = 32
		}
		x, err := strconv.ParseFloat(string(s), bits)
		if err != nil || math.IsNaN(x) || math.IsInf(x, 0) {
			return false
		}
		*v = rowbuf.Value{Kind: rowbuf.Float, Num: math.Float64bits(x)}
	default:
		return false
	}
	return true
}

// uintLimit is the largest value of an ENUM, SET or BIT column.
func uintLimit(c *column) uint64 {
	switch c.typ {
	case open.TypeEnum:
		return uint64(c.elements)
	case open.TypeSet:
		if c.elements < 64 {
			return 1<<c.elements - 1
		}
	case open.TypeBit:
		if c.bits < 64 {
			return 1<<c.bits - 1
		}
	}
	return math.MaxUint64
}

// plainDecimalBytes is plainDecimal of a byte slice.
func plainDecimalBytes(s []byte) bool {
	if len(s) > 0 && s[0] == '-' {
		s = s[1:]
	}
	if len(s) == 0 || (len(s) > 1 && s[0] == '0') {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// timestamp reads a TIMESTAMP's {location, value} as Decoder.timestamp does: the value
// goes to the builder, the UTC text it is checksummed as to st.tsHash.
func (st *state) timestamp(d *Decoder, c *column, at int) bool {
	sc := &st.sc
	b := &st.b
	if sc.Expect('{') != nil {
		return false
	}
	var loc *time.Location
	text := -1 // where the value's text starts in b.Text
	for first := true; ; first = false {
		name, more, err := sc.Member(first)
		if err != nil {
			return false
		}
		if !more {
			break
		}
		switch string(name) {
		case "location":
			if loc != nil {
				return false
			}
			s, err := sc.Str()
			if err != nil {
				return false
			}
			if loc = st.locs[string(s)]; loc == nil {
				if loc, err = loadLocation(string(s)); err != nil {
					return false
				}
				st.locs[string(s)] = loc
			}
		case "value":
			if text >= 0 {
				return false
			}
			text = len(b.Text)
			if b.Text, err = sc.AppendStr(b.Text); err != nil {
				return false
			}
		default:
			return false
		}
	}
	if loc == nil || text < 0 {
		return false
	}
	raw := b.Text[text:]
	tm, frac, zero, err := parseDatetime(string(raw))
	if err != nil {
		return false
	}
	hashOff := len(st.tsHash)
	if zero {
		st.tsHash = append(st.tsHash, raw...)
	} else {
		local := time.Date(tm.Year(), tm.Month(), tm.Day(), tm.Hour(), tm.Minute(), tm.Second(), tm.Nanosecond(), loc)
		st.tsHash = appendDatetime(st.tsHash, local.UTC(), frac)
		if d.cfg.TimeZone != nil && d.cfg.TimeZone.String() != loc.String() {
			b.Text = appendDatetime(b.Text[:text], local.In(d.cfg.TimeZone), frac)
		}
	}
	st.tsSpans = append(st.tsSpans, tsSpan{col: at, off: hashOff, end: len(st.tsHash)})
	b.Vals[at] = rowbuf.Value{Kind: rowbuf.Text, Off: text, End: len(b.Text)}
	return true
}
