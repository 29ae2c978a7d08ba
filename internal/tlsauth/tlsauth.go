// Package tlsauth holds the settings of parity's encrypted and authenticated
// connections to the servers it reads and writes — TLS to MySQL, MariaDB and TiDB (a
// [upstream.tls] or [downstream.tls] table beside a DSN), TLS and SASL to Kafka
// ([changefeed.tls], [changefeed.sasl]) — and turns them into what the drivers take: a
// TLS config registered with go-sql-driver/mysql and named in the DSN, a kafka-go
// Dialer and Transport.
//
// It is its own package because the applier (cdc), the diff (checker, through cmd),
// loadgen and the commands share the settings; it imports neither cdc nor checker.
//
// The server's certificate is verified here rather than by crypto/tls, so that a
// refusal names the setting to change (server-name, ca-file) instead of only the x509
// error.
package tlsauth

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/go-sql-driver/mysql"
)

// TLS is a client's TLS to one server (the [upstream.tls], [downstream.tls] and
// [changefeed.tls] tables). TLS is on when Enabled or any other field is set.
type TLS struct {
	// Enabled turns TLS on with the system's CAs when no other key is set (every other
	// key turns it on by itself).
	// Default: false
	Enabled bool `toml:"enabled"`
	// CAFile holds the CA certificates (PEM) the server's certificate must chain to.
	// Default: "" (the system's CAs)
	CAFile string `toml:"ca-file"`
	// CertFile is the client certificate (PEM, intermediates after it) presented to a
	// server that asks for one (MariaDB/MySQL REQUIRE X509, Kafka ssl.client.auth).
	// Needs KeyFile.
	// Default: "" (no client certificate)
	CertFile string `toml:"cert-file"`
	// KeyFile is the client certificate's private key (PEM). Needs CertFile.
	// Default: ""
	KeyFile string `toml:"key-file"`
	// ServerName is the name the server's certificate must be valid for.
	// Default: "" (the host of the address dialed: the DSN's host, each broker's host)
	ServerName string `toml:"server-name"`
	// InsecureSkipVerify accepts any certificate the server presents: the connection is
	// encrypted but anyone on the path can impersonate the server. For tests only;
	// parity warns at every start while it is set.
	// Default: false
	InsecureSkipVerify bool `toml:"insecure-skip-verify"`
}

// On tells whether TLS is configured.
func (t TLS) On() bool {
	return t.Enabled || t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != "" || t.InsecureSkipVerify
}

// Validate reports every problem of t, each prefixed with its key path under key
// ("downstream.tls"). It reads nothing but the files' existence.
func (t TLS) Validate(key string) error {
	var errs []error
	bad := func(k, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s.%s: %s", key, k, fmt.Sprintf(format, a...)))
	}
	file := func(k, path string) {
		if path == "" {
			return
		}
		if fi, err := os.Stat(path); err != nil {
			bad(k, "%v", err)
		} else if fi.IsDir() {
			bad(k, "%s is a directory", path)
		}
	}
	switch {
	case t.CertFile != "" && t.KeyFile == "":
		bad("key-file", "is required with %s.cert-file", key)
	case t.CertFile == "" && t.KeyFile != "":
		bad("cert-file", "is required with %s.key-file", key)
	}
	file("ca-file", t.CAFile)
	file("cert-file", t.CertFile)
	file("key-file", t.KeyFile)
	if t.InsecureSkipVerify && (t.CAFile != "" || t.ServerName != "") {
		bad("insecure-skip-verify", "is set with %s.ca-file or %s.server-name, which it would ignore: verify, or skip verification, not both", key, key)
	}
	if strings.ContainsAny(t.ServerName, " /:") {
		bad("server-name", "%q is not a host name", t.ServerName)
	}
	return errors.Join(errs...)
}

// Warnings are the warnings a start with t prints (insecure-skip-verify).
func (t TLS) Warnings(key string) []string {
	if !t.InsecureSkipVerify {
		return nil
	}
	return []string{fmt.Sprintf("%s.insecure-skip-verify is set: the server's certificate is NOT verified, "+
		"so anyone on the network path can impersonate the server and read or change the traffic (credentials included); "+
		"set %s.ca-file instead", key, key)}
}

// Config returns the TLS configuration for the server at addr (host:port), loading the
// files now. key names the settings in errors ("downstream.tls").
func (t TLS) Config(key, addr string) (*tls.Config, error) {
	var roots *x509.CertPool // nil: the system's
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("%s.ca-file: %w", key, err)
		}
		roots = x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s.ca-file: %s holds no PEM certificate", key, t.CAFile)
		}
	}
	name := t.ServerName
	if name == "" {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			host = addr
		}
		name = host
	}
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: name,
		// Verified by VerifyConnection below, which names the setting that refused it.
		InsecureSkipVerify: true, //nolint:gosec // verified in VerifyConnection unless insecure-skip-verify
	}
	if t.CertFile != "" || t.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("%s.cert-file %q, %s.key-file %q: %w", key, t.CertFile, key, t.KeyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	if !t.InsecureSkipVerify {
		v := verifier{key: key, addr: addr, name: name, nameSet: t.ServerName != "", roots: roots, caFile: t.CAFile}
		cfg.VerifyConnection = v.verify
	}
	return cfg, nil
}

