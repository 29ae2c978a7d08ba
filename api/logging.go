package api

// logging.go logs every call once it ended: its method, code, duration, the caller's
// name (the authenticator's, never its token) and the peer address. Request and
// response bodies are never logged: they hold keys and row values.

import (
	"context"
	"log/slog"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// callSlot carries what inner interceptors learn of a call (the authenticated caller)
// out to the logging interceptor, which runs outside the authenticator.
type callSlot struct{ caller string }

type callSlotKey struct{}

func logCall(log *slog.Logger, ctx context.Context, method string, start time.Time, slot *callSlot, err error) {
	code := status.Code(err)
	level := slog.LevelInfo
	switch code {
	case codes.OK, codes.Canceled, codes.NotFound, codes.InvalidArgument, codes.AlreadyExists, codes.FailedPrecondition, codes.Aborted, codes.DeadlineExceeded:
	case codes.Unauthenticated, codes.PermissionDenied:
		level = slog.LevelWarn
	default:
		level = slog.LevelError
	}
	attrs := []any{"method", method, "code", code.String(), "duration", time.Since(start).Round(time.Microsecond)}
	if slot.caller != "" {
		attrs = append(attrs, "caller", slot.caller)
	}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		attrs = append(attrs, "peer", p.Addr.String())
	}
	if err != nil && level >= slog.LevelWarn {
		attrs = append(attrs, "err", status.Convert(err).Message())
	}
	log.Log(ctx, level, "api call", attrs...)
}

func logUnary(log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		slot := &callSlot{}
		start := time.Now()
		resp, err := h(context.WithValue(ctx, callSlotKey{}, slot), req)
		logCall(log, ctx, info.FullMethod, start, slot, err)
		return resp, err
	}
}

func logStream(log *slog.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		slot := &callSlot{}
		start := time.Now()
		err := h(srv, &ctxStream{ServerStream: ss, ctx: context.WithValue(ss.Context(), callSlotKey{}, slot)})
		logCall(log, ss.Context(), info.FullMethod, start, slot, err)
		return err
	}
}

// noteCaller records the authenticated caller for the log; it runs inside the
// authenticator.
func noteCaller(ctx context.Context) {
	if slot, ok := ctx.Value(callSlotKey{}).(*callSlot); ok {
		slot.caller, _ = CallerFrom(ctx)
	}
}

// innerUnary and innerStream note the caller, and turn the handler's errors into
// statuses (errors.go): the innermost interceptors.
func innerUnary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		noteCaller(ctx)
		resp, err := h(ctx, req)
		return resp, ToStatus(err)
	}
}

func innerStream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		noteCaller(ss.Context())
		return ToStatus(h(srv, ss))
	}
}

// ctxStream is a server stream with another context.
type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *ctxStream) Context() context.Context { return s.ctx }
