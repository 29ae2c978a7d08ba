package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/BurntSushi/toml"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	parityv1 "github.com/tidb-parity/parity/api/parity/v1"
)

// Role is what a caller may do. Each role includes the rights of the ones before it:
// read < operate < repair.
type Role string

const (
	// RoleRead may call Get*, List*, Watch*, WaitForApplied and GetFixSQL.
	RoleRead Role = "read"
	// RoleOperate may also start and cancel diffs, create snapshot points and run the
	// cutover check.
	RoleOperate Role = "operate"
	// RoleRepair may also call Repair.
	RoleRepair Role = "repair"
)

// rank orders roles; 0 is no role.
func (r Role) rank() int {
	switch r {
	case RoleRead:
		return 1
	case RoleOperate:
		return 2
	case RoleRepair:
		return 3
	}
	return 0
}

func parseRole(s string) (Role, error) {
	r := Role(s)
	if r.rank() == 0 {
		return "", fmt.Errorf("role %q is not one of read, operate, repair", s)
	}
	return r, nil
}

// methodRoles is the role each RPC of parity.v1.Parity needs (the proto's role
// comments). A method of the service missing here is denied.
var methodRoles = map[string]Role{
	parityv1.Parity_GetStatus_FullMethodName:          RoleRead,
	parityv1.Parity_WatchStatus_FullMethodName:        RoleRead,
	parityv1.Parity_WaitForApplied_FullMethodName:     RoleRead,
	parityv1.Parity_GetUpstreamTSO_FullMethodName:     RoleRead,
	parityv1.Parity_ListUpstreamTables_FullMethodName: RoleRead,
	parityv1.Parity_GetDiff_FullMethodName:            RoleRead,
	parityv1.Parity_WatchDiff_FullMethodName:          RoleRead,
	parityv1.Parity_ListDiffs_FullMethodName:          RoleRead,
	parityv1.Parity_ListDifferences_FullMethodName:    RoleRead,
	parityv1.Parity_GetFixSQL_FullMethodName:          RoleRead,

	parityv1.Parity_CreateSnapshotPoint_FullMethodName: RoleOperate,
	parityv1.Parity_StartDiff_FullMethodName:           RoleOperate,
	parityv1.Parity_CancelDiff_FullMethodName:          RoleOperate,
	parityv1.Parity_CutoverCheck_FullMethodName:        RoleOperate,

	parityv1.Parity_Repair_FullMethodName: RoleRepair,

	parityv1.Fleet_GetFleetStatus_FullMethodName:    RoleRead,
	parityv1.Fleet_VerifyFleet_FullMethodName:       RoleOperate,
	parityv1.Fleet_FleetCutoverCheck_FullMethodName: RoleOperate,
}

// openServices are the services every caller may use without a token: health checks
// (load balancers, Kubernetes probes) and reflection (grpcurl).
var openServices = []string{
	"/grpc.health.v1.Health/",
	"/grpc.reflection.v1.ServerReflection/",
	"/grpc.reflection.v1alpha.ServerReflection/",
}

// RequiredRole is the role a full gRPC method name ("/parity.v1.Parity/StartDiff")
// needs. Health and reflection need none: ("", true). A method it does not know is
// ("", false) and is denied.
func RequiredRole(fullMethod string) (Role, bool) {
	if r, ok := methodRoles[fullMethod]; ok {
		return r, true
	}
	for _, p := range openServices {
		if strings.HasPrefix(fullMethod, p) {
			return "", true
		}
	}
	return "", false
}

// Authenticator checks every call's bearer token or client certificate against the
// token file and api.tls.client-roles, and the caller's role against the method's.
// Its token set is replaced atomically by Reload.
type Authenticator struct {
	tokenFile   string
	tls         TLSConfig
	clientRoles map[string]Role
	log         *slog.Logger

	tokens   atomic.Pointer[tokenSet]
	reloadMu sync.Mutex // one Reload at a time
}

