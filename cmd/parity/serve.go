package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

	"github.com/tidb-parity/parity/cdc"
)

// Environment variables that override the config file (flags override both).
const (
	envUpstreamDSN   = "PARITY_UPSTREAM_DSN"
	envDownstreamDSN = "PARITY_DOWNSTREAM_DSN"
)

// serveConfig is the `parity serve` configuration file.
type serveConfig struct {
	Changefeed cdc.ChangefeedConfig `toml:"changefeed"`
	Upstream   cdc.UpstreamConfig   `toml:"upstream"`
	Downstream cdc.DownstreamConfig `toml:"downstream"`
	Applier    cdc.ApplierConfig    `toml:"applier"`
	Log        logConfig            `toml:"log"`
	Status     statusConfig         `toml:"status"`
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
	// `parity status`). Empty disables it.
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
	}
}

func (c serveConfig) cdc() cdc.Config {
	return cdc.Config{Changefeed: c.Changefeed, Upstream: c.Upstream, Downstream: c.Downstream, Applier: c.Applier}
}

// Validate reports every problem with its TOML key path.
func (c serveConfig) Validate() error {
	var errs []error
	if err := c.cdc().Validate(); err != nil {
		errs = append(errs, err)
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

// redacted returns c with the passwords of its DSNs replaced.
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
	return c
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(s))
	return l, err
}

