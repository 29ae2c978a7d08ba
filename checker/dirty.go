package checker

// dirty.go owns the scopes of a run (Config.Scope): parsing them, each table's window of
// the changefeed's dirty-key ledger (internal/ledger) and the refusal of a window the
// ledger does not cover, the ledger's keys turned into the checker's keys (the applier
// types and orders them as TiCDC's messages do), and keyListScope, which hands a scoped
// table's keys out in batches for the comparer to read by key on both sides. It must not
// compare rows or count results (the comparer and the tracker do), nor write the ledger
// (the applier does).

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tidb-parity/parity/internal/ledger"
	"github.com/tidb-parity/parity/internal/rowkey"
	"github.com/tidb-parity/parity/internal/tso"
)

// Scope kinds (Config.Scope).
const (
	// ScopeFull compares every row of every table, in key-range chunks.
	ScopeFull = "full"
	// ScopeSince ("since:<TSO|RFC 3339 time>") compares the keys the changefeed changed
	// after that point.
	ScopeSince = "since"
	// ScopeCDC compares the keys the changefeed changed since each table's last clean
	// verification (verified.go).
	ScopeCDC = "cdc"
)

// ScopeSpec is a parsed Config.Scope.
type ScopeSpec struct {
	Kind string // ScopeFull, ScopeSince or ScopeCDC
	// Since is ScopeSince's TSO: keys changed at a commit ts above it are in scope.
	Since uint64
}

func (s ScopeSpec) String() string {
	if s.Kind == ScopeSince {
		return ScopeSince + ":" + strconv.FormatUint(s.Since, 10)
	}
	return s.Kind
}

// scoped reports whether the spec reads keys from the ledger.
func (s ScopeSpec) scoped() bool { return s.Kind == ScopeSince || s.Kind == ScopeCDC }

// minTSOTime and maxTSOTime bound the times a TSO given to since: may stand for: a number
// outside them is not a TSO (a Unix time in seconds, say, is a TSO of 1970).
var (
	minTSOTime = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	maxTSOTime = time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)
)

// ParseScope parses a scope: "full" (or ""), "cdc", or "since:" followed by a TiDB TSO
// or an RFC 3339 time ("since:2026-01-02T15:04:05Z", "since:2026-01-02T15:04:05+08:00").
func ParseScope(s string) (ScopeSpec, error) {
	switch s {
	case "", ScopeFull:
		return ScopeSpec{Kind: ScopeFull}, nil
	case ScopeCDC:
		return ScopeSpec{Kind: ScopeCDC}, nil
	}
	v, ok := strings.CutPrefix(s, ScopeSince+":")
	if !ok {
		return ScopeSpec{}, fmt.Errorf("unknown scope %q: want full, cdc or since:<TSO|RFC 3339 time>", s)
	}
	v = strings.TrimSpace(v)
	if v != "" && strings.Trim(v, "0123456789") == "" {
		ts, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return ScopeSpec{}, fmt.Errorf("scope %q: %v", s, err)
		}
		if at := tso.Time(ts); at.Before(minTSOTime) || at.After(maxTSOTime) {
			return ScopeSpec{}, fmt.Errorf("scope %q: %d is not a TiDB TSO (it would be %s): give a TSO or an RFC 3339 time", s, ts, at.UTC().Format(time.RFC3339))
		}
		return ScopeSpec{Kind: ScopeSince, Since: ts}, nil
	}
	at, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return ScopeSpec{}, fmt.Errorf("scope %q: want since:<TSO> or since:<RFC 3339 time> (2026-01-02T15:04:05Z): %v", s, err)
	}
	if at.Before(minTSOTime) || at.After(maxTSOTime) {
		return ScopeSpec{}, fmt.Errorf("scope %q: time out of range", s)
	}
	return ScopeSpec{Kind: ScopeSince, Since: tso.FromTime(at)}, nil
}

// ErrScopeUnavailable is returned, before anything is compared, for a scoped run the
// ledger cannot serve: the changefeed has no ledger, a table's window starts before the
// ledger does (since_ts: written by a release without it, a time with applier.ledger off,
// or pruned past its retention), or a cdc-scoped table has no clean verification to start
// from. A full run (scope full) covers such tables.
var ErrScopeUnavailable = errors.New("scope unavailable")

