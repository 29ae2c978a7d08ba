package checker

// keys.go owns the checker's row keys in Go: the Go values of key columns (in
// internal/rowkey's types), the stored forms of chunk bounds and of differences' keys
// (rowkey.Key, and reading back what earlier releases stored), and the form under which
// two keys are the same key when Go decides it (maps keyed by key). It must not look up
// or scan rows by key: that is SQL with the column's own collation (checksum.go). Nor
// does it order keys for the row merge: that follows the servers' ORDER BY
// (compareValue), which rowkey's byte order does not for DECIMAL and TIME values.

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/tidb-parity/parity/internal/rowkey"
)

// The checker reads values through SQL as text (sqlValue), with each column's kind known.
// A key value becomes a Go value of rowkey's types, as the applier's decoder (cdc/open)
// types the same column, so that one row has one rowkey.Key in the ledger and here:
//
//	NULL                                   nil
//	integer types and YEAR, signed         int64
//	integer types, UNSIGNED upstream       uint64
//	BIT (read as its unsigned integer)     uint64
//	FLOAT, DOUBLE (read as DOUBLE)         float64 (-0 is 0)
//	DECIMAL, temporal, JSON, ENUM, SET,    string: the text as the server printed it
//	  and character columns                (DECIMAL keeps its scale: 1.50)
//	binary columns (BINARY, VARBINARY,     []byte
//	  BLOB)
//
// ENUM and SET are their text here (the checker reads them as text), where the applier
// keys them by member index. A value whose text is not of its kind (an integer out of
// both 64-bit ranges, which no server prints) is kept as its text, a string. Back from a
// key (valueOfKey) every value is the same SQL value: strings and binaries their exact
// bytes, integers and floats their shortest decimal text (what the driver prints too).

// keyValue returns the Go value of value v of column c (see above).
func keyValue(c planColumn, v sqlValue) any {
	if v.Null {
		return nil
	}
	s := string(v.Bytes)
	switch c.Kind {
	case kindInt, kindBit:
		unsigned := c.Unsigned || c.Kind == kindBit
		if unsigned {
			if u, err := strconv.ParseUint(s, 10, 64); err == nil {
				return u
			}
		}
		if i, err := strconv.ParseInt(s, 10, 64); err == nil {
			if unsigned && i >= 0 {
				return uint64(i) // "+0", "-0": the value an unsigned column reads back as
			}
			return i
		}
		if !unsigned {
			if u, err := strconv.ParseUint(s, 10, 64); err == nil {
				return u // above a signed column's range: an unsigned downstream's value
			}
		}
	case kindFloat, kindDouble:
		// Only SQL's decimal spellings: ParseFloat also reads "NaN", "0x1p-2" and "1_0".
		if numericText.MatchString(s) {
			if f, err := strconv.ParseFloat(s, 64); err == nil && !math.IsInf(f, 0) {
				return f
			}
		}
	case kindBinary:
		return bytes.Clone(v.Bytes)
	}
	return s
}

// valueOfKey returns the sqlValue of a key value (keyValue's inverse, up to the spelling of
// numbers).
func valueOfKey(x any) sqlValue {
	switch x := x.(type) {
	case nil:
		return nullValue
	case int64:
		return stringValue(strconv.FormatInt(x, 10))
	case uint64:
		return stringValue(strconv.FormatUint(x, 10))
	case float64:
		return stringValue(strconv.FormatFloat(x, 'g', -1, 64))
	case string:
		return stringValue(x)
	case []byte:
		return sqlValue{Bytes: bytes.Clone(x)}
	}
	return stringValue(fmt.Sprint(x)) // not a type rowkey decodes to
}

// appendKey appends the exact key of values vals of columns cols (indexes into
// p.Columns) to dst. ok is false only for a type rowkey cannot hold, which keyValue
// never returns.
func (p *tablePlan) appendKey(dst []byte, cols []int, vals []sqlValue) (out []byte, ok bool) {
	for i, c := range cols {
		if dst, ok = rowkey.Append(dst, keyValue(p.Columns[c], vals[i]), rowkey.Exact); !ok {
			return dst, false
		}
	}
	return dst, true
}

