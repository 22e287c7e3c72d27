package wasm

import (
	"bytes"
	"context"
	"os"
	"testing"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// section is one section of a module: id, then its size as LEB128, then content.
func stripSection(id byte, content []byte) []byte {
	size := []byte{}
	n := uint32(len(content))
	for {
		c := byte(n & 0x7f)
		n >>= 7
		if n != 0 {
			size = append(size, c|0x80)
			continue
		}
		size = append(size, c)
		break
	}
	return append(append([]byte{id}, size...), content...)
}

var stripHeader = []byte{0, 'a', 's', 'm', 1, 0, 0, 0}

func stripModule(sections ...[]byte) []byte {
	return append(append([]byte{}, stripHeader...), bytes.Join(sections, nil)...)
}

// TestWithoutTrailingCustomSections: the custom sections after the last other one go
// (python.wasm's DWARF), those before it stay, and what does not parse is left whole.
func TestWithoutTrailingCustomSections(t *testing.T) {
	typ := stripSection(1, []byte{1, 0x60, 0, 0})
	code := stripSection(10, bytes.Repeat([]byte{0x0b}, 200)) // a size of two LEB128 bytes
	custom := func(name string, n int) []byte {
		return stripSection(0, append(append([]byte{byte(len(name))}, name...), make([]byte, n)...))
	}
	for _, c := range []struct {
		name    string
		in, out []byte
	}{
		{"trailing DWARF", stripModule(typ, code, custom(".debug_info", 300), custom(".debug_str", 5)), stripModule(typ, code)},
		{"a custom section between others stays", stripModule(typ, custom("name", 3), code, custom("producers", 4)), stripModule(typ, custom("name", 3), code)},
		{"nothing to cut", stripModule(typ, code), stripModule(typ, code)},
		{"only custom sections", stripModule(custom("x", 1)), stripHeader},
		{"the stripHeader alone", stripHeader, stripHeader},
		{"shorter than a stripHeader", stripHeader[:5], stripHeader[:5]},
		{"a section past the end", append(stripModule(typ), 10, 50, 1), append(stripModule(typ), 10, 50, 1)},
		{"a size that never ends", append(stripModule(typ), 0, 0x80, 0x80), append(stripModule(typ), 0, 0x80, 0x80)},
		{"a size over 32 bits", append(stripModule(typ), 0, 0xff, 0xff, 0xff, 0xff, 0x7f), append(stripModule(typ), 0, 0xff, 0xff, 0xff, 0xff, 0x7f)},
	} {
		if got := withoutTrailingCustomSections(c.in); !bytes.Equal(got, c.out) {
			t.Errorf("%s: got % x, want % x", c.name, got, c.out)
		}
	}
}

// FuzzWithoutTrailingCustomSections: any bytes, no panic, and the result is a prefix of
// the input that keeps at least the stripHeader.
func FuzzWithoutTrailingCustomSections(f *testing.F) {
	f.Add(stripModule(stripSection(1, []byte{1, 0x60, 0, 0}), stripSection(0, []byte{1, 'x', 9})))
	f.Add(stripHeader)
	f.Add(append(stripModule(), 0, 0xff, 0xff, 0xff, 0xff, 0x0f))
	f.Fuzz(func(t *testing.T, in []byte) {
		out := withoutTrailingCustomSections(in)
		if !bytes.HasPrefix(in, out) || (len(in) >= len(stripHeader) && len(out) < len(stripHeader)) {
			t.Fatalf("% x cut to % x", in, out)
		}
	})
}

// TestPythonWithoutDWARF: python.wasm is read and compiled without its trailing DWARF
// (some half of its bytes), whether its digest is hashed or was recorded, and what is
// compiled is the same program: a sandbox made from it runs Python.
func TestPythonWithoutDWARF(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	src, _ := tp.PythonPath()
	fi, err := os.Stat(src)
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(WithCacheDir(t.TempDir()), WithStateDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, how := range []string{"hashed", "recorded"} {
		bin, err := p.readPython(src, true)
		if err != nil {
			t.Fatalf("%s: %v", how, err)
		}
		if int64(len(bin)) >= fi.Size()*3/4 || len(bin) < moduleHeaderSize {
			t.Errorf("%s: read %d of python.wasm's %d bytes, want it without its DWARF", how, len(bin), fi.Size())
		}
	}
	// The tests' shared provider compiled it so (pythonModule).
	ctx := context.Background()
	info, err := tp.Create(ctx, roche.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Destroy(ctx, info.ID)
	res, err := tp.Exec(ctx, info.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", "print(6 * 7)"}})
	if err != nil || res.ExitCode != 0 || res.Stdout != "42\n" {
		t.Fatalf("python.wasm without its DWARF: %+v %v", res, err)
	}
}
