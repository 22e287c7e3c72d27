// Package kernel holds the Python program behind code contexts (kernel.py, embedded) and
// the Go side of its protocol: the events it writes and the sync marks that end a cell's
// raw output. roche-agent runs it in every sandbox it serves, and the wasm provider in
// python.wasm.
//
// It is not a Jupyter kernel: Jupyter needs zmq and ipykernel in the image, which most
// images (and python.wasm) lack, while this needs only python3's standard library.
package kernel

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"strconv"
)

// Source is kernel.py.
//
//go:embed kernel.py
var Source string

// Argv runs the kernel with python: its source on stdin (a pipe holding Source, closed,
// so that ps in the sandbox shows a short line and the cells' stdin is at its end), cells
// on fd 3, events on fd 4, raw output on fd 1 and fd 2 (roche-agent's layout).
func Argv(python string) []string {
	return []string{python, "-u", "-c", "import sys; exec(compile(sys.stdin.read(), '<roche-kernel>', 'exec'))", "--fds"}
}

// StdioArgv runs the kernel with cells on stdin and events on stdout (python.wasm).
func StdioArgv(python string) []string { return []string{python, "-u", "-c", Source, "--stdio"} }

// Cell is one cell sent to the kernel, as a JSON line.
type Cell struct {
	ID   int    `json:"id"`
	Code string `json:"code"`
}

// Line encodes c as the line the kernel reads.
func (c Cell) Line() []byte {
	b, _ := json.Marshal(c)
	return append(b, '\n')
}

// ReseedLine is the line that makes the kernel reseed the random module's global
// generator (and numpy's legacy one) from os.urandom, between cells.
var ReseedLine = []byte(`{"reseed": true}` + "\n")

// ForkLine is the line that makes the kernel fork itself (request id), the new kernel
// taking its fds from the abstract Unix socket addr.
func ForkLine(addr string, id int) []byte {
	b, _ := json.Marshal(struct {
		Fork string `json:"fork"`
		ID   int    `json:"id"`
	}{addr, id})
	return append(b, '\n')
}

// Event types.
const (
	EventReady  = "ready"
	EventStdout = "out"
	EventStderr = "err"
	EventResult = "result"
	EventError  = "error"
	EventDone   = "done"
)

// Event is one line the kernel writes.
type Event struct {
	T string `json:"t"`
	// out, err
	S string `json:"s,omitempty"`
	// result: MIME type to content (base64 for images)
	Data map[string]string `json:"data,omitempty"`
	Main bool              `json:"main,omitempty"`
	// error
	Name      string `json:"name,omitempty"`
	Value     string `json:"value,omitempty"`
	Traceback string `json:"traceback,omitempty"`
	// done
	ID    int `json:"id,omitempty"`
	Count int `json:"count,omitempty"`
	// ready
	Version string `json:"version,omitempty"`
	PID     int    `json:"pid,omitempty"`
}

// markPrefix starts the sync mark the kernel writes to raw fd 1 and fd 2 at the end of
// cell N: "\x1eroche:sync:N\x1e".
const markPrefix = "\x1eroche:sync:"

// maxMarkNumber bounds the cell number of a sync mark, in bytes: int64's 19 digits and a
// sign.
const maxMarkNumber = 20

// Marks finds the kernel's sync marks in one raw output stream, passing the rest on.
type Marks struct {
	held []byte
}

// Feed takes a chunk of the stream and returns the output in it (without marks) and the
// cells whose marks it held. Bytes that may begin a mark are held for the next chunk.
func (m *Marks) Feed(p []byte) (out []byte, cells []int) {
	buf := append(m.held, p...)
	m.held = nil
	for {
		i := bytes.Index(buf, []byte(markPrefix))
		if i < 0 {
			break
		}
		// A cell number is at most maxMarkNumber bytes: past them without the closing
		// byte this is not a mark, and is output rather than held (a program writing a
		// mark's prefix and then endless output must not make the agent hold it all).
		num := buf[i+len(markPrefix):]
		end := bytes.IndexByte(num[:min(len(num), maxMarkNumber+1)], '\x1e')
		if end < 0 && len(num) <= maxMarkNumber {
			out = append(out, buf[:i]...)
			m.held = append([]byte(nil), buf[i:]...)
			return out, cells
		}
		if end < 0 { // not a mark after all
			out = append(out, buf[:i+1]...)
			buf = buf[i+1:]
			continue
		}
		n, err := strconv.Atoi(string(buf[i+len(markPrefix) : i+len(markPrefix)+end]))
		if err != nil { // not a mark after all
			out = append(out, buf[:i+1]...)
			buf = buf[i+1:]
			continue
		}
		out = append(out, buf[:i]...)
		cells = append(cells, n)
		buf = buf[i+len(markPrefix)+end+1:]
	}
	// Keep a tail that could be the start of a mark.
	for k := min(len(buf), len(markPrefix)-1); k > 0; k-- {
		if bytes.HasPrefix([]byte(markPrefix), buf[len(buf)-k:]) {
			m.held = append([]byte(nil), buf[len(buf)-k:]...)
			buf = buf[:len(buf)-k]
			break
		}
	}
	return append(out, buf...), cells
}

// Flush returns what is held (the stream ended).
func (m *Marks) Flush() []byte {
	h := m.held
	m.held = nil
	return h
}