// NewAuthenticator reads the token file (none when tokenFile is empty) and the client
// certificate roles of tlsCfg. An unreadable or invalid token file is an error.
func NewAuthenticator(tokenFile string, tlsCfg TLSConfig, log *slog.Logger) (*Authenticator, error) {
	if log == nil {
		log = slog.Default()
	}
	a := &Authenticator{tokenFile: tokenFile, tls: tlsCfg, log: log, clientRoles: map[string]Role{}}
	var errs []error
	for subject, role := range tlsCfg.ClientRoles {
		r, err := parseRole(role)
		if err != nil {
			errs = append(errs, fmt.Errorf("api.tls.client-roles[%q]: %w", subject, err))
			continue
		}
		a.clientRoles[subject] = r
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	set := &tokenSet{}
	if tokenFile != "" {
		var err error
		if set, err = loadTokenFile(tokenFile, log); err != nil {
			return nil, err
		}
		log.Info("api tokens loaded", "file", tokenFile, "tokens", len(set.entries))
	}
	a.tokens.Store(set)
	return a, nil
}

// Enabled reports whether calls are authenticated: a token file is configured (even
// one holding no tokens, which then admits no token) or client certificates map to
// roles. When it is false every call passes; CheckExposure decides whether that may
// be served.
func (a *Authenticator) Enabled() bool {
	return a != nil && (a.tokenFile != "" || len(a.clientRoles) > 0)
}

// Reload reads the token file again and replaces the token set. On an error the
// previous set stays in force; the error is logged and returned. Without a token file
// it does nothing.
func (a *Authenticator) Reload() error {
	if a.tokenFile == "" {
		return nil
	}
	a.reloadMu.Lock()
	defer a.reloadMu.Unlock()
	set, err := loadTokenFile(a.tokenFile, a.log)
	if err != nil {
		a.log.Error("api token file not reloaded; the previous tokens stay in force",
			"file", a.tokenFile, "tokens", len(a.tokens.Load().entries), "err", err)
		return fmt.Errorf("reload api tokens: %w", err)
	}
	old := a.tokens.Swap(set)
	a.log.Info("api tokens reloaded", "file", a.tokenFile, "tokens", len(set.entries),
		"previous_tokens", len(old.entries))
	return nil
}

// ReloadOnSignal calls Reload on each of sigs (SIGHUP when none are given) until ctx
// ends, then returns nil. A failed reload is logged and keeps the previous tokens; the
// loop goes on. Run it in the daemon's errgroup. While it runs, the signals no longer
// have their default action (SIGHUP would end the process).
func (a *Authenticator) ReloadOnSignal(ctx context.Context, sigs ...os.Signal) error {
	if len(sigs) == 0 {
		sigs = []os.Signal{syscall.SIGHUP}
	}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, sigs...)
	defer signal.Stop(ch)
	for {
		select {
		case <-ctx.Done():
			return nil
		case sig := <-ch:
			if a.tokenFile == "" {
				a.log.Info("api: signal received, no token file to reload", "signal", sig.String())
				continue
			}
			_ = a.Reload() // logged by Reload; the previous tokens stay in force
		}
	}
}

// UnaryInterceptor authenticates and authorizes unary calls.
func (a *Authenticator) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, err := a.authorize(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamInterceptor authenticates and authorizes streaming calls.
func (a *Authenticator) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx, err := a.authorize(ss.Context(), info.FullMethod)
		if err != nil {
			return err
		}
		return handler(srv, &callerStream{ServerStream: ss, ctx: ctx})
	}
}

type callerStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *callerStream) Context() context.Context { return s.ctx }

type callerKey struct{}

type caller struct {
	name string
	role Role
}

// CallerFrom returns the authenticated caller of a call: the token's name (never the
// token) or "cert:" and the client certificate's subject as listed in
// api.tls.client-roles, and its role. Both are empty when authentication is off or the
// method needs no role.
func CallerFrom(ctx context.Context) (name string, role Role) {
	c, _ := ctx.Value(callerKey{}).(caller)
	return c.name, c.role
}

// authorize returns ctx with the caller in it, or the UNAUTHENTICATED or
// PERMISSION_DENIED status for the call.
func (a *Authenticator) authorize(ctx context.Context, method string) (context.Context, error) {
	need, known := RequiredRole(method)
	if known && need == "" {
		return ctx, nil
	}
	if !a.Enabled() {
		return ctx, nil
	}
	c, err := a.identify(ctx)
	if err != nil {
		return nil, err
	}
	if !known {
		return nil, authStatus(codes.PermissionDenied, parityv1.ErrorReason_PERMISSION_DENIED,
			fmt.Sprintf("method %s has no role assigned: denied", method),
			map[string]string{"role": string(c.role), "needs": "unknown"})
	}
	if c.role.rank() < need.rank() {
		return nil, authStatus(codes.PermissionDenied, parityv1.ErrorReason_PERMISSION_DENIED,
			fmt.Sprintf("%s needs role %s; %s has role %s", method, need, c.name, c.role),
			map[string]string{"role": string(c.role), "needs": string(need)})
	}
	return context.WithValue(ctx, callerKey{}, c), nil
}

