package fleet

// config.go owns the fleet file: its members and what each owns, checked as a whole
// (every problem with its key path), and the ownership of TiDB's tables.

import (
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"
	"time"

	"github.com/tidb-parity/parity/api/client"
	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/internal/config"
)

// Config is a fleet file (deploy/fleet.example.toml).
type Config struct {
	Fleet   Settings `toml:"fleet"`
	Members []Member `toml:"member"`
}

// Settings are the fleet's own settings.
type Settings struct {
	// Name names the fleet in output and logs. Default: "fleet".
	Name string `toml:"name"`
	// Tables are the schema.table patterns of the tables the fleet answers for: each
	// must be owned by exactly one member. Default: ["*.*"].
	Tables []string `toml:"tables"`
	// CallTimeout bounds one call to a member that answers at once (status, starting a
	// run, listing). Default: 10s.
	CallTimeout time.Duration `toml:"call-timeout"`
	// Failover is how long a member may go unanswered (its daemon restarting, its
	// standby taking the lease) before the fleet gives up on it. Default: 1m.
	Failover time.Duration `toml:"failover"`
	// PointAttempts is how many TSOs a fleet point is tried at (a member that has
	// applied past T refuses it; the next T is newer). Default: 10.
	PointAttempts int `toml:"point-attempts"`
}

// Member is one fallback's daemon (and its standbys).
type Member struct {
	// Name names the member: the fallback server or shard. Required, unique.
	Name string `toml:"name"`
	// Addrs are the gRPC addresses of the member's daemons (the active one and its
	// standbys, any order): the fleet talks to whichever holds the lease. Required.
	Addrs []string `toml:"addrs"`
	// Owns are the schema.table patterns of the tables this member's fallback holds.
	// Required.
	Owns []string `toml:"owns"`
	// TokenFile holds the bearer token for the member's API. Default: none.
	TokenFile string `toml:"token-file"`
	// TLSCA, TLSCert, TLSKey and TLSServerName: TLS to the member's API (any set turns
	// it on). Default: plaintext.
	TLSCA         string `toml:"tls-ca"`
	TLSCert       string `toml:"tls-cert"`
	TLSKey        string `toml:"tls-key"`
	TLSServerName string `toml:"tls-server-name"`
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{Fleet: Settings{Name: "fleet", Tables: []string{"*.*"}, CallTimeout: 10 * time.Second,
		Failover: time.Minute, PointAttempts: 10}}
}

// Load reads a fleet file over the defaults and validates it.
func Load(path string) (Config, error) {
	cfg := DefaultConfig()
	if _, err := config.Load(path, &cfg, config.Options{}); err != nil {
		return Config{}, err
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, fmt.Errorf("fleet file %s: %w", path, err)
	}
	return cfg, nil
}

