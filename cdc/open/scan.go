package open

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unicode/utf16"
	"unicode/utf8"
)

// scanner is a small JSON scanner for the fixed shapes of the open protocol (keys, row
// values, DDL values). encoding/json's token API allocates per token and is several times
// slower; this reads members in message order without building a tree, and never
// allocates from a length it has not checked against the input.
//
// Strings are returned as byte slices that alias either the input or a scratch buffer,
// valid until the next string read into the same buffer.
type scanner struct {
	data []byte
	pos  int
	sbuf []byte // scratch for unescaped string values
	nbuf []byte // scratch for unescaped member names
}

// maxDepth bounds the nesting of skipped (unknown) values.
const maxDepth = 64

// syntaxError is a scanner failure at a byte position of the JSON text.
type syntaxError struct {
	pos int
	msg string
	err error // sentinel, ErrSyntax unless stated
}

func (e *syntaxError) Error() string { return e.msg }
func (e *syntaxError) Unwrap() error { return e.err }

func (s *scanner) errorf(format string, args ...any) error {
	return &syntaxError{pos: s.pos, msg: fmt.Sprintf(format, args...), err: ErrSyntax}
}

// ws skips white space. TiCDC writes none, so the first test nearly always ends it.
func (s *scanner) ws() {
	if s.pos < len(s.data) && s.data[s.pos] > ' ' {
		return
	}
	s.wsSlow()
}

func (s *scanner) wsSlow() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// peek returns the next non-space byte, or 0 at the end of input.
func (s *scanner) peek() byte {
	s.ws()
	if s.pos >= len(s.data) {
		return 0
	}
	return s.data[s.pos]
}

func (s *scanner) describe() string {
	if s.pos >= len(s.data) {
		return "end of input"
	}
	c := s.data[s.pos]
	if c >= 0x20 && c < 0x7f {
		return fmt.Sprintf("%q", c)
	}
	return fmt.Sprintf("byte 0x%02x", c)
}

func (s *scanner) expect(c byte) error {
	if s.peek() != c {
		return s.errorf("expected %q, found %s", c, s.describe())
	}
	s.pos++
	return nil
}

// end checks that only white space follows the top-level value.
func (s *scanner) end() error {
	if s.peek() != 0 || s.pos < len(s.data) {
		return s.errorf("unexpected %s after the JSON value", s.describe())
	}
	return nil
}

// member reads the next member name of an object whose '{' was consumed, and the ':'
// after it. ok is false at the closing '}' (which is consumed).
func (s *scanner) member(first bool) (name []byte, ok bool, err error) {
	// Fast path, what TiCDC writes: no white space, and an ASCII name without escapes
	// directly followed by ':'. Anything else takes the general path below.
	data, i := s.data, s.pos
	if !first && i < len(data) && data[i] == ',' {
		i++
	}
	if i < len(data) && data[i] == '"' && (first || i > s.pos) {
		j := i + 1
		for j < len(data) && plainASCII[data[j]] {
			j++
		}
		if j+1 < len(data) && data[j] == '"' && data[j+1] == ':' {
			s.pos = j + 2
			return data[i+1 : j], true, nil
		}
	}
	c := s.peek()
	if c == '}' {
		s.pos++
		return nil, false, nil
	}
	if !first {
		if c != ',' {
			return nil, false, s.errorf("expected ',' or '}' in object, found %s", s.describe())
		}
		s.pos++
		c = s.peek()
	}
	if c != '"' {
		return nil, false, s.errorf("expected member name, found %s", s.describe())
	}
	name, s.nbuf, err = s.str(s.nbuf[:0])
	if err != nil {
		return nil, false, err
	}
	if err := s.expect(':'); err != nil {
		return nil, false, err
	}
	return name, true, nil
}

