package daemon

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// TestConsoleInABrowser drives the console in headless Chromium against a roched with
// real Docker sandboxes: the list shows a sandbox with its live memory and processes,
// the terminal runs what is typed into it, a destroy from the page shows the sandbox
// among the ended with its reason, and a read-only token's page has no destroy and is
// refused one when it asks anyway. Screenshots go to $ROCHE_TEST_ARTIFACTS when set.
func TestConsoleInABrowser(t *testing.T) {
	testenv.Needs(t, testenv.Docker, testenv.Chromium)
	admin, viewer := randomToken(), randomToken()
	cfg := Config{
		Listen: "tcp://127.0.0.1:0", UI: true,
		Tenants: []Tenant{{Name: "acme", TokenSHA256: HashToken(admin), ReadOnlyTokenSHA256: []string{HashToken(viewer)}}},
	}
	td := startDaemon(t, cfg)
	base := "http://" + td.d.TCPAddr().String()
	c, err := client.New(client.WithAddress(base), client.WithToken(admin))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := ctxFor(t, 4*time.Minute)
	p := c.Provider("docker")
	sb, err := p.Create(ctx, pyConfig())
	if err != nil {
		t.Fatal(err)
	}
	kept, err := p.Create(ctx, pyConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Destroy(context.WithoutCancel(ctx), kept.ID)

	bctx := browser(t, ctx)
	shot := screenshots(t, bctx)
	row := fmt.Sprintf(`#sandboxes tr[data-id=%q]`, sb.ID)

	// Sign in; the list shows the sandbox with live figures read from its cgroup.
	do(t, bctx, "sign in",
		chromedp.Navigate(base+"/ui/"),
		chromedp.WaitVisible("#token", chromedp.ByQuery),
		chromedp.SendKeys("#token", admin, chromedp.ByQuery),
		chromedp.Click("#login-form button", chromedp.ByQuery),
		chromedp.WaitVisible(row, chromedp.ByQuery),
	)
	var mem, procs, url string
	waitFor(t, bctx, "live memory and processes", func() bool {
		do(t, bctx, "read figures",
			chromedp.Text(row+" td.memory", &mem, chromedp.ByQuery),
			chromedp.Text(row+" td.processes", &procs, chromedp.ByQuery))
		return strings.Contains(mem, "iB /") && procs != "" && procs != "0" && procs != "–"
	})
	do(t, bctx, "url", chromedp.Location(&url))
	if strings.Contains(url, admin) {
		t.Errorf("the token is in the page's URL %s", url)
	}
	shot("list")

	// The terminal: what is typed runs in the sandbox's shell (the shell computes 6*7).
	do(t, bctx, "open the terminal",
		chromedp.Click(row+" button.terminal", chromedp.ByQuery),
		chromedp.WaitVisible("#terminal .xterm-helper-textarea", chromedp.ByQuery),
	)
	waitFor(t, bctx, "the shell's pid", func() bool {
		var status string
		do(t, bctx, "status", chromedp.Text("#terminal-status", &status, chromedp.ByQuery))
		return strings.HasPrefix(status, "shell pid")
	})
	do(t, bctx, "type", chromedp.Focus("#terminal .xterm-helper-textarea", chromedp.ByQuery),
		input.InsertText("echo typed-$((6*7))"), chromedp.KeyEvent(kb.Enter))
	var screen string
	waitFor(t, bctx, "the terminal's echo", func() bool {
		do(t, bctx, "screen", chromedp.Text("#terminal .xterm-rows", &screen, chromedp.ByQuery))
		return strings.Contains(screen, "typed-42")
	})
	if !strings.Contains(screen, "echo typed-$((6*7))") {
		t.Errorf("the terminal does not show the typed command: %q", screen)
	}
	shot("terminal")

	// Destroy from the page (accepting its confirm): it moves to the ended, with why.
	chromedp.ListenTarget(bctx, func(ev any) {
		if _, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			go chromedp.Run(bctx, page.HandleJavaScriptDialog(true))
		}
	})
	do(t, bctx, "destroy", chromedp.Click(row+" button.destroy", chromedp.ByQuery))
	endedRow := fmt.Sprintf(`#ended tr[data-ended=%q]`, sb.ID)
	var reason, detail string
	waitFor(t, bctx, "the ended sandbox's reason", func() bool {
		var n int
		do(t, bctx, "ended", chromedp.Evaluate(fmt.Sprintf(`document.querySelectorAll(%q).length`, endedRow), &n))
		if n == 0 {
			return false
		}
		do(t, bctx, "reason", chromedp.Text(endedRow+" td.reason", &reason, chromedp.ByQuery),
			chromedp.Text(endedRow+" td.detail", &detail, chromedp.ByQuery))
		return true
	})
	if reason != "destroyed" || !strings.Contains(detail, "acme") {
		t.Errorf("ended %s: reason %q, detail %q; want destroyed by tenant acme", sb.ID, reason, detail)
	}
	eventually(t, 30*time.Second, "the destroyed sandbox to go from the engine", func() bool { return td.gone(sb.ID) })
	shot("ended")

	// A read-only token: the page offers no terminal or destroy, and roched refuses the
	// page's own call when it makes one anyway.
	keptRow := fmt.Sprintf(`#sandboxes tr[data-id=%q]`, kept.ID)
	do(t, bctx, "sign in read-only",
		chromedp.Click("#signout", chromedp.ByQuery),
		chromedp.WaitVisible("#token", chromedp.ByQuery),
		chromedp.SendKeys("#token", viewer, chromedp.ByQuery),
		chromedp.Click("#login-form button", chromedp.ByQuery),
		chromedp.WaitVisible(keptRow, chromedp.ByQuery),
	)
	var who string
	var buttons int
	do(t, bctx, "read-only page", chromedp.Text("#who", &who, chromedp.ByQuery),
		chromedp.Evaluate(fmt.Sprintf(`document.querySelectorAll(%q).length`, keptRow+" button"), &buttons))
	if !strings.Contains(who, "read-only") || buttons != 0 {
		t.Errorf("read-only page: %q with %d buttons on the sandbox's row", who, buttons)
	}
	var refused string
	do(t, bctx, "read-only destroy", chromedp.Evaluate(
		fmt.Sprintf(`call("Destroy", {ids: [%q]}).then(() => "destroyed", (e) => e.code + ": " + e.message)`, kept.ID),
		&refused, func(p *runtime.EvaluateParams) *runtime.EvaluateParams { return p.WithAwaitPromise(true) }))
	if !strings.HasPrefix(refused, "permission_denied") {
		t.Errorf("the read-only page's Destroy: %q, want permission_denied", refused)
	}
	var term string
	do(t, bctx, "read-only terminal", chromedp.Evaluate(
		fmt.Sprintf(`call("CreatePty", {sandboxId: %q}).then((r) => "pid " + r.pid, (e) => e.code + ": " + e.message)`, kept.ID),
		&term, func(p *runtime.EvaluateParams) *runtime.EvaluateParams { return p.WithAwaitPromise(true) }))
	if !strings.HasPrefix(term, "permission_denied") {
		t.Errorf("the read-only page's CreatePty: %q, want permission_denied", term)
	}
	if td.gone(kept.ID) {
		t.Fatalf("sandbox %s destroyed through a read-only token", kept.ID)
	}
	shot("read-only")
}

// browser starts headless Chromium for the test; it ends with the test.
func browser(t *testing.T, ctx context.Context) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath("chromium"),
		chromedp.NoSandbox, // as root, Chromium's own sandbox will not start
		chromedp.DisableGPU,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 1000),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	bctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Run(bctx); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	return bctx
}

func do(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action) {
	t.Helper()
	actx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Run(actx, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// waitFor polls the page until cond holds, for up to a minute.
func waitFor(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: not within a minute", what)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// screenshots returns a function that keeps a screenshot of the page under
// $ROCHE_TEST_ARTIFACTS/console (nothing without it).
func screenshots(t *testing.T, ctx context.Context) func(name string) {
	dir := os.Getenv("ROCHE_TEST_ARTIFACTS")
	return func(name string) {
		if dir == "" {
			return
		}
		var png []byte
		do(t, ctx, "screenshot "+name, chromedp.FullScreenshot(&png, 100))
		out := filepath.Join(dir, "console")
		if err := os.MkdirAll(out, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(out, name+".png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
