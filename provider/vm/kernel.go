package vm

import (
	"bytes"
	"compress/gzip"
	"context"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/roche-sandbox/roche"
)

// kernelHint says how to get a guest kernel, for error messages.
const kernelHint = "install Debian's kernel (apt-get install linux-image-amd64), or point ROCHE_VM_KERNEL at a bzImage or vmlinux"

// findKernel returns the guest kernel to boot: the explicit path, else $ROCHE_VM_KERNEL,
// else the newest /boot/vmlinuz-* whose modules are installed.
func findKernel(explicit string) (string, error) {
	if explicit == "" {
		explicit = os.Getenv("ROCHE_VM_KERNEL")
	}
	if explicit != "" {
		if _, err := os.Stat(explicit); err != nil {
			return "", fmt.Errorf("%w: guest kernel %s: %v: %s", roche.ErrUnavailable, explicit, err, kernelHint)
		}
		return explicit, nil
	}
	matches, _ := filepath.Glob("/boot/vmlinuz-*")
	sort.Slice(matches, func(i, j int) bool { return versionLess(matches[j], matches[i]) })
	for _, m := range matches {
		ver := strings.TrimPrefix(filepath.Base(m), "vmlinuz-")
		if _, err := os.Stat(filepath.Join("/lib/modules", ver, "modules.dep")); err == nil {
			return m, nil
		}
	}
	return "", fmt.Errorf("%w: no guest kernel in /boot with its modules in /lib/modules: %s", roche.ErrUnavailable, kernelHint)
}

// versionLess compares version strings number by number ("6.1.10" > "6.1.9").
func versionLess(a, b string) bool {
	split := func(s string) []string {
		var parts []string
		cur := ""
		digit := false
		for i, r := range s {
			d := r >= '0' && r <= '9'
			if i > 0 && d != digit {
				parts = append(parts, cur)
				cur = ""
			}
			cur += string(r)
			digit = d
		}
		return append(parts, cur)
	}
	pa, pb := split(a), split(b)
	for i := 0; i < len(pa) && i < len(pb); i++ {
		if pa[i] == pb[i] {
			continue
		}
		na, ea := strconv.Atoi(pa[i])
		nb, eb := strconv.Atoi(pb[i])
		if ea == nil && eb == nil {
			return na < nb
		}
		return pa[i] < pb[i]
	}
	return len(pa) < len(pb)
}

// kernelVersion reads the release ("6.1.0-56-amd64") from a bzImage's header, or from
// the banner inside a vmlinux.
func kernelVersion(img []byte) (string, error) {
	if isBzImage(img) {
		off := int(binary.LittleEndian.Uint16(img[0x20e:])) + 0x200
		if off < len(img) {
			s := img[off:]
			if i := bytes.IndexByte(s, 0); i >= 0 {
				if f := strings.Fields(string(s[:i])); len(f) > 0 {
					return f[0], nil
				}
			}
		}
	}
	if i := bytes.Index(img, []byte("Linux version ")); i >= 0 {
		rest := img[i+len("Linux version "):]
		if f := strings.Fields(string(rest[:min(len(rest), 128)])); len(f) > 0 {
			return f[0], nil
		}
	}
	return "", errors.New("no kernel version found in the image")
}

func isBzImage(img []byte) bool {
	return len(img) > 0x250 && string(img[0x202:0x206]) == "HdrS"
}

// compression formats a kernel payload may use, by magic number, with the tool that
// decompresses it (gzip is done in process).
var compressions = []struct {
	name  string
	magic []byte
	tool  []string
}{
	{"gzip", []byte{0x1f, 0x8b, 0x08}, nil},
	{"xz", []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}, []string{"xz", "-dc"}},
	{"zstd", []byte{0x28, 0xb5, 0x2f, 0xfd}, []string{"zstd", "-dc"}},
	{"lzma", []byte{0x5d, 0x00, 0x00, 0x00}, []string{"xz", "--format=lzma", "-dc"}},
	{"bzip2", []byte("BZh"), []string{"bzip2", "-dc"}},
	{"lz4", []byte{0x02, 0x21, 0x4c, 0x18}, []string{"lz4", "-dc"}},
	{"lzo", []byte{0x89, 'L', 'Z', 'O'}, []string{"lzop", "-dc"}},
}

// extractVmlinux returns the uncompressed ELF kernel inside img, as the kernel's
// scripts/extract-vmlinux does: Firecracker boots only an ELF vmlinux, and QEMU boots
// one faster (PVH entry, no decompression, which is slow under emulation). A bzImage's
// header says where its payload is; otherwise every compression magic in the file is
// tried in turn.
func extractVmlinux(ctx context.Context, img []byte) ([]byte, error) {
	if isELF(img) {
		return img, nil
	}
	if isBzImage(img) && binary.LittleEndian.Uint16(img[0x206:]) >= 0x208 {
		setup := int(img[0x1f1])
		if setup == 0 {
			setup = 4
		}
		start := (setup+1)*512 + int(binary.LittleEndian.Uint32(img[0x248:]))
		end := start + int(binary.LittleEndian.Uint32(img[0x24c:]))
		if start < end && end <= len(img) {
			if out, err := decompress(ctx, img[start:end]); err == nil {
				return out, nil
			}
		}
	}
	var tried []string
	for _, c := range compressions {
		for off := 0; ; {
			i := bytes.Index(img[off:], c.magic)
			if i < 0 {
				break
			}
			out, err := decompress(ctx, img[off+i:])
			if err == nil {
				return out, nil
			}
			tried = append(tried, fmt.Sprintf("%s at %d: %v", c.name, off+i, err))
			off += i + 1
		}
	}
	if len(tried) == 0 {
		return nil, errors.New("no compressed kernel found: the file is neither a bzImage nor a vmlinux")
	}
	return nil, fmt.Errorf("no compressed payload gave an ELF kernel (%s)", strings.Join(tried[:min(len(tried), 3)], "; "))
}

// decompress decompresses a payload whose format its magic gives. Trailing bytes after
// the stream are tolerated (a scanned payload runs to the end of the file): the output
// counts when it is an x86-64 ELF, whatever the tool said.
func decompress(ctx context.Context, payload []byte) ([]byte, error) {
	for _, c := range compressions {
		if !bytes.HasPrefix(payload, c.magic) {
			continue
		}
		var out []byte
		var err error
		if c.tool == nil {
			var zr *gzip.Reader
			if zr, err = gzip.NewReader(bytes.NewReader(payload)); err == nil {
				zr.Multistream(false)
				out, err = io.ReadAll(zr)
			}
		} else {
			if _, lerr := exec.LookPath(c.tool[0]); lerr != nil {
				return nil, fmt.Errorf("the kernel is %s-compressed and %s is not installed (apt-get install %s)", c.name, c.tool[0], toolPackage(c.tool[0]))
			}
			cmd := exec.CommandContext(ctx, c.tool[0], c.tool[1:]...)
			cmd.Stdin = bytes.NewReader(payload)
			var buf bytes.Buffer
			cmd.Stdout = &buf
			err = cmd.Run()
			out = buf.Bytes()
		}
		if isELF(out) {
			return out, nil
		}
		if err == nil {
			err = errors.New("the output is not an ELF kernel")
		}
		return nil, err
	}
	return nil, errors.New("unknown compression")
}

func toolPackage(tool string) string {
	switch tool {
	case "xz":
		return "xz-utils"
	}
	return tool
}

func isELF(b []byte) bool {
	if len(b) < 64 || !bytes.HasPrefix(b, []byte(elf.ELFMAG)) {
		return false
	}
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return false
	}
	return f.Machine == elf.EM_X86_64
}