// identify finds the caller: a bearer token if the call carries one (a wrong token is
// refused even with a good certificate), else a verified client certificate whose
// subject has a role.
func (a *Authenticator) identify(ctx context.Context) (caller, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if vals := md.Get("authorization"); len(vals) > 0 {
		if len(vals) > 1 {
			return caller{}, unauthenticated("more than one authorization value")
		}
		scheme, tok, _ := strings.Cut(strings.TrimSpace(vals[0]), " ")
		tok = strings.TrimSpace(tok)
		if !strings.EqualFold(scheme, "bearer") || tok == "" {
			return caller{}, unauthenticated(`authorization must be "Bearer <token>"`)
		}
		e, ok, _ := a.tokens.Load().match(sha256.Sum256([]byte(tok)))
		if !ok {
			return caller{}, unauthenticated("token not valid")
		}
		return caller{name: e.name, role: e.role}, nil
	}
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.VerifiedChains) > 0 && len(ti.State.VerifiedChains[0]) > 0 {
			leaf := ti.State.VerifiedChains[0][0]
			for _, subject := range []string{leaf.Subject.CommonName, leaf.Subject.String()} {
				if r, ok := a.clientRoles[subject]; ok && subject != "" {
					return caller{name: "cert:" + subject, role: r}, nil
				}
			}
			return caller{}, unauthenticated(fmt.Sprintf("client certificate %q has no role in api.tls.client-roles", leaf.Subject.String()))
		}
	}
	return caller{}, unauthenticated("no bearer token (metadata authorization: Bearer <token>) and no client certificate")
}

// authErrorDomain is google.rpc.ErrorInfo's domain of every parity error.
const authErrorDomain = "parity.tidb-parity.io"

func unauthenticated(msg string) error {
	return authStatus(codes.Unauthenticated, parityv1.ErrorReason_UNAUTHENTICATED, msg, nil)
}

func authStatus(code codes.Code, reason parityv1.ErrorReason, msg string, md map[string]string) error {
	st := status.New(code, msg)
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: reason.String(), Domain: authErrorDomain, Metadata: md}); err == nil {
		st = d
	}
	return st.Err()
}

// CheckExposure refuses to serve the API on addr when anyone beyond this host could
// call it unchecked: a non-loopback address (or a wildcard or empty host) needs
// authentication, and tokens there need TLS so they do not cross the network in
// clear. insecure (api.insecure) allows both. An empty addr (API off) passes.
func CheckExposure(addr string, insecure bool, a *Authenticator) error {
	if addr == "" {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("api.addr %q: %w", addr, err)
	}
	if isLoopback(host) || insecure {
		return nil
	}
	if !a.Enabled() {
		return fmt.Errorf("api.addr %q is not a loopback address and no authentication is configured "+
			"(api.token-file, api.tls.client-roles): anyone who reaches it could start diffs and repairs; "+
			"configure authentication, listen on 127.0.0.1, or set api.insecure = true", addr)
	}
	if a.tokenFile != "" && a.tls.CertFile == "" {
		return fmt.Errorf("api.addr %q is not a loopback address and api.token-file is set without TLS: "+
			"bearer tokens would cross the network in clear; set api.tls.cert-file and api.tls.key-file, "+
			"listen on 127.0.0.1, or set api.insecure = true", addr)
	}
	return nil
}

func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// tokenEntry is one token of the file; digest is the SHA-256 of the token.
type tokenEntry struct {
	name   string
	role   Role
	digest [sha256.Size]byte
}

type tokenSet struct {
	entries []tokenEntry
}

// match finds the entry whose digest is d. It compares d with every entry in constant
// time and never stops early, so the time taken does not tell how much of a token, or
// which entry, matched; compared is how many entries it compared (all of them).
func (s *tokenSet) match(d [sha256.Size]byte) (e tokenEntry, ok bool, compared int) {
	found := -1
	for i := range s.entries {
		eq := subtle.ConstantTimeCompare(d[:], s.entries[i].digest[:])
		found = subtle.ConstantTimeSelect(eq, i, found)
		compared++
	}
	if found < 0 {
		return tokenEntry{}, false, compared
	}
	return s.entries[found], true, compared
}

