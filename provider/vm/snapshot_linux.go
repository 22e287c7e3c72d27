package vm

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/provider/kit"
	"github.com/roche-sandbox/roche/provider/vm/supervisor"
)

// Memory snapshots (qemu): a booted VM's RAM is a file of its own on a tmpfs
// (memory-backend-file, share=on), so saving a VM is QEMU's migration of its device
// state alone (x-ignore-shared leaves shared RAM out of the stream) into a file, and a
// copy of the RAM file's written pages to disk. A restore maps that disk file privately
// (share=off: copy-on-write): it reads nothing in, forks of one snapshot share every
// page none of them has written, and nothing a restored VM writes goes to the disk
// (so a full disk cannot fault its memory). A restored VM's own snapshot carries its RAM
// in the stream. The guest agent is told before (it gives up its link to the host and
// waits for a relink line) and after (fresh entropy, the time, its name and lifetime).

var _ roche.MemorySnapshotter = (*Provider)(nil)

// suspendedVM is the VM directory's SuspendedFile: the VM was saved and stopped.
type suspendedVM struct {
	SavedAt     time.Time `json:"saved_at"`
	RemainingMS int64     `json:"remaining_ms"` // of its lifetime, which is paused
	Nonce       string    `json:"nonce"`        // the relink line its guest waits for
	State       string    `json:"state"`        // the migration stream
	// Mem is the RAM file, or, with MemInStream, none: the VM's RAM was private (a
	// restored VM's) and is in State.
	Mem         string `json:"mem,omitempty"`
	MemInStream bool   `json:"mem_in_stream,omitempty"`
}

func suspended(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, supervisor.SuspendedFile))
	return err == nil
}

func readSuspended(dir string) (suspendedVM, error) {
	var sv suspendedVM
	b, err := os.ReadFile(filepath.Join(dir, supervisor.SuspendedFile))
	if err == nil {
		err = json.Unmarshal(b, &sv)
	}
	return sv, err
}

// infoOf describes a sandbox; one paused to disk ends its remaining lifetime from now.
func (p *Provider) infoOf(s *sandbox) roche.SandboxInfo {
	info := s.info(p.state(s.Dir))
	if sv, err := readSuspended(s.Dir); err == nil {
		info.ExpiresAt = time.Now().Add(time.Duration(sv.RemainingMS) * time.Millisecond)
	}
	return info
}

// memRoot is where VMs' RAM files and snapshots live: on disk, not under the state
// directory (a tmpfs on most hosts), so a VM paused to disk holds no memory.
func (p *Provider) memRoot() string {
	if p.memDirRoot != "" {
		return p.memDirRoot
	}
	return defaultDir("/var/lib/roche/vm", "XDG_DATA_HOME", "vm-mem")
}

func (p *Provider) memDir(id string) string { return filepath.Join(p.memRoot(), id) }

// ramRoot is where running VMs' RAM files live: a tmpfs, so RAM is memory, as an
// anonymous mapping's would be, and a snapshot can read it from outside QEMU.
func (p *Provider) ramRoot() string {
	if p.ramDirRoot != "" {
		return p.ramDirRoot
	}
	if os.Geteuid() == 0 {
		return "/dev/shm/roche-vm"
	}
	return "/dev/shm/roche-vm-" + strconv.Itoa(os.Geteuid())
}

func (p *Provider) ramDir(id string) string { return filepath.Join(p.ramRoot(), id) }

func makeDir(root, dir string) error {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return fmt.Errorf("%w: making the VM memory directory: %v", roche.ErrUnavailable, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("%w: making the VM memory directory: %v", roche.ErrUnavailable, err)
	}
	return nil
}

func (p *Provider) makeMemDir(id string) error { return makeDir(p.memRoot(), p.memDir(id)) }
func (p *Provider) makeRAMDir(id string) error { return makeDir(p.ramRoot(), p.ramDir(id)) }

// removeMemDir removes a VM's (or a snapshot's) RAM and saved state.
func (p *Provider) removeMemDir(id string) {
	if idPattern.MatchString(id) || strings.HasPrefix(id, "snap-") {
		_ = os.RemoveAll(p.memDir(id))
		_ = os.RemoveAll(p.ramDir(id))
	}
}

