package main

// client.go is what the commands that talk to a running `parity serve` over its gRPC API
// (api/parity/v1) share: the connection flags (--addr, --token-file, TLS, --timeout,
// --json), dialing, bearer tokens, printing protobuf answers as JSON for scripts, and
// the exit codes a runbook branches on: 0 pass / equal / done, 1 differences or a
// failed check, 2 an error (bad flags, an unreachable daemon, a gRPC error, printed with
// its code and google.rpc.ErrorInfo reason).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tidb-parity/parity/api/client"
	parityv1 "github.com/tidb-parity/parity/api/parity/v1"
)

// Environment variables that default the connection flags (a runbook sets them once).
const (
	envAPIAddr      = "PARITY_API_ADDR"
	envAPITokenFile = "PARITY_API_TOKEN_FILE"
)

// defaultAPIAddr is api.addr's default.
const defaultAPIAddr = "127.0.0.1:8391"

// clientFlags are the flags of every command that calls the API.
type clientFlags struct {
	addr          string
	tokenFile     string
	tlsCA         string
	tlsCert       string
	tlsKey        string
	tlsServerName string
	timeout       time.Duration
	json          bool
}

// register adds the flags to fs; timeout is the command's default deadline (0: none).
func (f *clientFlags) register(fs *pflag.FlagSet, timeout time.Duration) {
	addr := os.Getenv(envAPIAddr)
	if addr == "" {
		addr = defaultAPIAddr
	}
	fs.StringVar(&f.addr, "addr", addr, "gRPC address of parity serve (api.addr; env "+envAPIAddr+")")
	fs.StringVar(&f.tokenFile, "token-file", os.Getenv(envAPITokenFile), "file holding the bearer token to present (env "+envAPITokenFile+")")
	fs.StringVar(&f.tlsCA, "tls-ca", "", "CA certificate (PEM) to verify the daemon's certificate with; any --tls-* flag turns TLS on")
	fs.StringVar(&f.tlsCert, "tls-cert", "", "client certificate (PEM) for mutual TLS")
	fs.StringVar(&f.tlsKey, "tls-key", "", "client certificate's key (PEM)")
	fs.StringVar(&f.tlsServerName, "tls-server-name", "", "name to verify the daemon's certificate against (default: the host of --addr)")
	fs.DurationVar(&f.timeout, "timeout", timeout, "give up after this long (0: never)")
	fs.BoolVar(&f.json, "json", false, "print the answer as JSON (protojson; a stream prints one object a line)")
}

// useTLS reports whether any TLS flag is set.
func (f *clientFlags) useTLS() bool {
	return f.tlsCA != "" || f.tlsCert != "" || f.tlsKey != "" || f.tlsServerName != ""
}

// context is the command's context with the --timeout deadline, plus extra (the server
// answers a wait that ran out before the caller's own deadline cuts the call).
func (f *clientFlags) context(cmd *cobra.Command, extra time.Duration) (context.Context, context.CancelFunc) {
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	if f.timeout <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, f.timeout+extra)
}

// dial connects to the daemon (lazily: an unreachable daemon fails the first call).
func (f *clientFlags) dial() (*grpc.ClientConn, parityv1.ParityClient, error) {
	if f.addr == "" {
		return nil, nil, usageErr(errors.New("--addr: the daemon's gRPC address is required"))
	}
	c := client.ClientConfig{Addr: f.addr, TLSCA: f.tlsCA, TLSCert: f.tlsCert, TLSKey: f.tlsKey, TLSServerName: f.tlsServerName, TokenFile: f.tokenFile}
	opts, err := c.DialOptions()
	if err != nil {
		return nil, nil, usageErr(fmt.Errorf("--%w", err))
	}
	conn, err := grpc.NewClient(f.addr, opts...)
	if err != nil {
		return nil, nil, usageErr(fmt.Errorf("--addr %s: %w", f.addr, err))
	}
	return conn, parityv1.NewParityClient(conn), nil
}

// call dials the daemon and runs fn with its client and the command's context (the
// --timeout deadline plus extra, see context); the connection is closed after fn.
func (f *clientFlags) call(cmd *cobra.Command, extra time.Duration, fn func(ctx context.Context, c parityv1.ParityClient) error) error {
	conn, c, err := f.dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := f.context(cmd, extra)
	defer cancel()
	return fn(ctx, c)
}

