package vmlink

import (
	"io"
	"net"
	"testing"
	"time"
)

// TestSwitchSplitsAtMarker: what comes before the marker goes to the session being
// given up, what follows it to the next one, whatever the reads' boundaries (the marker
// arrives split across two writes here).
func TestSwitchSplitsAtMarker(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	sw := NewSwitch(b, b, false)
	old := sw.Conn()
	marker := RelinkLine("0123456789abcdef0123456789abcdef")
	found := sw.Expect(marker)
	go func() {
		_, _ = a.Write([]byte("old-session bytes"))
		_, _ = a.Write(marker[:7])
		_, _ = a.Write(append(append([]byte(nil), marker[7:]...), "new"...))
		_, _ = a.Write([]byte(" session"))
	}()
	// The old session reads on until it is dropped, as a multiplexer does.
	oldRead := make(chan []byte)
	go func() { b, _ := io.ReadAll(old); oldRead <- b }()
	select {
	case <-found:
	case <-time.After(10 * time.Second):
		t.Fatal("the marker was not seen")
	}
	nc := sw.Conn()
	if b := <-oldRead; len(b) < 17 || string(b[:17]) != "old-session bytes" || len(b) >= 17+len(marker) {
		t.Fatalf("the old session read %q: want what came before the marker", b)
	}
	got := make([]byte, len("new session"))
	if _, err := io.ReadFull(nc, got); err != nil || string(got) != "new session" {
		t.Fatalf("the new session read %q, %v", got, err)
	}
	// The old session, dropped, can no longer write into the stream.
	if _, err := old.Write([]byte("late")); err == nil {
		t.Fatal("a dropped session could still write")
	}
	go func() { _ = sw.Write([]byte(Hello)) }()
	if err := ReadHello(a); err != nil {
		t.Fatal(err)
	}
}

// TestScanHelloEnds: a link that ends while waiting for a hello is an error at once.
func TestScanHelloEnds(t *testing.T) {
	a, b := net.Pipe()
	sw := NewSwitch(b, b, false)
	found := sw.Expect([]byte(Hello))
	a.Close()
	if err := ScanHello(found, sw.Ended(), 10*time.Second); err == nil {
		t.Fatal("ScanHello on an ended link: nil error")
	}
}
