package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	parityv1 "github.com/tidb-parity/parity/api/parity/v1"
)

const (
	readToken    = "read-token-0123456789abcdef"
	operateToken = "operate-token-0123456789abcdef"
	repairToken  = "repair-token-0123456789abcdef"
)

// threeTokens is a token file with one token per role; the repair one is given as its
// SHA-256, as a file may hold hashes instead of secrets.
func threeTokens() string {
	sum := sha256.Sum256([]byte(repairToken))
	return fmt.Sprintf(`# parity API tokens
[[token]]
name = "dashboard"
role = "read"
token = %q

[[token]]
name = "runbook"
role = "operate"
token = %q

[[token]]
name = "oncall"
role = "repair"
sha256 = %q
`, readToken, operateToken, hex.EncodeToString(sum[:]))
}

func writeFile(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil { // WriteFile's mode is masked by umask
		t.Fatal(err)
	}
}

// syncBuffer collects a logger's output across goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func testLogger() (*slog.Logger, *syncBuffer) {
	buf := &syncBuffer{}
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug})), buf
}

// parityServer is the generated service with every method unimplemented: a call that
// passes authentication and authorization ends UNIMPLEMENTED. It records the caller
// the handler saw.
type parityServer struct {
	parityv1.UnimplementedParityServer
	mu      sync.Mutex
	callers []string
}

func (s *parityServer) record(ctx context.Context) {
	name, role := CallerFrom(ctx)
	s.mu.Lock()
	s.callers = append(s.callers, name+"/"+string(role))
	s.mu.Unlock()
}

func (s *parityServer) lastCaller() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.callers) == 0 {
		return ""
	}
	return s.callers[len(s.callers)-1]
}

func (s *parityServer) GetStatus(ctx context.Context, _ *parityv1.GetStatusRequest) (*parityv1.Status, error) {
	s.record(ctx)
	return nil, status.Error(codes.Unimplemented, "GetStatus reached the handler")
}

func (s *parityServer) WatchStatus(_ *parityv1.WatchStatusRequest, stream grpc.ServerStreamingServer[parityv1.Status]) error {
	s.record(stream.Context())
	return status.Error(codes.Unimplemented, "WatchStatus reached the handler")
}

// startServer serves parity.v1 and grpc.health.v1 on a loopback port behind a's
// interceptors, with TLS when cfg is not nil. It stops at the test's end.
func startServer(t *testing.T, a *Authenticator, cfg *tls.Config) (string, *parityServer) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	opts := []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(a.UnaryInterceptor()),
		grpc.ChainStreamInterceptor(a.StreamInterceptor()),
	}
	if cfg != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(cfg)))
	}
	srv := grpc.NewServer(opts...)
	ps := &parityServer{}
	parityv1.RegisterParityServer(srv, ps)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return lis.Addr().String(), ps
}

func dial(t *testing.T, addr string, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func withToken(ctx context.Context, tok string) context.Context {
	if tok == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
}

// invoke calls method (a full name of parity.v1.Parity) with an empty request.
func invoke(ctx context.Context, conn *grpc.ClientConn, method, tok string) error {
	ctx = withToken(ctx, tok)
	c := parityv1.NewParityClient(conn)
	var err error
	switch method {
	case parityv1.Parity_GetStatus_FullMethodName:
		_, err = c.GetStatus(ctx, &parityv1.GetStatusRequest{})
	case parityv1.Parity_StartDiff_FullMethodName:
		_, err = c.StartDiff(ctx, &parityv1.StartDiffRequest{})
	case parityv1.Parity_Repair_FullMethodName:
		_, err = c.Repair(ctx, &parityv1.RepairRequest{})
	case parityv1.Parity_CutoverCheck_FullMethodName:
		_, err = c.CutoverCheck(ctx, &parityv1.CutoverCheckRequest{})
	case parityv1.Parity_WatchStatus_FullMethodName:
		var s grpc.ServerStreamingClient[parityv1.Status]
		if s, err = c.WatchStatus(ctx, &parityv1.WatchStatusRequest{}); err == nil {
			_, err = s.Recv()
		}
	default:
		return fmt.Errorf("invoke: no case for %s", method)
	}
	return err
}

// checkCode fails unless err has code want and, for UNAUTHENTICATED and
// PERMISSION_DENIED, the ErrorInfo reason of that name in parity's domain. It returns
// the ErrorInfo's metadata.
func checkCode(t *testing.T, err error, want codes.Code) map[string]string {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != want {
		t.Fatalf("got %v (%v), want %v", st.Code(), err, want)
	}
	var reason parityv1.ErrorReason
	switch want {
	case codes.Unauthenticated:
		reason = parityv1.ErrorReason_UNAUTHENTICATED
	case codes.PermissionDenied:
		reason = parityv1.ErrorReason_PERMISSION_DENIED
	default:
		return nil
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			if info.Reason != reason.String() || info.Domain != "parity.tidb-parity.io" {
				t.Fatalf("ErrorInfo %v, want reason %s domain parity.tidb-parity.io", info, reason)
			}
			return info.Metadata
		}
	}
	t.Fatalf("%v carries no ErrorInfo", err)
	return nil
}