// str reads a JSON string at s.pos (which must be '"'). Without escapes it returns a
// slice of the input; otherwise it unescapes into buf. Invalid UTF-8 becomes U+FFFD, as
// in encoding/json.
func (s *scanner) str(buf []byte) (out, scratch []byte, err error) {
	s.pos++ // opening quote
	start := s.pos
	data := s.data
	i := s.pos
	// Eight bytes at a time while none of them is special ('"', '\\', a control
	// character or a byte of a multi-byte sequence).
	for len(data)-i >= 8 && !special8(binary.LittleEndian.Uint64(data[i:])) {
		i += 8
	}
	for i < len(data) {
		c := data[i]
		if c == '"' {
			s.pos = i + 1
			return data[start:i], buf, nil
		}
		if !plainASCII[c] {
			break
		}
		i++
	}
	buf = append(buf, data[start:i]...)
	for i < len(data) {
		c := data[i]
		switch {
		case c == '"':
			s.pos = i + 1
			return buf, buf, nil
		case c < 0x20:
			s.pos = i
			return nil, buf, s.errorf("control character 0x%02x in string", c)
		case c == '\\':
			if i+1 >= len(data) {
				s.pos = i
				return nil, buf, s.errorf("unterminated escape in string")
			}
			e := data[i+1]
			if u := unescapes[e]; u != 0 {
				buf = append(buf, u)
				i += 2
				break
			}
			if e != 'u' {
				s.pos = i
				return nil, buf, s.errorf("invalid escape \\%c in string", e)
			}
			r, ok := hex4(data, i+2)
			if !ok {
				s.pos = i
				return nil, buf, s.errorf("invalid \\u escape in string")
			}
			i += 6
			if utf16.IsSurrogate(r) {
				r2, ok2 := rune(-1), false
				if i+1 < len(data) && data[i] == '\\' && data[i+1] == 'u' {
					r2, ok2 = hex4(data, i+2)
				}
				if ok2 {
					if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
						i += 6
						buf = utf8.AppendRune(buf, dec)
						break
					}
				}
				r = utf8.RuneError
			}
			buf = utf8.AppendRune(buf, r)
		case c < utf8.RuneSelf:
			buf = append(buf, c)
			i++
		default:
			r, size := utf8.DecodeRune(data[i:])
			if r == utf8.RuneError && size == 1 {
				buf = utf8.AppendRune(buf, utf8.RuneError)
			} else {
				buf = append(buf, data[i:i+size]...)
			}
			i += size
		}
	}
	s.pos = len(data)
	return nil, buf, s.errorf("unterminated string")
}

// plainASCII is true for the bytes a JSON string holds as they are: printable ASCII
// other than '"' and '\\'.
var plainASCII = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// special8 reports whether any of the eight bytes in w is '"', '\\', below 0x20 or at
// least 0x80 (the classic "has a zero byte" and "has a byte less than n" bit tricks:
// exact about whether such a byte exists, not where).
func special8(w uint64) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	quote := w ^ (ones * '"')
	backslash := w ^ (ones * '\\')
	return ((quote-ones)&^quote|(backslash-ones)&^backslash|(w-ones*0x20)|w)&highs != 0
}

// unescapes maps the byte after a backslash to the byte it stands for; 0 where it is not
// a two-byte escape.
var unescapes = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