// Table scope modes (TableReport.Scope).
const (
	// tableFull: every row, in key-range chunks (a full run).
	tableFull = "full"
	// tableKeys: the keys of the table's ledger window, read by key.
	tableKeys = "keys"
	// tableWhole: a scoped run compares the table whole, as a full run would
	// (TableReport.ScopeNote says why: keyless, or keys the ledger's do not match).
	tableWhole = "whole"
)

// tableScope is what a run compares of one table.
type tableScope struct {
	mode string // tableFull, tableKeys or tableWhole
	note string // tableWhole: why
	// from, until: the ledger window (from, until] of a tableKeys table; until is also
	// the point a full or whole table is compared at when known (a snapshot pair's TSO),
	// which a clean verification records.
	from, until uint64
	// keys: a tableKeys table's keys, in the checker's typing, sorted.
	keys []rowkey.Key
	// bypass: whether the writes that bypassed parity are among a tableKeys table's
	// keys (bypasskeys.go).
	bypass BypassReport
}

// pairTS returns the TSO both sides read at when the run is at a snapshot pair (the
// upstream at a TSO and the downstream held at the same one).
func (p *sourcePair) pairTS() (uint64, bool) {
	if !p.atSnapshot() || p.snapshot[upSide] != p.snapshot[downSide] {
		return 0, false
	}
	ts, err := strconv.ParseUint(p.snapshot[upSide], 10, 64)
	return ts, err == nil && ts > 0
}

// upstreamTS returns the TSO the upstream reads at, when it reads at one.
func (p *sourcePair) upstreamTS() (uint64, bool) {
	ts, err := strconv.ParseUint(p.snapshot[upSide], 10, 64)
	return ts, err == nil && ts > 0
}

// ledgerReader reads the changefeed's ledger through q (on the downstream, where the
// applier's meta schema is).
func ledgerReader(cfg *Config, q Querier) ledger.Reader {
	return ledger.Reader{Q: q, MetaSchema: cfg.Changefeed.MetaSchema, Changefeed: cfg.Changefeed.ID, Timeout: cfg.QueryTimeout}
}

