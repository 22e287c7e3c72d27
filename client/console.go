package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/roche-sandbox/roche"
)

// ConsoleLogin is a one-time login URL of roched's console (roched --ui): opened in a
// browser before Expires, it signs that browser in as the client's tenant, with its
// token's role, once. The token itself is not in it.
type ConsoleLogin struct {
	URL     string    `json:"url"`
	Expires time.Time `json:"expires_at"`
}

// ConsoleLogin asks roched for a one-time login URL of its console (roche ui). roched
// must serve the console (--ui) and be reached over TCP with a tenant's token.
func (c *Client) ConsoleLogin(ctx context.Context) (ConsoleLogin, error) {
	var l ConsoleLogin
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/ui/api/login-code", nil)
	if err != nil {
		return l, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return l, c.unreachable(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	msg := strings.TrimSpace(string(body))
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return l, fmt.Errorf("%w: roched at %s serves no console: start it with --ui (and --listen tcp://HOST:PORT)", roche.ErrUnavailable, c.where)
	case http.StatusUnauthorized:
		return l, fmt.Errorf("%w: roched at %s refused the token: %s", roche.ErrPermission, c.where, msg)
	case http.StatusForbidden:
		return l, fmt.Errorf("%w: roched at %s: %s", roche.ErrPermission, c.where, msg)
	case http.StatusTooManyRequests:
		return l, fmt.Errorf("%w: roched at %s: %s", roche.ErrExhausted, c.where, msg)
	default:
		return l, fmt.Errorf("%w: roched at %s answered a console login code with %s: %s", roche.ErrUnavailable, c.where, resp.Status, msg)
	}
	if err := json.Unmarshal(body, &l); err != nil || l.URL == "" {
		return l, fmt.Errorf("%w: roched at %s sent a malformed login code: %s", roche.ErrUnavailable, c.where, msg)
	}
	return l, nil
}