// loadServeConfig decodes path strictly (unknown keys are errors) over the defaults.
func loadServeConfig(path string) (serveConfig, error) {
	cfg := defaultServeConfig()
	if path == "" {
		return cfg, nil
	}
	md, err := toml.DecodeFile(path, &cfg)
	if err != nil {
		return cfg, fmt.Errorf("config %s: %w", path, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		var errs []error
		for _, k := range und {
			errs = append(errs, fmt.Errorf("%s: unknown key", k.String()))
		}
		return cfg, fmt.Errorf("config %s: %w", path, errors.Join(errs...))
	}
	return cfg, nil
}

type serveFlags struct {
	config                                    string
	changefeedID, topicRegex, compression, tz string
	brokers, topics                           []string
	startTs                                   uint64
	upstreamDSN, downstreamDSN                string
	workers, batchRows                        int
	memoryBytes                               int64
	spillDir, metaSchema                      string
	deadLetter, pprof                         bool
	statusAddr, logLevel, logFormat           string
	checkConfig                               bool
}

// resolveServeConfig builds the effective config: defaults < file < env < flags.
func resolveServeConfig(cmd *cobra.Command, f *serveFlags) (serveConfig, error) {
	cfg, err := loadServeConfig(f.config)
	if err != nil {
		return cfg, err
	}
	if v := os.Getenv(envUpstreamDSN); v != "" {
		cfg.Upstream.DSN = v
	}
	if v := os.Getenv(envDownstreamDSN); v != "" {
		cfg.Downstream.DSN = v
	}
	fl := cmd.Flags()
	set := func(name string, apply func()) {
		if fl.Changed(name) {
			apply()
		}
	}
	set("changefeed-id", func() { cfg.Changefeed.ID = f.changefeedID })
	set("brokers", func() { cfg.Changefeed.Brokers = f.brokers })
	set("topics", func() { cfg.Changefeed.Topics = f.topics })
	set("topic-regex", func() { cfg.Changefeed.TopicRegex = f.topicRegex })
	set("compression", func() { cfg.Changefeed.Compression = f.compression })
	set("time-zone", func() { cfg.Changefeed.TimeZone = f.tz })
	set("start-ts", func() { cfg.Changefeed.StartTs = f.startTs })
	set("upstream-dsn", func() { cfg.Upstream.DSN = f.upstreamDSN })
	set("downstream-dsn", func() { cfg.Downstream.DSN = f.downstreamDSN })
	set("workers", func() { cfg.Applier.Workers = f.workers })
	set("batch-rows", func() { cfg.Applier.BatchRows = f.batchRows })
	set("memory-bytes", func() { cfg.Applier.MemoryBytes = f.memoryBytes })
	set("spill-dir", func() { cfg.Applier.SpillDir = f.spillDir })
	set("meta-schema", func() { cfg.Applier.MetaSchema = f.metaSchema })
	set("dead-letter", func() { cfg.Applier.DeadLetter = f.deadLetter })
	set("status-addr", func() { cfg.Status.Addr = f.statusAddr })
	set("pprof", func() { cfg.Status.Pprof = f.pprof })
	set("log-level", func() { cfg.Log.Level = f.logLevel })
	set("log-format", func() { cfg.Log.Format = f.logFormat })
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
(PARITY_UPSTREAM_DSN, PARITY_DOWNSTREAM_DSN), then flags. SIGTERM or SIGINT finishes the
round being applied and exits 0; a second signal exits at once.

Exit status: 0 after a signal, 1 when replication failed, 2 for a configuration error.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := resolveServeConfig(cmd, f)
			if err != nil {
				return &exitError{code: 2, err: err}
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
	fl.StringVar(&f.changefeedID, "changefeed-id", "", "changefeed.id")
	fl.StringSliceVar(&f.brokers, "brokers", nil, "changefeed.brokers (comma separated)")
	fl.StringSliceVar(&f.topics, "topics", nil, "changefeed.topics (comma separated)")
	fl.StringVar(&f.topicRegex, "topic-regex", "", "changefeed.topic-regex")
	fl.StringVar(&f.compression, "compression", "", "changefeed.compression (none, snappy, lz4)")
	fl.StringVar(&f.tz, "time-zone", "", "changefeed.time-zone of TIMESTAMP values")
	fl.Uint64Var(&f.startTs, "start-ts", 0, "changefeed.start-ts: checkpoint assumed at the first start (import TSO)")
	fl.StringVar(&f.upstreamDSN, "upstream-dsn", "", "upstream.dsn (prefer "+envUpstreamDSN+")")
	fl.StringVar(&f.downstreamDSN, "downstream-dsn", "", "downstream.dsn (prefer "+envDownstreamDSN+")")
	fl.IntVar(&f.workers, "workers", 0, "applier.workers")
	fl.IntVar(&f.batchRows, "batch-rows", 0, "applier.batch-rows")
	fl.Int64Var(&f.memoryBytes, "memory-bytes", 0, "applier.memory-bytes")
	fl.StringVar(&f.spillDir, "spill-dir", "", "applier.spill-dir")
	fl.StringVar(&f.metaSchema, "meta-schema", "", "applier.meta-schema")
	fl.BoolVar(&f.deadLetter, "dead-letter", false, "applier.dead-letter")
	fl.StringVar(&f.statusAddr, "status-addr", "", "status.addr (empty disables)")
	fl.BoolVar(&f.pprof, "pprof", false, "status.pprof: serve /debug/pprof/ on the status server")
	fl.StringVar(&f.logLevel, "log-level", "", "log.level")
	fl.StringVar(&f.logFormat, "log-format", "", "log.format (text, json)")
	return cmd, f
}

func runServe(parent context.Context, cfg serveConfig) error {
	if parent == nil {
		parent = context.Background()
	}
	log := newLogger(cfg.Log)
	r, err := cdc.New(cfg.cdc(), log)
	if err != nil {
		return &exitError{code: 2, err: err}
	}
	ctx, stop := signal.NotifyContext(parent, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		stop() // a second signal terminates at once
	}()

	g, gctx := errgroup.WithContext(ctx)
	var srv *http.Server
	if cfg.Status.Addr != "" {
		ln, err := net.Listen("tcp", cfg.Status.Addr)
		if err != nil {
			return &exitError{code: 2, err: fmt.Errorf("status.addr: %w", err)}
		}
		srv = &http.Server{Handler: statusHandler(r, cfg.Status.Pprof), ReadHeaderTimeout: 5 * time.Second}
		log.Info("status server listening", "addr", ln.Addr().String())
		g.Go(func() error {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("status server: %w", err)
			}
			return nil
		})
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
	if err := g.Wait(); err != nil {
		log.Error("serve failed", "err", err)
		return &exitError{code: 1, err: err}
	}
	return nil
}

func statusHandler(r *cdc.Replicator, pprofOn bool) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		cdc.NewCollector(r))
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
		_ = enc.Encode(r.Status())
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		st := r.Status()
		if st.State == "failed" {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprintln(w, strings.ToLower(st.State))
	})
	return mux
}