// verifier checks a server's certificate chain and name as crypto/tls would, with
// errors that name the setting to change.
type verifier struct {
	key, addr, name string
	nameSet         bool
	roots           *x509.CertPool
	caFile          string
}

func (v verifier) verify(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return fmt.Errorf("%s: the server at %s presented no certificate", v.key, v.addr)
	}
	leaf := cs.PeerCertificates[0]
	opts := x509.VerifyOptions{Roots: v.roots, DNSName: v.name, Intermediates: x509.NewCertPool()}
	for _, c := range cs.PeerCertificates[1:] {
		opts.Intermediates.AddCert(c)
	}
	_, err := leaf.Verify(opts)
	if err == nil {
		return nil
	}
	var (
		he x509.HostnameError
		ua x509.UnknownAuthorityError
	)
	switch {
	case errors.As(err, &he):
		from := fmt.Sprintf("as %s.server-name says", v.key)
		if !v.nameSet {
			from = fmt.Sprintf("the host dialed; set %s.server-name to a name the certificate holds", v.key)
		}
		return fmt.Errorf("%s.server-name: the certificate of the server at %s is valid for %s, not %q (%s): %w",
			v.key, v.addr, certNames(leaf), v.name, from, err)
	case errors.As(err, &ua):
		if v.caFile != "" {
			return fmt.Errorf("%s.ca-file: the certificate of the server at %s (issued by %q) is not signed by a CA in %s: %w",
				v.key, v.addr, leaf.Issuer.String(), v.caFile, err)
		}
		return fmt.Errorf("%s.ca-file: the certificate of the server at %s (issued by %q) is not signed by a CA the system trusts; set %s.ca-file: %w",
			v.key, v.addr, leaf.Issuer.String(), v.key, err)
	}
	return fmt.Errorf("%s: the certificate of the server at %s is not valid: %w", v.key, v.addr, err)
}

// certNames lists the names a certificate is valid for.
func certNames(c *x509.Certificate) string {
	var names []string
	names = append(names, c.DNSNames...)
	for _, ip := range c.IPAddresses {
		names = append(names, ip.String())
	}
	if len(names) == 0 && c.Subject.CommonName != "" {
		names = append(names, "CN="+c.Subject.CommonName+" (no subject alternative names)")
	}
	if len(names) == 0 {
		return "no name"
	}
	return strings.Join(names, ", ")
}

// ValidateDSN reports a DSN that sets its own tls parameter while t is on: the two would
// disagree, so one of them must go.
func (t TLS) ValidateDSN(key, dsn string) error {
	if !t.On() {
		return nil
	}
	mc, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil // the DSN's own check reports it
	}
	if mc.TLSConfig != "" && !strings.HasPrefix(mc.TLSConfig, registeredPrefix) {
		return fmt.Errorf("%s: the DSN sets tls=%s as well: use the %s table or the DSN parameter, not both", key, mc.TLSConfig, key)
	}
	return nil
}

// registeredPrefix starts the names of the TLS configs DSN registers.
const registeredPrefix = "parity-"

// DSN returns dsn with t applied: t's TLS config for the DSN's address is registered
// with go-sql-driver/mysql (mysql.RegisterTLSConfig) under a name of its own and set as
// the parsed DSN's TLS config name, so every pool opened from the returned DSN, wherever
// it is parsed, uses it. dsn comes back unchanged when t is off. key names the settings
// in errors ("downstream.tls"). The files are read now: a certificate renewed on disk
// is used from the next start.
func DSN(dsn string, t TLS, key string) (string, error) {
	if !t.On() {
		return dsn, nil
	}
	if err := t.ValidateDSN(key, dsn); err != nil {
		return "", err
	}
	mc, err := mysql.ParseDSN(dsn)
	if err != nil {
		return "", fmt.Errorf("%s: parsing the DSN: %w", key, err)
	}
	cfg, err := t.Config(key, mc.Addr)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00%s\x00%s\x00%s\x00%s\x00%t", key, mc.Net, mc.Addr, t.CAFile, t.CertFile, t.KeyFile, t.ServerName, t.InsecureSkipVerify)
	name := registeredPrefix + hex.EncodeToString(h.Sum(nil)[:8])
	if err := mysql.RegisterTLSConfig(name, cfg); err != nil {
		return "", fmt.Errorf("%s: %w", key, err)
	}
	mc.TLSConfig = name
	mc.TLS = nil
	mc.AllowFallbackToPlaintext = false
	return mc.FormatDSN(), nil
}

// dialTLS dials addr and completes a TLS handshake with t's config for it.
func dialTLS(ctx context.Context, d *net.Dialer, t TLS, key, network, addr string) (net.Conn, error) {
	cfg, err := t.Config(key, addr)
	if err != nil {
		return nil, err
	}
	raw, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	c := tls.Client(raw, cfg)
	if err := c.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, fmt.Errorf("TLS handshake with %s: %w", addr, err)
	}
	return c, nil
}
