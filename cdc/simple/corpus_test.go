package simple

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/tidb-parity/parity/cdc/open"
)

var update = flag.Bool("update", false, "rewrite testdata/corpus from the TiCDC-made dataset and the decoder's output")

var (
	corpusRecords = filepath.Join("testdata", "corpus", "records.jsonl")
	corpusGolden  = filepath.Join("testdata", "corpus", "golden.jsonl")
)

// corpusRecord is one TiCDC-made record kept in testdata: Index is its line in the
// dataset's records.jsonl.gz, Value the record value byte for byte.
type corpusRecord struct {
	Name      string `json:"name"`
	Index     int    `json:"dataset_index"`
	Partition int    `json:"partition"`
	Value     string `json:"value"`
}

// goldenRecord is what a corpus record decodes to.
type goldenRecord struct {
	Name   string        `json:"name"`
	Events []goldenEvent `json:"events"`
	Stats  Stats         `json:"stats_after"`
}

type goldenEvent struct {
	Kind          string         `json:"kind"`
	CommitTs      uint64         `json:"commit_ts"`
	Schema        string         `json:"schema,omitempty"`
	Table         string         `json:"table,omitempty"`
	Op            string         `json:"op,omitempty"`
	Query         string         `json:"query,omitempty"`
	OnlyHandleKey bool           `json:"only_handle_key,omitempty"`
	Columns       []goldenColumn `json:"columns,omitempty"`
	OldColumns    []goldenColumn `json:"old_columns,omitempty"`
}

type goldenColumn struct {
	Name   string  `json:"name"`
	Type   byte    `json:"type"`
	Flags  uint64  `json:"flags"`
	GoType string  `json:"go_type"`
	Value  *string `json:"value"` // Go value as text; []byte as hex; null for NULL
}

func goldenColumns(cols []open.Column) []goldenColumn {
	var out []goldenColumn
	for _, c := range cols {
		g := goldenColumn{Name: c.Name, Type: c.Type, Flags: uint64(c.Flags), GoType: fmt.Sprintf("%T", c.Value)}
		var s string
		switch v := c.Value.(type) {
		case nil:
			g.GoType = "nil"
		case []byte:
			s = hex.EncodeToString(v)
		case float64:
			s = strconv.FormatFloat(v, 'g', -1, 64)
		default:
			s = fmt.Sprint(v)
		}
		if c.Value != nil {
			g.Value = &s
		}
		out = append(out, g)
	}
	return out
}

func golden(name string, evs []open.Event, st Stats) goldenRecord {
	g := goldenRecord{Name: name, Events: []goldenEvent{}, Stats: st}
	for _, ev := range evs {
		ge := goldenEvent{Kind: ev.Kind.String(), CommitTs: ev.CommitTs, Schema: ev.Schema, Table: ev.Table, Query: ev.Query,
			OnlyHandleKey: ev.OnlyHandleKey, Columns: goldenColumns(ev.Columns), OldColumns: goldenColumns(ev.OldColumns)}
		if ev.Kind == open.KindRow {
			ge.Op = ev.Op.String()
		}
		g.Events = append(g.Events, ge)
	}
	return g
}

// selectCorpus picks records of the dataset: every DDL and BOOTSTRAP of partition 0, the
// first watermarks, and per table and operation the first two rows with checksums and
// the first two without (the halves of split UPDATEs).
func selectCorpus(tb testing.TB) []corpusRecord {
	var out []corpusRecord
	seen := map[string]int{}
	watermarks := 0
	for i, r := range loadDataset(tb) {
		var m wireMessage
		if err := json.Unmarshal(r.Value, &m); err != nil {
			tb.Fatal(err)
		}
		name := ""
		switch r.Kind {
		case "ddl", "bootstrap":
			if r.Partition == 0 {
				tbl := ""
				if m.TableSchema != nil {
					tbl = "-" + m.TableSchema.Table
				}
				name = fmt.Sprintf("%s-%s%s", r.Kind, m.Type, tbl)
			}
		case "resolved":
			if watermarks < 3 {
				watermarks++
				name = "watermark"
			}
		case "row":
			sum := "checksum"
			if m.Checksum == nil || (m.Checksum.Current == 0 && m.Checksum.Previous == 0) {
				sum = "no-checksum"
			}
			k := fmt.Sprintf("%s-%s-%s", m.Table, m.Type, sum)
			if seen[k] < 2 {
				seen[k]++
				name = fmt.Sprintf("row-%s-%d", k, seen[k])
			}
		}
		if name != "" {
			out = append(out, corpusRecord{Name: fmt.Sprintf("%03d-%s", len(out), name), Index: i, Partition: r.Partition, Value: string(r.Value)})
		}
	}
	return out
}

func writeJSONL[T any](tb testing.TB, path string, items []T) {
	var b bytes.Buffer
	for _, it := range items {
		line, err := json.Marshal(it)
		if err != nil {
			tb.Fatal(err)
		}
		b.Write(line)
		b.WriteByte('\n')
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		tb.Fatal(err)
	}
}

func readJSONL[T any](tb testing.TB, path string) []T {
	f, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	var out []T
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
	for sc.Scan() {
		var v T
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			tb.Fatalf("%s: %v", path, err)
		}
		out = append(out, v)
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	return out
}

// TestCorpus decodes the corpus of TiCDC-made records in order with one decoder and
// compares each record's events and the checksum counters after it with the golden
// file. Every checksummed row in it is also verified against TiCDC's checksum, so the
// golden values are TiCDC's, not only this decoder's. With -update both files are
// rewritten (records from the dataset, golden from the decoder: review the diff).
func TestCorpus(t *testing.T) {
	if *update {
		writeJSONL(t, corpusRecords, selectCorpus(t))
	}
	recs := readJSONL[corpusRecord](t, corpusRecords)
	d, err := NewDecoder(DefaultDecoderConfig())
	if err != nil {
		t.Fatal(err)
	}
	var got []goldenRecord
	for _, r := range recs {
		evs, err := d.Decode(nil, []byte(r.Value))
		if err != nil {
			t.Fatalf("%s: %v", r.Name, err)
		}
		got = append(got, golden(r.Name, evs, d.Stats()))
	}
	if *update {
		writeJSONL(t, corpusGolden, got)
	}
	want := readJSONL[goldenRecord](t, corpusGolden)
	if len(want) != len(got) {
		t.Fatalf("%d golden records, %d corpus records", len(want), len(got))
	}
	for i := range got {
		g, _ := json.Marshal(got[i])
		w, _ := json.Marshal(want[i])
		if !bytes.Equal(g, w) {
			t.Errorf("%s:\n got %s\nwant %s", got[i].Name, g, w)
		}
	}
	st := d.Stats()
	if st.RowsVerified == 0 || st.RowsWithoutChecksum == 0 || st.Mismatches != 0 {
		t.Errorf("corpus stats %+v: want rows verified and rows without checksum, no mismatch", st)
	}
	t.Logf("%d records; %+v", len(recs), st)
}

// TestCorpusFromDataset: every corpus record is byte for byte the dataset's record it
// names, so no hand-edited bytes are in the corpus.
func TestCorpusFromDataset(t *testing.T) {
	ds := loadDataset(t)
	for _, r := range readJSONL[corpusRecord](t, corpusRecords) {
		if r.Index < 0 || r.Index >= len(ds) || string(ds[r.Index].Value) != r.Value || ds[r.Index].Partition != r.Partition {
			t.Errorf("%s: not the dataset's record %d", r.Name, r.Index)
		}
	}
}
