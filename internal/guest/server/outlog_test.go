package server

import (
	"bytes"
	"errors"
	mathrand "math/rand/v2"
	"testing"

	"github.com/roche-sandbox/roche/internal/guest"
)

// TestOutputLog checks the log against a plain record of everything written: what it
// keeps is each stream's last window bytes, exactly; a read from any kept offsets
// returns each stream's rest, in the order written; an offset fallen out is CodeGone
// naming the first kept.
func TestOutputLog(t *testing.T) {
	rng := mathrand.New(mathrand.NewPCG(1, 2))
	for _, window := range []int64{1, 100, 5000, 200 << 10} {
		l := newOutputLog(window)
		var all [2][]byte
		type write struct {
			stream int
			data   []byte
		}
		var writes []write
		var kept int64
		for n := range 400 {
			i := rng.IntN(2)
			if n%7 == 6 {
				i = writes[len(writes)-1].stream // runs on one stream too
			}
			d := make([]byte, 1+rng.IntN(3000))
			for k := range d {
				d[k] = byte(rng.IntN(256))
			}
			kept += l.append(i, d)
			all[i] = append(all[i], d...)
			writes = append(writes, write{i, d})
			if kept != l.kept() {
				t.Fatalf("window %d: append reported %d kept, the log holds %d", window, kept, l.kept())
			}
		}
		for i := range 2 {
			st := l.s[i]
			if st.end != int64(len(all[i])) || st.end-st.first != min(window, st.end) {
				t.Fatalf("window %d stream %d: first %d end %d of %d written", window, i, st.first, st.end, len(all[i]))
			}
		}
		// From random kept offsets: each stream's rest, in write order.
		for range 50 {
			var pos [2]int64
			for i := range pos {
				st := l.s[i]
				pos[i] = st.first + rng.Int64N(st.end-st.first+1)
			}
			start := pos
			var got [2][]byte
			var order []int
			for {
				pieces, err := l.read(&pos, 1+rng.IntN(10000))
				if err != nil {
					t.Fatal(err)
				}
				if len(pieces) == 0 {
					break
				}
				for _, p := range pieces {
					got[p.stream] = append(got[p.stream], p.data...)
					if len(order) == 0 || order[len(order)-1] != p.stream {
						order = append(order, p.stream)
					}
				}
			}
			for i := range 2 {
				if !bytes.Equal(got[i], all[i][start[i]:]) {
					t.Fatalf("window %d: stream %d from %d: %d bytes, want %d", window, i, start[i], len(got[i]), len(all[i])-int(start[i]))
				}
			}
			// The order of runs is the order of the writes that made them.
			var want []int
			var off [2]int64
			for _, w := range writes {
				end := off[w.stream] + int64(len(w.data))
				if end > start[w.stream] && (len(want) == 0 || want[len(want)-1] != w.stream) {
					want = append(want, w.stream)
				}
				off[w.stream] = end
			}
			if len(order) != len(want) {
				t.Fatalf("window %d: runs %v, want %v", window, order, want)
			}
		}
		// Before the first kept byte: gone, naming it.
		if l.s[0].first > 0 {
			pos := [2]int64{l.s[0].first - 1, l.s[1].first}
			_, err := l.read(&pos, 10)
			var ge *guest.Error
			if !errors.As(err, &ge) || ge.Code != guest.CodeGone || ge.Kept.Stdout != l.s[0].first {
				t.Fatalf("window %d: read before the first kept: %v", window, err)
			}
		}
	}
}
