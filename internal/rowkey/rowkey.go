// Package rowkey is parity's one notion of "the same row key" in Go.
//
// A key is the values of a row's key columns. Two spellings can be one key: under a
// column's collation 'Ase', 'ASE', 'Asé' and 'Ase ' are all equal in utf8mb4_general_ci,
// and 'a' equals 'a ' under every PAD SPACE collation. Wherever Go code decides whether
// two keys are the same key — the applier routing rows to workers, maps keyed by row key —
// it must put collation-equal keys together: grouping more keys together than the
// collation does only costs parallelism, grouping fewer loses rows (two workers write
// 'Ase' and 'Asé' concurrently, and the DELETE of one removes the other).
//
// Append writes a key's values in a stable, type-tagged binary form (1 and '1' differ,
// NULL is distinct) in which character values are folded by their column's Class: equal
// forms for every pair of values the collation holds equal, possibly for some it does
// not. Where no safe fold is known in Go (a locale-tailored collation, a character whose
// equivalences parity does not model), Append reports it and the caller must treat the
// key as possibly equal to any other key of the table (the applier then writes the table
// through one ordered connection). Lookups and scans by key are never done in Go: they go
// through SQL with the column's own collation.
//
// It is its own leaf package (standard library and golang.org/x/text only) so that the
// applier (cdc) and the checker share it without importing each other.
package rowkey

import (
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// Class says how a key column's values compare.
type Class uint8

const (
	// Exact compares the bytes as they are: binary strings, and every value that is not
	// a character string (numbers, DECIMAL and temporal text, ENUM and SET indexes).
	Exact Class = iota
	// PadSpace compares bytes with trailing spaces ignored: the _bin collations.
	PadSpace
	// Folded is a case- and accent-insensitive collation without locale tailoring
	// (general_ci, unicode_ci, unicode_520_ci, 0900_ai_ci, uca1400_ai_ci and their
	// NO PAD and accent/case-sensitive variants): values are folded (see foldText).
	Folded
	// Opaque is a collation parity cannot fold safely (locale-tailored, unknown):
	// every character value is reported as unfoldable.
	Opaque
)

func (c Class) String() string {
	switch c {
	case Exact:
		return "exact"
	case PadSpace:
		return "pad-space"
	case Folded:
		return "folded"
	}
	return "opaque"
}

// genericCollation matches the collations without locale tailoring. Everything else
// with a language in its name (latin1_swedish_ci, utf8mb4_german2_ci, …) is Opaque:
// their tailorings make other strings equal ('Ü' = 'Y' in swedish, 'ä' = 'ae' in german2).
var genericCollation = regexp.MustCompile(`^[a-z0-9]+_(general|general_nopad|general_mysql500|unicode|unicode_nopad|unicode_520|unicode_520_nopad|0900|uca1400|uca1400_nopad)(_ai|_as)?_(ci|cs)$`)

// ClassOf returns the class of a character column with the given collation (as
// information_schema.COLUMNS.COLLATION_NAME spells it; empty for a non-character column,
// which is Exact). An unknown collation is Opaque.
func ClassOf(collation string) Class {
	c := strings.ToLower(collation)
	switch {
	case c == "", c == "binary":
		return Exact
	case strings.HasSuffix(c, "_bin"):
		return PadSpace // NO PAD _bin collations compare exactly: trimming is coarser, still safe
	case genericCollation.MatchString(c):
		return Folded
	}
	return Opaque
}

// Type tags of the encoding.
const (
	tagNull   = 0x01
	tagInt    = 0x02
	tagUint   = 0x03
	tagFloat  = 0x04
	tagBytes  = 0x05 // a binary string
	tagText   = 0x06 // a PadSpace or Folded string, after folding (Append only)
	endOfText = 0x00 // then 0x01; a 0x00 byte inside is written 0x00 0xFF
)

// Append appends the encoding of v, a column value as cdc/open decodes it (nil, int64,
// uint64, float64, string, []byte), folded by class c when v is a string: for Exact, and
// for every non-string value, it is Encode's form. ok is false when v is a string that
// cannot be folded safely under c (the key may equal keys whose encoding differs) or a
// type no key holds.
func Append(dst []byte, v any, c Class) (out []byte, ok bool) {
	if s, isText := v.(string); isText {
		switch c {
		case PadSpace:
			return appendText(append(dst, tagText), strings.TrimRight(s, " ")), true
		case Folded:
			return foldText(append(dst, tagText), s)
		case Opaque:
			return dst, false
		}
	}
	out, err := appendExact(dst, v)
	return out, err == nil
}

// appendText writes b escaped and terminated, so that a composite key's parts never run
// into each other ("a","bc" ≠ "ab","c").
func appendText[T string | []byte](dst []byte, b T) []byte {
	for i := 0; i < len(b); i++ {
		if b[i] == 0 {
			dst = append(dst, 0, 0xFF)
			continue
		}
		dst = append(dst, b[i])
	}
	return append(dst, endOfText, 0x01)
}

// foldText writes the fold of s under a Folded collation, escaped and terminated, with
// trailing spaces dropped (PAD SPACE; for a NO PAD collation that is coarser, still safe).
//
// The fold, per character of s's compatibility decomposition (NFKD: 'Ａ' → 'A', 'ﬁ' → "fi",
// 'é' → 'e' + a combining mark):
//   - combining marks and control characters are dropped (accents do not count; UCA
//     collations ignore controls, general_ci does not, and dropping is coarser);
//   - ASCII letters are lower-cased; other ASCII is kept;
//   - Greek and Cyrillic letters are replaced by the smallest member of their case
//     orbit ('ς', 'σ', 'Σ' → 'Σ');
//   - CJK ideographs of the Basic Multilingual Plane are kept (each is only equal to
//     itself);
//   - anything else is unfoldable (ok = false): letters such as 'ß' ('s' in general_ci,
//     "ss" in unicode_ci), 'æ', 'ø', kana (equal across hiragana and katakana), Hangul,
//     symbols, and every character outside the BMP (all equal to each other in
//     general_ci).
func foldText(dst []byte, s string) ([]byte, bool) {
	ascii := true
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			ascii = false
			break
		}
	}
	start := len(dst)
	if ascii {
		for i := 0; i < len(s); i++ {
			dst = appendASCII(dst, s[i])
		}
	} else {
		for _, r := range s {
			switch {
			case r < utf8.RuneSelf:
				dst = appendASCII(dst, byte(r))
			case r < tableEnd:
				f := &foldTable[r-utf8.RuneSelf]
				if !f.ok {
					return dst, false
				}
				dst = append(dst, f.s...)
			case r >= 0x4E00 && r <= 0x9FFF: // CJK Unified Ideographs: no decomposition
				dst = utf8.AppendRune(dst, r)
			default:
				f, ok := foldRune(r)
				if !ok {
					return dst, false
				}
				dst = append(dst, f...)
			}
		}
	}
	end := len(dst)
	for end > start && dst[end-1] == ' ' {
		end--
	}
	return append(dst[:end], endOfText, 0x01), true
}

