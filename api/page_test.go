package api

import (
	"strings"
	"testing"

	"github.com/tidb-parity/parity/api/client"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestPageTokens(t *testing.T) {
	f := filterKey("diffs", "DIFF_STATE_DONE", "manual", "", "")
	for _, off := range []int{0, 1, 50, 127, 128, 1 << 20} {
		tok := encodePageToken(off, f)
		if strings.ContainsAny(tok, "+/=") {
			t.Errorf("token %q is not URL-safe", tok)
		}
		got, err := decodePageToken(tok, f)
		if err != nil || got != off {
			t.Fatalf("offset %d: decoded %d, %v", off, got, err)
		}
	}
	if off, err := decodePageToken("", f); off != 0 || err != nil {
		t.Fatalf("empty token: %d, %v", off, err)
	}
	other := filterKey("diffs", "DIFF_STATE_DONE", "nightly", "", "")
	if other == f || filterKey("a", "bc") == filterKey("ab", "c") {
		t.Fatal("different filters hash alike")
	}
	tok := encodePageToken(50, f)
	bad := []struct{ name, tok string }{
		{"changed filter", encodePageToken(50, other)},
		{"not base64", "!!!"},
		{"truncated", tok[:len(tok)-2]},
		{"extended", tok + "AA"},
		{"other version", "Ag" + tok[2:]},
	}
	for _, b := range bad {
		_, err := decodePageToken(b.tok, f)
		st := ToStatus(err)
		if status.Code(st) != codes.InvalidArgument {
			t.Fatalf("%s: %v, want INVALID_ARGUMENT", b.name, err)
		}
		if _, md := client.ReasonOf(st); md["field"] != "page_token" {
			t.Fatalf("%s: metadata %v, want field page_token", b.name, md)
		}
	}
	if _, err := decodePageToken(encodePageToken(50, other), f); !strings.Contains(err.Error(), "other filters") {
		t.Fatalf("changed filter: %v does not say so", err)
	}
}

func TestPageSizeAndNames(t *testing.T) {
	for _, c := range []struct {
		in, want int32
		err      bool
	}{{0, 50, false}, {1, 1, false}, {1000, 1000, false}, {5000, 1000, false}, {-1, 0, true}} {
		got, err := pageSize(c.in, 50, 1000)
		if (err != nil) != c.err || (!c.err && int32(got) != c.want) {
			t.Errorf("pageSize(%d) = %d, %v", c.in, got, err)
		}
	}
	for _, c := range []struct{ in, want string }{{"diffs/v1-ab", "v1-ab"}, {"v1-ab", "v1-ab"}, {" diffs/x ", "x"}} {
		if got, err := runID("name", c.in); err != nil || got != c.want {
			t.Errorf("runID(%q) = %q, %v", c.in, got, err)
		}
	}
	for _, in := range []string{"", "diffs/", "diffs/a/b", "runs/x"} {
		if _, err := runID("name", in); err == nil {
			t.Errorf("runID(%q) accepted", in)
		}
	}
}
