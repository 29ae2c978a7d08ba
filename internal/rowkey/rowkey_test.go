package rowkey

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	_ "github.com/go-sql-driver/mysql"

	"github.com/tidb-parity/parity/internal/testenv"
)

func key(t *testing.T, v any, c Class) ([]byte, bool) {
	t.Helper()
	return Append(nil, v, c)
}

func TestClassOf(t *testing.T) {
	for coll, want := range map[string]Class{
		"":                              Exact,
		"binary":                        Exact,
		"utf8mb4_bin":                   PadSpace,
		"utf8mb4_0900_bin":              PadSpace,
		"utf8mb4_nopad_bin":             PadSpace,
		"latin1_bin":                    PadSpace,
		"utf8mb4_general_ci":            Folded,
		"utf8_general_ci":               Folded,
		"utf8mb3_general_ci":            Folded,
		"utf8mb4_general_nopad_ci":      Folded,
		"utf8mb4_unicode_ci":            Folded,
		"utf8mb4_unicode_520_ci":        Folded,
		"utf8mb4_0900_ai_ci":            Folded,
		"utf8mb4_0900_as_cs":            Folded,
		"utf8mb4_uca1400_ai_ci":         Folded,
		"UTF8MB4_GENERAL_CI":            Folded,
		"latin1_swedish_ci":             Opaque, // 'Ü' = 'Y'
		"utf8mb4_german2_ci":            Opaque, // 'ä' = 'ae'
		"utf8mb4_hungarian_ci":          Opaque,
		"utf8mb4_uca1400_swedish_ai_ci": Opaque,
		"gbk_chinese_ci":                Opaque,
		"something_new":                 Opaque,
	} {
		if got := ClassOf(coll); got != want {
			t.Errorf("ClassOf(%q) = %v, want %v", coll, got, want)
		}
	}
}

func TestAppend(t *testing.T) {
	same := func(c Class, a, b any) {
		t.Helper()
		ka, oka := key(t, a, c)
		kb, okb := key(t, b, c)
		if !oka || !okb || !bytes.Equal(ka, kb) {
			t.Errorf("%v: %q (%x, %v) and %q (%x, %v) must be one key", c, a, ka, oka, b, kb, okb)
		}
	}
	differ := func(c Class, a, b any) {
		t.Helper()
		ka, _ := key(t, a, c)
		kb, _ := key(t, b, c)
		if bytes.Equal(ka, kb) {
			t.Errorf("%v: %q and %q must be different keys (%x)", c, a, b, ka)
		}
	}
	unfoldable := func(c Class, v string) {
		t.Helper()
		if _, ok := key(t, v, c); ok {
			t.Errorf("%v: %q must be reported unfoldable", c, v)
		}
	}
	// Type tags: 1 and '1' differ, NULL is distinct from '' and from 0.
	differ(Exact, int64(1), "1")
	differ(Exact, int64(1), uint64(1))
	differ(Exact, nil, "")
	differ(Exact, nil, int64(0))
	same(Exact, 0.0, -0.0)
	differ(Exact, int64(-1), int64(1))
	// Escaping: composite keys never run into each other.
	ab, _ := Append(nil, "a", Exact)
	ab, _ = Append(ab, "bc", Exact)
	ab2, _ := Append(nil, "ab", Exact)
	ab2, _ = Append(ab2, "c", Exact)
	if bytes.Equal(ab, ab2) {
		t.Error(`("a","bc") and ("ab","c") encode alike`)
	}
	differ(Exact, "a\x00", "a")
	differ(Exact, "a", "a ")
	differ(Exact, []byte("a"), []byte("A"))
	same(PadSpace, "a", "a   ")
	differ(PadSpace, "a", "A")
	differ(PadSpace, "a", "a\t")
	same(Folded, "Ase", "ASE")
	same(Folded, "Ase", "Asé")
	same(Folded, "Ase", "ase  ")
	same(Folded, "ÀÉÎÕÜ", "aeiou")
	same(Folded, "Ａ", "a")
	same(Folded, "ﬁ", "FI")
	same(Folded, "σ", "ς")
	same(Folded, "ΣΊΣΥΦΟΣ", "σισυφος")
	same(Folded, "Ёлка", "елка")
	same(Folded, "中文", "中文 ")
	differ(Folded, "中文", "文中")
	differ(Folded, "a", "b")
	differ(Folded, "ab", "a b")
	for _, v := range []string{"ß", "æ", "ø", "ł", "カ", "か", "한", "😀", "𠀀", "€"} {
		unfoldable(Folded, v)
	}
	unfoldable(Opaque, "abc")
	if k, ok := key(t, int64(5), Opaque); !ok || len(k) == 0 {
		t.Error("a number is a number under any collation")
	}
}

