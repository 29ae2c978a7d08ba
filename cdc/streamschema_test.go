package cdc

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/tidb-parity/parity/cdc/canal"
	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/cdc/upstream"
)

// TestStreamSchemasCanalDataset decodes every record of ../shared/ticdc-random's
// canal-json-table (TiCDC v8.5.6's own canal-json bytes) and completes its rows from the
// definitions its DDLs leave, the three partitions read concurrently as the readers do
// (partition 1 and 2 rows wait for partition 0's DDLs). Every row's handle must be the key TiCDC chose (final.jsonl.gz's
// handle: t_uk_nn's NOT NULL unique (a, b), absent from pkNames), the generated column
// flagged, and nothing read from a database.
func TestStreamSchemasCanalDataset(t *testing.T) {
	dir := filepath.Join("..", "..", "shared", "ticdc-random", "canal-json-table")
	if _, err := os.Stat(dir); err != nil {
		t.Skipf("dataset not found: %v", err)
	}
	handles := map[string][]string{}
	readLines(t, filepath.Join(dir, "final.jsonl.gz"), func(b []byte) {
		var ft struct {
			Table  string   `json:"table"`
			Handle []string `json:"handle"`
		}
		if err := json.Unmarshal(b, &ft); err != nil {
			t.Fatal(err)
		}
		handles[ft.Table] = ft.Handle
	})
	type rec struct {
		part  int
		value []byte
	}
	var recs [3][]rec
	readLines(t, filepath.Join(dir, "records.jsonl.gz"), func(b []byte) {
		var r struct {
			Partition int    `json:"partition"`
			Value     string `json:"value"`
		}
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatal(err)
		}
		v, err := base64.StdEncoding.DecodeString(r.Value)
		if err != nil {
			t.Fatal(err)
		}
		recs[r.Partition] = append(recs[r.Partition], rec{r.Partition, v})
	})
	s := newStreamSchemas(0, func(ctx context.Context, schema, table string, ts uint64) (*upstream.Table, error) {
		t.Errorf("fallback read of %s.%s at %d: the stream defines every table", schema, table, ts)
		return nil, &schemaReadError{os.ErrNotExist}
	})
	dec, err := canal.NewDecoder(canal.DecoderConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		rows, generated int
		err             error
	}
	done := make(chan result, 3)
	for p := 2; p >= 0; p-- {
		go func() {
			var res result
			defer func() { done <- res }()
			for _, r := range recs[p] {
				evs, err := dec.Decode(nil, r.value)
				if err != nil {
					res.err = err
					return
				}
				if err := s.complete(ctx, partKey{Topic: "t", Partition: p}, evs); err != nil {
					res.err = err
					return
				}
				for _, ev := range evs {
					if ev.Kind != open.KindRow {
						continue
					}
					res.rows++
					base := ev.Table // before its RENAME: same key as the final table
					var got []string
					for _, c := range ev.Columns {
						if c.IsHandle() {
							got = append(got, c.Name)
						}
						if c.IsGenerated() {
							res.generated++
							if c.Name != "c_gen" {
								res.err = os.ErrInvalid
								return
							}
						}
					}
					want, ok := handles[ev.Table]
					if !ok {
						want = handles[base+"_r4"]
						if want == nil {
							want = handles[base+"_r7"]
						}
					}
					if !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
						t.Errorf("%s at %d: handle %v, want %v", ev.Table, ev.CommitTs, got, want)
						return
					}
				}
			}
		}()
	}
	total, gen := 0, 0
	for range 3 {
		r := <-done
		if r.err != nil {
			t.Fatal(r.err)
		}
		total, gen = total+r.rows, gen+r.generated
	}
	if total != 12942 || gen == 0 { // meta.json: 12942 row records
		t.Fatalf("%d rows (want 12942), %d generated columns", total, gen)
	}
}

func readLines(t *testing.T, path string, fn func([]byte)) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(zr)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		fn(sc.Bytes())
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
}
