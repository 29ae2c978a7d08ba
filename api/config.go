package api

import (
	"errors"
	"fmt"
	"net"
	"time"
)

// Config is the [api] section of parity serve's configuration: the gRPC server. Keys
// are reported with their full path (api.addr).
type Config struct {
	// Addr is the gRPC listen address; empty disables the API. A non-loopback address
	// needs authentication (token-file or TLS client certificates) unless insecure.
	// Default: "127.0.0.1:8391"
	Addr string `toml:"addr"`
	// Insecure allows serving without authentication on a non-loopback address.
	// Default: false
	Insecure bool `toml:"insecure"`
	// TokenFile is the file of bearer tokens and their roles (api/README.md); SIGHUP
	// reads it again.
	// Default: "" (no tokens: only loopback without TLS client auth, or insecure)
	TokenFile string `toml:"token-file"`
	// TLS serves over TLS, optionally with client certificates ([api.tls]).
	TLS TLSConfig `toml:"tls"`
	// KeepaliveTime: the server pings a client after this long without activity on
	// its connection, and closes it when no answer comes within KeepaliveTimeout.
	// Default: 2h
	KeepaliveTime time.Duration `toml:"keepalive-time"`
	// KeepaliveTimeout is how long the server waits for a ping's answer.
	// Default: 20s
	KeepaliveTimeout time.Duration `toml:"keepalive-timeout"`
	// MinClientPingInterval: a client pinging more often than this is sent GOAWAY
	// (keepalive enforcement); clients may ping while they have no stream open.
	// Default: 10s
	MinClientPingInterval time.Duration `toml:"min-client-ping-interval"`
	// MaxConnectionIdle closes a connection without calls for this long (0: never).
	// Default: 0
	MaxConnectionIdle time.Duration `toml:"max-connection-idle"`
	// StopTimeout bounds the graceful stop: calls under way may finish (watch streams
	// end at once); after it, the remaining connections are closed.
	// Default: 10s
	StopTimeout time.Duration `toml:"stop-timeout"`
	// MaxConcurrentStreams bounds the calls at once on one connection.
	// Default: 100
	MaxConcurrentStreams uint32 `toml:"max-concurrent-streams"`
}

// DefaultConfig returns the defaults of every key.
func DefaultConfig() Config {
	return Config{
		Addr:                  "127.0.0.1:8391",
		KeepaliveTime:         2 * time.Hour,
		KeepaliveTimeout:      20 * time.Second,
		MinClientPingInterval: 10 * time.Second,
		StopTimeout:           10 * time.Second,
		MaxConcurrentStreams:  100,
	}
}

// Validate reports every problem with its key path.
func (c Config) Validate() error {
	var errs []error
	if c.Addr != "" {
		if _, _, err := net.SplitHostPort(c.Addr); err != nil {
			errs = append(errs, fmt.Errorf("api.addr: %w", err))
		}
	}
	pos := func(key string, d time.Duration) {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("api.%s: must be positive, got %v", key, d))
		}
	}
	pos("keepalive-time", c.KeepaliveTime)
	pos("keepalive-timeout", c.KeepaliveTimeout)
	pos("min-client-ping-interval", c.MinClientPingInterval)
	pos("stop-timeout", c.StopTimeout)
	if c.MaxConnectionIdle < 0 {
		errs = append(errs, fmt.Errorf("api.max-connection-idle: must not be negative, got %v", c.MaxConnectionIdle))
	}
	if c.MaxConcurrentStreams == 0 {
		errs = append(errs, errors.New("api.max-concurrent-streams: must be at least 1"))
	}
	if err := c.TLS.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
