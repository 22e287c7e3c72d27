package client

import (
	"context"

	"connectrpc.com/connect"

	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/egress"
)

// EgressLog is a sandbox's egress decision log as roched returns it.
type EgressLog struct {
	Decisions []egress.Decision
	// Dropped counts older decisions the per-sandbox bound let go.
	Dropped uint64
	// Suggested are the minimal allowlist entries that would have allowed every refusal
	// kept that an entry can allow.
	Suggested []string
}

// EgressLog returns the decisions of sandbox id's egress proxy whose Seq is above after
// (0: every one kept), oldest first.
func (c *Client) EgressLog(ctx context.Context, id string, after uint64) (EgressLog, error) {
	resp, err := c.rpc.EgressLog(ctx, connect.NewRequest(&rochev1.EgressLogRequest{SandboxId: id, After: after}))
	if err != nil {
		return EgressLog{}, c.fromRPC(err)
	}
	out := EgressLog{Dropped: resp.Msg.Dropped, Suggested: resp.Msg.Suggested}
	for _, d := range resp.Msg.Decisions {
		out.Decisions = append(out.Decisions, decisionFromProto(d))
	}
	return out, nil
}

func decisionFromProto(d *rochev1.EgressDecision) egress.Decision {
	return egress.Decision{
		Seq: d.Seq, Time: d.Time.AsTime(), Sandbox: d.SandboxId, Tenant: d.Tenant, Host: d.Host, Port: int(d.Port),
		Addr: d.Addr, Method: d.Method, Path: d.Path, Rule: d.Rule, Allowed: d.Allowed, Reason: d.Reason,
		BytesOut: d.BytesOut, BytesIn: d.BytesIn, Done: d.Done,
	}
}

// EgressEvents calls fn with each final decision of sandbox id's egress proxy (a refusal
// at once, an allowed connection when it ends): those kept whose Seq is above after
// first, then each as it is made, with missed counting the decisions dropped before it
// because the reader was slow. It returns when ctx ends (nil), fn returns an error
// (that error), or the sandbox's proxy closes (nil).
func (c *Client) EgressEvents(ctx context.Context, id string, after uint64, fn func(d egress.Decision, missed uint64) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.rpc.EgressEvents(ctx, connect.NewRequest(&rochev1.EgressEventsRequest{SandboxId: id, After: after}))
	if err != nil {
		return c.fromRPC(err)
	}
	defer stream.Close()
	for stream.Receive() {
		m := stream.Msg()
		if m.Decision == nil {
			continue // a heartbeat
		}
		if err := fn(decisionFromProto(m.Decision), m.Missed); err != nil {
			return err
		}
	}
	if err := stream.Err(); err != nil && ctx.Err() == nil {
		return c.fromRPC(err)
	}
	return nil
}

// EgressPolicy adds and removes allowlist entries of running sandbox id, effective from
// its next connection, and returns the allowlist then in force. A bad or absent entry
// changes nothing.
func (c *Client) EgressPolicy(ctx context.Context, id string, allow, remove []string) ([]string, error) {
	resp, err := c.rpc.EgressPolicy(ctx, connect.NewRequest(&rochev1.EgressPolicyRequest{SandboxId: id, Allow: allow, Remove: remove}))
	if err != nil {
		return nil, c.fromRPC(err)
	}
	return resp.Msg.Rules, nil
}
