package docker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/docker"
)

// deniedProbe tries, as the sandbox user, system calls that the engine's default
// profile allows (Debian's 20.10, and every Docker since for ptrace and modify_ldt) and
// Roche's profile refuses, and prints each one's result.
const deniedProbe = `
import ctypes, errno, os, platform, time
nr = {
    'x86_64': {'io_uring_setup': 425, 'ptrace': 101, 'modify_ldt': 154, 'name_to_handle_at': 303},
    'aarch64': {'io_uring_setup': 425, 'ptrace': 117, 'name_to_handle_at': 264},
}[platform.machine()]
libc = ctypes.CDLL(None, use_errno=True)
def call(name, *args):
    ctypes.set_errno(0)
    r = libc.syscall(nr[name], *args)
    return name + '=' + ('allowed' if r >= 0 else errno.errorcode.get(ctypes.get_errno(), '?'))
out = [call('io_uring_setup', 1, ctypes.create_string_buffer(120))]
if 'modify_ldt' in nr:
    out.append(call('modify_ldt', 0, ctypes.create_string_buffer(16), 16))
handle = ctypes.create_string_buffer(8 + 128)
ctypes.memmove(handle, (128).to_bytes(4, 'little'), 4)
out.append(call('name_to_handle_at', -100, b'/tmp', handle, ctypes.byref(ctypes.c_int()), 0))
pid = os.fork()
if pid == 0:
    time.sleep(30)
    os._exit(0)
out.append(call('ptrace', 16, pid, 0, 0))
os.kill(pid, 9)
os.waitpid(pid, 0)
print(' '.join(out))`

// TestSeccompProfileApplied: every Docker sandbox, with roche-agent or through the exec
// fallback, runs under Roche's profile and not the engine's default: the engine is
// handed the checked-in profile, and from inside, calls the engine's default allows and
// the host kernel serves fail with EPERM, while programs run as usual.
func TestSeccompProfileApplied(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	hostAllows(t)
	want, err := os.ReadFile("../internal/seccomp/seccomp.json")
	if err != nil {
		t.Fatal(err)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, want); err != nil {
		t.Fatal(err)
	}
	cli := engineClient(t)
	for _, c := range []struct {
		name string
		opts []docker.Option
	}{{"agent", nil}, {"exec fallback", []docker.Option{docker.WithTransport(docker.TransportDockerExec)}}} {
		t.Run(c.name, func(t *testing.T) {
			p := newProvider(t, c.opts...)
			id := sandbox(t, p, testConfig())
			ins, err := cli.ContainerInspect(context.Background(), id)
			if err != nil {
				t.Fatal(err)
			}
			if opts := ins.HostConfig.SecurityOpt; !slices.Contains(opts, "seccomp="+compact.String()) || !slices.Contains(opts, "no-new-privileges:true") {
				t.Fatalf("the engine was not handed Roche's profile and no-new-privileges: %d security options", len(opts))
			}
			got := execOK(t, p, id, "python3", "-c", deniedProbe)
			for _, kv := range strings.Fields(got) {
				if name, result, _ := strings.Cut(kv, "="); result != "EPERM" {
					t.Errorf("%s inside the sandbox: %s, want EPERM from Roche's profile", name, result)
				}
			}
			if n := len(strings.Fields(got)); n < 3 {
				t.Fatalf("probe printed %q", got)
			}
			if got := execOK(t, p, id, "python3", "-c", "import json, subprocess; print(json.dumps(subprocess.run(['true']).returncode))"); got != "0\n" {
				t.Fatalf("python under the profile: %q", got)
			}
		})
	}
}

// hostAllows checks that the host kernel itself serves ptrace and modify_ldt to root, so
// that their failing inside a sandbox is the filter's doing.
func hostAllows(t *testing.T) {
	t.Helper()
	if runtime.GOARCH == "amd64" {
		var ldt [16]byte
		if _, _, e := unix.Syscall(unix.SYS_MODIFY_LDT, 0, uintptr(unsafe.Pointer(&ldt[0])), uintptr(len(ldt))); e != 0 {
			t.Fatalf("modify_ldt on the host: %v: the check inside would prove nothing", e)
		}
	}
	child := exec.Command("sleep", "30")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { child.Process.Kill(); child.Wait() }()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.PtraceAttach(child.Process.Pid); err != nil {
		t.Fatalf("ptrace on the host: %v: the check inside would prove nothing", err)
	}
	if b, err := os.ReadFile("/proc/sys/kernel/io_uring_disabled"); err == nil && strings.TrimSpace(string(b)) != "0" {
		t.Logf("the host kernel restricts io_uring itself (io_uring_disabled=%s)", strings.TrimSpace(string(b)))
	}
}
