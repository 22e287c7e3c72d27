package escape

import (
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// The host side: what an unprivileged local user (uid 65534, no groups) reaches of the
// sandboxes' control channels. The audit's way in on gVisor was runsc's control socket,
// abstract and unchecked: a local user ran a shell as root inside a sandbox.

// hostSockets lists the unix sockets on the host: files under /run and the temporary
// directory (the providers' agent and supervisor sockets live there), and the abstract
// names of the host's network namespace.
func hostSockets() (files, abstract []string) {
	for _, root := range []string{"/run", os.TempDir()} {
		base := strings.Count(root, "/")
		filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			if d.IsDir() && strings.Count(p, "/")-base > 6 {
				return fs.SkipDir
			}
			if d.Type()&fs.ModeSocket != 0 {
				files = append(files, p)
			}
			return nil
		})
	}
	if b, err := os.ReadFile("/proc/net/unix"); err == nil {
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) == 8 && strings.HasPrefix(f[7], "@") && f[5] == "01" { // listening
				abstract = append(abstract, f[7][1:])
			}
		}
	}
	slices.Sort(files)
	slices.Sort(abstract)
	return slices.Compact(files), slices.Compact(abstract)
}

// newSince is what after holds that before did not.
func newSince(before, after []string) []string {
	var out []string
	for _, s := range after {
		if !slices.Contains(before, s) {
			out = append(out, s)
		}
	}
	return out
}

// localUserProbe runs as the local user: connects to each socket and reads each file,
// answering per kind like the in-sandbox probe.
const localUserProbe = `
import errno, json, os, socket, sys
a = json.loads(sys.argv[1])
def first(items, fn):
    seen = []
    for i in items:
        try:
            fn(i)
            return 'ok:' + i.replace('\0', '@')
        except OSError as e:
            n = errno.errorcode.get(e.errno, str(e.errno))
            if n not in seen: seen.append(n)
    return ','.join(sorted(seen)) or 'none'
def connect(p):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(3)
    try: s.connect(p)
    finally: s.close()
print(json.dumps({
    'host.sockets': first(a['files'] or [], connect),
    'host.abstract': first(['\0' + n for n in a['abstract'] or []], connect),
    'host.credentials': first(a['secrets'] or [], lambda p: open(p, 'rb').read(1)),
    'whoami': '%d:%d' % (os.getuid(), os.getgid()),
}))`

// localUser tries, as the local user, every socket that appeared on the host since
// before (the sandboxes' own), and the files that would let it drive the provider.
func (h *harness) localUser(before hostView, obs map[string]string) {
	files, abstract := hostSockets()
	args := map[string][]string{
		"files":    newSince(before.files, files),
		"abstract": newSince(before.abstract, abstract),
		"secrets":  secretFiles(h.col.name),
	}
	h.t.Logf("as uid 65534: %d new socket files, %d new abstract sockets, %d credential files", len(args["files"]), len(args["abstract"]), len(args["secrets"]))
	b, _ := json.Marshal(args)
	cmd := exec.Command("/usr/bin/python3", "-c", localUserProbe, string(b))
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/bin:/bin"} // none of the test's own environment
	var stderr strings.Builder
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
	out, err := cmd.Output()
	if err != nil {
		h.t.Fatalf("the local user's probe: %v (%s%s)", err, out, stderr.String())
	}
	got := map[string]string{}
	if err := json.Unmarshal([]byte(lastLine(string(out))), &got); err != nil || got["whoami"] != "65534:65534" {
		h.t.Fatalf("the local user's probe answered %q: %v", out, err)
	}
	for _, k := range []string{"host.sockets", "host.abstract", "host.credentials"} {
		obs[k] = got[k]
	}
	if len(args["secrets"]) == 0 {
		obs["host.credentials"] = "nosurface: no cluster credentials"
	}
}

// hostView is what the host held before the sandboxes were made.
type hostView struct{ files, abstract []string }

func viewHost() hostView {
	f, a := hostSockets()
	return hostView{f, a}
}

// secretFiles are the files that would let a local user drive a column's backend: the
// engine's socket is tried above; here the cluster's admin credentials.
func secretFiles(col string) []string {
	if col != cK8s || cluster == nil {
		return nil
	}
	return []string{cluster.Kubeconfig, cluster.TokenFile}
}
