package main

import (
	"os"

	"github.com/spf13/pflag"

	"github.com/tidb-parity/parity/internal/tlsauth"
)

// addTLSFlags adds --NAME-ca-file, --NAME-cert-file, --NAME-key-file and
// --NAME-server-name, the TLS to one server, for the commands without a config file
// (loadgen, decode).
func addTLSFlags(fl *pflag.FlagSet, name, what string, t *tlsauth.TLS) {
	fl.StringVar(&t.CAFile, name+"-ca-file", "", "TLS to "+what+": CA certificates (PEM) its certificate must chain to")
	fl.StringVar(&t.CertFile, name+"-cert-file", "", "TLS to "+what+": client certificate (PEM)")
	fl.StringVar(&t.KeyFile, name+"-key-file", "", "TLS to "+what+": the client certificate's key (PEM)")
	fl.StringVar(&t.ServerName, name+"-server-name", "", "TLS to "+what+": a name its certificate must hold (default: the host dialed)")
}

// addSASLFlags adds --kafka-sasl-mechanism, --kafka-sasl-username and
// --kafka-sasl-password-file; the password itself is never a flag (ps shows flags):
// saslPasswordFromEnv reads it from PARITY_KAFKA_SASL_PASSWORD.
func addSASLFlags(fl *pflag.FlagSet, s *tlsauth.SASL) {
	fl.StringVar(&s.Mechanism, "kafka-sasl-mechanism", "", "SASL to Kafka: plain, scram-sha-256 or scram-sha-512 (the password from "+envKafkaSASLPassword+" or --kafka-sasl-password-file)")
	fl.StringVar(&s.Username, "kafka-sasl-username", "", "SASL to Kafka: the user")
	fl.StringVar(&s.PasswordFile, "kafka-sasl-password-file", "", "SASL to Kafka: a file holding the password")
}

// saslPasswordFromEnv sets s's password from PARITY_KAFKA_SASL_PASSWORD unless a
// password file is given.
func saslPasswordFromEnv(s *tlsauth.SASL) {
	if pw := os.Getenv(envKafkaSASLPassword); pw != "" && s.PasswordFile == "" {
		s.Password = pw
	}
}
