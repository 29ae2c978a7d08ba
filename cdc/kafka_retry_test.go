package cdc

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/segmentio/kafka-go"
)

// TestKafkaTransient: the read errors the consumer waits out (changefeed.retry-timeout)
// and those that stop it at once, in the forms kafka-go returns them.
func TestKafkaTransient(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: &net.AddrError{Err: "x"}}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("failed to dial: %w", fmt.Errorf("failed to open connection to 127.0.0.1:1: %w", refused)), true},
		{&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, true},
		{io.ErrUnexpectedEOF, true},
		{syscall.ECONNREFUSED, true},
		{kafka.NotLeaderForPartition, true},
		{kafka.LeaderNotAvailable, true},
		{kafka.RequestTimedOut, true},
		{kafka.OffsetOutOfRange, false},
		{kafka.TopicAuthorizationFailed, false},
		{errors.New("decoding failed"), false},
		{fmt.Errorf("failed to dial: %w", &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}), false},
		{&net.OpError{Op: "remote error", Err: tls.AlertError(42)}, false},
	} {
		if got := kafkaTransient(c.err); got != c.want {
			t.Errorf("kafkaTransient(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
