package open

import (
	"encoding/base64"
	"fmt"
	"math"
	"slices"
	"unicode/utf8"

	"github.com/tidb-parity/parity/cdc/internal/values"
)

// TypeTiDBVectorFloat32 is TiDB's VECTOR(FLOAT32) type code; its value is the vector's text.
const TypeTiDBVectorFloat32 byte = 225

// typeClass groups MySQL type codes by how their value is carried.
type typeClass uint8

const (
	classUnknown typeClass = iota
	classInt               // JSON number; int64, or uint64 with the Unsigned flag
	classYear              // JSON number; int64
	classUint              // JSON number; always uint64 (BIT, ENUM, SET)
	classFloat             // FLOAT: JSON number parsed as float32
	classDouble            // DOUBLE
	classText              // JSON string kept as a string (DECIMAL, temporal, JSON, VECTOR)
	classChar              // CHAR/VARCHAR/BINARY/VARBINARY: string, Go-quoted when binary
	classBlob              // TEXT/BLOB: base64
	classNull              // type NULL: only null
)

var typeClasses = func() (t [256]typeClass) {
	for _, c := range []byte{TypeTiny, TypeShort, TypeLong, TypeLonglong, TypeInt24} {
		t[c] = classInt
	}
	t[TypeYear] = classYear
	for _, c := range []byte{TypeBit, TypeEnum, TypeSet} {
		t[c] = classUint
	}
	t[TypeFloat] = classFloat
	t[TypeDouble] = classDouble
	for _, c := range []byte{TypeDecimal, TypeNewDecimal, TypeTimestamp, TypeDate, TypeDuration, TypeDatetime,
		TypeNewDate, TypeJSON, TypeTiDBVectorFloat32} {
		t[c] = classText
	}
	for _, c := range []byte{TypeVarchar, TypeVarString, TypeString} {
		t[c] = classChar
	}
	for _, c := range []byte{TypeTinyBlob, TypeMediumBlob, TypeLongBlob, TypeBlob} {
		t[c] = classBlob
	}
	t[TypeNull] = classNull
	return t
}()

// KnownType reports whether the codec knows how the value of a column of type code t is
// carried (every type TiCDC's open protocol emits; GEOMETRY is not supported by TiDB).
func KnownType(t byte) bool { return typeClasses[t] != classUnknown }

// intRange returns the bounds of an integer column type.
func intRange(t byte) (minS int64, maxS int64, maxU uint64) {
	switch t {
	case TypeTiny:
		return -1 << 7, 1<<7 - 1, 1<<8 - 1
	case TypeShort:
		return -1 << 15, 1<<15 - 1, 1<<16 - 1
	case TypeInt24:
		return -1 << 23, 1<<23 - 1, 1<<24 - 1
	case TypeLong:
		return -1 << 31, 1<<31 - 1, 1<<32 - 1
	case TypeYear:
		return 0, 2155, 2155
	case TypeEnum:
		return 0, 0, 1<<16 - 1
	}
	return -1 << 63, 1<<63 - 1, 1<<64 - 1
}

// token is the raw JSON value of a column's "v".
type tokenKind uint8

const (
	tokNull tokenKind = iota
	tokNumber
	tokString
	tokBool
	tokOther // object or array
)

var kindNames = [...]string{"null", "number", "string", "boolean", "object or array"}

