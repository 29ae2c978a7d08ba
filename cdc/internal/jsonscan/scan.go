// Package jsonscan is a small JSON scanner for the fixed message shapes of TiCDC's
// open, canal-json and simple protocols (cdc/open, cdc/canal, cdc/simple): members are
// read in message order without building a tree, strings are returned as slices of the
// input when they hold no escape, and nothing is allocated from a length that was not
// checked against the input. It depends on nothing but the standard library, so every
// protocol package (leaves without Kafka or SQL) can use it.
//
// Strings are unescaped like encoding/json: invalid UTF-8 and unpaired surrogates
// become U+FFFD.
package jsonscan

import (
	"encoding/binary"
	"fmt"
	"unicode/utf16"
	"unicode/utf8"
)

// Scanner reads one JSON text. Data and Pos may be set directly; strings returned by
// Str alias Data or a scratch buffer and are valid until the next Str or Member.
type Scanner struct {
	Data []byte
	Pos  int
	sbuf []byte // scratch for unescaped string values
	nbuf []byte // scratch for unescaped member names
}

// MaxDepth bounds the nesting of skipped values.
const MaxDepth = 64

// Error is a scanner failure at a byte position of the JSON text.
type Error struct {
	Pos  int
	Msg  string
	Kind Kind
}

// Kind says what kind of failure an Error is (cdc/open maps each to a sentinel).
type Kind uint8

const (
	Syntax    Kind = iota // malformed JSON text
	WrongType             // a valid value of another JSON type than wanted (WrongType, Str)
	Nesting               // a skipped value nested deeper than MaxDepth
)

func (e *Error) Error() string { return fmt.Sprintf("byte %d: %s", e.Pos, e.Msg) }

func (s *Scanner) errorf(format string, args ...any) error {
	return &Error{Pos: s.Pos, Msg: fmt.Sprintf(format, args...)}
}

// WrongType reports that the next value is not of the wanted JSON type ("a string", "an
// object", ...): Kind WrongType when a value of another type starts there, Syntax when
// no JSON value does.
func (s *Scanner) WrongType(want string) error {
	kind := Syntax
	switch c := s.Peek(); {
	case c == '"' || c == '{' || c == '[' || c == 't' || c == 'f' || c == 'n' || c == '-' || (c >= '0' && c <= '9'):
		kind = WrongType
	}
	return &Error{Pos: s.Pos, Msg: "expected " + want + ", found " + s.describe(), Kind: kind}
}

// Reset starts scanning data; scratch buffers are kept (up to keep bytes each).
func (s *Scanner) Reset(data []byte, keep int) {
	s.Data, s.Pos = data, 0
	if cap(s.sbuf) > keep {
		s.sbuf = nil
	}
	if cap(s.nbuf) > keep {
		s.nbuf = nil
	}
}

// ws skips white space. TiCDC writes none, so the first test nearly always ends it.
func (s *Scanner) ws() {
	if s.Pos < len(s.Data) && s.Data[s.Pos] > ' ' {
		return
	}
	s.wsSlow()
}

func (s *Scanner) wsSlow() {
	for s.Pos < len(s.Data) {
		switch s.Data[s.Pos] {
		case ' ', '\t', '\n', '\r':
			s.Pos++
		default:
			return
		}
	}
}

// Peek returns the next non-space byte (skipping the space), or 0 at the end of input.
func (s *Scanner) Peek() byte {
	s.ws()
	if s.Pos >= len(s.Data) {
		return 0
	}
	return s.Data[s.Pos]
}

func (s *Scanner) describe() string {
	if s.Pos >= len(s.Data) {
		return "end of input"
	}
	c := s.Data[s.Pos]
	if c >= 0x20 && c < 0x7f {
		return fmt.Sprintf("%q", c)
	}
	return fmt.Sprintf("byte 0x%02x", c)
}

// Expect consumes c (after white space).
func (s *Scanner) Expect(c byte) error {
	if s.Peek() != c {
		return s.errorf("expected %q, found %s", c, s.describe())
	}
	s.Pos++
	return nil
}

// End checks that only white space follows the top-level value.
func (s *Scanner) End() error {
	if s.Peek() != 0 || s.Pos < len(s.Data) {
		return s.errorf("unexpected %s after the JSON value", s.describe())
	}
	return nil
}

