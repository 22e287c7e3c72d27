//go:build linux

package vm

import (
	"bytes"
	"compress/gzip"
	"context"
	"debug/elf"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/guest/vmlink"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// fakeBzImage wraps payload (compressed with gzip) in a minimal bzImage header.
func fakeBzImage(t *testing.T, payload []byte, version string) []byte {
	t.Helper()
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	zw.Write(payload)
	zw.Close()
	const setupSects = 3
	img := make([]byte, (setupSects+1)*512)
	img[0x1f1] = setupSects
	copy(img[0x202:], "HdrS")
	binary.LittleEndian.PutUint16(img[0x206:], 0x20f)
	// The version string sits in the setup code; its offset is relative to 0x200.
	copy(img[0x300:], version+" (test@example) #1\x00")
	binary.LittleEndian.PutUint16(img[0x20e:], 0x100)
	binary.LittleEndian.PutUint32(img[0x248:], 16) // the payload starts 16 bytes into the protected-mode part
	binary.LittleEndian.PutUint32(img[0x24c:], uint32(z.Len()))
	img = append(img, make([]byte, 16)...)
	img = append(img, z.Bytes()...)
	return append(img, make([]byte, 64)...) // trailing bytes, as a real image has
}

func TestExtractVmlinuxFromBzImage(t *testing.T) {
	exe, err := os.ReadFile("/proc/self/exe") // any x86-64 ELF stands in for a kernel
	if err != nil {
		t.Fatal(err)
	}
	img := fakeBzImage(t, exe, "6.1.0-99-test")
	got, err := extractVmlinux(context.Background(), img)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, exe) {
		t.Fatalf("extracted %d bytes, want the %d-byte ELF", len(got), len(exe))
	}
	if v, err := kernelVersion(img); err != nil || v != "6.1.0-99-test" {
		t.Fatalf("version %q %v", v, err)
	}
	// Without a usable header, the payload is found by its magic number.
	broken := append([]byte(nil), img...)
	binary.LittleEndian.PutUint32(broken[0x24c:], 0)
	if got, err := extractVmlinux(context.Background(), broken); err != nil || !bytes.Equal(got, exe) {
		t.Fatalf("scanning for the payload: %d bytes, %v", len(got), err)
	}
	// An ELF is returned as it is; anything else is a one-line error.
	if got, _ := extractVmlinux(context.Background(), exe); !bytes.Equal(got, exe) {
		t.Fatal("an ELF kernel was not passed through")
	}
	if _, err := extractVmlinux(context.Background(), []byte("not a kernel at all")); err == nil || strings.Contains(err.Error(), "\n") {
		t.Fatalf("garbage: %v, want a one-line error", err)
	}
}

