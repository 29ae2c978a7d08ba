package simple

import (
	"bytes"
	"cmp"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidb-parity/parity/cdc/internal/slots"

	"github.com/tidb-parity/parity/cdc/open"
)

// MessageVersion is the only simple-protocol message version TiCDC writes.
const MessageVersion = 1

// DecoderConfig configures a Decoder.
type DecoderConfig struct {
	// TimeZone renders TIMESTAMP values: TiCDC sends each as {location, value} text in
	// its own time zone; with TimeZone set, the event carries the text in TimeZone (as the
	// applier's session time zone reads it). Default: nil, the text as TiCDC sent it,
	// which is what the open protocol carries.
	TimeZone *time.Location
}

// DefaultDecoderConfig returns the defaults documented on DecoderConfig.
func DefaultDecoderConfig() DecoderConfig { return DecoderConfig{} }

// Validate reports every problem with the configuration (there is none to have yet; it
// is here so the plumbing validates every protocol's configuration alike).
func (c DecoderConfig) Validate() error { return nil }

// Stats counts row images (an UPDATE carries two: the new row and the old one).
type Stats struct {
	// RowsVerified: images whose values hash to TiCDC's checksum.
	RowsVerified uint64
	// RowsWithoutChecksum: images TiCDC sent no checksum for (0, or no checksum field):
	// checksums off, an all-NULL row, a half of an UPDATE TiCDC split, or a
	// handle-key-only row. Counted, not failed.
	RowsWithoutChecksum uint64
	// Mismatches: images whose values do not hash to TiCDC's checksum, or that TiCDC
	// flagged corrupted. Each is also a *ChecksumError from Decode.
	Mismatches uint64
}

// Decoder decodes Kafka record values written by TiCDC's simple-protocol encoder
// (encoding-format = json) into open.Events, keeping the schema cache the rows need and
// verifying every row checksum. It is safe for concurrent use: one Decoder may serve
// every partition of a changefeed (DDL and BOOTSTRAP messages are broadcast to all
// partitions, and cache entries are keyed by schema version, so which partition's copy
// fills an entry makes no difference).
type Decoder struct {
	cfg DecoderConfig

	mu     sync.RWMutex
	tables map[tableKey]*cached
	// learned lists, in order, the keys whose entry a record added or changed (not
	// ImportSchemas): SchemasSince's marks are positions in it.
	learned []tableKey

	states *slots.Slots[state] // scratch of finished calls, for the next ones

	verified, without, mismatches atomic.Uint64
}

type tableKey struct {
	schema, table string
	version       uint64
}

// cached is a schema entry: the table, or why its schema cannot describe rows (that is
// an error for the table's rows, not for the DDL that carried it).
type cached struct {
	wire *wireTableSchema
	raw  []byte // wire as JSON (ExportSchemas, SchemasSince)
	t    *table
	err  error
}

// NewDecoder returns a Decoder with an empty schema cache.
func NewDecoder(cfg DecoderConfig) (*Decoder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("simple decoder config: %w", err)
	}
	return &Decoder{cfg: cfg, tables: map[tableKey]*cached{}, states: slots.New[state](max(2, runtime.GOMAXPROCS(0)))}, nil
}

// Stats returns the checksum counters so far.
func (d *Decoder) Stats() Stats {
	return Stats{RowsVerified: d.verified.Load(), RowsWithoutChecksum: d.without.Load(), Mismatches: d.mismatches.Load()}
}

// wireMessage is one simple-protocol JSON message (tiflow pkg/sink/codec/simple/message.go).
type wireMessage struct {
	Version            *int             `json:"version"`
	Schema             string           `json:"database"`
	Table              string           `json:"table"`
	TableID            int64            `json:"tableID"`
	Type               string           `json:"type"`
	CommitTs           *uint64          `json:"commitTs"`
	BuildTs            int64            `json:"buildTs"`
	SchemaVersion      *uint64          `json:"schemaVersion"`
	ClaimCheckLocation string           `json:"claimCheckLocation"`
	HandleKeyOnly      bool             `json:"handleKeyOnly"`
	SQL                string           `json:"sql"`
	TableSchema        *wireTableSchema `json:"tableSchema"`
	PreTableSchema     *wireTableSchema `json:"preTableSchema"`
	Checksum           *wireChecksum    `json:"checksum"`
	Data               map[string]any   `json:"data"`
	Old                map[string]any   `json:"old"`
}

