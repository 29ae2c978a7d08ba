package bypass

// coverage.go owns what the detector vouches for: the stretches of watching it records
// (bypass_coverage, internal/bypasslog), how far it has read against the binlog's end
// (poll, reached: Status's position, CaughtUpAt and the lag) and Cover, which a scoped
// run or a cutover check waits on. It must not decode events (bypass.go's stream and rows.go do).

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/tidb-parity/parity/internal/bypasslog"
)

// lagLocked is how long ago the detector last had read the whole binlog (since Run
// started when it never had). d.mu is held.
func (d *Detector) lagLocked(now time.Time) time.Duration {
	from := d.st.CaughtUpAt
	if from.IsZero() {
		from = d.started
	}
	return max(0, now.Sub(from))
}

// ErrNotWatching is returned by Cover when the detector has no stretch of watching to
// vouch for (it has not started reading yet).
var ErrNotWatching = errors.New("the bypass detector is not watching the binlog yet")

// Cover waits until the detector has read every transaction the fallback's binlog held
// when Cover was called, with its detections saved, and returns what it vouches for:
// the current stretch of watching (bypasslog.Coverage). It fails when ctx ends first
// (the detector is behind or cannot read: the error says how far it had read).
func (d *Detector) Cover(ctx context.Context) (bypasslog.Coverage, error) {
	d.waiters.Add(1)
	defer d.waiters.Add(-1)
	called := time.Now()
	for {
		d.mu.Lock()
		st, ch := d.st, d.caught
		d.mu.Unlock()
		if st.CaughtUpAt.After(called) {
			if st.WatchedSince.IsZero() {
				return bypasslog.Coverage{}, ErrNotWatching
			}
			return bypasslog.Coverage{Since: st.WatchedSince, Reason: st.WatchedReason, Through: st.CaughtUpAt, ThroughPosition: st.BinlogEnd}, nil
		}
		select {
		case <-ctx.Done():
			msg := fmt.Sprintf("the bypass detector has not read the fallback's binlog up to its end (state %s, read up to %s, binlog end %s, last caught up %s)",
				st.State, orNone(st.Position), orNone(st.BinlogEnd), orNever(st.CaughtUpAt))
			if st.LastError != "" {
				msg += ", last error: " + st.LastError
			}
			return bypasslog.Coverage{}, fmt.Errorf("%s: %w", msg, ctx.Err())
		case <-ch:
		}
	}
}

// ceilMicro rounds t up to the microsecond (what DATETIME(6) keeps): a stretch of
// watching never claims an instant before it began.
func ceilMicro(t time.Time) time.Time {
	if r := t.Truncate(time.Microsecond); !r.Equal(t) {
		return r.Add(time.Microsecond)
	}
	return t
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func orNever(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// loadCoverage reads the current stretch of watching.
func (s *session) loadCoverage(ctx context.Context) (bypasslog.Coverage, bool, error) {
	ctx, cancel := s.qctx(ctx)
	defer cancel()
	c, ok, err := bypasslog.ReadCoverage(ctx, s.db, s.d.cfg.MetaSchema, s.d.cfg.Changefeed)
	if err != nil {
		return c, false, fmt.Errorf("bypass: %w", err)
	}
	return c, ok, nil
}

// coverPoll is how often the binlog's end is asked while Cover waits.
const coverPoll = 20 * time.Millisecond

// pollEvery is how often the binlog's end is asked: every save-interval, and every
// coverPoll while a Cover waits.
func (d *Detector) pollEvery() time.Duration {
	if d.waiters.Load() > 0 {
		return min(coverPoll, d.cfg.SaveInterval)
	}
	return d.cfg.SaveInterval
}

// poll asks the fallback where its binlog ends (at most every pollEvery, and only once
// the previous end was reached) and publishes how far the detector has read: Status's
// position and the binlog's end; reached does the rest. cur is the transaction being
// read, if any.
func (s *session) poll(ctx context.Context, cur *txn) error {
	d := s.d
	if s.hasTarget || time.Since(s.polled) < d.pollEvery() {
		s.reached(cur)
		return nil
	}
	asked := time.Now()
	end, err := s.currentEnd(ctx)
	if err != nil {
		return err
	}
	s.polled, s.target, s.hasTarget = asked, end, true
	d.mu.Lock()
	d.st.Position, d.st.GTID, d.st.EventTime = s.read.String(), s.read.GTID, s.read.Time
	d.st.BinlogEnd = end.String()
	d.mu.Unlock()
	s.reached(cur)
	return nil
}

// reached publishes, once the detector has read up to the binlog's end as last asked
// with no detection left unsaved, the time it was asked as CaughtUpAt: every
// transaction committed before then is read (Cover's and the lag's reference). Under a
// steady load the end moves on while it is read; each end asked is still reached soon
// after.
func (s *session) reached(cur *txn) {
	if !s.hasTarget || cur != nil || len(s.pending) > 0 || s.seen.before(s.target) {
		return
	}
	s.hasTarget = false
	d := s.d
	d.mu.Lock()
	d.st.Position, d.st.GTID, d.st.EventTime = s.read.String(), s.read.GTID, s.read.Time
	d.st.CaughtUpAt = s.polled
	close(d.caught)
	d.caught = make(chan struct{})
	d.mu.Unlock()
}

// before reports whether p is an earlier place in the binlog than q: files compare by
// their sequence number (the suffix after the last dot), then by position.
func (p position) before(q position) bool {
	if p.File != q.File {
		pn, perr := strconv.ParseUint(p.File[strings.LastIndexByte(p.File, '.')+1:], 10, 64)
		qn, qerr := strconv.ParseUint(q.File[strings.LastIndexByte(q.File, '.')+1:], 10, 64)
		if perr != nil || qerr != nil {
			return p.File < q.File
		}
		return pn < qn
	}
	return p.Pos < q.Pos
}
