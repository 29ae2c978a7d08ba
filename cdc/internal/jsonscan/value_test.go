package jsonscan

import (
	"strconv"
	"testing"
	"unsafe"
)

// TestIntegers: Uint64 and Int64 (a one-pass path for up to 18 digits) give what reading
// the number and parsing its text gives, and stop at the same place.
func TestIntegers(t *testing.T) {
	for _, in := range []string{"0", "01", "7", " 7,", "-0", "-", "-x", "1.5", "1e3", "-1E3", "0.0",
		"123456789012345678", "1234567890123456789", "12345678901234567890", "18446744073709551615",
		"18446744073709551616", "9223372036854775807", "9223372036854775808", "-9223372036854775808",
		"-9223372036854775809", "-123456789012345678}", "42]", "\"1\"", "null"} {
		ref := Scanner{Data: []byte(in)}
		var wantU uint64
		var wantI int64
		okU, okI := false, false
		if raw, err := ref.Number(); err == nil {
			wantU, okU = ParseUint(raw)
			wantI, okI = ParseInt(raw)
		}
		s := Scanner{Data: []byte(in)}
		u, ok := s.Uint64()
		if ok != okU || (ok && (u != wantU || s.Pos != ref.Pos)) {
			t.Errorf("Uint64(%q) = %d, %v at %d; want %d, %v at %d", in, u, ok, s.Pos, wantU, okU, ref.Pos)
		}
		s = Scanner{Data: []byte(in)}
		i, ok := s.Int64()
		if ok != okI || (ok && (i != wantI || s.Pos != ref.Pos)) {
			t.Errorf("Int64(%q) = %d, %v at %d; want %d, %v at %d", in, i, ok, s.Pos, wantI, okI, ref.Pos)
		}
	}
}

// TestMemberIs: MemberIs accepts exactly when Member reads the same Plain name from the
// compact form, and then stops where Member stops; otherwise it consumes nothing.
func TestMemberIs(t *testing.T) {
	for _, c := range []struct {
		in    string
		first bool
		name  string
	}{
		{`"a":1`, true, "a"}, {`,"a":1`, false, "a"}, {`"a":1`, false, "a"}, {`,"a":1`, true, "a"},
		{`"ab":1`, true, "a"}, {`"a":1`, true, "ab"}, {`"a" :1`, true, "a"}, {` "a":1`, true, "a"},
		{`"a"`, true, "a"}, {`"a":`, true, "a"}, {`}`, false, "a"}, {`,"c_bigint_u":"1"`, false, "c_bigint_u"},
		{`"\u0061":1`, true, "a"}, {`"":1`, true, ""}, {`,"a\"b":1`, false, "a"},
	} {
		ref := Scanner{Data: []byte(c.in)}
		name, more, err := ref.Member(c.first)
		compactEnd := len(c.name) + 3 // `"name":` with no white space and no escape
		if !c.first {
			compactEnd++
		}
		want := err == nil && more && string(name) == c.name && ref.Pos == compactEnd
		s := Scanner{Data: []byte(c.in)}
		got := s.MemberIs(c.first, c.name)
		if got != want || (got && s.Pos != ref.Pos) || (!got && s.Pos != 0) {
			t.Errorf("MemberIs(%v, %q) on %q = %v at %d; Member gives %q, %v, %v at %d", c.first, c.name, c.in, got, s.Pos, name, more, err, ref.Pos)
		}
	}
	if !Plain("c_bigint_u") || Plain(`a"b`) || Plain(`a\b`) || Plain("é") || Plain("a\tb") {
		t.Error("Plain is wrong")
	}
}

func TestNames(t *testing.T) {
	var n Names
	a := n.Intern([]byte("sbtest1"))
	b := n.Intern([]byte("sbtest1"))
	if a != "sbtest1" || unsafe.StringData(a) != unsafe.StringData(b) {
		t.Fatalf("Intern gave %q and %q, not one string", a, b)
	}
	if c := n.Intern([]byte("other")); c != "other" {
		t.Fatalf("Intern(other) = %q", c)
	}
	for i := 0; i <= maxNames; i++ {
		n.Intern([]byte(strconv.Itoa(i)))
	}
	n.Trim()
	if len(n.m) != 0 {
		t.Errorf("Trim past %d names left %d", maxNames, len(n.m))
	}
	n.Intern([]byte("x"))
	n.Trim()
	if len(n.m) != 1 {
		t.Errorf("Trim under the bound left %d names, want 1", len(n.m))
	}
}
