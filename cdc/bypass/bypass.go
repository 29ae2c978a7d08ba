// Package bypass detects writes that bypass parity: it reads the fallback's binlog (as a
// replica would, with go-mysql-org/go-mysql's replication client) and records every row
// change of a replicated table made by a transaction parity's applier did not write.
//
// A fallback must change only through parity; a job, a person or an application pointed
// at the wrong host breaks that silently, and a later diff would report the damage as
// an ordinary difference. parity's own transactions carry a marker (a row of
// <meta>.write_marker written in the same transaction, internal/bypasslog); every other
// transaction with row events on a watched table is a bypass write. Detections go to
// <meta>.bypass_writes together with the position to resume from (one transaction), to
// the log (table, kind, GTID, position; never the key's values), to Status and to
// Prometheus; the checker classifies the differences of their keys as "bypass".
//
// It is its own package because it is its own reader of the fallback, with its own
// connection, failure modes (the binlog purged, the fallback restarting) and lifetime;
// it shares nothing with the applier beyond the meta schema's contract, and a problem
// here never stops replication from the changefeed... except a configuration the
// detector cannot work with (binlog off, binlog_format not ROW), reported at start.
package bypass

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
	"github.com/go-sql-driver/mysql"

	"github.com/tidb-parity/parity/internal/bypasslog"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/metaschema"
)

// maxTxnChanges bounds the changes one transaction records (the rest are counted and
// logged, not recorded): a bulk job on the fallback must not exhaust parity's memory.
const maxTxnChanges = 100000

// recentKept is how many detections Status lists.
const recentKept = 20

// Detection is one recorded change (Status).
type Detection struct {
	Table    string    `json:"table"` // schema.table in the fallback
	Kind     string    `json:"kind"`
	Key      string    `json:"key"`
	GTID     string    `json:"gtid,omitempty"`
	Position string    `json:"position"` // binlog file:pos where the transaction ends
	ServerID uint32    `json:"server_id"`
	Time     time.Time `json:"time"` // the binlog's commit time
	Detected time.Time `json:"detected_at"`
}

// Status is the detector's state for /status.
type Status struct {
	// State is starting, reading, reconnecting or stopped.
	State string `json:"state"`
	// Position is where the detector has read up to (binlog file:pos; it advances with
	// every transaction read), GTID the last transaction read, EventTime its commit time.
	Position  string    `json:"position,omitempty"`
	GTID      string    `json:"gtid,omitempty"`
	EventTime time.Time `json:"event_time,omitzero"`
	// BinlogEnd is the fallback's binlog end when it was last asked (every
	// bypass.save-interval while reading); CaughtUpAt the last time the detector had
	// read everything the binlog held (a time before which every transaction is read);
	// LagSeconds is now - CaughtUpAt: it grows while the detector falls behind or cannot
	// read at all (parity_bypass_lag_seconds).
	BinlogEnd  string    `json:"binlog_end,omitempty"`
	CaughtUpAt time.Time `json:"caught_up_at,omitzero"`
	LagSeconds float64   `json:"lag_seconds"`
	// WatchedSince starts the current stretch of continuous watching (the newest row of
	// <meta>.bypass_coverage): writes before it may have been missed, and a cutover
	// check does not vouch for a table whose window starts earlier. WatchedReason says
	// why the stretch started there.
	WatchedSince  time.Time `json:"watched_since,omitzero"`
	WatchedReason string    `json:"watched_reason,omitempty"`
	// Detections counts the changes recorded since the process started; Recent lists
	// the latest ones, newest first.
	Detections int64       `json:"detections"`
	Recent     []Detection `json:"recent,omitempty"`
	// LastDetectionTime is the commit time of the newest recorded change (also from
	// before a restart).
	LastDetectionTime time.Time `json:"last_detection_time,omitzero"`
	LastError         string    `json:"last_error,omitempty"`
}

// Detector reads the fallback's binlog; see the package comment.
type Detector struct {
	cfg Config
	log *slog.Logger
	my  *mysql.Config

	mu      sync.Mutex
	st      Status
	byTable map[string]int64 // detections per schema.table since start (metrics)
	up      bool
	caught  chan struct{} // closed and replaced whenever CaughtUpAt moves (Cover waits on it)
	waiters atomic.Int32  // Cover calls waiting: the binlog's end is then asked every coverPoll
	started time.Time     // when Run started: the lag before the first catch-up counts from it
}