type wireChecksum struct {
	Version   int    `json:"version"`
	Corrupted bool   `json:"corrupted"`
	Current   uint32 `json:"current"`
	Previous  uint32 `json:"previous"`
}

// ddlTypes are simple's DDL message types (tiflow simple.DDLType*).
var ddlTypes = map[string]bool{
	"CREATE": true, "RENAME": true, "CINDEX": true, "DINDEX": true, "ERASE": true,
	"TRUNCATE": true, "ALTER": true, "QUERY": true,
}

var rowOps = map[string]open.Op{"INSERT": open.OpInsert, "UPDATE": open.OpUpdate, "DELETE": open.OpDelete}

// Decode decodes one Kafka record. The key is not read (TiCDC's simple encoder writes
// none that matters). It returns the record's events — one for a row, DDL or watermark,
// none for a BOOTSTRAP — or an error: a *DecodeError for a record that cannot be
// decoded (ErrNoSchema for a row whose table schema is not cached yet), a
// *ChecksumError for a row that fails verification. A DDL or BOOTSTRAP record updates
// the schema cache before Decode returns.
func (d *Decoder) Decode(key, value []byte) ([]open.Event, error) {
	_ = key
	st := d.state()
	evs, ok := st.decode(d, value)
	d.release(st)
	if ok {
		return evs, nil
	}
	return d.decodeSlow(value)
}

// watermark is the event of a WATERMARK record, on either path.
func watermark(commitTs uint64) []open.Event {
	return []open.Event{{Kind: open.KindResolved, CommitTs: commitTs}}
}

// decodeSlow is the decoder built on encoding/json: Decode's fallback for every record
// the fast path (fast.go) does not decode — DDL and BOOTSTRAP records, any error or
// checksum mismatch, shapes TiCDC does not write — so the rules, the errors and the
// counters are its.
func (d *Decoder) decodeSlow(value []byte) ([]open.Event, error) {
	m, err := parse(value)
	if err != nil {
		return nil, err
	}
	switch {
	case m.Type == "WATERMARK":
		if m.CommitTs == nil {
			return nil, &DecodeError{Field: "commitTs", Err: fmt.Errorf("%w: a WATERMARK without commitTs", ErrMissingField)}
		}
		return watermark(*m.CommitTs), nil
	case m.Type == "BOOTSTRAP":
		if m.TableSchema == nil {
			return nil, &DecodeError{Field: "tableSchema", Err: fmt.Errorf("%w: a BOOTSTRAP without tableSchema", ErrMissingField)}
		}
		d.learn(m.TableSchema, true)
		return []open.Event{}, nil
	case ddlTypes[m.Type]:
		return d.ddl(m)
	}
	if op, ok := rowOps[m.Type]; ok {
		ev, err := d.row(m, op)
		if err != nil {
			return nil, err
		}
		return []open.Event{ev}, nil
	}
	return nil, &DecodeError{Field: "type", Err: fmt.Errorf("%w %q", ErrType, m.Type)}
}

// LearnSchema takes the table schemas of a DDL or BOOTSTRAP record into the cache and
// reports whether the record was one; other records are not decoded (nor verified, nor
// counted). A consumer resuming mid-stream uses it to fill the cache from records
// before its start offset.
func (d *Decoder) LearnSchema(value []byte) (bool, error) {
	m, err := parse(value)
	if err != nil {
		return false, err
	}
	if m.Type != "BOOTSTRAP" && !ddlTypes[m.Type] {
		return false, nil
	}
	_, err = d.Decode(nil, value)
	return err == nil, err
}

