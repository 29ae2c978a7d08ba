package checker

// encoding.go owns how a table pair is compared row by row: the plan (tablePlan: both
// sides' tables, the compared columns, the key), each column's text on each side, the
// row encoding (with the digests fitEncoding chooses for columns too long to
// concatenate within the packet) and the per-row hash over it. The statements that use
// them are in checksum.go; it must not hold SQL statements itself, nor read a server.

import (
	"strings"

	"github.com/tidb-parity/parity/internal/ident"
)

// Hash selects the per-row hash of the checksum query. Every variant yields a 64-bit
// unsigned integer per row; rows are aggregated with SUM (exact DECIMAL on both servers, so
// duplicated rows never cancel out as they do under BIT_XOR) and paired with COUNT(*).
type Hash string

const (
	// HashSHA1 takes the first 64 bits of SHA1 of the row encoding (the default: measured
	// fastest of the cryptographic hashes on both MariaDB and TiDB, see docs/diff.md).
	HashSHA1 Hash = "sha1"
	// HashMD5 takes the first 64 bits of MD5.
	HashMD5 Hash = "md5"
	// HashCRC32Pair concatenates CRC32(row) and CRC32(REVERSE(row)). Kept only for
	// benchmarks: CRC is affine over GF(2), so two rows that swap equal-length values
	// collide under XOR-style aggregates, and salting does not add bits (CRC of a prefixed
	// string is a function of the CRC of the string). Never the default.
	HashCRC32Pair Hash = "crc32pair"
)

// TiDBChecksum is where a TiDB side computes checksums (Config.TiDBChecksum).
type TiDBChecksum string

const (
	TiDBChecksumAuto     TiDBChecksum = "auto"
	TiDBChecksumPushdown TiDBChecksum = "pushdown"
	TiDBChecksumTiDB     TiDBChecksum = "tidb"
)

// Side is upstream or downstream.
type pairSide int

const (
	upSide pairSide = iota
	downSide
)

func (s pairSide) String() string {
	if s == upSide {
		return "upstream"
	}
	return "downstream"
}

// planColumn is a compared column: its name and the kind taken from the upstream.
type planColumn struct {
	Name string
	Kind colKind
	// NotNull is set when the column is NOT NULL on both sides (its encoding then needs
	// no NULL marker).
	NotNull bool
	// Enum is set for ENUM and SET columns: their index orders by member number, but
	// they compare with strings as text, so key predicates and walks use their text.
	Enum bool
	// Unsigned is set for an integer column that is UNSIGNED upstream: its key values are
	// uint64 (keyValue).
	Unsigned bool
	// per side: character set and collation (index 0 upstream, 1 downstream).
	Charset   [2]string
	Collation [2]string
	// MaxBytes bounds the column's text on either side (schemaColumn.MaxBytes).
	MaxBytes int64
	// Digest puts SHA1 of the column's text into the row encoding instead of the text
	// (fitEncoding), for columns too long to concatenate.
	Digest bool
}

// tablePlan is how one table pair is compared: the tables on both sides, the compared
// columns (upstream order, ignored and generated columns removed) and the key.
type tablePlan struct {
	Schema  [2]string // per side
	Table   [2]string
	Flavor  [2]Flavor
	Columns []planColumn
	// Key holds the indexes into Columns of the row key, in key order. For a keyless
	// table it holds the NOT NULL, orderable columns used only to cut chunks (possibly
	// none), and Keyless is true.
	Key     []int
	Keyless bool
	// PartialColumns is set when some downstream columns are not compared (ignored, or
	// absent upstream): fix SQL then updates instead of replacing whole rows.
	PartialColumns bool
	// Carried are the ignored columns that both sides have (plain, not generated,
	// downstream): not compared, but read from the upstream after the compared columns,
	// so that fix SQL inserts a missing row whole, with the upstream's values, instead of
	// leaving them to their defaults (which a NOT NULL column without one refuses).
	Carried []planColumn
	// Referenced is set when a foreign key references the downstream table: fix SQL then
	// updates rows in place instead of replacing them, because REPLACE deletes the old row
	// first and an ON DELETE CASCADE would delete its children with it.
	Referenced bool
	Hash       Hash
	// Pushdown, per side, marks a TiDB whose checksum expressions are written so that TiDB
	// pushes them down to its coprocessor (every function on TiKV's list: SUBSTRING, not
	// LEFT; no derived table). Otherwise a TiDB side uses tidbChecksumSQL's form,
	// evaluated in TiDB.
	Pushdown [2]bool
	// Where is the user's optional row filter, applied on both sides.
	Where string
}