func TestAuthTokens(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "tokens.toml")
	writeFile(t, file, threeTokens(), 0o600)
	log, logs := testLogger()
	a, err := NewAuthenticator(file, TLSConfig{}, log)
	if err != nil {
		t.Fatal(err)
	}
	if !a.Enabled() {
		t.Fatal("Enabled() = false with a token file")
	}
	addr, ps := startServer(t, a, nil)
	conn := dial(t, addr, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	for _, tc := range []struct {
		name, method, token string
		want                codes.Code
		role, needs         string // PERMISSION_DENIED's metadata
		caller              string // CallerFrom in the handler, for calls that pass
	}{
		{"no token", parityv1.Parity_GetStatus_FullMethodName, "", codes.Unauthenticated, "", "", ""},
		{"wrong token", parityv1.Parity_GetStatus_FullMethodName, "not-a-token-0123456789abcdef", codes.Unauthenticated, "", "", ""},
		{"token prefix", parityv1.Parity_GetStatus_FullMethodName, readToken[:len(readToken)-1], codes.Unauthenticated, "", "", ""},
		{"read GetStatus", parityv1.Parity_GetStatus_FullMethodName, readToken, codes.Unimplemented, "", "", "dashboard/read"},
		{"read WatchStatus", parityv1.Parity_WatchStatus_FullMethodName, readToken, codes.Unimplemented, "", "", "dashboard/read"},
		{"no token WatchStatus", parityv1.Parity_WatchStatus_FullMethodName, "", codes.Unauthenticated, "", "", ""},
		{"read StartDiff", parityv1.Parity_StartDiff_FullMethodName, readToken, codes.PermissionDenied, "read", "operate", ""},
		{"read Repair", parityv1.Parity_Repair_FullMethodName, readToken, codes.PermissionDenied, "read", "repair", ""},
		{"operate GetStatus", parityv1.Parity_GetStatus_FullMethodName, operateToken, codes.Unimplemented, "", "", "runbook/operate"},
		{"operate StartDiff", parityv1.Parity_StartDiff_FullMethodName, operateToken, codes.Unimplemented, "", "", ""},
		{"operate CutoverCheck", parityv1.Parity_CutoverCheck_FullMethodName, operateToken, codes.Unimplemented, "", "", ""},
		{"operate Repair", parityv1.Parity_Repair_FullMethodName, operateToken, codes.PermissionDenied, "operate", "repair", ""},
		{"repair Repair (sha256 entry)", parityv1.Parity_Repair_FullMethodName, repairToken, codes.Unimplemented, "", "", ""},
		{"repair StartDiff", parityv1.Parity_StartDiff_FullMethodName, repairToken, codes.Unimplemented, "", "", ""},
		{"repair GetStatus", parityv1.Parity_GetStatus_FullMethodName, repairToken, codes.Unimplemented, "", "", "oncall/repair"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := invoke(ctx, conn, tc.method, tc.token)
			md := checkCode(t, err, tc.want)
			if tc.want == codes.PermissionDenied && (md["role"] != tc.role || md["needs"] != tc.needs) {
				t.Errorf("metadata %v, want role=%s needs=%s", md, tc.role, tc.needs)
			}
			if tc.want == codes.Unimplemented && !strings.Contains(status.Convert(err).Message(), "reached the handler") &&
				(tc.method == parityv1.Parity_GetStatus_FullMethodName || tc.method == parityv1.Parity_WatchStatus_FullMethodName) {
				t.Errorf("message %q: the call did not reach the test's handler", status.Convert(err).Message())
			}
			if tc.caller != "" {
				if got := ps.lastCaller(); got != tc.caller {
					t.Errorf("CallerFrom in the handler = %q, want %q", got, tc.caller)
				}
			}
		})
	}

	t.Run("malformed authorization", func(t *testing.T) {
		for _, v := range []string{"Basic " + readToken, readToken, "Bearer", "Bearer  "} {
			c := metadata.AppendToOutgoingContext(ctx, "authorization", v)
			_, err := parityv1.NewParityClient(conn).GetStatus(c, &parityv1.GetStatusRequest{})
			checkCode(t, err, codes.Unauthenticated)
		}
		c := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+readToken, "authorization", "Bearer "+repairToken)
		_, err := parityv1.NewParityClient(conn).GetStatus(c, &parityv1.GetStatusRequest{})
		checkCode(t, err, codes.Unauthenticated)
		// The scheme is case-insensitive.
		c = metadata.AppendToOutgoingContext(ctx, "authorization", "bearer "+readToken)
		_, err = parityv1.NewParityClient(conn).GetStatus(c, &parityv1.GetStatusRequest{})
		checkCode(t, err, codes.Unimplemented)
	})

	t.Run("health needs no token", func(t *testing.T) {
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health %v", resp.Status)
		}
	})

	if s := logs.String(); strings.Contains(s, readToken) || strings.Contains(s, operateToken) {
		t.Fatalf("a token went into the logs:\n%s", s)
	}
}

