package simple

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/tidb-parity/parity/internal/testenv"
)

// datasetDir is TiCDC v8.5.6's own simple-protocol changefeed (../shared/ticdc-random,
// beside the repository): ~13,000 records with row checksums.
var datasetDir = filepath.Join("..", "..", "..", "shared", "ticdc-random", "simple-index-value")

type datasetRecord struct {
	Partition int    `json:"partition"`
	Key       []byte `json:"key"`
	Value     []byte `json:"value"`
	Kind      string `json:"kind"`
}

func loadDataset(tb testing.TB) []datasetRecord {
	tb.Helper()
	var recs []datasetRecord
	testenv.GzipLines(tb, filepath.Join(datasetDir, "records.jsonl.gz"), func(line []byte) {
		var r datasetRecord
		if err := json.Unmarshal(line, &r); err != nil {
			tb.Fatal(err)
		}
		recs = append(recs, r)
	})
	if len(recs) == 0 {
		tb.Fatal("the dataset has no records")
	}
	return recs
}

type datasetMeta struct {
	Records struct {
		ByKind             map[string]int `json:"by_kind"`
		Events             map[string]int `json:"events"`
		NewImagesChecksum0 int            `json:"new_images_with_checksum_0"`
		OldImagesChecksum0 int            `json:"old_images_with_checksum_0"`
	} `json:"records"`
	RowChecksums struct {
		WithChecksum int `json:"row_events_with_checksum"`
		Corrupted    int `json:"row_events_flagged_corrupted"`
	} `json:"row_checksums"`
}

func loadMeta(tb testing.TB) datasetMeta {
	b, err := os.ReadFile(filepath.Join(datasetDir, "meta.json"))
	if err != nil {
		tb.Fatal(err)
	}
	var m datasetMeta
	if err := json.Unmarshal(b, &m); err != nil {
		tb.Fatal(err)
	}
	return m
}

// TestDatasetChecksums decodes every record of the TiCDC-made changefeed in file order
// with one decoder (as the consumer would serve all partitions) and verifies every row
// checksum: all must verify; the images TiCDC sent without one are counted and must be
// exactly the ones the dataset's generator counted.
func TestDatasetChecksums(t *testing.T) {
	recs := loadDataset(t)
	meta := loadMeta(t)
	d, err := NewDecoder(DefaultDecoderConfig())
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for i, r := range recs {
		evs, err := d.Decode(r.Key, r.Value)
		if err != nil {
			t.Fatalf("record %d (partition %d, %s): %v", i, r.Partition, r.Kind, WithRecord(err, "dataset", r.Partition, int64(i)))
		}
		switch r.Kind {
		case "bootstrap":
			if len(evs) != 0 {
				t.Fatalf("record %d: a BOOTSTRAP gave %d events", i, len(evs))
			}
		default:
			if len(evs) != 1 {
				t.Fatalf("record %d: %d events", i, len(evs))
			}
			if got := evs[0].Kind.String(); got != r.Kind {
				t.Fatalf("record %d: decoded as %s, the dataset says %s", i, got, r.Kind)
			}
			if r.Kind == "row" {
				kinds[evs[0].Op.String()]++
			}
		}
	}
	for _, op := range []string{"insert", "update", "delete"} {
		if kinds[op] != meta.Records.Events[op] {
			t.Errorf("%d %s events, the dataset has %d", kinds[op], op, meta.Records.Events[op])
		}
	}
	st := d.Stats()
	images := uint64(kinds["insert"] + kinds["delete"] + 2*kinds["update"])
	wantWithout := uint64(meta.Records.NewImagesChecksum0 + meta.Records.OldImagesChecksum0)
	t.Logf("rows verified %d, rows without checksum %d, mismatches %d (of %d row images in %d records)",
		st.RowsVerified, st.RowsWithoutChecksum, st.Mismatches, images, len(recs))
	if st.Mismatches != 0 {
		t.Errorf("%d mismatches", st.Mismatches)
	}
	if st.RowsVerified+st.RowsWithoutChecksum != images {
		t.Errorf("verified %d + without %d != %d images", st.RowsVerified, st.RowsWithoutChecksum, images)
	}
	if st.RowsWithoutChecksum != wantWithout {
		t.Errorf("%d images without checksum, the dataset's generator counted %d", st.RowsWithoutChecksum, wantWithout)
	}
	if st.RowsVerified == 0 {
		t.Error("nothing verified")
	}
}
