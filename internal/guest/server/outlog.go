package server

import (
	"fmt"
	"sort"

	"github.com/roche-sandbox/roche/internal/guest"
)

// segMax bounds one segment of a stream's log: the unit in which a replay finds its
// starting point and sends its frames (guest.MaxChunk, the largest a frame carries).
const segMax = guest.MaxChunk

// segment is a run of one stream's output, written with nothing on the other stream in
// between; seq orders segments across the two streams, so a replay interleaves them as
// they were written.
type segment struct {
	seq  uint64
	off  int64 // the stream offset of data[0]
	data []byte
}

// streamLog is one stream's kept output: segs[head:], from offset first to end.
type streamLog struct {
	segs  []segment
	head  int
	first int64
	end   int64
}

// outputLog keeps a durable command's output, each stream in a window of its last
// window bytes, addressed by absolute byte offsets (counted from the command's start,
// never reset). Writers append; readers follow by offsets and never block a writer.
// It is not safe for concurrent use: its command's mutex guards it. A byte, once
// appended, is never changed, so a reader may use the slices read returns after
// letting go of that mutex.
type outputLog struct {
	window int64
	seq    uint64
	last   int // the stream of the newest segment, -1 before any
	s      [2]streamLog
}

func newOutputLog(window int64) *outputLog { return &outputLog{window: window, last: -1} }

// streamIndex is the log's index of an output frame kind.
func streamIndex(kind byte) int {
	if kind == guest.FrameStderr {
		return 1
	}
	return 0
}

var streamNames = [2]string{"stdout", "stderr"}

// append adds data to stream i and drops what falls out of the window; it returns the
// change in bytes kept.
func (l *outputLog) append(i int, data []byte) int64 {
	if len(data) == 0 {
		return 0
	}
	st := &l.s[i]
	if l.last == i && len(st.segs) > st.head {
		// Nothing on the other stream since: the newest segment goes on.
		if seg := &st.segs[len(st.segs)-1]; len(seg.data)+len(data) <= segMax {
			seg.data = append(seg.data, data...)
			st.end += int64(len(data))
			return int64(len(data)) - l.trim(i, l.window)
		}
	}
	l.seq++
	st.segs = append(st.segs, segment{seq: l.seq, off: st.end, data: append([]byte(nil), data...)})
	l.last = i
	st.end += int64(len(data))
	return int64(len(data)) - l.trim(i, l.window)
}

// trim drops stream i's oldest output until it keeps at most keep bytes, and returns
// how many bytes it dropped.
func (l *outputLog) trim(i int, keep int64) int64 {
	st := &l.s[i]
	var dropped int64
	for over := st.end - st.first - keep; over > 0; over = st.end - st.first - keep {
		seg := &st.segs[st.head]
		if n := int64(len(seg.data)); n <= over {
			dropped += n
			st.first += n
			st.segs[st.head] = segment{}
			st.head++
			continue
		}
		seg.data = seg.data[over:]
		seg.off += over
		st.first += over
		dropped += over
	}
	if st.head > 16 && st.head*2 > len(st.segs) {
		n := copy(st.segs, st.segs[st.head:])
		clear(st.segs[n:])
		st.segs = st.segs[:n]
		st.head = 0
	}
	return dropped
}

// kept is how many bytes the log holds.
func (l *outputLog) kept() int64 {
	return l.s[0].end - l.s[0].first + l.s[1].end - l.s[1].first
}

// first and end are the offsets of each stream's first byte kept and of its next byte.
func (l *outputLog) first() guest.Offsets {
	return guest.Offsets{Stdout: l.s[0].first, Stderr: l.s[1].first}
}

func (l *outputLog) end() guest.Offsets {
	return guest.Offsets{Stdout: l.s[0].end, Stderr: l.s[1].end}
}

// resolve turns a requested start into offsets in the streams: nil is the first byte
// kept, a negative offset the stream's current end. An offset before the first byte
// kept is CodeGone, one past the end invalid.
func (l *outputLog) resolve(from *guest.Offsets) ([2]int64, error) {
	if from == nil {
		return [2]int64{l.s[0].first, l.s[1].first}, nil
	}
	pos := [2]int64{from.Stdout, from.Stderr}
	for i := range pos {
		if pos[i] < 0 {
			pos[i] = l.s[i].end
		}
		if pos[i] > l.s[i].end {
			return pos, invalid("%s offset %d is past the end of the command's %s, %d bytes so far",
				streamNames[i], pos[i], streamNames[i], l.s[i].end)
		}
	}
	return pos, l.check(pos)
}

// check refuses positions that fell out of the window.
func (l *outputLog) check(pos [2]int64) error {
	for i := range pos {
		if pos[i] < l.s[i].first {
			kept := l.first()
			return &guest.Error{Code: guest.CodeGone, Kept: &kept, Message: fmt.Sprintf(
				"%s offset %d fell out of the command's window: the first %s byte still kept is at offset %d (stdout from %d, stderr from %d; it keeps the last %s of each stream)",
				streamNames[i], pos[i], streamNames[i], l.s[i].first, kept.Stdout, kept.Stderr, mib(l.window))}
		}
	}
	return nil
}

// piece is output read from the log.
type piece struct {
	stream int
	data   []byte
}

// read returns up to max bytes that follow pos, in the order they were written across
// both streams, and advances pos past them. Positions that fell out of the window are
// CodeGone.
func (l *outputLog) read(pos *[2]int64, max int) ([]piece, error) {
	if err := l.check(*pos); err != nil {
		return nil, err
	}
	var idx [2]int
	for i := range idx {
		idx[i] = l.s[i].find(pos[i])
	}
	var out []piece
	for n := 0; n < max; {
		best := -1
		for i := range idx {
			if idx[i] < len(l.s[i].segs) && (best < 0 || l.s[i].segs[idx[i]].seq < l.s[best].segs[idx[best]].seq) {
				best = i
			}
		}
		if best < 0 {
			break
		}
		seg := l.s[best].segs[idx[best]]
		d := seg.data[pos[best]-seg.off:]
		if len(d) > max-n {
			d = d[:max-n]
		}
		out = append(out, piece{best, d})
		n += len(d)
		pos[best] += int64(len(d))
		if pos[best] == seg.off+int64(len(seg.data)) {
			idx[best]++
		}
	}
	return out, nil
}

// find is the index of the segment holding offset off, or len(segs) at the end.
func (st *streamLog) find(off int64) int {
	segs := st.segs[st.head:]
	i := sort.Search(len(segs), func(i int) bool { return segs[i].off+int64(len(segs[i].data)) > off })
	return st.head + i
}

// mib words a byte count for messages: "16 MiB", or bytes below one.
func mib(n int64) string {
	if n >= 1<<20 && n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	if n >= 1<<10 && n%(1<<10) == 0 {
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}
