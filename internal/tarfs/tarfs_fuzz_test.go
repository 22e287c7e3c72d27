//go:build unix

package tarfs

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"path"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche/internal/fuzztar"
)

// fuzzCap is a fuzz input's copy cap. Never none: without a cap a sparse entry may
// claim terabytes of zeros, which the reader makes up and the extractor then reads, all
// of it, at memory speed; every caller on the host passes one (roche.CopyOptions.Limit,
// roched's --copy-max-bytes).
func fuzzCap(n uint16) int64 {
	if n == 0 {
		return 1 << 20
	}
	return int64(n)
}

// FuzzExtract extracts any archive with any link policy and cap, and checks what it did:
// nothing outside the destination written, linked or made; no device, fifo or hard link
// made; symlinks only as the policy allows, and under InsideLinks each resolving inside
// on this host; no more file content than the cap; and a failed copy takes back the
// destination it made.
func FuzzExtract(f *testing.F) {
	for i, s := range fuzztar.Seeds {
		f.Add(false, uint8(i%4), uint16(0), []byte(s))
		f.Add(false, uint8(InsideLinks), uint16(256), []byte(s))
	}
	for _, raw := range fuzztar.RawSeeds() {
		f.Add(true, uint8(AllLinks), uint16(0), raw)
	}
	f.Fuzz(func(t *testing.T, raw bool, policy uint8, maxBytes uint16, data []byte) {
		l := fuzztar.NewLayout(t, false)
		archive := data
		if !raw {
			archive = fuzztar.Build(data, l.Outside)
		}
		opts := Options{Links: LinkPolicy(policy % 4), MaxBytes: fuzzCap(maxBytes)}
		rep, err := Extract(bytes.NewReader(archive), l.Dst, opts)
		l.Check(t)
		made := l.Walk(t)
		if err != nil {
			if len(made) > 0 {
				t.Fatalf("a failed extraction (%v) left its destination behind: %+v", err, made)
			}
			return
		}
		if opts.MaxBytes > 0 && rep.Bytes > opts.MaxBytes {
			t.Errorf("extracted %d bytes, over the cap of %d", rep.Bytes, opts.MaxBytes)
		}
		var onDisk int64
		for _, m := range made {
			switch {
			case fuzztar.Special(m.Mode):
				t.Errorf("%s is a special file (%v)", m.Rel, m.Mode)
			case m.Mode.IsRegular():
				onDisk += m.Size
			case m.Mode.IsDir():
			default: // a symlink
				switch opts.Links {
				case SkipLinks, RefuseLinks:
					t.Errorf("%s is a symlink (to %q), under a policy that makes none", m.Rel, m.Link)
				case InsideLinks:
					if !l.LinkStaysInside(m.Rel, m.Link) {
						t.Errorf("%s is a symlink to %q, which resolves outside the destination", m.Rel, m.Link)
					}
				}
			}
		}
		if opts.MaxBytes > 0 && onDisk > opts.MaxBytes {
			t.Errorf("%d bytes of files on disk, over the cap of %d", onDisk, opts.MaxBytes)
		}
	})
}

// FuzzFilter relays any archive and reads back what came out: one root (renamed as
// asked), no name that climbs or is absolute, only files, directories and the symlinks
// the policy allows, no more content than the cap; and filtering the output again
// changes nothing.
func FuzzFilter(f *testing.F) {
	for i, s := range fuzztar.Seeds {
		f.Add(false, uint8(i%4), uint16(0), i%2 == 0, []byte(s))
		f.Add(false, uint8(InsideLinks), uint16(256), false, []byte(s))
	}
	for _, raw := range fuzztar.RawSeeds() {
		f.Add(true, uint8(InsideLinks), uint16(0), true, raw)
	}
	f.Fuzz(func(t *testing.T, raw bool, policy uint8, maxBytes uint16, rename bool, data []byte) {
		archive := data
		if !raw {
			archive = fuzztar.Build(data, "/outside")
		}
		opts := Options{Links: LinkPolicy(policy % 4), MaxBytes: fuzzCap(maxBytes)}
		root := ""
		if rename {
			root = "renamed"
		}
		var out bytes.Buffer
		rep, err := Filter(bytes.NewReader(archive), &out, root, opts)
		if err != nil {
			return
		}
		tr := tar.NewReader(bytes.NewReader(out.Bytes()))
		first := ""
		var total int64
		links := map[string]string{} // below the root: what a later entry may go through
		type link struct {
			dir    []string
			name   string
			target string
		}
		var made []link
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("the filtered stream does not read back: %v", err)
			}
			name := strings.TrimSuffix(h.Name, "/")
			if path.IsAbs(name) || path.Clean(name) != name || name == ".." || strings.HasPrefix(name, "../") {
				t.Errorf("filtered entry %q is not a clean relative name", h.Name)
			}
			top, rest, _ := strings.Cut(name, "/")
			if first == "" {
				first = top
				if root != "" && top != root {
					t.Errorf("the root is %q, asked for %q", top, root)
				}
			} else if top != first {
				t.Errorf("filtered entry %q is outside the root %q", h.Name, first)
			}
			switch h.Typeflag {
			case tar.TypeReg:
				total += h.Size
			case tar.TypeDir:
			case tar.TypeSymlink:
				switch opts.Links {
				case SkipLinks, RefuseLinks:
					t.Errorf("symlink %q passed under a policy that passes none", h.Name)
				case InsideLinks:
					if rest == "" {
						t.Errorf("the root %q passed as a symlink (to %q)", h.Name, h.Linkname)
						break
					}
					parts := strings.Split(rest, "/")
					links[rest] = h.Linkname
					made = append(made, link{parts[:len(parts)-1], h.Name, h.Linkname})
				}
			default:
				t.Errorf("entry %q of type %q passed", h.Name, h.Typeflag)
			}
		}
		// Each link checked against every link of the stream, as they stand once it is
		// extracted (a later entry of the same name replaces an earlier one).
		for _, l := range made {
			inside := fuzztar.StaysInside(l.dir, l.target, func(p []string) (string, bool) {
				to, ok := links[strings.Join(p, "/")]
				return to, ok
			})
			if !inside {
				t.Errorf("symlink %q to %q passed, and resolves outside the root", l.name, l.target)
			}
		}
		if opts.MaxBytes > 0 && total > opts.MaxBytes {
			t.Errorf("%d bytes passed, over the cap of %d", total, opts.MaxBytes)
		}
		if total != rep.Bytes {
			t.Errorf("the report says %d bytes, the stream holds %d", rep.Bytes, total)
		}
		var again bytes.Buffer
		_, err = Filter(bytes.NewReader(out.Bytes()), &again, root, opts)
		if first == "" {
			// Every entry was left out: the output holds none, which the reader at the
			// other end tells apart by the report (client.Provider.CopyOut).
			if !errors.Is(err, ErrEmpty) || rep.Skipped == 0 {
				t.Fatalf("an output without entries, %d skipped; filtered again: %v", rep.Skipped, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("filtering the filtered stream failed: %v", err)
		}
		if !bytes.Equal(again.Bytes(), out.Bytes()) {
			t.Errorf("filtering the filtered stream changed it")
		}
	})
}