// New returns a Detector; cfg is checked (Config.Checked) unless it already was. Run
// does the work.
func New(cfg Config, log *slog.Logger) (*Detector, error) {
	cfg, err := cfg.Checked()
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	my, err := mysql.ParseDSN(cfg.DSN)
	if err != nil {
		return nil, fmt.Errorf("downstream.dsn: %w", err)
	}
	return &Detector{cfg: cfg, log: log.With("component", "bypass"), my: my, st: Status{State: "starting"}, byTable: map[string]int64{},
		caught: make(chan struct{}), started: time.Now()}, nil
}

// Status returns the detector's state.
func (d *Detector) Status() Status {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.st
	s.Recent = slices.Clone(s.Recent)
	s.LagSeconds = d.lagLocked(time.Now()).Seconds()
	return s
}

func (d *Detector) setState(state string, err error) {
	d.mu.Lock()
	d.st.State = state
	d.up = state == "reading"
	if err != nil {
		d.st.LastError = err.Error()
	}
	d.mu.Unlock()
}

// position is a place in the binlog: the end of a transaction.
type position struct {
	File string
	Pos  uint32
	GTID string
	Time time.Time
}

func (p position) String() string { return fmt.Sprintf("%s:%d", p.File, p.Pos) }

// Run reads the binlog until ctx ends (then it returns nil), reconnecting from the last
// transaction it finished after a broken connection. It fails at start for a fallback
// without a ROW binlog, and when the position to resume from was purged (detections
// would be missed silently otherwise: the error says how to restart from the current
// end).
func (d *Detector) Run(ctx context.Context) error {
	db, err := sql.Open("mysql", d.cfg.DSN)
	if err != nil {
		return fmt.Errorf("bypass: open the fallback: %w", err)
	}
	defer db.Close()
	db.SetMaxOpenConns(2)
	defer d.setState("stopped", nil)
	s := &session{d: d, db: db, tables: map[[2]string]*tableInfo{}, metaSchemas: map[string]bool{}, ddlThreads: map[uint32]bool{}}
	flavor, err := s.checkServer(ctx)
	if err != nil {
		return err
	}
	if err := metaschema.Migrate(ctx, db, d.cfg.MetaSchema, d.cfg.QueryTimeout); err != nil {
		return fmt.Errorf("bypass: %w", err)
	}
	pos, found, err := s.loadPosition(ctx)
	if err != nil {
		return err
	}
	cov, covered, err := s.loadCoverage(ctx)
	if err != nil {
		return err
	}
	switch {
	case !found:
		if pos, err = s.currentEnd(ctx); err != nil {
			return err
		}
		reason := "first start"
		if covered {
			reason = "the saved binlog position was missing (deleted after a purge, or reset): the binlog since " + cov.Since.UTC().Format(time.RFC3339) + " was not all read"
		}
		cov = bypasslog.Coverage{Since: ceilMicro(pos.Time), SincePosition: pos.String(), Reason: reason}
		// Saved before the first event is read: a restart resumes here, not at a later end.
		if err := s.save(ctx, pos, nil, &cov); err != nil {
			return err
		}
		d.log.Info("bypass detection starts at the binlog's current end", "changefeed", d.cfg.Changefeed, "position", pos.String(), "reason", reason)
	case !covered:
		// A position saved by a release that did not record coverage: when its watching
		// began is unknown, so it is vouched for from now.
		end, err := s.currentEnd(ctx)
		if err != nil {
			return err
		}
		cov = bypasslog.Coverage{Since: ceilMicro(end.Time), SincePosition: pos.String(), Reason: "no coverage recorded before (an earlier release): watched from now"}
		if err := s.save(ctx, pos, nil, &cov); err != nil {
			return err
		}
		d.log.Info("bypass detection resumes; its coverage is recorded from now", "changefeed", d.cfg.Changefeed, "position", pos.String())
	default:
		d.log.Info("bypass detection resumes", "changefeed", d.cfg.Changefeed, "position", pos.String(), "gtid", pos.GTID,
			"watched_since", cov.Since)
	}
	if err := s.loadLast(ctx); err != nil {
		return err
	}
	d.mu.Lock()
	d.st.Position, d.st.GTID, d.st.EventTime = pos.String(), pos.GTID, pos.Time
	d.st.WatchedSince, d.st.WatchedReason = cov.Since, cov.Reason
	d.mu.Unlock()
	s.saved = pos
	backoff := d.cfg.ReconnectBackoff
	lastPrune := time.Time{}
	for {
		if time.Since(lastPrune) > time.Hour {
			if err := s.prune(ctx); err != nil && ctx.Err() == nil {
				d.log.Warn("bypass: pruning old detections failed", "changefeed", d.cfg.Changefeed, "err", err)
			}
			lastPrune = time.Now()
		}
		start := time.Now()
		err := s.stream(ctx, flavor, pos)
		pos = s.read // what was read, even if not saved yet (pending detections stay)
		if ctx.Err() != nil {
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.QueryTimeout)
			ferr := s.flush(fctx, true)
			cancel()
			return ferr
		}
		var me *gomysql.MyError
		if errors.As(err, &me) && me.Code == gomysql.ER_MASTER_FATAL_ERROR_READING_BINLOG {
			return fmt.Errorf("bypass: the fallback cannot send its binlog from %s (purged?): %v; writes since then cannot be checked — "+
				"to start again from the binlog's current end, delete the changefeed's row of %s", pos, me,
				ident.Table(d.cfg.MetaSchema, bypasslog.PositionTable))
		}
		if time.Since(start) > time.Minute {
			backoff = d.cfg.ReconnectBackoff
		}
		d.setState("reconnecting", err)
		// err.Error(): go-mysql's errors print their stack under %+v, which slog uses.
		d.log.Warn("bypass: reading the binlog failed, reconnecting", "changefeed", d.cfg.Changefeed, "position", pos.String(), "backoff", backoff, "err", err.Error())
		select {
		case <-ctx.Done():
			continue
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// session is one Run's state.
type session struct {
	d  *Detector
	db *sql.DB

	tables      map[[2]string]*tableInfo
	metaSchemas map[string]bool

	read      position // the end of the last transaction read
	seen      position // the end of the last event handled outside a transaction (at or after read)
	saved     position
	pending   []change // detections not saved yet
	dirty     bool     // read moved past saved by a transaction that was not the detector's own
	lastSav   time.Time
	polled    time.Time // when the binlog's end was last asked
	target    position  // that end, until it is reached (hasTarget)
	hasTarget bool

	// ddlThreads are the connections parity marked for its DDL (bypasslog.MarkDDLSQL):
	// the next DDL query event from one of them is parity's.
	ddlThreads map[uint32]bool
}

// change is one detected row change, before it is saved.
type change struct {
	at      position
	seq     int
	server  uint32
	schema  string
	table   string
	kind    string
	columns []string
	values  [][]byte
	text    string
}

func (s *session) qctx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.d.cfg.QueryTimeout)
}

