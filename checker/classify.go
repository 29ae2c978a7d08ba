package checker

// classify.go owns the classification of a run's differences, once they are final (after
// the re-check): where each one comes from, by the changefeed's dirty-key ledger and
// ts-map when the run is at a snapshot pair, by the re-check otherwise. It stores each
// difference's class with it (diff_differences.class) and counts them per class for the
// report and Stats. A classification is a result: what cannot be classified is
// "unclassified", with a note in the report saying why; it never fails a run that found
// differences. The classifier is its own part, beside the comparer: the runner hands it
// the store, the tracker and the pair once the differences are final. It must not
// compare rows nor change which differences are stored.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/tidb-parity/parity/internal/bypasslog"
	"github.com/tidb-parity/parity/internal/ledger"
	"github.com/tidb-parity/parity/internal/rowkey"
	"github.com/tidb-parity/parity/internal/tso"
)

// Classes of a difference (Difference.Class, Report.DifferencesByClass).
const (
	// ClassImported: the changefeed did not change the key in its ledger's window (since
	// ledger_since_ts, normally the import TSO): the import, or a write outside
	// replication, diverged.
	ClassImported = "imported"
	// ClassPostImport: the key was last changed while the applier was catching up,
	// before it first came within Config.CaughtUpLag of real time.
	ClassPostImport = "post-import"
	// ClassCDC: the key was last changed during live replication.
	ClassCDC = "cdc"
	// ClassInFlight counts the differences the re-check found resolved (the sides were
	// not read at one snapshot and replication applied the change meanwhile). They are
	// not differences any more: only counted, in TableReport.DifferencesResolved too.
	ClassInFlight = "in-flight"
	// ClassDiverged: the sides were not read at a snapshot pair and the difference was
	// still there when the re-check read it again.
	ClassDiverged = "diverged"
	// ClassBypass: a write that bypassed parity changed the key: a transaction on the
	// fallback that parity's applier did not write, recorded by the bypass detector
	// (cdc/bypass, the contract in internal/bypasslog) before the differences were
	// classified. It wins over every other class for that key.
	ClassBypass = "bypass"
	// ClassUnclassified: the run could not tell (Classification.Notes says why): at a
	// snapshot pair without a changefeed ledger, in a keyless table (not in the ledger),
	// or without a re-check when not at a snapshot pair.
	ClassUnclassified = "unclassified"
)

// Classification says how a run's differences were classified (Report.Classification:
// absent when there were none, or when the sides were not at a snapshot pair and the
// classes need no note).
type Classification struct {
	// AtTs is the TSO of the snapshot pair the differences were found at (0 when the
	// sides were not read at one: then a difference is diverged, or was in flight).
	AtTs uint64 `json:"at_ts,omitempty"`
	// LedgerSinceTs is where the changefeed's ledger starts: a key without a change
	// between it and AtTs is imported.
	LedgerSinceTs uint64 `json:"ledger_since_ts,omitempty"`
	// CaughtUpTs is the upstream TSO at which the applier first came within CaughtUpLag
	// of real time (by its ts-map): changes before it are post-import, later ones cdc.
	CaughtUpTs  uint64 `json:"caught_up_ts,omitempty"`
	CaughtUpLag string `json:"caught_up_lag,omitempty"`
	// Notes explain what could not be classified, or how.
	Notes []string `json:"notes,omitempty"`
}

func (c *Classification) note(format string, args ...any) {
	c.Notes = append(c.Notes, fmt.Sprintf(format, args...))
}

// classifier is the classification part of a run, beside the comparer: it reads the
// stored differences (store), the ledger and the bypass records (through the pair's
// downstream or the meta database), stores each difference's class and counts the
// classes in the tracker. The runner builds one once the differences are final.
type classifier struct {
	cfg   *Config
	log   *slog.Logger
	st    *store
	track *tracker
	pair  *sourcePair
}

// classRef is a stored difference to classify, with the rows it stands for.
type classRef struct {
	ref  diffRef
	rows int64
}