// snapshot is a VM's saved state: the migration stream and the RAM file it goes with.
type snapshot struct {
	state       string
	mem         string
	memInStream bool
	nonce       string
}

// save readies the guest, stops the VM and writes its device state (and its RAM, when
// that is a private mapping) to statePath. The VM is left stopped; the guest waits for
// the relink line of the returned nonce.
func (p *Provider) save(ctx context.Context, s *sandbox, statePath string) (snapshot, error) {
	if s.Hypervisor != QEMU {
		return snapshot{}, fmt.Errorf("%w: memory snapshots are built for qemu sandboxes; firecracker's snapshot API is not wired yet", roche.ErrUnsupported)
	}
	if err := noSnapshotWithEgress(s); err != nil {
		return snapshot{}, err
	}
	if s.Rootfs == "" || (s.Mem == "" && !s.MemPrivate) {
		return snapshot{}, fmt.Errorf("%w: sandbox %s was made before memory snapshots: its RAM is not a file", roche.ErrUnsupported, s.ID)
	}
	if _, err := os.Stat(filepath.Join(s.Dir, "paused")); err == nil {
		return snapshot{}, fmt.Errorf("%w: sandbox %s is paused in memory: unpause it first", roche.ErrInvalidConfig, s.ID)
	}
	snap := snapshot{state: statePath, mem: s.Mem, memInStream: s.MemPrivate, nonce: randomHex(16)}
	if err := s.agent.PrepareSnapshot(ctx, snap.nonce); err != nil {
		return snapshot{}, fmt.Errorf("readying sandbox %s for a snapshot: %w", s.ID, err)
	}
	f, err := os.OpenFile(statePath, os.O_CREATE|os.O_EXCL|os.O_WRONLY|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return snapshot{}, p.relinkAfterFailure(ctx, s, snap.nonce, fmt.Errorf("%w: %v", roche.ErrUnavailable, err))
	}
	defer f.Close()
	q, err := dialQMP(ctx, filepath.Join(s.Dir, "qmp.sock"))
	if err != nil {
		return snapshot{}, p.relinkAfterFailure(ctx, s, snap.nonce, err)
	}
	defer q.Close()
	err = q.do("stop", nil, nil)
	if err == nil {
		err = q.do("migrate-set-capabilities", map[string]any{"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": true}}}, nil)
	}
	if err == nil {
		err = q.do("getfd", map[string]any{"fdname": "snapshot"}, f)
	}
	if err == nil {
		err = q.do("migrate", map[string]any{"uri": "fd:snapshot"}, nil)
	}
	if err == nil {
		err = q.waitMigration(ctx)
	}
	if err != nil {
		_ = q.do("cont", nil, nil)
		os.Remove(statePath)
		return snapshot{}, p.relinkAfterFailure(ctx, s, snap.nonce, fmt.Errorf("%w: saving sandbox %s: %v", roche.ErrUnavailable, s.ID, err))
	}
	if err := f.Sync(); err != nil {
		_ = q.do("cont", nil, nil)
		os.Remove(statePath)
		return snapshot{}, p.relinkAfterFailure(ctx, s, snap.nonce, err)
	}
	return snap, nil
}

// relinkAfterFailure brings a VM whose snapshot failed back to its host, and returns err.
func (p *Provider) relinkAfterFailure(ctx context.Context, s *sandbox, nonce string, err error) error {
	if rerr := p.relink(context.WithoutCancel(ctx), s, nonce); rerr != nil {
		return fmt.Errorf("%w (and the VM could not be reached again: %v)", err, rerr)
	}
	return err
}

// restoredRequest is what a guest is told after a restore (guest.OpRestored); a zero
// lifetime leaves its lifetime as it was.
func restoredRequest(hostname string, lifetime time.Duration) guest.Request {
	req := guest.Request{Seed: randomBytes(32), TimeUnixNS: time.Now().UnixNano(), Hostname: hostname}
	if lifetime != 0 {
		req.LifetimeMS = max(lifetime.Milliseconds(), 1)
	}
	return req
}

