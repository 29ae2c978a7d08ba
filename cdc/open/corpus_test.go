package open

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tidb-parity/parity/internal/corpus"
)

// corpusCase is one case directory with its expected.json.
type corpusCase struct {
	Name    string
	Dir     string
	Encoder struct {
		Protocol             string      `json:"protocol"`
		MaxMessageBytes      json.Number `json:"max_message_bytes"`
		MaxBatchSize         json.Number `json:"max_batch_size"`
		LargeMessageHandle   string      `json:"large_message_handle_option"`
		Compression          string      `json:"large_message_handle_compression"`
		ClaimCheckStorageURI string      `json:"claim_check_storage_uri"`
		OutputOldValue       bool        `json:"output_old_value"`
		OnlyUpdatedColumns   bool        `json:"only_output_updated_columns"`
		DeleteOnlyHandleKey  bool        `json:"delete_only_output_handle_key_columns"`
	} `json:"encoder"`
	Messages []struct {
		KeyFile   string          `json:"key_file"`
		ValueFile string          `json:"value_file"`
		Events    []expectedEvent `json:"events"`
	} `json:"messages"`
	ClaimCheckFiles []struct {
		File     string        `json:"file"`
		Location string        `json:"location_in_key"`
		Event    expectedEvent `json:"event"`
	} `json:"claim_check_files"`
}

type expectedEvent struct {
	Index              int           `json:"index"`
	Kind               string        `json:"kind"`
	ValueJSON          *string       `json:"value_json"`
	ResolvedTs         json.Number   `json:"resolved_ts"`
	CommitTs           json.Number   `json:"commit_ts"`
	Schema             string        `json:"schema"`
	Table              string        `json:"table"`
	DDLType            int           `json:"ddl_type"`
	Query              string        `json:"query"`
	RowKindOnWire      string        `json:"row_kind_on_wire"`
	RowKind            string        `json:"row_kind"`
	RowID              int64         `json:"row_id"`
	IsPartitionTable   bool          `json:"is_partition_table"`
	PhysicalTableID    int64         `json:"physical_table_id"`
	OnlyHandleKey      bool          `json:"only_handle_key"`
	ClaimCheckLocation string        `json:"claim_check_location"`
	Columns            []expectedCol `json:"columns"`
	PreColumns         []expectedCol `json:"pre_columns"`
}

type expectedCol struct {
	Name          string          `json:"name"`
	MySQLType     int             `json:"mysql_type"`
	Flags         uint64          `json:"flags"`
	GoType        string          `json:"go_type"`
	Value         json.RawMessage `json:"value"`
	ValueEncoding string          `json:"value_encoding"`
	Generated     string          `json:"generated"`
	OnWire        bool            `json:"on_wire"`
	WireSection   string          `json:"wire_section"`
}

func (c *corpusCase) newArch() bool { return strings.HasPrefix(c.Name, "newarch-") }

func (c *corpusCase) flavour() Flavour {
	if c.newArch() {
		return FlavourNewArch
	}
	return FlavourClassic
}

func loadCorpus(t testing.TB) []*corpusCase {
	t.Helper()
	root, cases := corpus.Load(t, func(name, dir string) *corpusCase { return &corpusCase{Name: name, Dir: dir} })
	if len(cases) == 0 {
		t.Fatalf("no cases in %s", root)
	}
	return cases
}

