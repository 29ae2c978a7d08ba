package checker

// checksum.go owns every SQL statement that reads table data, on the encoding of
// encoding.go: the per-chunk checksum (and TiDB's forms of it), the key predicates of a
// range, the boundary walk, the drill-down row streams, the keyless hash groups and the
// benchmark-only lower bounds. Identifiers go through ident.Quote only. It must not
// execute a statement (the pair and the comparer do).

import (
	"bytes"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/tidb-parity/parity/internal/ident"
)

// ChecksumSQL returns the chunk checksum query for side s: one row (cnt, sum) where cnt is
// COUNT(*) and sum the exact SUM of the per-row hashes as a decimal string ('0' for no
// rows). r is the key range of the chunk.
func (p *tablePlan) ChecksumSQL(s pairSide, r keyRange) string {
	if p.batchFold(s) {
		return p.tidbChecksumSQL(s, r, "")
	}
	return "SELECT COUNT(*) AS cnt, IFNULL(SUM(" + p.rowHash(s) + "),0) AS sum FROM " + p.table(s) + p.whereClause(s, r)
}

// lowerBound selects a benchmark-only query (LowerBoundSQL) that bounds from below what
// any SQL checksum of a chunk can cost on a server.
type lowerBound string

const (
	// lowerBoundRead reads every compared column and hashes nothing.
	lowerBoundRead lowerBound = "read"
	// lowerBoundCRC32 is COUNT(*) and SUM(CRC32(row encoding)): a 32-bit per-row hash,
	// below the 64 bits the engine requires.
	lowerBoundCRC32 lowerBound = "crc32"
)

// LowerBoundSQL returns, for benchmarks only, a query over the chunk range r on side s
// that does less than any sound checksum can. lowerBoundRead returns COUNT(*) and, per
// compared column, the cheapest aggregate that still reads it (BIT_XOR of integers and
// BIT values, SUM(LENGTH(x)) of everything else); lowerBoundCRC32 hashes the row encoding
// with CRC32. The benchmark (scripts/bench/diffbench) times them in the bare loop's shape:
// a ratio against another tool that even the read bound does not reach cannot be reached
// by checksumming in SQL at all.
func (p *tablePlan) LowerBoundSQL(s pairSide, r keyRange, b lowerBound) string {
	if b == lowerBoundCRC32 {
		return "SELECT COUNT(*), IFNULL(SUM(CRC32(" + p.rowEncoding(s) + ")),0) FROM " + p.table(s) + p.whereClause(s, r)
	}
	aggs := []string{"COUNT(*)"}
	for _, c := range p.Columns {
		id := ident.Quote(c.Name)
		if c.Kind == kindInt || c.Kind == kindBit {
			aggs = append(aggs, "BIT_XOR("+id+")")
		} else {
			aggs = append(aggs, "SUM(LENGTH("+id+"))")
		}
	}
	return "SELECT " + strings.Join(aggs, ", ") + " FROM " + p.table(s) + p.whereClause(s, r)
}

// batchFold reports whether side s computes checksums in tidbChecksumSQL's form.
func (p *tablePlan) batchFold(s pairSide) bool {
	return p.Flavor[s] == FlavorTiDB && !p.Pushdown[s] && (p.Hash == HashSHA1 || p.Hash == HashMD5)
}

