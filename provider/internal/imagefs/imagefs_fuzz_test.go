//go:build linux

package imagefs

import (
	"bytes"
	"testing"

	"github.com/roche-sandbox/roche/internal/fuzztar"
)

// FuzzUnpackContainer unpacks any image filesystem stream into a directory, as the oci
// provider does, and checks that nothing outside it was written, made, re-linked or
// hard-linked, through a link the stream planted or by name, and that no device or fifo
// was made (the runtime gives a sandbox its /dev). Links may point anywhere: they are
// resolved inside the sandbox.
func FuzzUnpackContainer(f *testing.F) {
	for _, s := range fuzztar.Seeds {
		f.Add(false, []byte(s))
	}
	for _, raw := range fuzztar.RawSeeds() {
		f.Add(true, raw)
	}
	// An image's own shapes: absolute names, a hard link to an absolute path inside the
	// image, a link to the root, a later layer's file below a link.
	f.Add(false, []byte(fuzztar.Line(fuzztar.KindDir, "/usr/bin", "")+
		fuzztar.Line(fuzztar.KindReg, "/usr/bin/python3", "ELF")+
		fuzztar.Line(fuzztar.KindHardlink, "/usr/bin/python", "/usr/bin/python3")+
		fuzztar.Line(fuzztar.KindSymlink, "/bin", "usr/bin")+
		fuzztar.Line(fuzztar.KindSymlink, "/lib", "/")+
		fuzztar.Line(fuzztar.KindReg, "/bin/sh", "through a relative link")+
		fuzztar.Line(fuzztar.KindReg, "/lib/etc/passwd", "through a link to the root")+
		fuzztar.Line(fuzztar.KindSymlink, "/out", "../outside")+
		fuzztar.Line(fuzztar.KindReg, "/out/victim", "through a link out")+
		fuzztar.Line(fuzztar.KindHardlink, "/h", "../outside/victim")+
		fuzztar.Line(fuzztar.KindHardlink, "/bin/h", "/out/victim")))
	f.Fuzz(func(t *testing.T, raw bool, data []byte) {
		l := fuzztar.NewLayout(t, true)
		archive := data
		if !raw {
			archive = fuzztar.Build(data, l.Outside)
		}
		_, _ = Unpack(bytes.NewReader(archive), l.Dst, false)
		l.Check(t)
		for _, m := range l.Walk(t) {
			if fuzztar.Special(m.Mode) {
				t.Errorf("%s is a special file (%v)", m.Rel, m.Mode)
			}
		}
	})
}

// FuzzUnpackVM unpacks any exported root filesystem into a directory, as the microVM
// providers do, and checks that nothing outside it was written, made, re-linked or
// hard-linked, through a link the stream planted or by name. Devices, fifos and links
// anywhere are what a root filesystem holds (the guest mounts it nodev); made as root
// they are kept, otherwise the extraction fails on the first.
func FuzzUnpackVM(f *testing.F) {
	for _, s := range fuzztar.Seeds {
		f.Add(false, []byte(s))
	}
	for _, raw := range fuzztar.RawSeeds() {
		f.Add(true, raw)
	}
	f.Add(false, []byte(fuzztar.Line(fuzztar.KindDir, "./", "")+
		fuzztar.Line(fuzztar.KindDir, "usr/bin", "")+
		fuzztar.Line(fuzztar.KindReg, "usr/bin/python3", "ELF")+
		fuzztar.Line(fuzztar.KindHardlink, "usr/bin/python", "usr/bin/python3")+
		fuzztar.Line(fuzztar.KindSymlink, "bin", "usr/bin")+
		fuzztar.Line(fuzztar.KindReg, "bin/sh", "below a link: refused")+
		fuzztar.Line(fuzztar.KindSymlink, "out", fuzztar.OutsideToken)+
		fuzztar.Line(fuzztar.KindHardlink, "h", "out/victim")+
		fuzztar.Line(fuzztar.KindHardlink, "h2", fuzztar.OutsideToken+"/victim")+
		fuzztar.Line(fuzztar.KindDir, "out", "")))
	f.Fuzz(func(t *testing.T, raw bool, data []byte) {
		l := fuzztar.NewLayout(t, true)
		archive := data
		if !raw {
			archive = fuzztar.Build(data, l.Outside)
		}
		_, _ = Unpack(bytes.NewReader(archive), l.Dst, true)
		l.Check(t)
		l.Walk(t)
	})
}