// printAnswer prints an answer on the command's output: as indented JSON with --json,
// else with human.
func printAnswer[M proto.Message](cmd *cobra.Command, f *clientFlags, m M, human func(io.Writer, M) error) error {
	if f.json {
		return printJSON(cmd.OutOrStdout(), m)
	}
	return human(cmd.OutOrStdout(), m)
}

// usageErr is a problem with the command line: exit 2.
func usageErr(err error) error { return &exitError{code: exitNoAnswer, err: err} }

// callErr turns a failed call into exit 2 with the gRPC code and the ErrorInfo reason
// (and its metadata) in the message, e.g.
//
//	GetDiff: NotFound DIFF_NOT_FOUND (name=diffs/x): run x: verification run not found
func callErr(rpc string, err error) error {
	return &exitError{code: exitNoAnswer, err: errors.New(describeCallErr(rpc, err))}
}

func describeCallErr(rpc string, err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Sprintf("%s: %v", rpc, err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s", rpc, st.Code())
	if info := errorInfo(st); info != nil {
		b.WriteString(" " + info.GetReason())
		if md := info.GetMetadata(); len(md) > 0 {
			keys := make([]string, 0, len(md))
			for k := range md {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			parts := make([]string, len(keys))
			for i, k := range keys {
				parts[i] = k + "=" + md[k]
			}
			b.WriteString(" (" + strings.Join(parts, ", ") + ")")
		}
	}
	if m := st.Message(); m != "" {
		b.WriteString(": " + m)
	}
	if st.Code() == codes.Unavailable && strings.Contains(st.Message(), "connect") {
		b.WriteString(" (is parity serve running with api.addr set?)")
	}
	return b.String()
}

// errorInfo is the status's google.rpc.ErrorInfo detail, or nil.
func errorInfo(st *status.Status) *errdetails.ErrorInfo {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info
		}
	}
	return nil
}

// errorReason is the ErrorInfo reason of a call's error ("" without one).
func errorReason(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return ""
	}
	if info := errorInfo(st); info != nil {
		return info.GetReason()
	}
	return ""
}

var (
	jsonOut     = protojson.MarshalOptions{Multiline: true, Indent: "  ", EmitUnpopulated: true}
	jsonOutLine = protojson.MarshalOptions{EmitUnpopulated: true}
)

// printJSON prints m as indented JSON (with every field, so scripts see false and 0).
func printJSON(w io.Writer, m proto.Message) error {
	raw, err := jsonOut.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", raw)
	return err
}

// printJSONLine prints m as one line of JSON (a stream's message).
func printJSONLine(w io.Writer, m proto.Message) error {
	raw, err := jsonOutLine.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", raw)
	return err
}

// isTerminal reports whether w is a terminal (live progress instead of plain lines).
func isTerminal(w io.Writer) bool {
	f, ok := w.(interface{ Fd() uintptr })
	return ok && term.IsTerminal(int(f.Fd()))
}

// fmtTime renders a timestamp in UTC, "-" when unset.
func fmtTime(t *timestamppb.Timestamp) string {
	if t == nil {
		return "-"
	}
	return t.AsTime().UTC().Format("2006-01-02 15:04:05.000 UTC")
}

// fmtDur renders a duration rounded for people, "-" when unset.
func fmtDur(d *durationpb.Duration) string {
	if d == nil {
		return "-"
	}
	v := d.AsDuration()
	switch {
	case v >= time.Minute:
		return v.Round(time.Second).String()
	case v >= time.Second:
		return v.Round(time.Millisecond).String()
	default:
		return v.Round(time.Microsecond).String()
	}
}

// durOrNil is d as a protobuf duration, nil for 0 (the server's default).
func durOrNil(d time.Duration) *durationpb.Duration {
	if d <= 0 {
		return nil
	}
	return durationpb.New(d)
}

// diffName is "diffs/{run_id}" for a run id or a name.
func diffName(s string) string {
	if strings.HasPrefix(s, "diffs/") {
		return s
	}
	return "diffs/" + s
}

// runIDOf is the run id of "diffs/{run_id}".
func runIDOf(name string) string { return strings.TrimPrefix(name, "diffs/") }
