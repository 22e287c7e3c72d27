package doctor_test

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	dockerclient "github.com/docker/docker/client"
	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche/internal/catalog"
	"github.com/roche-sandbox/roche/internal/doctor"
	"github.com/roche-sandbox/roche/internal/inproc"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/kit"
)

// TestPrivateEngine runs a dockerd of the test's own (its own roots, socket and network
// namespace, no bridge: as internal/faults does, never touching the shared one), empty
// and with no runtime but runc. Running, doctor finds it answering and names what it
// lacks: the image (built with roche image build python) and, for docker on runsc, the
// runtime (registered by scripts/runsc.sh). Stopped, it names the engine and how to
// start it.
func TestPrivateEngine(t *testing.T) {
	testenv.Needs(t, testenv.Docker, testenv.Root)
	dir := testenv.ShortDir(t)
	host := "unix://" + filepath.Join(dir, "d.sock")
	if err := os.WriteFile(filepath.Join(dir, "daemon.json"), []byte("{}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	log := &testenv.SyncBuffer{}
	cmd := exec.Command("unshare", "--net", "--", "dockerd",
		"--data-root", filepath.Join(dir, "data"), "--exec-root", filepath.Join(dir, "exec"),
		"--pidfile", filepath.Join(dir, "d.pid"), "--config-file", filepath.Join(dir, "daemon.json"), "-H", host,
		"--bridge=none", "--iptables=false", "--ip-masq=false", "--ip6tables=false", "--storage-driver", "overlay2")
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting a private dockerd: %v", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	stop := func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	}
	t.Cleanup(func() {
		stop()
		// dockerd stops its containerd; one left behind is found by its pid file.
		if b, err := os.ReadFile(filepath.Join(dir, "exec", "containerd", "containerd.pid")); err == nil {
			if pid, _ := strconv.Atoi(strings.TrimSpace(string(b))); pid > 0 {
				if comm, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm"); strings.TrimSpace(string(comm)) == "containerd" {
					syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		for _, m := range mountsUnder(dir) {
			unix.Unmount(m, unix.MNT_DETACH)
		}
		if t.Failed() {
			t.Logf("private dockerd log:\n%s", log.String())
		}
	})
	c, err := dockerclient.NewClientWithOpts(dockerclient.WithHost(host), dockerclient.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	testenv.Eventually(t, 60*time.Second, "the private dockerd to answer", func() bool {
		select {
		case <-done:
			t.Fatalf("the private dockerd exited: %s", log.String())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := c.Ping(ctx)
		return err == nil
	})

	t.Setenv("DOCKER_HOST", host)
	settings := catalog.Options{EngineTimeout: 30 * time.Second, Transport: "agent"}
	r := doctor.Run(context.Background(), doctor.Options{Open: inproc.Open, Settings: settings, Timeout: 10 * time.Second})
	runc := entry(t, r, "docker", "runc")
	wantMissing(t, runc, "image", kit.DiagnoseImage+" is not in the Docker engine at "+host, "roche image build python", true)
	if eng := detailOf(runc, "engine"); !strings.Contains(eng, "at "+host) {
		t.Errorf("the engine check: %q, want the private engine answering at %s", eng, host)
	}
	wantMissing(t, entry(t, r, "docker", "runsc"), "runtime", `has no runtime "runsc" registered`, "bash scripts/runsc.sh", true)

	stop()
	r = doctor.Run(context.Background(), doctor.Options{Open: inproc.Open, Settings: settings, Timeout: 10 * time.Second})
	wantMissing(t, entry(t, r, "docker", "runc"), "engine", "not reachable at "+host, "systemctl start docker", true)
	wantMissing(t, entry(t, r, "oci", "runc"), "image", "not reachable at "+host, "systemctl start docker", true)
}

// detailOf is the detail of p's check named check, "" when it has none.
func detailOf(p doctor.Provider, check string) string {
	for _, f := range p.Checks {
		if f.Check == check {
			return f.Detail
		}
	}
	return ""
}

// mountsUnder lists the mount points under dir, deepest first.
func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
			out = append([]string{fields[4]}, out...)
		}
	}
	return out
}
