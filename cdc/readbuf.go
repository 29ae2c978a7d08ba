package cdc

// readbuf.go gives the partition readers' Kafka connections a large read buffer.
// kafka-go reads each connection through a 4 KiB bufio.Reader, so every record value
// larger than that is one read(2) of its own, and the headers between them refill the
// small buffer: a record costs two system calls or more. Under a catch-up the reads were
// 8 % of serve's CPU (docs/serve.md). The buffer below turns them into one read per
// readBufSize bytes; the extra copy is far cheaper than the system calls it saves.

import (
	"context"
	"net"

	"github.com/tidb-parity/parity/internal/bufconn"
)

// readBufSize is the read buffer of each partition reader's connection.
const readBufSize = 256 << 10

// dialFunc is kafka-go's Dialer.DialFunc.
type dialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// bufferedReads wraps dial so that the connections it makes read through a
// readBufSize buffer (internal/bufconn). Deadlines and writes go to the connection as
// they are.
func bufferedReads(dial dialFunc) dialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return bufconn.New(c, readBufSize), nil
	}
}