// TestAuthReload revokes a token by rewriting the file: after Reload it is refused, the
// others still work; a broken file keeps the previous set; then the same through
// SIGHUP and ReloadOnSignal.
func TestAuthReload(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "tokens.toml")
	writeFile(t, file, threeTokens(), 0o600)
	log, logs := testLogger()
	a, err := NewAuthenticator(file, TLSConfig{}, log)
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := startServer(t, a, nil)
	conn := dial(t, addr, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	getStatus := parityv1.Parity_GetStatus_FullMethodName

	checkCode(t, invoke(ctx, conn, getStatus, operateToken), codes.Unimplemented)

	// Revoke the runbook's token.
	without := strings.Replace(threeTokens(), fmt.Sprintf("[[token]]\nname = \"runbook\"\nrole = \"operate\"\ntoken = %q\n", operateToken), "", 1)
	if without == threeTokens() {
		t.Fatal("test bug: the runbook entry was not removed")
	}
	writeFile(t, file, without, 0o600)
	checkCode(t, invoke(ctx, conn, getStatus, operateToken), codes.Unimplemented) // not yet reloaded
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	checkCode(t, invoke(ctx, conn, getStatus, operateToken), codes.Unauthenticated)
	checkCode(t, invoke(ctx, conn, getStatus, readToken), codes.Unimplemented)
	checkCode(t, invoke(ctx, conn, parityv1.Parity_Repair_FullMethodName, repairToken), codes.Unimplemented)

	// A broken file: Reload fails naming it and the previous set stays.
	writeFile(t, file, without+"\n[[token]]\nname = \"x\"\nrole = \"admin\"\ntoken = \"0123456789abcdef0123\"\n", 0o600)
	err = a.Reload()
	if err == nil || !strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), `"admin"`) {
		t.Fatalf("Reload of a broken file: %v", err)
	}
	if !strings.Contains(logs.String(), "previous tokens stay in force") {
		t.Fatalf("the failed reload was not logged:\n%s", logs.String())
	}
	checkCode(t, invoke(ctx, conn, getStatus, readToken), codes.Unimplemented)
	checkCode(t, invoke(ctx, conn, getStatus, operateToken), codes.Unauthenticated)

	// SIGHUP: the file gets the runbook back and loses the dashboard's token.
	sigCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.ReloadOnSignal(sigCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("ReloadOnSignal: %v", err)
		}
	}()
	writeFile(t, file, strings.Replace(threeTokens(), readToken, "replaced-token-0123456789abcdef", 1), 0o600)
	// ReloadOnSignal registers for SIGHUP when its goroutine runs; until then SIGHUP
	// would end the test process, so this test listens for it too while it signals.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		<-hup
		time.Sleep(50 * time.Millisecond)
		if status.Code(invoke(ctx, conn, getStatus, readToken)) == codes.Unauthenticated {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("SIGHUP did not reload the token file")
		}
	}
	checkCode(t, invoke(ctx, conn, getStatus, operateToken), codes.Unimplemented)
	checkCode(t, invoke(ctx, conn, getStatus, "replaced-token-0123456789abcdef"), codes.Unimplemented)
}