// tidbChecksumSQL is ChecksumSQL on TiDB: the same count and sum, computed without CONV.
// TiDB evaluates an expression column by column over a batch of rows only when every
// function in it can; CONV cannot, so the whole per-row hash (encoding, digest, fold) ran
// row by row. Here a derived table computes the digest's bytes, b = UNHEX(SHA1(row)), and
// the outer query reads its first 8 as a big-endian unsigned 64-bit integer byte by byte
// (ASCII of each 1-byte SUBSTRING, shifted and OR-ed): every function batch-evaluated, the
// same value as CAST(CONV(LEFT(SHA1(row),16),16,10) AS UNSIGNED). (LEFT on the hex digest,
// a utf8mb4 string, went through runes: about a tenth of the query.)
// The LIMIT keeps TiDB from merging the two projections back into one (which would
// evaluate the digest once per byte). Per 1M sysbench rows: 2.0-2.2 s of TiDB CPU against
// 3.0-3.1 s for the CONV form (TiDB v8.5, unistore).
//
// group, when not empty, is an expression of the row computed in the derived table as g
// and grouped by: the query then returns (g, cnt, sum) per group, ordered by g.
func (p *tablePlan) tidbChecksumSQL(s pairSide, r keyRange, group string) string {
	digest := "SHA1"
	if p.Hash == HashMD5 {
		digest = "MD5"
	}
	var v strings.Builder
	for i := range 8 {
		if i > 0 {
			v.WriteString(" | ")
		}
		fmt.Fprintf(&v, "(ASCII(SUBSTRING(b,%d,1))<<%d)", i+1, 56-8*i)
	}
	sel, inner, tail := "", "", ""
	if group != "" {
		sel, inner, tail = "g, ", group+" AS g, ", " GROUP BY g ORDER BY g"
	}
	return "SELECT " + sel + "COUNT(*) AS cnt, IFNULL(SUM(" + v.String() + "),0) AS sum FROM (SELECT " + inner + "UNHEX(" + digest + "(" +
		p.rowEncoding(s) + ")) AS b FROM " + p.table(s) + p.whereClause(s, r) + " LIMIT 18446744073709551615) AS x" + tail
}

func (p *tablePlan) whereClause(s pairSide, r keyRange) string {
	var conds []string
	if c := p.rangePredicate(s, r); c != "" {
		conds = append(conds, c)
	}
	if p.Where != "" {
		conds = append(conds, "("+p.Where+")")
	}
	if len(conds) == 0 {
		return ""
	}
	return " WHERE " + strings.Join(conds, " AND ")
}

// binaryCollation stands, in planColumn.Collation, for a TiDB without new collations:
// whatever its columns declare, it compares strings as their bytes, NO PAD.
const binaryCollation = "binary"

// compareBytes plans side s as a server that compares strings as their bytes, NO PAD (a
// TiDB without new collations): what the server does, not what its columns declare. The
// key order, the chunk ranges and the other side's comparisons follow it (keyRef).
func (p *tablePlan) compareBytes(s pairSide) {
	for i := range p.Columns {
		if p.Columns[i].Kind == kindString {
			p.Columns[i].Collation[s] = binaryCollation
		}
	}
}

// keyRef returns the key column as used in range predicates and index walks on side s.
// When the two sides' collations differ, the downstream compares with the upstream's
// collation so a row falls into the same chunk on both sides; with binaryCollation it
// compares the column's bytes (no COLLATE names that for a text column), and cannot use
// its index for the range.
func (p *tablePlan) keyRef(s pairSide, c planColumn) string {
	id := ident.Quote(c.Name)
	if c.Enum {
		id = "CAST(" + id + " AS CHAR)"
	}
	if s == downSide && c.Kind == kindString && c.Collation[0] != "" && c.Collation[0] != c.Collation[1] {
		if c.Collation[0] == binaryCollation {
			// TiDB compares the UTF-8 bytes it stores.
			if !isUTF8(c.Charset[1]) {
				id = "CONVERT(" + id + " USING utf8mb4)"
			}
			return byteString(p.Flavor[s], id)
		}
		if c.Charset[0] != c.Charset[1] {
			id = "CONVERT(" + id + " USING " + c.Charset[0] + ")"
		}
		return id + " COLLATE " + c.Collation[0]
	}
	return id
}

// rangePredicate renders lo < key <= hi as a lexicographic expansion that range
// optimizers on TiDB and MariaDB turn into index ranges:
//
//	k1 >= v1 AND (k1 > v1 OR (k1 = v1 AND k2 > v2))
func (p *tablePlan) rangePredicate(s pairSide, r keyRange) string {
	var conds []string
	if sup := p.byteRangeSuperset(s, r); sup != "" {
		conds = append(conds, sup)
	}
	if r.Lo != nil {
		conds = append(conds, p.boundPredicate(s, r.Lo, ">"))
	}
	if r.Hi != nil {
		conds = append(conds, p.boundPredicate(s, r.Hi, "<="))
	}
	return strings.Join(conds, " AND ")
}