func (p *tablePlan) table(s pairSide) string { return ident.Table(p.Schema[s], p.Table[s]) }

// keyNames returns the key column names.
func (p *tablePlan) keyNames() []string {
	out := make([]string, len(p.Key))
	for i, k := range p.Key {
		out[i] = p.Columns[k].Name
	}
	return out
}

func isUTF8(cs string) bool {
	switch cs {
	case "", "utf8mb4", "utf8", "utf8mb3", "binary":
		return true
	}
	return false
}

// text returns an expression yielding the column's value as text (bytes) on side s.
func (p *tablePlan) text(s pairSide, c planColumn) string {
	id := ident.Quote(c.Name)
	switch c.Kind {
	case kindString:
		if !isUTF8(c.Charset[s]) {
			return "CONVERT(" + id + " USING utf8mb4)"
		}
		return id
	case kindJSON:
		if p.Flavor[s] == flavorMariaDB {
			return id // LONGTEXT: the stored text (what TiCDC wrote, in TiDB's format)
		}
		return "CAST(" + id + " AS CHAR)"
	case kindBit:
		return "CAST(" + id + " AS UNSIGNED)"
	case kindFloat:
		return floatText("CAST(" + id + " AS DOUBLE)")
	case kindDouble:
		return floatText(id)
	}
	return id
}

// floatText encodes a FLOAT/DOUBLE exactly and identically on TiDB and MySQL/MariaDB,
// which print floating-point values differently (TiDB: 3.1415927, 100000000000000000000;
// MariaDB: 3.14159, 1e20): as its binary form m 'p' E, the integer mantissa and the binary
// exponent, x = m × 2^(E-52) (m has 53 bits and the sign; subnormals keep E = -1022 and a
// shorter m). x is a DOUBLE expression (a FLOAT column is widened exactly by CAST).
//
// Only exact IEEE operations decide the result: dividing by a power of two (exact while
// the quotient is normal or an integer) and comparing. LOG2 merely guesses the exponent:
// TiDB's and MariaDB's LOG2 differ in the last bit, and LOG2(1.7976931348623157e308) is
// 1024 on both. Taking the floor of LOG2(|x|) - 1e-9 makes the guess g either the
// exponent or one less (never 1024, so POW never overflows, which would be an error, not
// infinity); |x| / 2^g >= 2 says which. The encoding is injective (different doubles
// never encode alike, unlike a decimal rounding of LOG10/POW(10) arithmetic, which also
// differs between the servers for about a third of random doubles at 17 digits), and 0
// and -0 both encode as 0. NaN and infinities cannot be stored in MySQL, TiDB or MariaDB.
func floatText(x string) string {
	a := "ABS(" + x + ")"
	g := "GREATEST(FLOOR(LOG2(" + a + ") - 1e-9), -1074)"
	e := "GREATEST(" + g + " + (" + a + " / POW(2, " + g + ") >= 2), -1022)"
	m := "CAST(" + x + " / POW(2, " + e + " - 52) AS SIGNED)"
	return "CASE WHEN " + x + " = 0 THEN '0' ELSE IFNULL(CONCAT(" + m + ", 'p', CAST(" + e + " AS SIGNED)), CONCAT('raw', " + x + ")) END"
}