func (c *corpusCase) read(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(c.Dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// claimCheckLoader resolves a location to the case's claim-check/<file name>.
func (c *corpusCase) claimCheckLoader() func(string) ([]byte, error) {
	return func(location string) ([]byte, error) {
		return os.ReadFile(filepath.Join(c.Dir, "claim-check", ClaimCheckFileName(location)))
	}
}

func (c *corpusCase) decoder(t testing.TB, keep bool) *Decoder {
	t.Helper()
	d, err := NewDecoder(DecoderConfig{
		Compression:    Compression(c.Encoder.Compression),
		ClaimCheck:     c.claimCheckLoader(),
		KeepClaimCheck: keep,
	})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestCorpusDecode(t *testing.T) {
	cases := loadCorpus(t)
	events := 0
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			d := c.decoder(t, false)
			for mi, m := range c.Messages {
				got, err := d.Decode(c.read(t, m.KeyFile), c.read(t, m.ValueFile))
				if err != nil {
					t.Fatalf("message %d: %v", mi, err)
				}
				if len(got) != len(m.Events) {
					t.Fatalf("message %d: %d events, want %d", mi, len(got), len(m.Events))
				}
				for i, want := range m.Events {
					if want.ClaimCheckLocation != "" {
						// The record is resolved through the claim-check object: the
						// event must be the one stored there, with the location kept.
						var found bool
						for _, f := range c.ClaimCheckFiles {
							if f.Location == want.ClaimCheckLocation {
								ev := f.Event
								ev.ClaimCheckLocation = want.ClaimCheckLocation
								checkEvent(t, c, fmt.Sprintf("message %d event %d (claim-check)", mi, i), &got[i], &ev)
								found = true
							}
						}
						if !found {
							t.Fatalf("message %d event %d: no claim-check file for %s", mi, i, want.ClaimCheckLocation)
						}
						continue
					}
					checkEvent(t, c, fmt.Sprintf("message %d event %d", mi, i), &got[i], &want)
				}
				events += len(got)
			}
		})
	}
	t.Logf("%d cases, %d events", len(cases), events)
}

func checkEvent(t *testing.T, c *corpusCase, where string, got *Event, want *expectedEvent) {
	t.Helper()
	errorf := func(format string, args ...any) {
		t.Helper()
		t.Errorf("%s: %s", where, fmt.Sprintf(format, args...))
	}
	if got.Kind.String() != want.Kind {
		errorf("kind %s, want %s", got.Kind, want.Kind)
		return
	}
	switch got.Kind {
	case KindResolved:
		if s := strconv.FormatUint(got.CommitTs, 10); s != want.ResolvedTs.String() {
			errorf("resolved ts %s, want %s", s, want.ResolvedTs)
		}
		return
	case KindDDL:
		if got.Query != want.Query || got.DDLType != want.DDLType {
			errorf("ddl %d %q, want %d %q", got.DDLType, got.Query, want.DDLType, want.Query)
		}
	}
	if s := strconv.FormatUint(got.CommitTs, 10); s != want.CommitTs.String() {
		errorf("commit ts %s, want %s", s, want.CommitTs)
	}
	if got.Schema != want.Schema || got.Table != want.Table {
		errorf("table %s.%s, want %s.%s", got.Schema, got.Table, want.Schema, want.Table)
	}
	if got.Kind != KindRow {
		return
	}
	if got.Op.String() != want.RowKindOnWire {
		errorf("op %s, want %s", got.Op, want.RowKindOnWire)
	}
	wantRID := want.RowID
	if c.newArch() {
		wantRID = 0 // the new architecture never writes rid
	}
	if got.RowID != wantRID {
		errorf("row id %d, want %d", got.RowID, wantRID)
	}
	wantPtn := int64(0)
	if want.IsPartitionTable {
		wantPtn = want.PhysicalTableID
	}
	if got.Partition != wantPtn {
		errorf("partition %d, want %d", got.Partition, wantPtn)
	}
	if got.OnlyHandleKey != want.OnlyHandleKey || got.ClaimCheckLocation != want.ClaimCheckLocation {
		errorf("ohk %v ccl %q, want %v %q", got.OnlyHandleKey, got.ClaimCheckLocation, want.OnlyHandleKey, want.ClaimCheckLocation)
	}
	// Expected columns per wire section, in wire order (sorted by name for classic).
	sections := map[string][]expectedCol{}
	for _, col := range append(append([]expectedCol(nil), want.Columns...), want.PreColumns...) {
		if col.OnWire {
			sections[col.WireSection] = append(sections[col.WireSection], col)
		}
	}
	if !c.newArch() {
		for _, cols := range sections {
			slices.SortStableFunc(cols, func(a, b expectedCol) int { return strings.Compare(a.Name, b.Name) })
		}
	}
	var gotNew, gotOld []Column = got.Columns, got.OldColumns
	switch got.Op {
	case OpDelete:
		compareColumns(t, where+" d", gotNew, sections["d"])
		if len(sections["u"])+len(sections["p"]) > 0 || gotOld != nil {
			errorf("delete has u/p columns")
		}
	default:
		compareColumns(t, where+" u", gotNew, sections["u"])
		compareColumns(t, where+" p", gotOld, sections["p"])
	}
	if w := malformedMembers(t, want.ValueJSON); !slices.Equal(got.Malformed, w) {
		errorf("malformed members %q, want %q", got.Malformed, w)
	}
}