// byteRangeSuperset returns, for a downstream whose first key column is compared as bytes
// (an upstream TiDB without new collations, keyRef), a predicate on the column itself that
// its index can serve and that every key of the range satisfies; "" when there is none.
// Every key between two strings in byte order starts with their common prefix P, and under
// the column's own PAD SPACE collation every string that starts with P lies between P
// followed by NUL characters and P followed by the collation's heaviest character, as many
// as the column holds: the lowest and highest weights there are. utf8mb4_general_ci
// weighs every character at most as U+FFFF (supplementary ones as U+FFFD), utf8mb4_bin by
// code point. Other collations (UCA ones expand and ignore characters) get no superset,
// and an open-ended range has no common prefix: the downstream scans for those.
// TestTiDBWithoutNewCollations checks the rows it selects and MariaDB's index range.
func (p *tablePlan) byteRangeSuperset(s pairSide, r keyRange) string {
	if s != downSide || len(p.Key) == 0 || len(r.Lo) == 0 || len(r.Hi) == 0 {
		return ""
	}
	c := p.Columns[p.Key[0]]
	if c.Kind != kindString || c.Enum || c.Collation[0] != binaryCollation || c.Charset[1] != "utf8mb4" {
		return ""
	}
	var heaviest string
	switch c.Collation[1] {
	case "utf8mb4_general_ci":
		heaviest = "\uffff"
	case "utf8mb4_bin":
		heaviest = "\U0010ffff"
	default:
		return ""
	}
	lo, hi := r.Lo[0], r.Hi[0]
	if lo.Null || hi.Null {
		return ""
	}
	n := 0
	for n < len(lo.Bytes) && n < len(hi.Bytes) && lo.Bytes[n] == hi.Bytes[n] {
		n++
	}
	pre := lo.Bytes[:n:n]
	for len(pre) > 0 && !utf8.Valid(pre) { // end on a whole character
		pre = pre[: len(pre)-1 : len(pre)-1]
	}
	if len(pre) == 0 {
		return ""
	}
	m := padLowChars(c)
	id := ident.Quote(c.Name)
	low := predicateLiteral(kindString, sqlValue{Bytes: append(pre, bytes.Repeat([]byte{0}, m)...)})
	high := predicateLiteral(kindString, sqlValue{Bytes: append(pre, strings.Repeat(heaviest, m)...)})
	return id + " >= " + low + " AND " + id + " <= " + high
}

func (p *tablePlan) boundPredicate(s pairSide, b chunkBound, op string) string {
	n := len(b)
	if n > len(p.Key) {
		n = len(p.Key)
	}
	strict := op[:1] // ">" or "<"
	refs := make([]string, n)
	lits := make([]string, n)
	cols := make([]planColumn, n)
	for i := 0; i < n; i++ {
		cols[i] = p.Columns[p.Key[i]]
		refs[i] = p.keyRef(s, cols[i])
		lits[i] = predicateLiteral(cols[i].Kind, b[i])
	}
	// Build from the last column outwards.
	expr := p.compare(s, cols[n-1], refs[n-1], op, b[n-1])
	for i := n - 2; i >= 0; i-- {
		expr = p.compare(s, cols[i], refs[i], strict, b[i]) + " OR (" + refs[i] + " = " + lits[i] + " AND (" + expr + "))"
	}
	if n > 1 {
		expr = p.compare(s, cols[0], refs[0], strict+"=", b[0]) + " AND (" + expr + ")"
	}
	return "(" + expr + ")"
}

