package providertest

import (
	"strings"
	"testing"
	"time"
)

// testReceipt: a command's result carries what it used, measured by roche-agent: a
// program that fills 100 MiB reports a peak of at least that, a busy loop its CPU time,
// and one that leaves a process running in the background counts it. A sandbox reached
// without roche-agent (a fallback transport) has nothing to measure with: its results
// carry no receipt, never a made-up one.
func (s *suite) testReceipt(t *testing.T, id string) {
	info, err := s.p.Inspect(ctxFor(t, time.Minute), id)
	if err != nil {
		t.Fatal(err)
	}
	if info.Transport != "agent" {
		res := s.py(t, id, "print(1)")
		if res.Receipt != nil {
			t.Fatalf("transport %q runs no roche-agent, yet the result has a receipt %+v", info.Transport, *res.Receipt)
		}
		t.Logf("no receipt: transport %q has no roche-agent to measure commands", info.Transport)
		return
	}

	const fill = 100 << 20
	res := s.py(t, id, "b = b'x' * (100 << 20); print(len(b))")
	if res.ExitCode != 0 || res.Receipt == nil {
		t.Fatalf("filling 100 MiB: exit %d, receipt %v; stderr %q", res.ExitCode, res.Receipt, res.Stderr)
	}
	if got := res.Receipt.PeakMemoryBytes; got < fill {
		t.Errorf("a program that filled 100 MiB has a peak of %d bytes, want >= %d", got, fill)
	}
	t.Logf("100 MiB program: peak %d MiB, CPU %s", res.Receipt.PeakMemoryBytes>>20, res.Receipt.CPUTime)

	res = s.py(t, id, `
import time
t = time.process_time()
while time.process_time() - t < 0.5:
    pass`)
	if res.ExitCode != 0 || res.Receipt == nil {
		t.Fatalf("busy loop: exit %d, receipt %v; stderr %q", res.ExitCode, res.Receipt, res.Stderr)
	}
	if got := res.Receipt.CPUTime; got < 400*time.Millisecond {
		t.Errorf("a loop that took 0.5 s of CPU reports %s", got)
	}
	if res.Receipt.Leftover != 0 {
		t.Errorf("a program that started nothing left %d processes", res.Receipt.Leftover)
	}
	if res.Receipt.End != "" || res.Receipt.Evidence != "" {
		t.Errorf("a program that ended on its own has an end %q (%q)", res.Receipt.End, res.Receipt.Evidence)
	}

	res = s.py(t, id, `
import subprocess, sys
p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(100)'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(p.pid)`)
	if res.ExitCode != 0 || res.Receipt == nil {
		t.Fatalf("leaving a process: exit %d, receipt %v; stderr %q", res.ExitCode, res.Receipt, res.Stderr)
	}
	left := strings.TrimSpace(res.Stdout)
	// The process left behind goes now: the shared sandbox's other checks count processes.
	s.pyOK(t, id, "import os, signal\ntry: os.kill("+left+", signal.SIGKILL)\nexcept ProcessLookupError: pass")
	if res.Receipt.Leftover != 1 {
		t.Errorf("a program that left one process running (pid %s) reports %d left", left, res.Receipt.Leftover)
	}
}
