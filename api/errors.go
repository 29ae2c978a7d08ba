package api

// errors.go is the one place errors become gRPC statuses: every handler returns plain Go
// errors (wrapped with %w as anywhere else), and the server's innermost interceptor
// turns them into a status with a google.rpc.ErrorInfo detail whose reason is a
// parityv1.ErrorReason name (domain "parity.tidb-parity.io"), so a runbook branches on
// the reason rather than on the message. Statuses made elsewhere (the authenticator's
// UNAUTHENTICATED and PERMISSION_DENIED) pass through unchanged.

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/go-sql-driver/mysql"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	parityv1 "github.com/tidb-parity/parity/api/parity/v1"
	"github.com/tidb-parity/parity/cdc"
	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/checker/verify"
	"github.com/tidb-parity/parity/fleet"
	"github.com/tidb-parity/parity/internal/tso"
)

// ErrorDomain is the google.rpc.ErrorInfo domain of the API's errors.
const ErrorDomain = "parity.tidb-parity.io"

// FieldError is a request field that is not valid: INVALID_ARGUMENT with
// ErrorInfo.metadata["field"] = Field. Backends return it too (a table pattern that
// names no table of the run, say).
type FieldError struct {
	// Field is the request field's name as the proto spells it ("scope", "tables[1]",
	// "snapshot_policy.max_view_age").
	Field string
	Err   error
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Err.Error() }
func (e *FieldError) Unwrap() error { return e.Err }

// fieldErr returns a *FieldError for field with a formatted message.
func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Err: fmt.Errorf(format, args...)}
}

// ServerError is an error reaching one of the daemon's servers: UNAVAILABLE with
// reason SERVER_UNAVAILABLE and metadata["server"] = Server (upstream, downstream).
type ServerError struct {
	Server string
	Err    error
}

func (e *ServerError) Error() string { return e.Server + ": " + e.Err.Error() }
func (e *ServerError) Unwrap() error { return e.Err }

// Errors the server and its backends return.
var (
	// ErrVerificationDisabled: the call needs verify.enabled.
	ErrVerificationDisabled = errors.New("verification is not enabled on this daemon (verify.enabled)")
	// ErrApplierNotRunning: the applier is starting, stopped or failed.
	ErrApplierNotRunning = errors.New("the applier is not running")
	// ErrUnimplemented: the daemon does not offer the call (yet).
	ErrUnimplemented = errors.New("not implemented by this daemon")
	// ErrRunNotFound: the diff run does not exist. Backends may return their own
	// sentinel (verify's, checker's); the server matches those too.
	ErrRunNotFound = errors.New("diff run not found")
	// ErrDeadline: a wait ran out of its own timeout (not the call's deadline).
	ErrDeadline = errors.New("the wait ran out of time")
)

// runErr names the run an error is about (metadata["name"] of DIFF_NOT_FOUND,
// metadata["run_id"] of DIFF_RUNNING) or the TSO (metadata["ts"] of TSO_PAST_GC).
type runErr struct {
	runID string
	ts    uint64
	err   error
}

func (e *runErr) Error() string { return e.err.Error() }
func (e *runErr) Unwrap() error { return e.err }

func withRun(runID string, err error) error {
	if err == nil {
		return nil
	}
	return &runErr{runID: runID, err: err}
}

func withTS(ts uint64, err error) error {
	if err == nil || ts == 0 {
		return err
	}
	return &runErr{ts: ts, err: err}
}

// notFoundErrs are the sentinels of an unknown run.
var notFoundErrs = []error{ErrRunNotFound, verify.ErrRunNotFound, checker.ErrRunNotFound}

// ToStatus returns err as a gRPC status error with an ErrorInfo detail (nil for nil; a
// status error as it is).
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	code, reason, md := classify(err)
	return newStatus(code, reason, err.Error(), md)
}

// newStatus builds a status with an ErrorInfo of reason and md.
func newStatus(code codes.Code, reason parityv1.ErrorReason, msg string, md map[string]string) error {
	st := status.New(code, msg)
	if reason == parityv1.ErrorReason_ERROR_REASON_UNSPECIFIED {
		return st.Err()
	}
	d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: reason.String(), Domain: ErrorDomain, Metadata: md})
	if err != nil {
		return st.Err()
	}
	return d.Err()
}

