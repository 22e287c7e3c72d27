package proctree

import (
	"bufio"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/roche-sandbox/roche/internal/testenv"
)

// TestKillTreeKillsGroupAndLeavers starts a shell that leads its own group, leaves one
// child in a session of its own (out of the group, still below it) and keeps starting
// more children while it is killed; none may survive KillTree.
func TestKillTreeKillsGroupAndLeavers(t *testing.T) {
	cmd := exec.Command("sh", "-c", `
setsid sleep 60 &
echo "leaver $!"
i=0
while [ $i -lt 400 ]; do
  sleep 60 &
  i=$((i+1))
  [ $i -eq 10 ] && echo ready
done
wait`)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	root := cmd.Process.Pid
	leaver := 0
	t.Cleanup(func() {
		// Whatever the test's outcome, nothing it started outlives it.
		_ = syscall.Kill(-root, syscall.SIGKILL)
		if leaver > 0 {
			_ = syscall.Kill(leaver, syscall.SIGKILL)
		}
		_ = cmd.Wait()
	})
	lines := bufio.NewScanner(out)
	for lines.Scan() {
		f := strings.Fields(lines.Text())
		if len(f) == 2 && f[0] == "leaver" {
			leaver, _ = strconv.Atoi(f[1])
		}
		if f[0] == "ready" {
			break
		}
	}
	if leaver == 0 {
		t.Fatalf("the shell did not report its children: %v", lines.Err())
	}

	if err := KillTree(root); err != nil {
		t.Fatalf("KillTree: %v", err)
	}
	// The shell is gone, so the tree no longer grows: wait for what is left of it to end,
	// each process's pidfd turning readable as it does.
	if left := testenv.AwaitExit(t, live(root, leaver), 10*time.Second); len(left) > 0 {
		t.Fatalf("10 s after KillTree, processes of the tree still run: %v", left)
	}
	if left := live(root, leaver); len(left) > 0 {
		t.Fatalf("after KillTree, processes of the tree still run: %v", left)
	}
}

// live lists the processes, other than zombies, in root's group or among root and
// leaver.
func live(root, leaver int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, ok := stat(pid)
		if !ok || st.state == 'Z' {
			continue
		}
		if st.pgrp == root || pid == root || pid == leaver {
			out = append(out, pid)
		}
	}
	return out
}
