package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/tidb-parity/parity/api"
	"github.com/tidb-parity/parity/cdc"
	"github.com/tidb-parity/parity/cdc/bypass"
	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/checker/verify"
)

// ConfigError is an error of Run before anything started: a component refused its
// config, or an address could not be bound (`parity serve` exits 2).
type ConfigError struct{ Err error }

func (e *ConfigError) Error() string { return e.Err.Error() }
func (e *ConfigError) Unwrap() error { return e.Err }

// Options are what Run takes beside the config.
type Options struct {
	// Logger logs the daemon's parts; nil: NewLogger(cfg.Log).
	Logger *slog.Logger
	// Warnings are logged at the start: the config's (Config.TLSWarnings), computed
	// once where the config was resolved.
	Warnings []string
	// Build labels parity_build_info.
	Build BuildInfo
}

// Run runs the daemon configured by cfg until ctx is done or a part fails: the replicator, with verify.enabled the
// verification service, with bypass.enabled the bypass detector (only while this daemon
// holds the lease under [ha]), the status server and the gRPC API. One errgroup owns
// them: stop is cancel (ctx, or one of them failing), then wait for all. It returns nil
// after ctx is done, a *ConfigError when cfg has a problem (the one check of the
// configuration, Config.Validate's, is made here; no component repeats it) or a part
// could not start, or the error that stopped replication.
func Run(ctx context.Context, cfg Config, opts Options) error {
	log := opts.Logger
	if log == nil {
		log = NewLogger(cfg.Log)
	}
	for _, w := range opts.Warnings {
		log.Warn(w)
	}
	cfg, p, err := cfg.check()
	if err != nil {
		return &ConfigError{err}
	}
	r, err := cdc.New(p.CDC, log)
	if err != nil {
		return &ConfigError{err}
	}

	c := Components{Replicator: r}
	var watcher checker.BypassWatcher // nil, not a nil *Detector, when detection is off
	if cfg.Bypass.Enabled {
		if c.Bypass, err = bypass.New(p.Bypass, log); err != nil {
			return &ConfigError{err}
		}
		watcher = c.Bypass
	}
	if cfg.Verify.Enabled {
		c.Verify, err = verify.New(p.Verify, verify.Deps{
			Applier:       Applier(r),
			BarrierPassed: cdc.ErrBarrierPassed,
			RecordTSMap:   r.RecordTSMap,
			Bypass:        watcher,
			Logger:        log,
		})
		if err != nil {
			return &ConfigError{err}
		}
		c.Repairer = NewRepairer(r, c.Verify)
	}

	// The API's listener and authentication are checked before anything starts.
	var (
		apiSrv *api.Server
		apiLn  net.Listener
		auth   *api.Authenticator
	)
	if cfg.API.Addr != "" {
		if auth, err = api.NewAuthenticator(cfg.API.TokenFile, cfg.API.TLS, log); err != nil {
			return &ConfigError{err}
		}
		if err := api.CheckExposure(cfg.API.Addr, cfg.API.Insecure, auth); err != nil {
			return &ConfigError{err}
		}
		backend, closeBackend := apiBackend(cfg.Upstream.DSN, p.Instance, r, c.Verify, c.Repairer)
		defer closeBackend()
		if c.Bypass != nil {
			backend.Bypass = func() *bypass.Status { return bypassStatus(r.Status(), c.Bypass) }
		}
		if apiSrv, err = api.New(p.API, backend, api.Options{Logger: log, Auth: auth, Changefeed: cfg.Changefeed.ID}); err != nil {
			return &ConfigError{err}
		}
		if apiLn, err = net.Listen("tcp", cfg.API.Addr); err != nil {
			return &ConfigError{fmt.Errorf("api.addr: %w", err)}
		}
		defer apiLn.Close()
	}

	g, gctx := errgroup.WithContext(ctx)
	var srv *http.Server
	if cfg.Status.Addr != "" {
		ln, err := net.Listen("tcp", cfg.Status.Addr)
		if err != nil {
			return &ConfigError{fmt.Errorf("status.addr: %w", err)}
		}
		var extra []prometheus.Collector
		if apiSrv != nil {
			extra = append(extra, apiSrv.Metrics())
		}
		srv = &http.Server{Handler: Handler(c, opts.Build, cfg.Status.Pprof, extra...), ReadHeaderTimeout: 5 * time.Second}
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
	if c.Verify != nil {
		g.Go(func() error { return c.Verify.Run(gctx) })
	}
	if c.Bypass != nil {
		// Under [ha] only the daemon holding the lease reads the binlog (status.go).
		g.Go(func() error { return r.WhileActive(gctx, "bypass detection", c.Bypass.Run) })
	}
	if err := g.Wait(); err != nil {
		log.Error("serve failed", "err", err)
		return err
	}
	return nil
}
