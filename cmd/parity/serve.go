package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/go-sql-driver/mysql"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/tidb-parity/parity/api"
	"github.com/tidb-parity/parity/cdc"
	"github.com/tidb-parity/parity/cdc/bypass"
	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/checker/verify"
	"github.com/tidb-parity/parity/internal/config"
)

// Environment variables that override the config file (flags override both).
const (
	envUpstreamDSN       = "PARITY_UPSTREAM_DSN"
	envDownstreamDSN     = "PARITY_DOWNSTREAM_DSN"
	envKafkaSASLPassword = "PARITY_KAFKA_SASL_PASSWORD"
)

// serveConfig is the `parity serve` configuration file.
type serveConfig struct {
	Changefeed cdc.ChangefeedConfig `toml:"changefeed"`
	Upstream   cdc.UpstreamConfig   `toml:"upstream"`
	Downstream cdc.DownstreamConfig `toml:"downstream"`
	Applier    cdc.ApplierConfig    `toml:"applier"`
	Log        logConfig            `toml:"log"`
	Status     statusConfig         `toml:"status"`
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

type logConfig struct {
	// Level is debug, info, warn or error.
	// Default: "info"
	Level string `toml:"level"`
	// Format is text or json.
	// Default: "text"
	Format string `toml:"format"`
}

type statusConfig struct {
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

func defaultServeConfig() serveConfig {
	c := cdc.DefaultConfig()
	return serveConfig{
		Changefeed: c.Changefeed,
		Downstream: c.Downstream,
		Applier:    c.Applier,
		Log:        logConfig{Level: "info", Format: "text"},
		Status:     statusConfig{Addr: "127.0.0.1:8390"},
		Verify:     verify.DefaultConfig(),
		API:        api.DefaultConfig(),
		Bypass:     bypass.DefaultConfig(),
		HA:         c.HA,
	}
}

// bypass is the bypass detector's config: [bypass] and what it shares with the applier.
func (c serveConfig) bypass() bypass.Config {
	b := c.Bypass
	b.DSN, b.MetaSchema, b.Changefeed = c.Downstream.DSN, c.Applier.MetaSchema, c.Changefeed.ID
	return b
}

func (c serveConfig) cdc() cdc.Config {
	a := c.Applier
	a.TSMapInterval = c.Verify.TSMapInterval
	ha := c.HA
	ha.Instance = c.instance()
	return cdc.Config{Changefeed: c.Changefeed, Upstream: c.Upstream, Downstream: c.Downstream, Applier: a, HA: ha}
}

// instance is the daemon's one name, in the lease and in verification's history:
// ha.instance, or verify.instance when only that is set ("": both default to
// "<hostname>:<pid>").
func (c serveConfig) instance() string {
	if c.HA.Instance != "" {
		return c.HA.Instance
	}
	return c.Verify.Instance
}

// verify is the verification service's config: [verify] and what it shares with the
// applier (the changefeed, both servers, the meta schema).
func (c serveConfig) verify() verify.Config {
	v := c.Verify
	v.Changefeed, v.UpstreamDSN, v.DownstreamDSN, v.MetaSchema = c.Changefeed.ID, c.Upstream.DSN, c.Downstream.DSN, c.Applier.MetaSchema
	v.Instance = c.instance()
	return v
}

// Validate reports every problem with its TOML key path.
func (c serveConfig) Validate() error {
	var errs []error
	if err := c.cdc().Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.verify().Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.API.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.bypass().Validate("bypass."); err != nil {
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
	return errors.Join(errs...)
}

// redacted returns c with the passwords of its DSNs and of changefeed.sasl replaced.
func (c serveConfig) redacted() serveConfig {
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

// withTLS returns c with [upstream.tls] and [downstream.tls] applied to their DSNs
// (cdc.Config.WithTLS), so the applier, verification, repair and the API all connect
// with TLS.
func (c serveConfig) withTLS() (serveConfig, error) {
	cc, err := c.cdc().WithTLS()
	if err != nil {
		return c, err
	}
	c.Upstream, c.Downstream = cc.Upstream, cc.Downstream
	return c, nil
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(s))
	return l, err
}

// loadServeConfig decodes path strictly (unknown keys are errors) over the defaults,
// writing config.Load's warnings (a file with secrets that others can read) to warn.
func loadServeConfig(path string, warn io.Writer) (serveConfig, error) {
	cfg := defaultServeConfig()
	if path == "" {
		return cfg, nil
	}
	warnings, err := config.Load(path, &cfg, config.Options{})
	for _, w := range warnings {
		fmt.Fprintln(warn, "warning:", w)
	}
	return cfg, err
}

// serveBindings ties serve's flags and environment variables to their keys.
var serveBindings = []config.Binding{
	{Flag: "changefeed-id", Key: "changefeed.id"},
	{Flag: "brokers", Key: "changefeed.brokers"},
	{Flag: "topics", Key: "changefeed.topics"},
	{Flag: "topic-regex", Key: "changefeed.topic-regex"},
	{Flag: "compression", Key: "changefeed.compression"},
	{Flag: "time-zone", Key: "changefeed.time-zone"},
	{Flag: "start-ts", Key: "changefeed.start-ts"},
	{Flag: "upstream-dsn", Env: envUpstreamDSN, Key: "upstream.dsn"},
	{Flag: "downstream-dsn", Env: envDownstreamDSN, Key: "downstream.dsn"},
	{Env: envKafkaSASLPassword, Key: "changefeed.sasl.password"},
	{Flag: "workers", Key: "applier.workers"},
	{Flag: "batch-rows", Key: "applier.batch-rows"},
	{Flag: "memory-bytes", Key: "applier.memory-bytes"},
	{Flag: "spill-dir", Key: "applier.spill-dir"},
	{Flag: "meta-schema", Key: "applier.meta-schema"},
	{Flag: "dead-letter", Key: "applier.dead-letter"},
	{Flag: "status-addr", Key: "status.addr"},
	{Flag: "pprof", Key: "status.pprof"},
	{Flag: "api-addr", Key: "api.addr"},
	{Flag: "verify", Key: "verify.enabled"},
	{Flag: "verify-tables", Key: "verify.tables"},
	{Flag: "log-level", Key: "log.level"},
	{Flag: "log-format", Key: "log.format"},
}

// serveFlags are the flags that are not settings (those are read through serveBindings).
type serveFlags struct {
	config      string
	checkConfig bool
}

// resolveServeConfig builds the effective config: defaults < file < env < flags.
func resolveServeConfig(cmd *cobra.Command, f *serveFlags) (serveConfig, error) {
	cfg, err := loadServeConfig(f.config, cmd.ErrOrStderr())
	if err != nil {
		return cfg, err
	}
	if err := config.Apply(&cfg, cmd.Flags(), serveBindings); err != nil {
		return cfg, err
	}
	for _, w := range cfg.cdc().TLSWarnings() {
		fmt.Fprintln(cmd.ErrOrStderr(), "warning:", w)
	}
	return cfg, cfg.Validate()
}

func newLogger(c logConfig) *slog.Logger {
	lvl, _ := parseLevel(c.Level)
	opts := &slog.HandlerOptions{Level: lvl}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}

func init() {
	addCommand(func() *cobra.Command {
		cmd, _ := newServeCommand()
		return cmd
	})
}

// newServeCommand returns the serve command and the flag values it parses into.
func newServeCommand() (*cobra.Command, *serveFlags) {
	f := &serveFlags{}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Replicate the TiCDC changefeed from Kafka into the fallback MySQL, exactly once",
		Long: `serve consumes a TiCDC open-protocol changefeed from Kafka and applies it to the
fallback MySQL in commit-ts order, exactly once, recording its progress in the meta
schema of the downstream. Settings come from --config (TOML), then the environment
(PARITY_UPSTREAM_DSN, PARITY_DOWNSTREAM_DSN, PARITY_KAFKA_SASL_PASSWORD), then flags.
TLS to each server and SASL to Kafka are set in the config file ([upstream.tls],
[downstream.tls], [changefeed.tls], [changefeed.sasl]; docs/security.md). SIGTERM or SIGINT finishes the
round being applied and exits 0; a second signal exits at once. SIGHUP reads
api.token-file again.

The gRPC API (api.addr, api/README.md) serves status, waits, snapshot points, diff runs,
their differences, fix SQL, repair and the cutover check; it refuses to start on a
non-loopback address without authentication (api.token-file or TLS client
certificates) unless api.insecure.

With verify.enabled, verification runs beside the applier (docs/verify.md): snapshot
pairs, scheduled and continuous runs, their history in the meta schema, and freshness in
/status and /metrics; ` + "`parity verify`" + ` asks it for a run.

Exit status: 0 after a signal, 1 when replication failed, 2 for a configuration error.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := resolveServeConfig(cmd, f)
			if err != nil {
				return &exitError{code: exitNoAnswer, err: err}
			}
			if f.checkConfig {
				return toml.NewEncoder(cmd.OutOrStdout()).Encode(cfg.redacted())
			}
			return runServe(cmd.Context(), cfg)
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.config, "config", "c", "", "TOML config file (see deploy/parity.example.toml)")
	fl.BoolVar(&f.checkConfig, "check-config", false, "validate the effective configuration, print it (passwords redacted) and exit")
	fl.String("changefeed-id", "", "changefeed.id")
	fl.StringSlice("brokers", nil, "changefeed.brokers (comma separated)")
	fl.StringSlice("topics", nil, "changefeed.topics (comma separated)")
	fl.String("topic-regex", "", "changefeed.topic-regex")
	fl.String("compression", "", "changefeed.compression (none, snappy, lz4)")
	fl.String("time-zone", "", "changefeed.time-zone of TIMESTAMP values")
	fl.Uint64("start-ts", 0, "changefeed.start-ts: checkpoint assumed at the first start (import TSO)")
	fl.String("upstream-dsn", "", "upstream.dsn (prefer "+envUpstreamDSN+")")
	fl.String("downstream-dsn", "", "downstream.dsn (prefer "+envDownstreamDSN+")")
	fl.Int("workers", 0, "applier.workers")
	fl.Int("batch-rows", 0, "applier.batch-rows")
	fl.Int64("memory-bytes", 0, "applier.memory-bytes")
	fl.String("spill-dir", "", "applier.spill-dir")
	fl.String("meta-schema", "", "applier.meta-schema")
	fl.Bool("dead-letter", false, "applier.dead-letter")
	fl.String("status-addr", "", "status.addr (empty disables)")
	fl.Bool("pprof", false, "status.pprof: serve /debug/pprof/ on the status server")
	fl.String("api-addr", "", "api.addr: the gRPC API's address (empty disables)")
	fl.Bool("verify", false, "verify.enabled: run verification beside the applier")
	fl.StringSlice("verify-tables", nil, "verify.tables (comma separated schema.table patterns)")
	fl.String("log-level", "", "log.level")
	fl.String("log-format", "", "log.format (text, json)")
	return cmd, f
}

func runServe(parent context.Context, cfg serveConfig) error {
	if parent == nil {
		parent = context.Background()
	}
	log := newLogger(cfg.Log)
	for _, w := range cfg.cdc().TLSWarnings() {
		log.Warn(w)
	}
	cfg, err := cfg.withTLS()
	if err != nil {
		return &exitError{code: exitNoAnswer, err: err}
	}
	r, err := cdc.New(cfg.cdc(), log)
	if err != nil {
		return &exitError{code: exitNoAnswer, err: err}
	}
	ctx, stop := signal.NotifyContext(parent, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		stop() // a second signal terminates at once
	}()

	var bd *bypass.Detector
	var watcher checker.BypassWatcher // nil, not a nil *Detector, when detection is off
	if cfg.Bypass.Enabled {
		if bd, err = bypass.New(cfg.bypass(), log); err != nil {
			return &exitError{code: exitNoAnswer, err: err}
		}
		watcher = bd
	}

	var vs *verify.Service
	if cfg.Verify.Enabled {
		vs, err = verify.New(cfg.verify(), verify.Deps{
			Applier:       replicatorApplier{r},
			BarrierPassed: cdc.ErrBarrierPassed,
			RecordTSMap:   r.RecordTSMap,
			Bypass:        watcher,
			Logger:        log,
		})
		if err != nil {
			return &exitError{code: exitNoAnswer, err: err}
		}
	}

	// The API's listener and authentication are checked before anything starts.
	var (
		apiSrv *api.Server
		apiLn  net.Listener
		auth   *api.Authenticator
	)
	rp := newRepairer(r, vs)
	if cfg.API.Addr != "" {
		if auth, err = api.NewAuthenticator(cfg.API.TokenFile, cfg.API.TLS, log); err != nil {
			return &exitError{code: exitNoAnswer, err: err}
		}
		if err := api.CheckExposure(cfg.API.Addr, cfg.API.Insecure, auth); err != nil {
			return &exitError{code: exitNoAnswer, err: err}
		}
		backend, closeBackend := apiBackend(cfg, r, vs, rp)
		defer closeBackend()
		if apiSrv, err = api.New(cfg.API, backend, api.Options{Logger: log, Auth: auth, Changefeed: cfg.Changefeed.ID}); err != nil {
			return &exitError{code: exitNoAnswer, err: err}
		}
		if apiLn, err = net.Listen("tcp", cfg.API.Addr); err != nil {
			return &exitError{code: exitNoAnswer, err: fmt.Errorf("api.addr: %w", err)}
		}
		defer apiLn.Close()
	}

	// One group owns the replicator, the verification service, the status server and
	// the API: stop is cancel (a signal, or one of them failing), then wait for all.
	g, gctx := errgroup.WithContext(ctx)
	var srv *http.Server
	if cfg.Status.Addr != "" {
		ln, err := net.Listen("tcp", cfg.Status.Addr)
		if err != nil {
			return &exitError{code: exitNoAnswer, err: fmt.Errorf("status.addr: %w", err)}
		}
		var extra []prometheus.Collector
		if apiSrv != nil {
			extra = append(extra, apiSrv.Metrics())
		}
		srv = &http.Server{Handler: statusMux(r, vs, rp, bd, cfg.Status.Pprof, extra...), ReadHeaderTimeout: 5 * time.Second}
		log.Info("status server listening", "addr", ln.Addr().String())
		g.Go(func() error {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("status server: %w", err)
			}
			return nil
		})
	}
	if apiSrv != nil {
		log.Info("api server listening", "addr", apiLn.Addr().String(), "authentication", auth.Enabled())
		g.Go(func() error { return apiSrv.Run(gctx, apiLn) })
		g.Go(func() error { return auth.ReloadOnSignal(gctx, syscall.SIGHUP) })
	}
	g.Go(func() error {
		defer func() {
			if srv != nil {
				sctx, cancel := context.WithTimeout(context.WithoutCancel(gctx), 5*time.Second)
				defer cancel()
				_ = srv.Shutdown(sctx)
			}
		}()
		return r.Run(gctx)
	})
	if vs != nil {
		g.Go(func() error { return vs.Run(gctx) })
	}
	if bd != nil {
		// Under [ha] only the daemon holding the lease reads the binlog (bypass_ha.go).
		g.Go(func() error { return r.WhileActive(gctx, "bypass detection", bd.Run) })
	}
	if err := g.Wait(); err != nil {
		log.Error("serve failed", "err", err)
		return &exitError{code: exitServeFailed, err: err}
	}
	return nil
}

// statusHandler serves the status address; vs is nil without verification.
func statusHandler(r *cdc.Replicator, vs *verify.Service, pprofOn bool) http.Handler {
	return statusMux(r, vs, newRepairer(r, vs), nil, pprofOn)
}

// statusMux is statusHandler with the daemon's repairer (shared with the API), the bypass
// detector (nil when off) and more collectors for /metrics (the API's).
func statusMux(r *cdc.Replicator, vs *verify.Service, rp *repairer, bd *bypass.Detector, pprofOn bool, extra ...prometheus.Collector) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		cdc.NewCollector(r))
	reg.MustRegister(extra...)
	if bd != nil {
		reg.MustRegister(activeCollector{r: r, c: bypass.NewCollector(bd)})
	}
	if vs != nil {
		reg.MustRegister(newVerifyCollector(vs))
	}
	build := prometheus.NewGauge(prometheus.GaugeOpts{Name: "parity_build_info", Help: "Build information.",
		ConstLabels: prometheus.Labels{"version": version, "commit": commit}})
	build.Set(1)
	reg.MustRegister(build)
	mux := http.NewServeMux()
	if pprofOn {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/status", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		st := serveStatus{Status: r.Status(), Verify: verifyStatusOf(vs)}
		if bd != nil {
			st.Bypass = bypassStatus(st.Status, bd)
		}
		_ = enc.Encode(st)
	})
	if vs != nil {
		mux.HandleFunc("POST /verify/run", loopbackOnly(verifyRunHandler(vs)))
		mux.HandleFunc("GET /verify/runs", loopbackOnly(verifyRunsHandler(vs)))
		mux.HandleFunc("POST /repair", loopbackOnly(repairHandler(rp)))
	}
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		st := r.Status()
		if st.State == "failed" {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprintln(w, strings.ToLower(st.State))
	})
	return mux
}
