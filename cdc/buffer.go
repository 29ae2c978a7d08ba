package cdc

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"iter"
	"math"
	"os"
	"path/filepath"
	"sort"

	"github.com/tidb-parity/parity/cdc/open"
)

// tableKey names an upstream table.
type tableKey struct {
	Schema string
	Table  string
}

func (t tableKey) String() string { return t.Schema + "." + t.Table }

// bufEvent is a buffered row event. seq is the global arrival order.
type bufEvent struct {
	ev   *open.Event
	ts   uint64
	seq  uint64
	size int64
}

// lessEv orders a table's rows for applying: by commit ts; within one commit ts (one
// transaction) deletes first, as TiCDC orders a transaction's rows, then in arrival order
// (within a partition, Kafka offset order). Arrival alone is not enough: with the
// index-value dispatcher the DELETE of an old key and the INSERT of the new one that
// TiCDC splits a key-changing UPDATE into travel in different partitions, and when the
// two keys are equal under the downstream's collation ('Ase' → 'Asé') an INSERT applied
// first replaces the row that the DELETE then removes. A transaction holds at most one
// event per row, so moving its deletes first reorders nothing else that matters.
func lessEv(a, b *bufEvent) bool {
	if a.ts != b.ts {
		return a.ts < b.ts
	}
	if da, db := isDelete(a), isDelete(b); da != db {
		return da
	}
	return a.seq < b.seq
}

func isDelete(e *bufEvent) bool { return e.ev != nil && e.ev.Op == open.OpDelete }

// buffer holds row events per table until the global resolved ts passes them. Memory is
// bounded by limit: beyond it the largest tables' in-memory rows are sorted and written
// to a spill run on disk. Runs are immutable, sorted files with a ts index, so the rows
// of a round are a prefix of every run and are read with one sequential pass; a round
// consumes that prefix only when release is called after it committed, so a failed
// round can be read again.
type buffer struct {
	dir      string
	limit    int64
	memBytes int64
	memCount int64
	spilled  int64 // events in spill runs not yet released
	files    int
	tables   map[tableKey]*tableBuf
}

type tableBuf struct {
	key      tableKey
	mem      []bufEvent
	sorted   bool
	memBytes int64
	runs     []*spillRun
}

// spillRun is one sorted spill file. marks[i] is the first event with marks[i].ts;
// events before marks[cursor] were released.
type spillRun struct {
	path   string
	marks  []runMark
	end    int64 // file size
	count  int64 // events in the file
	cursor int
}

type runMark struct {
	ts  uint64
	pos int64
	n   int64 // events before pos
}

func newBuffer(dir string, limit int64) (*buffer, error) {
	if err := clearDir(dir); err != nil {
		return nil, fmt.Errorf("clearing spill dir: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating spill dir: %w", err)
	}
	return &buffer{dir: dir, limit: limit, tables: map[tableKey]*tableBuf{}}, nil
}

// clearDir removes what dir holds, not dir itself: the spill directory may be a mount
// point (a volume of its own), which cannot be removed.
func clearDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// close removes the spill files, and the directory unless it is a mount point.
func (b *buffer) close() error {
	err := clearDir(b.dir)
	_ = os.Remove(b.dir)
	return err
}

func (b *buffer) add(ev *open.Event, seq uint64) error {
	k := tableKey{ev.Schema, ev.Table}
	tb := b.tables[k]
	if tb == nil {
		tb = &tableBuf{key: k, sorted: true}
		b.tables[k] = tb
	}
	be := bufEvent{ev: ev, ts: ev.CommitTs, seq: seq, size: estimateSize(ev)}
	if n := len(tb.mem); n > 0 && tb.sorted && lessEv(&be, &tb.mem[n-1]) {
		tb.sorted = false
	}
	tb.mem = append(tb.mem, be)
	tb.memBytes += be.size
	b.memBytes += be.size
	b.memCount++
	for b.memBytes > b.limit {
		var big *tableBuf
		for _, t := range b.tables {
			if big == nil || t.memBytes > big.memBytes {
				big = t
			}
		}
		if big == nil || len(big.mem) == 0 {
			break
		}
		if err := b.spill(big); err != nil {
			return err
		}
	}
	return nil
}

func (tb *tableBuf) sortMem() {
	if !tb.sorted {
		sort.SliceStable(tb.mem, func(i, j int) bool { return lessEv(&tb.mem[i], &tb.mem[j]) })
		tb.sorted = true
	}
}