// TestAuthDisabled: with no token file and no client roles every call passes, and
// CallerFrom is empty.
func TestAuthDisabled(t *testing.T) {
	a, err := NewAuthenticator("", TLSConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if a.Enabled() {
		t.Fatal("Enabled() = true without tokens or client roles")
	}
	if err := a.Reload(); err != nil {
		t.Fatalf("Reload without a token file: %v", err)
	}
	addr, ps := startServer(t, a, nil)
	conn := dial(t, addr, nil)
	for _, m := range []string{parityv1.Parity_GetStatus_FullMethodName, parityv1.Parity_Repair_FullMethodName, parityv1.Parity_WatchStatus_FullMethodName} {
		checkCode(t, invoke(t.Context(), conn, m, ""), codes.Unimplemented)
	}
	if got := ps.lastCaller(); got != "/" {
		t.Fatalf("CallerFrom = %q, want empty", got)
	}
}

// TestAuthEmptyTokenFile: a token file with no tokens still enables authentication
// (fail closed): every call without a certificate is refused.
func TestAuthEmptyTokenFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "tokens.toml")
	writeFile(t, file, "# every token revoked\n", 0o600)
	log, logs := testLogger()
	a, err := NewAuthenticator(file, TLSConfig{}, log)
	if err != nil {
		t.Fatal(err)
	}
	if !a.Enabled() {
		t.Fatal("Enabled() = false with a token file")
	}
	if !strings.Contains(logs.String(), "holds no tokens") {
		t.Fatalf("no warning for an empty token file:\n%s", logs.String())
	}
	addr, _ := startServer(t, a, nil)
	checkCode(t, invoke(t.Context(), dial(t, addr, nil), parityv1.Parity_GetStatus_FullMethodName, readToken), codes.Unauthenticated)
}

func TestRequiredRole(t *testing.T) {
	want := map[string]Role{
		"GetStatus": RoleRead, "WatchStatus": RoleRead, "WaitForApplied": RoleRead,
		"GetUpstreamTSO": RoleRead, "ListUpstreamTables": RoleRead,
		"GetDiff": RoleRead, "WatchDiff": RoleRead, "ListDiffs": RoleRead,
		"ListDifferences": RoleRead, "GetFixSQL": RoleRead,
		"CreateSnapshotPoint": RoleOperate, "StartDiff": RoleOperate, "CancelDiff": RoleOperate,
		"CutoverCheck": RoleOperate,
		"Repair":       RoleRepair,
	}
	// Every method of the service has a role, and exactly the expected one: a new RPC
	// added to the proto fails here until it is given one.
	var names []string
	for _, m := range parityv1.Parity_ServiceDesc.Methods {
		names = append(names, m.MethodName)
	}
	for _, s := range parityv1.Parity_ServiceDesc.Streams {
		names = append(names, s.StreamName)
	}
	for _, m := range parityv1.Fleet_ServiceDesc.Methods {
		names = append(names, m.MethodName)
	}
	want["GetFleetStatus"], want["VerifyFleet"], want["FleetCutoverCheck"] = RoleRead, RoleOperate, RoleOperate
	if len(names) != len(want) {
		t.Errorf("the service has %d methods, the test knows %d", len(names), len(want))
	}
	for _, n := range names {
		svc := parityv1.Parity_ServiceDesc.ServiceName
		if strings.Contains(n, "Fleet") {
			svc = parityv1.Fleet_ServiceDesc.ServiceName
		}
		got, ok := RequiredRole("/" + svc + "/" + n)
		if !ok || got != want[n] || got == "" {
			t.Errorf("RequiredRole(%s) = %q, %v; want %q", n, got, ok, want[n])
		}
	}
	for _, tc := range []struct {
		method string
		role   Role
		ok     bool
	}{
		{"/grpc.health.v1.Health/Check", "", true},
		{"/grpc.health.v1.Health/Watch", "", true},
		{"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", "", true},
		{"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", "", true},
		{"/parity.v1.Parity/DropEverything", "", false},
		{"/parity.v2.Parity/GetStatus", "", false},
		{"/grpc.health.v1.HealthX/Check", "", false},
		{"", "", false},
	} {
		if r, ok := RequiredRole(tc.method); r != tc.role || ok != tc.ok {
			t.Errorf("RequiredRole(%q) = %q, %v; want %q, %v", tc.method, r, ok, tc.role, tc.ok)
		}
	}
}

