package tlsauth

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"
)

// SASL mechanisms ([changefeed.sasl] mechanism).
const (
	MechanismPlain       = "plain"
	MechanismSCRAMSHA256 = "scram-sha-256"
	MechanismSCRAMSHA512 = "scram-sha-512"
)

// SASL is the authentication to Kafka ([changefeed.sasl]). PLAIN sends the password to
// the broker, so it is refused without TLS.
type SASL struct {
	// Mechanism is plain, scram-sha-256 or scram-sha-512 (case does not matter).
	// Default: "" (no SASL)
	Mechanism string `toml:"mechanism"`
	// Username is the SASL user. Required with a mechanism.
	// Default: ""
	Username string `toml:"username"`
	// Password is the user's password. Prefer password-file, or the environment
	// (PARITY_KAFKA_SASL_PASSWORD in parity serve); never printed.
	// Default: ""
	Password string `toml:"password"`
	// PasswordFile is a file holding the password (one line; a trailing newline is
	// dropped), read at start. Exclusive with password.
	// Default: ""
	PasswordFile string `toml:"password-file"`
}

// On tells whether SASL is configured.
func (s SASL) On() bool { return s.Mechanism != "" }

// Validate reports every problem of s, each prefixed with its key path under key
// ("changefeed.sasl"). withTLS tells whether the connection is encrypted.
func (s SASL) Validate(key string, withTLS bool) error {
	var errs []error
	bad := func(k, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s.%s: %s", key, k, fmt.Sprintf(format, a...)))
	}
	if !s.On() {
		if s.Username != "" || s.Password != "" || s.PasswordFile != "" {
			bad("mechanism", "is required with %s.username, password or password-file (plain, scram-sha-256 or scram-sha-512)", key)
		}
		return errors.Join(errs...)
	}
	switch strings.ToLower(s.Mechanism) {
	case MechanismPlain:
		if !withTLS {
			bad("mechanism", "plain sends the password in the clear: it needs TLS (the tls table beside it)")
		}
	case MechanismSCRAMSHA256, MechanismSCRAMSHA512:
	default:
		bad("mechanism", "want plain, scram-sha-256 or scram-sha-512, got %q", s.Mechanism)
	}
	if s.Username == "" {
		bad("username", "is required with %s.mechanism", key)
	}
	switch {
	case s.Password != "" && s.PasswordFile != "":
		bad("password-file", "is set with %s.password: set one", key)
	case s.Password == "" && s.PasswordFile == "":
		bad("password", "is required with %s.mechanism (or %s.password-file)", key, key)
	case s.PasswordFile != "":
		if fi, err := os.Stat(s.PasswordFile); err != nil {
			bad("password-file", "%v", err)
		} else if fi.IsDir() {
			bad("password-file", "%s is a directory", s.PasswordFile)
		}
	}
	return errors.Join(errs...)
}