func parse(value []byte) (*wireMessage, error) {
	i := 0
	for i < len(value) && (value[i] == ' ' || value[i] == '\t' || value[i] == '\n' || value[i] == '\r') {
		i++
	}
	if i == len(value) || value[i] != '{' {
		first := "nothing"
		if i < len(value) {
			first = fmt.Sprintf("byte 0x%02x", value[i])
		}
		return nil, &DecodeError{Err: fmt.Errorf("%w: the value is not a JSON object (it starts with %s); simple records with encoding-format avro or large-message-handle-compression are %w",
			ErrSyntax, first, ErrUnsupported)}
	}
	var m wireMessage
	if err := json.Unmarshal(value, &m); err != nil {
		field := ""
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			field = te.Field
		}
		return nil, &DecodeError{Field: field, Err: fmt.Errorf("%w: %v", ErrSyntax, err)}
	}
	if m.Version == nil {
		return nil, &DecodeError{Field: "version", Err: fmt.Errorf("%w: no message version", ErrMissingField)}
	}
	if *m.Version != MessageVersion {
		return nil, &DecodeError{Field: "version", Err: fmt.Errorf("%w %d (want %d)", ErrVersion, *m.Version, MessageVersion)}
	}
	if m.Type == "" {
		return nil, &DecodeError{Field: "type", Err: fmt.Errorf("%w: no message type", ErrMissingField)}
	}
	return &m, nil
}

// learn caches a table schema; a schema that cannot describe rows is cached as the
// error its rows will get. record says the schema came from a record (not
// ImportSchemas): a new or changed entry is then listed for SchemasSince.
func (d *Decoder) learn(w *wireTableSchema, record bool) {
	t, err := newTable(w)
	raw, _ := json.Marshal(w) // cannot fail: w was decoded from JSON
	k := tableKey{w.Schema, w.Table, w.Version}
	d.mu.Lock()
	defer d.mu.Unlock()
	old := d.tables[k]
	d.tables[k] = &cached{wire: w, raw: raw, t: t, err: err}
	if record && (old == nil || !bytes.Equal(old.raw, raw)) {
		d.learned = append(d.learned, k)
	}
}

// ExportSchemas returns every cached table schema (TiCDC's tableSchema JSON, as a JSON
// array) for the consumer to keep beside its offsets; ImportSchemas on a new Decoder
// restores them, so a consumer resuming mid-stream decodes rows whose BOOTSTRAP lies
// before its start offset.
func (d *Decoder) ExportSchemas() ([]byte, error) {
	d.mu.RLock()
	ws := make([]*wireTableSchema, 0, len(d.tables))
	for _, c := range d.tables {
		ws = append(ws, c.wire)
	}
	d.mu.RUnlock()
	slices.SortFunc(ws, func(a, b *wireTableSchema) int {
		return cmp.Or(cmp.Compare(a.Schema, b.Schema), cmp.Compare(a.Table, b.Table), cmp.Compare(a.Version, b.Version))
	})
	return json.Marshal(ws)
}

// ImportSchemas adds the schemas ExportSchemas returned (or a JSON array of
// SchemaEntry.TableSchema) to the cache. They are not reported by SchemasSince: they
// are kept wherever they came from.
func (d *Decoder) ImportSchemas(data []byte) error {
	var ws []*wireTableSchema
	if err := json.Unmarshal(data, &ws); err != nil {
		return fmt.Errorf("import simple-protocol schemas: %w", err)
	}
	for i, w := range ws {
		if w == nil {
			return fmt.Errorf("import simple-protocol schemas: entry %d is null", i)
		}
		d.learn(w, false)
	}
	return nil
}

// SchemaEntry is one table schema of the cache, keyed as rows name it.
type SchemaEntry struct {
	Schema, Table string
	Version       uint64
	// TableSchema is TiCDC's tableSchema JSON; a JSON array of them is what
	// ImportSchemas takes.
	TableSchema []byte
}

// SchemasSince returns the table schemas that records added to the cache (or changed)
// after mark — each once, as the cache holds it now — and the mark to pass next time.
// Mark 0 is a new Decoder's cache. A consumer that keeps the cache beside its offsets
// saves what SchemasSince returns with the offsets and moves its mark only when they
// are saved: a record decoded before the call has its schemas in the result or before
// mark.
func (d *Decoder) SchemasSince(mark int) ([]SchemaEntry, int) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	mark = min(max(mark, 0), len(d.learned))
	var out []SchemaEntry
	seen := map[tableKey]bool{}
	for _, k := range d.learned[mark:] {
		if seen[k] {
			continue
		}
		seen[k] = true
		out = append(out, SchemaEntry{Schema: k.schema, Table: k.table, Version: k.version, TableSchema: d.tables[k].raw})
	}
	return out, len(d.learned)
}

