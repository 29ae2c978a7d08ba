package checker

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"math/big"
	"strconv"
	"strings"
)

// Bound is a key tuple (one value per key column).
type Bound []Value

// Range is the key range lo < key <= hi of a chunk. A nil Lo means from the start of the
// table, a nil Hi means to its end.
type Range struct {
	Lo, Hi Bound
}

// boundValueJSON is the persisted form of one value of a Bound (see DecodeBound).
type boundValueJSON struct {
	Null bool   `json:"n,omitempty"`
	X    []byte `json:"x,omitempty"`
}

func encodeBound(b Bound) (string, error) {
	if b == nil {
		return "", nil
	}
	out := make([]boundValueJSON, len(b))
	for i, v := range b {
		if v.Null {
			out[i].Null = true
		} else {
			out[i].X = v.Bytes // empty or nil: omitted, {}
		}
	}
	data, err := json.Marshal(out)
	return string(data), err
}

func decodeBound(s string) (Bound, error) {
	if s == "" {
		return nil, nil
	}
	var in []boundValueJSON
	if err := json.Unmarshal([]byte(s), &in); err != nil {
		return nil, fmt.Errorf("decode chunk bound: %w", err)
	}
	b := make(Bound, len(in))
	for i, v := range in {
		if v.Null {
			b[i] = NullValue
			continue
		}
		b[i] = Value{Bytes: v.X}
		if b[i].Bytes == nil {
			b[i].Bytes = []byte{}
		}
	}
	return b, nil
}

// compareValue orders two non-NULL key values of kind k the way the drill-down queries
// order them (orderExpr): numbers by value, strings and binaries by bytes, temporal values
// by their fixed-width text. NULL sorts first, as in MySQL.
func compareValue(k Kind, a, b Value) int {
	switch {
	case a.Null && b.Null:
		return 0
	case a.Null:
		return -1
	case b.Null:
		return 1
	}
	switch k {
	case KindInt, KindBit:
		// Fast path without allocation (the drill-down compares every row's key).
		if x, err1 := strconv.ParseInt(string(a.Bytes), 10, 64); err1 == nil {
			if y, err2 := strconv.ParseInt(string(b.Bytes), 10, 64); err2 == nil {
				return cmp.Compare(x, y)
			}
		}
		x, ok1 := new(big.Int).SetString(string(a.Bytes), 10)
		y, ok2 := new(big.Int).SetString(string(b.Bytes), 10)
		if ok1 && ok2 {
			return x.Cmp(y)
		}
	case KindDecimal:
		x, ok1 := new(big.Rat).SetString(string(a.Bytes))
		y, ok2 := new(big.Rat).SetString(string(b.Bytes))
		if ok1 && ok2 {
			return x.Cmp(y)
		}
	case KindFloat, KindDouble:
		x, err1 := strconv.ParseFloat(string(a.Bytes), 64)
		y, err2 := strconv.ParseFloat(string(b.Bytes), 64)
		if err1 == nil && err2 == nil {
			return cmp.Compare(x, y) // no NaN in MySQL; -0 and 0 compare equal
		}
	case KindTemporal:
		// TIME values (negative, or with more than two hour digits) do not order by text;
		// dates and datetimes (fixed width) do.
		if isTime(a.Bytes) && isTime(b.Bytes) {
			return compareTime(string(a.Bytes), string(b.Bytes))
		}
	}
	return bytes.Compare(a.Bytes, b.Bytes)
}

func isTime(b []byte) bool {
	return len(b) > 1 && !bytes.Contains(b[1:], []byte("-")) && bytes.Contains(b, []byte(":"))
}

func compareTime(a, b string) int {
	sec := func(s string) float64 {
		neg := strings.HasPrefix(s, "-")
		s = strings.TrimPrefix(s, "-")
		var h, m int
		var f float64
		parts := strings.SplitN(s, ":", 3)
		if len(parts) == 3 {
			h, _ = strconv.Atoi(parts[0])
			m, _ = strconv.Atoi(parts[1])
			f, _ = strconv.ParseFloat(parts[2], 64)
		}
		v := float64(h*3600+m*60) + f
		if neg {
			v = -v
		}
		return v
	}
	x, y := sec(a), sec(b)
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

// compareKeys orders two key tuples.
func (p *TablePlan) compareKeys(a, b []Value) int {
	for i, k := range p.Key {
		if c := compareValue(p.Columns[k].Kind, a[i], b[i]); c != 0 {
			return c
		}
	}
	return 0
}

// Chunk is one unit of work: a key range of one table.
type Chunk struct {
	Table int // index into the run's tables
	Seq   int // 0-based position of the chunk in its table's key order
	Range Range
	// Last marks the final chunk of its table.
	Last bool

	retry bool // from a resumed run: an earlier attempt may have stored differences
}

// chunkSizer adapts the number of rows per chunk so that a checksum query takes about
// Target on the slower side, within [Min, Max] rows.
type chunkSizer struct {
	target   float64 // seconds
	min, max int
	rate     float64 // rows per second, exponentially weighted
	cur      int
}

func newChunkSizer(cfg *Config) *chunkSizer {
	return &chunkSizer{target: cfg.ChunkTargetTime.Seconds(), min: cfg.MinChunkRows, max: cfg.MaxChunkRows,
		cur: max(cfg.MinChunkRows, min(cfg.MaxChunkRows, cfg.InitialChunkRows))}
}

// observe records that rows took seconds on the slower side.
func (s *chunkSizer) observe(rows int, seconds float64) {
	if rows < 100 || seconds <= 0 {
		return
	}
	r := float64(rows) / seconds
	if s.rate == 0 {
		s.rate = r
	} else {
		s.rate = 0.7*s.rate + 0.3*r
	}
	n := int(s.rate * s.target)
	// Grow at most 2× at a time so one fast chunk does not produce a huge next one.
	if n > 2*s.cur {
		n = 2 * s.cur
	}
	s.cur = max(s.min, min(s.max, n))
}

func (s *chunkSizer) size() int { return s.cur }

// DecodeBound parses a chunk bound as persisted in parity_meta.diff_chunks.lo_bound /
// hi_bound ("" is an open end, nil). The format is a JSON array with one object per key
// column: {"n": true} for NULL, otherwise {"x": "<base64 of the value's bytes>"} ({} for
// an empty value).
func DecodeBound(s string) (Bound, error) { return decodeBound(s) }