// password returns the password, reading password-file.
func (s SASL) password(key string) (string, error) {
	if s.PasswordFile == "" {
		return s.Password, nil
	}
	b, err := os.ReadFile(s.PasswordFile)
	if err != nil {
		return "", fmt.Errorf("%s.password-file: %w", key, err)
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}

func (s SASL) mechanism(key string) (sasl.Mechanism, error) {
	if !s.On() {
		return nil, nil
	}
	pw, err := s.password(key)
	if err != nil {
		return nil, err
	}
	switch strings.ToLower(s.Mechanism) {
	case MechanismPlain:
		return plain.Mechanism{Username: s.Username, Password: pw}, nil
	case MechanismSCRAMSHA256:
		m, err := scram.Mechanism(scram.SHA256, s.Username, pw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", key, err) // stringprep of the user or password; neither is printed
		}
		return m, nil
	case MechanismSCRAMSHA512:
		m, err := scram.Mechanism(scram.SHA512, s.Username, pw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", key, err)
		}
		return m, nil
	}
	return nil, fmt.Errorf("%s.mechanism: want plain, scram-sha-256 or scram-sha-512, got %q", key, s.Mechanism)
}

// Kafka is how parity reaches Kafka brokers: TLS and SASL, ready for kafka-go. The
// zero value (and nil) dials plaintext without authentication.
type Kafka struct {
	tls     TLS
	mech    sasl.Mechanism
	key     string // "changefeed"
	user    string
	mechTxt string
}

// NewKafka reads the settings' files (password-file) and returns what Dialer and
// Transport use. key is the table holding tls and sasl ("changefeed").
func NewKafka(key string, t TLS, s SASL) (*Kafka, error) {
	k := &Kafka{tls: t, key: key, user: s.Username, mechTxt: strings.ToLower(s.Mechanism)}
	m, err := s.mechanism(key + ".sasl")
	if err != nil {
		return nil, err
	}
	k.mech = m
	if t.On() {
		// Load the files once now, so a bad file is a start-up error.
		if _, err := t.Config(key+".tls", "localhost:0"); err != nil {
			return nil, err
		}
	}
	return k, nil
}

// dial is the network dial of every Kafka connection: TCP, then TLS when on.
func (k *Kafka) dial(timeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{Timeout: timeout}
	if k == nil || !k.tls.On() {
		return d.DialContext
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return dialTLS(ctx, d, k.tls, k.key+".tls", network, addr)
	}
}

// Dialer returns a kafka-go Dialer (for kafka.Conn and kafka.Reader) with k's TLS and
// SASL.
func (k *Kafka) Dialer(timeout time.Duration) *kafka.Dialer {
	d := &kafka.Dialer{Timeout: timeout, DualStack: true, DialFunc: k.dial(timeout)}
	if k != nil {
		d.SASLMechanism = k.mech
	}
	return d
}

// Transport returns a kafka-go Transport (for kafka.Writer and kafka.Client) with k's
// TLS and SASL.
func (k *Kafka) Transport(timeout time.Duration) *kafka.Transport {
	t := &kafka.Transport{Dial: k.dial(timeout)}
	if k != nil {
		t.SASL = k.mech
	}
	return t
}

// Explain adds to an error from a Kafka connection the setting it is about: a refused
// SASL authentication names the mechanism and user (never the password), a mechanism
// the broker does not enable names changefeed.sasl.mechanism. Other errors come back
// as they are.
func (k *Kafka) Explain(err error) error {
	if err == nil || k == nil {
		return err
	}
	switch {
	case errors.Is(err, kafka.SASLAuthenticationFailed):
		if k.mech == nil {
			return fmt.Errorf("%s.sasl: the broker wants SASL authentication and none is configured: %w", k.key, err)
		}
		return fmt.Errorf("%s.sasl: the broker refused %s authentication as user %q (check %s.sasl.username and the password): %w",
			k.key, k.mechTxt, k.user, k.key, err)
	case errors.Is(err, kafka.UnsupportedSASLMechanism):
		return fmt.Errorf("%s.sasl.mechanism: the broker does not enable %s on this listener: %w", k.key, k.mechTxt, err)
	case errors.Is(err, kafka.IllegalSASLState):
		return fmt.Errorf("%s.sasl: the broker's listener does not take SASL (is it an SSL or PLAINTEXT listener?): %w", k.key, err)
	case k.tls.On() && k.tls.CertFile == "" && (strings.Contains(err.Error(), "tls: bad certificate") || strings.Contains(err.Error(), "tls: certificate required")):
		return fmt.Errorf("%s.tls.cert-file: the broker refused the connection without a client certificate: %w", k.key, err)
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET):
		var want []string
		if k.mech == nil {
			want = append(want, "SASL ("+k.key+".sasl)")
		}
		if !k.tls.On() {
			want = append(want, "TLS ("+k.key+".tls)")
		}
		if len(want) > 0 {
			return fmt.Errorf("%s: the broker closed the connection as it was set up: does its listener want %s? %w", k.key, strings.Join(want, " or "), err)
		}
	}
	return err
}
