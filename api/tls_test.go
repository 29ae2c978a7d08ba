package api

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"

	"github.com/tidb-parity/parity/api/client"
	parityv1 "github.com/tidb-parity/parity/api/parity/v1"
)

// testCA is a certificate authority made for a test.
type testCA struct {
	cert *x509.Certificate
	key  crypto.Signer
	file string // its certificate, PEM
}

var serial int64

func newSerial() *big.Int { serial++; return big.NewInt(serial) }

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func newCA(t *testing.T, dir, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          newSerial(),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"parity-test"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, name+".pem")
	writePEM(t, file, "CERTIFICATE", der)
	return &testCA{cert: cert, key: key, file: file}
}

// issue signs a certificate for subject: a server certificate for 127.0.0.1 and
// localhost, or a client one. It returns the certificate's and the key's files.
func (ca *testCA) issue(t *testing.T, dir string, subject pkix.Name, server bool) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: newSerial(),
		Subject:      subject,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
		tmpl.DNSNames = []string{"localhost"}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("%s-%d", subject.CommonName, tmpl.SerialNumber)
	certFile = filepath.Join(dir, name+".pem")
	keyFile = filepath.Join(dir, name+".key")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "PRIVATE KEY", keyDER)
	return certFile, keyFile
}

// TestTLSAuth serves the API over TLS with client certificates verified against a test
// CA and mapped to roles, beside tokens.
func TestTLSAuth(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t, dir, "parity-test-ca")
	other := newCA(t, dir, "untrusted-ca")
	serverCert, serverKey := ca.issue(t, dir, pkix.Name{CommonName: "parity-server"}, true)
	runbookCert, runbookKey := ca.issue(t, dir, pkix.Name{CommonName: "runbook-cert"}, false)
	oncallCert, oncallKey := ca.issue(t, dir, pkix.Name{CommonName: "oncall-cert", Organization: []string{"ops"}}, false)
	strangerCert, strangerKey := ca.issue(t, dir, pkix.Name{CommonName: "stranger"}, false)
	// The untrusted CA's certificate has a CommonName that has a role: it must still
	// not get in.
	forgedCert, forgedKey := other.issue(t, dir, pkix.Name{CommonName: "runbook-cert", SerialNumber: "forged"}, false)

	tokenFile := filepath.Join(dir, "tokens.toml")
	writeFile(t, tokenFile, threeTokens(), 0o600)
	cfg := TLSConfig{
		CertFile: serverCert, KeyFile: serverKey, ClientCAFile: ca.file,
		ClientRoles: map[string]string{
			"runbook-cert":            "operate",
			"CN=oncall-cert,O=ops":    "repair", // the full subject
			"CN=stranger,O=elsewhere": "repair", // not stranger's subject
		},
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	serverTLS, err := cfg.ServerTLS()
	if err != nil {
		t.Fatal(err)
	}
	a, err := NewAuthenticator(tokenFile, cfg, quiet)
	if err != nil {
		t.Fatal(err)
	}
	addr, ps := startServer(t, a, serverTLS)
	_, port, _ := net.SplitHostPort(addr)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	client := func(t *testing.T, caFile, certFile, keyFile, serverName string) credentials.TransportCredentials {
		t.Helper()
		c, err := client.TLS(caFile, certFile, keyFile, serverName)
		if err != nil {
			t.Fatal(err)
		}
		return credentials.NewTLS(c)
	}
	for _, tc := range []struct {
		name             string
		target           string
		creds            credentials.TransportCredentials
		method, token    string
		want             codes.Code
		caller           string
		plaintextRefused bool
	}{
		{name: "token over TLS", creds: client(t, ca.file, "", "", ""),
			method: parityv1.Parity_GetStatus_FullMethodName, token: readToken, want: codes.Unimplemented, caller: "dashboard/read"},
		{name: "localhost name", target: "localhost:" + port, creds: client(t, ca.file, "", "", ""),
			method: parityv1.Parity_GetStatus_FullMethodName, token: readToken, want: codes.Unimplemented},
		{name: "no token no cert", creds: client(t, ca.file, "", "", ""),
			method: parityv1.Parity_GetStatus_FullMethodName, want: codes.Unauthenticated},
		{name: "cert by CommonName", creds: client(t, ca.file, runbookCert, runbookKey, "localhost"),
			method: parityv1.Parity_StartDiff_FullMethodName, want: codes.Unimplemented},
		{name: "cert by CommonName reads", creds: client(t, ca.file, runbookCert, runbookKey, "localhost"),
			method: parityv1.Parity_GetStatus_FullMethodName, want: codes.Unimplemented, caller: "cert:runbook-cert/operate"},
		{name: "cert role too low", creds: client(t, ca.file, runbookCert, runbookKey, ""),
			method: parityv1.Parity_Repair_FullMethodName, want: codes.PermissionDenied},
		{name: "cert by full subject", creds: client(t, ca.file, oncallCert, oncallKey, ""),
			method: parityv1.Parity_Repair_FullMethodName, want: codes.Unimplemented},
		{name: "cert by full subject reads", creds: client(t, ca.file, oncallCert, oncallKey, ""),
			method: parityv1.Parity_WatchStatus_FullMethodName, want: codes.Unimplemented, caller: "cert:CN=oncall-cert,O=ops/repair"},
		{name: "trusted cert without a role", creds: client(t, ca.file, strangerCert, strangerKey, ""),
			method: parityv1.Parity_GetStatus_FullMethodName, want: codes.Unauthenticated},
		{name: "trusted cert without a role, with a token", creds: client(t, ca.file, strangerCert, strangerKey, ""),
			method: parityv1.Parity_GetStatus_FullMethodName, token: operateToken, want: codes.Unimplemented, caller: "runbook/operate"},
		{name: "a wrong token is not saved by a good cert", creds: client(t, ca.file, oncallCert, oncallKey, ""),
			method: parityv1.Parity_GetStatus_FullMethodName, token: "wrong-token-0123456789abcdef", want: codes.Unauthenticated},
		// Go's client sends no certificate the server's CAs did not sign: the token
		// authenticates, the certificate plays no part.
		{name: "cert from an untrusted CA, not sent", creds: client(t, ca.file, forgedCert, forgedKey, ""),
			method: parityv1.Parity_GetStatus_FullMethodName, want: codes.Unauthenticated},
		// A client that sends it anyway fails the handshake (forceCert itself works:
		// the next case).
		{name: "cert from an untrusted CA", creds: forceCert(t, ca.file, forgedCert, forgedKey),
			method: parityv1.Parity_GetStatus_FullMethodName, token: repairToken, want: codes.Unavailable},
		{name: "forced trusted cert", creds: forceCert(t, ca.file, runbookCert, runbookKey),
			method: parityv1.Parity_StartDiff_FullMethodName, want: codes.Unimplemented},
		{name: "server not trusted by the client", creds: client(t, other.file, "", "", ""),
			method: parityv1.Parity_GetStatus_FullMethodName, token: readToken, want: codes.Unavailable},
		{name: "plaintext client", method: parityv1.Parity_GetStatus_FullMethodName, token: readToken, want: codes.Unavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			target := tc.target
			if target == "" {
				target = addr
			}
			err := invoke(ctx, dial(t, target, tc.creds), tc.method, tc.token)
			checkCode(t, err, tc.want)
			if tc.want == codes.Unavailable {
				t.Logf("refused: %v", err)
			}
			if tc.caller != "" {
				if got := ps.lastCaller(); got != tc.caller {
					t.Errorf("CallerFrom = %q, want %q", got, tc.caller)
				}
			}
		})
	}
}

