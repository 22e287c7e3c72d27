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
	"testing"
	"time"

	"github.com/docker/docker/client"
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
            if e.errno in (errno.ECONNREFUSED, errno.ENOENT):
                continue  # gone meanwhile: no channel to reach
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
func (h *harness) localUser(before hostView, ids []string, obs map[string]string) {
	files, abstract := hostSockets()
	// Other tests' sockets come and go meanwhile: only those of these sandboxes, by
	// their ids (oci, qemu, runsc's per container) or the directories Docker mounts as
	// their agents' (named apart from the id).
	marks := ids
	if strings.HasPrefix(h.col.name, "docker") {
		marks = append(marks, dockerAgentDirs(h.t, ids)...)
	}
	var mine []string
	for _, f := range newSince(before.files, files) {
		for _, m := range marks {
			if strings.Contains(f, m) {
				mine = append(mine, f)
				break
			}
		}
	}
	// A Pod's agent is reached through the API server, a WASI guest's is the process.
	if len(mine) == 0 && h.col.name != cWasm && h.col.name != cK8s {
		h.t.Fatalf("no socket of sandboxes %v among the host's new ones: %v", ids, newSince(before.files, files))
	}
	// The engines' own sockets, where there are.
	for _, f := range []string{"/run/docker.sock", "/run/containerd/containerd.sock"} {
		if _, err := os.Stat(f); err == nil {
			mine = append(mine, f)
		}
	}
	if h.col.name == cK8s && cluster != nil && cluster.Containerd != "" {
		mine = append(mine, cluster.Containerd)
	}
	args := map[string][]string{
		"files":    mine,
		"abstract": newSince(before.abstract, abstract),
		"secrets":  secretFiles(h.col.name),
	}
	h.t.Logf("as uid 65534: socket files %v, abstract sockets %v, credential files %v", args["files"], args["abstract"], args["secrets"])
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

// dockerAgentDirs are the host directories Docker containers ids mount as their agent's.
func dockerAgentDirs(t *testing.T, ids []string) []string {
	t.Helper()
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	var dirs []string
	for _, id := range ids {
		c, err := cli.ContainerInspect(ctxFor(t, time.Minute), id)
		if err != nil {
			t.Fatalf("inspecting sandbox %s: %v", id, err)
		}
		for _, m := range c.Mounts {
			if m.Destination == "/.roche/run" {
				dirs = append(dirs, m.Source+"/")
			}
		}
	}
	return dirs
}
