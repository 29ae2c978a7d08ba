// Package metaschema is the one migrator of parity's meta schema: the schema in the
// fallback MySQL where the applier keeps its checkpoint, offsets and DDL history, the
// checker its runs, chunks and differences, and the service parts to come their ledger,
// ts-map, schedules, leases and repairs. Tables that one part writes and another reads
// (the dirty-key ledger, the ts-map) are a documented contract in that one schema.
//
// Each part registers a Component (its name, its tables, its append-only steps) from its
// package's init; Migrate brings every registered component up to date under one version
// table, parity_migrations, and refuses a schema in which one of its components is at a
// version this binary does not have (written by a newer parity) instead of running
// against tables it does not understand. Components it does not link are left alone.
//
// It is its own package so that cdc and checker share it without importing each other;
// it knows nothing of either beyond what they register.
package metaschema

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/tidb-parity/parity/internal/ident"
)

// VersionTable records every applied step: (component, version, name, applied_at).
const VersionTable = "parity_migrations"

// LegacySealVersion is the version a component's LegacySeal records in its legacy
// version table: higher than any release before the shared table had, so those releases
// refuse the schema ("newer than this binary") instead of writing to tables whose rules
// they do not know.
const LegacySealVersion = 1000000

// Step is one migration step of a component. Its statements run in order; every "%s" in
// them is replaced by the quoted meta schema. Steps are append-only: never edit, reorder
// or remove one; add a new one.
type Step struct {
	Name  string
	Stmts []string
}

// Component is one part of parity's tables in the meta schema.
type Component struct {
	// Name identifies the component in the version table ("cdc", "checker").
	Name string
	// Legacy is the version table the component kept before the shared one (its rows
	// are versions of this component's steps); adopted once. Versions at or above
	// LegacySealVersion in it are not versions but the seal (see LegacySeal).
	Legacy string
	// LegacySeal are statements that make a release from before the shared version
	// table refuse this schema (or at least not take it for its own): typically create
	// the legacy table if missing and record LegacySealVersion in it, a version no such
	// release knows. Run after every migration, so fresh schemas are sealed too.
	LegacySeal []string
	// Tables lists the tables the component owns (Table accepts only these).
	Tables []string
	// Steps are the component's migrations, version i+1 at index i.
	Steps []Step
}

// Registry holds components. The package's functions use the one registry every
// package registers into; tests make their own.
type Registry struct {
	mu         sync.Mutex
	components map[string]Component
	owners     map[string]string // table → component
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{components: map[string]Component{}, owners: map[string]string{}}
}

var std = NewRegistry()

// Register adds a component to the registry Migrate uses; it is called from a package's
// init.
func Register(c Component) { std.Register(c) }

// Table is std's Table: the quoted name of a registered table in schema.
func Table(schema, table string) string { return std.Table(schema, table) }

// Versions is std's Versions.
func Versions() map[string]int { return std.Versions() }

// Migrate brings every component registered with Register up to date (see
// Registry.Migrate).
func Migrate(ctx context.Context, db *sql.DB, schema string, timeout time.Duration) error {
	return std.Migrate(ctx, db, schema, timeout)
}

// Register adds a component. It panics on a component or table registered twice (a
// programming error found at start-up).
func (r *Registry) Register(c Component) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c.Name == "" {
		panic("metaschema: a component needs a name")
	}
	if _, ok := r.components[c.Name]; ok {
		panic("metaschema: component " + c.Name + " registered twice")
	}
	for _, t := range c.Tables {
		if o, ok := r.owners[t]; ok {
			panic(fmt.Sprintf("metaschema: table %s registered by %s and %s", t, o, c.Name))
		}
		r.owners[t] = c.Name
	}
	r.components[c.Name] = c
}

// Table returns the quoted name of a registered table in schema: tests and tools name
// tables through it, never by a literal. It panics for a table no component registered.
func (r *Registry) Table(schema, table string) string {
	r.mu.Lock()
	_, ok := r.owners[table]
	r.mu.Unlock()
	if !ok && table != VersionTable {
		panic("metaschema: no component registered table " + table)
	}
	return ident.Table(schema, table)
}