// classify maps err to its code, reason and metadata. The order matters: the most
// specific cause wins (a deadline while reaching a server is DEADLINE_EXCEEDED).
func classify(err error) (codes.Code, parityv1.ErrorReason, map[string]string) {
	var (
		fe    *FieldError
		busy  *verify.BusyError
		se    *ServerError
		re    *runErr
		runID string
		gcMD  map[string]string
	)
	if errors.As(err, &re) {
		runID = re.runID
		if re.ts != 0 {
			gcMD = map[string]string{"ts": strconv.FormatUint(re.ts, 10)}
		}
	}
	switch {
	case errors.As(err, &fe):
		return codes.InvalidArgument, parityv1.ErrorReason_INVALID_ARGUMENT, map[string]string{"field": fe.Field}
	case errors.Is(err, verify.ErrInvalidRequest):
		return codes.InvalidArgument, parityv1.ErrorReason_INVALID_ARGUMENT, nil
	case isAny(err, notFoundErrs...):
		return codes.NotFound, parityv1.ErrorReason_DIFF_NOT_FOUND, map[string]string{"name": diffName(runID)}
	case errors.Is(err, checker.ErrRunRunning):
		return codes.FailedPrecondition, parityv1.ErrorReason_DIFF_RUNNING, map[string]string{"run_id": runID}
	case errors.As(err, &busy):
		return codes.Aborted, parityv1.ErrorReason_DIFF_BUSY, map[string]string{"run_id": busy.RunID, "trigger": busy.Trigger}
	case errors.Is(err, ErrVerificationDisabled):
		return codes.FailedPrecondition, parityv1.ErrorReason_VERIFICATION_DISABLED, nil
	case errors.Is(err, ErrApplierNotRunning), errors.Is(err, cdc.ErrStopped), errors.Is(err, verify.ErrNotRunning):
		return codes.FailedPrecondition, parityv1.ErrorReason_APPLIER_NOT_RUNNING, nil
	case errors.As(err, new(*fleetOwnershipError)):
		return codes.FailedPrecondition, parityv1.ErrorReason_FLEET_OWNERSHIP, nil
	case errors.Is(err, fleet.ErrNoActive):
		return codes.Unavailable, parityv1.ErrorReason_SERVER_UNAVAILABLE, map[string]string{"server": "fleet member"}
	case errors.Is(err, verify.ErrPairPassed):
		return codes.Aborted, parityv1.ErrorReason_PAIR_PASSED, gcMD
	case errors.Is(err, verify.ErrPastGC), tso.IsGCSafePoint(err):
		return codes.FailedPrecondition, parityv1.ErrorReason_TSO_PAST_GC, gcMD
	case errors.Is(err, errStopping):
		return codes.Unavailable, parityv1.ErrorReason_SERVER_UNAVAILABLE, map[string]string{"server": "parity"}
	case errors.Is(err, ErrDeadline), errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded, parityv1.ErrorReason_DEADLINE, nil
	case errors.Is(err, context.Canceled):
		return codes.Canceled, parityv1.ErrorReason_ERROR_REASON_UNSPECIFIED, nil
	case errors.Is(err, ErrUnimplemented):
		return codes.Unimplemented, parityv1.ErrorReason_ERROR_REASON_UNSPECIFIED, nil
	case errors.As(err, &se):
		return codes.Unavailable, parityv1.ErrorReason_SERVER_UNAVAILABLE, map[string]string{"server": se.Server}
	case isConnErr(err):
		return codes.Unavailable, parityv1.ErrorReason_SERVER_UNAVAILABLE, nil
	}
	return codes.Internal, parityv1.ErrorReason_ERROR_REASON_UNSPECIFIED, nil
}

func isAny(err error, targets ...error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}

// isConnErr reports whether err is a lost or refused connection to a server.
func isConnErr(err error) bool {
	if errors.Is(err, mysql.ErrInvalidConn) || errors.Is(err, driver.ErrBadConn) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne)
}

// diffName is a run's resource name.
func diffName(runID string) string {
	if runID == "" {
		return ""
	}
	return "diffs/" + runID
}