// TestAuthorizeUnknownMethod: a method without a role is denied to every caller, even
// a repair token (fail closed).
func TestAuthorizeUnknownMethod(t *testing.T) {
	file := filepath.Join(t.TempDir(), "tokens.toml")
	writeFile(t, file, threeTokens(), 0o600)
	a, err := NewAuthenticator(file, TLSConfig{}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	ctx := metadata.NewIncomingContext(t.Context(), metadata.Pairs("authorization", "Bearer "+repairToken))
	_, err = a.authorize(ctx, "/parity.v1.Parity/DropEverything")
	if md := checkCode(t, err, codes.PermissionDenied); md["needs"] != "unknown" {
		t.Fatalf("metadata %v", md)
	}
	if _, err := a.authorize(ctx, parityv1.Parity_Repair_FullMethodName); err != nil {
		t.Fatalf("repair token on Repair: %v", err)
	}
}

// TestTokenMatchComparesAll checks the constant-time property structurally: the
// presented digest is compared with every entry whatever matches, and the right
// entry is found wherever it sits.
func TestTokenMatchComparesAll(t *testing.T) {
	mk := func(n int) *tokenSet {
		s := &tokenSet{}
		for i := range n {
			s.entries = append(s.entries, tokenEntry{name: fmt.Sprintf("t%d", i), role: RoleRead,
				digest: sha256.Sum256(fmt.Appendf(nil, "token-%d-0123456789abcdef", i))})
		}
		return s
	}
	for _, n := range []int{0, 1, 2, 7, 64} {
		s := mk(n)
		for i := -1; i < n; i++ {
			tok := "no-such-token-0123456789abcdef"
			if i >= 0 {
				tok = fmt.Sprintf("token-%d-0123456789abcdef", i)
			}
			e, ok, compared := s.match(sha256.Sum256([]byte(tok)))
			if compared != n {
				t.Errorf("set of %d, token %d: compared %d entries", n, i, compared)
			}
			if ok != (i >= 0) || (ok && e.name != fmt.Sprintf("t%d", i)) {
				t.Errorf("set of %d, token %d: match = %v, %v", n, i, e.name, ok)
			}
		}
		// A digest differing from an entry's only in its last byte does not match.
		if n > 0 {
			d := s.entries[n-1].digest
			d[len(d)-1] ^= 1
			if _, ok, compared := s.match(d); ok || compared != n {
				t.Errorf("set of %d: near miss matched %v after %d comparisons", n, ok, compared)
			}
		}
	}
}

func TestTokenFileErrors(t *testing.T) {
	sum := sha256.Sum256([]byte("x"))
	hexSum := hex.EncodeToString(sum[:])
	for _, tc := range []struct {
		name    string
		content string
		want    []string // each must be in the error
	}{
		{"toml syntax", "[[token]]\nname = \"a\"\nrole = read\n", []string{"line 3"}},
		{"bad role", "[[token]]\nname = \"a\"\nrole = \"read\"\ntoken = \"0123456789abcdef\"\n\n[[token]]\nname = \"b\"\nrole = \"admin\"\ntoken = \"0123456789abcdefX\"\n",
			[]string{"token entry 2 (line 6)", `role "admin" is not one of read, operate, repair`}},
		{"missing name and secret", "[[token]]\nrole = \"read\"\n", []string{"token entry 1 (line 1)", "name is required", "token or sha256 is required"}},
		{"short token", "[[token]]\nname = \"a\"\nrole = \"read\"\ntoken = \"short\"\n", []string{"token entry 1", "5 bytes; at least 16"}},
		{"space in token", "[[token]]\nname = \"a\"\nrole = \"read\"\ntoken = \"0123456789 abcdef\"\n", []string{"spaces or control characters"}},
		{"both", fmt.Sprintf("[[token]]\nname = \"a\"\nrole = \"read\"\ntoken = \"0123456789abcdef\"\nsha256 = %q\n", hexSum), []string{"not both"}},
		{"bad sha256", "[[token]]\nname = \"a\"\nrole = \"read\"\nsha256 = \"abc\"\n", []string{"64 hex digits"}},
		{"bad name", "[[token]]\nname = \"a b\"\nrole = \"read\"\ntoken = \"0123456789abcdef\"\n", []string{`name "a b" may hold only`}},
		{"duplicate name", "[[token]]\nname = \"a\"\nrole = \"read\"\ntoken = \"0123456789abcdef\"\n[[token]]\nname = \"a\"\nrole = \"read\"\ntoken = \"0123456789abcdefg\"\n",
			[]string{"token entry 2 (line 5)", `name "a" is also entry 1's`}},
		{"duplicate token", fmt.Sprintf("[[token]]\nname = \"a\"\nrole = \"read\"\ntoken = \"x0123456789abcdef\"\n[[token]]\nname = \"b\"\nrole = \"repair\"\nsha256 = %q\n",
			func() string { s := sha256.Sum256([]byte("x0123456789abcdef")); return hex.EncodeToString(s[:]) }()),
			[]string{"token entry 2 (line 5)", "same token as entry 1"}},
		{"unknown key", "[[token]]\nname = \"a\"\nrole = \"read\"\nsha-256 = \"00\"\n", []string{"unknown keys token.sha-256", "token or sha256 is required"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "tokens.toml")
			writeFile(t, file, tc.content, 0o600)
			_, err := NewAuthenticator(file, TLSConfig{}, slog.New(slog.DiscardHandler))
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range append([]string{file}, tc.want...) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
	if _, err := NewAuthenticator(filepath.Join(t.TempDir(), "missing.toml"), TLSConfig{}, quiet); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

func TestTokenFilePermissions(t *testing.T) {
	for _, tc := range []struct {
		mode os.FileMode
		warn bool
	}{{0o600, false}, {0o400, false}, {0o640, true}, {0o644, true}, {0o602, true}} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "tokens.toml")
			writeFile(t, file, threeTokens(), tc.mode)
			log, logs := testLogger()
			a, err := NewAuthenticator(file, TLSConfig{}, log)
			if err != nil {
				t.Fatal(err) // a warning, not a failure
			}
			if got := strings.Contains(logs.String(), "accessible to group or others"); got != tc.warn {
				t.Fatalf("warned %v, want %v:\n%s", got, tc.warn, logs.String())
			}
			if tc.warn && !strings.Contains(logs.String(), "file="+file) {
				t.Fatalf("the warning does not name the file:\n%s", logs.String())
			}
			if len(a.tokens.Load().entries) != 3 {
				t.Fatalf("%d tokens loaded", len(a.tokens.Load().entries))
			}
		})
	}
}

