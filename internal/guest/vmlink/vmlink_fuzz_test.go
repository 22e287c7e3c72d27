package vmlink

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
)

// yamuxFrame is one yamux frame (version 0): type, flags, stream, and a payload or, for
// a window update, ping or go-away, the length field's value.
func yamuxFrame(typ byte, flags uint16, stream, length uint32, payload string) []byte {
	h := make([]byte, 12, 12+len(payload))
	h[1] = typ
	binary.BigEndian.PutUint16(h[2:], flags)
	binary.BigEndian.PutUint32(h[4:], stream)
	if payload != "" {
		length = uint32(len(payload))
	}
	binary.BigEndian.PutUint32(h[8:], length)
	return append(h, payload...)
}

const (
	yData, yWindow, yPing, yGoAway = 0, 1, 2, 3
	fSYN, fACK, fFIN, fRST         = 1, 2, 4, 8
)

// guestSeeds are what a guest writes on its serial port: the hello, then a yamux session
// that answers the host's first stream (id 1) and sends on it, and the hostile shapes:
// a frame past the window, a stream the host never opened, a bad version, a go-away.
var guestSeeds = [][]byte{
	[]byte(Hello),
	bytes.Join([][]byte{[]byte(Hello),
		yamuxFrame(yWindow, fACK, 1, 0, ""),
		yamuxFrame(yData, 0, 1, 0, "answer"),
		yamuxFrame(yData, fFIN, 1, 0, "")}, nil),
	bytes.Join([][]byte{[]byte(Hello),
		yamuxFrame(yWindow, fACK, 1, 1<<30, ""),
		yamuxFrame(yData, 0, 1, 0, strings.Repeat("x", 300<<10))}, nil),
	bytes.Join([][]byte{[]byte(Hello), yamuxFrame(yData, 0, 1, 1<<31, "")}, nil),
	bytes.Join([][]byte{[]byte(Hello), yamuxFrame(yWindow, fSYN, 2, 0, ""), yamuxFrame(yData, 0, 2, 0, "guest-opened")}, nil),
	bytes.Join([][]byte{[]byte(Hello), yamuxFrame(yPing, fSYN, 0, 7, ""), yamuxFrame(yGoAway, 0, 0, 1, "")}, nil),
	bytes.Join([][]byte{[]byte(Hello), yamuxFrame(yWindow, fRST, 1, 0, "")}, nil),
	append([]byte(Hello), 1, 0, 0, 0),
	[]byte("roche-vmlink 2\n"),
	[]byte(strings.Repeat("x", 100)),
}

// FuzzSerialLink plays a guest that writes any bytes on the serial link, and the host
// as the supervisor is: it checks the hello and runs a yamux client, opens a stream and
// reads it. Whatever the guest wrote, the host's side ends once the guest hangs up (no
// deadline is what ends it), reads on its stream only what the guest sent, and holds no
// more memory than the window allows.
func FuzzSerialLink(f *testing.F) {
	for _, s := range guestSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, guest []byte) {
		host, vm := net.Pipe()
		defer host.Close()
		go func() {
			go func() { _, _ = io.Copy(io.Discard, vm) }()
			_, _ = vm.Write(guest)
			vm.Close()
		}()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		err := ReadHello(host)
		if (err == nil) != bytes.HasPrefix(guest, []byte(Hello)) {
			t.Fatalf("hello %q: ReadHello said %v", guest[:min(len(guest), 64)], err)
		}
		if err != nil {
			return
		}
		sess, err := yamux.Client(host, MuxConfig())
		if err != nil {
			t.Fatal(err)
		}
		defer sess.Close()
		read := make(chan []byte, 1)
		go func() {
			st, err := sess.OpenStream()
			if err != nil {
				read <- nil
				return
			}
			defer st.Close()
			_, _ = st.Write([]byte("request"))
			b, _ := io.ReadAll(io.LimitReader(st, 64<<20))
			read <- b
		}()
		var got []byte
		select {
		case got = <-read:
		case <-time.After(20 * time.Second):
			t.Fatal("the host's stream did not end after the guest hung up")
		}
		select {
		case <-sess.CloseChan():
		case <-time.After(20 * time.Second):
			t.Fatal("the host's session did not end after the guest hung up")
		}
		if len(got) > 0 && !bytes.Contains(guest, got[:min(len(got), 16)]) {
			t.Fatalf("the host read %q, which the guest never sent", got[:min(len(got), 64)])
		}
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		if grown := int64(after.TotalAlloc-before.TotalAlloc) - 4*int64(len(guest)); grown > 16<<20 {
			t.Fatalf("the host allocated %d bytes more than four times what the guest sent", grown)
		}
	})
}

