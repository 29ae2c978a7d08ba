package api

// client.go is the client side of the API that the CLI and a fleet share: dialing a
// daemon with TLS and a bearer token, the one way a token is read from its file and
// refused in clear to anything but loopback.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
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
		cfg, err := ClientTLS(c.TLSCA, c.TLSCert, c.TLSKey, c.TLSServerName)
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
