package open

import (
	"math"
	"math/big"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

// TestParseFloatTiny compares parseFloat with strconv.ParseFloat on random numbers around
// the subnormal ranges of float64 and float32 (the fuzz target rarely gets there alone),
// and on the exact halfway points between subnormals, where rounding to even decides.
func TestParseFloatTiny(t *testing.T) {
	rng := rand.New(rand.NewPCG(32, 1))
	check := func(s string) {
		t.Helper()
		for _, bits := range []int{64, 32} {
			want, werr := strconv.ParseFloat(s, bits)
			got, gerr := parseFloat([]byte(s), bits)
			if (werr == nil) != (gerr == nil) || math.Float64bits(got) != math.Float64bits(want) {
				t.Fatalf("parseFloat(%q, %d) = %v, %v; strconv %v, %v", s, bits, got, gerr, want, werr)
			}
		}
	}
	for range 20000 {
		var b strings.Builder
		if rng.IntN(2) == 0 {
			b.WriteByte('-')
		}
		digits := 1 + rng.IntN(40)
		point := rng.IntN(digits + 1)
		for i := range digits {
			if i == point && i > 0 {
				b.WriteByte('.')
			}
			b.WriteByte(byte('0' + rng.IntN(10)))
		}
		exp := -rng.IntN(80) - 290 // float64's subnormals and around
		if rng.IntN(2) == 0 {
			exp = -rng.IntN(30) - 30 // float32's
		}
		b.WriteString("e" + strconv.Itoa(exp-digits+point))
		s := b.String()
		if s[0] == '0' && len(s) > 1 && s[1] >= '0' && s[1] <= '9' || strings.HasPrefix(s, "-0") && len(s) > 2 && s[2] >= '0' && s[2] <= '9' {
			continue // leading zero: not a JSON number
		}
		check(s)
	}
	// Exactly halfway between k·2^-1074 and (k+1)·2^-1074, (2k+1)·5^1075·10^-1075, for a
	// few k; and a hair above and below.
	five := new(big.Int).Exp(big.NewInt(5), big.NewInt(1075), nil)
	for _, k := range []int64{0, 1, 2, 3, 1 << 20, 1<<52 - 1} {
		d := new(big.Int).Mul(big.NewInt(2*k+1), five).String()
		for _, s := range []string{d + "e-1075", d + "1e-1076", d[:len(d)-1] + "e-1074"} {
			if _, ok := parseTiny([]byte(s), 64); !ok && k < 1<<52-1 { // the last is above 10^-308
				t.Fatalf("%s: not taken by the exact path", s)
			}
			check(s)
		}
	}
}

// BenchmarkParseFloatTiny: the smallest DOUBLE, which strconv.ParseFloat takes about
// 18 µs for.
func BenchmarkParseFloatTiny(b *testing.B) {
	raw := []byte("5e-324")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := parseFloat(raw, 64); err != nil {
			b.Fatal(err)
		}
	}
}
