package jsonscan

import "fmt"

// Number reads a JSON number literal and returns its text.
func (s *Scanner) Number() ([]byte, error) {
	s.ws()
	data := s.Data
	start := s.Pos
	i := start
	if i < len(data) && data[i] == '-' {
		i++
	}
	if i >= len(data) {
		s.Pos = i
		return nil, s.errorf("truncated number")
	}
	switch c := data[i]; {
	case c == '0':
		i++
	case c >= '1' && c <= '9':
		i = skipDigits(data, i)
	default:
		s.Pos = i
		return nil, s.errorf("invalid number")
	}
	if i < len(data) && data[i] == '.' {
		d := i + 1
		if i = skipDigits(data, d); i == d {
			s.Pos = i
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
			s.Pos = i
			return nil, s.errorf("invalid number: no exponent digits")
		}
	}
	s.Pos = i
	return data[start:i], nil
}

// SmallUint reads a non-negative integer of at most 18 digits that is a whole JSON
// number (not followed by a fraction, an exponent or another digit), as column types,
// flags and the like are, at the current position (no white space skipped). ok is
// false, and nothing is consumed, for anything else.
func (s *Scanner) SmallUint() (v uint64, ok bool) {
	data, i := s.Data, s.Pos
	end := min(len(data), i+19)
	for ; i < end; i++ {
		c := data[i]
		if c < '0' || c > '9' {
			break
		}
		v = v*10 + uint64(c-'0')
	}
	n := i - s.Pos
	if n == 0 || n > 18 || (n > 1 && data[s.Pos] == '0') {
		return 0, false
	}
	if i < len(data) {
		if c := data[i]; c == '.' || c == 'e' || c == 'E' || (c >= '0' && c <= '9') {
			return 0, false
		}
	}
	s.Pos = i
	return v, true
}

// Uint64 reads a JSON number that is an integer in 0..2^64-1 written without fraction
// or exponent (what encoding/json accepts for a uint64). ok is false, and the position
// is unspecified, for anything else.
func (s *Scanner) Uint64() (v uint64, ok bool) {
	s.ws()
	if v, ok := s.SmallUint(); ok { // most: up to 18 digits, one pass
		return v, true
	}
	raw, err := s.Number()
	if err != nil {
		return 0, false
	}
	return ParseUint(raw)
}

// Int64 is Uint64 for an int64 (an optional '-').
func (s *Scanner) Int64() (v int64, ok bool) {
	s.ws()
	start := s.Pos
	if start < len(s.Data) && s.Data[start] == '-' {
		s.Pos++
		if v, ok := s.SmallUint(); ok {
			return -int64(v), true
		}
		s.Pos = start
	} else if v, ok := s.SmallUint(); ok {
		return int64(v), true
	}
	raw, err := s.Number()
	if err != nil {
		return 0, false
	}
	return ParseInt(raw)
}

// ParseUint parses [0-9]+ (no sign) into a uint64; ok is false for anything else or on
// overflow. Leading zeros are accepted (callers that must reject them check first).
func ParseUint(b []byte) (v uint64, ok bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if v > (1<<64-1-d)/10 {
			return 0, false
		}
		v = v*10 + d
	}
	return v, true
}

// ParseInt parses -?[0-9]+ into an int64; ok is false for anything else or on overflow.
func ParseInt(b []byte) (v int64, ok bool) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	u, ok := ParseUint(b)
	if !ok {
		return 0, false
	}
	if neg {
		if u > 1<<63 {
			return 0, false
		}
		return -int64(u), true
	}
	if u > 1<<63-1 {
		return 0, false
	}
	return int64(u), true
}

// skipDigits returns the index of the first byte at or after i that is not a decimal digit.
func skipDigits(data []byte, i int) int {
	for i < len(data) && data[i] >= '0' && data[i] <= '9' {
		i++
	}
	return i
}

// Literal consumes word ("true", "false" or "null") after white space.
func (s *Scanner) Literal(word string) error {
	s.ws()
	if len(s.Data)-s.Pos < len(word) || string(s.Data[s.Pos:s.Pos+len(word)]) != word {
		return s.errorf("invalid literal, expected %s", word)
	}
	s.Pos += len(word)
	return nil
}

// Null consumes a null if one is next and reports whether it did.
func (s *Scanner) Null() bool {
	if s.Peek() == 'n' && s.Literal("null") == nil {
		return true
	}
	return false
}

// Bool reads true or false.
func (s *Scanner) Bool() (bool, error) {
	switch s.Peek() {
	case 't':
		return true, s.Literal("true")
	case 'f':
		return false, s.Literal("false")
	}
	return false, s.errorf("expected a boolean, found %s", s.describe())
}

// Skip skips any JSON value.
func (s *Scanner) Skip() error { return s.skip(0) }

func (s *Scanner) skip(depth int) error {
	if depth > MaxDepth {
		return &Error{Pos: s.Pos, Msg: fmt.Sprintf("JSON nested deeper than %d levels", MaxDepth), Kind: Nesting}
	}
	switch c := s.Peek(); {
	case c == '"':
		var err error
		_, s.sbuf, err = s.str(s.sbuf[:0])
		return err
	case c == '-' || (c >= '0' && c <= '9'):
		_, err := s.Number()
		return err
	case c == 't':
		return s.Literal("true")
	case c == 'f':
		return s.Literal("false")
	case c == 'n':
		return s.Literal("null")
	case c == '{':
		s.Pos++
		for first := true; ; first = false {
			_, ok, err := s.Member(first)
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
		s.Pos++
		for first := true; ; first = false {
			ok, err := s.Element(first)
			if err != nil || !ok {
				return err
			}
			if err := s.skip(depth + 1); err != nil {
				return err
			}
		}
	}
	return s.errorf("unexpected %s, expected a JSON value", s.describe())
}