// classify classifies the stored differences of every table that holds some, stores
// their classes and counts them in the tracker. Errors of the meta schema (storing the
// classes) fail the run; what the ledger cannot tell is classified unclassified.
func (c *classifier) classify(ctx context.Context) (*Classification, error) {
	cl, err := c.classifyBase(ctx)
	if err != nil {
		return nil, err
	}
	return c.classifyBypass(ctx, cl)
}

// classifyBase classifies by the ledger or the re-check (every class but bypass).
func (c *classifier) classifyBase(ctx context.Context) (*Classification, error) {
	cl := &Classification{}
	pending, _ := c.track.pending()
	if len(pending) == 0 {
		return nil, nil // nothing to classify (the re-check's resolved rows are counted in-flight)
	}
	ts, atPair := c.pair.pairTS()
	if !atPair {
		class := ClassDiverged
		if !recheckEnabled(c.cfg, c.pair) {
			class = ClassUnclassified
			cl.note("not at a snapshot pair and not re-checked (recheck-rounds 0): a difference may have been in flight")
		}
		for _, t := range pending {
			if err := c.classifyAll(ctx, t, class); err != nil {
				return nil, err
			}
		}
		if len(cl.Notes) == 0 {
			return nil, nil // the classes say it all
		}
		return cl, nil
	}
	cl.AtTs = ts
	cl.CaughtUpLag = c.cfg.CaughtUpLag.String()
	if c.cfg.Changefeed.ID == "" {
		cl.note("no changefeed (changefeed.id): where a difference comes from is not known")
		for _, t := range pending {
			if err := c.classifyAll(ctx, t, ClassUnclassified); err != nil {
				return nil, err
			}
		}
		return cl, nil
	}
	var keyed []*target
	for _, t := range pending {
		if !t.handle.ok {
			cl.note("%s: %s: its differences are unclassified", t.name, strings.TrimSuffix(t.handle.why, ", compared whole"))
			if err := c.classifyAll(ctx, t, ClassUnclassified); err != nil {
				return nil, err
			}
			continue
		}
		keyed = append(keyed, t)
	}
	if len(keyed) == 0 {
		return cl, nil
	}
	err := c.pair.withSide(ctx, downSide, func(ctx context.Context, q Querier) error {
		rd := ledgerReader(c.cfg, q)
		bounds, err := rd.Bounds(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return err
			}
			c.log.Warn("classification: the changefeed's ledger cannot be read; differences unclassified", "changefeed", c.cfg.Changefeed.ID, "err", err)
			cl.note("%v: differences unclassified", err)
			return errLedgerUnusable
		}
		cl.LedgerSinceTs = bounds.Since
		if bounds.Since > ts || bounds.Applied < ts {
			cl.note("the changefeed's ledger covers (%d, %d], not the pair's TSO %d: differences unclassified", bounds.Since, bounds.Applied, ts)
			return errLedgerUnusable
		}
		up, err := rd.CaughtUp(ctx, c.cfg.CaughtUpLag)
		if err != nil {
			if ctx.Err() != nil {
				return err
			}
			c.log.Warn("classification: the changefeed's ts-map cannot be read; differences unclassified", "changefeed", c.cfg.Changefeed.ID, "err", err)
			cl.note("%v: differences unclassified", err)
			return errLedgerUnusable
		}
		switch {
		case up.Rows == 0:
			cl.note("the changefeed's ts-map is empty: when the applier caught up is not known, every changed key is classed cdc")
		case !up.Found:
			cl.note("the applier has not come within caught-up-lag %v of real time (ts-map since %s): every changed key is post-import", c.cfg.CaughtUpLag, tso.Format(up.First))
		default:
			cl.CaughtUpTs = up.Ts
			if up.First == up.Ts && up.First > bounds.Since {
				cl.note("the oldest ts-map row (%s) is already within caught-up-lag: the applier caught up at or before it (the ts-map is pruned with the ledger)", tso.Format(up.First))
			}
		}
		for _, t := range keyed {
			if err := c.classifyKeyed(ctx, rd, t, bounds.Since, ts, up, cl); err != nil {
				return fmt.Errorf("classify the differences of %s: %w", t.name, err)
			}
		}
		return nil
	})
	if errors.Is(err, errLedgerUnusable) {
		for _, t := range keyed {
			if err := c.classifyAll(ctx, t, ClassUnclassified); err != nil {
				return nil, err
			}
		}
		return cl, nil
	}
	if err != nil {
		return nil, err
	}
	return cl, nil
}