// fields returns the CONCAT_WS fields that encode column c on side s:
//
//   - numbers, temporal values, BIT and FLOAT/DOUBLE: one field, their text, which never
//     contains ',' and never equals 'N'; 'N' for NULL (IFNULL(x,'N')).
//   - strings, binaries and JSON (variable bytes): two fields, the byte length and then the
//     bytes, LENGTH(x) and x; for NULL the length field is 'N' and the value field is NULL,
//     which CONCAT_WS skips (IFNULL(LENGTH(x),'N') and x).
//
// The length as a field of its own costs one CONCAT_WS argument where CONCAT(LENGTH(x),
// ':', x) built a temporary string per value: 0.52 s against 0.68 s per 1M sysbench rows
// on MariaDB and 1.17 s against 1.72 s on TiDB for the whole-table SUM(LENGTH(encoding))
// (docs/diff.md). rowEncoding proves the row encoding injective.
func (p *tablePlan) fields(s pairSide, c planColumn) []string {
	x := p.text(s, c)
	if c.Kind.variableBytes() {
		if c.NotNull {
			return []string{"LENGTH(" + x + ")", p.value(s, c)}
		}
		return []string{"IFNULL(LENGTH(" + x + "),'N')", p.value(s, c)}
	}
	if c.NotNull {
		return []string{x}
	}
	return []string{"IFNULL(" + x + ",'N')"}
}

// encode returns the encoding of column c alone as one expression (for tests that show
// which column differs).
func (p *tablePlan) encode(s pairSide, c planColumn) string {
	f := p.fields(s, c)
	if len(f) == 1 {
		return f[0]
	}
	return "CONCAT_WS(','," + strings.Join(f, ",") + ")"
}

// rowEncoding returns the SQL expression of the row encoding on side s: the fields of
// every compared column (see fields) joined by CONCAT_WS(',', ...) in plan order, except
// that the last NOT NULL string or binary column r (if any) is moved to the end as its
// bare bytes, without a length field.
//
// The encoding is injective: given the plan (which fixes the sequence of columns and their
// kinds), the row is decoded from its encoding left to right, so two different rows never
// encode alike.
//
//   - A text column (number, temporal, BIT, FLOAT/DOUBLE): its field runs to the next ','
//     (its text never contains ','); 'N' is NULL (no such text equals 'N').
//   - A variable-bytes column: its first field runs to the next ',' (a decimal length
//     never contains ','). 'N' means NULL, and the value field is absent (CONCAT_WS
//     skipped it), so the next column starts right after. A length L means the value is
//     exactly the L bytes after that ',', whatever they contain (',', 'N', digits), and
//     the next column starts after the ',' that follows them. So NULL ('N'), ” ('0,'),
//     'N' ('1,N') and 'NULL' ('4,NULL') all differ, and a separator inside a value, or
//     bytes moved from one column to the next, change a length.
//   - r: everything after the last ',' consumed by the fields before it. r is NOT NULL,
//     so CONCAT_WS never skips it; a nullable column cannot go there ('N' would be both
//     NULL and the string 'N').
//
// CONCAT_WS never skips any other field: text fields and length fields are wrapped in
// IFNULL. Moving r last is a fixed permutation of the columns, so column order still
// counts. Leaving r without a length saves a LENGTH and a field per row.
// TestRowEncodingDecodes decodes the encodings that MariaDB computes for rows built to
// collide under careless encodings.
func (p *tablePlan) rowEncoding(s pairSide) string {
	raw := p.rawLast()
	parts := make([]string, 0, 2*len(p.Columns))
	for i, c := range p.Columns {
		if i != raw {
			parts = append(parts, p.fields(s, c)...)
		}
	}
	if raw >= 0 {
		parts = append(parts, p.value(s, p.Columns[raw]))
	}
	if len(parts) == 1 {
		return parts[0]
	}
	return "CONCAT_WS(','," + strings.Join(parts, ",") + ")"
}

// value returns the value field of a variable-bytes column c: its text, or for a Digest
// column SHA1 of its text, 40 hexadecimal digits (NULL for NULL, as the text).
func (p *tablePlan) value(s pairSide, c planColumn) string {
	if c.Digest {
		return "SHA1(" + p.text(s, c) + ")"
	}
	return p.text(s, c)
}

