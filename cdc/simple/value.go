package simple

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/tidb-parity/parity/cdc/open"
)

// intRange returns the bounds of an integer column type.
func intRange(t byte) (minS, maxS int64, maxU uint64) {
	switch t {
	case open.TypeTiny:
		return -1 << 7, 1<<7 - 1, 1<<8 - 1
	case open.TypeShort:
		return -1 << 15, 1<<15 - 1, 1<<16 - 1
	case open.TypeInt24:
		return -1 << 23, 1<<23 - 1, 1<<24 - 1
	case open.TypeLong:
		return -1 << 31, 1<<31 - 1, 1<<32 - 1
	case open.TypeYear:
		return 0, 2155, 2155
	}
	return math.MinInt64, math.MaxInt64, math.MaxUint64
}

// plainDecimal reports whether s is an optionally signed run of decimal digits (no "+",
// no leading zeros beyond a lone 0): the only form tiflow's strconv.Format* writes.
func plainDecimal(s string) bool {
	if len(s) > 0 && s[0] == '-' {
		s = s[1:]
	}
	if len(s) == 0 || (len(s) > 1 && s[0] == '0') {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// parsed is one decoded column value: the Go value for open.Column.Value and what the
// checksum hashes (for TIMESTAMP the UTC text, which differs from the value).
type parsed struct {
	value any
	hash  string // classTimestamp: the UTC text
}

// decodeValue converts the JSON value of column c (nil, a string, or for TIMESTAMP a
// {location, value} object) into the Go value documented on open.Column.
func (d *Decoder) decodeValue(c *column, raw any) (parsed, error) {
	if raw == nil {
		return parsed{}, nil
	}
	if c.class == classTimestamp {
		m, ok := raw.(map[string]any)
		if !ok {
			return parsed{}, fmt.Errorf("%w: TIMESTAMP wants a {location, value} object, got %s", ErrValue, jsonKind(raw))
		}
		return d.timestamp(m)
	}
	s, ok := raw.(string)
	if !ok {
		return parsed{}, fmt.Errorf("%w: %s column wants a string, got %s", ErrValue, typeName(c.typ), jsonKind(raw))
	}
	switch c.class {
	case classInt, classYear:
		if !plainDecimal(s) {
			return parsed{}, fmt.Errorf("%w: %q is not an integer", ErrValue, s)
		}
		minS, maxS, maxU := intRange(c.typ)
		if c.flags&open.FlagUnsigned != 0 && c.class == classInt {
			v, err := strconv.ParseUint(s, 10, 64)
			if err != nil || v > maxU {
				return parsed{}, fmt.Errorf("%w: %s for unsigned %s (0..%d)", ErrRange, s, typeName(c.typ), maxU)
			}
			return parsed{value: v}, nil
		}
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil || v < minS || v > maxS {
			return parsed{}, fmt.Errorf("%w: %s for %s (%d..%d)", ErrRange, s, typeName(c.typ), minS, maxS)
		}
		return parsed{value: v}, nil
	case classUint:
		if !plainDecimal(s) || s[0] == '-' {
			return parsed{}, fmt.Errorf("%w: %q is not an unsigned integer", ErrValue, s)
		}
		v, err := strconv.ParseUint(s, 10, 64)
		var limit uint64 = math.MaxUint64
		switch c.typ {
		case open.TypeEnum:
			limit = uint64(c.elements)
		case open.TypeSet:
			if c.elements < 64 {
				limit = 1<<c.elements - 1
			}
		case open.TypeBit:
			if c.bits < 64 {
				limit = 1<<c.bits - 1
			}
		}
		if err != nil || v > limit {
			return parsed{}, fmt.Errorf("%w: %s for %s (0..%d)", ErrRange, s, typeName(c.typ), limit)
		}
		return parsed{value: v}, nil
	case classFloat:
		v, err := strconv.ParseFloat(s, 32)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
			return parsed{}, fmt.Errorf("%w: %q is not a FLOAT", ErrValue, s)
		}
		return parsed{value: v}, nil
	case classDouble:
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
			return parsed{}, fmt.Errorf("%w: %q is not a DOUBLE", ErrValue, s)
		}
		return parsed{value: v}, nil
	case classText:
		return parsed{value: s}, nil
	case classString:
		if c.flags&open.FlagBinary != 0 {
			b, err := base64.StdEncoding.Strict().DecodeString(s)
			if err != nil || base64.StdEncoding.EncodedLen(len(b)) != len(s) {
				return parsed{}, fmt.Errorf("%w: binary value is not standard padded base64", ErrValue)
			}
			if b == nil {
				b = []byte{} // '' is not NULL
			}
			return parsed{value: b}, nil
		}
		return parsed{value: s}, nil
	}
	return parsed{}, fmt.Errorf("%w: type %d", ErrUnknownType, c.typ)
}