var errLedgerUnusable = errors.New("ledger unusable for classification")

// classifyAll gives every stored difference of t the same class.
func (c *classifier) classifyAll(ctx context.Context, t *target, class string) error {
	if err := c.st.setClassAll(ctx, t.idx, class); err != nil {
		return err
	}
	tl := c.track.tally(t.idx)
	tl.mu.Lock()
	n := tl.differences
	tl.mu.Unlock()
	c.track.classified(t.idx, map[string]int64{class: n})
	return nil
}

// classifyKeyed classifies the stored differences of keyed table t, found at the pair's
// TSO ts, by the last change of each key in the ledger's window (since, ts].
func (c *classifier) classifyKeyed(ctx context.Context, rd ledger.Reader, t *target, since, ts uint64, up ledger.CaughtUp, cl *Classification) error {
	p := t.plan
	refs := map[string][]classRef{} // match form → stored differences
	counts := map[string]int64{}
	var unclassified []classRef
	limit := -1
	err := c.st.scanDifferences(ctx, t.idx, "", -1, -1, &limit, func(seq, n int64, d Difference, _ string) error {
		ref := classRef{ref: diffRef{seq: int(seq), n: int(n)}, rows: int64(max(1, d.Count))}
		vals, err := p.keyValues(d)
		if err != nil {
			unclassified = append(unclassified, ref)
			return nil
		}
		form := p.matchForm(vals)
		refs[form] = append(refs[form], ref)
		return nil
	})
	if err != nil {
		return err
	}
	// The last change of each differing key under each candidate order of the ledger's
	// key values (handleKey), and which orders fit every entry.
	h := &t.handle
	last := make([]map[string]uint64, len(h.orders))
	fits := make([]bool, len(h.orders))
	for o := range h.orders {
		last[o], fits[o] = map[string]uint64{}, true
	}
	errKey := errors.New("ledger key")
	err = rd.Scan(ctx, t.stored.upSchema, t.stored.upTable, since, ts, func(e ledger.Entry) error {
		for o := range h.orders {
			if !fits[o] {
				continue
			}
			k, ok := h.translate(p, o, e.Key)
			if !ok {
				fits[o] = false
				continue
			}
			vals, err := k.Values()
			if err != nil {
				return fmt.Errorf("%w: %v", errKey, err)
			}
			form := p.matchForm(vals)
			if _, ok := refs[form]; ok {
				last[o][form] = max(last[o][form], e.CommitTs)
			}
		}
		return nil
	})
	if err != nil {
		if ctx.Err() != nil {
			return err
		}
		// What the ledger cannot tell is unclassified, not a failed run.
		c.log.Warn("classification: the ledger of a table cannot be read; its differences unclassified", "table", t.name, "err", err)
		cl.note("%s: %v: its differences are unclassified", t.name, err)
		return c.classifyAll(ctx, t, ClassUnclassified)
	}
	order := -1
	for o, ok := range fits {
		if !ok {
			continue
		}
		if order >= 0 {
			cl.note("%s: the column order of its composite key in the changefeed's messages is ambiguous: its differences are unclassified", t.name)
			return c.classifyAll(ctx, t, ClassUnclassified)
		}
		order = o
	}
	if order < 0 {
		cl.note("%s: the changefeed's keys do not fit its key columns: its differences are unclassified", t.name)
		return c.classifyAll(ctx, t, ClassUnclassified)
	}
	byClass := map[string][]diffRef{}
	for form, rs := range refs {
		cts, changed := last[order][form]
		class := classOf(cts, changed, up)
		for _, ref := range rs {
			byClass[class] = append(byClass[class], ref.ref)
			counts[class] += ref.rows
		}
	}
	for _, ref := range unclassified {
		byClass[ClassUnclassified] = append(byClass[ClassUnclassified], ref.ref)
		counts[ClassUnclassified] += ref.rows
	}
	for class, rs := range byClass {
		if err := c.st.setClass(ctx, t.idx, class, rs); err != nil {
			return err
		}
	}
	c.track.classified(t.idx, counts)
	return nil
}

