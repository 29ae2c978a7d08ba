package api

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/go-sql-driver/mysql"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tidb-parity/parity/api/client"
	"github.com/tidb-parity/parity/cdc"
	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/checker/verify"
)

func TestToStatus(t *testing.T) {
	authErr := status.Error(codes.PermissionDenied, "no")
	cases := []struct {
		name   string
		err    error
		code   codes.Code
		reason string
		md     map[string]string
	}{
		{"field", fmt.Errorf("start: %w", &FieldError{Field: "tables[1]", Err: errors.New("bad")}), codes.InvalidArgument, "INVALID_ARGUMENT", map[string]string{"field": "tables[1]"}},
		{"not found (api)", withRun("v1", fmt.Errorf("x: %w", ErrRunNotFound)), codes.NotFound, "DIFF_NOT_FOUND", map[string]string{"name": "diffs/v1"}},
		{"not found (checker)", withRun("d2", fmt.Errorf("x: %w", checker.ErrRunNotFound)), codes.NotFound, "DIFF_NOT_FOUND", map[string]string{"name": "diffs/d2"}},
		{"running", withRun("v3", fmt.Errorf("x: %w", checker.ErrRunRunning)), codes.FailedPrecondition, "DIFF_RUNNING", map[string]string{"run_id": "v3"}},
		{"busy", fmt.Errorf("x: %w", &verify.BusyError{Trigger: "manual", RunID: "v4"}), codes.Aborted, "DIFF_BUSY", map[string]string{"run_id": "v4", "trigger": "manual"}},
		{"disabled", ErrVerificationDisabled, codes.FailedPrecondition, "VERIFICATION_DISABLED", nil},
		{"applier", fmt.Errorf("x: %w", cdc.ErrStopped), codes.FailedPrecondition, "APPLIER_NOT_RUNNING", nil},
		{"verify not running", verify.ErrNotRunning, codes.FailedPrecondition, "APPLIER_NOT_RUNNING", nil},
		{"gc", fmt.Errorf("read: %w", &mysql.MySQLError{Number: 8055, Message: "snapshot is older than GC safe point"}), codes.FailedPrecondition, "TSO_PAST_GC", nil},
		{"past gc", withTS(42, fmt.Errorf("x: %w", verify.ErrPastGC)), codes.FailedPrecondition, "TSO_PAST_GC", map[string]string{"ts": "42"}},
		{"verify not found", withRun("v5", fmt.Errorf("x: %w", verify.ErrRunNotFound)), codes.NotFound, "DIFF_NOT_FOUND", map[string]string{"name": "diffs/v5"}},
		{"verify invalid", fmt.Errorf("x: %w", verify.ErrInvalidRequest), codes.InvalidArgument, "INVALID_ARGUMENT", nil},
		{"own deadline", fmt.Errorf("x: %w", ErrDeadline), codes.DeadlineExceeded, "DEADLINE", nil},
		{"ctx deadline", fmt.Errorf("q: %w", context.DeadlineExceeded), codes.DeadlineExceeded, "DEADLINE", nil},
		{"canceled", context.Canceled, codes.Canceled, "", nil},
		{"stopping", errStopping, codes.Unavailable, "SERVER_UNAVAILABLE", map[string]string{"server": "parity"}},
		{"server", &ServerError{Server: "upstream", Err: errors.New("refused")}, codes.Unavailable, "SERVER_UNAVAILABLE", map[string]string{"server": "upstream"}},
		{"invalid conn", fmt.Errorf("q: %w", mysql.ErrInvalidConn), codes.Unavailable, "SERVER_UNAVAILABLE", nil},
		{"bad conn", fmt.Errorf("q: %w", driver.ErrBadConn), codes.Unavailable, "SERVER_UNAVAILABLE", nil},
		{"net", fmt.Errorf("q: %w", &net.OpError{Op: "dial", Err: errors.New("refused")}), codes.Unavailable, "SERVER_UNAVAILABLE", nil},
		{"unimplemented", fmt.Errorf("x: %w", ErrUnimplemented), codes.Unimplemented, "", nil},
		{"other", errors.New("boom"), codes.Internal, "", nil},
		{"status passes", authErr, codes.PermissionDenied, "", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := ToStatus(c.err)
			if got := status.Code(err); got != c.code {
				t.Fatalf("code %v, want %v (%v)", got, c.code, err)
			}
			if msg := status.Convert(err).Message(); msg != c.err.Error() && c.err != authErr {
				t.Errorf("message %q, want the error's %q", msg, c.err.Error())
			}
			reason, md := client.ReasonOf(err)
			if reason != c.reason {
				t.Fatalf("reason %q, want %q", reason, c.reason)
			}
			if len(md) != len(c.md) {
				t.Fatalf("metadata %v, want %v", md, c.md)
			}
			for k, v := range c.md {
				if md[k] != v {
					t.Fatalf("metadata %v, want %v", md, c.md)
				}
			}
		})
	}
	if ToStatus(nil) != nil {
		t.Fatal("nil error became a status")
	}
}
