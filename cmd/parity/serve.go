package main

// serve.go: `parity serve`'s flags, configuration file and exit status. The process it
// runs is package daemon's.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/signal"
	"syscall"

	"github.com/BurntSushi/toml"
	"github.com/spf13/cobra"

	"github.com/tidb-parity/parity/daemon"
	"github.com/tidb-parity/parity/internal/config"
)

// Environment variables that override the config file (flags override both).
const (
	envUpstreamDSN       = "PARITY_UPSTREAM_DSN"
	envDownstreamDSN     = "PARITY_DOWNSTREAM_DSN"
	envKafkaSASLPassword = "PARITY_KAFKA_SASL_PASSWORD"
)

// loadServeConfig decodes path strictly (unknown keys are errors) over the defaults,
// writing config.Load's warnings (a file with secrets that others can read) to warn.
func loadServeConfig(path string, warn io.Writer) (daemon.Config, error) {
	cfg := daemon.DefaultConfig()
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
	{Flag: "protocol", Key: "changefeed.protocol"},
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

// resolveServeConfig builds the effective config: defaults < file < env < flags. It
// writes the TLS warnings (daemon.Config.TLSWarnings) to stderr and returns them for the
// daemon's log. The config is checked once, by daemon.Run (or by Validate for
// --check-config).
func resolveServeConfig(cmd *cobra.Command, f *serveFlags) (daemon.Config, []string, error) {
	cfg, err := loadServeConfig(f.config, cmd.ErrOrStderr())
	if err != nil {
		return cfg, nil, err
	}
	if err := config.Apply(&cfg, cmd.Flags(), serveBindings); err != nil {
		return cfg, nil, err
	}
	warnings := cfg.TLSWarnings()
	for _, w := range warnings {
		fmt.Fprintln(cmd.ErrOrStderr(), "warning:", w)
	}
	return cfg, warnings, nil
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
			cfg, warnings, err := resolveServeConfig(cmd, f)
			if err != nil {
				return &exitError{code: exitNoAnswer, err: err}
			}
			if f.checkConfig {
				if err := cfg.Validate(); err != nil {
					return &exitError{code: exitNoAnswer, err: err}
				}
				return toml.NewEncoder(cmd.OutOrStdout()).Encode(cfg.Redacted())
			}
			return runServe(cmd.Context(), cfg, warnings...)
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.config, "config", "c", "", "TOML config file (see deploy/parity.example.toml)")
	fl.BoolVar(&f.checkConfig, "check-config", false, "validate the effective configuration, print it (passwords redacted) and exit")
	fl.String("changefeed-id", "", "changefeed.id")
	fl.StringSlice("brokers", nil, "changefeed.brokers (comma separated)")
	fl.StringSlice("topics", nil, "changefeed.topics (comma separated)")
	fl.String("topic-regex", "", "changefeed.topic-regex")
	fl.String("protocol", "", "changefeed.protocol (open-protocol, canal-json, simple)")
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

// runServe runs the daemon until SIGTERM or SIGINT (a second one terminates at once),
// logging warnings (the config's, written to stderr when it was resolved): exit status 2
// when it could not start, 1 when replication failed.
func runServe(parent context.Context, cfg daemon.Config, warnings ...string) error {
	if parent == nil {
		parent = context.Background()
	}
	ctx, stop := signal.NotifyContext(parent, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		stop() // a second signal terminates at once
	}()
	err := daemon.Run(ctx, cfg, daemon.Options{Warnings: warnings, Build: daemon.BuildInfo{Version: version, Commit: commit}})
	var ce *daemon.ConfigError
	switch {
	case errors.As(err, &ce):
		return &exitError{code: exitNoAnswer, err: err}
	case err != nil:
		return &exitError{code: 1, err: err}
	}
	return nil
}
