package agentfwd

import (
	"bytes"
	"encoding/base64"
	"testing"

	"github.com/roche-sandbox/roche/agent"
)

func TestCodeResultFromMIMEBundle(t *testing.T) {
	png := []byte("\x89PNG\r\n\x1a\nfake")
	r := CodeResult(agent.CodeResult{Main: true, Data: map[string]string{
		"text/plain": "df", "text/html": "<table/>", "image/png": base64.StdEncoding.EncodeToString(png),
		"image/svg+xml": "<svg/>", "application/json": `{"a":1}`, "text/markdown": "*m*",
		"text/latex": "$x$", "application/javascript": "1", "application/x-unknown": "ignored",
	}})
	if !r.IsMainResult || r.Text != "df" || r.HTML != "<table/>" || !bytes.Equal(r.PNG, png) || r.SVG != "<svg/>" ||
		r.JSON != `{"a":1}` || r.Markdown != "*m*" || r.LaTeX != "$x$" || r.JavaScript != "1" {
		t.Fatalf("converted result: %+v", r)
	}
}

func TestChunksKeepWrites(t *testing.T) {
	var logs []string
	var out bytes.Buffer
	c := &chunks{w: &out, into: &logs}
	c.Write([]byte("a\n"))
	c.Write([]byte("b"))
	if len(logs) != 2 || logs[0] != "a\n" || out.String() != "a\nb" {
		t.Fatalf("chunks %q, passed on %q", logs, out.String())
	}
}
