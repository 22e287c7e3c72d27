package vm

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/guest/vmlink"
)

// guestModules are the kernel modules the guest needs, where the kernel builds them as
// modules rather than in (Debian's builds all of these as modules): the virtio-mmio
// transport both hypervisors use, its block device and serial ports, vsock, ext4 for the
// root filesystem, overlayfs for a writable root, and crc32c, the checksum ext4 asks for
// by name (with no modprobe in the guest, it must already be loaded).
var guestModules = []string{
	"virtio_mmio", "virtio_blk", "virtio_console", "vmw_vsock_virtio_transport",
	"crc32c_generic", "ext4", "overlay",
}

// module is one kernel module to load, in order.
type module struct {
	name string
	path string // on the host
}

// moduleName is a module's name from its file name ("crc32c-intel.ko.xz" -> "crc32c_intel").
func moduleName(file string) string {
	base := filepath.Base(file)
	if i := strings.Index(base, ".ko"); i >= 0 {
		base = base[:i]
	}
	return strings.ReplaceAll(base, "-", "_")
}

// resolveModules orders the wanted modules and their dependencies, from modules.dep, as
// modprobe would load them; modules the kernel has built in (modules.builtin) need nothing.
func resolveModules(dir string, want []string) ([]module, error) {
	deps := map[string][]string{} // name -> dependency names
	paths := map[string]string{}
	f, err := os.Open(filepath.Join(dir, "modules.dep"))
	if err != nil {
		return nil, fmt.Errorf("%w: the guest kernel's modules: %v: %s", roche.ErrUnavailable, err, kernelHint)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		mod, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		name := moduleName(mod)
		paths[name] = filepath.Join(dir, mod)
		for _, d := range strings.Fields(rest) {
			deps[name] = append(deps[name], moduleName(d))
		}
	}
	builtin := map[string]bool{}
	if b, err := os.ReadFile(filepath.Join(dir, "modules.builtin")); err == nil {
		for _, line := range strings.Fields(string(b)) {
			builtin[moduleName(line)] = true
		}
	}
	var order []module
	seen := map[string]bool{}
	var visit func(name string, chain []string) error
	visit = func(name string, chain []string) error {
		if seen[name] || builtin[name] {
			return nil
		}
		p, ok := paths[name]
		if !ok {
			return fmt.Errorf("%w: the guest kernel in %s has no module %s and does not build it in (needed by %s)",
				roche.ErrUnavailable, dir, name, strings.Join(append(chain, name), " -> "))
		}
		seen[name] = true
		// modules.dep lists each module's dependencies, the deepest last.
		d := deps[name]
		for i := len(d) - 1; i >= 0; i-- {
			if err := visit(d[i], append(chain, name)); err != nil {
				return err
			}
		}
		order = append(order, module{name: name, path: p})
		return nil
	}
	for _, w := range want {
		if err := visit(w, nil); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// readModule returns a module's bytes, decompressed (the guest loads plain .ko files).
func readModule(ctx context.Context, path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var tool []string
	switch {
	case strings.HasSuffix(path, ".ko"):
		return b, nil
	case strings.HasSuffix(path, ".ko.gz"):
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return io.ReadAll(zr)
	case strings.HasSuffix(path, ".ko.xz"):
		tool = []string{"xz", "-dc"}
	case strings.HasSuffix(path, ".ko.zst"):
		tool = []string{"zstd", "-dc"}
	default:
		return nil, fmt.Errorf("module %s: unknown compression", path)
	}
	cmd := exec.CommandContext(ctx, tool[0], tool[1:]...)
	cmd.Stdin = bytes.NewReader(b)
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("decompressing module %s with %s: %w", path, tool[0], err)
	}
	return out, nil
}

// checkStatic refuses an agent binary that needs a dynamic loader: the initramfs has no
// C library.
func checkStatic(agent string) error {
	f, err := elf.Open(agent)
	if err != nil {
		return fmt.Errorf("%w: roche-agent at %s: %v", roche.ErrUnavailable, agent, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%w: roche-agent at %s is dynamically linked and cannot be a VM's init: build it with CGO_ENABLED=0 (make build does)", roche.ErrUnavailable, agent)
		}
	}
	if f.Machine != elf.EM_X86_64 {
		return fmt.Errorf("%w: roche-agent at %s is not an x86-64 binary", roche.ErrUnavailable, agent)
	}
	return nil
}

// writeBaseInitramfs writes the initramfs every VM shares: roche-agent as /init, the
// modules, and the directories init needs. The kernel gives init its console through
// /dev/console, so that node is in the archive (devtmpfs is not mounted yet).
func writeBaseInitramfs(ctx context.Context, w io.Writer, agentPath string, mods []module) error {
	cw := newCPIOWriter(w)
	for _, d := range []string{"dev", "proc", "sys", "newroot", "lib", "lib/modules", "roche"} {
		cw.Dir(d, 0o755)
	}
	cw.CharDev("dev/console", 0o600, 5, 1)
	a, err := os.Open(agentPath)
	if err != nil {
		return err
	}
	defer a.Close()
	fi, err := a.Stat()
	if err != nil {
		return err
	}
	cw.FileFrom("init", 0o755, a, fi.Size())
	names := make([]string, 0, len(mods))
	for _, m := range mods {
		b, err := readModule(ctx, m.path)
		if err != nil {
			return err
		}
		cw.File("lib/modules/"+m.name+".ko", 0o644, b)
		names = append(names, m.name)
	}
	cw.File(strings.TrimPrefix(vmlink.ModulesPath, "/"), 0o644, []byte(strings.Join(names, "\n")+"\n"))
	return cw.Close()
}

// writeConfigArchive writes the small archive appended to the shared initramfs for one VM.
func writeConfigArchive(w io.Writer, cfg vmlink.GuestConfig) error {
	b, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	cw := newCPIOWriter(w)
	cw.File(strings.TrimPrefix(vmlink.ConfigPath, "/"), 0o600, b)
	return cw.Close()
}
