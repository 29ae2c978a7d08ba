package fleet

// fleet.go owns the fleet as the commands see it: its members dialed, TiDB's TSO (the
// fleet's clock, read through a member), the tables it answers for and their owners.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"

	parityv1 "github.com/tidb-parity/parity/api/parity/v1"
)

// Fleet is a fleet file's members, dialed. Create it with Open; Close it.
type Fleet struct {
	cfg     Config
	log     *slog.Logger
	members []*member
}

// Open dials every member's daemons (connections are made on first use).
func Open(cfg Config, log *slog.Logger) (*Fleet, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f := &Fleet{cfg: cfg, log: log.With("fleet", cfg.Fleet.Name)}
	for _, m := range cfg.Members {
		mb, err := dialMember(m, cfg.Fleet.CallTimeout)
		if err != nil {
			f.Close()
			return nil, err
		}
		f.members = append(f.members, mb)
	}
	return f, nil
}

// Close closes the connections.
func (f *Fleet) Close() {
	for _, m := range f.members {
		m.close()
	}
}

// Config returns the fleet's configuration.
func (f *Fleet) Config() Config { return f.cfg }

// TSO reads TiDB's current TSO through the first member that answers.
func (f *Fleet) TSO(ctx context.Context) (uint64, error) {
	var errs []error
	for _, m := range f.members {
		var ts uint64
		err := m.call(ctx, 0, func(ctx context.Context, c parityv1.ParityClient, _ string) error {
			cctx, cancel := context.WithTimeout(ctx, f.cfg.Fleet.CallTimeout)
			defer cancel()
			r, err := c.GetUpstreamTSO(cctx, &parityv1.GetUpstreamTSORequest{})
			ts = r.GetTs()
			return err
		})
		if err == nil {
			return ts, nil
		}
		errs = append(errs, fmt.Errorf("member %s: %w", m.cfg.Name, err))
	}
	return 0, fmt.Errorf("reading TiDB's TSO through the members: %w", errors.Join(errs...))
}

// Tables lists TiDB's tables the fleet selects (fleet.tables), through the first member
// that answers, and assigns each to its owner: a table owned by no member or by
// several fails with an *OwnershipError naming it.
func (f *Fleet) Tables(ctx context.Context) (map[string]string, error) {
	var (
		errs   []error
		tables []string
	)
	for _, m := range f.members {
		err := m.call(ctx, 0, func(ctx context.Context, c parityv1.ParityClient, _ string) error {
			cctx, cancel := context.WithTimeout(ctx, f.cfg.Fleet.CallTimeout)
			defer cancel()
			r, err := c.ListUpstreamTables(cctx, &parityv1.ListUpstreamTablesRequest{Tables: f.cfg.Fleet.Tables})
			tables = r.GetTables()
			return err
		})
		if err == nil {
			break
		}
		errs = append(errs, fmt.Errorf("member %s: %w", m.cfg.Name, err))
	}
	if tables == nil {
		return nil, fmt.Errorf("listing TiDB's tables through the members: %w", errors.Join(errs...))
	}
	return f.cfg.Owners(tables)
}

// owned returns, for each member, the tables it owns among owner's, sorted.
func (f *Fleet) owned(owner map[string]string) map[string][]string {
	by := map[string][]string{}
	for t, m := range owner {
		by[m] = append(by[m], t)
	}
	for _, ts := range by {
		sort.Strings(ts)
	}
	return by
}
