package faults

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/defaults"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/oci"
)

// TestGuardHoldsWithoutTheStateFile does what the fault matrix did: roched, whose state
// file is not beside its socket (--state), hands a pooled sandbox with its own env and
// workdir to a client and is killed outright. roche exec on that sandbox must not run
// it directly, silently without them: it refuses, naming roched and --direct, whether
// the state file beside the socket is missing, corrupt or unreadable (a directory in its
// place). The sandbox itself says it is roched's. --direct still acts on it, and shows
// what acting directly drops.
func TestGuardHoldsWithoutTheStateFile(t *testing.T) {
	real := realProvider(t)
	img := privateImage(t)
	rd := startRochedProc(t, "--pool", "docker/"+img+"?min=1&max=1")
	eventually(t, time.Minute, "the pool to fill", func() bool {
		idle, creating, _ := rd.poolCounts(t)
		return idle == 1 && creating == 0
	})
	cfg := roche.DefaultConfig()
	cfg.Image = img
	cfg.Env = map[string]string{"FROM_POOL": "yes"}
	cfg.Workdir = "/tmp/wd"
	sb, pooled, err := rd.c.Create(context.Background(), "docker", cfg)
	if err != nil || !pooled {
		t.Fatalf("create through roched: pooled %v, %v; want one from the pool", pooled, err)
	}
	defer real.Destroy(context.Background(), sb.ID)
	// Killed mid-refill is TestRochedKilledDuringRefill's: here the pool is full again.
	eventually(t, time.Minute, "the pool to refill", func() bool {
		idle, creating, _ := rd.poolCounts(t)
		return idle == 1 && creating == 0
	})
	rd.kill(t)

	beside := client.StateFile(rd.socket)
	env := []string{"ROCHE_SOCKET=" + rd.socket}
	want := "sandbox " + sb.ID + " is managed by roched, which is not answering on " + rd.socket +
		": start it (roche daemon start) or pass --direct to act on it without its env and workdir"
	for _, c := range []struct {
		name  string
		setUp func() error
	}{
		{"no state file beside the socket", func() error { return nil }},
		{"a corrupt one", func() error { return os.WriteFile(beside, []byte(`{"version":1,"sandboxes":[{"id":"`), 0o600) }},
		{"an unreadable one", func() error { os.Remove(beside); return os.Mkdir(beside, 0o700) }},
	} {
		if err := c.setUp(); err != nil {
			t.Fatal(err)
		}
		r := runRoche(t, env, "exec", "--sandbox", sb.ID, "--", "sh", "-c", "echo ${FROM_POOL:-unset} $PWD")
		if r.code == 0 || !strings.Contains(r.stderr, want) || strLines(r.stderr) != 1 {
			t.Errorf("%s: roche exec with roched killed: %+v, want one line saying %q", c.name, r, want)
		}
	}
	r := runRoche(t, env, "--direct", "exec", "--sandbox", sb.ID, "--", "sh", "-c", "echo ${FROM_POOL:-unset}")
	if r.code != 0 || r.stdout != "unset\n" {
		t.Errorf("roche --direct exec: %+v, want it run without the pool's env", r)
	}
	if err := real.Destroy(context.Background(), sb.ID); err != nil {
		t.Fatal(err)
	}
	noneLeft(t, real, img, 30*time.Second)
}