// Chunk bounds are stored in diff_chunks.lo_bound and hi_bound as boundPrefix and the
// base64 of the bound's rowkey.Key (typed by the key columns, see keyValue); "" is an
// open end. Releases before rowkey stored a JSON array, one object per value: {"n":true}
// for NULL, otherwise {"x":"<base64 of the value's text>"} ({} for an empty one). Both
// are read: a run stored by such a release resumes.
const boundPrefix = "rk:"

// encodeBound returns the stored form of bound b of p's key.
func (p *tablePlan) encodeBound(b chunkBound) (string, error) {
	if b == nil {
		return "", nil
	}
	if len(b) > len(p.Key) {
		return "", fmt.Errorf("encode chunk bound: %d values for a key of %d columns", len(b), len(p.Key))
	}
	k, ok := p.appendKey(nil, p.Key[:len(b)], b)
	if !ok {
		return "", errors.New("encode chunk bound: a value no key holds")
	}
	return boundPrefix + base64.StdEncoding.EncodeToString(k), nil
}

// boundValueJSON is one value of a bound as releases before rowkey stored it.
type boundValueJSON struct {
	Null bool   `json:"n,omitempty"`
	X    []byte `json:"x,omitempty"`
}

// decodeBound reads a stored chunk bound, in either form (see boundPrefix).
func decodeBound(s string) (chunkBound, error) {
	switch {
	case s == "":
		return nil, nil
	case strings.HasPrefix(s, boundPrefix):
		raw, err := base64.StdEncoding.DecodeString(s[len(boundPrefix):])
		if err != nil {
			return nil, fmt.Errorf("decode chunk bound: %w", err)
		}
		vals, err := rowkey.Key(raw).Values()
		if err != nil {
			return nil, fmt.Errorf("decode chunk bound: %w", err)
		}
		b := make(chunkBound, len(vals)) // not nil, even for no values: nil is an open end
		for i, v := range vals {
			b[i] = valueOfKey(v)
		}
		return b, nil
	case strings.HasPrefix(s, "["):
		var in []boundValueJSON
		if err := json.Unmarshal([]byte(s), &in); err != nil {
			return nil, fmt.Errorf("decode chunk bound: %w", err)
		}
		b := make(chunkBound, len(in))
		for i, v := range in {
			if v.Null {
				b[i] = nullValue
				continue
			}
			b[i] = sqlValue{Bytes: v.X}
			if b[i].Bytes == nil {
				b[i].Bytes = []byte{}
			}
		}
		return b, nil
	}
	return nil, fmt.Errorf("decode chunk bound: not a stored bound (%.8q...)", s)
}

// diffKeyColumns are the columns that identify a difference's row: the key, or every
// column of a keyless table.
func (p *tablePlan) diffKeyColumns() []int {
	if !p.Keyless {
		return p.Key
	}
	idx := make([]int, len(p.Columns))
	for i := range idx {
		idx[i] = i
	}
	return idx
}

// keyFor returns the key of a difference's row: its report form (the key columns' SQL
// literals) and its exact rowkey.Key.
func (p *tablePlan) keyFor(row []sqlValue) (Key, rowkey.Key) {
	idx := p.diffKeyColumns()
	k := make(Key, len(idx))
	vals := make([]sqlValue, len(idx))
	for i, c := range idx {
		k[i] = KeyValue{Column: p.Columns[c].Name, Value: sqlLiteral(p.Columns[c].Kind, row[c])}
		vals[i] = row[c]
	}
	rk, ok := p.appendKey(nil, idx, vals)
	if !ok {
		rk = nil // stored without it, read back from its literals
	}
	return k, rk
}

// storedDifference is a difference as diff_differences.diff holds it (JSON): its report
// entry (kind, key as SQL literals, columns, count), which report.json repeats, and its
// exact key (rk, the base64 of a rowkey.Key), which the re-check reads the row by.
// Differences stored by releases before rowkey have no rk: their key is read back from
// its literals (parseLiteral).
type storedDifference struct {
	Difference
	RowKey rowkey.Key `json:"rk,omitempty"`
}

func marshalDifference(d Difference) string {
	d.Class = "" // its own column
	data, _ := json.Marshal(storedDifference{Difference: d, RowKey: d.rk})
	return string(data)
}

func unmarshalDifference(data string) (Difference, error) {
	var sd storedDifference
	if err := json.Unmarshal([]byte(data), &sd); err != nil {
		return Difference{}, err
	}
	d := sd.Difference
	d.rk = sd.RowKey
	return d, nil
}

