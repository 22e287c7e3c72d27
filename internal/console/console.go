// Package console is the web console roched serves at /ui (roched --ui): its front-end,
// embedded so that nothing is built or fetched at run time, and the headers it is served
// with. The data it shows comes from roched's API and its /ui/api endpoints
// (internal/daemon console.go), with the session cookie a one-time login code bought
// (roche ui) or a token the user gives the page.
package console

import (
	"embed"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
)

//go:embed web
var web embed.FS

// Assets is the console's front-end: index.html, app.js, app.css and vendor/ (the
// libraries internal/console/package-lock.json pins; scripts/console-vendor.sh copies
// them in).
func Assets() fs.FS {
	sub, err := fs.Sub(web, "web")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	return sub
}

// ContentSecurityPolicy is sent with every asset: scripts only from roched itself (no
// inline script, no eval), requests only to roched, never framed. Inline styles are
// allowed because xterm.js sets its cell sizes with a <style> element.
const ContentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; " +
	"connect-src 'self'; img-src 'self' data:; font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// SetHeaders sets the security headers every console response carries.
func SetHeaders(h http.Header) {
	h.Set("Content-Security-Policy", ContentSecurityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
}

// Handler serves the assets below prefix ("/ui/"); "/ui" itself redirects there. Only
// GET and HEAD; anything not in the tree is 404.
func Handler(prefix string) http.Handler {
	assets := Assets()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		SetHeaders(w.Header())
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "the console's pages are read with GET", http.StatusMethodNotAllowed)
			return
		}
		if r.URL.Path == strings.TrimSuffix(prefix, "/") {
			http.Redirect(w, r, prefix, http.StatusFound)
			return
		}
		name := strings.TrimPrefix(r.URL.Path, prefix)
		if name == "" {
			name = "index.html"
		}
		name = path.Clean(name)
		b, err := fs.ReadFile(assets, name)
		if err != nil || !fs.ValidPath(name) {
			http.NotFound(w, r)
			return
		}
		ct := mime.TypeByExtension(path.Ext(name))
		if ct == "" {
			ct = "application/octet-stream"
		}
		w.Header().Set("Content-Type", ct)
		_, _ = w.Write(b)
	})
}