// compare renders ref op v (op one of > >= < <=) for key column c on side s. It is the
// plain comparison except on a MySQL or MariaDB downstream of a TiDB upstream, for a
// string key under a PAD SPACE collation: there the two servers order some strings
// differently, and the comparison is written to follow TiDB's order (tidbPadOrder).
func (p *tablePlan) compare(s pairSide, c planColumn, ref, op string, v sqlValue) string {
	lit := predicateLiteral(c.Kind, v)
	plain := ref + " " + op + " " + lit
	if v.Null || !p.tidbPadOrder(s, c) {
		return plain
	}
	// PAD SPACE means comparing as if the shorter string were padded with spaces. MySQL
	// and MariaDB do exactly that; TiDB trims trailing spaces and then compares, so a
	// string ordered against one it extends differs when what follows the common part
	// starts (after spaces) with a character below the space (a tab, a newline, any
	// control character): MariaDB orders 'a\t' below 'a', TiDB above. Only two sets of
	// strings x are ordered differently against a bound b:
	//
	//   - extensions of b' (b without trailing spaces) that MariaDB puts below b; TiDB
	//     puts every extension of b' above b. In MariaDB's order the strings that extend
	//     b' form one interval, whose lowest member is b' followed by as many NUL
	//     characters as the column holds, l: these are exactly the x in [l, b).
	//   - prefixes of b after which b goes on with spaces and a control character
	//     (prefixesBelow): MariaDB puts them above b, TiDB below.
	//
	// So, in TiDB's order, x >= b is x >= l and x not one of those prefixes, x < b is
	// x < l or one of them, and so on: index ranges and points. (A LIKE 'b%' prefix would
	// not do: MariaDB's range optimizer starts a LIKE range at b' padded with spaces, so
	// an index scan misses the very strings at stake.) TestPadSpaceOrder compares every
	// form with TiDB's own answers.
	t := bytes.TrimRight(v.Bytes, " ")
	low := predicateLiteral(kindString, sqlValue{Bytes: append(t[:len(t):len(t)], make([]byte, padLowChars(c))...)})
	below := ""
	if pre := prefixesBelow(v.Bytes); len(pre) > 0 {
		lits := make([]string, len(pre))
		for i, x := range pre {
			lits[i] = predicateLiteral(c.Kind, sqlValue{Bytes: x})
		}
		below = ref + " IN (" + strings.Join(lits, ", ") + ")"
	}
	var out string
	switch op {
	case ">", ">=":
		out = ref + " >= " + low
		if op == ">" {
			out += " AND " + ref + " <> " + lit
		}
		if below != "" {
			out += " AND NOT " + below
		}
	case "<", "<=":
		out = ref + " < " + low
		if op == "<=" {
			out += " OR " + ref + " = " + lit
		}
		if below != "" {
			out += " OR " + below
		}
	default:
		return plain
	}
	return "(" + out + ")"
}

// padLowChars is how many NUL characters follow a bound's text in the lowest string that
// extends it (compare): at least as many characters as the column holds, at most 3072
// (the longest index key, and so the longest key value that can be cut on).
func padLowChars(c planColumn) int {
	n := c.MaxBytes
	if c.Charset[0] == "utf8mb4" && c.Charset[1] == "utf8mb4" {
		n = (n + 3) / 4
	}
	return int(max(1, min(n, 3072)))
}

// tidbPadOrder reports whether key comparisons on side s must be rewritten to follow the
// TiDB upstream's order of a PAD SPACE collation (compare): on a MySQL or MariaDB
// downstream, for a string key column whose comparison collation (the upstream's, see
// keyRef) pads with spaces. Boundaries come from the upstream's key order; evaluated in
// the same order on both sides, the chunks hold the same keys.
func (p *tablePlan) tidbPadOrder(s pairSide, c planColumn) bool {
	if s != downSide || p.Flavor[upSide] != FlavorTiDB || p.Flavor[downSide] == FlavorTiDB || c.Kind != kindString || c.Enum {
		return false
	}
	coll := c.Collation[1]
	if c.Collation[0] != "" && c.Collation[0] != c.Collation[1] {
		coll = c.Collation[0]
	}
	return padSpace(coll)
}

// padSpace reports whether a collation compares with PAD SPACE: all but binary, MariaDB's
// _nopad_ collations and MySQL's _0900_ ones.
func padSpace(coll string) bool {
	return coll != "" && coll != "binary" && !strings.Contains(coll, "_nopad_") && !strings.Contains(coll, "_0900_")
}