// relink makes a running VM's supervisor start a new session with its guest (which was
// readied for a snapshot), waits for the agent and reseeds it: its memory may live on in
// forks, whose numbers it must not draw.
func (p *Provider) relink(ctx context.Context, s *sandbox, nonce string) error {
	specPath := filepath.Join(s.Dir, supervisor.SpecFile)
	var spec supervisor.Spec
	b, err := os.ReadFile(specPath)
	if err == nil {
		err = json.Unmarshal(b, &spec)
	}
	if err != nil {
		return err
	}
	spec.Relink = nonce
	if err := writeJSON(specPath, spec); err != nil {
		return err
	}
	pid := readPID(filepath.Join(s.Dir, supervisor.PIDFile))
	if pid <= 0 || !isOurProcess(pid, s.Dir, supervisor.Subcommand) {
		return fmt.Errorf("%w: the VM's supervisor is gone", roche.ErrNotFound)
	}
	if err := syscall.Kill(pid, syscall.SIGUSR2); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, p.bootTimeout)
	defer cancel()
	if err := s.agent.WaitReady(wctx); err != nil {
		return err
	}
	if err := s.agent.Restored(wctx, restoredRequest("", 0)); err != nil {
		return err
	}
	// The lease held here went with the old link (the guest kept it across the
	// snapshot, and let go of that at Restored): take it again on the new one, or the
	// guest would stop the VM its grace later.
	if p.leases.Holds(s.ID) {
		return p.leases.Take(wctx, s.ID, s.agent)
	}
	return nil
}

// PauseToDisk implements roche.MemorySnapshotter.
func (p *Provider) PauseToDisk(ctx context.Context, id string) error {
	s, err := p.lookup(id)
	if err != nil {
		return err
	}
	if suspended(s.Dir) {
		return nil
	}
	remaining := time.Until(s.ExpiresAt)
	if remaining <= 0 {
		return fmt.Errorf("%w: sandbox %s is at the end of its lifetime", roche.ErrNotFound, id)
	}
	if err := p.makeMemDir(id); err != nil {
		return err
	}
	statePath := filepath.Join(p.memDir(id), "state")
	snap, err := p.save(ctx, s, statePath)
	if err != nil {
		return err
	}
	sv := suspendedVM{SavedAt: time.Now(), RemainingMS: remaining.Milliseconds(), Nonce: snap.nonce, State: statePath, MemInStream: snap.memInStream}
	if !snap.memInStream {
		sv.Mem = filepath.Join(p.memDir(id), "mem")
		err = copySparse(s.Mem, sv.Mem)
	}
	if err == nil {
		err = writeJSON(filepath.Join(s.Dir, supervisor.SuspendedFile), sv)
	}
	if err != nil {
		os.Remove(sv.Mem)
		q, qerr := dialQMP(ctx, filepath.Join(s.Dir, "qmp.sock"))
		if qerr == nil {
			_ = q.do("cont", nil, nil)
			q.Close()
		}
		os.Remove(statePath)
		return p.relinkAfterFailure(ctx, s, snap.nonce, fmt.Errorf("%w: recording the pause: %v", roche.ErrUnavailable, err))
	}
	// The supervisor sees the hypervisor exit with SuspendedFile present and leaves the
	// directories for Resume.
	pid := readPID(filepath.Join(s.Dir, supervisor.PIDFile))
	if q, err := dialQMP(ctx, filepath.Join(s.Dir, "qmp.sock")); err == nil {
		_ = q.do("quit", nil, nil)
		q.Close()
	}
	for deadline := time.Now().Add(10 * time.Second); pid > 0 && isOurProcess(pid, s.Dir, supervisor.Subcommand) && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	if pid > 0 && isOurProcess(pid, s.Dir, supervisor.Subcommand) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if hv := hypervisorOf(s.Dir); hv > 0 {
		_ = syscall.Kill(hv, syscall.SIGKILL)
	}
	for _, f := range []string{supervisor.PIDFile, supervisor.HypervisorFile, "agent.sock", "qmp.sock"} {
		os.Remove(filepath.Join(s.Dir, f))
	}
	_ = os.RemoveAll(p.ramDir(id)) // the memory it held, saved to disk
	p.leases.Drop(id)
	p.forget(id)
	return nil
}

