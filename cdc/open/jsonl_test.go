package open

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// goldenCases are the corpus cases whose `parity decode` output is pinned in
// testdata/decode/<case>.jsonl: every column type and value edge, every event kind,
// handle-key-only, claim-check, partitions and the new-architecture encoder bug.
var goldenCases = []string{
	"row-all-types-01-insert-typical",
	"row-all-types-02-insert-max",
	"row-all-types-03-insert-min-empty",
	"row-all-types-04-insert-nulls",
	"row-all-types-05-insert-escapes-binary",
	"row-all-types-06-insert-zero-temporal",
	"row-all-types-07-update",
	"row-all-types-08-update-only-updated-columns",
	"row-all-types-11-delete",
	"row-all-types-13-update-pk-change",
	"row-partition-01-insert",
	"row-generated-columns-01-insert",
	"batch-03-mixed-insert-update-delete",
	"ddl-02-create-table-all-types",
	"ddl-13-rename-tables-multi",
	"resolved-03-edge-values",
	"large-01-handle-key-only-insert",
	"large-05-claim-check-insert",
	"compression-lz4-02-row-batch",
	"newarch-row-all-types-08-update-only-updated-columns",
}

func TestJSONLinesGolden(t *testing.T) {
	byName := map[string]*corpusCase{}
	for _, c := range loadCorpus(t) {
		byName[c.Name] = c
	}
	for _, name := range goldenCases {
		t.Run(name, func(t *testing.T) {
			c := byName[name]
			if c == nil {
				t.Fatalf("corpus case %s is missing", name)
			}
			evs := c.decodeAll(t, c.decoder(t, false))
			var out []byte
			for i := range evs {
				line := AppendJSONLine(nil, &evs[i], nil)
				checkJSONLine(t, line, &evs[i])
				out = append(out, line...)
			}
			path := filepath.Join("testdata", "decode", name+".jsonl")
			if *update {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, out, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test -run TestJSONLinesGolden -update)", err)
			}
			if !bytes.Equal(out, want) {
				t.Errorf("output differs from %s:\n got %s\nwant %s", path, out, want)
			}
		})
	}
}

// checkJSONLine checks that a line is one valid JSON object whose numbers are exact.
func checkJSONLine(t *testing.T, line []byte, ev *Event) {
	t.Helper()
	if len(line) == 0 || line[len(line)-1] != '\n' || bytes.Count(line, []byte("\n")) != 1 {
		t.Fatalf("not one line: %q", line)
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	var obj struct {
		Kind     string      `json:"kind"`
		CommitTs json.Number `json:"commit_ts"`
		Columns  []struct {
			Name   string          `json:"name"`
			Handle bool            `json:"handle"`
			Value  json.RawMessage `json:"value"`
		} `json:"columns"`
	}
	if err := dec.Decode(&obj); err != nil {
		t.Fatalf("invalid JSON line %s: %v", line, err)
	}
	if obj.Kind != ev.Kind.String() || obj.CommitTs.String() != strconv.FormatUint(ev.CommitTs, 10) {
		t.Errorf("kind/commit_ts %s %s, want %s %d", obj.Kind, obj.CommitTs, ev.Kind, ev.CommitTs)
	}
	if len(obj.Columns) != len(ev.Columns) {
		t.Fatalf("%d columns, want %d", len(obj.Columns), len(ev.Columns))
	}
	for i, c := range ev.Columns {
		raw := string(obj.Columns[i].Value)
		switch v := c.Value.(type) {
		case int64:
			if raw != strconv.FormatInt(v, 10) {
				t.Errorf("column %s: %s, want exact %d", c.Name, raw, v)
			}
		case uint64:
			if raw != strconv.FormatUint(v, 10) {
				t.Errorf("column %s: %s, want exact %d", c.Name, raw, v)
			}
		case nil:
			if raw != "null" {
				t.Errorf("column %s: %s, want null", c.Name, raw)
			}
		}
		if obj.Columns[i].Handle != c.IsHandle() {
			t.Errorf("column %s: handle %v", c.Name, obj.Columns[i].Handle)
		}
	}
}

func TestJSONLineRecordRef(t *testing.T) {
	ev := Event{Kind: KindResolved, CommitTs: 1<<64 - 1}
	got := string(AppendJSONLine(nil, &ev, &RecordRef{Topic: "t<1>", Partition: 2, Offset: 30, Index: 1}))
	want := `{"kind":"resolved","commit_ts":18446744073709551615,"kafka_topic":"t<1>","kafka_partition":2,"kafka_offset":30,"event_index":1}` + "\n"
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}
