package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/tidb-parity/parity/internal/testenv"
)

// simpleCorpus reads cdc/simple's corpus of TiCDC-made simple records (from
// ../shared/ticdc-random/simple-index-value), in stream order, and how many events the
// decoder's golden file says each gives.
func simpleCorpus(t *testing.T) (values []string, names []string, events []int) {
	t.Helper()
	dir := filepath.Join("..", "..", "cdc", "simple", "testdata", "corpus")
	read := func(name string, each func(line []byte)) {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 16<<20)
		for sc.Scan() {
			each(sc.Bytes())
		}
		if err := sc.Err(); err != nil {
			t.Fatal(err)
		}
	}
	read("records.jsonl", func(line []byte) {
		var r struct{ Name, Value string }
		if err := json.Unmarshal(line, &r); err != nil {
			t.Fatal(err)
		}
		names, values = append(names, r.Name), append(values, r.Value)
	})
	read("golden.jsonl", func(line []byte) {
		var g struct{ Events []json.RawMessage }
		if err := json.Unmarshal(line, &g); err != nil {
			t.Fatal(err)
		}
		events = append(events, len(g.Events))
	})
	if len(values) == 0 || len(values) != len(events) {
		t.Fatalf("corpus: %d records, %d golden", len(values), len(events))
	}
	return values, names, events
}

// TestDecodeSimpleFiles: a simple row record decodes with its table's BOOTSTRAP given as
// --schema-file, is refused without it (exit 1, the hint naming the flag), and a value
// altered by one byte with the checksum kept is a checksum mismatch (exit 1).
func TestDecodeSimpleFiles(t *testing.T) {
	values, names, _ := simpleCorpus(t)
	find := func(prefix string) string {
		for i, n := range names {
			if strings.HasPrefix(n, prefix) {
				return values[i]
			}
		}
		t.Fatalf("no corpus record %s…", prefix)
		return ""
	}
	dir := t.TempDir()
	write := func(name, content string) string {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return f
	}
	boot := write("boot.json", find("013-bootstrap-BOOTSTRAP-t_uk_nn"))
	rowText := find("014-row-t_uk_nn-INSERT-checksum-1")
	row := write("row.json", rowText)

	out, err := runDecodeCommand(t, "--protocol", "simple", "--value-file", row)
	if exitCode(err) != 1 || !strings.Contains(err.Error(), "--schema-file") || !strings.Contains(err.Error(), "t_uk_nn") {
		t.Fatalf("a row without its schema: exit %d, %v\n%s", exitCode(err), err, out)
	}
	out, err = runDecodeCommand(t, "--protocol", "simple", "--schema-file", boot, "--value-file", row)
	if err != nil {
		t.Fatalf("a row with its BOOTSTRAP: %v\n%s", err, out)
	}
	var ev struct {
		Kind     string `json:"kind"`
		CommitTs uint64 `json:"commit_ts"`
		Table    string `json:"table"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &ev); err != nil || ev.Kind != "row" || ev.Table != "t_uk_nn" || ev.CommitTs == 0 {
		t.Fatalf("printed %q (%v), want one row event of t_uk_nn", out, err)
	}

	// One byte of one value altered, the checksum kept: the row's values no longer hash
	// to it.
	var m map[string]any
	d := json.NewDecoder(strings.NewReader(rowText))
	d.UseNumber() // the commit ts and schema version are beyond float64's integers
	if err := d.Decode(&m); err != nil {
		t.Fatal(err)
	}
	// Column b is t_uk_nn's VARCHAR: its text stays a valid value when one byte changes
	// (an integer column's would not decode at all).
	data, _ := m["data"].(map[string]any)
	b, ok := data["b"].(string)
	if !ok || b == "" {
		t.Fatalf("no VARCHAR value b to alter in %s", rowText)
	}
	alt := []byte(b)
	alt[0] ^= 0x01
	data["b"] = string(alt)
	bad, _ := json.Marshal(m)
	out, err = runDecodeCommand(t, "--protocol", "simple", "--schema-file", boot, "--value-file", write("bad.json", string(bad)))
	if exitCode(err) != 1 || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("an altered value: exit %d, %v\n%s", exitCode(err), err, out)
	}

	if _, err := runDecodeCommand(t, "--protocol", "canal-json", "--schema-file", boot, "--value-file", row); exitCode(err) != 2 {
		t.Errorf("--schema-file with canal-json: exit %d, %v", exitCode(err), err)
	}
	if _, err := runDecodeCommand(t, "--protocol", "simple", "--schema-file", row, "--value-file", row); exitCode(err) != 2 || !strings.Contains(err.Error(), "not a DDL or BOOTSTRAP") {
		t.Errorf("a row as --schema-file: exit %d, %v", exitCode(err), err)
	}
}

// TestDecodeSimpleKafka: the corpus produced to Kafka in stream order decodes from the
// first offset (every record, as many events as the golden file says), and from an
// offset past the tables' BOOTSTRAPs, whose schemas are learned from the records before it.
func TestDecodeSimpleKafka(t *testing.T) {
	values, names, events := simpleCorpus(t)
	broker := testenv.Kafka(t)
	topic := testenv.NewTopic(t, "decode-simple", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	msgs := make([]kafka.Message, len(values))
	for i, v := range values {
		msgs[i] = kafka.Message{Value: []byte(v)}
	}
	produce(ctx, t, broker, topic, 0, msgs)

	count := func(from int) int {
		n := 0
		for _, e := range events[from:] {
			n += e
		}
		return n
	}
	out, err := runDecodeCommand(t, "--protocol", "simple", "--brokers", broker, "--topic", topic)
	if err != nil {
		t.Fatalf("from the first offset: %v\n%s", err, out)
	}
	if got := strings.Count(out, "\n"); got != count(0) {
		t.Fatalf("from the first offset: %d events, want %d", got, count(0))
	}

	// The first row record after at least one BOOTSTRAP: from there on, the rows need
	// the schemas of records before the offset.
	from := -1
	for i, n := range names {
		if strings.Contains(n, "-row-") && i > 0 && strings.Contains(names[i-1], "BOOTSTRAP") {
			from = i
			break
		}
	}
	if from < 0 {
		t.Fatal("no row record after a BOOTSTRAP in the corpus")
	}
	out, err = runDecodeCommand(t, "--protocol", "simple", "--brokers", broker, "--topic", topic, "--offset", strconv.Itoa(from))
	if err != nil {
		t.Fatalf("from offset %d (%s): %v\n%s", from, names[from], err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != count(from) || !strings.Contains(lines[0], `"kafka_offset":`+strconv.Itoa(from)+`,`) {
		t.Fatalf("from offset %d: %d events, want %d; first %s", from, len(lines), count(from), lines[0])
	}
}
