package ident

import (
	"strings"
	"testing"
)

func TestQuote(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"t", "`t`"},
		{"", "``"},
		{"a`b", "`a``b`"},
		{"``", "``````"},
		{"sp ace.dot", "`sp ace.dot`"},
		{"😀", "`😀`"},
		{"`", "````"},
		{"x.y", "`x.y`"},
		{"日本", "`日本`"},
	} {
		if got := Quote(tc.in); got != tc.want {
			t.Errorf("Quote(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
	if got, want := Table("d`b", "t"), "`d``b`.`t`"; got != want {
		t.Errorf("Table = %s, want %s", got, want)
	}
}

func unquoteIdent(s string) (string, bool) {
	if len(s) < 2 || s[0] != '`' || s[len(s)-1] != '`' {
		return "", false
	}
	inner := s[1 : len(s)-1]
	var b strings.Builder
	for i := 0; i < len(inner); i++ {
		if inner[i] == '`' {
			if i+1 >= len(inner) || inner[i+1] != '`' {
				return "", false // an unescaped backtick would end the identifier
			}
			i++
		}
		b.WriteByte(inner[i])
	}
	return b.String(), true
}

func FuzzQuote(f *testing.F) {
	for _, s := range []string{"t", "a`b", "``", "x`.`y", "\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, ok := unquoteIdent(Quote(s))
		if !ok || got != s {
			t.Fatalf("Quote(%q) = %s does not round-trip", s, Quote(s))
		}
	})
}