func (d *Decoder) ddl(m *wireMessage) ([]open.Event, error) {
	if m.CommitTs == nil {
		return nil, &DecodeError{Field: "commitTs", Err: fmt.Errorf("%w: a %s DDL without commitTs", ErrMissingField, m.Type)}
	}
	if strings.TrimSpace(m.SQL) == "" {
		return nil, &DecodeError{Field: "sql", Err: fmt.Errorf("%w: a %s DDL without sql", ErrMissingField, m.Type)}
	}
	ev := open.Event{Kind: open.KindDDL, CommitTs: *m.CommitTs, Query: m.SQL}
	if m.PreTableSchema != nil {
		d.learn(m.PreTableSchema, true)
		ev.Schema, ev.Table = m.PreTableSchema.Schema, m.PreTableSchema.Table
	}
	if m.TableSchema != nil {
		d.learn(m.TableSchema, true)
		ev.Schema, ev.Table = m.TableSchema.Schema, m.TableSchema.Table
	}
	return []open.Event{ev}, nil
}

func (d *Decoder) lookup(schema, tbl string, version uint64) (*table, error) {
	d.mu.RLock()
	c := d.tables[tableKey{schema, tbl, version}]
	d.mu.RUnlock()
	if c == nil {
		return nil, fmt.Errorf("%w: no DDL or BOOTSTRAP message gave table %s.%s at schema version %d (a row before its table's BOOTSTRAP: read the partition from an earlier offset, or feed the earlier DDL and BOOTSTRAP records to LearnSchema)",
			ErrNoSchema, schema, tbl, version)
	}
	if c.err != nil {
		return nil, fmt.Errorf("table schema at version %d: %w", version, c.err)
	}
	return c.t, nil
}

func (d *Decoder) row(m *wireMessage, op open.Op) (open.Event, error) {
	name := m.Schema + "." + m.Table
	fail := func(field string, err error) (open.Event, error) {
		return open.Event{}, &DecodeError{Table: name, Field: field, Err: err}
	}
	if m.Schema == "" || m.Table == "" {
		return fail("table", fmt.Errorf("%w: a row without database or table", ErrMissingField))
	}
	if m.CommitTs == nil {
		return fail("commitTs", fmt.Errorf("%w: a row without commitTs", ErrMissingField))
	}
	if m.SchemaVersion == nil {
		return fail("schemaVersion", fmt.Errorf("%w: a row without schemaVersion", ErrMissingField))
	}
	if m.ClaimCheckLocation != "" {
		return fail("claimCheckLocation", fmt.Errorf("%w: claim-check (large-message-handle-option = claim-check)", ErrUnsupported))
	}
	t, err := d.lookup(m.Schema, m.Table, *m.SchemaVersion)
	if err != nil {
		return fail("schemaVersion", err)
	}
	ev := open.Event{Kind: open.KindRow, CommitTs: *m.CommitTs, Schema: m.Schema, Table: m.Table, Op: op, OnlyHandleKey: m.HandleKeyOnly}
	var newHash, oldHash uint32
	switch op {
	case open.OpInsert, open.OpUpdate:
		if m.Data == nil {
			return fail("data", fmt.Errorf("%w: an %s without data", ErrMissingField, m.Type))
		}
		if ev.Columns, newHash, err = d.image(t, m.Data, m.HandleKeyOnly, "data"); err != nil {
			return fail("", err)
		}
		if op == open.OpUpdate {
			if m.Old == nil {
				return fail("old", fmt.Errorf("%w: an UPDATE without old", ErrMissingField))
			}
			if ev.OldColumns, oldHash, err = d.image(t, m.Old, m.HandleKeyOnly, "old"); err != nil {
				return fail("", err)
			}
		} else if m.Old != nil {
			return fail("old", fmt.Errorf("%w: an INSERT with old", ErrColumn))
		}
	case open.OpDelete:
		if m.Old == nil {
			return fail("old", fmt.Errorf("%w: a DELETE without old", ErrMissingField))
		}
		if m.Data != nil {
			return fail("data", fmt.Errorf("%w: a DELETE with data", ErrColumn))
		}
		if ev.Columns, oldHash, err = d.image(t, m.Old, m.HandleKeyOnly, "old"); err != nil {
			return fail("", err)
		}
	}
	// The checksum: current is the new row's, previous the old row's (TiCDC's
	// RowChangedEvent.Checksum). A half that does not apply must be 0.
	var cs wireChecksum
	if m.Checksum != nil {
		cs = *m.Checksum
		if cs.Version < 0 || cs.Version > 2 {
			return fail("checksum.version", fmt.Errorf("%w: row checksum version %d (known: 0, 1, 2)", ErrUnsupported, cs.Version))
		}
		if op == open.OpInsert && cs.Previous != 0 {
			return fail("checksum.previous", fmt.Errorf("%w: an INSERT has no old row, but checksum.previous is %d", ErrValue, cs.Previous))
		}
		if op == open.OpDelete && cs.Current != 0 {
			return fail("checksum.current", fmt.Errorf("%w: a DELETE has no new row, but checksum.current is %d", ErrValue, cs.Current))
		}
	}
	type image struct {
		which string
		want  uint32
		got   uint32
		cols  []open.Column
	}
	var images []image
	switch op {
	case open.OpInsert:
		images = []image{{"new", cs.Current, newHash, ev.Columns}}
	case open.OpUpdate:
		images = []image{{"new", cs.Current, newHash, ev.Columns}, {"old", cs.Previous, oldHash, ev.OldColumns}}
	case open.OpDelete:
		images = []image{{"old", cs.Previous, oldHash, ev.Columns}}
	}
	for _, im := range images {
		if cs.Corrupted || (im.want != 0 && im.want != im.got && !m.HandleKeyOnly) {
			d.mismatches.Add(1)
			return open.Event{}, &ChecksumError{Schema: m.Schema, Table: m.Table, Key: keyString(t, im.cols), Image: im.which,
				Op: op.String(), CommitTs: *m.CommitTs, Want: im.want, Got: im.got, Corrupted: cs.Corrupted}
		}
	}
	for _, im := range images {
		// A handle-key-only image carries too few columns to hash: it cannot be verified.
		if im.want == 0 || m.HandleKeyOnly {
			d.without.Add(1)
		} else {
			d.verified.Add(1)
		}
	}
	return ev, nil
}

