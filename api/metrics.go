package api

// metrics.go counts the server's calls for Prometheus, as go-grpc-prometheus names them
// (with the parity_ prefix): started, handled by code, and the handling time.

import (
	"context"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Metrics are the server's call metrics.
type Metrics struct {
	started  *prometheus.CounterVec
	handled  *prometheus.CounterVec
	handling *prometheus.HistogramVec
}

var _ prometheus.Collector = (*Metrics)(nil)

// NewMetrics returns the call metrics of the daemon applying changefeed (their changefeed
// label); register them (they are a prometheus.Collector).
func NewMetrics(changefeed string) *Metrics {
	l := []string{"grpc_service", "grpc_method"}
	cl := prometheus.Labels{"changefeed": changefeed}
	return &Metrics{
		started: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "parity_grpc_server_started_total",
			Help: "gRPC calls started on the API server.", ConstLabels: cl}, l),
		handled: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "parity_grpc_server_handled_total",
			Help: "gRPC calls completed on the API server, by status code.", ConstLabels: cl}, append(l, "grpc_code")),
		handling: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "parity_grpc_server_handling_seconds",
			Help: "Time the API server took to complete a call (streams: their whole life).", ConstLabels: cl,
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}}, l),
	}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.started.Describe(ch)
	m.handled.Describe(ch)
	m.handling.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.started.Collect(ch)
	m.handled.Collect(ch)
	m.handling.Collect(ch)
}

// init creates the series of every method of srv at 0 (started, handled OK), so rates
// exist before the first call.
func (m *Metrics) init(srv *grpc.Server) {
	for svc, info := range srv.GetServiceInfo() {
		for _, meth := range info.Methods {
			m.started.WithLabelValues(svc, meth.Name)
			m.handled.WithLabelValues(svc, meth.Name, codes.OK.String())
			m.handling.WithLabelValues(svc, meth.Name)
		}
	}
}

func splitMethod(full string) (service, method string) {
	full = strings.TrimPrefix(full, "/")
	if i := strings.LastIndex(full, "/"); i >= 0 {
		return full[:i], full[i+1:]
	}
	return "unknown", full
}

func (m *Metrics) observe(full string, start time.Time, err error) {
	svc, meth := splitMethod(full)
	m.handled.WithLabelValues(svc, meth, status.Code(err).String()).Inc()
	m.handling.WithLabelValues(svc, meth).Observe(time.Since(start).Seconds())
}

func (m *Metrics) unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		svc, meth := splitMethod(info.FullMethod)
		m.started.WithLabelValues(svc, meth).Inc()
		start := time.Now()
		resp, err := h(ctx, req)
		m.observe(info.FullMethod, start, err)
		return resp, err
	}
}

func (m *Metrics) stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		svc, meth := splitMethod(info.FullMethod)
		m.started.WithLabelValues(svc, meth).Inc()
		start := time.Now()
		err := h(srv, ss)
		m.observe(info.FullMethod, start, err)
		return err
	}
}