// Resume implements roche.MemorySnapshotter. It works from the files alone, so a
// process other than the one that paused the sandbox (roched after a restart) resumes it.
func (p *Provider) Resume(ctx context.Context, id string) (roche.SandboxInfo, error) {
	s, err := p.lookup(id)
	if err != nil {
		return roche.SandboxInfo{}, err
	}
	sv, err := readSuspended(s.Dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return roche.SandboxInfo{}, fmt.Errorf("%w: sandbox %s is not paused to disk", roche.ErrInvalidConfig, id)
		}
		return roche.SandboxInfo{}, fmt.Errorf("%w: reading how sandbox %s was paused: %v", roche.ErrUnavailable, id, err)
	}
	vm := p.restorePlan(s.meta, s.Dir, s.ID)
	vm.ExpiresAt = time.Now().Add(time.Duration(sv.RemainingMS) * time.Millisecond)
	if sv.MemInStream {
		vm.Mem, vm.MemPrivate = "", true // RAM of its own, filled from the stream
	} else {
		vm.Mem, vm.MemPrivate = sv.Mem, true
	}
	vm.incoming, vm.relink, vm.resuming = sv.State, sv.Nonce, true
	// SuspendedFile stays until the VM runs: if the start fails, its supervisor keeps
	// the files, and the resume can be tried again.
	sb, err := p.launch(ctx, vm, func(ctx context.Context) error { return p.startIncoming(ctx, vm) })
	if err != nil {
		_ = os.RemoveAll(p.ramDir(id))
		return roche.SandboxInfo{}, err
	}
	os.Remove(filepath.Join(s.Dir, supervisor.SuspendedFile))
	// Mapped now: the names can go (forks made from this pause hold their own
	// mappings); the disk space goes with the last VM mapping the file.
	os.Remove(sv.State)
	if sv.Mem != "" {
		os.Remove(sv.Mem)
	}
	p.remember(sb)
	return sb.info(roche.StateRunning), nil
}

// restorePlan is the plan to boot m's VM again from a snapshot, as sandbox id in dir.
func (p *Provider) restorePlan(m meta, dir, id string) *plan {
	m.ID, m.Dir = id, dir
	return &plan{
		meta: m, rootfs: m.Rootfs, assets: &bootAssets{vmlinux: m.Kernel},
		initrd: filepath.Join(dir, "initrd"), console: filepath.Join(dir, "console.log"),
		vcpus: m.VCPUs, memMiB: m.MemMiB,
	}
}

