package api

import (
	"crypto/tls"
	"errors"
	"fmt"
	"os"

	"github.com/tidb-parity/parity/api/client"
)

// TLSConfig is the API's TLS ([api.tls]): the server's certificate and, optionally, the
// CA that client certificates must chain to and the role of each client certificate.
type TLSConfig struct {
	// CertFile is the server certificate (PEM, with any intermediates after it).
	// Default: "" (plaintext)
	CertFile string `toml:"cert-file"`
	// KeyFile is the server certificate's private key (PEM). Required with CertFile.
	// Default: ""
	KeyFile string `toml:"key-file"`
	// ClientCAFile holds the CA certificates (PEM) client certificates are verified
	// against. A client may still present no certificate and use a token; one that does
	// not chain to these CAs fails the handshake. Needs CertFile.
	// Default: "" (no client certificates)
	ClientCAFile string `toml:"client-ca-file"`
	// ClientRoles maps a verified client certificate's subject — its CommonName, or the
	// full RFC 2253 subject ("CN=runbook,O=Example") — to a role: read, operate or
	// repair. The CommonName is looked up first. Needs ClientCAFile.
	// Default: empty
	ClientRoles map[string]string `toml:"client-roles"`
}

// Validate reports every problem with its key path (api.tls.cert-file, …).
func (c TLSConfig) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
	}
	file := func(key, path string) {
		if path == "" {
			return
		}
		if fi, err := os.Stat(path); err != nil {
			bad(key, "%v", err)
		} else if fi.IsDir() {
			bad(key, "%s is a directory", path)
		}
	}
	switch {
	case c.CertFile != "" && c.KeyFile == "":
		bad("api.tls.key-file", "is required with api.tls.cert-file")
	case c.CertFile == "" && c.KeyFile != "":
		bad("api.tls.cert-file", "is required with api.tls.key-file")
	}
	file("api.tls.cert-file", c.CertFile)
	file("api.tls.key-file", c.KeyFile)
	file("api.tls.client-ca-file", c.ClientCAFile)
	if c.ClientCAFile != "" && c.CertFile == "" {
		bad("api.tls.client-ca-file", "needs api.tls.cert-file and api.tls.key-file (client certificates need TLS)")
	}
	if len(c.ClientRoles) > 0 && c.ClientCAFile == "" {
		bad("api.tls.client-roles", "needs api.tls.client-ca-file (client certificates are verified against it)")
	}
	for subject, role := range c.ClientRoles {
		key := fmt.Sprintf("api.tls.client-roles[%q]", subject)
		if subject == "" {
			bad(key, "the subject is empty")
		}
		if _, err := parseRole(role); err != nil {
			bad(key, "%v", err)
		}
	}
	return errors.Join(errs...)
}

// ServerTLS is the server's TLS configuration, or nil (plaintext) when no certificate
// is configured. With ClientCAFile, client certificates are verified against it when
// given (tls.VerifyClientCertIfGiven): token callers need none, and a certificate from
// another CA fails the handshake.
func (c TLSConfig) ServerTLS() (*tls.Config, error) {
	if c.CertFile == "" && c.KeyFile == "" {
		if c.ClientCAFile != "" {
			return nil, errors.New("api.tls.client-ca-file: needs api.tls.cert-file and api.tls.key-file")
		}
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("api.tls.cert-file %q, api.tls.key-file %q: %w", c.CertFile, c.KeyFile, err)
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
	}
	if c.ClientCAFile != "" {
		pool, err := client.LoadCertPool(c.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("api.tls.client-ca-file: %w", err)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
	}
	return cfg, nil
}