// Q returns a statement of the meta schema with its schema filled in: the meta schema's
// statements (migrations and queries alike) name their tables "%s.table", and every "%s"
// in format becomes quoted, the meta schema's name as ident.Quote returns it.
func Q(quoted, format string) string { return strings.ReplaceAll(format, "%s", quoted) }

// Versions returns each registered component's latest version (what this binary writes).
func (r *Registry) Versions() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for n, c := range r.components {
		out[n] = len(c.Steps)
	}
	return out
}

// ErrNewer is returned when the meta schema was written by a newer parity.
var ErrNewer = errors.New("meta schema is newer than this binary")

// lockName serialises concurrent migrations of one schema (serve and a diff starting
// together); GET_LOCK is per server, so the name includes the schema.
func lockName(schema string) string { return "parity_migrate:" + schema }

// Migrate creates the meta schema if needed and brings every registered component up to
// date. timeout bounds each statement.
func (r *Registry) Migrate(ctx context.Context, db *sql.DB, schema string, timeout time.Duration) error {
	r.mu.Lock()
	comps := make([]Component, 0, len(r.components))
	for _, c := range r.components {
		comps = append(comps, c)
	}
	r.mu.Unlock()
	sort.Slice(comps, func(i, j int) bool { return comps[i].Name < comps[j].Name })

	m := &migrator{db: db, schema: ident.Quote(schema), raw: schema, timeout: timeout}
	if err := m.exec(ctx, "CREATE DATABASE IF NOT EXISTS "+m.schema); err != nil {
		return fmt.Errorf("creating meta schema %s: %w", schema, err)
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("migrating meta schema %s: %w", schema, err)
	}
	defer conn.Close()
	unlock := m.lock(ctx, conn)
	defer unlock()

	if err := m.exec(ctx, m.q(`CREATE TABLE IF NOT EXISTS %s.`+VersionTable+` (
		component VARCHAR(64) NOT NULL,
		version INT NOT NULL,
		name VARCHAR(255) NOT NULL,
		applied_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
		PRIMARY KEY (component, version)
	) ENGINE=InnoDB`)); err != nil {
		return fmt.Errorf("creating %s.%s: %w", schema, VersionTable, err)
	}
	have, err := m.versions(ctx)
	if err != nil {
		return err
	}
	for _, c := range comps {
		if _, ok := have[c.Name]; ok || c.Legacy == "" {
			continue
		}
		v, err := m.adopt(ctx, c)
		if err != nil {
			return err
		}
		if v > 0 {
			have[c.Name] = v
		}
	}
	known := map[string]int{}
	for _, c := range comps {
		known[c.Name] = len(c.Steps)
	}
	// A component this binary does not link (the checker's tables seen by a program
	// built with cdc alone, or a part a newer release added) is none of its business:
	// the tables it uses are the ones it knows, and those must not be newer.
	var newer []string
	for name, v := range have {
		if k, ok := known[name]; ok && v > k {
			newer = append(newer, fmt.Sprintf("component %q at version %d, this binary knows %d", name, v, k))
		}
	}
	if len(newer) > 0 {
		slices.Sort(newer)
		return fmt.Errorf("%w: %s: %s (run the parity release that wrote it, or a newer one)", ErrNewer, schema, strings.Join(newer, "; "))
	}
	for _, c := range comps {
		for v := have[c.Name] + 1; v <= len(c.Steps); v++ {
			st := c.Steps[v-1]
			for _, s := range st.Stmts {
				if err := m.exec(ctx, m.q(s)); err != nil && !alreadyDone(err) {
					return fmt.Errorf("meta migration %s %d (%s): %w", c.Name, v, st.Name, err)
				}
			}
			if err := m.exec(ctx, m.q("INSERT IGNORE INTO %s."+VersionTable+" (component, version, name) VALUES (?, ?, ?)"), c.Name, v, st.Name); err != nil {
				return fmt.Errorf("recording meta migration %s %d: %w", c.Name, v, err)
			}
		}
		for _, s := range c.LegacySeal {
			if err := m.exec(ctx, strings.ReplaceAll(m.q(s), "%v", strconv.Itoa(LegacySealVersion))); err != nil {
				return fmt.Errorf("sealing %s's legacy version table: %w", c.Name, err)
			}
		}
	}
	return nil
}