// Member reads the next member name of an object whose '{' was consumed, and the ':'
// after it; first says whether it is the object's first member. ok is false at the
// closing '}' (which is consumed).
func (s *Scanner) Member(first bool) (name []byte, ok bool, err error) {
	// Fast path, what TiCDC writes: no white space, and an ASCII name without escapes
	// directly followed by ':'.
	data, i := s.Data, s.Pos
	if !first && i < len(data) && data[i] == ',' {
		i++
	}
	if i < len(data) && data[i] == '"' && (first || i > s.Pos) {
		j := i + 1
		for j < len(data) && plainASCII[data[j]] {
			j++
		}
		if j+1 < len(data) && data[j] == '"' && data[j+1] == ':' {
			s.Pos = j + 2
			return data[i+1 : j], true, nil
		}
	}
	c := s.Peek()
	if c == '}' {
		s.Pos++
		return nil, false, nil
	}
	if !first {
		if c != ',' {
			return nil, false, s.errorf("expected ',' or '}' in object, found %s", s.describe())
		}
		s.Pos++
		c = s.Peek()
	}
	if c != '"' {
		return nil, false, s.errorf("expected member name, found %s", s.describe())
	}
	name, s.nbuf, err = s.str(s.nbuf[:0])
	if err != nil {
		return nil, false, err
	}
	if err := s.Expect(':'); err != nil {
		return nil, false, err
	}
	return name, true, nil
}

// MemberIs consumes the next member name and the ':' after it when they are written
// exactly as `"name":` (after a ',' unless first) at the position, and reports whether
// it did; otherwise nothing is consumed. name must be Plain, so that the JSON string
// with these bytes is name.
func (s *Scanner) MemberIs(first bool, name string) bool {
	data, i := s.Data, s.Pos
	if !first {
		if i >= len(data) || data[i] != ',' {
			return false
		}
		i++
	}
	end := i + len(name) + 1 // the closing quote
	if end+1 >= len(data) || data[i] != '"' || data[end] != '"' || data[end+1] != ':' || string(data[i+1:end]) != name {
		return false
	}
	s.Pos = end + 2
	return true
}

// Plain reports whether name is written in a JSON string as it is (printable ASCII
// other than '"' and '\\'), as MemberIs needs.
func Plain(name string) bool {
	for i := 0; i < len(name); i++ {
		if !plainASCII[name[i]] {
			return false
		}
	}
	return true
}

// Element prepares the next element of an array whose '[' was consumed: ok is false at
// the closing ']' (which is consumed).
func (s *Scanner) Element(first bool) (ok bool, err error) {
	c := s.Peek()
	if c == ']' {
		s.Pos++
		return false, nil
	}
	if !first {
		if c != ',' {
			return false, s.errorf("expected ',' or ']' in array, found %s", s.describe())
		}
		s.Pos++
	}
	return true, nil
}

// Str reads a JSON string (the next value must be one). Without escapes it returns a
// slice of the input; otherwise the unescaped text in a scratch buffer.
func (s *Scanner) Str() ([]byte, error) {
	if s.Peek() != '"' {
		return nil, s.WrongType("a string")
	}
	var out []byte
	var err error
	out, s.sbuf, err = s.str(s.sbuf[:0])
	return out, err
}

// AppendStr reads a JSON string (the next value must be one) and appends its unescaped
// text to dst.
func (s *Scanner) AppendStr(dst []byte) ([]byte, error) {
	if s.Peek() != '"' {
		return dst, s.errorf("expected a string, found %s", s.describe())
	}
	n := len(dst)
	out, buf, err := s.str(dst)
	if err != nil {
		return dst[:n], err
	}
	if len(buf) == n { // no escape: out is a slice of the input
		return append(buf, out...), nil
	}
	return buf, nil
}

// str reads a JSON string at s.Pos (which must be '"'). Without escapes it returns a
// slice of the input and buf unchanged; otherwise it unescapes by appending to buf.
func (s *Scanner) str(buf []byte) (out, scratch []byte, err error) {
	s.Pos++ // opening quote
	start := s.Pos
	data := s.Data
	i := s.Pos
	// Eight bytes at a time while none of them is special ('"', '\\', a control
	// character or a byte of a multi-byte sequence).
	for len(data)-i >= 8 && !special8(binary.LittleEndian.Uint64(data[i:])) {
		i += 8
	}
	for i < len(data) {
		c := data[i]
		if c == '"' {
			s.Pos = i + 1
			return data[start:i], buf, nil
		}
		if !plainASCII[c] {
			break
		}
		i++
	}
	n := len(buf)
	buf = append(buf, data[start:i]...)
	for i < len(data) {
		c := data[i]
		switch {
		case c == '"':
			s.Pos = i + 1
			return buf[n:], buf, nil
		case c < 0x20:
			s.Pos = i
			return nil, buf, s.errorf("control character 0x%02x in string", c)
		case c == '\\':
			if i+1 >= len(data) {
				s.Pos = i
				return nil, buf, s.errorf("unterminated escape in string")
			}
			e := data[i+1]
			if u := unescapes[e]; u != 0 {
				buf = append(buf, u)
				i += 2
				break
			}
			if e != 'u' {
				s.Pos = i
				return nil, buf, s.errorf("invalid escape \\%c in string", e)
			}
			r, ok := hex4(data, i+2)
			if !ok {
				s.Pos = i
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
	s.Pos = len(data)
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
// least 0x80 (exact about whether such a byte exists, not where).
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