// startIncoming has a restoring QEMU (-incoming defer) read its saved state: the
// capability must be set on this side too for the stream to be read as it was written.
func (p *Provider) startIncoming(ctx context.Context, vm *plan) error {
	var q *qmpConn
	var err error
	for q == nil {
		q, err = dialQMP(ctx, filepath.Join(vm.Dir, "qmp.sock"))
		if err != nil {
			select {
			case <-ctx.Done():
				return fmt.Errorf("QEMU's monitor did not come up: %w", err)
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	defer q.Close()
	if err := q.do("migrate-set-capabilities", map[string]any{"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": true}}}, nil); err != nil {
		return err
	}
	if err := q.do("migrate-incoming", map[string]any{"uri": "fd:4"}, nil); err != nil {
		return err
	}
	// The VM was saved stopped, and so it is loaded: run it once loaded.
	if err := q.waitMigration(ctx); err != nil {
		return err
	}
	return q.do("cont", nil, nil)
}

// Fork implements roche.MemorySnapshotter.
func (p *Provider) Fork(ctx context.Context, id string, n int) (out []roche.SandboxInfo, err error) {
	if n < 1 || n > roche.MaxForks {
		return nil, fmt.Errorf("%w: fork count %d: give 1 to %d", roche.ErrInvalidConfig, n, roche.MaxForks)
	}
	s, err := p.lookup(id)
	if err != nil {
		return nil, err
	}
	if s.Hypervisor != QEMU {
		return nil, fmt.Errorf("%w: fork is built for qemu sandboxes; firecracker's snapshot API is not wired yet", roche.ErrUnsupported)
	}
	if err := noSnapshotWithEgress(s); err != nil {
		return nil, err
	}
	var snap snapshot
	if sv, rerr := readSuspended(s.Dir); rerr == nil {
		// Paused to disk: its files are the snapshot. Nothing writes them (its resume
		// maps them privately too), so the forks map them as they are.
		snap = snapshot{state: sv.State, mem: sv.Mem, memInStream: sv.MemInStream, nonce: sv.Nonce}
	} else {
		snapID := "snap-" + randomHex(8)
		if err := p.makeMemDir(snapID); err != nil {
			return nil, err
		}
		// The snapshot's files are removed once every fork maps them (a mapping
		// outlives the file's name), or on failure; held meanwhile, so that another
		// process's List leaves them be.
		defer func() {
			p.removeMemDir(snapID)
			p.unlockSnap(snapID)
		}()
		if err := p.lockSnap(snapID); err != nil {
			return nil, fmt.Errorf("%w: holding the fork's snapshot: %v", roche.ErrUnavailable, err)
		}
		snapDir := p.memDir(snapID)
		snap, err = p.save(ctx, s, filepath.Join(snapDir, "state"))
		if err != nil {
			return nil, err
		}
		if !snap.memInStream {
			snap.mem = filepath.Join(snapDir, "mem")
			err = copySparse(s.Mem, snap.mem)
		}
		// The origin goes on, reseeded like its forks: it must not draw their numbers.
		if q, qerr := dialQMP(ctx, filepath.Join(s.Dir, "qmp.sock")); qerr == nil {
			qerr = q.do("cont", nil, nil)
			q.Close()
			if err == nil {
				err = qerr
			}
		} else if err == nil {
			err = qerr
		}
		if rerr := p.relink(context.WithoutCancel(ctx), s, snap.nonce); err == nil {
			err = rerr
		}
		if err != nil {
			return nil, fmt.Errorf("%w: forking sandbox %s: %v", roche.ErrUnavailable, id, err)
		}
	}
	defer func() {
		if err != nil {
			for _, info := range out {
				_ = p.Destroy(context.WithoutCancel(ctx), info.ID)
			}
			out = nil
		}
	}()
	for range n {
		info, err := p.forkOne(ctx, s.meta, snap)
		if err != nil {
			return out, err
		}
		out = append(out, info)
	}
	return out, nil
}

// forkOne restores snap as a new sandbox: a new id, directory, link, lifetime and lease.
func (p *Provider) forkOne(ctx context.Context, origin meta, snap snapshot) (roche.SandboxInfo, error) {
	now := time.Now()
	id := p.Name() + "-" + randomHex(6)
	dir := filepath.Join(p.stateDir, id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return roche.SandboxInfo{}, fmt.Errorf("%w: making the VM's directory: %v", roche.ErrUnavailable, err)
	}
	vm := p.restorePlan(origin, dir, id)
	vm.CreatedAt, vm.ExpiresAt, vm.Claim = now, now.Add(time.Duration(origin.Config.TimeoutSecs)*time.Second), nil
	if origin.Claim != nil {
		vm.Config.Owner = origin.Claim.Owner
	}
	vm.incoming, vm.relink = snap.state, snap.nonce
	if snap.memInStream {
		vm.Mem, vm.MemPrivate = "", true // RAM of its own, filled from the stream
	} else {
		vm.Mem, vm.MemPrivate = snap.mem, true
	}
	// QEMU loads the initrd again (its size must match); the guest does not read it.
	if err := os.Link(filepath.Join(origin.Dir, "initrd"), vm.initrd); err != nil {
		if err := copySparse(filepath.Join(origin.Dir, "initrd"), vm.initrd); err != nil {
			p.removeDir(dir)
			p.removeMemDir(id)
			return roche.SandboxInfo{}, fmt.Errorf("%w: the origin's initrd: %v", roche.ErrUnavailable, err)
		}
	}
	sb, err := p.launch(ctx, vm, func(ctx context.Context) error { return p.startIncoming(ctx, vm) })
	if err != nil {
		p.removeDir(dir)
		p.removeMemDir(id)
		return roche.SandboxInfo{}, err
	}
	p.remember(sb)
	return sb.info(roche.StateRunning), nil
}

// copySparse copies a file, leaving its holes holes (a VM's RAM file is mostly holes).
func copySparse(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = func() error {
		if err := out.Truncate(fi.Size()); err != nil {
			return err
		}
		var off int64
		for off < fi.Size() {
			data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
			if err != nil {
				if errors.Is(err, unix.ENXIO) {
					return nil // only a hole is left
				}
				return err
			}
			hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
			if err != nil {
				return err
			}
			if _, err := io.Copy(io.NewOffsetWriter(out, data), io.NewSectionReader(in, data, hole-data)); err != nil {
				return err
			}
			off = hole
		}
		return nil
	}()
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(dst)
	}
	return err
}

