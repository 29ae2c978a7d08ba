package tlsauth_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"database/sql"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/tidb-parity/parity/internal/testenv"
	"github.com/tidb-parity/parity/internal/tlsauth"
)

func TestValidate(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "x.pem")
	if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		tls  tlsauth.TLS
		want []string // each must appear; none: valid
	}{
		{"off", tlsauth.TLS{}, nil},
		{"enabled only", tlsauth.TLS{Enabled: true}, nil},
		{"all files", tlsauth.TLS{CAFile: f, CertFile: f, KeyFile: f, ServerName: "db.example"}, nil},
		{"cert without key", tlsauth.TLS{CertFile: f}, []string{"downstream.tls.key-file: is required with downstream.tls.cert-file"}},
		{"key without cert", tlsauth.TLS{KeyFile: f}, []string{"downstream.tls.cert-file: is required with downstream.tls.key-file"}},
		{"missing files", tlsauth.TLS{CAFile: filepath.Join(dir, "nope.pem")}, []string{"downstream.tls.ca-file: ", "nope.pem"}},
		{"directory", tlsauth.TLS{CAFile: dir}, []string{"downstream.tls.ca-file: " + dir + " is a directory"}},
		{"skip verify and ca", tlsauth.TLS{InsecureSkipVerify: true, CAFile: f}, []string{"downstream.tls.insecure-skip-verify: is set with"}},
		{"bad server name", tlsauth.TLS{ServerName: "db:3306"}, []string{"downstream.tls.server-name: "}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.tls.Validate("downstream.tls")
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("want an error with %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestSASLValidate(t *testing.T) {
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		sasl    tlsauth.SASL
		withTLS bool
		want    []string
	}{
		{"off", tlsauth.SASL{}, false, nil},
		{"scram without tls", tlsauth.SASL{Mechanism: "SCRAM-SHA-512", Username: "u", Password: "p"}, false, nil},
		{"plain with tls", tlsauth.SASL{Mechanism: "plain", Username: "u", PasswordFile: pwFile}, true, nil},
		{"plain without tls", tlsauth.SASL{Mechanism: "plain", Username: "u", Password: "p"}, false, []string{"changefeed.sasl.mechanism: plain sends the password in the clear"}},
		{"unknown mechanism", tlsauth.SASL{Mechanism: "gssapi", Username: "u", Password: "p"}, true, []string{`changefeed.sasl.mechanism: want plain, scram-sha-256 or scram-sha-512, got "gssapi"`}},
		{"no user, no password", tlsauth.SASL{Mechanism: "scram-sha-256"}, true, []string{"changefeed.sasl.username: is required", "changefeed.sasl.password: is required"}},
		{"both passwords", tlsauth.SASL{Mechanism: "scram-sha-256", Username: "u", Password: "p", PasswordFile: pwFile}, true, []string{"changefeed.sasl.password-file: is set with changefeed.sasl.password"}},
		{"user without mechanism", tlsauth.SASL{Username: "u", Password: "hunter2"}, true, []string{"changefeed.sasl.mechanism: is required"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.sasl.Validate("changefeed.sasl", tc.withTLS)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("want an error with %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			for _, secret := range []string{"hunter2", tc.sasl.Password} {
				if secret != "" && secret != "p" && strings.Contains(err.Error(), secret) {
					t.Errorf("error %q holds the password", err)
				}
			}
		})
	}
}

func TestDSN(t *testing.T) {
	dir := testenv.Require(t, testenv.EnvTLSDir)
	ca := tlsauth.TLS{CAFile: filepath.Join(dir, "ca.pem")}
	const dsn = "u:pw@tcp(db.example:3306)/app?timeout=5s"
	if got, err := tlsauth.DSN(dsn, tlsauth.TLS{}, "downstream.tls"); err != nil || got != dsn {
		t.Fatalf("TLS off: %q, %v; want the DSN unchanged", got, err)
	}
	got, err := tlsauth.DSN(dsn, ca, "downstream.tls")
	if err != nil {
		t.Fatal(err)
	}
	mc, err := mysql.ParseDSN(got)
	if err != nil {
		t.Fatalf("the DSN with TLS does not parse: %v", err)
	}
	if !strings.HasPrefix(mc.TLSConfig, "parity-") || mc.TLS == nil || mc.TLS.ServerName != "db.example" || mc.Passwd != "pw" || mc.DBName != "app" || mc.Timeout != 5*time.Second {
		t.Fatalf("DSN with TLS %q: config %q, server name %v; the rest must be kept", got, mc.TLSConfig, mc.TLS)
	}
	again, err := tlsauth.DSN(got, ca, "downstream.tls")
	if err != nil || again != got {
		t.Fatalf("applying again: %q, %v; want %q", again, err, got)
	}
	if _, err := tlsauth.DSN(dsn+"&tls=skip-verify", ca, "downstream.tls"); err == nil || !strings.Contains(err.Error(), "downstream.tls: the DSN sets tls=skip-verify as well") {
		t.Fatalf("a DSN with its own tls parameter: %v", err)
	}
	if _, err := tlsauth.DSN(dsn, tlsauth.TLS{CAFile: filepath.Join(dir, "client-key.pem")}, "upstream.tls"); err == nil || !strings.Contains(err.Error(), "upstream.tls.ca-file:") {
		t.Fatalf("a CA file without a certificate: %v", err)
	}
	if w := (tlsauth.TLS{InsecureSkipVerify: true}).Warnings("upstream.tls"); len(w) != 1 || !strings.Contains(w[0], "upstream.tls.insecure-skip-verify is set: the server's certificate is NOT verified") {
		t.Fatalf("warnings %q", w)
	}
}

// otherCA writes a CA certificate that signed none of the servers'.
func otherCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "another CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "other-ca.pem")
	if err := os.WriteFile(f, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// connect opens dsn with t applied and runs query on one connection, returning its
// first column.
func connect(t *testing.T, dsn string, tl tlsauth.TLS, query string) (string, error) {
	t.Helper()
	d, err := tlsauth.DSN(dsn, tl, "downstream.tls")
	if err != nil {
		return "", err
	}
	db, err := sql.Open("mysql", d)
	if err != nil {
		return "", err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out sql.NullString
	rows, err := db.QueryContext(ctx, query)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	if !rows.Next() {
		return "", rows.Err()
	}
	dest := make([]any, len(cols))
	for i := range dest {
		dest[i] = new(sql.RawBytes)
	}
	dest[len(cols)-1] = &out
	if err := rows.Scan(dest...); err != nil {
		return "", err
	}
	return out.String, nil
}

// password returns the password of dsn.
func password(t *testing.T, dsn string) string {
	t.Helper()
	mc, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return mc.Passwd
}

// serverTLS tests a server that refuses plaintext: TLS verified against the test CA,
// by the host or a name of the certificate; a name or a CA it does not match refused
// with an error naming the setting.
func serverTLS(t *testing.T, dsn string, plaintextErr string) {
	dir := testenv.Require(t, testenv.EnvTLSDir)
	ca := filepath.Join(dir, "ca.pem")
	pw := password(t, dsn)
	noSecret := func(t *testing.T, err error) {
		t.Helper()
		if pw != "" && strings.Contains(err.Error(), pw) {
			t.Errorf("the error holds the DSN's password: %v", err)
		}
	}
	t.Run("plaintext refused", func(t *testing.T) {
		_, err := connect(t, dsn, tlsauth.TLS{}, "SELECT 1")
		if err == nil || !strings.Contains(err.Error(), plaintextErr) {
			t.Fatalf("plaintext: %v, want %q", err, plaintextErr)
		}
	})
	t.Run("verified by the CA", func(t *testing.T) {
		cipher, err := connect(t, dsn, tlsauth.TLS{CAFile: ca}, "SHOW SESSION STATUS LIKE 'Ssl_cipher'")
		if err != nil || cipher == "" {
			t.Fatalf("Ssl_cipher %q, %v: want TLS", cipher, err)
		}
		t.Logf("cipher %s", cipher)
	})
	t.Run("server name in the certificate", func(t *testing.T) {
		if _, err := connect(t, dsn, tlsauth.TLS{CAFile: ca, ServerName: "parity-tls.test"}, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("server name mismatch", func(t *testing.T) {
		_, err := connect(t, dsn, tlsauth.TLS{CAFile: ca, ServerName: "wrong.parity.test"}, "SELECT 1")
		var he x509.HostnameError
		if err == nil || !errors.As(err, &he) {
			t.Fatalf("want a refusal wrapping x509.HostnameError, got %v", err)
		}
		for _, w := range []string{"downstream.tls.server-name: the certificate of the server at 127.0.0.1:", `is valid for parity-tls.test, localhost, 127.0.0.1, not "wrong.parity.test"`} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q lacks %q", err, w)
			}
		}
		noSecret(t, err)
		t.Logf("refused: %v", err)
	})
	t.Run("another CA", func(t *testing.T) {
		other := otherCA(t)
		_, err := connect(t, dsn, tlsauth.TLS{CAFile: other}, "SELECT 1")
		if err == nil || !strings.Contains(err.Error(), "downstream.tls.ca-file: the certificate of the server at 127.0.0.1:") ||
			!strings.Contains(err.Error(), `(issued by "CN=parity test CA") is not signed by a CA in `+other) {
			t.Fatalf("want a refusal naming downstream.tls.ca-file, got %v", err)
		}
		noSecret(t, err)
		t.Logf("refused: %v", err)
	})
	t.Run("system CAs", func(t *testing.T) {
		_, err := connect(t, dsn, tlsauth.TLS{Enabled: true}, "SELECT 1")
		if err == nil || !strings.Contains(err.Error(), "is not signed by a CA the system trusts; set downstream.tls.ca-file") {
			t.Fatalf("want a refusal naming downstream.tls.ca-file, got %v", err)
		}
	})
	t.Run("insecure skip verify", func(t *testing.T) {
		if _, err := connect(t, dsn, tlsauth.TLS{InsecureSkipVerify: true}, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
	})
}

func TestMariaDBTLS(t *testing.T) {
	dsn := testenv.Require(t, testenv.EnvTLSMySQL)
	serverTLS(t, dsn, "Access denied")
	dir := testenv.Require(t, testenv.EnvTLSDir)
	ca, cert, key := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	x509DSN := testenv.Require(t, testenv.EnvTLSMySQLX509)
	t.Run("client certificate required", func(t *testing.T) {
		_, err := connect(t, x509DSN, tlsauth.TLS{CAFile: ca}, "SELECT 1")
		if err == nil || !strings.Contains(err.Error(), "Access denied for user 'parity_x509'") {
			t.Fatalf("REQUIRE X509 without a client certificate: %v", err)
		}
		if strings.Contains(err.Error(), password(t, x509DSN)) {
			t.Errorf("the error holds the password: %v", err)
		}
	})
	t.Run("client certificate presented", func(t *testing.T) {
		user, err := connect(t, x509DSN, tlsauth.TLS{CAFile: ca, CertFile: cert, KeyFile: key}, "SELECT CURRENT_USER()")
		if err != nil || user != "parity_x509@127.0.0.1" {
			t.Fatalf("current user %q, %v", user, err)
		}
	})
}

func TestTiDBTLS(t *testing.T) {
	serverTLS(t, testenv.Require(t, testenv.EnvTLSTiDB), "Connections using insecure transport are prohibited")
}