// checkServer checks the binlog is on and ROW, and returns go-mysql's flavor.
func (s *session) checkServer(ctx context.Context) (string, error) {
	ctx, cancel := s.qctx(ctx)
	defer cancel()
	var version, format string
	var logBin int
	if err := s.db.QueryRowContext(ctx, "SELECT VERSION(), @@log_bin, @@binlog_format").Scan(&version, &logBin, &format); err != nil {
		return "", fmt.Errorf("bypass: read the fallback's binlog settings: %w", err)
	}
	if logBin != 1 {
		return "", errors.New("bypass: the fallback's binary log is off (log_bin): bypass detection reads it; turn it on or set bypass.enabled = false")
	}
	if !strings.EqualFold(format, "ROW") {
		return "", fmt.Errorf("bypass: the fallback's binlog_format is %s: bypass detection needs ROW", format)
	}
	if strings.Contains(strings.ToLower(version), "mariadb") {
		return gomysql.MariaDBFlavor, nil
	}
	return gomysql.MySQLFlavor, nil
}

// currentEnd is where the binlog ends now.
func (s *session) currentEnd(ctx context.Context) (position, error) {
	ctx, cancel := s.qctx(ctx)
	defer cancel()
	rows, err := s.db.QueryContext(ctx, "SHOW MASTER STATUS")
	if err != nil {
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == 1064 { // MySQL 8.4: renamed
			rows, err = s.db.QueryContext(ctx, "SHOW BINARY LOG STATUS")
		}
		if err != nil {
			return position{}, fmt.Errorf("bypass: read the binlog's position (needs BINLOG MONITOR or REPLICATION CLIENT): %w", err)
		}
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return position{}, err
	}
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return position{}, fmt.Errorf("bypass: read the binlog's position: %w", err)
		}
		return position{}, errors.New("bypass: SHOW MASTER STATUS returned nothing: is the fallback's binary log on?")
	}
	vals := make([]sql.RawBytes, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	if err := rows.Scan(ptrs...); err != nil {
		return position{}, fmt.Errorf("bypass: read the binlog's position: %w", err)
	}
	pos, err := strconv.ParseUint(string(vals[1]), 10, 32)
	if err != nil {
		return position{}, fmt.Errorf("bypass: binlog position %q: %w", vals[1], err)
	}
	return position{File: string(vals[0]), Pos: uint32(pos), Time: time.Now().UTC()}, rows.Err()
}

