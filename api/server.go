package api

// server.go is the gRPC server: its setup (interceptors, health, reflection, keepalive,
// graceful stop) and every RPC of parity.v1.Parity. Conversions to the proto's messages
// are in convert.go, page tokens in page.go.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	parityv1 "github.com/tidb-parity/parity/api/parity/v1"
	"github.com/tidb-parity/parity/checker/verify"
	"github.com/tidb-parity/parity/fleet"
	"github.com/tidb-parity/parity/internal/tso"
)

// Limits of the requests (the proto's comments).
const (
	watchStatusDefault = 5 * time.Second
	watchStatusMin     = time.Second
	watchStatusMax     = 5 * time.Minute
	watchDiffDefault   = time.Second
	watchDiffMin       = 200 * time.Millisecond
	watchDiffMax       = time.Minute
	waitDefault        = 10 * time.Minute
	cutoverAgeDefault  = 7 * 24 * time.Hour
	listDiffsDefault   = 50
	listDiffsMax       = 1000
	listDiffsDefault2  = 100 // ListDifferences
	cutoverDiffsMax    = 1000
	fixChunkBytes      = 64 << 10
	healthPoll         = 500 * time.Millisecond
)

// ServiceName is the gRPC service's full name (health checks name it).
const ServiceName = "parity.v1.Parity"

// Options are what New needs besides the Config and the Backend.
type Options struct {
	// Logger receives the request log. Default: slog.Default().
	Logger *slog.Logger
	// Registerer registers the call metrics (parity_grpc_server_*). nil: not
	// registered.
	Registerer prometheus.Registerer
	// Changefeed labels the call metrics (the changefeed label every parity metric
	// carries). Default: "".
	Changefeed string
	// Auth authenticates and authorizes calls and its TLS config serves TLS; nil: no
	// authentication (tests, or a daemon CheckExposure allowed without it).
	Auth *Authenticator
	// Fleet, when set, serves the Fleet service over it (`parity fleet serve`); a server
	// with a fleet and no Backend.Replication serves the Fleet service alone.
	Fleet *fleet.Fleet
}

// Server is the API's gRPC server. Create it with New, serve with Run.
type Server struct {
	parityv1.UnimplementedParityServer

	cfg     Config
	b       Backend
	log     *slog.Logger
	srv     *grpc.Server
	health  *health.Server
	metrics *Metrics

	// stopCtx ends when the server begins to stop: watch streams end with OK and
	// waits fail UNAVAILABLE, so the graceful stop need not wait for them.
	stopCtx  context.Context
	stopNow  context.CancelFunc
	stopOnce sync.Once
}

var _ parityv1.ParityServer = (*Server)(nil)

// errStopping is a call cut short because the daemon stops.
var errStopping = errors.New("the daemon is stopping")

// New builds the server (it does not listen yet).
func New(cfg Config, b Backend, o Options) (*Server, error) {
	if b.Replication == nil && o.Fleet == nil {
		return nil, errors.New("api: a replication backend or a fleet is required")
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	s := &Server{cfg: cfg, b: b, log: o.Logger.With("component", "api"), health: health.NewServer(), metrics: NewMetrics(o.Changefeed)}
	s.stopCtx, s.stopNow = context.WithCancel(context.Background())

	// Outermost first: metrics and the log see the final code; the authenticator
	// rejects before the handler; the innermost notes the caller and maps errors.
	unary := []grpc.UnaryServerInterceptor{s.metrics.unary(), logUnary(s.log)}
	stream := []grpc.StreamServerInterceptor{s.metrics.stream(), logStream(s.log)}
	if o.Auth != nil {
		unary = append(unary, o.Auth.UnaryInterceptor())
		stream = append(stream, o.Auth.StreamInterceptor())
	}
	unary = append(unary, innerUnary())
	stream = append(stream, innerStream())
	opts := []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(unary...),
		grpc.ChainStreamInterceptor(stream...),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: cfg.KeepaliveTime, Timeout: cfg.KeepaliveTimeout,
			MaxConnectionIdle: cfg.MaxConnectionIdle}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: cfg.MinClientPingInterval, PermitWithoutStream: true}),
		grpc.MaxConcurrentStreams(cfg.MaxConcurrentStreams),
	}
	tc, err := cfg.TLS.ServerTLS()
	if err != nil {
		return nil, err
	}
	if tc != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tc)))
	}
	s.srv = grpc.NewServer(opts...)
	if b.Replication != nil {
		parityv1.RegisterParityServer(s.srv, s)
	}
	if o.Fleet != nil {
		parityv1.RegisterFleetServer(s.srv, &fleetServer{f: o.Fleet})
	}
	healthpb.RegisterHealthServer(s.srv, liveHealth{Server: s.health, refresh: s.setHealth})
	reflection.Register(s.srv)
	s.metrics.init(s.srv)
	if o.Registerer != nil {
		if err := o.Registerer.Register(s.metrics); err != nil {
			return nil, fmt.Errorf("api: registering metrics: %w", err)
		}
	}
	s.setHealth()
	return s, nil
}

