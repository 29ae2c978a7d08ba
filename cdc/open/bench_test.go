package open

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"
)

// allTypesBatch returns one Kafka record of 16 all-types row events, encoded like
// classic TiCDC: the corpus's typical, max, min/empty, NULL and escape inserts, an
// update and a delete, repeated.
func allTypesBatch(b testing.TB, comp Compression) Message {
	b.Helper()
	var evs []Event
	for _, c := range loadCorpus(b) {
		switch c.Name {
		case "row-all-types-01-insert-typical", "row-all-types-02-insert-max", "row-all-types-03-insert-min-empty",
			"row-all-types-04-insert-nulls", "row-all-types-05-insert-escapes-binary", "row-all-types-07-update",
			"row-all-types-11-delete":
			got, err := c.decoder(b, false).Decode(c.read(b, c.Messages[0].KeyFile), c.read(b, c.Messages[0].ValueFile))
			if err != nil {
				b.Fatal(err)
			}
			evs = append(evs, got...)
		}
	}
	if len(evs) != 7 {
		b.Fatalf("found %d all-types events in the corpus, want 7", len(evs))
	}
	enc, err := NewEncoder(EncoderConfig{Compression: comp})
	if err != nil {
		b.Fatal(err)
	}
	for i := range 16 {
		if err := enc.AppendRow(&evs[i%len(evs)]); err != nil {
			b.Fatal(err)
		}
	}
	msgs := enc.Build()
	if len(msgs) != 1 || msgs[0].Events != 16 {
		b.Fatalf("want one record of 16 events, got %d records", len(msgs))
	}
	return msgs[0]
}

// sysbenchBatch returns one record of 16 sysbench rows (id BIGINT, the handle; k INT;
// c CHAR(120); pad CHAR(60)) over 8 tables, the shape of the changefeed
// BenchmarkApplierInsert applies (cdc/e2e). There the key, the names and the copies of
// the text weigh more than in allTypesBatch's wide rows: what serve's profile shows.
func sysbenchBatch(b testing.TB, comp Compression) Message {
	return sysbenchRecord(b, comp, false, false)
}

// sysbenchTxn is one record of one 16-row sysbench transaction as classic TiCDC writes
// it: one table, one commit ts, keys that differ only in their row id.
func sysbenchTxn(b testing.TB) Message {
	return sysbenchRecord(b, CompressionNone, true, false)
}

// sysbenchUpdateTxn is sysbenchTxn with updates (every column but the handle changed, as
// in BenchmarkApplierUpdate): each row carries its old values too.
func sysbenchUpdateTxn(b testing.TB) Message {
	return sysbenchRecord(b, CompressionNone, true, true)
}

// sysbenchRecord encodes 16 sysbench inserts (updates when update is set) into one
// record: of one transaction (one table and commit ts, classic keys with row ids) when
// txn is set, else each with its own commit ts and one of 8 tables.
func sysbenchRecord(b testing.TB, comp Compression, txn, update bool) Message {
	b.Helper()
	enc, err := NewEncoder(EncoderConfig{Compression: comp})
	if err != nil {
		b.Fatal(err)
	}
	digits := "83868641912-28773667398-52066376034-47294575418-12086617934-48283512749-97536911423-"
	row := func(id, k int64, c string) []Column {
		return []Column{
			{Name: "id", Type: 8, Flags: FlagHandleKey | FlagPrimaryKey, Value: id},
			{Name: "k", Type: 3, Value: k},
			{Name: "c", Type: 254, Value: c},
			{Name: "pad", Type: 254, Value: c[:59]},
		}
	}
	for i := range 16 {
		id := int64(5_000_000 + i)
		ev := Event{Kind: KindRow, CommitTs: 470780676075945984 + uint64(i), Schema: "bench", Table: fmt.Sprintf("sbtest%d", i%8+1), Op: OpInsert,
			Columns: row(id, int64(498_000+37*i), (digits + digits)[i:i+119])}
		if txn {
			ev.CommitTs, ev.Table, ev.RowID = 470780676075945984, "sbtest3", id
		}
		if update {
			ev.Op, ev.OldColumns = OpUpdate, row(id, int64(501_000+41*i), (digits + digits)[i+3:i+122])
		}
		if err := enc.AppendRow(&ev); err != nil {
			b.Fatal(err)
		}
	}
	msgs := enc.Build()
	if len(msgs) != 1 || msgs[0].Events != 16 {
		b.Fatalf("want one record of 16 events, got %d records", len(msgs))
	}
	return msgs[0]
}

func benchDecode(b *testing.B, comp Compression) {
	benchDecodeMessage(b, comp, allTypesBatch(b, comp), comp == CompressionNone)
}

// benchDecodeMessage decodes m (16 events) b.N times; withBaseline also reports the ratio
// against encoding/json on allTypesBatch (the named baseline).
func benchDecodeMessage(b *testing.B, comp Compression, m Message, withBaseline bool) {
	d, err := NewDecoder(DecoderConfig{Compression: comp})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(m.Key) + len(m.Value)))
	b.ReportAllocs()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	mallocs, cpu := ms.Mallocs, processCPU(b)
	b.ResetTimer()
	for b.Loop() {
		evs, err := d.Decode(m.Key, m.Value)
		if err != nil || len(evs) != 16 {
			b.Fatal(err)
		}
	}
	cpu = processCPU(b) - cpu
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(16*b.N)/b.Elapsed().Seconds(), "events/s")
	// Wall-clock MB/s follows the machine's load; the process's CPU time per byte (GC
	// included) much less: compare builds on MB/cpu-s when the machine is busy.
	b.ReportMetric(float64(len(m.Key)+len(m.Value))*float64(b.N)/cpu.Seconds()/1e6, "MB/cpu-s")
	b.ReportMetric(float64(ms.Mallocs-mallocs)/float64(16*b.N), "allocs/event")
	if withBaseline {
		// The ratio against the named baseline, measured in the same run.
		baselineOnce.Do(func() {
			start, n := time.Now(), 0
			for ; time.Since(start) < time.Second; n++ {
				if err := baselineDecode(m); err != nil {
					b.Fatal(err)
				}
			}
			baselineNsPerOp = float64(time.Since(start).Nanoseconds()) / float64(n)
		})
		perOp := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
		b.ReportMetric(baselineNsPerOp/perOp, "x-vs-encoding/json")
	}
}