// image decodes one row image (data or old) in table column order and returns its
// checksum (0 when every column is NULL: the CRC of nothing).
func (d *Decoder) image(t *table, vals map[string]any, handleOnly bool, field string) ([]open.Column, uint32, error) {
	for name := range vals {
		if _, ok := t.byName[name]; !ok {
			return nil, 0, &DecodeError{Table: t.qualified(), Field: field + "." + name,
				Err: fmt.Errorf("%w: column %q is not in the table schema at version %d", ErrColumn, name, t.version)}
		}
	}
	n := len(t.cols)
	if handleOnly {
		n = len(t.handle)
		if n == 0 {
			return nil, 0, &DecodeError{Table: t.qualified(), Field: "handleKeyOnly",
				Err: fmt.Errorf("%w: a handle-key-only row of a table without a handle key", ErrColumn)}
		}
	}
	cols := make([]open.Column, 0, n)
	var buf [64]byte
	var sum uint32
	for i := range t.cols {
		c := &t.cols[i]
		raw, ok := vals[c.name]
		if !ok {
			if handleOnly && c.flags&open.FlagHandleKey == 0 {
				continue
			}
			return nil, 0, &DecodeError{Table: t.qualified(), Field: field + "." + c.name,
				Err: fmt.Errorf("%w: column %s is missing", ErrColumn, c.name)}
		}
		p, err := d.decodeValue(c, raw)
		if err != nil {
			return nil, 0, &DecodeError{Table: t.qualified(), Field: field + "." + c.name, Err: err}
		}
		cols = append(cols, open.Column{Name: c.name, Type: c.typ, Flags: c.flags, Value: p.value})
		if p.value != nil {
			sum = crc32.Update(sum, crc32.IEEETable, appendChecksumBytes(buf[:0], c, p))
		}
	}
	return cols, sum, nil
}

// keyString renders a row's handle key (every column for a keyless table) for an error.
func keyString(t *table, cols []open.Column) string {
	var b strings.Builder
	for _, c := range cols {
		if len(t.handle) > 0 && !c.IsHandle() {
			continue
		}
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		b.WriteString(c.Name)
		b.WriteByte('=')
		switch v := c.Value.(type) {
		case nil:
			b.WriteString("NULL")
		case string:
			b.WriteString(strconv.Quote(v))
		case []byte:
			b.WriteString("0x" + hex.EncodeToString(v))
		default:
			fmt.Fprint(&b, v)
		}
	}
	return b.String()
}
