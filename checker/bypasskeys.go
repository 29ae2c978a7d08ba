package checker

// bypasskeys.go owns the second source of a scoped table's keys: the writes that bypassed
// parity, as the bypass detector recorded them (internal/bypasslog). The ledger holds
// the keys the changefeed changed; a write made straight in the fallback on any other
// row is only in the detector's records, and a scoped run that read the ledger alone
// would never look at it. It also says, per table, whether the detector watched the
// whole window (a window nobody watched is not vouched for). The scope resolution
// (dirty.go) calls its functions with what they need; it holds no state of the run. It
// must not compare rows (the comparer does) nor write the records (the detector does).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/tidb-parity/parity/internal/bypasslog"
	"github.com/tidb-parity/parity/internal/rowkey"
	"github.com/tidb-parity/parity/internal/tso"
)

// BypassWatcher is the bypass detector as a scoped run needs it (cdc/bypass.Detector
// satisfies it): Cover returns once every transaction the fallback's binlog held when it
// was called is read and its detections are saved, with the stretch of watching it
// vouches for; an error when it cannot (behind, not reading).
type BypassWatcher interface {
	Cover(ctx context.Context) (bypasslog.Coverage, error)
}

// Bypass states of a scoped table (TableReport.Bypass).
const (
	BypassIncluded  = "included"
	bypassUnwatched = "unwatched"
	BypassOff       = "off"
)

// bypassCoverWait bounds how long a scoped run waits for the bypass detector to have
// read the fallback's binlog up to the run's start.
const bypassCoverWait = time.Minute

// bypassSkew is added before a window's start when its bypass writes are read: the
// window starts at a TSO (TiDB's clock), the writes carry the fallback's binlog time in
// whole seconds. Reading a little more than the window costs a few keys compared; less
// would miss a write.
const bypassSkew = 2 * time.Second

// coverage is what the bypass detector vouched for at the start of a scoped run.
type coverage struct {
	off bool               // no detector
	err error              // the detector could not vouch (behind, not reading)
	c   bypasslog.Coverage // when err is nil and off is false
}

// bypassCoverage asks the detector, once per run, to catch up with the fallback's
// binlog: after it returns, every write made before the run's snapshot pair (opened
// before the scopes are resolved) is in the records.
func bypassCoverage(ctx context.Context, w BypassWatcher, log *slog.Logger) coverage {
	if w == nil {
		return coverage{off: true}
	}
	cctx, cancel := context.WithTimeout(ctx, bypassCoverWait)
	defer cancel()
	c, err := w.Cover(cctx)
	if err != nil {
		log.Warn("the bypass detector cannot vouch for the run's windows", "err", err)
		return coverage{err: err}
	}
	return coverage{c: c}
}

