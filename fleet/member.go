package fleet

// member.go owns the connections to one member's daemons: which of them holds the
// lease (the one the fleet talks to), and calls that follow a takeover to the standby.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tidb-parity/parity/api/client"
	parityv1 "github.com/tidb-parity/parity/api/parity/v1"
	"github.com/tidb-parity/parity/internal/retry"
)

// member is one member's daemons.
type member struct {
	cfg     Member
	timeout time.Duration // Settings.CallTimeout
	conns   []*grpc.ClientConn
	clients []parityv1.ParityClient

	mu     sync.Mutex
	active int // index of the daemon last found holding the lease (-1: none yet)
}

func dialMember(m Member, timeout time.Duration) (*member, error) {
	mb := &member{cfg: m, timeout: timeout, active: -1}
	for i, addr := range m.Addrs {
		opts, err := m.client(addr).DialOptions()
		if err != nil {
			mb.close()
			return nil, fmt.Errorf("member %s: addrs[%d]: %w", m.Name, i, err)
		}
		conn, err := grpc.NewClient(addr, opts...)
		if err != nil {
			mb.close()
			return nil, fmt.Errorf("member %s: %s: %w", m.Name, addr, err)
		}
		mb.conns = append(mb.conns, conn)
		mb.clients = append(mb.clients, parityv1.NewParityClient(conn))
	}
	return mb, nil
}

func (m *member) close() {
	for _, c := range m.conns {
		_ = c.Close()
	}
}

// ErrNoActive is matched by a member none of whose daemons holds its lease and applies
// (none answered, or every one stands by).
var ErrNoActive = errors.New("no daemon of the member is active (applying)")

// find returns the daemon applying for the member, asking each (the one last found
// first): the one whose status says it applies and, with [ha], holds the lease. It
// returns the daemon's address and status.
func (m *member) find(ctx context.Context) (int, *parityv1.Status, error) {
	m.mu.Lock()
	first := m.active
	m.mu.Unlock()
	order := make([]int, 0, len(m.clients))
	if first >= 0 {
		order = append(order, first)
	}
	for i := range m.clients {
		if i != first {
			order = append(order, i)
		}
	}
	var errs []error
	for _, i := range order {
		cctx, cancel := context.WithTimeout(ctx, m.timeout)
		st, err := m.clients[i].GetStatus(cctx, &parityv1.GetStatusRequest{})
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", m.cfg.Addrs[i], err))
			continue
		}
		if ha := st.GetHa(); ha != nil && ha.GetRole() != parityv1.HARole_HA_ROLE_ACTIVE {
			errs = append(errs, fmt.Errorf("%s: %s", m.cfg.Addrs[i], ha.GetRole()))
			continue
		}
		m.mu.Lock()
		m.active = i
		m.mu.Unlock()
		return i, st, nil
	}
	return -1, nil, fmt.Errorf("member %s: %w (%w)", m.cfg.Name, ErrNoActive, errors.Join(errs...))
}

// retryable: the member's daemon is gone or no longer active; its standby may take
// over.
func retryable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable:
		return true
	case codes.FailedPrecondition:
		r, _ := client.ReasonOf(err)
		return r == parityv1.ErrorReason_APPLIER_NOT_RUNNING.String()
	}
	return errors.Is(err, ErrNoActive)
}

// call runs fn on the member's active daemon; when that daemon is gone or stands by
// (a takeover under way), it finds the active one again and calls fn there, for at
// most failover. fn's other errors are returned as they are.
func (m *member) call(ctx context.Context, failover time.Duration, fn func(ctx context.Context, c parityv1.ParityClient, addr string) error) error {
	deadline := time.Now().Add(failover)
	for {
		i, _, err := m.find(ctx)
		if err == nil {
			err = fn(ctx, m.clients[i], m.cfg.Addrs[i])
			if err == nil || !retryable(err) {
				return err
			}
			err = fmt.Errorf("member %s at %s: %w", m.cfg.Name, m.cfg.Addrs[i], err)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%w (no active daemon answered within %v)", err, failover)
		}
		if err := retry.Sleep(ctx, 500*time.Millisecond); err != nil {
			return err
		}
	}
}