func TestCheckExposure(t *testing.T) {
	file := filepath.Join(t.TempDir(), "tokens.toml")
	writeFile(t, file, threeTokens(), 0o600)
	off, err := NewAuthenticator("", TLSConfig{}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	tokens, err := NewAuthenticator(file, TLSConfig{}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	tokensTLS, err := NewAuthenticator(file, TLSConfig{CertFile: "server.pem", KeyFile: "server.key"}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	certs, err := NewAuthenticator("", TLSConfig{CertFile: "s.pem", KeyFile: "s.key", ClientCAFile: "ca.pem",
		ClientRoles: map[string]string{"runbook": "operate"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		addr     string
		insecure bool
		a        *Authenticator
		want     string // "" = allowed, else in the error
	}{
		{"127.0.0.1:8391", false, off, ""},
		{"[::1]:8391", false, off, ""},
		{"localhost:8391", false, off, ""},
		{"127.0.0.2:8391", false, nil, ""},
		{"", false, off, ""},
		{"0.0.0.0:8391", false, off, "no authentication is configured"},
		{":8391", false, off, "no authentication is configured"},
		{"[::]:8391", false, off, "no authentication is configured"},
		{"10.0.0.5:8391", false, nil, "no authentication is configured"},
		{"parity.example.com:8391", false, off, "no authentication is configured"},
		{"0.0.0.0:8391", true, off, ""},
		{"0.0.0.0:8391", false, tokens, "in clear"},
		{"0.0.0.0:8391", true, tokens, ""},
		{"0.0.0.0:8391", false, tokensTLS, ""},
		{"10.0.0.5:8391", false, certs, ""},
		{"127.0.0.1", false, off, "api.addr"},
	} {
		err := CheckExposure(tc.addr, tc.insecure, tc.a)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("CheckExposure(%q, %v): %v", tc.addr, tc.insecure, err)
		case tc.want != "" && err == nil:
			t.Errorf("CheckExposure(%q, %v) allowed it", tc.addr, tc.insecure)
		case tc.want != "":
			for _, w := range []string{tc.want, "api.addr", fmt.Sprintf("%q", tc.addr)} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("CheckExposure(%q, %v) = %q, lacks %q", tc.addr, tc.insecure, err, w)
				}
			}
			if tc.want != "api.addr" && !strings.Contains(err.Error(), "api.insecure") {
				t.Errorf("CheckExposure(%q, %v) = %q, does not name api.insecure", tc.addr, tc.insecure, err)
			}
		}
	}
}

var quiet = slog.New(slog.DiscardHandler)
