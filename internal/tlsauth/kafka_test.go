package tlsauth_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/tidb-parity/parity/internal/testenv"
	"github.com/tidb-parity/parity/internal/tlsauth"
)

// kafkaTarget is one way into kafka-tls.
type kafkaTarget struct {
	name   string
	broker string
	tls    tlsauth.TLS
	sasl   tlsauth.SASL
}

func kafkaTargets(t *testing.T) []kafkaTarget {
	dir := testenv.Require(t, testenv.EnvTLSDir)
	ssl := testenv.Require(t, testenv.EnvTLSKafkaSSL)
	saslSSL := testenv.Require(t, testenv.EnvTLSKafkaSASLSSL)
	user, pw := testenv.Require(t, testenv.EnvTLSKafkaUser), testenv.Require(t, testenv.EnvTLSKafkaPassword)
	ca := tlsauth.TLS{CAFile: filepath.Join(dir, "ca.pem")}
	withCert := ca
	withCert.CertFile, withCert.KeyFile = filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	out := []kafkaTarget{{"ssl client certificate", ssl, withCert, tlsauth.SASL{}}}
	for _, m := range []string{tlsauth.MechanismPlain, tlsauth.MechanismSCRAMSHA256, tlsauth.MechanismSCRAMSHA512} {
		out = append(out, kafkaTarget{"sasl_ssl " + m, saslSSL, ca, tlsauth.SASL{Mechanism: m, Username: user, Password: pw}})
	}
	return out
}

// TestKafkaTLSAndSASL writes and reads a record through every listener and mechanism of
// kafka-tls with kafka-go's Writer (Transport) and Reader (Dialer), and checks the
// refusals: no client certificate on SSL, a wrong password for each mechanism (named,
// never printed), a mechanism the listener does not take.
func TestKafkaTLSAndSASL(t *testing.T) {
	targets := kafkaTargets(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	topic := testenv.UniqueName("tls")
	admin, err := tlsauth.NewKafka("changefeed", targets[0].tls, targets[0].sasl)
	if err != nil {
		t.Fatal(err)
	}
	createTopic(ctx, t, admin.Dialer(10*time.Second), targets[0].broker, topic)

	for i, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			k, err := tlsauth.NewKafka("changefeed", tg.tls, tg.sasl)
			if err != nil {
				t.Fatal(err)
			}
			tr := k.Transport(10 * time.Second)
			defer tr.CloseIdleConnections()
			w := &kafka.Writer{Addr: kafka.TCP(tg.broker), Topic: topic, Transport: tr, Balancer: kafka.BalancerFunc(func(kafka.Message, ...int) int { return 0 })}
			value := fmt.Sprintf("record %d over %s", i, tg.name)
			if err := w.WriteMessages(ctx, kafka.Message{Value: []byte(value)}); err != nil {
				t.Fatalf("write: %v", k.Explain(err))
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{tg.broker}, Topic: topic, Partition: 0, Dialer: k.Dialer(10 * time.Second), MaxWait: 500 * time.Millisecond})
			defer r.Close()
			if err := r.SetOffset(int64(i)); err != nil {
				t.Fatal(err)
			}
			rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
			defer rcancel()
			m, err := r.FetchMessage(rctx)
			if err != nil || string(m.Value) != value {
				t.Fatalf("read offset %d: %q, %v; want %q", i, m.Value, err, value)
			}
		})
	}

	t.Run("ssl without a client certificate", func(t *testing.T) {
		noCert := targets[0].tls
		noCert.CertFile, noCert.KeyFile = "", ""
		k, err := tlsauth.NewKafka("changefeed", noCert, tlsauth.SASL{})
		if err != nil {
			t.Fatal(err)
		}
		err = readPartitions(ctx, k, targets[0].broker, topic)
		if err == nil || !strings.Contains(err.Error(), "changefeed.tls.cert-file: the broker refused the connection without a client certificate") {
			t.Fatalf("want a refusal naming changefeed.tls.cert-file, got %v", err)
		}
		t.Logf("refused: %v", err)
	})
	for _, tg := range targets[1:] {
		t.Run(tg.name+" wrong password", func(t *testing.T) {
			const wrong = "not-the-password-42"
			s := tg.sasl
			s.Password = wrong
			k, err := tlsauth.NewKafka("changefeed", tg.tls, s)
			if err != nil {
				t.Fatal(err)
			}
			err = readPartitions(ctx, k, tg.broker, topic)
			if !errors.Is(err, kafka.SASLAuthenticationFailed) {
				t.Fatalf("want SASL authentication failed, got %v", err)
			}
			want := fmt.Sprintf("changefeed.sasl: the broker refused %s authentication as user %q", s.Mechanism, s.Username)
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q lacks %q", err, want)
			}
			for _, secret := range []string{wrong, tg.sasl.Password} {
				if strings.Contains(err.Error(), secret) {
					t.Errorf("the error holds a password: %v", err)
				}
			}
			t.Logf("refused: %v", err)
		})
	}
	t.Run("sasl_ssl without sasl", func(t *testing.T) {
		k, err := tlsauth.NewKafka("changefeed", targets[1].tls, tlsauth.SASL{})
		if err != nil {
			t.Fatal(err)
		}
		err = readPartitions(ctx, k, targets[1].broker, topic)
		if err == nil || !strings.Contains(err.Error(), "changefeed: the broker closed the connection as it was set up: does its listener want SASL (changefeed.sasl)?") {
			t.Fatalf("want a refusal naming changefeed.sasl, got %v", err)
		}
		t.Logf("refused: %v", err)
	})
}

func readPartitions(ctx context.Context, k *tlsauth.Kafka, broker, topic string) error {
	c, err := k.Dialer(10*time.Second).DialContext(ctx, "tcp", broker)
	if err != nil {
		return k.Explain(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, err = c.ReadPartitions(topic)
	return k.Explain(err)
}

func createTopic(ctx context.Context, t *testing.T, d *kafka.Dialer, broker, topic string) {
	t.Helper()
	c, err := d.DialContext(ctx, "tcp", broker)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctrl, err := c.Controller()
	if err != nil {
		t.Fatal(err)
	}
	cc, err := d.DialContext(ctx, "tcp", net.JoinHostPort(ctrl.Host, strconv.Itoa(ctrl.Port)))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	if err := cc.CreateTopics(kafka.TopicConfig{Topic: topic, NumPartitions: 1, ReplicationFactor: 1}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c, err := d.DialContext(context.Background(), "tcp", net.JoinHostPort(ctrl.Host, strconv.Itoa(ctrl.Port))); err == nil {
			_ = c.DeleteTopics(topic)
			c.Close()
		}
	})
	for deadline := time.Now().Add(30 * time.Second); ; {
		parts, err := c.ReadPartitions(topic)
		if err == nil && len(parts) == 1 && parts[0].Leader.Host != "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("topic %s has no leader: %v", topic, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