// txn is the transaction being read.
type txn struct {
	gtid    string
	marked  bool
	own     bool // every row event so far is the detector's own position or detections
	rows    bool
	changes []change
	dropped int
}

// stream reads from pos until ctx ends or the connection breaks.
func (s *session) stream(ctx context.Context, flavor string, pos position) error {
	d := s.d
	host, portText, err := net.SplitHostPort(d.my.Addr)
	if err != nil {
		return fmt.Errorf("downstream.dsn: address %q: %w", d.my.Addr, err)
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil {
		return fmt.Errorf("downstream.dsn: port %q: %w", portText, err)
	}
	syncer := replication.NewBinlogSyncer(replication.BinlogSyncerConfig{
		ServerID:                d.cfg.ServerID,
		Flavor:                  flavor,
		Host:                    host,
		Port:                    uint16(port),
		User:                    d.my.User,
		Password:                d.my.Passwd,
		TLSConfig:               d.my.TLS,
		TimestampStringLocation: time.UTC,
		HeartbeatPeriod:         5 * time.Second,
		ReadTimeout:             30 * time.Second,
		DisableRetrySync:        true, // Run reconnects from the last whole transaction
		Logger:                  slog.New(slog.DiscardHandler),
	})
	defer syncer.Close()
	st, err := syncer.StartSync(gomysql.Position{Name: pos.File, Pos: pos.Pos})
	if err != nil {
		return fmt.Errorf("start reading the binlog at %s: %w", pos, err)
	}
	s.read, s.seen = pos, pos
	d.setState("reading", nil)
	file := pos.File
	var cur *txn
	tick := time.NewTicker(d.cfg.SaveInterval)
	defer tick.Stop()
	for {
		ectx, cancel := context.WithTimeout(ctx, d.pollEvery())
		ev, err := st.GetEvent(ectx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, context.DeadlineExceeded) {
				if err := s.flush(ctx, false); err != nil {
					return err
				}
				if err := s.poll(ctx, cur); err != nil {
					return err
				}
				continue
			}
			return err
		}
		h := ev.Header
		switch e := ev.Event.(type) {
		case *replication.RotateEvent:
			file = string(e.NextLogName)
			if h.Timestamp != 0 || h.LogPos != 0 { // a real rotate: the next file starts
				s.read = position{File: file, Pos: uint32(e.Position), GTID: s.read.GTID, Time: s.read.Time}
				s.seen = s.read
			}
			continue
		case *replication.MariadbGTIDEvent:
			cur = &txn{gtid: e.GTID.String(), own: true}
		case *replication.GTIDEvent:
			cur = &txn{gtid: gtidOf(e), own: true}
		case *replication.QueryEvent:
			q := strings.TrimSpace(string(e.Query))
			switch {
			case strings.EqualFold(q, "BEGIN"):
				if cur == nil {
					cur = &txn{own: true}
				}
				continue
			case strings.EqualFold(q, "COMMIT"): // a transaction of non-transactional tables
			default: // DDL (its own transaction): forget what was read of the tables
				clear(s.tables)
				clear(s.metaSchemas)
				if s.ddlThreads[e.SlaveProxyID] { // one mark, one DDL
					delete(s.ddlThreads, e.SlaveProxyID)
				} else {
					if cur == nil {
						cur = &txn{own: true}
					}
					s.ddl(ctx, cur, string(e.Schema), q)
				}
			}
			s.commit(cur, file, h)
			cur = nil
		case *replication.RowsEvent:
			if cur == nil {
				cur = &txn{own: true}
			}
			s.rows(ctx, cur, h, e)
			continue
		case *replication.XIDEvent:
			s.commit(cur, file, h)
			cur = nil
		default:
			if cur == nil && h.LogPos != 0 { // between transactions (format description, GTID list, checkpoint, ...)
				s.seen = position{File: file, Pos: h.LogPos, GTID: s.read.GTID, Time: s.read.Time}
			}
			continue
		}
		if len(s.pending) > 0 {
			if err := s.flush(ctx, false); err != nil {
				return err
			}
		}
		if len(s.pending) == 0 {
			s.seen = s.read
		}
		select {
		case <-tick.C:
			if err := s.flush(ctx, false); err != nil {
				return err
			}
		default:
		}
		if err := s.poll(ctx, cur); err != nil {
			return err
		}
	}
}
