package rowkey

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Key is a row key in its exact, decodable form: the values of a table's key columns in
// column order, each type-tagged (1, '1' and X'31' are three keys; NULL is its own), in
// a binary encoding whose byte order is the values' order for integers and floats and
// byte order for strings. It is what is stored (the dirty-key ledger, differences) and
// compared byte for byte; for "the same key under the column's collation" fold it with
// Append instead.
type Key []byte

// tagString marks an exact (unfolded) character string; tagBytes a binary one.
const tagString = 0x08

// Encode returns the key of values (nil, int64, uint64, float64, string, []byte).
func Encode(values ...any) (Key, error) {
	var k []byte
	for i, v := range values {
		var err error
		if k, err = appendExact(k, v); err != nil {
			return nil, fmt.Errorf("key column %d: %w", i, err)
		}
	}
	return Key(k), nil
}

func appendExact(dst []byte, v any) ([]byte, error) {
	switch v := v.(type) {
	case nil:
		return append(dst, tagNull), nil
	case int64:
		return binary.BigEndian.AppendUint64(append(dst, tagInt), uint64(v)^(1<<63)), nil
	case uint64:
		return binary.BigEndian.AppendUint64(append(dst, tagUint), v), nil
	case float64:
		if v == 0 {
			v = 0 // -0 = 0
		}
		b := math.Float64bits(v)
		if b&(1<<63) != 0 {
			b = ^b // negative: larger magnitude sorts first
		} else {
			b |= 1 << 63
		}
		return binary.BigEndian.AppendUint64(append(dst, tagFloat), b), nil
	case string:
		return appendText(append(dst, tagString), v), nil
	case []byte:
		return appendText(append(dst, tagBytes), v), nil
	}
	return dst, fmt.Errorf("a %T cannot be a key value", v)
}

// ErrCorrupt is returned by Values for bytes that are not a Key's encoding.
var ErrCorrupt = errors.New("corrupt row key")

// Values decodes the key.
func (k Key) Values() ([]any, error) {
	var out []any
	b := []byte(k)
	for len(b) > 0 {
		tag := b[0]
		b = b[1:]
		switch tag {
		case tagNull:
			out = append(out, nil)
		case tagInt, tagUint, tagFloat:
			if len(b) < 8 {
				return nil, fmt.Errorf("%w: value %d truncated", ErrCorrupt, len(out))
			}
			u := binary.BigEndian.Uint64(b)
			b = b[8:]
			switch tag {
			case tagInt:
				out = append(out, int64(u^(1<<63)))
			case tagUint:
				out = append(out, u)
			default:
				if u&(1<<63) != 0 {
					u &^= 1 << 63
				} else {
					u = ^u
				}
				out = append(out, math.Float64frombits(u))
			}
		case tagString, tagBytes:
			var raw []byte
			var ok bool
			raw, b, ok = readText(b)
			if !ok {
				return nil, fmt.Errorf("%w: value %d unterminated or badly escaped", ErrCorrupt, len(out))
			}
			if tag == tagString {
				out = append(out, string(raw))
			} else {
				out = append(out, raw)
			}
		default:
			return nil, fmt.Errorf("%w: unknown tag 0x%02x at value %d", ErrCorrupt, tag, len(out))
		}
	}
	return out, nil
}

// readText reads an escaped, terminated text (see appendText).
func readText(b []byte) (text, rest []byte, ok bool) {
	out := []byte{}
	for i := 0; i < len(b); i++ {
		if b[i] != 0 {
			out = append(out, b[i])
			continue
		}
		if i+1 >= len(b) {
			return nil, nil, false
		}
		switch b[i+1] {
		case 0xFF:
			out = append(out, 0)
			i++
		case 0x01:
			return out, b[i+2:], true
		default:
			return nil, nil, false
		}
	}
	return nil, nil, false
}

// String is the key's text form for reports and logs: its values as SQL literals,
// comma separated ("7", "'a”b', NULL", "X'00FF'"). Row values never go into logs: log a
// key only where the key itself is not confidential.
func (k Key) String() string {
	vals, err := k.Values()
	if err != nil {
		return "<" + err.Error() + ": " + hex.EncodeToString(k) + ">"
	}
	return Text(vals...)
}

// Text renders values as Key.String does.
func Text(values ...any) string {
	var sb strings.Builder
	for i, v := range values {
		if i > 0 {
			sb.WriteString(", ")
		}
		switch v := v.(type) {
		case nil:
			sb.WriteString("NULL")
		case int64:
			sb.WriteString(strconv.FormatInt(v, 10))
		case uint64:
			sb.WriteString(strconv.FormatUint(v, 10))
		case float64:
			sb.WriteString(strconv.FormatFloat(v, 'g', -1, 64))
		case string:
			if printable(v) {
				sb.WriteString("'" + strings.ReplaceAll(v, "'", "''") + "'")
			} else {
				sb.WriteString("_utf8mb4 X'" + strings.ToUpper(hex.EncodeToString([]byte(v))) + "'")
			}
		case []byte:
			sb.WriteString("X'" + strings.ToUpper(hex.EncodeToString(v)) + "'")
		default:
			fmt.Fprintf(&sb, "%v", v)
		}
	}
	return sb.String()
}

// printable reports text that reads the same as a quoted literal: valid UTF-8 without
// control characters or backslashes.
func printable(s string) bool {
	if !strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7F || r == '\\' || r == 0xFFFD }) {
		return true
	}
	return false
}

// Compare orders keys by their encoding (bytes.Compare).
func Compare(a, b Key) int { return bytes.Compare(a, b) }
