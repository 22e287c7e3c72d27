package client

import (
	"context"
	"time"

	"connectrpc.com/connect"

	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
)

// StoredSecret describes a secret in roched's secret store: never its value.
type StoredSecret struct {
	Name    string
	Updated time.Time
	// Sandboxes are the running sandboxes that took it from the store.
	Sandboxes []string
}

// SetSecret stores value under name in roched's secret store (the caller's tenant's),
// replacing what was there, and returns the running sandboxes that took the secret from
// the store and send the new value from their next request on (rotation). A create
// takes it with roche.Secret{Name: name, FromStore: true, ...}.
func (c *Client) SetSecret(ctx context.Context, name, value string) ([]string, error) {
	resp, err := c.rpc.SetSecret(ctx, connect.NewRequest(&rochev1.SetSecretRequest{Name: name, Value: value}))
	if err != nil {
		return nil, c.fromRPC(err)
	}
	return resp.Msg.Rotated, nil
}

// SetSandboxSecret replaces the value of running sandbox id's secret name (from a file
// or the store), from its next request on; the store is left as it is.
func (c *Client) SetSandboxSecret(ctx context.Context, id, name, value string) error {
	_, err := c.rpc.SetSecret(ctx, connect.NewRequest(&rochev1.SetSecretRequest{Name: name, Value: value, SandboxId: id}))
	return c.fromRPC(err)
}

// ListSecrets names the caller's stored secrets.
func (c *Client) ListSecrets(ctx context.Context) ([]StoredSecret, error) {
	resp, err := c.rpc.ListSecrets(ctx, connect.NewRequest(&rochev1.ListSecretsRequest{}))
	if err != nil {
		return nil, c.fromRPC(err)
	}
	var out []StoredSecret
	for _, s := range resp.Msg.Secrets {
		out = append(out, StoredSecret{Name: s.Name, Updated: s.UpdatedAt.AsTime(), Sandboxes: s.Sandboxes})
	}
	return out, nil
}

// RemoveSecret takes a secret out of the store; running sandboxes that took it keep the
// value they have.
func (c *Client) RemoveSecret(ctx context.Context, name string) error {
	_, err := c.rpc.RemoveSecret(ctx, connect.NewRequest(&rochev1.RemoveSecretRequest{Name: name}))
	return c.fromRPC(err)
}