// columnValue converts a column's raw JSON value into the value documented on Column,
// held as a pending value until finish boxes it: numbers in place, text and bytes
// appended to the record's arenas. raw is the number text or the unescaped string bytes
// (which may alias a scratch buffer; the arenas never do).
func (st *decodeState) columnValue(t byte, f Flag, kind tokenKind, raw []byte) (pending, error) {
	class := typeClasses[t]
	if class == classUnknown {
		return pending{}, fmt.Errorf("%w %d", ErrUnknownType, t)
	}
	if kind == tokNull {
		return pending{}, nil
	}
	want := tokString
	switch class {
	case classInt, classYear, classUint, classFloat, classDouble:
		want = tokNumber
	case classNull:
		want = tokNull
	}
	if kind != want {
		return pending{}, fmt.Errorf("%w: type %d wants a %s, got a %s", ErrValue, t, kindNames[want], kindNames[kind])
	}
	switch class {
	case classInt, classYear:
		if class == classInt && f&FlagUnsigned != 0 {
			v, err := parseUint(t, raw)
			return pending{Kind: values.Uint, Num: v}, err
		}
		v, err := parseInt(t, raw)
		return pending{Kind: values.Int, Num: uint64(v)}, err
	case classUint:
		v, err := parseUint(t, raw)
		return pending{Kind: values.Uint, Num: v}, err
	case classFloat:
		v, err := parseFloat(raw, 32)
		if err != nil {
			return pending{}, fmt.Errorf("%w: FLOAT %s", ErrRange, raw)
		}
		return pending{Kind: values.Float, Num: math.Float64bits(v)}, nil
	case classDouble:
		v, err := parseFloat(raw, 64)
		if err != nil {
			return pending{}, fmt.Errorf("%w: DOUBLE %s", ErrRange, raw)
		}
		return pending{Kind: values.Float, Num: math.Float64bits(v)}, nil
	case classText:
		return st.appendText(raw), nil
	case classChar:
		if f&FlagBinary != 0 {
			off := len(st.bin)
			var err error
			if st.bin, err = appendUnquoted(st.bin, raw); err != nil {
				st.bin = st.bin[:off]
				return pending{}, err
			}
			return pending{Kind: values.Bytes, Off: off, End: len(st.bin)}, nil
		}
		return st.appendText(raw), nil
	case classBlob:
		dst := &st.text
		kind := values.Text
		if f&FlagBinary != 0 {
			dst, kind = &st.bin, values.Bytes
		}
		off := len(*dst)
		n := base64.StdEncoding.DecodedLen(len(raw))
		*dst = slices.Grow(*dst, n)
		m, err := strictBase64.Decode((*dst)[off:off+n], raw)
		if err != nil || !canonicalBase64(raw, m) {
			return pending{}, fmt.Errorf("%w: %v", ErrBase64, err)
		}
		*dst = (*dst)[:off+m]
		return pending{Kind: kind, Off: off, End: off + m}, nil
	}
	return pending{}, nil
}

// strictBase64 is standard padded base64 rejecting non-zero padding bits (made once:
// Strict copies the encoding).
var strictBase64 = base64.StdEncoding.Strict()

func (st *decodeState) appendText(raw []byte) pending {
	off := len(st.text)
	st.text = append(st.text, raw...)
	return pending{Kind: values.Text, Off: off, End: len(st.text)}
}

// canonicalBase64 rejects the line breaks the standard decoder skips: TiCDC (encoding/json)
// never writes them, so they mean corruption.
func canonicalBase64(raw []byte, decoded int) bool {
	return base64.StdEncoding.EncodedLen(decoded) == len(raw)
}

func isInteger(raw []byte) bool {
	for _, c := range raw {
		if c == '.' || c == 'e' || c == 'E' {
			return false
		}
	}
	return true
}

func parseInt(t byte, raw []byte) (int64, error) {
	if !isInteger(raw) {
		return 0, fmt.Errorf("%w: type %d wants an integer, got %s", ErrValue, t, raw)
	}
	v, err := atoi64(raw)
	minS, maxS, _ := intRange(t)
	if err != nil || v < minS || v > maxS {
		return 0, fmt.Errorf("%w: %s for type %d (range %d..%d)", ErrRange, raw, t, minS, maxS)
	}
	return v, nil
}

func parseUint(t byte, raw []byte) (uint64, error) {
	if !isInteger(raw) {
		return 0, fmt.Errorf("%w: type %d wants an integer, got %s", ErrValue, t, raw)
	}
	v, err := atou64(raw)
	_, _, maxU := intRange(t)
	if err != nil || v > maxU {
		return 0, fmt.Errorf("%w: %s for unsigned type %d (range 0..%d)", ErrRange, raw, t, maxU)
	}
	return v, nil
}

var errNumber = fmt.Errorf("integer overflow")

