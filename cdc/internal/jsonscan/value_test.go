package jsonscan

import "testing"

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