// prefixesBelow returns the prefixes of b after which b continues with spaces (possibly
// none) and then a character below the space, without those spaces: the strings that
// MySQL orders above b and TiDB below it.
func prefixesBelow(b []byte) [][]byte {
	var out [][]byte
	for j, ch := range b {
		if ch >= 0x20 {
			continue
		}
		k := j
		for k > 0 && b[k-1] == ' ' {
			k--
		}
		out = append(out, b[:k:k]) // k grows with j: b[k-1], if any, is not a space
	}
	return out
}

func (p *tablePlan) keyList(s pairSide) string {
	parts := make([]string, len(p.Key))
	for i, k := range p.Key {
		parts[i] = p.keyRef(s, p.Columns[k])
	}
	return strings.Join(parts, ", ")
}

func (p *tablePlan) keySelect() string {
	parts := make([]string, len(p.Key))
	for i, k := range p.Key {
		parts[i] = p.selectExpr(p.Columns[k])
	}
	return strings.Join(parts, ", ")
}

// selectExpr is how a column is read for comparison in Go: as the server prints it,
// except BIT, read as its unsigned integer, and FLOAT/DOUBLE, read as DOUBLE. Both servers
// print a DOUBLE in its shortest round-trip form, so the text identifies the value exactly;
// MariaDB prints a FLOAT with 6 digits (3.14159 for a stored 3.1415927), and a
// FLOAT(M,D)/DOUBLE(M,D) with D decimals, while CAST(... AS DOUBLE) widens exactly and
// prints in full (3.1415927410125732). The exact text also makes exact literals in fix SQL.
func (p *tablePlan) selectExpr(c planColumn) string {
	switch c.Kind {
	case kindBit:
		return "CAST(" + ident.Quote(c.Name) + " AS UNSIGNED)"
	case kindFloat, kindDouble:
		return "CAST(" + ident.Quote(c.Name) + " AS DOUBLE)"
	}
	return ident.Quote(c.Name)
}

// boundarySQL returns the key of the row `offset` rows past the start of range r in key
// order (the index walk that cuts the next chunk), or no row when fewer remain.
func (p *tablePlan) boundarySQL(s pairSide, r keyRange, offset int) string {
	return fmt.Sprintf("SELECT %s FROM %s%s ORDER BY %s LIMIT %d,1", p.keySelect(), p.table(s), p.whereClause(s, r), p.keyList(s), offset)
}

// keysSQL returns the first n keys of range r in key order (cutting several chunks with
// one index walk).
func (p *tablePlan) keysSQL(s pairSide, r keyRange, n int) string {
	return fmt.Sprintf("SELECT %s FROM %s%s ORDER BY %s LIMIT %d", p.keySelect(), p.table(s), p.whereClause(s, r), p.keyList(s), n)
}

// regionSampleSQL returns the first row key of every TiDB region of the table (TiDB only).
func (p *tablePlan) regionSampleSQL() string {
	return fmt.Sprintf("SELECT %s FROM %s TABLESAMPLE REGIONS() ORDER BY %s", p.keySelect(), p.table(upSide), p.keyList(upSide))
}

// orderExpr orders drill-down streams so that Go can merge them: strings by their UTF-8
// bytes (no collation, no pad space, byteString), everything else by value.
func (p *tablePlan) orderExpr(c planColumn, s pairSide) string {
	id := ident.Quote(c.Name)
	switch c.Kind {
	case kindString:
		if !isUTF8(c.Charset[s]) {
			id = "CONVERT(" + id + " USING utf8mb4)"
		}
		return byteString(p.Flavor[s], id)
	}
	return id
}