// tokenFileData is the token file's TOML:
//
//	[[token]]
//	name = "runbook"
//	role = "operate"
//	token = "…"      # or sha256 = "<hex SHA-256 of the token>"
type tokenFileData struct {
	Token []tokenFileEntry `toml:"token"`
}

type tokenFileEntry struct {
	Name   string `toml:"name"`
	Role   string `toml:"role"`
	Token  string `toml:"token"`
	SHA256 string `toml:"sha256"`
}

// minTokenLen is the shortest token the file may hold in clear (16 bytes: a guessable
// token would make the rest pointless).
const minTokenLen = 16

var (
	tokenNameRE   = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)
	tokenHeaderRE = regexp.MustCompile(`^\s*\[\[\s*token\s*\]\]`)
)

// loadTokenFile reads and checks a token file. Each problem names the file and the
// entry (its number and line); a file group or others may read or write is logged.
func loadTokenFile(path string, log *slog.Logger) (*tokenSet, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("api token file: %w", err)
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
		log.Warn("api token file is accessible to group or others; make it readable by parity only (chmod 600)",
			"file", path, "mode", fi.Mode().Perm().String())
	}
	var data tokenFileData
	md, err := toml.Decode(string(raw), &data)
	if err != nil {
		return nil, fmt.Errorf("api token file %s: %w", path, err)
	}
	var errs []error
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		errs = append(errs, fmt.Errorf("api token file %s: unknown keys %s (entries take name, role and token or sha256)",
			path, strings.Join(keys, ", ")))
	}
	// The line of each [[token]] header, to name entries by line as well.
	var lines []int
	for i, l := range bytes.Split(raw, []byte("\n")) {
		if tokenHeaderRE.Match(l) {
			lines = append(lines, i+1)
		}
	}
	where := func(i int) string {
		if len(lines) == len(data.Token) {
			return fmt.Sprintf("api token file %s: token entry %d (line %d)", path, i+1, lines[i])
		}
		return fmt.Sprintf("api token file %s: token entry %d", path, i+1)
	}
	set := &tokenSet{}
	names := map[string]int{}
	digests := map[[sha256.Size]byte]int{}
	for i, t := range data.Token {
		bad := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("%s: %s", where(i), fmt.Sprintf(format, args...)))
		}
		e := tokenEntry{name: t.Name}
		ok := true
		switch {
		case t.Name == "":
			bad("name is required")
			ok = false
		case !tokenNameRE.MatchString(t.Name):
			bad("name %q may hold only letters, digits, '.', '_' and '-'", t.Name)
			ok = false
		default:
			if j, dup := names[t.Name]; dup {
				bad("name %q is also entry %d's", t.Name, j+1)
				ok = false
			} else {
				names[t.Name] = i
			}
		}
		r, err := parseRole(t.Role)
		if err != nil {
			bad("%v", err)
			ok = false
		}
		e.role = r
		switch {
		case t.Token != "" && t.SHA256 != "":
			bad("give token or sha256, not both")
			ok = false
		case t.Token != "":
			if len(t.Token) < minTokenLen {
				bad("token is %d bytes; at least %d are required", len(t.Token), minTokenLen)
				ok = false
			}
			if strings.ContainsFunc(t.Token, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
				bad("token may not contain spaces or control characters")
				ok = false
			}
			e.digest = sha256.Sum256([]byte(t.Token))
		case t.SHA256 != "":
			b, err := hex.DecodeString(t.SHA256)
			if err != nil || len(b) != sha256.Size {
				bad("sha256 must be %d hex digits (printf %%s \"$TOKEN\" | sha256sum)", 2*sha256.Size)
				ok = false
			}
			copy(e.digest[:], b)
		default:
			bad("token or sha256 is required")
			ok = false
		}
		if !ok {
			continue
		}
		if j, dup := digests[e.digest]; dup {
			bad("same token as entry %d", j+1)
			continue
		}
		digests[e.digest] = i
		set.entries = append(set.entries, e)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if len(set.entries) == 0 {
		log.Warn("api token file holds no tokens: only client certificates are accepted", "file", path)
	}
	return set, nil
}