// malformedMembers lists members of u/p/d in the wire JSON whose value is not an object.
func malformedMembers(t *testing.T, valueJSON *string) []string {
	if valueJSON == nil {
		return nil
	}
	dec := json.NewDecoder(strings.NewReader(*valueJSON))
	var out []string
	tok := func() json.Token {
		tk, err := dec.Token()
		if err != nil {
			t.Fatalf("value_json: %v", err)
		}
		return tk
	}
	tok() // {
	for dec.More() {
		sec := tok().(string)
		tok() // {
		for dec.More() {
			name := tok().(string)
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				t.Fatal(err)
			}
			if raw[0] != '{' {
				out = append(out, sec+"."+name)
			}
		}
		tok() // }
	}
	return out
}

func compareColumns(t *testing.T, where string, got []Column, want []expectedCol) {
	t.Helper()
	if len(got) != len(want) {
		var names []string
		for _, c := range got {
			names = append(names, c.Name)
		}
		var wnames []string
		for _, c := range want {
			wnames = append(wnames, c.Name)
		}
		t.Errorf("%s: columns %v, want %v", where, names, wnames)
		return
	}
	for i, w := range want {
		g := got[i]
		if g.Name != w.Name || int(g.Type) != w.MySQLType || uint64(g.Flags) != w.Flags {
			t.Errorf("%s: column %d is %s t=%d f=%d, want %s t=%d f=%d", where, i, g.Name, g.Type, g.Flags, w.Name, w.MySQLType, w.Flags)
			continue
		}
		wv, err := expectedValue(w)
		if err != nil {
			t.Errorf("%s: column %s: %v", where, w.Name, err)
			continue
		}
		if !reflect.DeepEqual(g.Value, wv) {
			t.Errorf("%s: column %s = %#v (%T), want %#v (%T)", where, w.Name, g.Value, g.Value, wv, wv)
		}
	}
}

// expectedValue converts an expected.json value into the Go value the decoder must
// produce (the Value rules documented on Column).
func expectedValue(c expectedCol) (any, error) {
	if string(c.Value) == "null" {
		return nil, nil
	}
	switch c.GoType {
	case "int64":
		return strconv.ParseInt(string(c.Value), 10, 64)
	case "uint64":
		return strconv.ParseUint(string(c.Value), 10, 64)
	case "float32":
		f, err := strconv.ParseFloat(string(c.Value), 32)
		return f, err
	case "float64":
		return strconv.ParseFloat(string(c.Value), 64)
	case "string", "types.VectorFloat32":
		var s string
		err := json.Unmarshal(c.Value, &s)
		return s, err
	case "[]uint8":
		var s string
		if err := json.Unmarshal(c.Value, &s); err != nil {
			return nil, err
		}
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return nil, err
		}
		if Flag(c.Flags)&FlagBinary == 0 {
			return string(b), nil // character column: text
		}
		return b, nil
	}
	return nil, fmt.Errorf("unknown go_type %s", c.GoType)
}

// TestCorpusReencode decodes every case and encodes the events again with the case's
// encoder configuration: the records must be TiCDC's bytes.
func TestCorpusReencode(t *testing.T) {
	for _, c := range loadCorpus(t) {
		t.Run(c.Name, func(t *testing.T) {
			d := c.decoder(t, true)
			enc, err := NewEncoder(c.encoderConfig(t))
			if err != nil {
				t.Fatal(err)
			}
			evs := c.decodeAll(t, d)
			got := encodeAll(t, enc, evs)
			if slices.ContainsFunc(evs, func(ev Event) bool { return len(ev.Malformed) > 0 }) {
				// The new-architecture encoder bug (README §7) cannot be reproduced:
				// the decoded events hold what could be recovered, so compare them.
				t.Logf("known new-architecture encoder bug: comparing events, not bytes")
				c.compareDecoded(t, got, d)
				return
			}
			c.compareRecords(t, got)
		})
	}
}