// timestamp decodes TiCDC's {location, value}: value is the TIMESTAMP's text in
// location (TiCDC's time zone). The checksum hashes it in UTC; the event carries it in
// DecoderConfig.TimeZone, or as sent when that is nil.
func (d *Decoder) timestamp(m map[string]any) (parsed, error) {
	locName, ok1 := m["location"].(string)
	text, ok2 := m["value"].(string)
	if !ok1 || !ok2 || len(m) != 2 {
		return parsed{}, fmt.Errorf("%w: TIMESTAMP wants {\"location\": string, \"value\": string}", ErrValue)
	}
	tm, frac, zero, err := parseDatetime(text)
	if err != nil {
		return parsed{}, fmt.Errorf("%w: TIMESTAMP %q: %v", ErrValue, text, err)
	}
	loc, err := loadLocation(locName)
	if err != nil {
		return parsed{}, fmt.Errorf("%w: TIMESTAMP location %q: %v", ErrValue, locName, err)
	}
	if zero {
		return parsed{value: text, hash: text}, nil
	}
	local := time.Date(tm.Year(), tm.Month(), tm.Day(), tm.Hour(), tm.Minute(), tm.Second(), tm.Nanosecond(), loc)
	out := parsed{value: text, hash: formatDatetime(local.UTC(), frac)}
	if d.cfg.TimeZone != nil && d.cfg.TimeZone.String() != loc.String() {
		out.value = formatDatetime(local.In(d.cfg.TimeZone), frac)
	}
	return out, nil
}

var locations sync.Map // name → *time.Location

func loadLocation(name string) (*time.Location, error) {
	if l, ok := locations.Load(name); ok {
		return l.(*time.Location), nil
	}
	if name == "" {
		return nil, fmt.Errorf("empty location")
	}
	l, err := time.LoadLocation(name)
	if err != nil {
		return nil, err
	}
	locations.Store(name, l)
	return l, nil
}

var errDatetime = errors.New("want YYYY-MM-DD HH:MM:SS[.ffffff]")

// parseDatetime parses "YYYY-MM-DD HH:MM:SS[.f{1,6}]" strictly (a time.Time in UTC holding
// the fields, and the number of fractional digits). "0000-00-00 00:00:00[.0…]" is TiDB's
// zero TIMESTAMP.
func parseDatetime(s string) (t time.Time, frac int, zero bool, err error) {
	bad := errDatetime
	if len(s) < 19 || s[4] != '-' || s[7] != '-' || s[10] != ' ' || s[13] != ':' || s[16] != ':' {
		return t, 0, false, bad
	}
	num := func(a, b int) (int, bool) {
		v := 0
		for i := a; i < b; i++ {
			if s[i] < '0' || s[i] > '9' {
				return 0, false
			}
			v = v*10 + int(s[i]-'0')
		}
		return v, true
	}
	y, ok1 := num(0, 4)
	mo, ok2 := num(5, 7)
	da, ok3 := num(8, 10)
	h, ok4 := num(11, 13)
	mi, ok5 := num(14, 16)
	se, ok6 := num(17, 19)
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6) {
		return t, 0, false, bad
	}
	ns := 0
	if len(s) > 19 {
		frac = len(s) - 20
		if s[19] != '.' || frac < 1 || frac > 6 {
			return t, 0, false, bad
		}
		f, ok := num(20, len(s))
		if !ok {
			return t, 0, false, bad
		}
		ns = f
		for range 9 - frac {
			ns *= 10
		}
	}
	if y == 0 && mo == 0 && da == 0 && h == 0 && mi == 0 && se == 0 && ns == 0 {
		return t, frac, true, nil
	}
	if mo < 1 || mo > 12 || da < 1 || da > 31 || h > 23 || mi > 59 || se > 59 {
		return t, 0, false, fmt.Errorf("field out of range")
	}
	t = time.Date(y, time.Month(mo), da, h, mi, se, ns, time.UTC)
	if t.Day() != da {
		return t, 0, false, fmt.Errorf("no day %d in %04d-%02d", da, y, mo)
	}
	return t, frac, false, nil
}