// encodingSlack is what fitEncoding leaves free of a server's max_allowed_packet.
const encodingSlack = 1024

// fitEncoding makes every row's encoding fit in packet bytes, the smaller
// max_allowed_packet of the two servers. Both MariaDB/MySQL and TiDB turn a CONCAT_WS
// result longer than max_allowed_packet into NULL (with a warning only), so the row's
// hash would be NULL and SUM would skip it: with rows that wide on both sides, a
// difference in them would never be seen. fitEncoding bounds the encoding's length from
// the columns' maximum lengths and, while the bound exceeds packet, turns the longest
// remaining variable-bytes column into a Digest column (its value field becomes SHA1 of
// its text, 40 bytes). It returns the digested columns' names. Columns of the sizes
// people mostly use (VARCHAR, TEXT) stay inline; LONGTEXT, LONGBLOB and JSON are digested
// under every packet size, MEDIUMTEXT and MEDIUMBLOB under the 16 MiB default.
func (p *tablePlan) fitEncoding(packet int64) []string {
	var out []string
	for p.encodingBound() > packet-encodingSlack {
		best := -1
		for i, c := range p.Columns {
			if c.MaxBytes > 40 && !c.Digest && c.Kind.variableBytes() &&
				(best < 0 || c.MaxBytes > p.Columns[best].MaxBytes) {
				best = i
			}
		}
		if best < 0 {
			break // every long column is digested; what is left cannot be shortened
		}
		p.Columns[best].Digest = true
		out = append(out, p.Columns[best].Name)
	}
	return out
}

// encodingBound is an upper bound of the row encoding's length in bytes: per column its
// separator, a length field of up to 20 digits and the value (its MaxBytes, or 40 for a
// digest) for variable-bytes kinds, and 100 bytes for the others (a DECIMAL(65,30) prints
// in 67).
func (p *tablePlan) encodingBound() int64 {
	var n int64
	for _, c := range p.Columns {
		switch {
		case !c.Kind.variableBytes():
			n += 100
		case c.Digest:
			n += 22 + 40
		default:
			n += 22 + c.MaxBytes
		}
	}
	return n
}

// rawLast returns the index of the column encoded last without a length field: the last
// NOT NULL string or binary column, or -1.
func (p *tablePlan) rawLast() int {
	for i := len(p.Columns) - 1; i >= 0; i-- {
		if c := p.Columns[i]; c.NotNull && (c.Kind == kindString || c.Kind == kindBinary) {
			return i
		}
	}
	return -1
}

// rowHash returns the SQL expression of the 64-bit unsigned per-row hash on side s.
func (p *tablePlan) rowHash(s pairSide) string {
	return hashExpr(p.Hash, p.rowEncoding(s), p.Flavor[s] == FlavorTiDB && p.Pushdown[s])
}

// hashExpr folds the digest of row to its first 64 bits. pushdown writes SUBSTRING(h,1,16)
// instead of LEFT(h,16) (the same value): TiDB pushes SUBSTRING down to TiKV, not LEFT.
// Kept in TiDB, the LEFT form was about 1 s cheaper per 1M rows on unistore (1.7-1.8 s
// against 2.6-3.0 s), whose coprocessor evaluates a pushed-down expression row by row.
func hashExpr(h Hash, row string, pushdown bool) string {
	left := func(x string) string {
		if pushdown {
			return "SUBSTRING(" + x + ",1,16)"
		}
		return "LEFT(" + x + ",16)"
	}
	switch h {
	case HashMD5:
		return "CAST(CONV(" + left("MD5("+row+")") + ",16,10) AS UNSIGNED)"
	case HashCRC32Pair:
		return "((CRC32(" + row + ") << 32) | CRC32(REVERSE(" + row + ")))"
	}
	return "CAST(CONV(" + left("SHA1("+row+")") + ",16,10) AS UNSIGNED)"
}
