package e2b

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/roche-sandbox/roche"
)

// The code interpreter (port 49999): POST /execute streams a cell's output as JSON lines,
// and /contexts manages contexts, on Roche's code contexts (RunCode, CreateContext...).

func (s *Server) interpreter() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /execute", s.execute)
	mux.HandleFunc("POST /contexts", s.createContext)
	mux.HandleFunc("GET /contexts", s.listContexts)
	mux.HandleFunc("DELETE /contexts/{cid}", s.removeContext)
	mux.HandleFunc("POST /contexts/{cid}/restart", s.restartContext)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The Python SDK's /contexts calls carry no access token: the sandbox's id
		// (a MAC, see parseID) is what authorises them, as on E2B's public traffic.
		call, ok := s.authSandbox(w, r, false)
		if !ok {
			return
		}
		mux.ServeHTTP(w, r.WithContext(withCall(r.Context(), call)))
	})
}

// lines writes JSON lines, one at a time, flushing each.
type lines struct {
	mu    sync.Mutex
	w     http.ResponseWriter
	wrote bool
}

func (l *lines) send(v map[string]any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b, _ := json.Marshal(v)
	l.wrote = true
	_, _ = l.w.Write(append(b, '\n'))
	if f, ok := l.w.(http.Flusher); ok {
		f.Flush()
	}
}

// streamWriter sends what a stream gets as stdout or stderr lines.
type streamWriter struct {
	l    *lines
	kind string
}

func (s streamWriter) Write(p []byte) (int, error) {
	s.l.send(map[string]any{"type": s.kind, "text": string(p), "timestamp": time.Now().UTC().Format(time.RFC3339Nano)})
	return len(p), nil
}

func resultLine(res roche.CodeResult) map[string]any {
	m := map[string]any{"type": "result", "is_main_result": res.IsMainResult}
	set := func(k, v string) {
		if v != "" {
			m[k] = v
		}
	}
	set("text", res.Text)
	set("html", res.HTML)
	set("markdown", res.Markdown)
	set("svg", res.SVG)
	set("latex", res.LaTeX)
	set("javascript", res.JavaScript)
	if len(res.PNG) > 0 {
		m["png"] = res.PNG // base64 in JSON, as E2B sends it
	}
	if len(res.JPEG) > 0 {
		m["jpeg"] = res.JPEG
	}
	if res.JSON != "" {
		m["json"] = json.RawMessage(res.JSON)
	}
	return m
}

func (s *Server) execute(w http.ResponseWriter, r *http.Request) {
	call := callOf(r.Context())
	var req struct {
		Code      string            `json:"code"`
		ContextID *string           `json:"context_id"`
		Language  *string           `json:"language"`
		EnvVars   map[string]string `json:"env_vars"`
	}
	if err := decodeBody(r, &req); err != nil {
		writeErr(w, err)
		return
	}
	cr := roche.CodeRequest{Code: req.Code, Env: req.EnvVars}
	if req.ContextID != nil {
		cr.Context = *req.ContextID
	}
	if req.Language != nil {
		cr.Language = *req.Language
	}
	if err := cr.Validate(); err != nil {
		writeErr(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	l := &lines{w: w}
	cr.Stdout, cr.Stderr = streamWriter{l, "stdout"}, streamWriter{l, "stderr"}
	cr.OnResult = func(res roche.CodeResult) { l.send(resultLine(res)) }
	// Results arrive through OnResult as they are made; the Execution repeats them.
	ex, err := call.p.RunCode(r.Context(), call.id, cr)
	if err != nil {
		l.mu.Lock()
		wrote := l.wrote
		l.mu.Unlock()
		if !wrote {
			writeErr(w, err)
			return
		}
		l.send(map[string]any{"type": "error", "name": "RuntimeError", "value": err.Error(), "traceback": err.Error()})
		return
	}
	if ex.Error != nil {
		l.send(map[string]any{"type": "error", "name": ex.Error.Name, "value": ex.Error.Value, "traceback": ex.Error.Traceback})
	}
	l.send(map[string]any{"type": "number_of_executions", "execution_count": ex.ExecutionCount})
	l.send(map[string]any{"type": "end_of_execution"})
}

type contextJSON struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

func toContextJSON(c roche.CodeContext) contextJSON {
	return contextJSON{ID: c.ID, Language: c.Language, Cwd: c.Cwd}
}

func (s *Server) createContext(w http.ResponseWriter, r *http.Request) {
	call := callOf(r.Context())
	var req struct {
		Language string `json:"language"`
		Cwd      string `json:"cwd"`
	}
	if err := decodeBody(r, &req); err != nil {
		writeErr(w, err)
		return
	}
	c, err := call.p.CreateContext(r.Context(), call.id, roche.ContextOptions{Language: strings.ToLower(req.Language), Cwd: req.Cwd})
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, toContextJSON(c))
}

func (s *Server) listContexts(w http.ResponseWriter, r *http.Request) {
	call := callOf(r.Context())
	cs, err := call.p.Contexts(r.Context(), call.id)
	if err != nil {
		writeErr(w, err)
		return
	}
	out := []contextJSON{}
	for _, c := range cs {
		out = append(out, toContextJSON(c))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) removeContext(w http.ResponseWriter, r *http.Request) {
	call := callOf(r.Context())
	if err := call.p.RemoveContext(r.Context(), call.id, r.PathValue("cid")); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) restartContext(w http.ResponseWriter, r *http.Request) {
	call := callOf(r.Context())
	if err := call.p.RestartContext(r.Context(), call.id, r.PathValue("cid")); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
