//go:build linux

package vm

import (
	"bytes"
	"testing"

	"github.com/roche-sandbox/roche/internal/fuzztar"
)

// FuzzExtractRootfs unpacks any exported root filesystem into a directory and checks
// that nothing outside it was written, made, re-linked or hard-linked, through a link
// the stream planted or by name. Devices, fifos and links anywhere are what a root
// filesystem holds (the guest mounts it nodev); made as root they are kept, otherwise
// the extraction fails on the first.
func FuzzExtractRootfs(f *testing.F) {
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
		_, _ = extractRootfs(bytes.NewReader(archive), l.Dst)
		l.Check(t)
		l.Walk(t)
	})
}