// Metrics returns the server's call metrics (to register elsewhere).
func (s *Server) Metrics() *Metrics { return s.metrics }

// Run serves on ln until ctx ends, then stops gracefully: watch streams end with OK,
// calls under way get api.stop-timeout to finish, then every connection is closed.
// It returns once the server stopped; an error only when serving failed.
func (s *Server) Run(ctx context.Context, ln net.Listener) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("api server: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		t := time.NewTicker(healthPoll)
		defer t.Stop()
		for {
			select {
			case <-gctx.Done():
				s.stop()
				return nil
			case <-t.C:
				s.setHealth()
			}
		}
	})
	return g.Wait()
}

// stop stops the server: graceful, bounded by api.stop-timeout, then forced.
func (s *Server) stop() {
	s.stopOnce.Do(func() {
		s.stopNow()
		s.health.Shutdown()
		done := make(chan struct{})
		go func() {
			s.srv.GracefulStop()
			close(done)
		}()
		t := time.NewTimer(s.cfg.StopTimeout)
		defer t.Stop()
		select {
		case <-done:
		case <-t.C:
			s.log.Warn("api calls still under way after the stop timeout; closing their connections", "stop_timeout", s.cfg.StopTimeout)
			s.srv.Stop()
			<-done
		}
	})
}

// liveHealth answers Check from the applier's state at the call, so a health check
// agrees with a GetStatus made just before it (the poll alone lagged by up to
// healthPoll: the runbook's check printed NOT_SERVING after GetStatus said running).
// Watch is served from the polled state. After stop, Shutdown's NOT_SERVING holds.
type liveHealth struct {
	*health.Server
	refresh func()
}

// Check refreshes the status, then answers as the health server does.
func (h liveHealth) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	h.refresh()
	return h.Server.Check(ctx, req)
}

// setHealth reports SERVING while the applier runs, NOT_SERVING otherwise.
func (s *Server) setHealth() {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if s.b.Replication == nil || s.b.Replication.Status().State == "running" {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(ServiceName, st)
}

// callCtx is ctx, also cancelled (cause errStopping) when the server stops.
func (s *Server) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	cctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(s.stopCtx, func() { cancel(errStopping) })
	return cctx, func() { stop(); cancel(nil) }
}

// verification returns the verification backend or ErrVerificationDisabled.
func (s *Server) verification() (Verification, error) {
	if s.b.Verification == nil {
		return nil, ErrVerificationDisabled
	}
	return s.b.Verification, nil
}

// verificationRun is the verification and the run id of the name in the request's field
// (see runID).
func (s *Server) verificationRun(field, name string) (Verification, string, error) {
	v, err := s.verification()
	if err != nil {
		return nil, "", err
	}
	id, err := runID(field, name)
	if err != nil {
		return nil, "", err
	}
	return v, id, nil
}

// GetStatus implements parityv1.ParityServer.
func (s *Server) GetStatus(ctx context.Context, _ *parityv1.GetStatusRequest) (*parityv1.Status, error) {
	return s.status(), nil
}

func (s *Server) status() *parityv1.Status {
	var stats *verify.Stats
	if s.b.Verification != nil {
		st := s.b.Verification.Stats()
		stats = &st
	}
	out := statusProto(s.b.Replication.Status(), stats, s.b.Instance)
	if s.b.Bypass != nil {
		out.Bypass = bypassProto(s.b.Bypass())
	}
	return out
}

// WatchStatus implements parityv1.ParityServer.
func (s *Server) WatchStatus(req *parityv1.WatchStatusRequest, stream parityv1.Parity_WatchStatusServer) error {
	every, err := interval("interval", req.GetInterval(), watchStatusDefault, watchStatusMin, watchStatusMax)
	if err != nil {
		return err
	}
	return s.every(stream.Context(), every, nil, func() (bool, error) {
		return false, stream.Send(s.status())
	})
}

