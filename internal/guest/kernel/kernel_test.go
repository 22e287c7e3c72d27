package kernel

import (
	"strings"
	"testing"
)

func TestMarksSplitAcrossChunks(t *testing.T) {
	stream := "hello\x1eroche:sync:7\x1eafter\x1enot a mark\x1eroche:sync:x\x1e"
	for size := 1; size <= len(stream); size++ {
		var m Marks
		var out strings.Builder
		var cells []int
		for i := 0; i < len(stream); i += size {
			o, c := m.Feed([]byte(stream[i:min(i+size, len(stream))]))
			out.Write(o)
			cells = append(cells, c...)
		}
		out.Write(m.Flush())
		if want := "helloafter\x1enot a mark\x1eroche:sync:x\x1e"; out.String() != want {
			t.Fatalf("chunks of %d: output %q, want %q", size, out.String(), want)
		}
		if len(cells) != 1 || cells[0] != 7 {
			t.Fatalf("chunks of %d: cells %v, want [7]", size, cells)
		}
	}
}

func TestArgv(t *testing.T) {
	a := Argv("python3")
	if a[0] != "python3" || a[len(a)-1] != "--fds" || len(a[3]) > 100 || !strings.Contains(Source, "def main()") {
		t.Fatalf("Argv = %q...", a[:3])
	}
}