// Validate reports every problem of the file, each with its key path.
func (c Config) Validate() error {
	var errs []error
	bad := func(key, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, a...)))
	}
	s := c.Fleet
	if strings.TrimSpace(s.Name) == "" {
		bad("fleet.name", "must not be empty")
	}
	if len(s.Tables) == 0 {
		bad("fleet.tables", "must name at least one pattern")
	}
	for i, p := range s.Tables {
		if err := checkPattern(p); err != nil {
			bad(fmt.Sprintf("fleet.tables[%d]", i), "%v", err)
		}
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"fleet.call-timeout", s.CallTimeout}, {"fleet.failover", s.Failover}} {
		if d.v < time.Second {
			bad(d.key, "%v: want at least 1s", d.v)
		}
	}
	if s.PointAttempts < 1 || s.PointAttempts > 100 {
		bad("fleet.point-attempts", "%d: want 1 to 100", s.PointAttempts)
	}
	if len(c.Members) == 0 {
		bad("member", "the fleet has no members ([[member]] tables)")
	}
	names, addrs := map[string]int{}, map[string]string{}
	for i, m := range c.Members {
		key := fmt.Sprintf("member[%d]", i)
		if m.Name == "" {
			bad(key+".name", "must not be empty")
		} else if j, ok := names[m.Name]; ok {
			bad(key+".name", "%q is member[%d]'s name too", m.Name, j)
		} else {
			names[m.Name] = i
		}
		if len(m.Addrs) == 0 {
			bad(key+".addrs", "must name the member's daemon (host:port)")
		}
		for j, a := range m.Addrs {
			if _, _, err := net.SplitHostPort(a); err != nil {
				bad(fmt.Sprintf("%s.addrs[%d]", key, j), "want host:port, got %q", a)
			} else if other, ok := addrs[a]; ok {
				bad(fmt.Sprintf("%s.addrs[%d]", key, j), "%s is member %s's address too", a, other)
			} else {
				addrs[a] = m.Name
			}
		}
		if len(m.Owns) == 0 {
			bad(key+".owns", "must name the tables the member's fallback holds (schema.table patterns)")
		}
		for j, p := range m.Owns {
			if err := checkPattern(p); err != nil {
				bad(fmt.Sprintf("%s.owns[%d]", key, j), "%v", err)
			}
		}
		if m.TokenFile != "" && !m.client("").UsesTLS() {
			for j, a := range m.Addrs {
				if h, _, err := net.SplitHostPort(a); err == nil && !client.IsLoopbackHost(h) {
					bad(fmt.Sprintf("%s.addrs[%d]", key, j), "%s: %v (set %s.tls-ca)", a, client.ErrTokenInClear, key)
				}
			}
		}
	}
	return errors.Join(errs...)
}

// client is how the member's daemon at addr is dialed.
func (m Member) client(addr string) client.ClientConfig {
	return client.ClientConfig{Addr: addr, TLSCA: m.TLSCA, TLSCert: m.TLSCert, TLSKey: m.TLSKey, TLSServerName: m.TLSServerName, TokenFile: m.TokenFile}
}

// OwnershipError names every selected table owned by no member or by several: a table
// nobody verifies is a finding, not a silence.
type OwnershipError struct {
	// Unowned are the selected tables no member owns; Shared the tables several do,
	// with their owners.
	Unowned []string
	Shared  map[string][]string
}

func (e *OwnershipError) Error() string {
	var parts []string
	for _, t := range e.Unowned {
		parts = append(parts, fmt.Sprintf("table %s is owned by no member", t))
	}
	shared := make([]string, 0, len(e.Shared))
	for t := range e.Shared {
		shared = append(shared, t)
	}
	sort.Strings(shared)
	for _, t := range shared {
		parts = append(parts, fmt.Sprintf("table %s is owned by %s", t, strings.Join(e.Shared[t], " and ")))
	}
	return "fleet ownership: " + strings.Join(parts, "; ")
}

// Owners assigns each of tables ("schema.table", TiDB's tables the fleet selects) to
// the one member that owns it; a table owned by none or by several fails with an
// *OwnershipError naming them all.
func (c Config) Owners(tables []string) (map[string]string, error) {
	owner := map[string]string{}
	oe := &OwnershipError{Shared: map[string][]string{}}
	for _, t := range tables {
		sc, tb, _ := strings.Cut(t, ".")
		var by []string
		for _, m := range c.Members {
			if owns(m.Owns, sc, tb) {
				by = append(by, m.Name)
			}
		}
		switch len(by) {
		case 0:
			oe.Unowned = append(oe.Unowned, t)
		case 1:
			owner[t] = by[0]
		default:
			oe.Shared[t] = by
		}
	}
	if len(oe.Unowned) > 0 || len(oe.Shared) > 0 {
		return nil, oe
	}
	return owner, nil
}

func checkPattern(p string) error { return checker.CheckTablePattern(p) }

// owns reports whether a member owning patterns owns schema.table.
func owns(patterns []string, schema, table string) bool {
	for _, p := range patterns {
		if checker.MatchTable(p, schema, table) {
			return true
		}
	}
	return false
}