// decodeAll decodes the case's records, in order, into one list of events.
func (c *corpusCase) decodeAll(t testing.TB, d *Decoder) []Event {
	t.Helper()
	var evs []Event
	for mi, m := range c.Messages {
		got, err := d.Decode(c.read(t, m.KeyFile), c.read(t, m.ValueFile))
		if err != nil {
			t.Fatalf("message %d: %v", mi, err)
		}
		evs = append(evs, got...)
	}
	return evs
}

// encodeAll encodes evs the way TiCDC's sink drives its encoder: row events are batched;
// a DDL or resolved event flushes the batch and gets a record of its own.
func encodeAll(t testing.TB, enc *Encoder, evs []Event) []Message {
	t.Helper()
	var out []Message
	for i := range evs {
		ev := &evs[i]
		switch ev.Kind {
		case KindRow:
			if err := enc.AppendRow(ev); err != nil {
				t.Fatalf("encode event %d: %v", i, err)
			}
		case KindDDL:
			out = append(out, enc.Build()...)
			m, err := enc.EncodeDDL(ev)
			if err != nil {
				t.Fatalf("encode DDL event %d: %v", i, err)
			}
			out = append(out, m)
		case KindResolved:
			out = append(out, enc.Build()...)
			out = append(out, enc.EncodeResolved(ev.CommitTs))
		}
	}
	return append(out, enc.Build()...)
}

// compareRecords checks that got are the case's records: the same bytes and event counts.
func (c *corpusCase) compareRecords(t *testing.T, got []Message) {
	t.Helper()
	if len(got) != len(c.Messages) {
		t.Fatalf("%d records, want %d", len(got), len(c.Messages))
	}
	for mi, m := range c.Messages {
		if wk := c.read(t, m.KeyFile); !bytes.Equal(got[mi].Key, wk) {
			t.Errorf("message %d key:\n got %q\nwant %q", mi, got[mi].Key, wk)
		}
		if wv := c.read(t, m.ValueFile); !bytes.Equal(got[mi].Value, wv) {
			t.Errorf("message %d value:\n got %.300q\nwant %.300q", mi, got[mi].Value, wv)
		}
		if got[mi].Events != len(m.Events) {
			t.Errorf("message %d: %d events, want %d", mi, got[mi].Events, len(m.Events))
		}
	}
}

func (c *corpusCase) encoderConfig(t testing.TB) EncoderConfig {
	cfg := DefaultEncoderConfig()
	cfg.Flavour = c.flavour()
	cfg.Compression = Compression(c.Encoder.Compression)
	if n, err := c.Encoder.MaxBatchSize.Int64(); err == nil {
		cfg.MaxBatchSize = int(n)
	}
	if n, err := c.Encoder.MaxMessageBytes.Int64(); err == nil {
		cfg.MaxMessageBytes = int(n)
	}
	return cfg
}

// compareDecoded checks that records decode to the same events as the case's records.
func (c *corpusCase) compareDecoded(t *testing.T, got []Message, d *Decoder) {
	t.Helper()
	want := c.decodeAll(t, d)
	for i := range want {
		want[i].Malformed = nil
	}
	var have []Event
	for _, m := range got {
		evs, err := d.Decode(m.Key, m.Value)
		if err != nil {
			t.Fatal(err)
		}
		have = append(have, evs...)
	}
	if !reflect.DeepEqual(have, want) {
		t.Errorf("re-encoded records decode to\n%+v\nwant\n%+v", have, want)
	}
}