// qmpConn is a session with QEMU's monitor (QMP).
type qmpConn struct {
	c *net.UnixConn
	r *bufio.Reader
}

func dialQMP(ctx context.Context, socket string) (*qmpConn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, fmt.Errorf("reaching QEMU's monitor: %w", err)
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(5 * time.Minute)
	}
	_ = c.SetDeadline(deadline)
	q := &qmpConn{c: c.(*net.UnixConn), r: bufio.NewReader(c)}
	if _, err := q.r.ReadBytes('\n'); err != nil {
		c.Close()
		return nil, fmt.Errorf("QEMU's monitor greeting: %w", err)
	}
	if err := q.do("qmp_capabilities", nil, nil); err != nil {
		c.Close()
		return nil, err
	}
	return q, nil
}

func (q *qmpConn) Close() error { return q.c.Close() }

// do runs one command; fd, when given, goes with it (SCM_RIGHTS), as getfd wants.
func (q *qmpConn) do(command string, args any, fd *os.File) error {
	_, err := q.call(command, args, fd)
	return err
}

func (q *qmpConn) call(command string, args any, fd *os.File) (json.RawMessage, error) {
	req := map[string]any{"execute": command}
	if args != nil {
		req["arguments"] = args
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	var oob []byte
	if fd != nil {
		oob = unix.UnixRights(int(fd.Fd()))
	}
	if _, _, err := q.c.WriteMsgUnix(append(b, '\n'), oob, nil); err != nil {
		return nil, fmt.Errorf("QEMU's monitor, %s: %w", command, err)
	}
	for {
		line, err := q.r.ReadBytes('\n')
		if err != nil {
			if command == "quit" {
				return nil, nil // it may go before it answers
			}
			return nil, fmt.Errorf("QEMU's monitor, %s: %w", command, err)
		}
		var resp struct {
			Return json.RawMessage `json:"return"`
			Error  *struct {
				Desc string `json:"desc"`
			} `json:"error"`
		}
		if json.Unmarshal(line, &resp) != nil {
			continue
		}
		if resp.Error != nil {
			return nil, fmt.Errorf("QEMU's monitor, %s: %s", command, resp.Error.Desc)
		}
		if resp.Return != nil {
			return resp.Return, nil
		}
	}
}

// waitMigration polls until the migration has completed.
func (q *qmpConn) waitMigration(ctx context.Context) error {
	for {
		raw, err := q.call("query-migrate", nil, nil)
		if err != nil {
			return err
		}
		var st struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		_ = json.Unmarshal(raw, &st)
		switch st.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("migration %s: %s", st.Status, st.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			_ = q.do("migrate_cancel", nil, nil)
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// restoreDiagnosis says where a restore that did not come up stands: the hypervisor's
// run state and migration, and the supervisor's log.
func (p *Provider) restoreDiagnosis(vm *plan) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out := ""
	if q, err := dialQMP(ctx, filepath.Join(vm.Dir, "qmp.sock")); err == nil {
		st, _ := q.call("query-status", nil, nil)
		mig, _ := q.call("query-migrate", nil, nil)
		q.Close()
		out += fmt.Sprintf("\nQEMU: status %s, migration %s", st, mig)
	}
	if log := tail(filepath.Join(vm.Dir, "supervisor.log"), 5); log != "" {
		out += "\nsupervisor: " + log
	}
	return out
}

var _ kit.Templater = (*Provider)(nil)

// A template (kit.Templater) is a snapshot whose origin is gone: a directory under
// memRoot, named like a fork's snapshot ("snap-..."), holding the migration stream, the
// RAM file its restores map privately (so they share every page none of them writes),
// the initrd QEMU loads again, and templateFile, what a restore needs of the origin.
const templateFile = "template.json"

// savedTemplate is templateFile.
type savedTemplate struct {
	Origin      meta   `json:"origin"` // its Dir is the template's directory
	State       string `json:"state"`
	Mem         string `json:"mem,omitempty"`
	MemInStream bool   `json:"mem_in_stream,omitempty"`
	Nonce       string `json:"nonce"`
}

// MakeTemplate implements kit.Templater: it boots a VM for cfg and opts (its owner and
// lease are every restore's), starts language's interpreter in it, saves it and
// destroys it.
func (p *Provider) MakeTemplate(ctx context.Context, cfg roche.Config, opts kit.CreateOptions, language string) (t kit.Template, err error) {
	if p.Name() != QEMU {
		return "", fmt.Errorf("%w: templates are built for qemu sandboxes; firecracker's snapshot API is not wired yet", roche.ErrUnsupported)
	}
	if len(cfg.NetworkAllowlist) > 0 {
		return "", fmt.Errorf("%w: a template of a VM with an egress allowlist: memory snapshots of a VM with egress are not supported (its proxy, CA and secrets belong to one sandbox)", roche.ErrUnsupported)
	}
	info, err := p.CreateFor(ctx, cfg, opts)
	if err != nil {
		return "", err
	}
	defer func() { _ = p.Destroy(context.WithoutCancel(ctx), info.ID) }()
	if language != "" {
		if err := p.WarmCode(ctx, info.ID, language); err != nil {
			return "", fmt.Errorf("starting its %s interpreter: %w", language, err)
		}
	}
	s, err := p.lookup(info.ID)
	if err != nil {
		return "", err
	}
	snapID := "snap-" + randomHex(8)
	if err := p.makeMemDir(snapID); err != nil {
		return "", err
	}
	defer func() {
		if err != nil {
			p.removeMemDir(snapID)
			p.unlockSnap(snapID)
		}
	}()
	// Held until DropTemplate, or this process's end: then another's List removes it.
	if err := p.lockSnap(snapID); err != nil {
		return "", fmt.Errorf("%w: holding the template: %v", roche.ErrUnavailable, err)
	}
	dir := p.memDir(snapID)
	snap, err := p.save(ctx, s, filepath.Join(dir, "state"))
	if err != nil {
		return "", err
	}
	if !snap.memInStream {
		snap.mem = filepath.Join(dir, "mem")
		if err := copySparse(s.Mem, snap.mem); err != nil {
			return "", fmt.Errorf("%w: saving the template's memory: %v", roche.ErrUnavailable, err)
		}
	}
	if err := copySparse(filepath.Join(s.Dir, "initrd"), filepath.Join(dir, "initrd")); err != nil {
		return "", fmt.Errorf("%w: keeping the template's initrd: %v", roche.ErrUnavailable, err)
	}
	origin := s.meta
	origin.Dir = dir
	st := savedTemplate{Origin: origin, State: snap.state, Mem: snap.mem, MemInStream: snap.memInStream, Nonce: snap.nonce}
	if err := writeJSON(filepath.Join(dir, templateFile), st); err != nil {
		return "", fmt.Errorf("%w: recording the template: %v", roche.ErrUnavailable, err)
	}
	return kit.Template(snapID), nil
}

// templateDir is where template t lives, or an error for a name that is not one.
func (p *Provider) templateDir(t kit.Template) (string, error) {
	id := string(t)
	if !strings.HasPrefix(id, "snap-") || strings.ContainsAny(id, `/\.`) || len(id) > 64 {
		return "", fmt.Errorf("%w: %q names no template", roche.ErrNotFound, id)
	}
	return p.memDir(id), nil
}

// CreateFromTemplate implements kit.Templater: it restores t as a new sandbox, as Fork
// makes each fork, with its own id, hostname, lifetime, lease, clock and randomness.
func (p *Provider) CreateFromTemplate(ctx context.Context, t kit.Template) (roche.SandboxInfo, error) {
	dir, err := p.templateDir(t)
	if err != nil {
		return roche.SandboxInfo{}, err
	}
	var st savedTemplate
	b, err := os.ReadFile(filepath.Join(dir, templateFile))
	if err == nil {
		err = json.Unmarshal(b, &st)
	}
	if err != nil {
		return roche.SandboxInfo{}, fmt.Errorf("%w: template %s: %v", roche.ErrNotFound, t, err)
	}
	st.Origin.Dir = dir
	return p.forkOne(ctx, st.Origin, snapshot{state: st.State, mem: st.Mem, memInStream: st.MemInStream, nonce: st.Nonce})
}

// DropTemplate implements kit.Templater.
func (p *Provider) DropTemplate(t kit.Template) {
	if _, err := p.templateDir(t); err == nil {
		p.removeMemDir(string(t))
		p.unlockSnap(string(t))
	}
}