// formatDatetime writes t as TiDB's Time.String with frac fractional digits.
func formatDatetime(t time.Time, frac int) string {
	return string(appendDatetime(make([]byte, 0, 26), t, frac))
}

// appendDatetime appends formatDatetime's text to b.
func appendDatetime(b []byte, t time.Time, frac int) []byte {
	b = appendPadded(b, t.Year(), 4)
	b = append(b, '-')
	b = appendPadded(b, int(t.Month()), 2)
	b = append(b, '-')
	b = appendPadded(b, t.Day(), 2)
	b = append(b, ' ')
	b = appendPadded(b, t.Hour(), 2)
	b = append(b, ':')
	b = appendPadded(b, t.Minute(), 2)
	b = append(b, ':')
	b = appendPadded(b, t.Second(), 2)
	if frac > 0 {
		b = append(b, '.')
		ns := t.Nanosecond()
		for range 9 - frac {
			ns /= 10
		}
		b = appendPadded(b, ns, frac)
	}
	return b
}

func appendPadded(b []byte, v, width int) []byte {
	var buf [20]byte
	s := strconv.AppendInt(buf[:0], int64(v), 10)
	for range width - len(s) {
		b = append(b, '0')
	}
	return append(b, s...)
}

// appendChecksumBytes appends what TiDB's rowcodec hashes for one non-NULL value
// (util/rowcodec appendDatumForChecksum, as tiflow's verify_checksum.go reproduces it).
func appendChecksumBytes(buf []byte, c *column, p parsed) []byte {
	switch c.class {
	case classInt, classYear:
		switch v := p.value.(type) {
		case int64:
			return binary.LittleEndian.AppendUint64(buf, uint64(v))
		case uint64:
			return binary.LittleEndian.AppendUint64(buf, v)
		}
	case classUint:
		return binary.LittleEndian.AppendUint64(buf, p.value.(uint64))
	case classFloat, classDouble:
		return binary.LittleEndian.AppendUint64(buf, math.Float64bits(p.value.(float64)))
	case classTimestamp:
		return appendLengthValue(buf, p.hash)
	case classText:
		return appendLengthValue(buf, p.value.(string))
	case classString:
		switch v := p.value.(type) {
		case string:
			return appendLengthValue(buf, v)
		case []byte:
			buf = binary.LittleEndian.AppendUint32(buf, uint32(len(v)))
			return append(buf, v...)
		}
	}
	return buf
}

func appendLengthValue(buf []byte, s string) []byte {
	buf = binary.LittleEndian.AppendUint32(buf, uint32(len(s)))
	return append(buf, s...)
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case float64:
		return "a number"
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	}
	return fmt.Sprintf("%T", v)
}

var typeNames = map[byte]string{
	open.TypeTiny: "TINYINT", open.TypeShort: "SMALLINT", open.TypeInt24: "MEDIUMINT", open.TypeLong: "INT",
	open.TypeLonglong: "BIGINT", open.TypeYear: "YEAR", open.TypeFloat: "FLOAT", open.TypeDouble: "DOUBLE",
	open.TypeNewDecimal: "DECIMAL", open.TypeDate: "DATE", open.TypeDatetime: "DATETIME", open.TypeTimestamp: "TIMESTAMP",
	open.TypeDuration: "TIME", open.TypeVarchar: "VARCHAR", open.TypeString: "CHAR", open.TypeTinyBlob: "TINYBLOB",
	open.TypeBlob: "BLOB", open.TypeMediumBlob: "MEDIUMBLOB", open.TypeLongBlob: "LONGBLOB", open.TypeBit: "BIT",
	open.TypeEnum: "ENUM", open.TypeSet: "SET", open.TypeJSON: "JSON",
}

func typeName(t byte) string {
	if n, ok := typeNames[t]; ok {
		return n
	}
	return "type " + strconv.Itoa(int(t))
}
