package checker

// sqltext.go owns value literals: a column value as the server printed it, the SQL
// literal of it for fix SQL and predicates, and reading a literal back. Identifiers go
// through internal/ident, never here. It must not build statements (checksum.go, fix.go).

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"
)

// sqlValue is one column value as the server printed it in the text protocol. Null
// distinguishes SQL NULL from an empty string.
type sqlValue struct {
	Null  bool
	Bytes []byte
}

// nullValue is SQL NULL.
var nullValue = sqlValue{Null: true}

// stringValue returns a non-NULL value with the given text.
func stringValue(s string) sqlValue { return sqlValue{Bytes: []byte(s)} }

func (v sqlValue) clone() sqlValue {
	if v.Null {
		return v
	}
	return sqlValue{Bytes: bytes.Clone(v.Bytes)}
}

var numericText = regexp.MustCompile(`^[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$`)

// sqlLiteral renders v as SQL text for a column of kind k, so that it can be pasted into any
// statement regardless of the session's sql_mode: numbers unquoted, text quoted with ”
// when it is plain printable UTF-8 without quotes or backslashes, other text as a hex
// literal with the _utf8mb4 introducer (_utf8mb4 X'..'), and binary values as a bare hex
// literal X'..'. This is the form used in fix SQL and in report.json.
//
// Text is read as utf8mb4 whatever the column's character set, so its literal must say
// so: a bare X'..' is a binary string, which the server stores into a latin1 column
// byte for byte (UTF-8 bytes, not the characters), where _utf8mb4 X'..' is converted to
// the column's character set on assignment. Only text that is not valid UTF-8 (which a
// server reading as utf8mb4 does not send) stays a bare X'..', its bytes as read.
func sqlLiteral(k colKind, v sqlValue) string {
	if v.Null {
		return "NULL"
	}
	switch k {
	case kindInt, kindDecimal, kindFloat, kindDouble, kindBit: // BIT is read as its integer
		if numericText.Match(v.Bytes) {
			return string(v.Bytes)
		}
	case kindBinary:
		return hexLiteral(v.Bytes)
	}
	if plainText(v.Bytes) {
		return "'" + string(v.Bytes) + "'"
	}
	if k == kindJSON {
		// MySQL and TiDB refuse JSON from a binary string.
		return "CONVERT(" + hexLiteral(v.Bytes) + " USING utf8mb4)"
	}
	if k == kindString && len(v.Bytes) > 0 && utf8.Valid(v.Bytes) {
		return utf8Introducer + hexLiteral(v.Bytes)
	}
	return hexLiteral(v.Bytes)
}

// utf8Introducer marks a hex literal as utf8mb4 text.
const utf8Introducer = "_utf8mb4 "

// predicateLiteral renders v for a comparison against a column of kind k in a chunk
// predicate. Text gets the _utf8mb4 introducer so the comparison uses the column's own
// collation (a bare X'..' would compare as binary); the connection character set of every
// checker session is utf8mb4.
func predicateLiteral(k colKind, v sqlValue) string {
	if v.Null {
		return "NULL"
	}
	switch k {
	case kindString:
		return utf8Introducer + hexLiteral(v.Bytes)
	case kindJSON:
		return "CAST(" + utf8Introducer + hexLiteral(v.Bytes) + " AS JSON)"
	}
	return sqlLiteral(k, v)
}

func hexLiteral(b []byte) string {
	if len(b) == 0 {
		return "''"
	}
	return "X'" + strings.ToUpper(hex.EncodeToString(b)) + "'"
}

func plainText(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if r < 0x20 || r == 0x7f || r == '\'' || r == '\\' || r == utf8.RuneError {
			return false
		}
	}
	return true
}

// parseLiteral reads back a literal written by sqlLiteral: NULL, a number, 'plain text',
// X'hex', _utf8mb4 X'hex' or CONVERT(X'hex' USING utf8mb4). It reads the keys of
// differences stored by releases before rowkey, which kept only their literals
// (keys.go, storedDifference).
func parseLiteral(s string) (sqlValue, error) {
	hexOf := func(h string) (sqlValue, error) {
		b, err := hex.DecodeString(h)
		if err != nil {
			return sqlValue{}, fmt.Errorf("literal %.40q: %w", s, err)
		}
		return sqlValue{Bytes: b}, nil
	}
	const convOpen, convClose = "CONVERT(X'", "' USING utf8mb4)"
	switch {
	case s == "NULL":
		return nullValue, nil
	case len(s) >= len(convOpen)+len(convClose) && strings.HasPrefix(s, convOpen) && strings.HasSuffix(s, convClose):
		return hexOf(s[len(convOpen) : len(s)-len(convClose)])
	case strings.HasPrefix(s, "X'") && strings.HasSuffix(s, "'") && len(s) >= 3:
		return hexOf(s[2 : len(s)-1])
	case strings.HasPrefix(s, utf8Introducer+"X'") && strings.HasSuffix(s, "'") && len(s) >= len(utf8Introducer)+3:
		return hexOf(s[len(utf8Introducer)+2 : len(s)-1])
	case len(s) >= 2 && s[0] == '\'' && s[len(s)-1] == '\'' && !strings.ContainsAny(s[1:len(s)-1], `'\`):
		return sqlValue{Bytes: []byte(s[1 : len(s)-1])}, nil
	case numericText.MatchString(s):
		return sqlValue{Bytes: []byte(s)}, nil
	}
	return sqlValue{}, fmt.Errorf("not a literal parity writes: %.40q", s)
}
