package mcp

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
)

// The egress decision log for models: what a sandbox made with allow_hosts tried to reach
// and what its proxy did, so a model can see why a `pip install` failed (a host missing
// from the list, an address refused) and say which host to allow. Read-only on purpose:
// no tool changes a sandbox's allowlist, and none sets or reads roched's secret store
// (docs/mcp.md says why).

// Bounds on egress_log's answer: a model's context is small, and a log may not be.
const (
	DefaultEgressDecisions = 50
	MaxEgressDecisions     = 500
)

// EgressLogInput is egress_log's arguments.
type EgressLogInput struct {
	SandboxID    string `json:"sandbox_id" jsonschema:"the sandbox's id, from create_sandbox (made with allow_hosts)"`
	MaxDecisions int    `json:"max_decisions,omitempty" jsonschema:"return at most this many of the most recent decisions (default 50, at most 500)"`
	RefusedOnly  bool   `json:"refused_only,omitempty" jsonschema:"return only the refused connections"`
}

// EgressDecision is one connection the sandbox asked its egress proxy for.
type EgressDecision struct {
	Time     string `json:"time" jsonschema:"when, RFC 3339"`
	Host     string `json:"host" jsonschema:"the host as the sandbox named it"`
	Port     int    `json:"port"`
	Addr     string `json:"addr,omitempty" jsonschema:"the address the name resolved to"`
	Method   string `json:"method" jsonschema:"CONNECT (HTTPS), or a plain HTTP request's method"`
	Path     string `json:"path,omitempty"`
	Allowed  bool   `json:"allowed"`
	Rule     string `json:"rule,omitempty" jsonschema:"the allow_hosts entry that allowed it, or that would have allowed a refusal"`
	Reason   string `json:"reason" jsonschema:"what the sandbox was told"`
	BytesOut int64  `json:"bytes_out"`
	BytesIn  int64  `json:"bytes_in"`
}

// EgressLogOutput is egress_log's answer.
type EgressLogOutput struct {
	Decisions []EgressDecision `json:"decisions" jsonschema:"the most recent decisions, oldest first"`
	Omitted   uint64           `json:"omitted" jsonschema:"older decisions not returned (past max_decisions, or no longer kept)"`
	Suggested []string         `json:"suggested" jsonschema:"the allow_hosts entries that would have allowed the refusals an entry can fix"`
}

func (s *Server) addEgressTools() {
	addTool(s.server, &mcp.Tool{
		Name:  "egress_log",
		Title: "Show what a sandbox tried to reach",
		Description: "List the recent connections a sandbox made with allow_hosts asked for (host, port, method, " +
			"allowed or refused, and why), most recent last, with the allow_hosts entries the refusals needed. " +
			"Use it when a download or `pip install` in the sandbox fails; to allow a host, create a new sandbox " +
			"with it in allow_hosts (ask the user first).",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: boolPtr(false)},
	}, s.egressLog)
}

// egressLogs is a provider whose sandboxes' egress proxies roched runs (client.Provider).
type egressLogs interface{ Client() *client.Client }

var _ egressLogs = (*client.Provider)(nil)

func (s *Server) egressLog(ctx context.Context, req *mcp.CallToolRequest, in EgressLogInput) (*mcp.CallToolResult, EgressLogOutput, error) {
	limit := in.MaxDecisions
	switch {
	case limit == 0:
		limit = DefaultEgressDecisions
	case limit < 0 || limit > MaxEgressDecisions:
		return nil, EgressLogOutput{}, fmt.Errorf("%w: max_decisions %d: give 1 to %d", roche.ErrInvalidConfig, limit, MaxEgressDecisions)
	}
	p, err := s.own(req.Session, in.SandboxID)
	if err != nil {
		return nil, EgressLogOutput{}, err
	}
	rp, ok := p.(egressLogs)
	if !ok {
		return nil, EgressLogOutput{}, fmt.Errorf("%w: the egress log is kept by roched, and this server runs sandboxes without it: "+
			"ask the user to start roched (roche daemon start) and the MCP server again", roche.ErrUnsupported)
	}
	log, err := rp.Client().EgressLog(ctx, in.SandboxID, 0)
	if err != nil {
		return nil, EgressLogOutput{}, err
	}
	out := EgressLogOutput{Omitted: log.Dropped, Suggested: log.Suggested, Decisions: []EgressDecision{}}
	if out.Suggested == nil {
		out.Suggested = []string{}
	}
	kept := log.Decisions
	if in.RefusedOnly {
		kept = kept[:0:0]
		for _, d := range log.Decisions {
			if !d.Allowed {
				kept = append(kept, d)
			}
		}
	}
	if len(kept) > limit {
		out.Omitted += uint64(len(kept) - limit)
		kept = kept[len(kept)-limit:]
	}
	for _, d := range kept {
		out.Decisions = append(out.Decisions, EgressDecision{
			Time: d.Time.UTC().Format(time.RFC3339Nano), Host: d.Host, Port: d.Port, Addr: d.Addr, Method: d.Method, Path: d.Path,
			Allowed: d.Allowed, Rule: d.Rule, Reason: d.Reason, BytesOut: d.BytesOut, BytesIn: d.BytesIn,
		})
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: egressText(out)}}}, out, nil
}

// egressText is the log as a model reads it best: a line a decision.
func egressText(o EgressLogOutput) string {
	var b strings.Builder
	if len(o.Decisions) == 0 {
		b.WriteString("no connections in the egress log\n")
	}
	if o.Omitted > 0 {
		fmt.Fprintf(&b, "(%d older decisions not shown)\n", o.Omitted)
	}
	for _, d := range o.Decisions {
		verdict := "allowed"
		if !d.Allowed {
			verdict = "REFUSED"
		}
		fmt.Fprintf(&b, "%s %s %s:%d%s", verdict, d.Method, d.Host, d.Port, d.Path)
		if d.Rule != "" {
			fmt.Fprintf(&b, " (rule %s)", d.Rule)
		}
		if !d.Allowed && d.Reason != "" {
			fmt.Fprintf(&b, ": %s", d.Reason)
		}
		b.WriteByte('\n')
	}
	if len(o.Suggested) > 0 {
		fmt.Fprintf(&b, "allow_hosts entries the refusals needed: %s\n", strings.Join(o.Suggested, ", "))
	}
	return b.String()
}