// TestCorpusEncodeFromSource encodes the events TiCDC's encoder was given (expected.json
// columns, including those TiCDC left off the wire) with the case's configuration,
// including large-message handling, and compares with TiCDC's records and claim-check
// objects. Cases that use encoder options the Encoder leaves to its caller
// (output-old-value=false, only-output-updated-columns, delete-only-handle-key) are
// covered by TestCorpusReencode instead.
func TestCorpusEncodeFromSource(t *testing.T) {
	n := 0
	for _, c := range loadCorpus(t) {
		e := c.Encoder
		if !e.OutputOldValue || e.OnlyUpdatedColumns || e.DeleteOnlyHandleKey {
			continue
		}
		n++
		t.Run(c.Name, func(t *testing.T) {
			cfg := c.encoderConfig(t)
			written := map[string][]byte{}
			var names []string
			for _, f := range c.ClaimCheckFiles {
				names = append(names, ClaimCheckFileName(f.Location))
			}
			if h := LargeMessageHandle(e.LargeMessageHandle); h != "" {
				cfg.LargeMessageHandle = h
			}
			if cfg.LargeMessageHandle == LargeMessageClaimCheck {
				cfg.ClaimCheckStorageURI = e.ClaimCheckStorageURI
				cfg.ClaimCheckWrite = func(name string, data []byte) error {
					written[name] = data
					return nil
				}
				cfg.ClaimCheckName = func() string {
					if len(names) == 0 {
						t.Fatal("encoder wrote more claim-check objects than the case has")
					}
					name := names[0]
					names = names[1:]
					return name
				}
			}
			enc, err := NewEncoder(cfg)
			if err != nil {
				t.Fatal(err)
			}
			var evs []Event
			for _, m := range c.Messages {
				for _, w := range m.Events {
					evs = append(evs, c.sourceEvent(t, &w))
				}
			}
			c.compareRecords(t, encodeAll(t, enc, evs))
			if len(written) != len(c.ClaimCheckFiles) {
				t.Errorf("wrote %d claim-check objects, want %d", len(written), len(c.ClaimCheckFiles))
			}
			for _, f := range c.ClaimCheckFiles {
				if w := c.read(t, f.File); !bytes.Equal(written[ClaimCheckFileName(f.Location)], w) {
					t.Errorf("claim-check object %s:\n got %.200q\nwant %.200q", f.File, written[ClaimCheckFileName(f.Location)], w)
				}
			}
		})
	}
	t.Logf("%d cases encoded from source", n)
}

// sourceEvent builds the event TiCDC's encoder was given.
func (c *corpusCase) sourceEvent(t testing.TB, w *expectedEvent) Event {
	t.Helper()
	ts := w.CommitTs
	if w.Kind == "resolved" {
		ts = w.ResolvedTs
	}
	commitTs, err := strconv.ParseUint(ts.String(), 10, 64)
	if err != nil {
		t.Fatalf("ts %q: %v", ts, err)
	}
	ev := Event{CommitTs: commitTs, Schema: w.Schema, Table: w.Table}
	switch w.Kind {
	case "resolved":
		ev.Kind = KindResolved
	case "ddl":
		ev.Kind, ev.Query, ev.DDLType = KindDDL, w.Query, w.DDLType
	case "row":
		ev.Kind, ev.RowID = KindRow, w.RowID
		if w.IsPartitionTable {
			ev.Partition = w.PhysicalTableID
		}
		cols := func(in []expectedCol) []Column {
			if in == nil {
				return nil
			}
			out := []Column{}
			for _, x := range in {
				if c.newArch() && strings.HasPrefix(x.Generated, "VIRTUAL") {
					continue // the new-architecture encoder skips virtual columns
				}
				v, err := expectedValue(x)
				if err != nil {
					t.Fatalf("column %s: %v", x.Name, err)
				}
				out = append(out, Column{Name: x.Name, Type: byte(x.MySQLType), Flags: Flag(x.Flags), Value: v})
			}
			return out
		}
		switch w.RowKind {
		case "insert":
			ev.Op, ev.Columns = OpInsert, cols(w.Columns)
		case "update":
			ev.Op, ev.Columns, ev.OldColumns = OpUpdate, cols(w.Columns), cols(w.PreColumns)
		case "delete":
			ev.Op, ev.Columns = OpDelete, cols(w.PreColumns)
		default:
			t.Fatalf("row kind %q", w.RowKind)
		}
	}
	return ev
}
