package guestfwd

import (
	"bytes"
	"encoding/base64"
	"testing"

	"github.com/roche-sandbox/roche/internal/guest"
)

func TestCodeResultFromMIMEBundle(t *testing.T) {
	png := []byte("\x89PNG\r\n\x1a\nfake")
	r := CodeResult(guest.CodeResult{Main: true, Data: map[string]string{
		"text/plain": "df", "text/html": "<table/>", "image/png": base64.StdEncoding.EncodeToString(png),
		"image/svg+xml": "<svg/>", "application/json": `{"a":1}`, "text/markdown": "*m*",
		"text/latex": "$x$", "application/javascript": "1", "application/x-unknown": "ignored",
	}})
	if !r.IsMainResult || r.Text != "df" || r.HTML != "<table/>" || !bytes.Equal(r.PNG, png) || r.SVG != "<svg/>" ||
		r.JSON != `{"a":1}` || r.Markdown != "*m*" || r.LaTeX != "$x$" || r.JavaScript != "1" {
		t.Fatalf("converted result: %+v", r)
	}
}
