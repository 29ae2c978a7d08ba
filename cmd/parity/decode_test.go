package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/internal/corpus"
	"github.com/tidb-parity/parity/internal/testenv"
)

// runDecodeCommand runs `parity decode args...` and returns its output and error.
func runDecodeCommand(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(append([]string{"decode"}, args...))
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

func exitCode(err error) int {
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	if err != nil {
		return 2
	}
	return 0
}

// TestDecodeFiles decodes corpus records from files and compares with the golden output
// pinned by cdc/open's tests (the same rendering).
func TestDecodeFiles(t *testing.T) {
	root := corpus.Dir(t)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"row-all-types-05-insert-escapes-binary", nil},
		{"row-all-types-07-update", nil},
		{"ddl-02-create-table-all-types", nil},
		{"resolved-03-edge-values", nil}, // three records: key.0.bin …
		{"compression-lz4-02-row-batch", []string{"--compression", "lz4"}},
		{"large-05-claim-check-insert", []string{"--claim-check-dir", "claim-check"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(root, tc.name)
			golden, err := os.ReadFile(filepath.Join("..", "..", "cdc", "open", "testdata", "decode", tc.name+".jsonl"))
			if err != nil {
				t.Fatal(err)
			}
			pairs := [][2]string{{"key.bin", "value.bin"}}
			if _, err := os.Stat(filepath.Join(dir, "key.bin")); err != nil {
				pairs = nil
				for i := 0; ; i++ {
					k := "key." + strconv.Itoa(i) + ".bin"
					if _, err := os.Stat(filepath.Join(dir, k)); err != nil {
						break
					}
					pairs = append(pairs, [2]string{k, "value." + strconv.Itoa(i) + ".bin"})
				}
			}
			var got strings.Builder
			for _, p := range pairs {
				args := []string{"--key-file", filepath.Join(dir, p[0]), "--value-file", filepath.Join(dir, p[1])}
				for _, a := range tc.args {
					if a == "claim-check" {
						a = filepath.Join(dir, a)
					}
					args = append(args, a)
				}
				out, err := runDecodeCommand(t, args...)
				if err != nil {
					t.Fatalf("decode %v: %v", p, err)
				}
				got.WriteString(out)
			}
			if got.String() != string(golden) {
				t.Errorf("output:\n%s\nwant:\n%s", got.String(), golden)
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	root := corpus.Dir(t)
	tmp := t.TempDir()
	junk := filepath.Join(tmp, "junk.bin")
	if err := os.WriteFile(junk, []byte{0, 0, 0, 0, 0, 0, 0, 2}, 0o644); err != nil {
		t.Fatal(err)
	}
	cc := filepath.Join(root, "large-05-claim-check-insert")
	lz4 := filepath.Join(root, "compression-lz4-01-row-insert")
	for _, tc := range []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"no source", nil, 2, []string{"give --key-file"}},
		{"key without value", []string{"--key-file", junk}, 2, []string{"go together"}},
		{"both sources", []string{"--key-file", junk, "--value-file", junk, "--brokers", "x:1", "--topic", "t"}, 2, []string{"exclusive"}},
		{"bad compression", []string{"--key-file", junk, "--value-file", junk, "--compression", "zstd"}, 2, []string{"--compression"}},
		{"bad offset", []string{"--brokers", "x:1", "--topic", "t", "--offset", "-3"}, 2, []string{"--offset"}},
		{"missing file", []string{"--key-file", filepath.Join(tmp, "nope"), "--value-file", junk}, 2, []string{"read key"}},
		{"bad version", []string{"--key-file", junk, "--value-file", junk}, 1, []string{"junk.bin", "key byte 0", "field version", "unsupported key format version 2"}},
		{"claim-check without dir", []string{"--key-file", filepath.Join(cc, "key.bin"), "--value-file", filepath.Join(cc, "value.bin")},
			1, []string{"key byte 16, event 0, field ccl", "no claim-check storage is configured", "give --claim-check-dir"}},
		{"wrong compression", []string{"--key-file", filepath.Join(lz4, "key.bin"), "--value-file", filepath.Join(lz4, "value.bin"), "--compression", "snappy"},
			1, []string{"value byte 8", "event 0", "cannot decompress"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := runDecodeCommand(t, tc.args...)
			if code := exitCode(err); code != tc.code {
				t.Fatalf("exit code %d (%v), want %d", code, err, tc.code)
			}
			if out != "" {
				t.Errorf("printed %q before failing", out)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// TestDecodeKafka produces corpus records to the test Kafka and reads them back with
// `parity decode --brokers/--topic`.
func TestDecodeKafka(t *testing.T) {
	root := corpus.Dir(t)
	broker := testenv.Kafka(t)
	topic := testenv.NewTopic(t, "decode", 3)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	type rec struct{ key, value []byte }
	read := func(c, name string) []byte {
		b, err := os.ReadFile(filepath.Join(root, c, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// partition → records, in offset order
	plan := map[int][]rec{
		0: {
			{read("batch-01-default-max-batch-size-16", "key.0.bin"), read("batch-01-default-max-batch-size-16", "value.0.bin")},
			{read("batch-01-default-max-batch-size-16", "key.1.bin"), read("batch-01-default-max-batch-size-16", "value.1.bin")},
			{read("row-all-types-01-insert-typical", "key.bin"), read("row-all-types-01-insert-typical", "value.bin")},
		},
		1: {
			{read("ddl-13-rename-tables-multi", "key.0.bin"), read("ddl-13-rename-tables-multi", "value.0.bin")},
			{read("ddl-13-rename-tables-multi", "key.1.bin"), read("ddl-13-rename-tables-multi", "value.1.bin")},
			{read("resolved-02-sequence", "key.0.bin"), read("resolved-02-sequence", "value.0.bin")},
			{read("row-all-types-13-update-pk-change", "key.bin"), read("row-all-types-13-update-pk-change", "value.bin")},
			{read("newarch-row-all-types-02-insert-max", "key.bin"), read("newarch-row-all-types-02-insert-max", "value.bin")},
		},
		2: {
			{read("row-all-types-05-insert-escapes-binary", "key.bin"), read("row-all-types-05-insert-escapes-binary", "value.bin")},
			{[]byte("not an open-protocol key"), []byte("junk")},
			{read("resolved-01-single", "key.bin"), read("resolved-01-single", "value.bin")},
		},
	}
	for p, recs := range plan {
		var msgs []kafka.Message
		for _, r := range recs {
			msgs = append(msgs, kafka.Message{Key: r.key, Value: r.value})
		}
		produce(ctx, t, broker, topic, p, msgs)
	}
	// expected renders records [from, to) of partition p as the command must print them.
	dec, err := open.NewDecoder(open.DefaultDecoderConfig())
	if err != nil {
		t.Fatal(err)
	}
	expected := func(p, from, to int) string {
		var b []byte
		for off := from; off < to; off++ {
			r := plan[p][off]
			evs, err := dec.Decode(r.key, r.value)
			if err != nil {
				t.Fatalf("partition %d offset %d: %v", p, off, err)
			}
			for i := range evs {
				b = open.AppendJSONLine(b, &evs[i], &open.RecordRef{Topic: topic, Partition: p, Offset: int64(off), Index: i})
			}
		}
		return string(b)
	}

	t.Run("one partition", func(t *testing.T) {
		out, err := runDecodeCommand(t, "--brokers", broker, "--topic", topic, "--partition", "0")
		if err != nil {
			t.Fatal(err)
		}
		if want := expected(0, 0, 3); out != want {
			t.Errorf("output:\n%s\nwant:\n%s", out, want)
		}
		if n := strings.Count(out, "\n"); n != 21 {
			t.Errorf("%d lines, want 21 (16+4 batch events and 1 insert)", n)
		}
	})
	t.Run("offset and limit", func(t *testing.T) {
		out, err := runDecodeCommand(t, "--brokers", broker, "--topic", topic, "--partition", "1", "--offset", "2", "--limit", "2")
		if err != nil {
			t.Fatal(err)
		}
		if want := expected(1, 2, 4); out != want {
			t.Errorf("output:\n%s\nwant:\n%s", out, want)
		}
	})
	t.Run("all partitions stop at the bad record", func(t *testing.T) {
		out, err := runDecodeCommand(t, "--brokers", "127.0.0.1:1,"+broker, "--topic", topic)
		if code := exitCode(err); code != 1 {
			t.Fatalf("exit code %d (%v), want 1", code, err)
		}
		var de *open.DecodeError
		if !errors.As(err, &de) || de.Topic != topic || de.Partition != 2 || de.KafkaOffset != 1 {
			t.Fatalf("error does not name the record: %v", err)
		}
		for _, w := range []string{"topic " + topic + " partition 2 offset 1", "key byte 0", "unsupported key format version"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q does not contain %q", err, w)
			}
		}
		if want := expected(0, 0, 3) + expected(1, 0, 5) + expected(2, 0, 1); out != want {
			t.Errorf("output before the error:\n%s\nwant:\n%s", out, want)
		}
	})
	t.Run("missing partition", func(t *testing.T) {
		_, err := runDecodeCommand(t, "--brokers", broker, "--topic", topic, "--partition", "7")
		if code := exitCode(err); code != 2 {
			t.Fatalf("exit code %d (%v), want 2", code, err)
		}
	})
}

// produce writes msgs to one partition, retrying while a new topic's leader settles
// (a failed produce request writes nothing).
func produce(ctx context.Context, t *testing.T, broker, topic string, partition int, msgs []kafka.Message) {
	t.Helper()
	var err error
	for ctx.Err() == nil {
		var conn *kafka.Conn
		if conn, err = kafka.DialLeader(ctx, "tcp", broker, topic, partition); err == nil {
			_ = conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
			_, err = conn.WriteMessages(msgs...)
			conn.Close()
			if err == nil {
				return
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("produce to %s partition %d: %v", topic, partition, err)
}

// TestDecodeCanalJSON prints TiCDC-made canal-json records (cdc/canal's corpus, from
// ../shared/ticdc-random/canal-json-table) given as a value file alone, and refuses a
// record without the TiDB extension, naming the sink-URI option.
func TestDecodeCanalJSON(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "cdc", "canal", "testdata", "ticdc-v8.5.6.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	kinds := map[string]bool{}
	for i, line := range lines {
		var r struct{ Value string }
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(dir, strconv.Itoa(i)+".json")
		if err := os.WriteFile(f, []byte(r.Value), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := runDecodeCommand(t, "--protocol", "canal-json", "--value-file", f)
		if err != nil {
			t.Fatalf("record %d: %v\n%s", i, err, out)
		}
		var ev struct {
			Kind     string `json:"kind"`
			CommitTs uint64 `json:"commit_ts"`
		}
		if err := json.Unmarshal([]byte(strings.SplitN(out, "\n", 2)[0]), &ev); err != nil || ev.CommitTs == 0 {
			t.Fatalf("record %d: %v: %s", i, err, out)
		}
		kinds[ev.Kind] = true
	}
	if !kinds["row"] || !kinds["ddl"] || !kinds["resolved"] {
		t.Errorf("kinds printed: %v", kinds)
	}
	f := filepath.Join(dir, "noext.json")
	if err := os.WriteFile(f, []byte(`{"type":"INSERT","table":"t","mysqlType":{"a":"int"},"data":[{"a":"1"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runDecodeCommand(t, "--protocol", "canal-json", "--value-file", f)
	if exitCode(err) != 1 || !strings.Contains(err.Error(), "enable-tidb-extension=true") {
		t.Errorf("no TiDB extension: exit %d, %v\n%s", exitCode(err), err, out)
	}
	if _, err := runDecodeCommand(t, "--protocol", "avro", "--value-file", f); exitCode(err) != 2 {
		t.Errorf("--protocol avro: exit %d, %v", exitCode(err), err)
	}
}