// memUpTo sorts the in-memory rows and returns how many of them have ts <= target.
func (tb *tableBuf) memUpTo(target uint64) int {
	tb.sortMem()
	return sort.Search(len(tb.mem), func(i int) bool { return tb.mem[i].ts > target })
}

// spill writes the table's in-memory rows to a new sorted run.
func (b *buffer) spill(tb *tableBuf) error {
	tb.sortMem()
	b.files++
	path := filepath.Join(b.dir, fmt.Sprintf("run-%06d", b.files))
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("spilling %s: %w", tb.key, err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	run := &spillRun{path: path}
	var pos int64 // bytes written: a bufio.Writer writes all of p or fails
	var scratch []byte
	for i := range tb.mem {
		e := &tb.mem[i]
		if len(run.marks) == 0 || run.marks[len(run.marks)-1].ts != e.ts {
			run.marks = append(run.marks, runMark{ts: e.ts, pos: pos, n: int64(i)})
		}
		scratch = encodeEvent(scratch[:0], e)
		if _, err := w.Write(scratch); err != nil {
			f.Close()
			return fmt.Errorf("spilling %s: %w", tb.key, err)
		}
		pos += int64(len(scratch))
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("spilling %s: %w", tb.key, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("spilling %s: %w", tb.key, err)
	}
	run.end = pos
	run.count = int64(len(tb.mem))
	tb.runs = append(tb.runs, run)
	b.spilled += run.count
	b.memBytes -= tb.memBytes
	b.memCount -= int64(len(tb.mem))
	tb.mem = nil
	tb.memBytes = 0
	tb.sorted = true
	return nil
}

// minTs returns the smallest buffered commit ts of the table, or MaxUint64.
func (tb *tableBuf) minTs() uint64 {
	m := uint64(math.MaxUint64)
	if len(tb.mem) > 0 {
		tb.sortMem()
		m = tb.mem[0].ts
	}
	for _, r := range tb.runs {
		if r.cursor < len(r.marks) && r.marks[r.cursor].ts < m {
			m = r.marks[r.cursor].ts
		}
	}
	return m
}

// tablesUpTo lists the tables holding rows with ts <= target, in a stable order.
func (b *buffer) tablesUpTo(target uint64) []*tableBuf {
	var out []*tableBuf
	for _, tb := range b.tables {
		if tb.minTs() <= target {
			out = append(out, tb)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].key.Schema != out[j].key.Schema {
			return out[i].key.Schema < out[j].key.Schema
		}
		return out[i].key.Table < out[j].key.Table
	})
	return out
}

// release drops every row with ts <= target (after they were applied).
func (b *buffer) release(target uint64) {
	for k, tb := range b.tables {
		n := tb.memUpTo(target)
		if n > 0 {
			var freed int64
			for i := 0; i < n; i++ {
				freed += tb.mem[i].size
			}
			// The rows left move to the front, so the next round's rows fill the same
			// array: slicing the applied ones off made every round grow a new array
			// (growslice in buffer.add was 5 % of serve's CPU under the insert bench).
			// The array is given back only when it is over twice what this round held.
			peak := len(tb.mem)
			m := copy(tb.mem, tb.mem[n:])
			clear(tb.mem[m:]) // drop the references so the events can be collected
			tb.mem = tb.mem[:m]
			if cap(tb.mem) > 2*peak+1024 {
				tb.mem = append([]bufEvent(nil), tb.mem...)
			}
			tb.memBytes -= freed
			b.memBytes -= freed
			b.memCount -= int64(n)
		}
		runs := tb.runs[:0]
		for _, r := range tb.runs {
			before := r.released()
			for r.cursor < len(r.marks) && r.marks[r.cursor].ts <= target {
				r.cursor++
			}
			b.spilled -= r.released() - before
			if r.cursor == len(r.marks) {
				_ = os.Remove(r.path)
				continue
			}
			runs = append(runs, r)
		}
		tb.runs = runs
		if len(tb.mem) == 0 && len(tb.runs) == 0 {
			delete(b.tables, k)
		}
	}
}

func (r *spillRun) released() int64 {
	if r.cursor >= len(r.marks) {
		return r.count
	}
	return r.marks[r.cursor].n
}

// upTo returns the file position and the number of events (from the file's start)
// after the last event with ts <= target.
func (r *spillRun) upTo(target uint64) (pos, n int64) {
	i := sort.Search(len(r.marks), func(i int) bool { return r.marks[i].ts > target })
	if i == len(r.marks) {
		return r.end, r.count
	}
	return r.marks[i].pos, r.marks[i].n
}

// tableIter yields a table's rows with ts <= target in (ts, arrival) order, merging the
// in-memory rows with every spill run.
type tableIter struct {
	key     tableKey
	mem     []bufEvent
	runs    []*runReader
	headMem int
}

type runReader struct {
	f     *os.File
	r     *bufio.Reader
	head  bufEvent
	ok    bool
	names map[string]string
}

func (tb *tableBuf) iter(target uint64) (*tableIter, error) {
	it := &tableIter{key: tb.key, mem: tb.mem[:tb.memUpTo(target)]}
	for _, r := range tb.runs {
		if r.cursor >= len(r.marks) || r.marks[r.cursor].ts > target {
			continue
		}
		start := r.marks[r.cursor].pos
		end, _ := r.upTo(target)
		f, err := os.Open(r.path)
		if err != nil {
			it.close()
			return nil, fmt.Errorf("reading spill run of %s: %w", tb.key, err)
		}
		if _, err := f.Seek(start, io.SeekStart); err != nil {
			f.Close()
			it.close()
			return nil, fmt.Errorf("reading spill run of %s: %w", tb.key, err)
		}
		rr := &runReader{f: f, r: bufio.NewReaderSize(io.LimitReader(f, end-start), 1<<20), names: map[string]string{}}
		if err := rr.next(tb.key); err != nil {
			f.Close()
			it.close()
			return nil, err
		}
		it.runs = append(it.runs, rr)
	}
	return it, nil
}

func (rr *runReader) next(k tableKey) error {
	ev, ts, seq, err := decodeEvent(rr.r, rr.names)
	if errors.Is(err, io.EOF) {
		rr.ok = false
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading spill run of %s: %w", k, err)
	}
	ev.Schema, ev.Table = k.Schema, k.Table
	rr.head = bufEvent{ev: ev, ts: ts, seq: seq}
	rr.ok = true
	return nil
}

// next returns the next event, or nil at the end.
func (it *tableIter) next() (*open.Event, error) {
	var best *bufEvent
	bestRun := -1
	if it.headMem < len(it.mem) {
		best = &it.mem[it.headMem]
	}
	for i, rr := range it.runs {
		if rr.ok && (best == nil || lessEv(&rr.head, best)) {
			best, bestRun = &rr.head, i
		}
	}
	if best == nil {
		return nil, nil
	}
	ev := best.ev
	if bestRun < 0 {
		it.headMem++
		return ev, nil
	}
	if err := it.runs[bestRun].next(it.key); err != nil {
		return nil, err
	}
	return ev, nil
}

// events yields the table's rows with ts <= target in (ts, arrival) order; an error
// opening or reading a spill run is yielded (with a nil event) and ends the sequence.
// The spill files are closed when the sequence ends or the loop over it stops.
func (tb *tableBuf) events(target uint64) iter.Seq2[*open.Event, error] {
	return func(yield func(*open.Event, error) bool) {
		it, err := tb.iter(target)
		if err != nil {
			yield(nil, err)
			return
		}
		defer it.close()
		for {
			ev, err := it.next()
			if err != nil {
				yield(nil, err)
				return
			}
			if ev == nil || !yield(ev, nil) {
				return
			}
		}
	}
}

func (it *tableIter) close() {
	for _, rr := range it.runs {
		rr.f.Close()
	}
	it.runs = nil
}

// Spill encoding of one event: uvarint length, then ts, seq, partition id, op, columns,
// old columns (count+1, 0 meaning nil). Column: name, type, flags, value tag + value.
const (
	tagNil byte = iota
	tagInt
	tagUint
	tagFloat
	tagString
	tagBytes
)

func encodeEvent(dst []byte, e *bufEvent) []byte {
	// The body goes straight into dst behind room for its length prefix, which is then
	// written right before it and the unused room closed: no buffer per event.
	start := len(dst)
	dst = append(dst, make([]byte, binary.MaxVarintLen64)...)
	at := len(dst)
	dst = binary.AppendUvarint(dst, e.ts)
	dst = binary.AppendUvarint(dst, e.seq)
	dst = binary.AppendVarint(dst, e.ev.Partition)
	dst = append(dst, byte(e.ev.Op))
	dst = appendCols(dst, e.ev.Columns)
	if e.ev.OldColumns == nil {
		dst = binary.AppendUvarint(dst, 0)
	} else {
		dst = binary.AppendUvarint(dst, uint64(len(e.ev.OldColumns))+1)
		dst = appendColList(dst, e.ev.OldColumns)
	}
	var hdr [binary.MaxVarintLen64]byte
	k := binary.PutUvarint(hdr[:], uint64(len(dst)-at))
	copy(dst[at-k:at], hdr[:k])
	if gap := binary.MaxVarintLen64 - k; gap > 0 {
		n := copy(dst[start:], dst[start+gap:])
		dst = dst[:start+n]
	}
	return dst
}

func appendCols(b []byte, cols []open.Column) []byte {
	b = binary.AppendUvarint(b, uint64(len(cols)))
	return appendColList(b, cols)
}

func appendColList(b []byte, cols []open.Column) []byte {
	for _, c := range cols {
		b = binary.AppendUvarint(b, uint64(len(c.Name)))
		b = append(b, c.Name...)
		b = append(b, c.Type)
		b = binary.AppendUvarint(b, uint64(c.Flags))
		switch v := c.Value.(type) {
		case nil:
			b = append(b, tagNil)
		case int64:
			b = append(b, tagInt)
			b = binary.AppendVarint(b, v)
		case uint64:
			b = append(b, tagUint)
			b = binary.AppendUvarint(b, v)
		case float64:
			b = append(b, tagFloat)
			b = binary.BigEndian.AppendUint64(b, math.Float64bits(v))
		case string:
			b = append(b, tagString)
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
		case []byte:
			b = append(b, tagBytes)
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
		default:
			// The codec documents exactly the types above; anything else is a bug there.
			s := fmt.Sprint(v)
			b = append(b, tagString)
			b = binary.AppendUvarint(b, uint64(len(s)))
			b = append(b, s...)
		}
	}
	return b
}

var errSpillCorrupt = errors.New("corrupt spill record")

// maxSpillRecord bounds one spilled event (a row of TiDB is at most 120 MiB by default).
const maxSpillRecord = 1 << 30

func decodeEvent(r *bufio.Reader, names map[string]string) (*open.Event, uint64, uint64, error) {
	n, err := binary.ReadUvarint(r)
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, 0, 0, io.EOF
		}
		return nil, 0, 0, err
	}
	if n > maxSpillRecord {
		return nil, 0, 0, errSpillCorrupt
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, 0, 0, err
	}
	d := decoder{b: body, names: names}
	ts := d.uvarint()
	seq := d.uvarint()
	ev := &open.Event{Kind: open.KindRow, CommitTs: ts}
	ev.Partition = d.varint()
	ev.Op = open.Op(d.byte())
	ev.Columns = d.cols(int(d.uvarint()))
	if k := d.uvarint(); k > 0 {
		ev.OldColumns = d.cols(int(k - 1))
	}
	if d.err != nil {
		return nil, 0, 0, d.err
	}
	return ev, ts, seq, nil
}

