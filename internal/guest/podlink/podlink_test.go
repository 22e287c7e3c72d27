package podlink

import (
	"bytes"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/roche-sandbox/roche/internal/guest/vmlink"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// TestInstall: the agent is copied read-and-execute only, beside a socket directory only
// its owner may enter, in a directory only its owner may change, even when the volume
// starts world-writable as an emptyDir does.
func TestInstall(t *testing.T) {
	src := filepath.Join(t.TempDir(), "agent")
	if err := os.WriteFile(src, []byte("#!agent"), 0o700); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "vol")
	if err := os.Mkdir(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o777)
	for range 2 { // a restarted init container installs again over the first
		if err := Install(src, dir); err != nil {
			t.Fatal(err)
		}
	}
	check := func(path string, want os.FileMode) {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", path, fi.Mode().Perm(), want)
		}
	}
	check(dir, 0o755)
	check(filepath.Join(dir, "roche-agent"), 0o555)
	check(filepath.Join(dir, "run"), 0o700)
	if b, _ := os.ReadFile(filepath.Join(dir, "roche-agent")); string(b) != "#!agent" {
		t.Errorf("installed agent holds %q", b)
	}
	if _, err := os.Stat(filepath.Join(dir, "roche-agent.tmp")); !os.IsNotExist(err) {
		t.Errorf("the temporary copy is left: %v", err)
	}
}

// TestRelay: bytes go both ways; the agent closing ends the relay, and the end of the
// relay's input ends its connection to the agent.
func TestRelay(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// One exchange: the agent reads a request, answers and hangs up.
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		b := make([]byte, len("request"))
		io.ReadFull(c, b)
		c.Write(append([]byte("answer to "), b...))
		c.Close()
	}()
	inR, inW := io.Pipe()
	defer inW.Close()
	go inW.Write([]byte("request"))
	var out bytes.Buffer
	if err := Relay(sock, inR, &out); err != nil {
		t.Fatal(err)
	}
	if out.String() != "answer to request" {
		t.Errorf("relay wrote %q", out.String())
	}

	// The host hangs up (its stdin ends): the agent sees the connection end.
	closed := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		b, _ := io.ReadAll(c)
		c.Close()
		closed <- b
	}()
	if err := Relay(sock, strings.NewReader("last words"), io.Discard); err != nil {
		t.Fatal(err)
	}
	if got := <-closed; string(got) != "last words" {
		t.Errorf("agent read %q before the end, want last words", got)
	}
	if err := Relay(filepath.Join(t.TempDir(), "none"), strings.NewReader(""), io.Discard); err == nil {
		t.Error("relay to a missing socket succeeded")
	}
}

// TestMux: streams of one session reach the agent as connections of their own, and the
// session's end closes every one of them.
func TestMux(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ended := make(chan struct{}, 2)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b := make([]byte, 1)
				for {
					if _, err := c.Read(b); err != nil {
						ended <- struct{}{}
						return
					}
					c.Write(b) // echo
				}
			}()
		}
	}()
	// The exec stream: the host's end and the relay's, two pipes.
	hostR, relayW := io.Pipe()
	relayR, hostW := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- Mux(sock, relayR, relayW, "") }()
	sess, err := yamux.Client(stdio{hostR, hostW}, vmlink.MuxConfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, msg := range []string{"a", "b"} {
		st, err := sess.OpenStream()
		if err != nil {
			t.Fatal(err)
		}
		st.Write([]byte(msg))
		b := make([]byte, 1)
		if _, err := io.ReadFull(st, b); err != nil || string(b) != msg {
			t.Fatalf("echo of %q: %q, %v", msg, b, err)
		}
	}
	// The host goes: its stdin ends.
	hostW.Close()
	if err := <-done; err != nil {
		t.Fatalf("Mux: %v", err)
	}
	for range 2 {
		<-ended
	}
	relayW.Close() // the relay process exits, and its stdout ends
	sess.Close()
}

// TestMuxEgress: a connection the agent makes to the egress socket reaches the host as a
// stream the relay opens, both ways; the socket is root's alone (0600); a second relay
// takes the socket over, and the first one's end leaves it to the second.
func TestMuxEgress(t *testing.T) {
	dir := t.TempDir()
	egressSock := filepath.Join(dir, "egress.sock")
	start := func() (*yamux.Session, func()) {
		hostR, relayW := io.Pipe()
		relayR, hostW := io.Pipe()
		done := make(chan error, 1)
		go func() { done <- Mux(filepath.Join(dir, "agent.sock"), relayR, relayW, egressSock) }()
		sess, err := yamux.Client(stdio{hostR, hostW}, vmlink.MuxConfig())
		if err != nil {
			t.Fatal(err)
		}
		return sess, func() {
			hostW.Close()
			if err := <-done; err != nil {
				t.Errorf("Mux: %v", err)
			}
			relayW.Close()
			sess.Close()
		}
	}
	// listening waits for a relay's egress socket: it listens, then restricts the mode.
	listening := func(replacing os.FileInfo) {
		t.Helper()
		testenv.AwaitFile(t, egressSock, "the relay's egress socket", 10*time.Second, func(fi os.FileInfo) bool {
			return fi.Mode().Perm() == 0o600 && (replacing == nil || !os.SameFile(replacing, fi))
		})
	}
	// roundTrip dials the egress socket as the agent does, and the host answers.
	roundTrip := func(sess *yamux.Session, msg string) {
		t.Helper()
		c, err := net.Dial("unix", egressSock)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write([]byte(msg))
		st, err := sess.AcceptStream()
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		b := make([]byte, len(msg))
		if _, err := io.ReadFull(st, b); err != nil || string(b) != msg {
			t.Fatalf("host read %q, %v; want %q", b, err, msg)
		}
		st.Write([]byte("re:" + msg))
		st.Close()
		got, err := io.ReadAll(c)
		if err != nil || string(got) != "re:"+msg {
			t.Fatalf("agent read %q, %v; want re:%s", got, err, msg)
		}
	}
	first, stopFirst := start()
	listening(nil)
	roundTrip(first, "one")
	if fi, err := os.Stat(egressSock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("egress socket %v, %v: want mode 0600", fi.Mode(), err)
	}
	was, _ := os.Stat(egressSock)
	second, stopSecond := start()
	listening(was) // the second relay's, in place of the first's
	roundTrip(second, "two")
	stopFirst()
	roundTrip(second, "three")
	stopSecond()
}