// classOf is the class of a difference found at a snapshot pair whose key the changefeed
// last changed at commit ts cts (changed false: not in the ledger's window), given when
// the applier caught up: imported when unchanged; post-import when changed before the
// applier first came within the caught-up lag of real time (or when it never has); cdc
// when changed at or after that, or when the ts-map is empty (not known: the change did
// come through the changefeed).
func classOf(cts uint64, changed bool, up ledger.CaughtUp) string {
	switch {
	case !changed:
		return ClassImported
	case up.Rows > 0 && (!up.Found || cts < up.Ts):
		return ClassPostImport
	}
	return ClassCDC
}

// matchForm is the form of a key's values (diffKeyColumns', keyValue's types) under which
// a difference's key and a ledger key are the same row's: character values folded as
// the key's collations allow (sameKey; exactly when they cannot be folded), DECIMAL by
// value (1.5 = 1.50) and temporal values without trailing fractional zeros (the text
// TiCDC sends and the text a server prints may spell them apart).
func (p *tablePlan) matchForm(vals []any) string {
	idx := p.diffKeyColumns()
	var dst []byte
	for i, v := range vals {
		c := p.Columns[idx[i]]
		s, isText := v.(string)
		switch {
		case isText && c.Kind == kindDecimal:
			v = canon(kindDecimal, stringValue(s))
		case isText && c.Kind == kindTemporal:
			if strings.Contains(s, ".") {
				v = strings.TrimRight(strings.TrimRight(s, "0"), ".")
			}
		case isText && c.Kind == kindString:
			if class := keyClass(c); class != rowkey.Opaque {
				if out, ok := rowkey.Append(dst, s, class); ok {
					dst = out
					continue
				}
			}
		}
		dst, _ = rowkey.Append(dst, v, rowkey.Exact)
	}
	return string(dst)
}

// setClassAll gives every stored difference of a table the same class.
func (s *store) setClassAll(ctx context.Context, table int, class string) error {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	if _, err := s.db.ExecContext(ctx, s.q("UPDATE %s.diff_differences SET class = ? WHERE run_id = ? AND table_idx = ? AND class <> ?"),
		class, s.runID, table, class); err != nil {
		return fmt.Errorf("store the class of the differences of table %d: %w", table, err)
	}
	return nil
}

// classBatch is how many differences one statement of setClass classifies.
const classBatch = 1000

// setClass stores the class of the given differences of a table.
func (s *store) setClass(ctx context.Context, table int, class string, refs []diffRef) error {
	for len(refs) > 0 {
		n := min(len(refs), classBatch)
		batch := refs[:n]
		refs = refs[n:]
		byChunk := map[int][]int{}
		var seqs []int
		for _, d := range batch {
			if _, ok := byChunk[d.seq]; !ok {
				seqs = append(seqs, d.seq)
			}
			byChunk[d.seq] = append(byChunk[d.seq], d.n)
		}
		var cond strings.Builder
		args := []any{class, s.runID, table}
		for i, seq := range seqs {
			if i > 0 {
				cond.WriteString(" OR ")
			}
			cond.WriteString("(chunk_seq = ? AND n IN (" + strings.TrimSuffix(strings.Repeat("?, ", len(byChunk[seq])), ", ") + "))")
			args = append(args, seq)
			for _, n := range byChunk[seq] {
				args = append(args, n)
			}
		}
		err := func() error {
			ctx, cancel := s.ctx(ctx)
			defer cancel()
			_, err := s.db.ExecContext(ctx, s.q("UPDATE %s.diff_differences SET class = ? WHERE run_id = ? AND table_idx = ? AND ("+cond.String()+")"), args...)
			return err
		}()
		if err != nil {
			return fmt.Errorf("store the class of differences of table %d: %w", table, err)
		}
	}
	return nil
}

