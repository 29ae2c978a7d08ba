// Package client is the client side of parity's gRPC API, shared by the CLI and the
// fleet: dialing a daemon with TLS and a bearer token (the one way a token is read from
// its file and refused in clear to anything but loopback) and reading an error's
// ErrorInfo reason. It imports no other parity package but the generated code's, so
// the server (package api) may use a fleet built on it.
package client

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// ClientConfig is how a client reaches a daemon's API.
type ClientConfig struct {
	// Addr is the daemon's gRPC address, host:port. Required.
	Addr string
	// TLSCA, TLSCert, TLSKey and TLSServerName turn TLS on when any is set: the CA to
	// verify the daemon's certificate with, a client certificate and its key for mutual
	// TLS, the name to verify (default: Addr's host). Default: plaintext.
	TLSCA, TLSCert, TLSKey, TLSServerName string
	// TokenFile holds the bearer token to present. Default: none.
	TokenFile string
}

// ErrTokenInClear is returned for a token that would be sent without TLS to an address
// that is not loopback.
var ErrTokenInClear = errors.New("refusing to send a bearer token in clear (not loopback); use TLS")

// UsesTLS reports whether the client dials with TLS.
func (c ClientConfig) UsesTLS() bool {
	return c.TLSCA != "" || c.TLSCert != "" || c.TLSKey != "" || c.TLSServerName != ""
}

// DialOptions returns the options to dial c.Addr with; errors name what is wrong
// ("addr", "tls-ca/tls-cert/tls-key", "token-file": the caller adds its own prefix).
func (c ClientConfig) DialOptions() ([]grpc.DialOption, error) {
	host, _, err := net.SplitHostPort(c.Addr)
	if err != nil {
		return nil, fmt.Errorf("addr: want host:port, got %q", c.Addr)
	}
	var opts []grpc.DialOption
	if c.UsesTLS() {
		cfg, err := TLS(c.TLSCA, c.TLSCert, c.TLSKey, c.TLSServerName)
		if err != nil {
			return nil, fmt.Errorf("tls-ca/tls-cert/tls-key: %w", err)
		}
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	} else {
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	if c.TokenFile != "" {
		tok, err := ReadTokenFile(c.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("token-file: %w", err)
		}
		if !c.UsesTLS() && !IsLoopbackHost(host) {
			return nil, fmt.Errorf("token-file: to %s: %w", c.Addr, ErrTokenInClear)
		}
		opts = append(opts, grpc.WithPerRPCCredentials(Bearer{Token: tok, TLS: c.UsesTLS()}))
	}
	return opts, nil
}

// IsLoopbackHost reports whether host is localhost or a loopback IP.
func IsLoopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// ReadTokenFile reads the one bearer token a file holds (surrounding space is not part
// of it).
func ReadTokenFile(path string) (string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	tok := strings.TrimSpace(string(raw))
	if tok == "" {
		return "", fmt.Errorf("%s: the file is empty (want one bearer token)", path)
	}
	if strings.ContainsAny(tok, " \t\r\n") {
		return "", fmt.Errorf("%s: want one bearer token, found several words or lines", path)
	}
	return tok, nil
}

// Bearer presents Token as "authorization: Bearer <token>" on every call.
type Bearer struct {
	Token string
	// TLS: the connection is secured (a token is never sent in clear to other than
	// loopback; DialOptions refuses that).
	TLS bool
}

var _ credentials.PerRPCCredentials = Bearer{}

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (b Bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.Token}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials.
func (b Bearer) RequireTransportSecurity() bool { return b.TLS }

// ReasonOf returns the ErrorInfo reason of a status error ("" without one), and its
// metadata.
func ReasonOf(err error) (reason string, md map[string]string) {
	st, ok := status.FromError(err)
	if !ok {
		return "", nil
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason(), info.GetMetadata()
		}
	}
	return "", nil
}

// TLS is a client's TLS configuration for the API: the server is verified
// against caFile (the system's roots when empty) under serverName (the dialed host when
// empty); certFile and keyFile, both or neither, are the client certificate.
func TLS(caFile, certFile, keyFile, serverName string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	if caFile != "" {
		pool, err := LoadCertPool(caFile)
		if err != nil {
			return nil, fmt.Errorf("CA file: %w", err)
		}
		cfg.RootCAs = pool
	}
	switch {
	case certFile != "" && keyFile != "":
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("client certificate %q, key %q: %w", certFile, keyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	case certFile != "" || keyFile != "":
		return nil, errors.New("a client certificate needs both its certificate and its key file")
	}
	return cfg, nil
}

// LoadCertPool reads a PEM file of CA certificates.
func LoadCertPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return pool, nil
}

// EnumName is an API enum value's name as parity prints it: without the enum's prefix,
// lower case (DIFF_RESULT_EQUAL → "equal").
func EnumName(name, prefix string) string {
	return strings.ToLower(strings.TrimPrefix(name, prefix))
}
