package podlink

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// muxFrame is one yamux frame (version 0) as the host sends it: type, flags, stream,
// and a payload or, for a window update, ping or go-away, the length field's value.
func muxFrame(typ byte, flags uint16, stream, length uint32, payload string) []byte {
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

// streamPayloads is, for each stream id, the data the frames of b carry for it in order,
// as far as b parses as yamux frames.
func streamPayloads(b []byte) map[uint32][]byte {
	out := map[uint32][]byte{}
	for len(b) >= 12 {
		typ, id, n := b[1], binary.BigEndian.Uint32(b[4:8]), binary.BigEndian.Uint32(b[8:12])
		b = b[12:]
		if typ != 0 {
			continue
		}
		if uint32(len(b)) < n {
			out[id] = append(out[id], b...)
			break
		}
		out[id] = append(out[id], b[:n]...)
		b = b[n:]
	}
	return out
}

// FuzzMux feeds the relay any bytes as the host's end of the exec stream, with an agent
// socket that records what each connection gets. Whatever the host sent, the relay
// returns once the stream ends, every connection it made to the agent is closed, and
// each got only what the host sent on one stream, in order: no stream's bytes reach
// another's connection.
func FuzzMux(f *testing.F) {
	open := func(id uint32) []byte { return muxFrame(1, 1, id, 0, "") } // window update, SYN
	for _, s := range [][]byte{
		bytes.Join([][]byte{open(1), muxFrame(0, 0, 1, 0, "request one"), open(3), muxFrame(0, 0, 3, 0, "request two"),
			muxFrame(0, 0, 1, 0, " more"), muxFrame(0, 4, 1, 0, ""), muxFrame(0, 4, 3, 0, "")}, nil),
		bytes.Join([][]byte{open(1), muxFrame(0, 0, 1, 1<<31, "")}, nil),
		bytes.Join([][]byte{muxFrame(0, 1, 5, 0, strings.Repeat("x", 300<<10))}, nil),
		bytes.Join([][]byte{open(1), open(1), muxFrame(0, 8, 1, 0, ""), muxFrame(2, 1, 0, 9, ""), muxFrame(3, 0, 0, 0, "")}, nil),
		{1, 2, 3},
		{},
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, host []byte) {
		sock := filepath.Join(t.TempDir(), "agent.sock")
		ln, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		var mu sync.Mutex
		var got [][]byte
		var conns sync.WaitGroup
		conns.Add(1)
		go func() {
			defer conns.Done()
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				conns.Add(1)
				go func() {
					defer conns.Done()
					defer c.Close()
					b, _ := io.ReadAll(c)
					mu.Lock()
					got = append(got, b)
					mu.Unlock()
				}()
			}
		}()
		in, toRelay := io.Pipe()
		go func() {
			_, _ = toRelay.Write(host)
			toRelay.Close()
		}()
		done := make(chan error, 1)
		go func() { done <- Mux(sock, in, io.Discard, "") }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Fatal("the relay did not return after the host's stream ended")
		}
		ln.Close()
		waited := make(chan struct{})
		go func() { conns.Wait(); close(waited) }()
		select {
		case <-waited:
		case <-time.After(20 * time.Second):
			t.Fatal("a connection to the agent outlived the relay")
		}
		sent := streamPayloads(host)
		for _, b := range got {
			if len(b) == 0 {
				continue
			}
			ok := false
			for _, p := range sent {
				if bytes.HasPrefix(p, b) {
					ok = true
					break
				}
			}
			if !ok {
				t.Fatalf("an agent connection got %q, which no stream of the host sent", b[:min(len(b), 64)])
			}
		}
	})
}