// every calls send at once, then every interval and once when wake is closed (nil:
// never), until it reports the end, ctx ends (its error) or the server stops (nil: the
// stream ends with OK).
func (s *Server) every(ctx context.Context, every time.Duration, wake <-chan struct{}, send func() (end bool, err error)) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		end, err := send()
		if err != nil || end {
			return err
		}
		select {
		case <-t.C:
		case <-wake:
			wake = nil // closed: once
		case <-ctx.Done():
			return ctx.Err()
		case <-s.stopCtx.Done():
			return nil
		}
	}
}

// interval validates an optional duration field against its bounds.
func interval(field string, d *durationpb.Duration, def, lo, hi time.Duration) (time.Duration, error) {
	if d == nil {
		return def, nil
	}
	if err := d.CheckValid(); err != nil {
		return 0, fieldErr(field, "%v", err)
	}
	v := d.AsDuration()
	if v < lo || v > hi {
		return 0, fieldErr(field, "want %v to %v, got %v", lo, hi, v)
	}
	return v, nil
}

// positive validates an optional duration field that must be positive when set.
func positive(field string, d *durationpb.Duration, def time.Duration) (time.Duration, error) {
	if d == nil {
		return def, nil
	}
	if err := d.CheckValid(); err != nil {
		return 0, fieldErr(field, "%v", err)
	}
	if v := d.AsDuration(); v > 0 {
		return v, nil
	}
	return 0, fieldErr(field, "must be positive, got %v", d.AsDuration())
}

// waitBound is how long a wait may take: the field, else the call's deadline, else
// 10 min.
func waitBound(ctx context.Context, field string, d *durationpb.Duration) (time.Duration, error) {
	def := waitDefault
	if dl, ok := ctx.Deadline(); ok {
		def = time.Until(dl)
	}
	return positive(field, d, def)
}

// WaitForApplied implements parityv1.ParityServer.
func (s *Server) WaitForApplied(ctx context.Context, req *parityv1.WaitForAppliedRequest) (*parityv1.WaitForAppliedResponse, error) {
	start := time.Now()
	timeout, err := waitBound(ctx, "timeout", req.GetTimeout())
	if err != nil {
		return nil, err
	}
	var target uint64
	switch t := req.GetTarget().(type) {
	case *parityv1.WaitForAppliedRequest_Ts:
		if t.Ts == 0 {
			return nil, fieldErr("ts", "must be a TSO, got 0")
		}
		target = t.Ts
	case *parityv1.WaitForAppliedRequest_Now:
		if !t.Now {
			return nil, fieldErr("now", "must be true when set (or set ts)")
		}
		if target, err = s.b.Replication.UpstreamTSO(ctx); err != nil {
			return nil, err
		}
	default:
		return nil, fieldErr("target", "set ts or now")
	}
	if st := s.b.Replication.Status(); st.State == "stopped" || st.State == "failed" {
		return nil, fmt.Errorf("waiting for ts %d: %w (%s)", target, ErrApplierNotRunning, st.State)
	}
	cctx, cancel := s.callCtx(ctx)
	defer cancel()
	wctx, wcancel := context.WithTimeout(cctx, timeout)
	defer wcancel()
	if err := s.b.Replication.WaitApplied(wctx, target); err != nil {
		switch {
		case context.Cause(cctx) == errStopping:
			return nil, errStopping
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case errors.Is(err, context.DeadlineExceeded):
			return nil, fmt.Errorf("ts %d not applied after %v (applied ts %d): %w", target, timeout.Round(time.Millisecond),
				s.b.Replication.Status().AppliedTs, ErrDeadline)
		}
		return nil, err
	}
	applied := s.b.Replication.Status().AppliedTs
	return &parityv1.WaitForAppliedResponse{TargetTs: target, AppliedTs: applied, AppliedTime: tsTime(applied),
		Waited: durationpb.New(time.Since(start))}, nil
}