// byteString returns text expression x as a binary string of all its bytes, compared and
// ordered byte by byte, on a server of flavor f. The servers need different spellings:
//   - TiDB casts a VARCHAR(n) to a binary string of n bytes, so CAST(… AS BINARY) sorted
//     a value longer than n bytes (a VARCHAR(3) holding 中a) by its first n bytes only:
//     keys sharing them tied and came in TiDB's own order, and the drill-down's merge
//     reported each such row as missing and extra (found by the randomized test, seed
//     5378; TestTiDBLongKeyOrder). CONVERT(… USING binary) keeps every byte on TiDB;
//   - MariaDB orders CONVERT(… USING binary) of a text column with PAD SPACE (中\t before
//     中), and CAST(… AS BINARY) by the bytes.
func byteString(f Flavor, x string) string {
	if f == FlavorTiDB {
		return "CONVERT(" + x + " USING binary)"
	}
	return "CAST(" + x + " AS BINARY)"
}

// rowColumns returns what a row read on side s holds: the compared columns, then on the
// upstream the carried ones (width).
func (p *tablePlan) rowColumns(s pairSide) []string {
	cols := make([]string, 0, p.width(s))
	for _, c := range p.Columns {
		cols = append(cols, p.selectExpr(c))
	}
	if s == upSide {
		for _, c := range p.Carried {
			cols = append(cols, p.selectExpr(c))
		}
	}
	return cols
}

// width is the number of values of a row read on side s (rowColumns).
func (p *tablePlan) width(s pairSide) int {
	if s == upSide {
		return len(p.Columns) + len(p.Carried)
	}
	return len(p.Columns)
}

// rangeRowsSQL streams the rows of a range on side s: every compared column (then the
// carried ones upstream), in the byte/value order of the key that compareKeys expects.
func (p *tablePlan) rangeRowsSQL(s pairSide, r keyRange) string {
	return p.rowsSQL(s, p.whereClause(s, r))
}

func (p *tablePlan) rowsSQL(s pairSide, where string) string {
	cols := p.rowColumns(s)
	order := make([]string, len(p.Key))
	for i, k := range p.Key {
		order[i] = p.orderExpr(p.Columns[k], s)
	}
	return fmt.Sprintf("SELECT %s FROM %s%s ORDER BY %s", strings.Join(cols, ", "), p.table(s), where, strings.Join(order, ", "))
}

// rowsInRangesSQL streams the rows of several disjoint ranges (in key order) on side s,
// in rangeRowsSQL's columns and order: one query for the differing buckets of a chunk.
func (p *tablePlan) rowsInRangesSQL(s pairSide, rs []keyRange) string {
	terms := make([]string, 0, len(rs))
	for _, r := range rs {
		if c := p.rangePredicate(s, r); c != "" {
			terms = append(terms, "("+c+")")
		} else {
			terms = append(terms, "TRUE")
		}
	}
	where := " WHERE (" + strings.Join(terms, " OR ") + ")"
	if p.Where != "" {
		where += " AND (" + p.Where + ")"
	}
	return p.rowsSQL(s, where)
}

// rowsByKeysSQL reads the rows with the given keys (values in key order) on side s, in
// rangeRowsSQL's columns and order, within the user's row filter: the re-check reads the rows
// of stored differences again. Each key is an equality per key column (with the collation
// of the range predicates), OR-ed: both servers' range optimizers turn it into point
// lookups.
func (p *tablePlan) rowsByKeysSQL(s pairSide, keys []chunkBound) string {
	terms := make([]string, len(keys))
	for i, k := range keys {
		conds := make([]string, len(p.Key))
		for j, ki := range p.Key {
			c := p.Columns[ki]
			if j >= len(k) || k[j].Null {
				conds[j] = p.keyRef(s, c) + " IS NULL"
				continue
			}
			ref, lit := p.keyRef(s, c), predicateLiteral(c.Kind, k[j])
			conds[j] = ref + " = " + lit
			if ref != ident.Quote(c.Name) && c.Collation[0] == binaryCollation {
				// Equal bytes are equal under any collation: the column's own equality
				// is a superset its index can look up.
				conds[j] = ident.Quote(c.Name) + " = " + lit + " AND " + conds[j]
			}
		}
		terms[i] = "(" + strings.Join(conds, " AND ") + ")"
	}
	where := " WHERE (" + strings.Join(terms, " OR ") + ")"
	if p.Where != "" {
		where += " AND (" + p.Where + ")"
	}
	return p.rowsSQL(s, where)
}