// keyValues returns the key values of a stored difference of p's table (diffKeyColumns'
// values, typed as keyValue types them): from its rowkey.Key, or from the literals of a
// difference stored by an earlier release.
func (p *tablePlan) keyValues(d Difference) ([]any, error) {
	idx := p.diffKeyColumns()
	mismatch := func() error {
		names := make([]string, len(d.Key))
		for i, kv := range d.Key {
			names[i] = kv.Column
		}
		want := make([]string, len(idx))
		for i, c := range idx {
			want[i] = p.Columns[c].Name
		}
		return fmt.Errorf("key (%s) does not match the table's (%s)", strings.Join(names, ", "), strings.Join(want, ", "))
	}
	if len(d.Key) != len(idx) {
		return nil, mismatch()
	}
	for i, kv := range d.Key {
		if !strings.EqualFold(kv.Column, p.Columns[idx[i]].Name) {
			return nil, mismatch()
		}
	}
	if d.rk != nil {
		vals, err := d.rk.Values()
		if err != nil {
			return nil, err
		}
		if len(vals) != len(idx) {
			return nil, fmt.Errorf("stored key has %d values for %d key columns", len(vals), len(idx))
		}
		return vals, nil
	}
	vals := make([]any, len(idx))
	for i, kv := range d.Key {
		v, err := parseLiteral(kv.Value)
		if err != nil {
			return nil, fmt.Errorf("key column %s: %w", kv.Column, err)
		}
		vals[i] = keyValue(p.Columns[idx[i]], v)
	}
	return vals, nil
}

// exactKey is the exact key of key values.
func exactKey(vals []any) (string, error) {
	k, err := rowkey.Encode(vals...)
	return string(k), err
}

// boundOf returns key values as a chunkBound (the values SQL reads rows by).
func boundOf(vals []any) chunkBound {
	b := make(chunkBound, len(vals))
	for i, v := range vals {
		b[i] = valueOfKey(v)
	}
	return b
}

// sameKey returns the form of a row's key values (diffKeyColumns') under which two keys
// are equal whenever the key columns' collations on both sides hold them equal, and
// possibly more often, never less: rowkey.Append by the coarser class of a character
// column's two collations ('Ase', 'ASE', 'Asé' and 'Ase ' are one key under
// utf8mb4_general_ci); a column whose collation Go cannot fold (rowkey.Opaque) is left out
// of every key's form. ok is false when a value could not be folded (a character the fold
// does not model, such as 'ß', equal to 's' in general_ci): such a value may equal values
// whose forms differ, so the form must not be matched (looseKey may).
func (p *tablePlan) sameKey(vals []any) (form string, ok bool) {
	idx := p.diffKeyColumns()
	var dst []byte
	for i, v := range vals {
		class := keyClass(p.Columns[idx[i]])
		if class == rowkey.Opaque {
			dst = append(dst, anyValue)
			continue
		}
		if dst, ok = rowkey.Append(dst, v, class); !ok {
			return "", false
		}
	}
	return string(dst), true
}

// looseKey returns a form of key values that is equal for every two keys whose values
// are equal outside character columns: coarser than sameKey, and defined for every key.
func (p *tablePlan) looseKey(vals []any) string {
	idx := p.diffKeyColumns()
	var dst []byte
	for i, v := range vals {
		if p.Columns[idx[i]].Kind == kindString {
			dst = append(dst, anyValue)
			continue
		}
		dst, _ = rowkey.Append(dst, v, rowkey.Exact)
	}
	return string(dst)
}

// anyValue stands in a key's form for a value left out of it: no value's encoding starts
// with it.
const anyValue = 0x00

// keyClass is how Go may fold column c's values to decide that two keys are one: for a
// character column the coarser of its two sides' collation classes, otherwise exact.
func keyClass(c planColumn) rowkey.Class {
	if c.Kind != kindString {
		return rowkey.Exact
	}
	a, b := rowkey.ClassOf(c.Collation[0]), rowkey.ClassOf(c.Collation[1])
	for _, k := range []rowkey.Class{rowkey.Opaque, rowkey.Folded, rowkey.PadSpace} {
		if a == k || b == k {
			return k // each class holds equal every pair the ones after it do
		}
	}
	return rowkey.Exact
}
