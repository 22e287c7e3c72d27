package guestfwd

import (
	"context"
	"fmt"
	"io"
	"sync"

	"github.com/roche-sandbox/roche/internal/guest"
)

// Leases holds the leases of the leased sandboxes one provider made (kit.Leaser), each
// by an open connection to the sandbox's agent, for as long as this process lives or
// until Drop: the kernel closes the connections of a process that dies, however it dies,
// and each agent stops its sandbox agentspec.LeaseGrace later. Every provider that runs
// roche-agent holds leases this one way. The zero value is ready to use.
type Leases struct {
	mu   sync.Mutex
	held map[string]io.Closer
}

// Take takes the lease of sandbox id, whose agent is a, and holds it. ctx bounds taking
// it, not holding it.
func (l *Leases) Take(ctx context.Context, id string, a *guest.Client) error {
	c, err := a.Lease(ctx)
	if err != nil {
		return fmt.Errorf("taking the lease of sandbox %s: %w", id, err)
	}
	l.mu.Lock()
	if l.held == nil {
		l.held = map[string]io.Closer{}
	}
	old := l.held[id]
	l.held[id] = c
	l.mu.Unlock()
	if old != nil {
		old.Close()
	}
	return nil
}

// Holds reports whether the lease of sandbox id is held here.
func (l *Leases) Holds(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.held[id]
	return ok
}

// Drop lets go of the lease of sandbox id, if held here (Destroy, or Keep).
func (l *Leases) Drop(id string) {
	l.mu.Lock()
	c, ok := l.held[id]
	delete(l.held, id)
	l.mu.Unlock()
	if ok {
		c.Close()
	}
}

// DropAll lets go of every lease (the provider's Close): those sandboxes stop within the
// grace.
func (l *Leases) DropAll() {
	l.mu.Lock()
	held := l.held
	l.held = nil
	l.mu.Unlock()
	for _, c := range held {
		c.Close()
	}
}

// Keep implements kit.Leaser for a provider that holds its leases in l: the agent ends
// the sandbox's lease (it then lives out its lifetime), and the lease held here, if any,
// is let go of. id is the sandbox's full id, as l knows it.
func (l *Leases) Keep(ctx context.Context, f Forwarder, id string) error {
	if err := f.Keep(ctx, id); err != nil {
		return err
	}
	l.Drop(id)
	return nil
}
