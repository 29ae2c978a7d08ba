package testenv

import (
	"bufio"
	"compress/gzip"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// RandomDatasetsDir is ../shared/ticdc-random beside the repository root: the
// changefeeds TiCDC's own code made of random workloads, with the upstream's final tables
// (its README). Whether a test skips or fails without them is the test's to say.
func RandomDatasetsDir() string {
	_, file, _, _ := runtime.Caller(0) // internal/testenv/datasets.go
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "shared", "ticdc-random")
}

// GzipLines calls each with every line of the gzip-compressed file at path (the
// datasets' records.jsonl.gz and final.jsonl.gz: lines of up to 64 MiB); any error fails
// tb. each must not keep line.
func GzipLines(tb testing.TB, path string, each func(line []byte)) {
	tb.Helper()
	f, err := os.Open(path)
	if err != nil {
		tb.Fatalf("the TiCDC-made dataset is required: %v", err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		tb.Fatalf("%s: %v", path, err)
	}
	sc := bufio.NewScanner(zr)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	for sc.Scan() {
		each(sc.Bytes())
	}
	if err := sc.Err(); err != nil {
		tb.Fatalf("%s: %v", path, err)
	}
}