// forceCert is a client's TLS that presents the certificate whatever CAs the server
// asks for.
func forceCert(t *testing.T, caFile, certFile, keyFile string) credentials.TransportCredentials {
	t.Helper()
	c, err := client.TLS(caFile, "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }
	return credentials.NewTLS(c)
}

func TestTLSValidate(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t, dir, "ca")
	cert, key := ca.issue(t, dir, pkix.Name{CommonName: "srv"}, true)
	missing := filepath.Join(dir, "missing.pem")
	for _, tc := range []struct {
		name string
		cfg  TLSConfig
		want []string // "" = valid
	}{
		{"empty", TLSConfig{}, nil},
		{"server only", TLSConfig{CertFile: cert, KeyFile: key}, nil},
		{"mtls", TLSConfig{CertFile: cert, KeyFile: key, ClientCAFile: ca.file, ClientRoles: map[string]string{"a": "read"}}, nil},
		{"cert without key", TLSConfig{CertFile: cert}, []string{"api.tls.key-file: is required with api.tls.cert-file"}},
		{"key without cert", TLSConfig{KeyFile: key}, []string{"api.tls.cert-file: is required with api.tls.key-file"}},
		{"missing files", TLSConfig{CertFile: missing, KeyFile: dir, ClientCAFile: missing},
			[]string{"api.tls.cert-file: stat " + missing, "api.tls.key-file: " + dir + " is a directory", "api.tls.client-ca-file: stat " + missing}},
		{"client CA without TLS", TLSConfig{ClientCAFile: ca.file}, []string{"api.tls.client-ca-file: needs api.tls.cert-file"}},
		{"roles without client CA", TLSConfig{CertFile: cert, KeyFile: key, ClientRoles: map[string]string{"a": "read"}},
			[]string{"api.tls.client-roles: needs api.tls.client-ca-file"}},
		{"bad roles", TLSConfig{CertFile: cert, KeyFile: key, ClientCAFile: ca.file, ClientRoles: map[string]string{"a": "admin", "": "read"}},
			[]string{`api.tls.client-roles["a"]: role "admin" is not one of read, operate, repair`, `api.tls.client-roles[""]: the subject is empty`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatal("valid")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q lacks %q", err, w)
				}
			}
		})
	}
}

