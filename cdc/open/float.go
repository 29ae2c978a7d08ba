package open

import (
	"math"
	"math/big"
	"strconv"
	"sync"
	"sync/atomic"
)

// parseFloat is strconv.ParseFloat(string(raw), bitSize) for a JSON number (syntax
// already checked by the scanner), with an exact fast path for results below the
// smallest normal number. strconv converts those (5e-324, the smallest DOUBLE; 1e-45,
// the smallest FLOAT) with its general decimal algorithm, about 18 µs each, more than a
// whole row of other values.
func parseFloat(raw []byte, bitSize int) (float64, error) {
	if v, ok := parseTiny(raw, bitSize); ok {
		return v, nil
	}
	return strconv.ParseFloat(string(raw), bitSize)
}

// parseTiny converts a number whose magnitude is below 10^-308 (float64) or 10^-38
// (float32): the result is k·2^-1074 (k·2^-149) with k the value divided by that unit,
// rounded half to even, computed exactly with big integers. ok is false for any other
// number, and for numbers of more than maxTinyDigits significant digits.
func parseTiny(raw []byte, bitSize int) (float64, bool) {
	const maxTinyDigits = 800
	minExp, zeroExp, unit := -309, -326, uint(1074) // 10^-308 < 2^-1022; 10^-325 < 2^-1075
	if bitSize == 32 {
		minExp, zeroExp, unit = -39, -47, 149 // 10^-38 < 2^-126; 10^-46 < 2^-150
	}
	i := 0
	neg := len(raw) > 0 && raw[0] == '-'
	if neg {
		i++
	}
	var buf [maxTinyDigits]byte // the significant digits, without leading zeros
	n, frac := 0, 0             // significant digits; digits after the point (from the first one kept)
	seen := false
	for ; i < len(raw); i++ {
		c := raw[i]
		if c == '.' {
			seen = true
			continue
		}
		if c < '0' || c > '9' {
			break
		}
		if seen {
			frac++
		}
		if n == 0 && c == '0' {
			continue
		}
		if n == maxTinyDigits {
			return 0, false
		}
		buf[n] = c
		n++
	}
	digits := buf[:n]
	exp := 0
	if i < len(raw) && (raw[i] == 'e' || raw[i] == 'E') {
		i++
		eneg := false
		if i < len(raw) && (raw[i] == '+' || raw[i] == '-') {
			eneg = raw[i] == '-'
			i++
		}
		for ; i < len(raw); i++ {
			if exp < 1<<20 {
				exp = exp*10 + int(raw[i]-'0')
			}
		}
		if eneg {
			exp = -exp
		}
	}
	if n == 0 {
		return 0, false // zero: strconv is fast
	}
	e := exp - frac // value = digits · 10^e
	x := n - 1 + e  // 10^x <= value < 10^(x+1)
	if x > minExp {
		return 0, false
	}
	sign := 1.0
	if neg {
		sign = -1
	}
	if x < zeroExp {
		return math.Copysign(0, sign), true
	}
	sc := tinyScratch.Get().(*tinyInts)
	defer tinyScratch.Put(sc)
	num, r := &sc.num, &sc.r
	if n <= 19 {
		var d uint64
		for _, c := range digits {
			d = d*10 + uint64(c-'0')
		}
		num.SetUint64(d)
	} else {
		num.SetString(string(digits), 10)
	}
	num.Lsh(num, unit)
	den := pow10(-e)
	num.QuoRem(num, den, r)
	r.Lsh(r, 1)
	if c := r.Cmp(den); c > 0 || c == 0 && num.Bit(0) == 1 {
		num.Add(num, bigOne)
	}
	return sign * math.Ldexp(float64(num.Uint64()), -int(unit)), true
}

type tinyInts struct{ num, r big.Int }

var (
	tinyScratch = sync.Pool{New: func() any { return new(tinyInts) }}
	bigOne      = big.NewInt(1)
	// pow10s caches 10^k for the exponents of short numbers (up to 400; 5e-324 needs 324).
	pow10s [401]atomic.Pointer[big.Int]
)

func pow10(k int) *big.Int {
	if k < len(pow10s) {
		if p := pow10s[k].Load(); p != nil {
			return p
		}
	}
	p := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(k)), nil)
	if k < len(pow10s) {
		pow10s[k].Store(p)
	}
	return p
}