// TestExtractVmlinuxDebianKernel uncompresses the installed Debian kernel (xz inside).
func TestExtractVmlinuxDebianKernel(t *testing.T) {
	path, err := findKernel("")
	if err != nil {
		t.Fatalf("%v (the README's test command installs linux-image-amd64)", err)
	}
	img, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	version, err := kernelVersion(img)
	if err != nil || !strings.Contains(path, version) {
		t.Fatalf("version of %s: %q %v", path, version, err)
	}
	start := time.Now()
	out, err := extractVmlinux(context.Background(), img)
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.NewFile(bytes.NewReader(out))
	if err != nil || f.Machine != elf.EM_X86_64 {
		t.Fatalf("not an x86-64 ELF: %v", err)
	}
	t.Logf("%s: %d MiB compressed, %d MiB vmlinux, in %v", path, len(img)>>20, len(out)>>20, time.Since(start).Round(time.Millisecond))
	mods, err := resolveModules(filepath.Join("/lib/modules", version), guestModules)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range mods {
		names = append(names, m.name)
	}
	t.Logf("modules, in load order: %s", strings.Join(names, " "))
	if names[len(names)-1] != "overlay" || indexOf(names, "virtio") > indexOf(names, "virtio_mmio") {
		t.Fatalf("load order %v: dependencies must come first", names)
	}
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

func TestVersionLess(t *testing.T) {
	for _, c := range []struct{ a, b string }{
		{"vmlinuz-6.1.9-amd64", "vmlinuz-6.1.10-amd64"},
		{"vmlinuz-5.10.0-28-amd64", "vmlinuz-6.1.0-1-amd64"},
		{"vmlinuz-6.1.0-9-amd64", "vmlinuz-6.1.0-56-amd64"},
	} {
		if !versionLess(c.a, c.b) || versionLess(c.b, c.a) {
			t.Errorf("%s < %s not seen", c.a, c.b)
		}
	}
}

func TestResolveModules(t *testing.T) {
	dir := t.TempDir()
	dep := "kernel/fs/ext4/ext4.ko: kernel/lib/crc16.ko kernel/fs/mbcache.ko kernel/fs/jbd2/jbd2.ko\n" +
		"kernel/fs/jbd2/jbd2.ko:\nkernel/fs/mbcache.ko:\nkernel/lib/crc16.ko:\n" +
		"kernel/drivers/virtio/virtio_mmio.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko\n" +
		"kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko\nkernel/drivers/virtio/virtio_ring.ko:\n" +
		"kernel/arch/x86/crypto/crc32c-intel.ko:\n"
	os.WriteFile(filepath.Join(dir, "modules.dep"), []byte(dep), 0o644)
	os.WriteFile(filepath.Join(dir, "modules.builtin"), []byte("kernel/fs/overlayfs/overlay.ko\n"), 0o644)
	mods, err := resolveModules(dir, []string{"virtio_mmio", "ext4", "overlay", "crc32c_intel"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range mods {
		names = append(names, m.name)
	}
	if got, want := strings.Join(names, " "), "virtio_ring virtio virtio_mmio jbd2 mbcache crc16 ext4 crc32c_intel"; got != want {
		t.Fatalf("order %q, want %q", got, want)
	}
	if _, err := resolveModules(dir, []string{"vsock"}); !errors.Is(err, roche.ErrUnavailable) || !strings.Contains(err.Error(), "vsock") {
		t.Fatalf("a missing module: %v", err)
	}
}

// TestCPIOReadableByCpio checks the archive writer against GNU cpio.
func TestCPIOReadableByCpio(t *testing.T) {
	cpioBin, err := exec.LookPath("cpio")
	if err != nil {
		t.Skip("cpio is not installed; the format is otherwise checked by every VM boot")
	}
	var buf bytes.Buffer
	w := newCPIOWriter(&buf)
	w.Dir("roche", 0o755)
	w.File("roche/config.json", 0o600, []byte(`{"a":1}`))
	w.CharDev("console", 0o600, 5, 1)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(cpioBin, "-itv", "--quiet")
	cmd.Stdin = &buf
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	for _, want := range []string{"roche/config.json", "crw-------", "drwxr-xr-x"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("cpio -t output lacks %q:\n%s", want, out)
		}
	}
}

// TestRootfsBuildFailureLeavesNothing: when mkfs.ext4 fails (here a stand-in that writes
// half an image and exits 1), the error says so and nothing is left: no image, no
// extracted tree, no export container.
func TestRootfsBuildFailureLeavesNothing(t *testing.T) {
	cache := t.TempDir()
	fake := filepath.Join(t.TempDir(), "mkfs.ext4")
	script := "#!/bin/sh\nfor a in \"$@\"; do case \"$a\" in *.ext4) echo partial > \"$a\";; esac; done\necho 'mkfs.ext4: Could not allocate block in ext2 filesystem' >&2\nexit 1\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	p, err := NewQEMU(WithCacheDir(cache), func(o *options) { o.mkfs = fake })
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	_, err = p.rootfs(context.Background(), testenv.Image())
	if err == nil || !strings.Contains(err.Error(), "Could not allocate block") || !strings.Contains(err.Error(), "building the VM root filesystem") {
		t.Fatalf("rootfs with a failing mkfs: %v, want an error quoting it", err)
	}
	filepath.WalkDir(cache, func(path string, d os.DirEntry, err error) error {
		if err == nil && path != cache && path != filepath.Join(cache, "rootfs") {
			t.Errorf("left behind: %s", path)
		}
		return nil
	})
	cli, err := p.dockerClient()
	if err != nil {
		t.Fatal(err)
	}
	cs, err := cli.ContainerList(context.Background(), container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", "roche.rootfs-export="+filepath.Join(cache, "rootfs")))})
	if err != nil || len(cs) != 0 {
		t.Fatalf("export containers left: %d %v", len(cs), err)
	}
}

func TestFirecrackerConfigMapping(t *testing.T) {
	vm := &plan{
		meta:   meta{ID: "firecracker-0123456789ab", Dir: "/run/x", API: "/run/x/api.sock", Vsock: "/run/x/vsock.sock"},
		assets: &bootAssets{vmlinux: "/cache/vmlinux"}, rootfs: "/cache/root.ext4", initrd: "/run/x/initrd",
		vcpus: 2, memMiB: 768,
	}
	cfg := firecrackerConfig(vm, "roche.debug=1")
	if cfg.KernelImagePath != "/cache/vmlinux" || cfg.InitrdPath != "/run/x/initrd" || cfg.SocketPath != "/run/x/api.sock" {
		t.Errorf("boot source %+v", cfg)
	}
	if len(cfg.NetworkInterfaces) != 0 {
		t.Error("a VM with network off must have no interface at all")
	}
	if len(cfg.Drives) != 1 || !*cfg.Drives[0].IsReadOnly || *cfg.Drives[0].IsRootDevice || *cfg.Drives[0].PathOnHost != "/cache/root.ext4" {
		t.Errorf("drives %+v: want the root filesystem, read-only, mounted by the initramfs", cfg.Drives)
	}
	if *cfg.MachineCfg.VcpuCount != 2 || *cfg.MachineCfg.MemSizeMib != 768 || *cfg.MachineCfg.Smt {
		t.Errorf("machine %+v", cfg.MachineCfg)
	}
	if len(cfg.VsockDevices) != 1 || cfg.VsockDevices[0].Path != "/run/x/vsock.sock" || cfg.VsockDevices[0].CID != guestCID {
		t.Errorf("vsock %+v", cfg.VsockDevices)
	}
	if cfg.ForwardSignals == nil || len(cfg.ForwardSignals) != 0 {
		t.Error("signals must not be forwarded: the VM outlives the creating process")
	}
	for _, arg := range []string{"reboot=k", "console=ttyS0", "roche.debug=1"} {
		if !strings.Contains(cfg.KernelArgs, arg) {
			t.Errorf("kernel args %q lack %s", cfg.KernelArgs, arg)
		}
	}
}

// TestFirecrackerUnavailable: with no firecracker binary, the provider says so, and how
// to get one, before doing anything.
func TestFirecrackerUnavailable(t *testing.T) {
	state := t.TempDir()
	p, err := NewFirecracker(WithBinary("/no/such/firecracker"), WithStateDir(state))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, err := range []error{p.Available(), func() error { _, err := p.Create(context.Background(), roche.DefaultConfig()); return err }()} {
		if !errors.Is(err, roche.ErrUnavailable) || !strings.Contains(err.Error(), "firecracker") || !strings.Contains(err.Error(), "--provider qemu") {
			t.Errorf("%v, want ErrUnavailable saying where to get firecracker", err)
		}
	}
	if left, _ := os.ReadDir(state); len(left) > 0 {
		t.Errorf("left %v", left)
	}
}

func TestGuestConfigArchive(t *testing.T) {
	var buf bytes.Buffer
	if err := writeConfigArchive(&buf, vmlink.GuestConfig{User: "65534:65534", Transport: vmlink.TransportSerial}); err != nil {
		t.Fatal(err)
	}
	if buf.Len()%4 != 0 || !bytes.Contains(buf.Bytes(), []byte("TRAILER!!!")) || !bytes.Contains(buf.Bytes(), []byte(`"transport":"serial"`)) {
		t.Fatalf("archive %q", buf.Bytes())
	}
}
