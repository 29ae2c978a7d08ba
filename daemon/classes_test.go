package daemon

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/tidb-parity/parity/checker"
)

// TestDifferenceClassesAgree: the classes of a difference are one list everywhere a
// user reads them: every class the checker defines (but in-flight, which only counts
// resolved rows) is a class label of parity_verify_differences_total (diffClasses), and
// the proto's comments, docs/verify.md's metric row and docs/reliability.md list
// exactly diffClasses, in its order; docs/diff.md's table has a row for each.
func TestDifferenceClassesAgree(t *testing.T) {
	src, err := os.ReadFile("../checker/classify.go")
	if err != nil {
		t.Fatal(err)
	}
	var defined []string
	for _, m := range regexp.MustCompile(`(?m)^\s+Class\w+\s*=\s*"([^"]+)"`).FindAllStringSubmatch(string(src), -1) {
		if m[1] != checker.ClassInFlight {
			defined = append(defined, m[1])
		}
	}
	if len(defined) < 6 || !sameSet(defined, diffClasses) {
		t.Fatalf("checker/classify.go defines the classes %q; parity_verify_differences_total's labels (diffClasses) are %q", defined, diffClasses)
	}

	plain := strings.Join(diffClasses, ", ")
	quoted := "`" + strings.Join(diffClasses, "`, `") + "`"
	for _, c := range []struct {
		file, want string
		n          int
	}{
		{"../api/parity/v1/parity.proto", "// Differing rows by class: " + plain + ".", 1},
		{"../api/parity/v1/parity.proto", "// " + plain + ".\n  string class = 3;", 1},
		{"../docs/verify.md", quoted, 2},
		{"../docs/reliability.md", quoted, 1},
	} {
		b, err := os.ReadFile(c.file)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Count(string(b), c.want); got < c.n {
			t.Errorf("%s: %q found %d times, want %d", c.file, c.want, got, c.n)
		}
	}
	// Every other list of classes in the proto and these docs is the same list: a
	// comma-separated run of class names is diffClasses.
	run := regexp.MustCompile("(`?[a-z-]+`?(, |/))+`?[a-z-]+`?")
	for _, f := range []string{"../api/parity/v1/parity.proto", "../docs/verify.md", "../docs/reliability.md"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range run.FindAllString(string(b), -1) {
			names := strings.FieldsFunc(strings.ReplaceAll(m, "`", ""), func(r rune) bool { return r == ',' || r == ' ' || r == '/' })
			n := 0
			for _, name := range names {
				if slices.Contains(diffClasses, name) {
					n++
				}
			}
			if n >= 3 && !slices.Equal(names, diffClasses) {
				t.Errorf("%s lists classes %q, want %q", f, names, diffClasses)
			}
		}
	}
	diff, err := os.ReadFile("../docs/diff.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range append(slices.Clone(diffClasses), checker.ClassInFlight) {
		if !strings.Contains(string(diff), "\n| `"+c+"` | ") {
			t.Errorf("docs/diff.md's classification table has no row for %s", c)
		}
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