// processCPU returns the user and system CPU time the process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

var (
	baselineOnce    sync.Once
	baselineNsPerOp float64
)

// BenchmarkDecode: decoding throughput for a 16-event all-types record. Targets (issue
// 32): ≥ 300 MB/s of record bytes per core uncompressed, ≥ 150 MB/s of (compressed)
// record bytes with snappy and lz4, ≤ 5 allocations per event (TestDecodeAllocations
// pins that one). On a busy machine read MB/cpu-s rather than MB/s (docs/decode.md).
func BenchmarkDecode(b *testing.B) {
	b.Run("none", func(b *testing.B) { benchDecode(b, CompressionNone) })
	b.Run("snappy", func(b *testing.B) { benchDecode(b, CompressionSnappy) })
	b.Run("lz4", func(b *testing.B) { benchDecode(b, CompressionLZ4) })
}

// BenchmarkDecodeSysbench decodes sysbenchBatch: the applier bench's rows, where serve
// spends its decoding time (docs/serve.md).
func BenchmarkDecodeSysbench(b *testing.B) {
	benchDecodeMessage(b, CompressionNone, sysbenchBatch(b, CompressionNone), false)
}

// BenchmarkDecodeSysbenchTxn decodes one 16-row sysbench transaction's record (sysbenchTxn):
// the keys of its rows begin alike.
func BenchmarkDecodeSysbenchTxn(b *testing.B) {
	benchDecodeMessage(b, CompressionNone, sysbenchTxn(b), false)
}

// BenchmarkDecodeSysbenchUpdate decodes one 16-row sysbench transaction of updates
// (sysbenchUpdateTxn): the record BenchmarkApplierUpdate's serve decodes.
func BenchmarkDecodeSysbenchUpdate(b *testing.B) {
	benchDecodeMessage(b, CompressionNone, sysbenchUpdateTxn(b), false)
}

// BenchmarkDecodeBaselineEncodingJSON is the named baseline: the same record decoded the
// way tiflow's reference decoder does it (encoding/json into structs and maps with
// UseNumber), without even converting the values.
func BenchmarkDecodeBaselineEncodingJSON(b *testing.B) {
	m := allTypesBatch(b, CompressionNone)
	b.SetBytes(int64(len(m.Key) + len(m.Value)))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := baselineDecode(m); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(16*b.N)/b.Elapsed().Seconds(), "events/s")
}

type baselineColumn struct {
	T byte        `json:"t"`
	H *bool       `json:"h"`
	F uint64      `json:"f"`
	V interface{} `json:"v"`
}

type baselineKey struct {
	Ts  uint64 `json:"ts"`
	Scm string `json:"scm"`
	Tbl string `json:"tbl"`
	Rid int64  `json:"rid"`
	Ptn *int64 `json:"ptn"`
	T   int    `json:"t"`
	Ohk bool   `json:"ohk"`
	Ccl string `json:"ccl"`
}

type baselineRow struct {
	U map[string]baselineColumn `json:"u"`
	P map[string]baselineColumn `json:"p"`
	D map[string]baselineColumn `json:"d"`
}

// baselineDecode decodes a record like tiflow's reference decoder.
func baselineDecode(m Message) error {
	k, v := m.Key[8:], m.Value
	n := 0
	for len(k) > 0 {
		kl := binary.BigEndian.Uint64(k)
		var mk baselineKey
		if err := json.Unmarshal(k[8:8+kl], &mk); err != nil {
			return err
		}
		k = k[8+kl:]
		vl := binary.BigEndian.Uint64(v)
		dec := json.NewDecoder(bytes.NewReader(v[8 : 8+vl]))
		dec.UseNumber()
		var r baselineRow
		if err := dec.Decode(&r); err != nil {
			return err
		}
		v = v[8+vl:]
		n++
	}
	if n != 16 {
		return fmt.Errorf("%d events", n)
	}
	return nil
}

// BenchmarkEncode: encoding a 16-event all-types record (used by the load generator).
func BenchmarkEncode(b *testing.B) {
	m := allTypesBatch(b, CompressionNone)
	d, _ := NewDecoder(DefaultDecoderConfig())
	evs, err := d.Decode(m.Key, m.Value)
	if err != nil {
		b.Fatal(err)
	}
	enc, _ := NewEncoder(DefaultEncoderConfig())
	b.SetBytes(int64(len(m.Key) + len(m.Value)))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		for i := range evs {
			if err := enc.AppendRow(&evs[i]); err != nil {
				b.Fatal(err)
			}
		}
		if out := enc.Build(); len(out) != 1 {
			b.Fatal(len(out))
		}
	}
	b.ReportMetric(float64(16*b.N)/b.Elapsed().Seconds(), "events/s")
}