// FuzzReadHello: the hello is read to its newline and no further, at most 64 bytes, and
// only the exact line passes.
func FuzzReadHello(f *testing.F) {
	for _, s := range guestSeeds {
		f.Add(s)
	}
	f.Add([]byte("roche-vmlink 1\nrest"))
	f.Add([]byte("roche-vmlink 1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		err := ReadHello(r)
		used := len(b) - r.Len()
		if used > 64 {
			t.Fatalf("ReadHello read %d bytes", used)
		}
		if i := bytes.IndexByte(b, '\n'); i >= 0 && used > i+1 {
			t.Fatalf("ReadHello read %d bytes, past the newline at %d", used, i)
		}
		if (err == nil) != bytes.HasPrefix(b, []byte(Hello)) {
			t.Fatalf("%q: ReadHello said %v", b, err)
		}
	})
}

// FuzzHybridVsockReply answers a hybrid vsock CONNECT with any bytes: DialHybridVsock
// succeeds only on "OK <port>" (a 32-bit port) ended by a newline within 64 bytes, and
// what follows the newline is left on the connection for the agent's protocol.
func FuzzHybridVsockReply(f *testing.F) {
	for _, s := range []string{"OK 1073741824\n", "OK 5\nagent bytes", "OK\n", "NOPE 1\n", "OK 99999999999\n",
		"OK 1 2\n", " OK   7 \n", "OK -1\n", strings.Repeat("O", 70), "OK 7", "OK 5" + strings.Repeat(" ", 60) + "\nagent",
		"OK 5" + strings.Repeat(" ", 59) + "\nagent"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, reply []byte) {
		sock := filepath.Join(t.TempDir(), "v.sock")
		ln, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		served := make(chan error, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				served <- err
				return
			}
			defer c.Close()
			line := make([]byte, len("CONNECT 1024\n"))
			if _, err := io.ReadFull(c, line); err != nil || string(line) != "CONNECT 1024\n" {
				served <- errors.New("no CONNECT line")
				return
			}
			_, _ = c.Write(reply)
			// The end of the reply is the end of what the dialer reads: a reply cut
			// short ends the dial at once instead of at its deadline.
			_ = c.(*net.UnixConn).CloseWrite()
			served <- nil
			_, _ = io.Copy(io.Discard, c)
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		c, err := DialHybridVsock(ctx, sock, VsockPort)
		if serr := <-served; serr != nil {
			t.Fatal(serr)
		}
		line, rest, nl := bytes.Cut(reply, []byte("\n"))
		fields := strings.Fields(string(line))
		ok := nl && len(line) < 64 && len(fields) == 2 && fields[0] == "OK"
		if ok {
			_, perr := strconv.ParseUint(fields[1], 10, 32)
			ok = perr == nil
		}
		if (err == nil) != ok {
			t.Fatalf("reply %q: DialHybridVsock said %v", reply, err)
		}
		if err != nil {
			return
		}
		defer c.Close()
		if len(rest) > 0 {
			got := make([]byte, len(rest))
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, rest) {
				t.Fatalf("after the reply the connection gave %q (%v), want %q", got, err, rest)
			}
		}
	})
}
