package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// browserDriver is the npm driver of TestConsoleInABrowser: puppeteer-core, pinned in
// its package-lock.json; scripts/test.sh runs npm ci there.
const browserDriver = "testdata/console-browser"

// browserRun is what the driver (console.mjs) saw.
type browserRun struct {
	Figures map[string]struct {
		CPU       string `json:"cpu"`
		Memory    string `json:"memory"`
		Processes string `json:"processes"`
	} `json:"figures"`
	Who      string `json:"who"`
	Location string `json:"location"`
	Cookies  []struct {
		Name     string `json:"name"`
		HTTPOnly bool   `json:"httpOnly"`
		SameSite string `json:"sameSite"`
	} `json:"cookies"`
	Screen string `json:"screen"`
	Ended  struct {
		Reason, Detail string
	} `json:"ended"`
	Reuse          string `json:"reuse"`
	ReuseAppHidden bool   `json:"reuse_app_hidden"`
	Viewer         struct {
		Who     string `json:"who"`
		Buttons int    `json:"buttons"`
		Destroy string `json:"destroy"`
		PTY     string `json:"pty"`
	} `json:"viewer"`
}

// TestConsoleInABrowser drives the console in Debian's headless chromium with a pinned
// npm driver (puppeteer-core), against a roched with real Docker sandboxes, signed in by
// roche ui's one-time login URLs: the list shows both sandboxes with live CPU, memory and
// tasks, the terminal echoes what is typed and the shell runs it, a destroy from the
// page shows the sandbox among the ended with its reason, the login URL opened a second
// time is refused, and a read-only token's session has no terminal or destroy and is
// refused both when its page calls them anyway. Screenshots go to
// $ROCHE_TEST_ARTIFACTS/console when set.
func TestConsoleInABrowser(t *testing.T) {
	testenv.Needs(t, testenv.Docker, testenv.Chromium, testenv.Node)
	driver, err := filepath.Abs(browserDriver)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(driver, "node_modules", "puppeteer-core")); err != nil {
		t.Fatalf("the browser driver is not installed: (cd internal/daemon/%s && npm ci --ignore-scripts) (scripts/test.sh does)", browserDriver)
	}
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal(err)
	}
	admin, viewer := randomToken(), randomToken()
	cfg := Config{
		Listen: "tcp://127.0.0.1:0", UI: true,
		Tenants: []Tenant{{Name: "acme", TokenSHA256: HashToken(admin), ReadOnlyTokenSHA256: []string{HashToken(viewer)}}},
	}
	td := startDaemon(t, cfg)
	base := "http://" + td.d.TCPAddr().String()
	ctx := ctxFor(t, 4*time.Minute)
	login := func(tok string) (*client.Client, string) {
		c, err := client.New(client.WithAddress(base), client.WithToken(tok))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		l, err := c.ConsoleLogin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return c, l.URL
	}
	c, adminURL := login(admin)
	_, viewerURL := login(viewer)
	p := c.Provider("docker")
	sb, err := p.Create(ctx, pyConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if !td.gone(sb.ID) {
			p.Destroy(context.WithoutCancel(ctx), sb.ID)
		}
	}()
	kept, err := p.Create(ctx, pyConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Destroy(context.WithoutCancel(ctx), kept.ID)

	in, _ := json.Marshal(map[string]string{"chromium": chromium, "admin_url": adminURL, "viewer_url": viewerURL,
		"destroy": sb.ID, "kept": kept.ID, "artifacts": os.Getenv("ROCHE_TEST_ARTIFACTS")})
	node := exec.CommandContext(ctx, "node", "console.mjs")
	node.Dir = driver
	node.Env = append(os.Environ(), "ROCHE_CONSOLE="+string(in))
	var stdout, stderr bytes.Buffer
	node.Stdout, node.Stderr = &stdout, &stderr
	if err := node.Run(); err != nil {
		t.Fatalf("the browser driver: %v\n%s", err, stderr.String())
	}
	var run browserRun
	if err := json.Unmarshal(stdout.Bytes(), &run); err != nil {
		t.Fatalf("the browser driver's report %q: %v", stdout.String(), err)
	}

	// Signed in by the login URL, as acme's admin; the code gone from the address bar;
	// the session cookie HttpOnly and SameSite=Strict; the token in none of them.
	if !strings.Contains(run.Who, "tenant acme (admin)") {
		t.Errorf("signed in by the login URL as %q, want acme's admin", run.Who)
	}
	if strings.Contains(run.Location, "code=") || strings.Contains(run.Location, admin) {
		t.Errorf("the page's URL after sign-in still holds the code or the token: %s", run.Location)
	}
	var session bool
	for _, ck := range run.Cookies {
		if ck.Name == sessionCookie {
			session = ck.HTTPOnly && ck.SameSite == "Strict"
		}
	}
	if !session {
		t.Errorf("the browser's cookies %+v: want %s, HttpOnly and SameSite=Strict", run.Cookies, sessionCookie)
	}
	for _, id := range []string{sb.ID, kept.ID} {
		f, ok := run.Figures[id]
		if !ok || !strings.HasSuffix(f.CPU, " %") || !strings.Contains(f.Memory, "iB /") || f.Processes == "" || f.Processes == "0" {
			t.Errorf("live figures of %s: %+v, want CPU, memory against its limit and tasks", id, f)
		}
	}
	if !strings.Contains(run.Screen, "echo typed-$((6*7))") || !strings.Contains(run.Screen, "typed-42") {
		t.Errorf("the terminal shows %q, want the typed command echoed and its output", run.Screen)
	}
	if run.Ended.Reason != "destroyed" || !strings.Contains(run.Ended.Detail, "acme") {
		t.Errorf("ended %s: reason %q, detail %q; want destroyed by tenant acme", sb.ID, run.Ended.Reason, run.Ended.Detail)
	}
	eventually(t, 30*time.Second, "the destroyed sandbox to go from the engine", func() bool { return td.gone(sb.ID) })
	if !strings.Contains(run.Reuse, "login code was refused") || !run.ReuseAppHidden {
		t.Errorf("the login URL opened a second time: %q (app hidden: %v), want it refused", run.Reuse, run.ReuseAppHidden)
	}
	v := run.Viewer
	if !strings.Contains(v.Who, "read-only") || v.Buttons != 0 {
		t.Errorf("read-only page: %q with %d buttons on the sandbox's row", v.Who, v.Buttons)
	}
	if !strings.HasPrefix(v.Destroy, "permission_denied") || !strings.HasPrefix(v.PTY, "permission_denied") {
		t.Errorf("the read-only page's Destroy: %q, CreatePty: %q; want permission_denied", v.Destroy, v.PTY)
	}
	if td.gone(kept.ID) {
		t.Fatalf("sandbox %s destroyed through a read-only session", kept.ID)
	}
}