type decoder struct {
	b     []byte
	err   error
	names map[string]string
}

func (d *decoder) fail() {
	if d.err == nil {
		d.err = errSpillCorrupt
	}
	d.b = nil
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) byte() byte {
	if len(d.b) < 1 {
		d.fail()
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if uint64(len(d.b)) < n {
		d.fail()
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) cols(n int) []open.Column {
	if n < 0 || n > len(d.b) {
		d.fail()
		return nil
	}
	cols := make([]open.Column, n)
	for i := range cols {
		nb := d.bytes()
		name, ok := d.names[string(nb)]
		if !ok {
			name = string(nb)
			d.names[name] = name
		}
		c := open.Column{Name: name, Type: d.byte(), Flags: open.Flag(d.uvarint())}
		switch d.byte() {
		case tagNil:
		case tagInt:
			c.Value = d.varint()
		case tagUint:
			c.Value = d.uvarint()
		case tagFloat:
			if len(d.b) < 8 {
				d.fail()
				break
			}
			c.Value = math.Float64frombits(binary.BigEndian.Uint64(d.b))
			d.b = d.b[8:]
		case tagString:
			c.Value = string(d.bytes())
		case tagBytes:
			c.Value = append([]byte{}, d.bytes()...)
		default:
			d.fail()
		}
		cols[i] = c
	}
	return cols
}

// countUpTo returns the number of buffered rows with ts <= target (spill runs counted
// at their ts marks, so exactly).
func (tb *tableBuf) countUpTo(target uint64) int64 {
	n := int64(tb.memUpTo(target))
	for _, r := range tb.runs {
		if r.cursor >= len(r.marks) || r.marks[r.cursor].ts > target {
			continue
		}
		_, end := r.upTo(target)
		n += end - r.released()
	}
	return n
}