// atou64 parses a JSON integer literal (already validated by the scanner) without
// allocating.
func atou64(raw []byte) (uint64, error) {
	if len(raw) == 0 || raw[0] == '-' {
		if len(raw) == 2 && raw[1] == '0' {
			return 0, nil
		}
		return 0, errNumber
	}
	var v uint64
	for _, c := range raw {
		d := uint64(c - '0')
		if v > (1<<64-1-d)/10 {
			return 0, errNumber
		}
		v = v*10 + d
	}
	return v, nil
}

func atoi64(raw []byte) (int64, error) {
	neg := len(raw) > 0 && raw[0] == '-'
	if neg {
		raw = raw[1:]
	}
	u, err := atou64(raw)
	if err != nil {
		return 0, err
	}
	if neg {
		if u > 1<<63 {
			return 0, errNumber
		}
		return -int64(u), nil
	}
	if u > 1<<63-1 {
		return 0, errNumber
	}
	return int64(u), nil
}

// goUnquote reverses strconv.Quote without the outer quotes, as tiflow's decoder does
// with strconv.Unquote("\"" + s + "\""). The result is never nil: ” is not NULL.
func goUnquote(raw []byte) ([]byte, error) {
	return appendUnquoted(make([]byte, 0, len(raw)), raw)
}

// appendUnquoted appends goUnquote(raw) to out. It reads escapes exactly as
// strconv.UnquoteChar does (FuzzQuoted checks it against strconv.Unquote), over the
// bytes, without converting them to a string.
func appendUnquoted(out, raw []byte) ([]byte, error) {
	for i := 0; i < len(raw); {
		c := raw[i]
		switch {
		case c == '\\':
		case c == '\n':
			return out, fmt.Errorf("%w: newline", ErrQuoted)
		case c == '"':
			return out, quotedError(raw[i:])
		case c < utf8.RuneSelf:
			out = append(out, c)
			i++
			continue
		default:
			r, size := utf8.DecodeRune(raw[i:])
			if r == utf8.RuneError && size == 1 {
				out = utf8.AppendRune(out, r)
			} else {
				out = append(out, raw[i:i+size]...)
			}
			i += size
			continue
		}
		// A backslash escape.
		if i+1 >= len(raw) {
			return out, quotedError(raw[i:])
		}
		e, at := raw[i+1], i
		i += 2
		switch e {
		case 'a':
			out = append(out, '\a')
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'v':
			out = append(out, '\v')
		case '\\', '"':
			out = append(out, e)
		case 'x', 'u', 'U':
			n := 2
			if e == 'u' {
				n = 4
			} else if e == 'U' {
				n = 8
			}
			if len(raw)-i < n {
				return out, quotedError(raw[at:])
			}
			var v rune
			for _, h := range raw[i : i+n] {
				x, ok := unhex(h)
				if !ok {
					return out, quotedError(raw[at:])
				}
				v = v<<4 | x
			}
			i += n
			if e == 'x' {
				out = append(out, byte(v)) // a single byte, possibly not UTF-8
				break
			}
			if !utf8.ValidRune(v) {
				return out, quotedError(raw[at:])
			}
			out = utf8.AppendRune(out, v)
		case '0', '1', '2', '3', '4', '5', '6', '7':
			v := rune(e - '0')
			if len(raw)-i < 2 {
				return out, quotedError(raw[at:])
			}
			for _, o := range raw[i : i+2] {
				if o < '0' || o > '7' {
					return out, quotedError(raw[at:])
				}
				v = v<<3 | rune(o-'0')
			}
			i += 2
			if v > 255 {
				return out, quotedError(raw[at:])
			}
			out = append(out, byte(v))
		default:
			return out, quotedError(raw[at:])
		}
	}
	return out, nil
}

func quotedError(rest []byte) error {
	return fmt.Errorf("%w: at %q", ErrQuoted, truncate(string(rest), 12))
}

func unhex(c byte) (rune, bool) {
	switch {
	case c >= '0' && c <= '9':
		return rune(c - '0'), true
	case c >= 'a' && c <= 'f':
		return rune(c - 'a' + 10), true
	case c >= 'A' && c <= 'F':
		return rune(c - 'A' + 10), true
	}
	return 0, false
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