// TestRochedKilledUnderForegroundCommands kills roched outright while two commands run
// through it in a sandbox it made for a client: one from the CLI (roche exec, which
// streams its output) and one from the Go client's unary Exec. Both callers hear, in one
// line, that roched went away, that the command was stopped with it and that the
// sandbox stays, never a bare "protocol error: incomplete envelope"; and it does: the
// sandbox answers afterwards, the commands no longer run.
func TestRochedKilledUnderForegroundCommands(t *testing.T) {
	real := realProvider(t)
	img := privateImage(t)
	rd := startRochedProc(t)
	cfg := roche.DefaultConfig()
	cfg.Image = img
	sb, err := rd.c.Provider("docker").Create(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer real.Destroy(context.Background(), sb.ID)

	cli := exec.Command(filepath.Join(binDir, "roche"), "exec", "--sandbox", sb.ID, "--", "sh", "-c", "echo started; exec sleep 301")
	cli.Env = append(os.Environ(), "ROCHE_SOCKET="+rd.socket)
	stdout, err := cli.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cli.Stderr = &stderr
	if err := cli.Start(); err != nil {
		t.Fatal(err)
	}
	defer cli.Process.Kill()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "started\n" {
		t.Fatalf("roche exec through roched printed %q, %v", line, err)
	}
	unary := make(chan error, 1)
	go func() {
		_, err := rd.c.Provider("docker").Exec(context.Background(), sb.ID,
			roche.ExecRequest{Cmd: []string{"sh", "-c", "touch /tmp/unary; exec sleep 302"}})
		unary <- err
	}()
	running := func(what string) int {
		res, err := real.Exec(context.Background(), sb.ID, roche.ExecRequest{Cmd: []string{"sh", "-c",
			"for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done | grep -c '^" + what + "' || true"}})
		if err != nil {
			t.Fatalf("looking for %s in the sandbox: %v", what, err)
		}
		return int(res.Stdout[0] - '0')
	}
	eventually(t, 30*time.Second, "the unary Exec's command to start", func() bool {
		return running("sleep 302") == 1
	})

	rd.kill(t)
	waitExit(t, cli, 10*time.Second)
	want := "roched went away while the command ran in sandbox " + sb.ID
	for who, msg := range map[string]string{"roche exec": strings.TrimSpace(stderr.String()), "the Go client's Exec": fmt.Sprint(<-unary)} {
		if !strings.Contains(msg, want) || !strings.Contains(msg, "the command was stopped with it") ||
			!strings.Contains(msg, "the sandbox stays") || strings.Contains(msg, "\n") {
			t.Errorf("%s with roched killed: %q, want one line saying %q, what became of the command and of the sandbox", who, msg, want)
		}
	}
	if code := cli.ProcessState.ExitCode(); code == 0 {
		t.Errorf("roche exec exited 0 with roched killed under it")
	}
	eventually(t, 10*time.Second, "the commands to have stopped", func() bool {
		return running("sleep 30") == 0
	})
	if err := real.Destroy(context.Background(), sb.ID); err != nil {
		t.Fatal(err)
	}
	noneLeft(t, real, img, 30*time.Second)
}

// TestStateFileLostKeepsClientSandboxes does what the fault matrix did: roched, with a
// pool, hands sandboxes to a client, some from the pool (each with the env, workdir and
// lifetime its create asked for) and some made for it, and is killed outright; its state
// file is then cut short. The next roched refuses to start on it, saying to move it
// aside; moved aside as told, the one after finds every client sandbox again from the
// sandboxes themselves (the pooled ones from their claims: the pool's owner label
// alone once had 11 of 13 destroyed as pool leftovers) and serves them as before: the
// same ids, env, workdir and end. Only the dead daemon's idle pool members go.
func TestStateFileLostKeepsClientSandboxes(t *testing.T) {
	real := realProvider(t)
	img := privateImage(t)
	dir := shortDir(t)
	state := filepath.Join(dir, "state.json")
	rd := startRochedIn(t, dir, "--pool", "docker/"+img+"?min=3&max=3")
	eventually(t, 2*time.Minute, "the pool to fill", func() bool {
		idle, creating, _ := rd.poolCounts(t)
		return idle == 3 && creating == 0
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	type made struct {
		sb     roche.SandboxInfo
		pooled bool
		env    string
	}
	var mine []made
	for i := range 5 {
		cfg := roche.DefaultConfig()
		cfg.Image = img
		cfg.TimeoutSecs = 240 + 10*i
		env := fmt.Sprintf("client-%d", i)
		cfg.Env = map[string]string{"WHO": env}
		if i < 3 {
			cfg.Workdir = fmt.Sprintf("/tmp/wd%d", i)
		} else {
			cfg.Memory = "256m" // not the pool's: made for it
		}
		sb, pooled, err := rd.c.Create(ctx, "docker", cfg)
		if err != nil || pooled != (i < 3) {
			t.Fatalf("create %d: pooled %v, %v", i, pooled, err)
		}
		defer real.Destroy(context.Background(), sb.ID)
		mine = append(mine, made{sb, pooled, env})
	}
	eventually(t, 2*time.Minute, "the pool to refill", func() bool {
		idle, creating, _ := rd.poolCounts(t)
		return idle == 3 && creating == 0
	})
	rd.kill(t)

	b, err := os.ReadFile(state)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(state, b[:len(b)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	refused := exec.Command(filepath.Join(binDir, "roched"), "--socket", rd.socket, "--state", state)
	out, err := refused.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "move it aside") {
		t.Fatalf("roched on a state file cut short: %v\n%s\nwant it refused, saying to move the file aside", err, out)
	}
	if err := os.Rename(state, state+".bad"); err != nil {
		t.Fatal(err)
	}
	next := startRochedIn(t, dir)
	list, err := next.c.Provider("docker").List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mine {
		var found *roche.SandboxInfo
		for i := range list {
			if list[i].ID == m.sb.ID {
				found = &list[i]
			}
		}
		if found == nil {
			t.Errorf("sandbox %s (pooled %v) is not served after the state file was lost", m.sb.ID, m.pooled)
			continue
		}
		if d := found.ExpiresAt.Sub(m.sb.ExpiresAt); d < -time.Second || d > time.Second {
			t.Errorf("sandbox %s (pooled %v) ends at %v, the client was told %v", m.sb.ID, m.pooled, found.ExpiresAt, m.sb.ExpiresAt)
		}
		want := m.env + " /\n"
		if m.pooled {
			want = m.env + " /tmp/wd" + m.env[len(m.env)-1:] + "\n"
		}
		res, err := next.c.Provider("docker").Exec(ctx, m.sb.ID, roche.ExecRequest{Cmd: []string{"sh", "-c", "echo $WHO $PWD"}})
		if err != nil || res.Stdout != want {
			t.Errorf("exec in sandbox %s (pooled %v) after the state file was lost: %q %v, want %q", m.sb.ID, m.pooled, res.Stdout, err, want)
		}
	}
	if len(list) != len(mine) {
		t.Errorf("the next roched serves %d sandboxes, want the client's %d", len(list), len(mine))
	}
	for _, m := range mine {
		if err := next.c.Provider("docker").Destroy(ctx, m.sb.ID); err != nil {
			t.Error(err)
		}
	}
	// The dead daemon's idle pool members were destroyed as leftovers.
	noneLeft(t, real, img, 30*time.Second)
}

// TestRochedKilledDuringOCICreates does what the fault matrix did: roched is killed
// outright 0.12 s into 20 concurrent oci creates, and started again on its state file.
// Every create whose caller was told it failed must leave no live sandbox (the matrix
// found 5 of 16 adopted and kept for their whole lifetime), and every one told it
// succeeded is served by the next roched. At the end nothing of them is left: no
// sandbox directory, cgroup or mount.
func TestRochedKilledDuringOCICreates(t *testing.T) {
	img := privateImage(t)
	local, err := oci.New(oci.WithLogger(testLogger(t))) // roched's state directory, as root
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	ours := func() map[string]bool {
		list, err := local.List(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		ids := map[string]bool{}
		for _, sb := range list {
			if sb.Image == img {
				ids[sb.ID] = true
			}
		}
		return ids
	}
	defer func() {
		for id := range ours() {
			t.Errorf("oci sandbox %s left", id)
			local.Destroy(context.Background(), id)
		}
	}()

	dir := shortDir(t)
	rd := startRochedIn(t, dir)
	// The image unpacked into the provider's cache first, so that the creates race
	// only with the kill.
	cfg := roche.DefaultConfig()
	cfg.Image = img
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	warm, err := rd.c.Provider("oci").Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := rd.c.Provider("oci").Destroy(ctx, warm.ID); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the first sandbox to be removed", func() bool { return len(ours()) == 0 })

	dirsBefore := ociDirs()
	const creates = 20
	type outcome struct {
		id  string
		err error
	}
	outcomes := make(chan outcome, creates)
	for range creates {
		go func() {
			sb, err := rd.c.Provider("oci").Create(ctx, cfg)
			outcomes <- outcome{sb.ID, err}
		}()
	}
	time.Sleep(120 * time.Millisecond) // the matrix's moment: a fault injected, not a wait
	rd.kill(t)
	killed := time.Now()
	told := map[string]bool{}
	failed := 0
	for range creates {
		o := <-outcomes
		if o.err == nil {
			told[o.id] = true
		} else {
			failed++
		}
	}
	made := ours()
	// A create killed before its record (many wait for the state directory's lock to
	// draw a uid) leaves only its directory, which holds nothing else: gc and the next
	// create's sweep remove it once its create has given up (TestRestartFindsSandboxes).
	// The state directory is the machine's: a directory without a record may also be
	// another process's create under way (another test's, a roche run's), which then
	// writes its record; a killed roched's never does.
	var unrecorded []string
	for name := range ociDirs() {
		if !recorded(name) && !dirsBefore[name] && !made[name] {
			unrecorded = append(unrecorded, name)
		}
	}
	t.Logf("killed 0.12 s into %d oci creates: %d told they succeeded, %d that they failed; %d oci sandboxes of theirs on disk, %d directories without a record",
		creates, len(told), failed, len(made), len(unrecorded))
	for id := range told {
		made[id] = true
	}

	next := startRochedIn(t, dir)
	var left map[string]bool
	// A create that finished in the provider but whose answer the kill cut off is a
	// client's leased sandbox whose lease nobody took: the restarted roched keeps it (its
	// client may hold it again) and its agent stops it once the first lease is overdue,
	// agentspec.FirstLease of the create's deadline after its start (about 60 s). The wait
	// goes past that, with margin; a minute was that very moment, and failed by
	// milliseconds.
	eventually(t, 100*time.Second, "the creates cut short to be destroyed", func() bool {
		left = ours()
		for id := range left {
			if !told[id] {
				return false
			}
		}
		return true
	})
	for id := range told {
		if !left[id] {
			t.Errorf("sandbox %s, whose create was told it succeeded, is gone", id)
			continue
		}
		res, err := next.c.Provider("oci").Exec(ctx, id, roche.ExecRequest{Cmd: []string{"true"}})
		if err != nil || res.ExitCode != 0 {
			t.Errorf("sandbox %s, whose create was told it succeeded: exec %+v %v", id, res, err)
		}
		if err := next.c.Provider("oci").Destroy(ctx, id); err != nil {
			t.Error(err)
		}
	}
	eventually(t, time.Minute, "every oci sandbox of the test to be removed", func() bool { return len(ours()) == 0 })
	if len(unrecorded) > 0 {
		// Their creates gave up an engine timeout after they began; the next create's
		// sweep (at most once a minute per process: this is the restarted roched's first)
		// then removes them.
		time.Sleep(time.Until(killed.Add(defaults.EngineTimeout + 2*time.Second)))
		sb, err := next.c.Provider("oci").Create(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := next.c.Provider("oci").Destroy(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		eventually(t, 30*time.Second, "the directories left without a record to be swept", func() bool {
			now := ociDirs()
			for _, name := range unrecorded {
				if now[name] && !recorded(name) {
					return false
				}
			}
			return true
		})
		for _, name := range unrecorded {
			if recorded(name) {
				t.Logf("%s, without a record at the kill, has one now: another process's create", name)
			}
		}
		eventually(t, time.Minute, "the sweep's create to be removed", func() bool { return len(ours()) == 0 })
	}
	// What the sandboxes were made of goes with them, the cut-short ones' too.
	eventually(t, 30*time.Second, "the sandboxes' directories, cgroups and mounts to go", func() bool {
		for id := range made {
			if left := ociRemains(id); len(left) > 0 {
				t.Logf("%s: %v", id, left)
				return false
			}
		}
		return true
	})
}

// recorded reports whether oci sandbox directory name in roched's state directory holds
// a record: its create got that far.
func recorded(name string) bool {
	_, err := os.Stat(filepath.Join("/run/roche/oci", name, "record.json"))
	return err == nil
}

// ociDirs names the sandbox directories in roched's oci state directory.
func ociDirs() map[string]bool {
	entries, _ := os.ReadDir("/run/roche/oci")
	out := map[string]bool{}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "oci-") {
			out[e.Name()] = true
		}
	}
	return out
}

// ociRemains lists what is left on the host of oci sandbox id made by a roched (the
// provider's default directories): its directory, its disk, its cgroups, its mounts.
func ociRemains(id string) []string {
	var left []string
	for _, d := range []string{filepath.Join("/run/roche/oci", id), filepath.Join("/var/lib/roche/oci/sandboxes", id)} {
		if _, err := os.Lstat(d); err == nil {
			left = append(left, d)
		}
	}
	cgroups, _ := filepath.Glob("/sys/fs/cgroup/*/roche-" + id)
	left = append(left, cgroups...)
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mounts), "\n") {
		if strings.Contains(line, "/"+id+"/") {
			left = append(left, "mount: "+line)
		}
	}
	return left
}

// TestOCITornDownWhenTheAgentExits: an oci sandbox whose roche-agent (PID 1) exits,
// at the end of its lifetime or killed from the host, is torn down at once by the
// process that made it (roched, here an oci provider in the test's process): its
// directory, cgroups, overlay mounts, and the loop device under its writable root's
// disk, not at the next restart, create or gc.
func TestOCITornDownWhenTheAgentExits(t *testing.T) {
	testenv.Needs(t, testenv.Root, testenv.Docker)
	state := filepath.Join("/run/roche-faults", filepath.Base(shortDir(t)))
	data := filepath.Join("/var/lib/roche-faults", filepath.Base(shortDir(t)))
	for _, d := range []string{state, data} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	p, err := oci.New(oci.WithStateDir(state), oci.WithDataDir(data), oci.WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Close()
		unix.Unmount(state, 0) // the tmpfs the provider may put its state on
		os.RemoveAll(state)
		os.RemoveAll(data)
	})
	img := privateImage(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, c := range []struct {
		name     string
		lifetime int
		// end ends the sandbox's agent, within the time it returns.
		end func(t *testing.T, id string) time.Duration
	}{
		{"lifetime over", 3, func(*testing.T, string) time.Duration { return 3 * time.Second }},
		{"killed", 300, func(t *testing.T, id string) time.Duration {
			b, err := os.ReadFile(filepath.Join(state, id, "pid"))
			if err != nil {
				t.Fatal(err)
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				t.Fatal(err)
			}
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			return 0
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := roche.DefaultConfig()
			cfg.Image = img
			cfg.Writable = true // a sized disk: a loop device to let go of
			cfg.TimeoutSecs = c.lifetime
			sb, err := p.Create(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Destroy(context.Background(), sb.ID)
			remains := func() []string {
				return remainsOf(sb.ID, filepath.Join(state, sb.ID), filepath.Join(data, "sandboxes", sb.ID))
			}
			before := remains()
			if !slices.ContainsFunc(before, func(s string) bool { return strings.HasPrefix(s, "loop device") }) ||
				!slices.ContainsFunc(before, func(s string) bool { return strings.HasPrefix(s, "mount") }) {
				t.Fatalf("a live writable sandbox shows no loop device or mount to watch: %v", before)
			}
			within := c.end(t, sb.ID)
			ended := time.Now()
			var left []string
			eventually(t, within+5*time.Second+margin, "the ended sandbox to be torn down", func() bool {
				left = remains()
				return len(left) == 0
			})
			t.Logf("torn down %v after it was ended (%d things it held)", time.Since(ended).Round(100*time.Millisecond), len(before))
			if list, err := p.List(ctx); err != nil || slices.ContainsFunc(list, func(s roche.SandboxInfo) bool { return s.ID == sb.ID }) {
				t.Errorf("still listed after it was torn down: %v %v", list, err)
			}
		})
	}
}

// remainsOf lists what is left on the host of oci sandbox id: its directories, cgroups,
// mounts below them and loop devices backed by a file below them.
func remainsOf(id string, dirs ...string) []string {
	var left []string
	for _, d := range dirs {
		if _, err := os.Lstat(d); err == nil {
			left = append(left, d)
		}
	}
	cgroups, _ := filepath.Glob("/sys/fs/cgroup/*/roche-" + id)
	left = append(left, cgroups...)
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mounts), "\n") {
		for _, d := range dirs {
			if strings.Contains(line, " "+d+"/") || strings.Contains(line, " "+d+" ") {
				left = append(left, "mount: "+line)
			}
		}
	}
	backing, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range backing {
		b, _ := os.ReadFile(f)
		for _, d := range dirs {
			if strings.HasPrefix(strings.TrimSpace(string(b)), d+"/") {
				left = append(left, "loop device "+f+": "+strings.TrimSpace(string(b)))
			}
		}
	}
	return left
}

// TestSkippedProviderIsNeverSilent does what the fault matrix did, on a private hung
// engine (a socket that accepts and never answers, as Docker's): every list or count
// across providers, through roched and in direct mode, says it skipped Docker in its
// exit status (3), on stderr, and in its JSON (an object with "skipped" instead of the
// array a script would read as "no sandboxes"). roche list once exited 0 with only its
// header (or [] with --json) and nothing on stderr.
func TestSkippedProviderIsNeverSilent(t *testing.T) {
	hung := "DOCKER_HOST=unix://" + silentSocket(t)
	rd := startRochedEnv(t, shortDir(t), []string{hung})
	modes := map[string][]string{
		"through roched": {"ROCHE_SOCKET=" + rd.socket},
		// Its own owner: a destroy --all in direct mode reaches only what it made.
		"direct": append(noDaemon(t), hung, "ROCHE_OWNER=faults-skipped-"+strconv.Itoa(os.Getpid())),
	}
	type check struct {
		args    []string
		jsonKey string // the key of the list in the JSON object, for --json
	}
	checks := []check{
		{[]string{"list"}, ""},
		{[]string{"list", "--json"}, "sandboxes"},
		{[]string{"gc", "--dry-run"}, ""},
		{[]string{"destroy", "--all"}, ""},
		{[]string{"workspace", "list", "--json"}, "workspaces"},
		{[]string{"snapshot", "list", "--json"}, "snapshots"},
	}
	type outcome struct {
		mode string
		c    check
		r    result
	}
	out := make(chan outcome, len(modes)*len(checks))
	for mode, env := range modes {
		for _, c := range checks {
			go func() { out <- outcome{mode, c, runRoche(t, env, c.args...)} }()
		}
	}
	for range len(modes) * len(checks) {
		o := <-out
		what := fmt.Sprintf("%s: roche %s", o.mode, strings.Join(o.c.args, " "))
		if o.r.code != 3 {
			t.Errorf("%s with Docker hung: exit %d, want 3 (incomplete): %+v", what, o.r.code, o.r)
		}
		if o.c.jsonKey == "" {
			if !strings.Contains(o.r.stderr, "roche: incomplete: skipped docker (") {
				t.Errorf("%s: stderr %q does not say docker was skipped", what, o.r.stderr)
			}
			continue
		}
		var got map[string]json.RawMessage
		var skipped []struct{ Provider, Reason, Message string }
		if err := json.Unmarshal([]byte(o.r.stdout), &got); err != nil || got[o.c.jsonKey] == nil ||
			json.Unmarshal(got["skipped"], &skipped) != nil || len(skipped) == 0 || skipped[0].Provider != "docker" ||
			skipped[0].Reason != "unavailable" || !strings.Contains(skipped[0].Message, "not answering") {
			t.Errorf("%s: JSON %q, want {%q: [...], \"skipped\": [docker, unavailable, not answering]}", what, o.r.stdout, o.c.jsonKey)
		}
		var line struct {
			Error struct {
				Reason  string
				Skipped []struct{ Provider string }
			}
		}
		if json.Unmarshal([]byte(o.r.stderr), &line) != nil || line.Error.Reason != "incomplete" || len(line.Error.Skipped) == 0 {
			t.Errorf("%s: stderr %q, want one JSON line with reason incomplete and the skipped providers", what, o.r.stderr)
		}
	}
}