// addBypassKeys adds to sc (a tableKeys scope of t) the keys of the writes that bypassed
// parity in its window, and records whether the window was watched. A table with a
// recorded DDL, or with a write whose key is not the one compared (a keyless table
// downstream, another key), is compared whole.
func addBypassKeys(ctx context.Context, cfg *Config, q Querier, t *target, sc *tableScope, cov coverage) error {
	start := tso.Time(sc.from)
	sc.bypass.BypassSince, sc.bypass.BypassWatched = start.Add(-bypassSkew).Truncate(time.Second), cov.c.Since
	switch {
	case cov.off:
		sc.bypass.Bypass, sc.bypass.BypassNote = BypassOff, "bypass detection is off: writes that bypassed parity are not among the keys"
		return nil
	case cov.err != nil:
		sc.bypass.Bypass, sc.bypass.BypassNote = bypassUnwatched, fmt.Sprintf("the bypass detector cannot vouch for the window from %s: %v", start.UTC().Format(time.RFC3339), cov.err)
	case cov.c.Since.After(start):
		sc.bypass.Bypass = bypassUnwatched
		sc.bypass.BypassNote = fmt.Sprintf("the window starts at %s (TSO %d) but bypass detection watched the fallback only from %s (%s): writes from %s to %s were not watched",
			start.UTC().Format(time.RFC3339), sc.from, cov.c.Since.UTC().Format(time.RFC3339Nano), cov.c.Reason,
			start.UTC().Format(time.RFC3339), cov.c.Since.UTC().Format(time.RFC3339Nano))
	default:
		sc.bypass.Bypass = BypassIncluded
	}
	qctx, cancel := context.WithTimeout(ctx, cfg.QueryTimeout)
	defer cancel()
	ws, err := bypasslog.Read(qctx, q, cfg.Changefeed.MetaSchema, cfg.Changefeed.ID, t.stored.downSchema, t.stored.downName,
		sc.bypass.BypassSince, time.Now().Add(time.Hour))
	if errors.Is(err, bypasslog.ErrNoTable) {
		return nil // no detector ever ran against this meta schema: nothing recorded
	}
	if err != nil {
		return fmt.Errorf("table %s: %w", t.name, err)
	}
	if len(ws) == 0 {
		return nil
	}
	p := t.plan
	seen := map[string]bool{}
	for _, k := range sc.keys {
		if vals, err := k.Values(); err == nil {
			seen[p.matchForm(vals)] = true
		}
	}
	var add []rowkey.Key
	whole := ""
	for _, w := range ws {
		if w.Kind == bypasslog.KindDDL {
			// The full verification the window starts at compared the table's structure:
			// a DDL before it is not in the window. The binlog's time is in whole
			// seconds, so one in the window's first second may be either side: counted.
			if w.EventTime.Before(start.Truncate(time.Second)) {
				continue
			}
			sc.bypass.BypassDDL = append(sc.bypass.BypassDDL, w.Text)
			whole = "a DDL was made straight in the fallback on the table in the window, compared whole"
			continue
		}
		k, vals, ok := bypassKey(p, w)
		if !ok {
			if whole == "" {
				whole = "a write that bypassed parity has no key of the compared key columns (" + strings.Join(p.keyNames(), ", ") + "), compared whole"
			}
			continue
		}
		if f := p.matchForm(vals); !seen[f] {
			seen[f] = true
			add = append(add, k)
		}
	}
	if whole != "" {
		sc.mode, sc.note, sc.keys = tableWhole, whole, nil
		return nil
	}
	sc.bypass.BypassKeys = int64(len(add))
	sc.keys = append(sc.keys, add...)
	slices.SortFunc(sc.keys, rowkey.Compare)
	return nil
}

// bypassKey is the key of the row a detected write changed, in the checker's typing
// (keyValue's), with its values, when the write names exactly the compared key's columns
// and none of them is NULL.
func bypassKey(p *tablePlan, w bypasslog.Write) (rowkey.Key, []any, bool) {
	if p.Keyless {
		return nil, nil, false
	}
	vals, ok := p.bypassKeyValues(w)
	if !ok || slices.Contains(vals, nil) {
		return nil, nil, false
	}
	k, err := rowkey.Encode(vals...)
	return k, vals, err == nil
}

// bypassKeyValues returns the values, in keyValue's typing, of the row a detected write
// names, over the columns that identify a difference's row (diffKeyColumns: the key, or
// every column of a keyless table; a NULL is nil); ok is false when the write names
// other columns (no key, or another key than the one compared). Scoped runs read keys
// from it (bypassKey) and classification matches differences with it.
func (p *tablePlan) bypassKeyValues(w bypasslog.Write) ([]any, bool) {
	idx := p.diffKeyColumns()
	if len(w.Columns) != len(idx) || len(w.Values) != len(w.Columns) {
		return nil, false
	}
	vals := make([]any, len(idx))
	for i, col := range idx {
		j := slices.IndexFunc(w.Columns, func(n string) bool { return strings.EqualFold(n, p.Columns[col].Name) })
		if j < 0 {
			return nil, false
		}
		v := nullValue
		if w.Values[j] != nil {
			v = sqlValue{Bytes: w.Values[j]}
		}
		vals[i] = keyValue(p.Columns[col], v)
	}
	return vals, true
}
