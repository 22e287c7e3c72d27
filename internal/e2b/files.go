package e2b

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"strings"

	"github.com/roche-sandbox/roche"
)

// envd's /files: GET downloads one file (gzip when asked), POST uploads one or more, as
// multipart/form-data (each part's file name its path, unless ?path= names the one) or
// as the raw body (application/octet-stream, gzip when Content-Encoding says so). Both
// stream through Roche's files API (ReadFile, WriteFile) without staging on this host.

// writeInfo is envd's answer for each uploaded file.
type writeInfo struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

// lazyBody writes the response's header at the first byte of content, so that an error
// found before any (not found, over the cap) is still answered as one.
type lazyBody struct {
	w       http.ResponseWriter
	gz      bool
	zw      *gzip.Writer
	started bool
}

func (b *lazyBody) start() {
	if b.started {
		return
	}
	b.started = true
	h := b.w.Header()
	h.Set("Content-Type", "application/octet-stream")
	if b.gz {
		h.Set("Content-Encoding", "gzip")
		b.zw = gzip.NewWriter(b.w)
	}
	b.w.WriteHeader(http.StatusOK)
}

func (b *lazyBody) Write(p []byte) (int, error) {
	b.start()
	if b.zw != nil {
		return b.zw.Write(p)
	}
	return b.w.Write(p)
}

func (b *lazyBody) finish() error {
	b.start()
	if b.zw != nil {
		return b.zw.Close()
	}
	return nil
}

func acceptsGzip(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept-Encoding"), ",") {
		if strings.TrimSpace(strings.SplitN(part, ";", 2)[0]) == "gzip" {
			return true
		}
	}
	return false
}

func (s *Server) getFile(w http.ResponseWriter, r *http.Request) {
	call := callOf(r.Context())
	p, err := sandboxPath(r.URL.Query().Get("path"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "give the file's path: /files?path=/home/user/data.txt")
		return
	}
	body := &lazyBody{w: w, gz: acceptsGzip(r)}
	if _, err := call.p.ReadFileLimit(r.Context(), call.id, p, body, 0); err != nil {
		if !body.started {
			writeErr(w, err)
		}
		return
	}
	_ = body.finish()
}

func (s *Server) postFiles(w http.ResponseWriter, r *http.Request) {
	call := callOf(r.Context())
	q := r.URL.Query().Get("path")
	ctype, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var out []writeInfo
	write := func(dst string, body io.Reader) error {
		p, err := sandboxPath(dst)
		if err != nil {
			return fmt.Errorf("%w: the file has no path: give ?path= or the part's file name", roche.ErrInvalidConfig)
		}
		fi, err := call.p.WriteFileLimit(r.Context(), call.id, p, body, 0o644, 0)
		if err != nil {
			return err
		}
		out = append(out, writeInfo{Name: fi.Name, Type: "file", Path: fi.Path})
		if out[len(out)-1].Path == "" {
			out[len(out)-1].Path = p
		}
		return nil
	}
	var err error
	switch ctype {
	case "multipart/form-data":
		mr := multipart.NewReader(r.Body, params["boundary"])
		n := 0
		for {
			part, perr := mr.NextPart()
			if errors.Is(perr, io.EOF) {
				break
			}
			if perr != nil {
				err = fmt.Errorf("%w: multipart body: %v", roche.ErrInvalidConfig, perr)
				break
			}
			if part.FormName() != "file" {
				continue
			}
			// The whole file name: Part.FileName keeps only its last element.
			_, dp, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
			dst := dp["filename"]
			if q != "" && n == 0 {
				dst = q
			}
			n++
			if err = write(dst, part); err != nil {
				break
			}
		}
		if err == nil && n == 0 {
			err = fmt.Errorf("%w: the multipart body holds no part named \"file\"", roche.ErrInvalidConfig)
		}
	default:
		var body io.Reader = r.Body
		switch enc := r.Header.Get("Content-Encoding"); enc {
		case "", "identity":
		case "gzip":
			zr, zerr := gzip.NewReader(r.Body)
			if zerr != nil {
				writeError(w, http.StatusBadRequest, "the gzip body does not start as gzip: "+zerr.Error())
				return
			}
			defer zr.Close()
			body = zr
		default:
			writeError(w, http.StatusBadRequest, "Content-Encoding "+enc+": send gzip or none")
			return
		}
		err = write(q, body)
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}
