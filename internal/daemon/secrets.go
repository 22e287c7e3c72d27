package daemon

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/egress"
	"github.com/roche-sandbox/roche/internal/wire"
)

// The secret store: values a tenant keeps in roched for its sandboxes' egress proxies to
// broker (roche secret set NAME; roche create --secret NAME). Values are held in this
// process's memory only: never written to disk, so roched's state file, a backup of the
// host or another local user reading roched's files finds none, at the cost that a
// roched restarted has an empty store (set them again). Each tenant has its own store;
// another tenant's secret is "not found", as if it did not exist.

// MaxSecretBytes bounds a stored value: it goes in a request header.
const MaxSecretBytes = 64 << 10

type storedSecret struct {
	value   string
	updated time.Time
}

type secretStore struct {
	mu sync.Mutex
	// values by tenant, then name.
	values map[string]map[string]storedSecret
	// owners gives, for each sandbox id roched holds for a client, its tenant (the
	// ledger's records).
	owners func() map[string]string
}

// Which sandboxes follow a stored secret is not kept here: it is recorded with each
// sandbox (roche.Secret.FromStore, in the provider's stored config), so each proxy,
// made for a create or started again after a restart, knows its stored secrets
// (egress.Proxy.StoredSecrets), and the ledger knows whose sandbox it is. A rotation
// after a restart so reaches every running sandbox of the tenant that took the secret
// from the store, and a sandbox made again from one's config (Reset, Fork) too.

// fill puts the stored values in the secrets of a create that asked for them.
func (s *secretStore) fill(tenant string, secrets []roche.Secret) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range secrets {
		sec := &secrets[i]
		if !sec.FromStore {
			continue
		}
		if sec.Value != "" {
			return fmt.Errorf("%w: secret %s: give a value or from_store, not both", roche.ErrInvalidConfig, sec.Name)
		}
		v, ok := s.values[tenant][sec.Name]
		if !ok {
			return fmt.Errorf("%w: secret %s is not in roched's secret store: store it with roche secret set %s", roche.ErrNotFound, sec.Name, sec.Name)
		}
		sec.Value = v.value
	}
	return nil
}

// follow gives the proxies of tenant's sandboxes ids the values stored now of their
// stored secrets: one replaced between fill and the proxy's start, or a proxy started
// without values (again after a restart, or for a sandbox made again from another's
// config). A name no longer stored is left as the proxy has it.
func (s *secretStore) follow(tenant string, ids ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		px := egress.Lookup(id)
		if px == nil {
			continue
		}
		for _, n := range px.StoredSecrets() {
			if v, ok := s.values[tenant][n]; ok {
				px.SetSecret(n, v.value)
			}
		}
	}
}

// registered is egress.OnRegister's hook: a proxy started again for a client sandbox
// (after a restart) gets its tenant's stored values before it serves a request for the
// sandbox under that id. (The ledger calls no provider under its lock, which owners
// takes.)
func (s *secretStore) registered(id string, px *egress.Proxy) {
	if s.owners == nil || len(px.StoredSecrets()) == 0 {
		return
	}
	if tenant, ok := s.owners()[id]; ok {
		s.follow(tenant, id)
	}
}

// usersLocked are the running sandboxes of tenant whose proxies take name from the
// store, with their proxies. Callers hold s.mu.
func (s *secretStore) usersLocked(tenant, name string) map[string]*egress.Proxy {
	out := map[string]*egress.Proxy{}
	if s.owners == nil {
		return out
	}
	owners := s.owners()
	for id, px := range egress.Registered() {
		if owners[id] == tenant && slices.Contains(px.StoredSecrets(), name) {
			out[id] = px
		}
	}
	return out
}

// set stores value under name and gives it to every running sandbox of tenant that took
// name from the store, returning their ids.
func (s *secretStore) set(tenant, name, value string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.values == nil {
		s.values = map[string]map[string]storedSecret{}
	}
	if s.values[tenant] == nil {
		s.values[tenant] = map[string]storedSecret{}
	}
	s.values[tenant][name] = storedSecret{value: value, updated: time.Now()}
	var rotated []string
	for id, px := range s.usersLocked(tenant, name) {
		if px.SetSecret(name, value) {
			rotated = append(rotated, id)
		}
	}
	sort.Strings(rotated)
	return rotated
}