// classifyBypass gives the differences whose key a write that bypassed parity changed
// (bypasslog: recorded in the applier's meta schema, with a commit time up to now)
// the class bypass, whatever class they had. Without the table (no detector ever ran)
// nothing changes; what cannot be read is a note, not a failed run.
func (c *classifier) classifyBypass(ctx context.Context, cl *Classification) (*Classification, error) {
	if c.cfg.Changefeed.ID == "" || c.cfg.Changefeed.MetaSchema == "" {
		return cl, nil
	}
	pending, _ := c.track.pending()
	until := time.Now()
	for _, t := range pending {
		if t.plan == nil {
			continue
		}
		ws, err := c.readBypass(ctx, t, until)
		if errors.Is(err, bypasslog.ErrNoTable) {
			return cl, nil
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, err
			}
			c.log.Warn("classification: the writes that bypassed parity cannot be read", "table", t.name, "err", err)
			if cl == nil {
				cl = &Classification{}
			}
			cl.note("%s: %v: writes that bypassed parity are not classified", t.name, err)
			continue
		}
		if len(ws) == 0 {
			continue
		}
		if err := c.classifyBypassTable(ctx, t, ws); err != nil {
			return nil, fmt.Errorf("classify the differences of %s: %w", t.name, err)
		}
	}
	return cl, nil
}

// readBypass reads the recorded bypass writes of t's downstream table: through the
// meta database when the applier's meta schema is there (it sees the newest
// detections), else through the downstream.
func (c *classifier) readBypass(ctx context.Context, t *target, until time.Time) ([]bypasslog.Write, error) {
	read := func(ctx context.Context, q Querier) ([]bypasslog.Write, error) {
		qctx, cancel := context.WithTimeout(ctx, c.cfg.QueryTimeout)
		defer cancel()
		return bypasslog.Read(qctx, q, c.cfg.Changefeed.MetaSchema, c.cfg.Changefeed.ID, t.stored.downSchema, t.stored.downName, time.Time{}, until)
	}
	if c.st != nil && c.st.db != nil {
		ws, err := read(ctx, c.st.db)
		if !errors.Is(err, bypasslog.ErrNoTable) {
			return ws, err
		}
	}
	var ws []bypasslog.Write
	err := c.pair.withSide(ctx, downSide, func(ctx context.Context, q Querier) error {
		var err error
		ws, err = read(ctx, q)
		return err
	})
	return ws, err
}

// classifyBypassTable moves the stored differences of t whose key is one of ws's to
// the class bypass, and their rows in the tracker's counts.
func (c *classifier) classifyBypassTable(ctx context.Context, t *target, ws []bypasslog.Write) error {
	p := t.plan
	forms := map[string]bool{}
	for _, w := range ws {
		if vals, ok := p.bypassKeyValues(w); ok { // else no key, or another key than the one compared
			forms[p.matchForm(vals)] = true
		}
	}
	if len(forms) == 0 {
		return nil
	}
	var refs []diffRef
	moved := map[string]int64{}
	limit := -1
	err := c.st.scanDifferences(ctx, t.idx, "", -1, -1, &limit, func(seq, n int64, d Difference, _ string) error {
		if d.Class == ClassBypass {
			return nil
		}
		vals, err := p.keyValues(d)
		if err != nil || !forms[p.matchForm(vals)] {
			return nil
		}
		refs = append(refs, diffRef{seq: int(seq), n: int(n)})
		moved[d.Class] += int64(max(1, d.Count))
		return nil
	})
	if err != nil || len(refs) == 0 {
		return err
	}
	if err := c.st.setClass(ctx, t.idx, ClassBypass, refs); err != nil {
		return err
	}
	c.track.reclassified(t.idx, moved, ClassBypass)
	return nil
}