// foldRune folds one non-ASCII character (see foldText). Marks are dropped whole, so
// decomposing each character on its own gives what decomposing the string would.
func foldRune(r rune) (string, bool) {
	var out []byte
	for _, d := range norm.NFKD.String(string(r)) {
		switch {
		case d < utf8.RuneSelf:
			out = appendASCII(out, byte(d))
		case unicode.Is(unicode.Mn, d) || unicode.Is(unicode.Me, d) || unicode.Is(unicode.Cc, d):
		case unicode.Is(unicode.Greek, d) || unicode.Is(unicode.Cyrillic, d):
			if !unicode.IsLetter(d) {
				return "", false
			}
			out = utf8.AppendRune(out, caseOrbitMin(d))
		case d <= 0xFFFF && unicode.Is(unicode.Han, d):
			out = utf8.AppendRune(out, d)
		default:
			return "", false
		}
	}
	return string(out), true
}

// foldTable holds foldRune of the characters below tableEnd (Latin, combining marks,
// Greek, Cyrillic), the ones keys are most often made of beyond ASCII.
const tableEnd = 0x500

var foldTable = func() (t [tableEnd - utf8.RuneSelf]struct {
	s  string
	ok bool
}) {
	for i := range t {
		t[i].s, t[i].ok = foldRune(rune(i + utf8.RuneSelf))
	}
	return t
}()

// appendASCII appends an ASCII byte folded: letters lower-cased, controls dropped, NUL
// escaped (a NUL is a control and never reaches the escape, but the rule stays local).
func appendASCII(dst []byte, c byte) []byte {
	switch {
	case c >= 'A' && c <= 'Z':
		return append(dst, c+'a'-'A')
	case c < 0x20 || c == 0x7F:
		return dst
	}
	return append(dst, c)
}

// caseOrbitMin returns the smallest rune that simple case folding relates to r.
func caseOrbitMin(r rune) rune {
	m := r
	for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
		m = min(m, f)
	}
	return m
}