func (s *secretStore) remove(tenant, name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.values[tenant][name]; !ok {
		return fmt.Errorf("%w: secret %s is not in roched's secret store", roche.ErrNotFound, name)
	}
	delete(s.values[tenant], name)
	return nil
}

func (s *secretStore) list(tenant string) []*rochev1.StoredSecret {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*rochev1.StoredSecret
	for name, v := range s.values[tenant] {
		ss := &rochev1.StoredSecret{Name: name, UpdatedAt: timestamppb.New(v.updated)}
		for id := range s.usersLocked(tenant, name) {
			ss.Sandboxes = append(ss.Sandboxes, id)
		}
		slices.Sort(ss.Sandboxes)
		out = append(out, ss)
	}
	slices.SortFunc(out, func(a, b *rochev1.StoredSecret) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	return out
}

// checkSecret refuses a name that cannot name an environment variable and a value that
// cannot go in a header.
func checkSecret(name, value string) error {
	if !secretName(name) {
		return fmt.Errorf("%w: secret %q: name it as an environment variable, such as API_TOKEN", roche.ErrInvalidConfig, name)
	}
	if value == "" {
		return fmt.Errorf("%w: secret %s: the value is empty", roche.ErrInvalidConfig, name)
	}
	if len(value) > MaxSecretBytes {
		return fmt.Errorf("%w: secret %s: the value is %d bytes, more than %d", roche.ErrInvalidConfig, name, len(value), MaxSecretBytes)
	}
	for _, c := range []byte(value) {
		if c < 0x20 && c != '\t' || c == 0x7f {
			return fmt.Errorf("%w: secret %s: the value holds a control character, which a request header cannot carry", roche.ErrInvalidConfig, name)
		}
	}
	return nil
}

// secretName is roche.Config's rule for a secret's name: an environment variable's.
func secretName(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i, r := range s {
		if !(r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r == '_' || i > 0 && r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

func (s *service) SetSecret(ctx context.Context, req *connect.Request[rochev1.SetSecretRequest]) (*connect.Response[rochev1.SetSecretResponse], error) {
	t, err := tenantOf(ctx)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	name, id := req.Msg.Name, req.Msg.SandboxId
	var rotated []string
	err = checkSecret(name, req.Msg.Value)
	if err == nil && id != "" {
		var px *egress.Proxy
		px, _, err = s.egressProxy(ctx, id)
		if err == nil && !px.SetSecret(name, req.Msg.Value) {
			err = fmt.Errorf("%w: sandbox %s has no secret %s", roche.ErrNotFound, id, name)
		}
		if err == nil {
			rotated = []string{id}
		}
	} else if err == nil {
		rotated = s.d.secrets.set(t.Name, name, req.Msg.Value)
	}
	// The name, never the value.
	s.d.audit(ctx, "secret_set", err, "name", name, "id", id, "rotated", rotated)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	return connect.NewResponse(&rochev1.SetSecretResponse{Rotated: rotated}), nil
}

func (s *service) ListSecrets(ctx context.Context, _ *connect.Request[rochev1.ListSecretsRequest]) (*connect.Response[rochev1.ListSecretsResponse], error) {
	t, err := tenantOf(ctx)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	return connect.NewResponse(&rochev1.ListSecretsResponse{Secrets: s.d.secrets.list(t.Name)}), nil
}

func (s *service) RemoveSecret(ctx context.Context, req *connect.Request[rochev1.RemoveSecretRequest]) (*connect.Response[rochev1.RemoveSecretResponse], error) {
	t, err := tenantOf(ctx)
	if err == nil {
		err = s.d.secrets.remove(t.Name, req.Msg.Name)
	}
	s.d.audit(ctx, "secret_rm", err, "name", req.Msg.Name)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	return connect.NewResponse(&rochev1.RemoveSecretResponse{}), nil
}
