package api

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tidb-parity/parity/api/client"
	parityv1 "github.com/tidb-parity/parity/api/parity/v1"
	"github.com/tidb-parity/parity/cdc"
)

// testReplication is an applier whose state and checkpoint the test sets: the server's
// own behaviour (streams, health, limits, errors) is what these tests check; the real
// daemon behind it is tested in cmd/parity.
type testReplication struct {
	mu      sync.Mutex
	state   string
	applied uint64
	now     uint64
}

func (r *testReplication) set(state string, applied uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.state, r.applied = state, applied
}

func (r *testReplication) Status() cdc.Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	return cdc.Status{Changefeed: "cf", State: r.state, AppliedTs: r.applied}
}

func (r *testReplication) WaitApplied(ctx context.Context, ts uint64) error {
	for {
		if r.Status().AppliedTs >= ts {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (r *testReplication) UpstreamTSO(context.Context) (uint64, error) { return r.now, nil }

// startAPI runs a Server on a loopback port until the returned stop is called (or
// the test ends) and returns a client connection to it.
func startAPI(t *testing.T, b Backend, reg prometheus.Registerer) (*grpc.ClientConn, func() error) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.StopTimeout = 2 * time.Second
	s, err := New(cfg, b, Options{Logger: slog.New(slog.DiscardHandler), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, ln) }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	var runErr error
	stop := func() error {
		once.Do(func() {
			cancel()
			runErr = <-done
		})
		return runErr
	}
	t.Cleanup(func() {
		_ = stop()
		conn.Close()
	})
	return conn, stop
}

func TestServerStatusHealthAndStop(t *testing.T) {
	rep := &testReplication{state: "starting"}
	reg := prometheus.NewRegistry()
	conn, stop := startAPI(t, Backend{Replication: rep, Instance: "i1"}, reg)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := parityv1.NewParityClient(conn)
	hc := healthpb.NewHealthClient(conn)

	health := func(want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: ServiceName})
			if err == nil && r.Status == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("health %v, %v; want %v", r, err, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	health(healthpb.HealthCheckResponse_NOT_SERVING)
	rep.set("running", 100<<18)
	// Check answers from the state at the call, not the last poll: at once, no retry.
	if r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: ServiceName}); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health right after the applier runs: %v, %v; want SERVING", r, err)
	}
	rep.set("starting", 100<<18)
	if r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health right after the applier stopped running: %v, %v; want NOT_SERVING", r, err)
	}
	rep.set("running", 100<<18)
	health(healthpb.HealthCheckResponse_SERVING)

	st, err := c.GetStatus(ctx, &parityv1.GetStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.Changefeed != "cf" || st.Instance != "i1" || st.ApplierState != parityv1.ApplierState_APPLIER_STATE_RUNNING ||
		st.AppliedTs != 100<<18 || st.AppliedTime.AsTime().UnixMilli() != 100 || st.Verification.GetEnabled() {
		t.Fatalf("status %v", st)
	}

	// Limits: an interval out of bounds names its field.
	ws, err := c.WatchStatus(ctx, &parityv1.WatchStatusRequest{Interval: durationpb.New(time.Millisecond)})
	if err == nil {
		_, err = ws.Recv()
	}
	wantField(t, err, codes.InvalidArgument, "interval")

	// Verification calls without verification.
	_, err = c.GetDiff(ctx, &parityv1.GetDiffRequest{Name: "diffs/x"})
	wantReason(t, err, codes.FailedPrecondition, "VERIFICATION_DISABLED")

	// WaitForApplied: reached, then a timeout.
	rep.now = 90 << 18
	w, err := c.WaitForApplied(ctx, &parityv1.WaitForAppliedRequest{Target: &parityv1.WaitForAppliedRequest_Now{Now: true}})
	if err != nil || w.TargetTs != 90<<18 || w.AppliedTs != 100<<18 {
		t.Fatalf("wait now: %v, %v", w, err)
	}
	_, err = c.WaitForApplied(ctx, &parityv1.WaitForAppliedRequest{Target: &parityv1.WaitForAppliedRequest_Ts{Ts: 200 << 18},
		Timeout: durationpb.New(100 * time.Millisecond)})
	wantReason(t, err, codes.DeadlineExceeded, "DEADLINE")
	_, err = c.WaitForApplied(ctx, &parityv1.WaitForAppliedRequest{})
	wantField(t, err, codes.InvalidArgument, "target")

	// Reflection lists the service.
	rc, err := rpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Send(&rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	rr, err := rc.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range rr.GetListServicesResponse().GetService() {
		names = append(names, s.Name)
	}
	if !strings.Contains(strings.Join(names, " "), ServiceName) {
		t.Fatalf("reflection lists %v", names)
	}
	_ = rc.CloseSend()

	// A watch and a wait under way when the daemon stops: the watch ends with OK after
	// the messages it sent, the wait fails UNAVAILABLE, and the stop does not wait for
	// the stop timeout.
	ws, err = c.WatchStatus(ctx, &parityv1.WatchStatusRequest{Interval: durationpb.New(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ws.Recv(); err != nil {
		t.Fatal(err)
	}
	waitErr := make(chan error, 1)
	go func() {
		_, err := c.WaitForApplied(ctx, &parityv1.WaitForAppliedRequest{Target: &parityv1.WaitForAppliedRequest_Ts{Ts: 300 << 18}})
		waitErr <- err
	}()
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("stop took %v: the graceful stop waited for the streams", d)
	}
	for {
		_, err := ws.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("watch ended with %v, want OK", err)
		}
	}
	wantReason(t, <-waitErr, codes.Unavailable, "SERVER_UNAVAILABLE")

	// Metrics: every call counted with its code.
	if n := testutil.ToFloat64(mustVec(t, reg, "parity_grpc_server_handled_total", "GetStatus", "OK")); n != 1 {
		t.Errorf("GetStatus OK handled %v, want 1", n)
	}
	if n := testutil.ToFloat64(mustVec(t, reg, "parity_grpc_server_handled_total", "WaitForApplied", "DeadlineExceeded")); n != 1 {
		t.Errorf("WaitForApplied DeadlineExceeded handled %v, want 1", n)
	}
	if n := testutil.ToFloat64(mustVec(t, reg, "parity_grpc_server_handled_total", "CutoverCheck", "OK")); n != 0 {
		t.Errorf("CutoverCheck initialised at %v, want 0", n)
	}
}

// mustVec finds a handled_total series in reg's output.
func mustVec(t *testing.T, reg *prometheus.Registry, name, method, code string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["grpc_service"] == ServiceName && labels["grpc_method"] == method && labels["grpc_code"] == code {
				g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "x"})
				g.Set(m.GetCounter().GetValue())
				return g
			}
		}
	}
	t.Fatalf("no %s{%s,%s}", name, method, code)
	return nil
}

func wantReason(t *testing.T, err error, code codes.Code, reason string) map[string]string {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("error %v, want %v", err, code)
	}
	r, md := client.ReasonOf(err)
	if r != reason {
		t.Fatalf("error %v: reason %q, want %q", err, r, reason)
	}
	return md
}

func wantField(t *testing.T, err error, code codes.Code, field string) {
	t.Helper()
	if md := wantReason(t, err, code, "INVALID_ARGUMENT"); md["field"] != field {
		t.Fatalf("error %v names field %q, want %q", err, md["field"], field)
	}
}