// hashGroupsSQL returns (h, n) for every distinct row hash of a range, ordered by h: the
// drill-down of keyless tables compares these multisets.
func (p *tablePlan) hashGroupsSQL(s pairSide, r keyRange) string {
	return fmt.Sprintf("SELECT h, COUNT(*) FROM (SELECT %s AS h FROM %s%s) AS x GROUP BY h ORDER BY h", p.rowHash(s), p.table(s), p.whereClause(s, r))
}

// keylessFetchBatch is how many row hashes one rowsByHashesSQL query looks for.
const keylessFetchBatch = 256

// rowsByHashesSQL returns the rows of a range whose row hash is one of hs (decimal
// strings), each followed by its hash.
func (p *tablePlan) rowsByHashesSQL(s pairSide, r keyRange, hs []string) string {
	lits := make([]string, len(hs))
	for i, h := range hs {
		lits[i] = h
		if h == "" || strings.Trim(h, "0123456789") != "" {
			lits[i] = "NULL" // not a hash the server computed: matches nothing
		}
	}
	cols := p.rowColumns(s)
	w := p.whereClause(s, r)
	if w == "" {
		w = " WHERE "
	} else {
		w += " AND "
	}
	h := p.rowHash(s)
	return fmt.Sprintf("SELECT %s, %s FROM %s%s%s IN (%s)", strings.Join(cols, ", "), h, p.table(s), w, h, strings.Join(lits, ", "))
}

// numericKey reports whether every key column orders the same in Go and in SQL
// regardless of collation (numbers and temporal values).
func (p *tablePlan) numericKey() bool {
	for _, k := range p.Key {
		switch p.Columns[k].Kind {
		case kindInt, kindDecimal, kindTemporal:
		default:
			return false
		}
	}
	return true
}

// intKey reports whether the table has a key of one integer column: such ranges are cut by
// key value, and narrowed or grouped by key buckets (bucketChecksumSQL).
func (p *tablePlan) intKey() bool {
	return len(p.Key) == 1 && !p.Keyless && p.Columns[p.Key[0]].Kind == kindInt
}

// minMaxSQL returns the smallest and largest key of a range (single-column keys).
func (p *tablePlan) minMaxSQL(s pairSide, r keyRange) string {
	k := ident.Quote(p.Columns[p.Key[0]].Name)
	return "SELECT MIN(" + k + "), MAX(" + k + ") FROM " + p.table(s) + p.whereClause(s, r)
}

// bucketChecksumSQL returns (bucket, cnt, sum) per bucket of an integer key range, where
// bucket = FLOOR((key - base) / width) computed exactly in DECIMAL: one scan yields the
// checksums of many sub-ranges, so a mismatched chunk is narrowed in one query per side.
//
// intMath, when every key of the range minus base fits a signed BIGINT, computes the
// bucket as (key - base) DIV width in integer arithmetic instead (the same number for the
// range's keys, which are >= base). Per 1M sysbench rows in 248 grouped chunk queries
// (64-row buckets), MariaDB spent 2.15-2.45 s of CPU with integers and 2.29-2.89 s with
// DECIMAL, against 1.70-1.95 s for the plain checksum; on TiDB the two forms cost the same
// within noise.
func (p *tablePlan) bucketChecksumSQL(s pairSide, r keyRange, base, width string, intMath bool) string {
	k := ident.Quote(p.Columns[p.Key[0]].Name)
	b := "FLOOR((CAST(" + k + " AS DECIMAL(65,0)) - " + base + ") / " + width + ")"
	if intMath {
		b = "((" + k + " - " + base + ") DIV " + width + ")"
	}
	if p.batchFold(s) {
		return p.tidbChecksumSQL(s, r, b)
	}
	return "SELECT " + b + " AS b, COUNT(*), IFNULL(SUM(" + p.rowHash(s) + "),0) FROM " + p.table(s) + p.whereClause(s, r) + " GROUP BY b ORDER BY b"
}
