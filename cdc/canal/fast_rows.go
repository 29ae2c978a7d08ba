package canal

import (
	"math"
	"strconv"
	"unicode/utf8"

	"github.com/tidb-parity/parity/cdc/internal/jsonscan"
	"github.com/tidb-parity/parity/cdc/internal/rowbuf"
	"github.com/tidb-parity/parity/cdc/open"
)

// row reads one element of data or old into the builder.
func (st *state) row(tt *tableTypes) (span, bool) {
	sc := &st.sc
	seen := st.rowSeen
	clear(seen)
	out := span{start: len(st.b.Cols)}
	if sc.Expect('{') != nil {
		return out, false
	}
	prev := -1
	for first := true; ; first = false {
		i := tt.first
		if prev >= 0 {
			i = tt.next[prev]
		}
		// The column that followed the previous one in the last row, written as TiCDC
		// writes it, is recognized by comparing bytes; anything else is read and looked up.
		if i < 0 || !tt.plain[i] || !sc.MemberIs(first, tt.names[i]) {
			name, more, err := sc.Member(first)
			if err != nil {
				return out, false
			}
			if !more {
				break
			}
			if i < 0 || tt.names[i] != string(name) {
				var ok bool
				if i, ok = tt.index[string(name)]; !ok {
					return out, false
				}
				if prev >= 0 {
					tt.next[prev] = i
				} else {
					tt.first = i
				}
			}
		}
		if seen[i] {
			return out, false
		}
		seen[i] = true
		prev = i
		t := tt.types[i]
		flags := t.flags
		if st.isPK[i] {
			flags |= open.FlagPrimaryKey | open.FlagHandleKey
		}
		c := st.b.Add(tt.names[i], t.code, flags)
		if sc.Null() {
			continue
		}
		if !st.value(c, t) {
			return out, false
		}
	}
	for _, i := range st.pkCols {
		if !seen[i] {
			return out, false
		}
	}
	out.end = len(st.b.Cols)
	return out, out.end > out.start
}

// value reads column c's value (a JSON string) the way value() converts it.
func (st *state) value(c int, t colType) bool {
	b := &st.b
	v := &b.Vals[c]
	switch t.kind {
	case kindText:
		off := len(b.Text)
		var err error
		if b.Text, err = st.sc.AppendStr(b.Text); err != nil {
			return false
		}
		*v = rowbuf.Value{Kind: rowbuf.Text, Off: off, End: len(b.Text)}
		return true
	case kindBytes:
		s, ok := st.str()
		if !ok {
			return false
		}
		off := len(b.Bin)
		if b.Bin, ok = appendLatin1(b.Bin, s); !ok {
			return false
		}
		*v = rowbuf.Value{Kind: rowbuf.Bytes, Off: off, End: len(b.Bin)}
		return true
	}
	s, ok := st.str()
	if !ok {
		return false
	}
	switch t.kind {
	case kindSigned:
		x, ok := jsonscan.ParseInt(s)
		if !ok {
			var err error
			if x, err = strconv.ParseInt(string(s), 10, 64); err != nil {
				return false
			}
		}
		if lo, hi := signedRange(t.code); x < lo || x > hi {
			return false
		}
		*v = rowbuf.Value{Kind: rowbuf.Int, Num: uint64(x)}
	case kindUnsigned, kindUint:
		x, ok := jsonscan.ParseUint(s)
		if !ok {
			var err error
			if x, err = strconv.ParseUint(string(s), 10, 64); err != nil {
				return false
			}
		}
		if t.kind == kindUnsigned && x > unsignedMax(t.code) {
			return false
		}
		*v = rowbuf.Value{Kind: rowbuf.Uint, Num: x}
	case kindFloat:
		x, err := strconv.ParseFloat(string(s), 32)
		if err != nil {
			return false
		}
		*v = rowbuf.Value{Kind: rowbuf.Float, Num: math.Float64bits(float64(float32(x)))}
	case kindDouble:
		x, err := strconv.ParseFloat(string(s), 64)
		if err != nil || math.IsInf(x, 0) || math.IsNaN(x) {
			return false
		}
		*v = rowbuf.Value{Kind: rowbuf.Float, Num: math.Float64bits(x)}
	default:
		return false
	}
	return true
}

// appendLatin1 is latin1 appending to dst: ok is false for a character beyond U+00FF.
func appendLatin1(dst, s []byte) ([]byte, bool) {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			dst = append(dst, c)
			i++
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		if r > 0xff {
			return dst, false
		}
		dst = append(dst, byte(r))
		i += size
	}
	return dst, true
}