// resolveScopes decides what the run compares of each table, reading the ledger for the
// scoped ones. A table whose scope was stored (a resumed run) keeps it: its window is
// read again. A scoped run whose window the ledger does not cover is refused
// (ErrScopeUnavailable), naming every such table.
func (r *runner) resolveScopes(ctx context.Context, targets []*target) ([]*tableScope, error) {
	spec := r.cfg.scope
	out := make([]*tableScope, len(targets))
	pairTS, atPair := r.pair.pairTS()
	if !spec.scoped() {
		for i, t := range targets {
			out[i] = &tableScope{mode: tableFull, until: pairTS}
			if t.stored.scopeMode != "" {
				out[i].until = t.stored.scopeUntil
			} else if !t.fatal {
				if err := r.st.setTableScope(ctx, t.idx, out[i]); err != nil {
					return nil, err
				}
			}
		}
		return out, nil
	}
	var refused []string
	cov := bypassCoverage(ctx, r.cfg.Bypass, r.log)
	err := r.pair.withSide(ctx, downSide, func(ctx context.Context, q Querier) error {
		rd := ledgerReader(r.cfg, q)
		bounds, err := rd.Bounds(ctx)
		if err != nil {
			return fmt.Errorf("%w: scope %s: %w", ErrScopeUnavailable, spec, err)
		}
		// The window ends where both sides are: the pair's TSO, the upstream's snapshot,
		// or else the applied checkpoint (changes after it are not in scope).
		until := bounds.Applied
		if atPair {
			until = pairTS
		} else if ts, ok := r.pair.upstreamTS(); ok && ts < until {
			until = ts
		}
		for i, t := range targets {
			if t.fatal {
				out[i] = &tableScope{mode: tableWhole, note: "not compared"}
				continue
			}
			sc, why, err := r.tableScope(ctx, rd, spec, bounds, until, t)
			if err != nil {
				return err
			}
			if why != "" {
				refused = append(refused, fmt.Sprintf("%s: %s", t.name, why))
				continue
			}
			if sc.mode == tableKeys {
				if err := addBypassKeys(ctx, r.cfg, q, t, sc, cov); err != nil {
					return err
				}
			}
			out[i] = sc
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(refused) > 0 {
		return nil, fmt.Errorf("%w: scope %s: %s (a full run covers them)", ErrScopeUnavailable, spec, strings.Join(refused, "; "))
	}
	for i, t := range targets {
		if t.fatal || t.stored.scopeMode != "" {
			continue
		}
		if err := r.st.setTableScope(ctx, t.idx, out[i]); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// tableScope resolves one table's scope; why is set when the ledger cannot serve it.
func (r *runner) tableScope(ctx context.Context, rd ledger.Reader, spec ScopeSpec, bounds ledger.Bounds, until uint64, t *target) (sc *tableScope, why string, err error) {
	st := t.stored
	if st.scopeMode == "" && slices.Contains(r.cfg.WholeTables, st.upSchema+"."+st.upTable) {
		return &tableScope{mode: tableWhole, note: "compared whole as asked (a full comparison of the table)", until: until}, "", nil
	}
	if st.scopeMode == tableWhole || (st.scopeMode == "" && !t.handle.ok) {
		note := st.scopeNote
		if st.scopeMode == "" {
			note = t.handle.why
		}
		return &tableScope{mode: tableWhole, note: note, until: until}, "", nil
	}
	from := spec.Since
	if st.scopeMode == tableKeys {
		from, until = st.scopeFrom, st.scopeUntil // a resumed run reads its window again
	} else if spec.Kind == ScopeCDC {
		v, ok, err := r.st.lastVerified(ctx, r.cfg.Changefeed.ID, st.upSchema, st.upTable)
		if err != nil {
			return nil, "", err
		}
		if !ok {
			return nil, "no clean verification of the table recorded for changefeed " + r.cfg.Changefeed.ID + " (scope cdc starts at the last one)", nil
		}
		from = v.Ts
	}
	if from < bounds.Since {
		return nil, fmt.Sprintf("the scope starts at %d (%s), before the changefeed's ledger does (since_ts %d, %s)",
			from, tso.Format(from), bounds.Since, tso.Format(bounds.Since)), nil
	}
	sc = &tableScope{mode: tableKeys, from: from, until: until}
	if from >= until {
		return sc, "", nil // nothing changed after from that the pair holds
	}
	entries, err := ledger.Read(ctx, rd, st.upSchema, st.upTable, from, until)
	if errors.Is(err, ledger.ErrNotCovered) || errors.Is(err, ledger.ErrNoLedger) {
		return nil, err.Error(), nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("table %s: %w", t.name, err)
	}
	keys, note := t.handle.translateAll(t.plan, entries)
	if note != "" {
		return &tableScope{mode: tableWhole, note: note, until: until}, "", nil
	}
	sc.keys = keys
	return sc, "", nil
}

// handleKey is how the ledger's keys of a table become the checker's. The applier keys a
// row by its handle columns, in the order TiCDC's message lists them, with the Go types
// of the open protocol; the checker keys it by its key columns (p.Key's order) with
// keyValue's types. They are the same columns when the checker's key is the table's
// primary key, or, without one, its only NOT NULL unique key (TiCDC's handle is the
// first by index id, which information_schema does not give). TiCDC lists a row's
// columns by name (tiflow) or in table order (the new architecture): both orders are
// candidates, told apart by the keys' types when they differ. ENUM and SET values are
// member indexes and bit sets in the ledger, their text here.
type handleKey struct {
	ok  bool
	why string // when !ok: why the ledger's keys cannot be the table's
	// orders are the candidate orders: orders[o][i] is the ledger value of key column i.
	orders [][]int
	// members, per key column: its ENUM or SET members (nil: neither); set marks SETs.
	members [][]string
	set     []bool
}

// newHandleKey works out how the ledger keys table up's rows compared by plan p (f: the
// upstream's flavour, which decides how its column types are spelled).
func newHandleKey(up *tableSchema, p *tablePlan, f Flavor) handleKey {
	if p.Keyless {
		return handleKey{why: "keyless: no key to scope by, compared whole"}
	}
	names := p.keyNames()
	switch {
	case len(up.PrimaryKey) > 0:
		if !equalFoldSlices(up.PrimaryKey, names) {
			return handleKey{why: fmt.Sprintf("the compared key (%s) is not the primary key (%s) the changefeed keys rows by, compared whole",
				strings.Join(names, ", "), strings.Join(up.PrimaryKey, ", "))}
		}
	case len(up.UniqueKeys) != 1:
		return handleKey{why: fmt.Sprintf("no primary key and %d NOT NULL unique keys: which one the changefeed keys rows by is not known, compared whole", len(up.UniqueKeys))}
	case !equalFoldSlices(up.UniqueKeys[0], names):
		return handleKey{why: "the compared key is not the unique key the changefeed keys rows by, compared whole"}
	}
	h := handleKey{ok: true, members: make([][]string, len(p.Key)), set: make([]bool, len(p.Key))}
	for i, k := range p.Key {
		c := p.Columns[k]
		if !c.Enum {
			continue
		}
		uc, _ := up.column(c.Name)
		m, err := enumMembers(uc.ColumnType, f != FlavorTiDB)
		if err != nil {
			return handleKey{why: fmt.Sprintf("key column %s: %v, compared whole", c.Name, err)}
		}
		h.members[i], h.set[i] = m, uc.DataType == "set"
	}
	// Table order: p.Columns follows the upstream's column order.
	table := make([]int, len(p.Key))
	for i := range table {
		table[i] = i
	}
	slices.SortFunc(table, func(a, b int) int { return p.Key[a] - p.Key[b] })
	byName := slices.Clone(table)
	slices.SortFunc(byName, func(a, b int) int {
		return strings.Compare(p.Columns[p.Key[a]].Name, p.Columns[p.Key[b]].Name)
	})
	// orders[o][i]: position of key column i among the ledger's values.
	for _, ord := range [][]int{table, byName} {
		inv := make([]int, len(ord))
		for pos, col := range ord {
			inv[col] = pos
		}
		if !slices.ContainsFunc(h.orders, func(o []int) bool { return slices.Equal(o, inv) }) {
			h.orders = append(h.orders, inv)
		}
	}
	return h
}

// translate returns ledger key k in the checker's typing under order o; ok is false when
// its values do not fit the key columns (their number, types, or an ENUM index beyond the
// members).
func (h *handleKey) translate(p *tablePlan, o int, k rowkey.Key) (rowkey.Key, bool) {
	vals, err := k.Values()
	if err != nil || len(vals) != len(p.Key) {
		return nil, false
	}
	out := make([]any, len(p.Key))
	for i, k := range p.Key {
		v, ok := h.value(p.Columns[k], i, vals[h.orders[o][i]])
		if !ok {
			return nil, false
		}
		out[i] = v
	}
	key, err := rowkey.Encode(out...)
	return key, err == nil
}

// value turns ledger value v of key column c (the i-th) into keyValue's type for it.
func (h *handleKey) value(c planColumn, i int, v any) (any, bool) {
	if v == nil {
		return nil, true
	}
	switch c.Kind {
	case kindInt:
		switch x := v.(type) {
		case int64:
			if c.Unsigned {
				return uint64(x), x >= 0
			}
			return x, true
		case uint64:
			if !c.Unsigned && x <= 1<<63-1 {
				return int64(x), true
			}
			return x, true
		}
	case kindBit:
		x, ok := v.(uint64)
		return x, ok
	case kindFloat, kindDouble:
		x, ok := v.(float64)
		return x, ok
	case kindDecimal, kindTemporal, kindJSON:
		x, ok := v.(string)
		return x, ok
	case kindBinary:
		x, ok := v.([]byte)
		return x, ok
	case kindString:
		if h.members[i] == nil {
			x, ok := v.(string)
			return x, ok
		}
		x, ok := v.(uint64)
		if !ok {
			return nil, false
		}
		return memberText(h.members[i], h.set[i], x)
	}
	return nil, false
}

// memberText is the text of ENUM index x (0: the empty error value) or SET bits x.
func memberText(members []string, set bool, x uint64) (string, bool) {
	if !set {
		switch {
		case x == 0:
			return "", true
		case x > uint64(len(members)):
			return "", false
		}
		return members[x-1], true
	}
	if len(members) < 64 && x>>len(members) != 0 {
		return "", false
	}
	var parts []string
	for b := range members {
		if x&(1<<b) != 0 {
			parts = append(parts, members[b])
		}
	}
	return strings.Join(parts, ","), true
}

// translateAll turns a table's ledger entries into its sorted keys in the checker's
// typing. note is set (and keys nil) when the entries cannot be the table's keys under
// exactly one candidate order: the table is then compared whole.
func (h *handleKey) translateAll(p *tablePlan, entries []ledger.Entry) (keys []rowkey.Key, note string) {
	if len(entries) == 0 {
		return nil, ""
	}
	var fits []int
	for o := range h.orders {
		ok := true
		for _, e := range entries {
			if _, ok = h.translate(p, o, e.Key); !ok {
				break
			}
		}
		if ok {
			fits = append(fits, o)
		}
	}
	switch len(fits) {
	case 0:
		return nil, "the changefeed's keys of the table do not fit its key columns (" + strings.Join(p.keyNames(), ", ") + "), compared whole"
	case 2:
		return nil, "composite key whose column order in the changefeed's messages is ambiguous (TiCDC lists columns by name or in table order), compared whole"
	}
	keys = make([]rowkey.Key, len(entries))
	for i, e := range entries {
		keys[i], _ = h.translate(p, fits[0], e.Key)
	}
	slices.SortFunc(keys, rowkey.Compare)
	return slices.CompactFunc(keys, func(a, b rowkey.Key) bool { return string(a) == string(b) }), ""
}

// enumMembers parses the members of an ENUM or SET column type as
// information_schema.COLUMNS.COLUMN_TYPE spells it: enum('a','it”s','b\\c'). A quote
// inside a member is doubled; MySQL and MariaDB also escape a backslash as \\ (and may
// write \' for a quote), TiDB writes it as it is (backslash false).
func enumMembers(columnType string, backslash bool) ([]string, error) {
	s := strings.TrimSpace(columnType)
	open := strings.IndexByte(s, '(')
	if open < 0 || !strings.HasSuffix(s, ")") {
		return nil, fmt.Errorf("column type %q: not an ENUM or SET", columnType)
	}
	if kind := strings.ToLower(strings.TrimSpace(s[:open])); kind != "enum" && kind != "set" {
		return nil, fmt.Errorf("column type %q: not an ENUM or SET", columnType)
	}
	body := s[open+1 : len(s)-1]
	var out []string
	for i := 0; i < len(body); {
		if body[i] != '\'' {
			return nil, fmt.Errorf("column type %q: member %d does not start with a quote", columnType, len(out)+1)
		}
		i++
		var m strings.Builder
		closed := false
		for i < len(body) && !closed {
			c := body[i]
			switch {
			case c == '\'' && i+1 < len(body) && body[i+1] == '\'':
				m.WriteByte('\'')
				i += 2
			case c == '\'':
				closed = true
				i++
			case c == '\\' && backslash && i+1 < len(body):
				m.WriteByte(body[i+1])
				i += 2
			default:
				m.WriteByte(c)
				i++
			}
		}
		if !closed {
			return nil, fmt.Errorf("column type %q: member %d is not closed", columnType, len(out)+1)
		}
		out = append(out, m.String())
		if i < len(body) {
			if body[i] != ',' || i+1 == len(body) {
				return nil, fmt.Errorf("column type %q: expected a comma after member %d", columnType, len(out))
			}
			i++
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("column type %q: no members", columnType)
	}
	return out, nil
}

// scopeBatch is how many keys one key unit of a scoped table holds: one query per side
// reads their rows (rowsByKeysSQL).
const scopeBatch = 512

// scopeCutBatch is how many key units are recorded in one statement.
const scopeCutBatch = 16

// keyListScope hands out a scoped table's keys in batches of scopeBatch, in key order,
// recording each batch as a chunk (its first and last key as its bounds) before handing
// it out. A resumed run's chunks keep their keys: the keys within a stored chunk's bounds
// go with it (compared again unless it is done), the others are cut anew.
type keyListScope struct {
	t     *target
	st    *store
	track *tracker

	queue []unit
	rest  []rowkey.Key // not yet cut, sorted
	seq   int
	cut0  bool // a unit has been cut or resumed (a table without keys still gets one)
}

// keyBound is the stored bound of a key unit: boundPrefix and its exact key.
func keyBound(k rowkey.Key) string { return boundPrefix + base64.StdEncoding.EncodeToString(k) }

func openKeyListScope(ctx context.Context, cfg *Config, t *target, sc *tableScope, st *store, track *tracker) (*keyListScope, error) {
	s := &keyListScope{t: t, st: st, track: track, rest: sc.keys}
	if cfg.Resume == "" {
		return s, nil
	}
	stored, err := st.chunks(ctx, t.idx)
	if err != nil {
		return nil, err
	}
	track.restore(t.idx, stored)
	var rest []rowkey.Key
	claimed := make([]bool, len(s.rest))
	for _, c := range stored {
		s.seq = c.Seq + 1
		s.cut0 = true
		lo, err1 := rawBound(c.bounds[0])
		hi, err2 := rawBound(c.bounds[1])
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("table %s, chunk %d: %w", t.name, c.Seq, err)
		}
		var keys []chunkBound
		for i, k := range s.rest {
			if rowkey.Compare(k, lo) >= 0 && rowkey.Compare(k, hi) <= 0 {
				claimed[i] = true
				if c.state != chunkDone {
					b, err := keyBoundValues(k)
					if err != nil {
						return nil, err
					}
					keys = append(keys, b)
				}
			}
		}
		if c.state != chunkDone {
			c.retry = true
			if keys == nil {
				keys = []chunkBound{}
			}
			s.queue = append(s.queue, unit{keyChunk: c.keyChunk, keys: keys})
		}
	}
	for i, k := range s.rest {
		if !claimed[i] {
			rest = append(rest, k)
		}
	}
	s.rest = rest
	return s, nil
}

// rawBound reads a key unit's stored bound.
func rawBound(s string) (rowkey.Key, error) {
	b, ok := strings.CutPrefix(s, boundPrefix)
	if !ok {
		return nil, fmt.Errorf("not a key unit's bound: %.12q", s)
	}
	raw, err := base64.StdEncoding.DecodeString(b)
	return rowkey.Key(raw), err
}

// keyBoundValues returns key k's values as a chunkBound (what rowsByKeysSQL reads by).
func keyBoundValues(k rowkey.Key) (chunkBound, error) {
	vals, err := k.Values()
	if err != nil {
		return nil, err
	}
	return boundOf(vals), nil
}

func (s *keyListScope) next(ctx context.Context) (unit, bool, error) {
	if len(s.queue) == 0 && (len(s.rest) > 0 || !s.cut0) {
		if err := s.cut(ctx); err != nil {
			return unit{}, false, err
		}
	}
	if len(s.queue) == 0 {
		return unit{}, false, nil
	}
	u := s.queue[0]
	s.queue = s.queue[1:]
	return u, true, nil
}

// cut records the next scopeCutBatch units and queues them.
func (s *keyListScope) cut(ctx context.Context) error {
	var batch []keyChunk
	var units []unit
	for len(batch) < scopeCutBatch && (len(s.rest) > 0 || !s.cut0) {
		n := min(scopeBatch, len(s.rest))
		keys := s.rest[:n]
		s.rest = s.rest[n:]
		s.cut0 = true
		c := keyChunk{Table: s.t.idx, Seq: s.seq, Last: len(s.rest) == 0}
		if n > 0 {
			c.bounds = [2]string{keyBound(keys[0]), keyBound(keys[n-1])}
		} else {
			c.bounds = [2]string{keyBound(nil), keyBound(nil)}
		}
		s.seq++
		u := unit{keyChunk: c, keys: make([]chunkBound, 0, n)}
		for _, k := range keys {
			b, err := keyBoundValues(k)
			if err != nil {
				return fmt.Errorf("table %s: %w", s.t.name, err)
			}
			u.keys = append(u.keys, b)
		}
		batch = append(batch, c)
		units = append(units, u)
	}
	if err := s.st.addChunks(ctx, batch); err != nil {
		return err
	}
	s.track.cut(s.t.idx, batch)
	s.queue = append(s.queue, units...)
	return nil
}

// feedback: key units are not sized.
func (s *keyListScope) feedback(unit, chunkResult) {}

var _ scope = (*keyListScope)(nil)
