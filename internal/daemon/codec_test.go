package daemon

import (
	"bytes"
	"testing"

	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
)

// TestCodecsMarshalAppend: both codecs marshal into the buffer they are given (connect-go's
// pooled one) when it has room, and the bytes are what Marshal makes.
func TestCodecsMarshalAppend(t *testing.T) {
	msg := &rochev1.ReadFileResponse{Data: bytes.Repeat([]byte("x"), 1000)}
	for _, c := range []interface {
		Marshal(any) ([]byte, error)
		MarshalAppend([]byte, any) ([]byte, error)
	}{strictProto{}, strictJSON{"json"}} {
		want, err := c.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 0, 4096)
		got, err := c.MarshalAppend(buf, msg)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%T: MarshalAppend %q, %v; want %q", c, got[:min(len(got), 20)], err, want[:20])
		}
		if &got[0] != &buf[:1][0] {
			t.Errorf("%T: MarshalAppend allocated instead of using the buffer it was given", c)
		}
	}
}
