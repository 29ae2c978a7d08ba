// Package ledger is the contract of the dirty-key ledger, the meta-schema table in which
// the applier (cdc) records which keys of which tables it changed and when, and from
// which the checker builds key scopes ("keys changed since T") and classifies
// differences (a key the changefeed never touched since the import diverged outside
// replication). Writer and reader are different packages that must not import each
// other; this leaf package holds what they share: the table's name, its columns, the
// encoding of its entries, and the reader's side of the rules below (read.go: what a
// reader may trust, a table's keys changed in a window, when the applier caught up).
//
// The table (created by the "cdc" component of internal/metaschema):
//
//	dirty_keys (changefeed, max_ts, schema_name, table_name, part, min_ts, key_count, entries)
//	  PRIMARY KEY (changefeed, max_ts, schema_name, table_name, part)
//
// One row holds the keys one applier round changed in one upstream table (a round's
// keys beyond MaxPartKeys are split into parts): every key at most once, with the
// commit ts of its last change in the round, which lies in [min_ts, max_ts]. Keys are
// rowkey.Key values of the table's handle-key columns in column order (tables without
// a handle are not recorded: they are compared whole). schema_name and table_name are
// the upstream's names.
//
// Consistency: the applier writes a round's rows first, then its ledger rows in the
// transaction of its checkpoint (checkpoint.applied_ts). So a ledger row never names a change that was not
// applied, and every change above ledger_range.since_ts and at or below applied_ts is in
// the ledger: a reader trusts the rows with max_ts <= applied_ts (rows above it may be
// rewritten by a replayed round, identically), and only for changes after since_ts.
// Rows older than the applier's retention are deleted, and since_ts moves up with them.
package ledger

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/klauspost/compress/s2"

	"github.com/tidb-parity/parity/internal/rowkey"
)

// Table is the ledger's table in the meta schema.
const Table = "dirty_keys"

// RangeTable records where each changefeed's ledger starts:
//
//	ledger_range (changefeed PRIMARY KEY, since_ts)
//
// The ledger holds every change with commit ts in (since_ts, checkpoint.applied_ts].
// since_ts is the checkpoint the applier started from when it first wrote the ledger
// (a meta schema upgraded from a release without the ledger, or applier.ledger turned
// on); without a row the ledger is off or was off, and holds nothing a reader may trust.
const RangeTable = "ledger_range"

// MaxPartKeys bounds the keys of one ledger row.
const MaxPartKeys = 50000

// Entry is one key and the commit ts of its last change in a round.
type Entry struct {
	Key      rowkey.Key
	CommitTs uint64
}

// format is the first byte of an encoded part.
const format = 1

// Compact sorts entries by key and keeps one per key, with the largest commit ts. Keys
// that arrive in order (a table's rows are often written in key order) are not sorted
// again.
func Compact(entries []Entry) []Entry {
	byKey := func(a, b Entry) int { return rowkey.Compare(a.Key, b.Key) }
	if !slices.IsSortedFunc(entries, byKey) {
		slices.SortStableFunc(entries, byKey)
	}
	out := entries[:0]
	for _, e := range entries {
		if n := len(out); n > 0 && string(out[n-1].Key) == string(e.Key) {
			out[n-1].CommitTs = max(out[n-1].CommitTs, e.CommitTs)
			continue
		}
		out = append(out, e)
	}
	return out
}

// Encode encodes entries (as Compact leaves them) whose commit ts are all >= minTs:
// a format byte, then, s2-compressed, for each entry the length of the prefix its key
// shares with the previous key, the length of the rest and the rest (sorted keys share
// long prefixes), and its commit ts - minTs; all lengths and numbers are uvarints.
func Encode(entries []Entry, minTs uint64) ([]byte, error) {
	var raw []byte
	var prev rowkey.Key
	for _, e := range entries {
		if e.CommitTs < minTs {
			return nil, fmt.Errorf("ledger entry at ts %d below the part's min ts %d", e.CommitTs, minTs)
		}
		shared := 0
		for shared < len(prev) && shared < len(e.Key) && prev[shared] == e.Key[shared] {
			shared++
		}
		raw = binary.AppendUvarint(raw, uint64(shared))
		raw = binary.AppendUvarint(raw, uint64(len(e.Key)-shared))
		raw = append(raw, e.Key[shared:]...)
		raw = binary.AppendUvarint(raw, e.CommitTs-minTs)
		prev = e.Key
	}
	return append([]byte{format}, s2.Encode(nil, raw)...), nil
}

// ErrCorrupt is returned for bytes that are not an encoded part.
var ErrCorrupt = errors.New("corrupt ledger entries")

// Decode decodes a part written by Encode with minTs.
func Decode(blob []byte, minTs uint64) ([]Entry, error) {
	if len(blob) == 0 || blob[0] != format {
		return nil, fmt.Errorf("%w: unknown format", ErrCorrupt)
	}
	if n, err := s2.DecodedLen(blob[1:]); err != nil || n > 1<<30 {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	raw, err := s2.Decode(nil, blob[1:])
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	var out []Entry
	var prev rowkey.Key
	for len(raw) > 0 {
		shared, w := binary.Uvarint(raw)
		if w <= 0 || shared > uint64(len(prev)) {
			return nil, fmt.Errorf("%w: entry %d: bad shared prefix", ErrCorrupt, len(out))
		}
		raw = raw[w:]
		n, w := binary.Uvarint(raw)
		if w <= 0 || n > uint64(len(raw)-w) {
			return nil, fmt.Errorf("%w: entry %d: bad key length", ErrCorrupt, len(out))
		}
		key := make(rowkey.Key, 0, int(shared)+int(n))
		key = append(append(key, prev[:shared]...), raw[w:w+int(n)]...)
		raw = raw[w+int(n):]
		prev = key
		d, w := binary.Uvarint(raw)
		if w <= 0 || d > ^uint64(0)-minTs {
			return nil, fmt.Errorf("%w: entry %d: bad commit ts", ErrCorrupt, len(out))
		}
		raw = raw[w:]
		out = append(out, Entry{Key: key, CommitTs: minTs + d})
	}
	return out, nil
}