func hex4(data []byte, i int) (rune, bool) {
	if i+4 > len(data) {
		return 0, false
	}
	var r rune
	for _, c := range data[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// number reads a JSON number literal and returns its text.
func (s *scanner) number() ([]byte, error) {
	data := s.data
	start := s.pos
	i := start
	if i < len(data) && data[i] == '-' {
		i++
	}
	if i >= len(data) {
		s.pos = i
		return nil, s.errorf("truncated number")
	}
	switch c := data[i]; {
	case c == '0':
		i++
	case c >= '1' && c <= '9':
		i = skipDigits(data, i)
	default:
		s.pos = i
		return nil, s.errorf("invalid number")
	}
	if i < len(data) && data[i] == '.' {
		d := i + 1
		if i = skipDigits(data, d); i == d {
			s.pos = i
			return nil, s.errorf("invalid number: no digits after '.'")
		}
	}
	if i < len(data) && (data[i] == 'e' || data[i] == 'E') {
		i++
		if i < len(data) && (data[i] == '+' || data[i] == '-') {
			i++
		}
		d := i
		if i = skipDigits(data, d); i == d {
			s.pos = i
			return nil, s.errorf("invalid number: no exponent digits")
		}
	}
	s.pos = i
	return data[start:i], nil
}

// smallUint reads a non-negative integer of at most 18 digits that is a whole JSON
// number (not followed by a fraction, an exponent or another digit), as column types,
// flags and the like are. ok is false, and nothing is consumed, for anything else.
func (s *scanner) smallUint() (v uint64, ok bool) {
	data, i := s.data, s.pos
	end := min(len(data), i+19)
	for ; i < end; i++ {
		c := data[i]
		if c < '0' || c > '9' {
			break
		}
		v = v*10 + uint64(c-'0')
	}
	n := i - s.pos
	if n == 0 || n > 18 || (n > 1 && data[s.pos] == '0') {
		return 0, false
	}
	if i < len(data) {
		if c := data[i]; c == '.' || c == 'e' || c == 'E' || (c >= '0' && c <= '9') {
			return 0, false
		}
	}
	s.pos = i
	return v, true
}

// skipDigits returns the index of the first byte at or after i that is not a decimal digit.
func skipDigits(data []byte, i int) int {
	for i < len(data) && data[i] >= '0' && data[i] <= '9' {
		i++
	}
	return i
}

// literal consumes "true", "false" or "null" (the first byte already peeked).
func (s *scanner) literal(word string) error {
	if len(s.data)-s.pos < len(word) || string(s.data[s.pos:s.pos+len(word)]) != word {
		return s.errorf("invalid literal, expected %s", word)
	}
	s.pos += len(word)
	return nil
}

// boolean reads true, false, or null (as false).
func (s *scanner) boolean() (bool, error) {
	switch s.peek() {
	case 't':
		return true, s.literal("true")
	case 'f':
		return false, s.literal("false")
	case 'n':
		return false, s.literal("null")
	}
	return false, s.wrongType("a boolean")
}

// wrongType reports that the next value is not of the wanted JSON type: ErrValue when a
// value of another type starts there, ErrSyntax when no JSON value does.
func (s *scanner) wrongType(want string) error {
	err := ErrSyntax
	switch c := s.peek(); {
	case c == '"' || c == '{' || c == '[' || c == 't' || c == 'f' || c == 'n' || c == '-' || (c >= '0' && c <= '9'):
		err = ErrValue
	}
	return &syntaxError{pos: s.pos, msg: "expected " + want + ", found " + s.describe(), err: err}
}

// skip skips any JSON value.
func (s *scanner) skip(depth int) error {
	if depth > maxDepth {
		return &syntaxError{pos: s.pos, msg: fmt.Sprintf("JSON nested deeper than %d levels", maxDepth), err: ErrNesting}
	}
	switch c := s.peek(); {
	case c == '"':
		var err error
		_, s.sbuf, err = s.str(s.sbuf[:0])
		return err
	case c == '-' || (c >= '0' && c <= '9'):
		_, err := s.number()
		return err
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	case c == '{':
		s.pos++
		for first := true; ; first = false {
			_, ok, err := s.member(first)
			if err != nil {
				return err
			}
			if !ok {
				return nil
			}
			if err := s.skip(depth + 1); err != nil {
				return err
			}
		}
	case c == '[':
		s.pos++
		if s.peek() == ']' {
			s.pos++
			return nil
		}
		for {
			if err := s.skip(depth + 1); err != nil {
				return err
			}
			switch s.peek() {
			case ',':
				s.pos++
			case ']':
				s.pos++
				return nil
			default:
				return s.errorf("expected ',' or ']' in array, found %s", s.describe())
			}
		}
	}
	return s.errorf("unexpected %s, expected a JSON value", s.describe())
}

// asSyntax extracts the position of a scanner error.
func asSyntax(err error) (*syntaxError, bool) {
	var se *syntaxError
	ok := errors.As(err, &se)
	return se, ok
}
