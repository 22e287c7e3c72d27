package statedir

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"
)

// TestMappingKeep: Keep releases the whole pages of a mapping outside a piece of it, and
// only those; Unmap then releases the rest, once. What is mapped of the file is read
// from /proc/self/maps, which, unlike probing the addresses, is not fooled by another
// mapping reusing them.
func TestMappingKeep(t *testing.T) {
	page := os.Getpagesize()
	file := filepath.Join(t.TempDir(), "mapped")
	want := bytes.Repeat([]byte("0123456789abcdef"), (4*page+page/2)/16)
	if err := WritePrivate(file, want); err != nil {
		t.Fatal(err)
	}
	m, mapping, err := MapPrivate(file, int64(len(want)))
	if err != nil {
		t.Fatal(err)
	}
	defer mapping.Unmap()
	base := uintptr(unsafe.Pointer(unsafe.SliceData(m)))
	pages := func(from, to int) string {
		if from == to {
			return ""
		}
		return fmt.Sprintf("%x-%x", base+uintptr(from*page), base+uintptr(to*page))
	}
	if got := mappedOf(t, file); got != pages(0, 5) {
		t.Fatalf("mapped %q, want %q", got, pages(0, 5))
	}
	mapping.Keep(m[page+page/2 : 2*page+page/2])
	if got := mappedOf(t, file); got != pages(1, 3) {
		t.Errorf("after Keep: mapped %q, want %q", got, pages(1, 3))
	}
	if !bytes.Equal(m[page:3*page], want[page:3*page]) {
		t.Error("the pages kept changed")
	}
	mapping.Keep(m[2*page : 2*page+1])
	if got := mappedOf(t, file); got != pages(2, 3) {
		t.Errorf("after a second Keep: mapped %q, want %q", got, pages(2, 3))
	}
	mapping.Unmap()
	mapping.Unmap()
	if got := mappedOf(t, file); got != "" {
		t.Errorf("after Unmap: mapped %q", got)
	}
}

// mappedOf returns the address ranges this process maps of file, as /proc/self/maps
// lists them.
func mappedOf(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	var ranges []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 6 && f[5] == file {
			ranges = append(ranges, f[0])
		}
	}
	return strings.Join(ranges, " ")
}
