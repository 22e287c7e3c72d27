package vmlink

import (
	"bufio"
	"context"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
)

// fakeFirecracker answers hybrid vsock connections as Firecracker does: it reads
// "CONNECT <port>\n" and, for port 1024, replies "OK <host port>\n" and echoes.
func fakeFirecracker(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "v.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				line, err := bufio.NewReader(c).ReadString('\n')
				if err != nil {
					return
				}
				if line != "CONNECT 1024\n" {
					return // Firecracker closes on an unknown port
				}
				io.WriteString(c, "OK 1073741824\n")
				io.Copy(c, c)
			}()
		}
	}()
	return sock
}

func TestDialHybridVsock(t *testing.T) {
	sock := fakeFirecracker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := DialHybridVsock(ctx, sock, VsockPort)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "ping")
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo %q %v", buf, err)
	}
	if _, err := DialHybridVsock(ctx, sock, 9); err == nil || !strings.Contains(err.Error(), "port 9") {
		t.Fatalf("a port nobody listens on: %v", err)
	}
	if _, err := DialHybridVsock(ctx, filepath.Join(t.TempDir(), "none"), VsockPort); err == nil {
		t.Fatal("dialing a missing socket succeeded")
	}
}

// TestSerialLink runs the multiplexer both ways over one pipe, as over a serial port.
func TestSerialLink(t *testing.T) {
	guest, host := net.Pipe()
	go func() {
		io.WriteString(guest, Hello)
		sess, err := yamux.Server(guest, MuxConfig())
		if err != nil {
			return
		}
		for {
			st, err := sess.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(st, st); st.Close() }()
		}
	}()
	if err := ReadHello(host); err != nil {
		t.Fatal(err)
	}
	sess, err := yamux.Client(host, MuxConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	for i := 0; i < 3; i++ {
		st, err := sess.OpenStream()
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(st, "hello")
		buf := make([]byte, 5)
		if _, err := io.ReadFull(st, buf); err != nil || string(buf) != "hello" {
			t.Fatalf("stream %d: %q %v", i, buf, err)
		}
		st.Close()
	}
	if err := ReadHello(strings.NewReader("something else\n")); err == nil {
		t.Fatal("a wrong hello was accepted")
	}
}