func TestServerTLS(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t, dir, "ca")
	cert, key := ca.issue(t, dir, pkix.Name{CommonName: "srv"}, true)
	_, otherKey := ca.issue(t, dir, pkix.Name{CommonName: "other"}, true)
	notPEM := filepath.Join(dir, "not.pem")
	writeFile(t, notPEM, "not a certificate\n", 0o600)

	if c, err := (TLSConfig{}).ServerTLS(); c != nil || err != nil {
		t.Fatalf("no certificate: %v, %v; want plaintext", c, err)
	}
	c, err := TLSConfig{CertFile: cert, KeyFile: key}.ServerTLS()
	if err != nil || c.ClientCAs != nil || c.ClientAuth != 0 {
		t.Fatalf("server only: %v, %v", c, err)
	}
	c, err = TLSConfig{CertFile: cert, KeyFile: key, ClientCAFile: ca.file}.ServerTLS()
	if err != nil || c.ClientCAs == nil || c.ClientAuth.String() != "VerifyClientCertIfGiven" {
		t.Fatalf("mtls: %v, %v", c, err)
	}
	for _, tc := range []struct {
		cfg  TLSConfig
		want string
	}{
		{TLSConfig{CertFile: cert, KeyFile: otherKey}, "api.tls.cert-file"},
		{TLSConfig{CertFile: cert, KeyFile: key, ClientCAFile: notPEM}, "api.tls.client-ca-file: " + notPEM + " holds no PEM certificate"},
		{TLSConfig{ClientCAFile: ca.file}, "api.tls.client-ca-file"},
	} {
		if _, err := tc.cfg.ServerTLS(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ServerTLS(%+v) = %v, want %q", tc.cfg, err, tc.want)
		}
	}

	if _, err := client.TLS("", cert, "", ""); err == nil {
		t.Error("ClientTLS with a certificate and no key")
	}
	if _, err := client.TLS(notPEM, "", "", ""); err == nil || !strings.Contains(err.Error(), notPEM) {
		t.Errorf("ClientTLS with a bad CA file: %v", err)
	}
	if c, err := client.TLS("", "", "", "parity.example.com"); err != nil || c.RootCAs != nil || c.ServerName != "parity.example.com" {
		t.Errorf("ClientTLS with system roots: %v, %v", c, err)
	}
}
