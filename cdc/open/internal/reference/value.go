package reference

import (
	"encoding/base64"
	"fmt"
	"strconv"
	"unicode/utf8"
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

// columnValue converts a column's raw JSON value into the Go value documented on Column.
// raw is the number text or the unescaped string bytes (which may alias a scratch buffer;
// the result never does).
func columnValue(t byte, f Flag, kind tokenKind, raw []byte) (any, error) {
	class := typeClasses[t]
	if class == classUnknown {
		return nil, fmt.Errorf("%w %d", ErrUnknownType, t)
	}
	if kind == tokNull {
		return nil, nil
	}
	want := tokString
	switch class {
	case classInt, classYear, classUint, classFloat, classDouble:
		want = tokNumber
	case classNull:
		want = tokNull
	}
	if kind != want {
		return nil, fmt.Errorf("%w: type %d wants a %s, got a %s", ErrValue, t, kindNames[want], kindNames[kind])
	}
	switch class {
	case classInt, classYear:
		if class == classInt && f&FlagUnsigned != 0 {
			return parseUint(t, raw)
		}
		return parseInt(t, raw)
	case classUint:
		return parseUint(t, raw)
	case classFloat:
		v, err := strconv.ParseFloat(string(raw), 32)
		if err != nil {
			return nil, fmt.Errorf("%w: FLOAT %s", ErrRange, raw)
		}
		return v, nil
	case classDouble:
		v, err := strconv.ParseFloat(string(raw), 64)
		if err != nil {
			return nil, fmt.Errorf("%w: DOUBLE %s", ErrRange, raw)
		}
		return v, nil
	case classText:
		return string(raw), nil
	case classChar:
		if f&FlagBinary != 0 {
			return goUnquote(raw)
		}
		return string(raw), nil
	case classBlob:
		n := base64.StdEncoding.DecodedLen(len(raw))
		out := make([]byte, n)
		m, err := base64.StdEncoding.Strict().Decode(out, raw)
		if err != nil || !canonicalBase64(raw, m) {
			return nil, fmt.Errorf("%w: %v", ErrBase64, err)
		}
		if f&FlagBinary != 0 {
			return out[:m], nil
		}
		return string(out[:m]), nil
	}
	return nil, nil
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

func parseInt(t byte, raw []byte) (any, error) {
	if !isInteger(raw) {
		return nil, fmt.Errorf("%w: type %d wants an integer, got %s", ErrValue, t, raw)
	}
	v, err := atoi64(raw)
	minS, maxS, _ := intRange(t)
	if err != nil || v < minS || v > maxS {
		return nil, fmt.Errorf("%w: %s for type %d (range %d..%d)", ErrRange, raw, t, minS, maxS)
	}
	return v, nil
}

func parseUint(t byte, raw []byte) (any, error) {
	if !isInteger(raw) {
		return nil, fmt.Errorf("%w: type %d wants an integer, got %s", ErrValue, t, raw)
	}
	v, err := atou64(raw)
	_, _, maxU := intRange(t)
	if err != nil || v > maxU {
		return nil, fmt.Errorf("%w: %s for unsigned type %d (range 0..%d)", ErrRange, raw, t, maxU)
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
// with strconv.Unquote("\"" + s + "\"").
func goUnquote(raw []byte) ([]byte, error) {
	plain := true
	for _, c := range raw {
		if c == '\\' || c == '"' || c == '\n' {
			plain = false
			break
		}
	}
	if plain && utf8.Valid(raw) {
		out := make([]byte, len(raw)) // non-nil even when empty: '' is not NULL
		copy(out, raw)
		return out, nil
	}
	out := make([]byte, 0, len(raw))
	s := string(raw)
	for len(s) > 0 {
		if s[0] == '\n' {
			return nil, fmt.Errorf("%w: newline", ErrQuoted)
		}
		r, multibyte, tail, err := strconv.UnquoteChar(s, '"')
		if err != nil {
			return nil, fmt.Errorf("%w: at %q", ErrQuoted, truncate(s, 12))
		}
		s = tail
		if r < utf8.RuneSelf || !multibyte {
			out = append(out, byte(r))
		} else {
			out = utf8.AppendRune(out, r)
		}
	}
	return out, nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
