package guest

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"
)

// frames concatenates frames as WriteFrame writes them.
func frames(fs ...any) []byte {
	var b bytes.Buffer
	for i := 0; i+1 < len(fs); i += 2 {
		kind := fs[i].(byte)
		switch p := fs[i+1].(type) {
		case string:
			_ = WriteFrame(&b, kind, []byte(p))
		default:
			_ = WriteJSON(&b, kind, p)
		}
	}
	return b.Bytes()
}

// header is a frame header alone, claiming n bytes of payload.
func header(kind byte, n uint32) []byte {
	h := []byte{kind, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(h[1:], n)
	return h
}

// agentSeeds are what an agent sends back: the answers of every operation, errors, and
// the broken and hostile shapes (a frame past the limit, a short frame, garbage JSON).
var agentSeeds = [][]byte{
	frames(byte(FrameStarted), Started{PID: 7}, byte(FrameStdout), "out\n", byte(FrameStderr), "err\n",
		byte(FrameResult), Result{PID: 7, ExitCode: 3, DurationNS: 1e6}),
	frames(byte(FrameResult), Result{TimedOut: true, Truncated: true, OOMKilled: true}),
	frames(byte(FrameError), Error{Code: CodeNotFound, Message: "no such file"}),
	frames(byte(FrameError), "{not json"),
	frames(byte(FrameStdout), "partial"),
	frames(byte(FrameData), "file ", byte(FrameData), "content", byte(FrameDataEOF), ""),
	frames(byte(FrameReply), []FileInfo{{Name: "a", Path: "/a", Size: 1, Mode: 0o644}, {Name: "d", IsDir: true, Symlink: "x"}}),
	frames(byte(FrameReply), FileInfo{Name: "a", Path: "/a"}),
	frames(byte(FrameReply), Health{PID: 1, RSSBytes: 1 << 20, Version: "v", Procs: 2}),
	frames(byte(FrameReply), []Process{{PID: 3, Cmd: []string{"sleep", "1"}, Running: true}}),
	frames(byte(FrameReply), "null"),
	frames(byte(FrameStdout), "x", byte(FrameCodeResult), CodeResult{Data: map[string]string{"text/plain": "1"}, Main: true},
		byte(FrameCodeEnd), CodeEnd{Context: "c", ExecutionCount: 1, Error: &CodeError{Name: "E", Value: "v", Traceback: "t"}}),
	frames(byte(FrameCodeResult), "[]"),
	frames(byte(FrameStderr), "python3: not found", byte(FrameResult), Result{ExitCode: 127}),
	frames(byte('?'), "unknown kind"),
	append(header(FrameStdout, maxFramePayload+1), "over the limit"...),
	append(header(FrameStdout, 1<<20), "short"...),
	header(FrameResult, 0),
	{FrameStdout, 0, 0},
	{},
}

// FuzzReadFrame reads frames from any bytes: every frame read is within the limit,
// writes back to exactly the bytes it was read from, and costs no buffer larger than
// itself (a header claiming more than the limit costs nothing).
func FuzzReadFrame(f *testing.F) {
	for _, s := range agentSeeds {
		f.Add(s, uint16(0))
		f.Add(s, uint16(16))
	}
	f.Fuzz(func(t *testing.T, data []byte, bufCap uint16) {
		buf := make([]byte, 0, bufCap)
		rest := data
		for {
			r := bytes.NewReader(rest)
			kind, p, err := ReadFrame(r, buf)
			if err != nil {
				if len(rest) >= 5 && binary.BigEndian.Uint32(rest[1:5]) <= maxFramePayload && len(rest)-5 >= int(binary.BigEndian.Uint32(rest[1:5])) {
					t.Fatalf("a whole frame was refused: %v", err)
				}
				return
			}
			if len(p) > maxFramePayload {
				t.Fatalf("a frame of %d bytes, over the %d limit", len(p), maxFramePayload)
			}
			if cap(p) > max(cap(buf), len(p)) {
				t.Fatalf("a frame of %d bytes came in a buffer of %d", len(p), cap(p))
			}
			used := len(rest) - r.Len()
			var again bytes.Buffer
			if err := WriteFrame(&again, kind, p); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(again.Bytes(), rest[:used]) {
				t.Fatalf("frame %q of %d bytes writes back as %x, was read from %x", kind, len(p), again.Bytes(), rest[:used])
			}
			rest = rest[used:]
			if cap(p) > cap(buf) {
				buf = p[:0]
			}
		}
	})
}

// TestReadFrameAllocation bounds what a frame header makes the reader allocate: nothing
// for one over the limit, the frame's size for one within it (whether or not its
// payload follows), and nothing when the buffer passed in is large enough.
func TestReadFrameAllocation(t *testing.T) {
	// TotalAlloc counts the whole process (the runtime and the testing package
	// allocate too, now and then): the least of a few runs is the reader's own.
	allocated := func(data, buf []byte) uint64 {
		least := uint64(math.MaxUint64)
		for range 5 {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			_, _, _ = ReadFrame(bytes.NewReader(data), buf)
			runtime.ReadMemStats(&after)
			least = min(least, after.TotalAlloc-before.TotalAlloc)
		}
		return least
	}
	if n := allocated(header(FrameStdout, 1<<31), nil); n > 4<<10 {
		t.Errorf("a header claiming 2 GiB made the reader allocate %d bytes", n)
	}
	if n := allocated(append(header(FrameStdout, 1<<20), "short"...), nil); n > 1<<20+4<<10 {
		t.Errorf("a header claiming 1 MiB made the reader allocate %d bytes", n)
	}
	buf := make([]byte, 64<<10)
	data := frames(byte(FrameStdout), strings.Repeat("x", 60<<10))
	r := bytes.NewReader(data)
	// One allocation is the header's five bytes, which escape through io.Reader.
	if n := testing.AllocsPerRun(100, func() { r.Reset(data); _, _, _ = ReadFrame(r, buf) }); n > 1 {
		t.Errorf("reading a frame into a buffer large enough allocates %v times", n)
	}
}

// op is one client call against a fake agent; what it returns, for the checks.
type opResult struct {
	stdout, stderr, data bytes.Buffer
	result               any
	err                  error
}

var clientOps = []func(ctx context.Context, c *Client, out *opResult){
	func(ctx context.Context, c *Client, out *opResult) {
		out.result, out.err = c.Exec(ctx, Request{Cmd: []string{"true"}}, ExecOptions{Stdout: &out.stdout, Stderr: &out.stderr, Started: func(Started) {}})
	},
	func(ctx context.Context, c *Client, out *opResult) {
		out.result, out.err = c.RunCode(ctx, Request{Code: "1"}, CodeOptions{Stdout: &out.stdout, Stderr: &out.stderr, Result: func(CodeResult) {}})
	},
	func(ctx context.Context, c *Client, out *opResult) { out.err = c.ReadFile(ctx, "/f", &out.data) },
	func(ctx context.Context, c *Client, out *opResult) { out.result, out.err = c.List(ctx, "/") },
	func(ctx context.Context, c *Client, out *opResult) { out.result, out.err = c.Stat(ctx, "/") },
	func(ctx context.Context, c *Client, out *opResult) { out.result, out.err = c.Health(ctx) },
	func(ctx context.Context, c *Client, out *opResult) { out.result, out.err = c.Processes(ctx) },
	func(ctx context.Context, c *Client, out *opResult) {
		out.result, out.err = c.Start(ctx, Request{Cmd: []string{"sleep"}})
	},
	func(ctx context.Context, c *Client, out *opResult) {
		var l io.Closer
		if l, out.err = c.Lease(ctx); l != nil {
			l.Close()
		}
	},
	func(ctx context.Context, c *Client, out *opResult) {
		out.err = c.WriteFile(ctx, "/f", strings.NewReader("content"), 0o644, false)
	},
	func(ctx context.Context, c *Client, out *opResult) { out.result, out.err = c.Contexts(ctx) },
}

// FuzzClient runs each client call against a fake agent that answers with any bytes:
// every call returns (the agent hanging up ends it, never a deadline), and what an
// exec, a cell or a read passes on is exactly the payload of the output or data frames
// the agent sent before its last frame.
func FuzzClient(f *testing.F) {
	for i, s := range agentSeeds {
		f.Add(uint8(i), s)
	}
	f.Fuzz(func(t *testing.T, which uint8, reply []byte) {
		agentEnd, clientEnd := net.Pipe()
		served := make(chan error, 1)
		go func() {
			defer agentEnd.Close()
			kind, _, err := ReadFrame(agentEnd, nil)
			if err != nil || kind != FrameRequest {
				served <- errors.New("no request frame")
				return
			}
			go func() { _, _ = io.Copy(io.Discard, agentEnd) }() // stdin, data, signals
			_, _ = agentEnd.Write(reply)
			served <- nil
		}()
		used := false
		c := NewClientWithDialer("fuzz", func(context.Context) (net.Conn, error) {
			if used {
				return nil, errors.New("one connection per run")
			}
			used = true
			return clientEnd, nil
		})
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		op := int(which) % len(clientOps)
		var out opResult
		clientOps[op](ctx, c, &out)
		if ctx.Err() != nil {
			t.Fatalf("op %d did not return when the agent hung up: %v", op, out.err)
		}
		clientEnd.Close()
		if err := <-served; err != nil {
			t.Fatal(err)
		}
		want := expectedOutput(reply, op)
		switch op {
		case 0, 1:
			if !bytes.Equal(out.stdout.Bytes(), want[FrameStdout]) || !bytes.Equal(out.stderr.Bytes(), want[FrameStderr]) {
				t.Errorf("op %d passed on stdout %q, stderr %q; the agent sent %q, %q", op,
					out.stdout.Bytes(), out.stderr.Bytes(), want[FrameStdout], want[FrameStderr])
			}
		case 2:
			if !bytes.Equal(out.data.Bytes(), want[FrameData]) {
				t.Errorf("read passed on %q; the agent sent %q", out.data.Bytes(), want[FrameData])
			}
		}
		if out.err == nil && op == 0 {
			var res Result
			last := lastFrame(reply)
			if last == nil || last[0] != FrameResult || json.Unmarshal(last[5:], &res) != nil || !reflect.DeepEqual(res, out.result.(Result)) {
				t.Errorf("exec returned %+v without a result frame saying so", out.result)
			}
		}
	})
}

// expectedOutput splits what an agent sent into the payloads of each streaming kind,
// up to the frame that ends the operation (or the first that is not a frame): for an
// exec output and started frames go on, for a cell output and well-formed rich results,
// for a read data frames.
func expectedOutput(b []byte, op int) map[byte][]byte {
	out := map[byte][]byte{}
	for len(b) >= 5 {
		n := binary.BigEndian.Uint32(b[1:5])
		if n > maxFramePayload || uint32(len(b)-5) < n {
			break
		}
		kind, p := b[0], b[5:5+n]
		goesOn := false
		switch op {
		case 0:
			goesOn = kind == FrameStdout || kind == FrameStderr || kind == FrameStarted && json.Unmarshal(p, new(Started)) == nil
		case 1:
			var r CodeResult
			goesOn = kind == FrameStdout || kind == FrameStderr || kind == FrameCodeResult && json.Unmarshal(p, &r) == nil
		case 2:
			goesOn = kind == FrameData
		}
		if !goesOn {
			break
		}
		if kind == FrameStdout || kind == FrameStderr || kind == FrameData {
			out[kind] = append(out[kind], p...)
		}
		b = b[5+n:]
	}
	return out
}

// lastFrame is the frame that ended an exec: the first that is not output (a started
// frame that is not JSON ends it too).
func lastFrame(b []byte) []byte {
	for len(b) >= 5 {
		n := binary.BigEndian.Uint32(b[1:5])
		if n > maxFramePayload || uint32(len(b)-5) < n {
			return nil
		}
		switch {
		case b[0] == FrameStdout, b[0] == FrameStderr,
			b[0] == FrameStarted && json.Unmarshal(b[5:5+n], new(Started)) == nil:
			b = b[5+n:]
			continue
		}
		return b[:5+n]
	}
	return nil
}
