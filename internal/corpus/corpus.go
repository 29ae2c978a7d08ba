// Package corpus locates the TiCDC open-protocol conformance corpus
// (../shared/ticdc-corpus beside the repository root) for tests. It is its own package,
// importing nothing but the standard library, so that the leaf codec cdc/open can use it
// in its tests without pulling in the test environment's SQL and Kafka clients
// (internal/testenv).
package corpus

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// Dir returns the corpus directory. Locally a missing corpus skips the test; with
// CI=true it fails it (CI must run the conformance tests).
func Dir(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the package directory")
		}
		dir = parent
	}
	c := filepath.Join(dir, "..", "shared", "ticdc-corpus")
	if _, err := os.Stat(filepath.Join(c, "README.md")); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("TiCDC corpus not found at %s: CI must run the conformance tests", c)
		}
		t.Skipf("TiCDC corpus not found at %s; conformance tests skipped", c)
	}
	return c
}

// Load decodes every case's expected.json (numbers kept as json.Number) into a value
// made by newCase for the case's name and directory, in directory order; a case
// directory without an expected.json is not a case. It returns the corpus directory too.
func Load[T any](t testing.TB, newCase func(name, dir string) *T) (string, []*T) {
	t.Helper()
	root := Dir(t)
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	var out []*T
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(root, e.Name())
		data, err := os.ReadFile(filepath.Join(dir, "expected.json"))
		if err != nil {
			continue
		}
		c := newCase(e.Name(), dir)
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		if err := dec.Decode(c); err != nil {
			t.Fatalf("%s/expected.json: %v", e.Name(), err)
		}
		out = append(out, c)
	}
	return root, out
}