// CreateSnapshotPoint implements parityv1.ParityServer.
func (s *Server) CreateSnapshotPoint(ctx context.Context, req *parityv1.CreateSnapshotPointRequest) (*parityv1.SnapshotPoint, error) {
	v, err := s.verification()
	if err != nil {
		return nil, err
	}
	var at uint64
	if req.AtTs != nil {
		if *req.AtTs == 0 {
			return nil, fieldErr("at_ts", "must be a TSO, got 0 (leave it unset for the resolved ts)")
		}
		at = *req.AtTs
	}
	cctx, cancel := s.callCtx(ctx)
	defer cancel()
	p, err := v.SnapshotPoint(cctx, at)
	if err != nil {
		return nil, withTS(at, stopped(cctx, err))
	}
	return pointProto(p), nil
}

// stopped returns errStopping for a call cut short by the server's stop, else err.
func stopped(cctx context.Context, err error) error {
	if context.Cause(cctx) == errStopping {
		return fmt.Errorf("%w: %w", errStopping, err)
	}
	return err
}

// Repair implements parityv1.ParityServer.
func (s *Server) Repair(ctx context.Context, req *parityv1.RepairRequest) (*parityv1.RepairResponse, error) {
	if s.b.Repairer == nil {
		return nil, ErrVerificationDisabled
	}
	id, err := runID("diff", req.GetDiff())
	if err != nil {
		return nil, err
	}
	tables, err := patterns("tables", req.GetTables())
	if err != nil {
		return nil, err
	}
	res, err := s.b.Repairer.Repair(ctx, id, tables, req.GetDryRun())
	if err != nil {
		return nil, withRun(id, err)
	}
	return repairProto(res), nil
}

// GetUpstreamTSO implements parityv1.ParityServer.
func (s *Server) GetUpstreamTSO(ctx context.Context, _ *parityv1.GetUpstreamTSORequest) (*parityv1.GetUpstreamTSOResponse, error) {
	ts, err := s.b.Replication.UpstreamTSO(ctx)
	if err != nil {
		return nil, err
	}
	return &parityv1.GetUpstreamTSOResponse{Ts: ts, Time: timestamppb.New(tso.Time(ts))}, nil
}

// ListUpstreamTables implements parityv1.ParityServer.
func (s *Server) ListUpstreamTables(ctx context.Context, req *parityv1.ListUpstreamTablesRequest) (*parityv1.ListUpstreamTablesResponse, error) {
	v, err := s.verification()
	if err != nil {
		return nil, err
	}
	ps, err := patterns("tables", req.GetTables())
	if err != nil {
		return nil, err
	}
	tables, err := v.UpstreamTables(ctx, ps)
	if err != nil {
		return nil, requestField(err, startDiffFields)
	}
	return &parityv1.ListUpstreamTablesResponse{Tables: tables}, nil
}

// CutoverCheck implements parityv1.ParityServer.
func (s *Server) CutoverCheck(ctx context.Context, req *parityv1.CutoverCheckRequest) (*parityv1.CutoverCheckResponse, error) {
	v, err := s.verification()
	if err != nil {
		return nil, err
	}
	var cr verify.CutoverRequest
	switch u := req.GetUpstream().(type) {
	case *parityv1.CutoverCheckRequest_UpstreamTs:
		if u.UpstreamTs == 0 {
			return nil, fieldErr("upstream_ts", "must be a TSO, got 0")
		}
		cr.UpstreamTS = u.UpstreamTs
	case *parityv1.CutoverCheckRequest_Now:
		if !u.Now {
			return nil, fieldErr("now", "must be true when set (or set upstream_ts)")
		}
		cr.Now = true
	default:
		return nil, fieldErr("upstream", "set upstream_ts or now")
	}
	if cr.MaxFullAge, err = positive("max_full_diff_age", req.GetMaxFullDiffAge(), cutoverAgeDefault); err != nil {
		return nil, err
	}
	if cr.WaitTimeout, err = waitBound(ctx, "wait_timeout", req.GetWaitTimeout()); err != nil {
		return nil, err
	}
	if cr.Tables, err = patterns("tables", req.GetTables()); err != nil {
		return nil, err
	}
	if cr.FullTables, err = patterns("full_tables", req.GetFullTables()); err != nil {
		return nil, err
	}
	cr.Full, cr.ExactPair = req.GetFull(), req.GetExactPair()
	cctx, cancel := s.callCtx(ctx)
	defer cancel()
	res, err := v.CutoverCheck(cctx, cr)
	if err != nil {
		return nil, withTS(cr.UpstreamTS, stopped(cctx, requestField(err, cutoverFields)))
	}
	return cutoverProto(res), nil
}
