package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"

	"github.com/go-sql-driver/mysql"

	"github.com/tidb-parity/parity/api"
	"github.com/tidb-parity/parity/cdc"
	"github.com/tidb-parity/parity/cdc/bypass"
	"github.com/tidb-parity/parity/checker/verify"
	"github.com/tidb-parity/parity/internal/instance"
)

// Config is the `parity serve` configuration file (deploy/parity.example.toml).
type Config struct {
	Changefeed cdc.ChangefeedConfig `toml:"changefeed"`
	Upstream   cdc.UpstreamConfig   `toml:"upstream"`
	Downstream cdc.DownstreamConfig `toml:"downstream"`
	Applier    cdc.ApplierConfig    `toml:"applier"`
	Log        LogConfig            `toml:"log"`
	Status     StatusConfig         `toml:"status"`
	// Verify runs verification beside the applier (checker/verify, docs/verify.md).
	Verify verify.Config `toml:"verify"`
	// API is the gRPC API (api/README.md).
	API api.Config `toml:"api"`
	// Bypass detects writes to the fallback that bypass parity (cdc/bypass,
	// docs/reliability.md).
	Bypass bypass.Config `toml:"bypass"`
	// HA makes the daemon the active or a standby one of several configured for the
	// same changefeed and fallback (docs/reliability.md).
	HA cdc.HAConfig `toml:"ha"`
}

// LogConfig is [log].
type LogConfig struct {
	// Level is debug, info, warn or error.
	// Default: "info"
	Level string `toml:"level"`
	// Format is text or json.
	// Default: "text"
	Format string `toml:"format"`
}

// StatusConfig is [status].
type StatusConfig struct {
	// Addr is the HTTP address serving /metrics (Prometheus) and /status (JSON, read by
	// `parity status`), and with verify.enabled the verification endpoints (POST
	// /verify/run, GET /verify/runs, POST /repair: loopback clients only). Empty disables it.
	// Default: "127.0.0.1:8390"
	Addr string `toml:"addr"`
	// Pprof mounts Go's net/http/pprof handlers under /debug/pprof/ on the status
	// server, for profiling a running daemon. Keep the address on loopback when set.
	// Default: false
	Pprof bool `toml:"pprof"`
}

// DefaultConfig returns the defaults of every section.
func DefaultConfig() Config {
	c := cdc.DefaultConfig()
	return Config{
		Changefeed: c.Changefeed,
		Downstream: c.Downstream,
		Applier:    c.Applier,
		Log:        LogConfig{Level: "info", Format: "text"},
		Status:     StatusConfig{Addr: "127.0.0.1:8390"},
		Verify:     verify.DefaultConfig(),
		API:        api.DefaultConfig(),
		Bypass:     bypass.DefaultConfig(),
		HA:         c.HA,
	}
}

// Parts are the components' configs, each derived from Config in one place: what they
// share (the changefeed, the daemon's name, both servers, the meta schema) is copied
// from the one key that sets it.
type Parts struct {
	// Instance is the daemon's one name, in the lease and in verification's history:
	// ha.instance, or verify.instance when only that is set, or "<hostname>:<pid>".
	Instance string
	CDC      cdc.Config
	Verify   verify.Config
	Bypass   bypass.Config
	API      api.Config
}

// Parts derives the components' configs.
func (c Config) Parts() Parts {
	name := c.HA.Instance
	if name == "" {
		name = c.Verify.Instance
	}
	if name == "" {
		name = instance.DefaultInstance()
	}
	p := Parts{Instance: name, API: c.API}

	a := c.Applier
	a.TSMapInterval = c.Verify.TSMapInterval
	ha := c.HA
	ha.Instance = name
	p.CDC = cdc.Config{Changefeed: c.Changefeed, Upstream: c.Upstream, Downstream: c.Downstream, Applier: a, HA: ha}

	v := c.Verify
	v.Changefeed, v.UpstreamDSN, v.DownstreamDSN, v.MetaSchema = c.Changefeed.ID, c.Upstream.DSN, c.Downstream.DSN, c.Applier.MetaSchema
	v.Instance = name
	p.Verify = v

	b := c.Bypass
	b.DSN, b.MetaSchema, b.Changefeed = c.Downstream.DSN, c.Applier.MetaSchema, c.Changefeed.ID
	p.Bypass = b
	return p
}

// Validate reports every problem with its TOML key path, the TLS certificate files
// included (they are read).
func (c Config) Validate() error {
	_, _, err := c.check()
	return err
}

// check is the configuration's one check: every part is validated once and returned
// checked (cdc.Config.Checked, verify.Config.Checked, bypass.Config.Checked), so the
// components take them as they are, with [upstream.tls] and [downstream.tls] applied to
// the DSNs every part connects with. The returned Config has those DSNs too.
func (c Config) check() (Config, Parts, error) {
	var errs []error
	cc, err := c.Parts().CDC.Checked()
	if err != nil {
		errs = append(errs, err)
	} else {
		c.Upstream, c.Downstream = cc.Upstream, cc.Downstream
	}
	p := c.Parts()
	if err == nil {
		p.CDC = cc
	}
	if p.Verify, err = p.Verify.Checked(); err != nil {
		errs = append(errs, err)
	}
	if err := c.API.Validate(); err != nil {
		errs = append(errs, err)
	}
	if p.Bypass, err = p.Bypass.Checked(); err != nil {
		errs = append(errs, err)
	}
	if c.HA.Instance != "" && c.Verify.Instance != "" && c.HA.Instance != c.Verify.Instance {
		errs = append(errs, fmt.Errorf("ha.instance: %q differs from verify.instance %q: a daemon has one name (set one of them)", c.HA.Instance, c.Verify.Instance))
	}
	if _, err := parseLevel(c.Log.Level); err != nil {
		errs = append(errs, fmt.Errorf("log.level: %w", err))
	}
	if c.Log.Format != "text" && c.Log.Format != "json" {
		errs = append(errs, fmt.Errorf("log.format: want text or json, got %q", c.Log.Format))
	}
	if c.Status.Addr != "" {
		if _, _, err := net.SplitHostPort(c.Status.Addr); err != nil {
			errs = append(errs, fmt.Errorf("status.addr: %w", err))
		}
	}
	return c, p, errors.Join(errs...)
}

// TLSWarnings are the warnings about [changefeed.tls], [upstream.tls] and
// [downstream.tls] (cdc.Config.TLSWarnings).
func (c Config) TLSWarnings() []string { return c.Parts().CDC.TLSWarnings() }

// Redacted returns c with the passwords of its DSNs and of changefeed.sasl replaced.
func (c Config) Redacted() Config {
	red := func(dsn string) string {
		mc, err := mysql.ParseDSN(dsn)
		if err != nil || mc.Passwd == "" {
			return dsn
		}
		mc.Passwd = "REDACTED"
		return mc.FormatDSN()
	}
	c.Upstream.DSN = red(c.Upstream.DSN)
	c.Downstream.DSN = red(c.Downstream.DSN)
	if c.Changefeed.SASL.Password != "" {
		c.Changefeed.SASL.Password = "REDACTED"
	}
	return c
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(s))
	return l, err
}

// NewLogger returns the logger [log] describes, writing to stderr.
func NewLogger(c LogConfig) *slog.Logger {
	lvl, _ := parseLevel(c.Level)
	opts := &slog.HandlerOptions{Level: lvl}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}