// FuzzFold: Append never fails on any input, its encoding is terminated, and the folds it
// claims are consistent with case and trailing spaces.
func FuzzFold(f *testing.F) {
	for _, s := range []string{"", "a", "Ase", "Asé", "ß", "中文 ", "\x00", "a\x00b", "ΣΊΣΥΦΟΣ", "\xff\xfe"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, c := range []Class{Exact, PadSpace, Folded, Opaque} {
			k, ok := Append([]byte{0xAA}, s, c)
			if k[0] != 0xAA {
				t.Fatal("Append overwrote dst")
			}
			if ok && !bytes.HasSuffix(k, []byte{endOfText, 0x01}) {
				t.Fatalf("%v: %q: unterminated %x", c, s, k)
			}
		}
		k1, ok1 := Append(nil, s, Folded)
		k2, ok2 := Append(nil, s+"  ", Folded)
		if ok1 && ok2 && !bytes.Equal(k1, k2) {
			t.Fatalf("%q: trailing spaces change the fold", s)
		}
		if isASCII(s) {
			k3, ok3 := Append(nil, strings.ToUpper(s), Folded)
			if !ok1 || !ok3 || !bytes.Equal(k1, k3) {
				t.Fatalf("%q: ASCII case changes the fold", s)
			}
		}
	})
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// atoms are the pieces of the strings compared on the servers: case, accents (precomposed
// and combining), expansions, compatibility forms, ignorable and control characters,
// trailing spaces, scripts with and without case, characters outside the BMP.
var atoms = []string{
	"a", "A", "á", "Á", "à", "ä", "Ä", "a\u0301", "å", "ae", "æ", "Æ", "e", "é", "É", "ê",
	"s", "S", "ss", "ß", "ẞ", "ſ", "o", "ø", "ö", "oe", "œ", "i", "I", "ı", "İ", "k", "K", "\u212a",
	"f", "fi", "ﬁ", "ff", "ﬀ", "d", "đ", "dz", "ǆ", "Ǆ", "x", "ⅻ", "1", "①", "²", "2", "٣", "3",
	"Ａ", "ａ", "σ", "ς", "Σ", "ά", "α", "Ω", "ω", "е", "ё", "Ё", "и", "й", "Ж", "ж",
	"中", "文", "丽", "\uf900", "か", "カ", "ｶ", "が", "한", "ㅎ", "😀", "😁", "𠀀",
	" ", "  ", "\t", "\x01", "\u00ad", "\u200b", "-", "_", ".", "'", "€", "$",
}

func randomStrings(n int, seed uint64) []string {
	rnd := rand.New(rand.NewPCG(seed, 24))
	out := append([]string(nil), atoms...)
	for len(out) < n {
		var b strings.Builder
		for range 1 + rnd.IntN(4) {
			b.WriteString(atoms[rnd.IntN(len(atoms))])
		}
		out = append(out, b.String())
	}
	return out
}

// TestFoldAgainstServers asks the real servers which strings their collations hold
// equal: every generic and _bin utf8mb4 collation MariaDB and TiDB have groups the
// strings (GROUP BY on a column of that collation), and every group must share one key
// unless Append reported one of its members unfoldable. The collations are the servers',
// not ours: a fold that misses an equivalence fails here.
func TestFoldAgainstServers(t *testing.T) {
	strs := randomStrings(3000, 7)
	for _, server := range []string{testenv.EnvDownstream, testenv.EnvUpstream} {
		t.Run(server, func(t *testing.T) {
			d := testenv.NewDB(t, server, "rk")
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			colls := collations(t, ctx, d.DB)
			if len(colls) < 3 {
				t.Fatalf("%s: only %d utf8mb4 collations to test: %v", server, len(colls), colls)
			}
			t.Logf("%s: %d collations: %v", server, len(colls), colls)
			for _, coll := range colls {
				checkCollation(t, ctx, d.DB, d.Name, coll, strs)
			}
		})
	}
}

func collations(t *testing.T, ctx context.Context, db *sql.DB) []string {
	rows, err := db.QueryContext(ctx, "SELECT COLLATION_NAME FROM information_schema.COLLATIONS WHERE CHARACTER_SET_NAME='utf8mb4' ORDER BY 1")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			t.Fatal(err)
		}
		if k := ClassOf(c); k == PadSpace || k == Folded {
			out = append(out, c)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func checkCollation(t *testing.T, ctx context.Context, db *sql.DB, schema, coll string, strs []string) {
	t.Helper()
	tbl := fmt.Sprintf("`%s`.`c_%s`", schema, coll)
	if _, err := db.ExecContext(ctx, fmt.Sprintf("CREATE TABLE %s (id INT PRIMARY KEY, s VARCHAR(64) CHARACTER SET utf8mb4 COLLATE %s)", tbl, coll)); err != nil {
		t.Fatalf("%s: %v", coll, err)
	}
	for i := 0; i < len(strs); i += 500 {
		var q strings.Builder
		var args []any
		q.WriteString("INSERT INTO " + tbl + " VALUES ")
		for j := i; j < min(i+500, len(strs)); j++ {
			if j > i {
				q.WriteByte(',')
			}
			q.WriteString("(?,?)")
			args = append(args, j, strs[j])
		}
		if _, err := db.ExecContext(ctx, q.String(), args...); err != nil {
			t.Fatalf("%s: %v", coll, err)
		}
	}
	rows, err := db.QueryContext(ctx, "SELECT GROUP_CONCAT(id) FROM "+tbl+" GROUP BY s")
	if err != nil {
		t.Fatalf("%s: %v", coll, err)
	}
	defer rows.Close()
	class := ClassOf(coll)
	groups, merged, unfoldable := 0, 0, 0
	for rows.Next() {
		var ids string
		if err := rows.Scan(&ids); err != nil {
			t.Fatal(err)
		}
		groups++
		var first []byte
		var firstS string
		members := strings.Split(ids, ",")
		if len(members) > 1 {
			merged++
		}
		for _, m := range members {
			var id int
			fmt.Sscan(m, &id)
			k, ok := Append(nil, strs[id], class)
			if !ok {
				// the applier orders the whole table: nothing to check
				unfoldable++
				break
			}
			if first == nil {
				first, firstS = k, strs[id]
				continue
			}
			if !bytes.Equal(k, first) {
				t.Errorf("%s holds %q and %q equal, but their keys differ (%x, %x)", coll, firstS, strs[id], first, k)
			}
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if merged == 0 {
		t.Errorf("%s: no two strings were equal: the test compared nothing", coll)
	}
	t.Logf("%s (%v): %d groups, %d with several spellings, %d with an unfoldable member", coll, class, groups, merged, unfoldable)
}