type migrator struct {
	db      *sql.DB
	schema  string // quoted
	raw     string
	timeout time.Duration
}

func (m *migrator) q(s string) string { return Q(m.schema, s) }

func (m *migrator) exec(ctx context.Context, q string, args ...any) error {
	ctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	_, err := m.db.ExecContext(ctx, q, args...)
	return err
}

// lock takes the schema's migration lock on conn when the server has GET_LOCK; without
// it migrations still converge (every step tolerates running twice, see alreadyDone).
func (m *migrator) lock(ctx context.Context, conn *sql.Conn) func() {
	lctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	var got sql.NullInt64
	if err := conn.QueryRowContext(lctx, "SELECT GET_LOCK(?, ?)", lockName(m.raw), int(m.timeout.Seconds())).Scan(&got); err != nil || got.Int64 != 1 {
		return func() {}
	}
	return func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = conn.ExecContext(rctx, "SELECT RELEASE_LOCK(?)", lockName(m.raw))
	}
}

// versions reads each component's highest applied version.
func (m *migrator) versions(ctx context.Context) (map[string]int, error) {
	ctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	rows, err := m.db.QueryContext(ctx, m.q("SELECT component, MAX(version) FROM %s."+VersionTable+" GROUP BY component"))
	if err != nil {
		return nil, fmt.Errorf("reading meta schema versions: %w", err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var c string
		var v int
		if err := rows.Scan(&c, &v); err != nil {
			return nil, fmt.Errorf("reading meta schema versions: %w", err)
		}
		out[c] = v
	}
	return out, rows.Err()
}

// adopt records the versions a component's legacy version table holds, returning the
// highest (0 when there is no legacy table). A legacy version beyond the component's
// steps is recorded too, so the newer-than check refuses it.
func (m *migrator) adopt(ctx context.Context, c Component) (int, error) {
	qctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	var n int
	if err := m.db.QueryRowContext(qctx, "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA=? AND TABLE_NAME=?", m.raw, c.Legacy).Scan(&n); err != nil {
		return 0, fmt.Errorf("looking for %s.%s: %w", m.raw, c.Legacy, err)
	}
	if n == 0 {
		return 0, nil
	}
	var v int
	if err := m.db.QueryRowContext(qctx, m.q("SELECT COALESCE(MAX(version),0) FROM %s."+ident.Quote(c.Legacy)+" WHERE version < ?"), LegacySealVersion).Scan(&v); err != nil {
		return 0, fmt.Errorf("reading %s.%s: %w", m.raw, c.Legacy, err)
	}
	for i := 1; i <= v; i++ {
		name := "adopted from " + c.Legacy
		if i <= len(c.Steps) {
			name = c.Steps[i-1].Name
		}
		if err := m.exec(ctx, m.q("INSERT IGNORE INTO %s."+VersionTable+" (component, version, name) VALUES (?, ?, ?)"), c.Name, i, name); err != nil {
			return 0, fmt.Errorf("adopting %s.%s: %w", m.raw, c.Legacy, err)
		}
	}
	return v, nil
}

// alreadyDone reports the errors a step gives when it ran before but was not recorded
// (a crash between the two, or two binaries migrating at once without GET_LOCK).
func alreadyDone(err error) bool {
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return false
	}
	switch me.Number {
	case 1050, // table exists
		1060, // duplicate column
		1061, // duplicate key name
		1091: // can't drop; check that it exists
		return true
	}
	return false
}
