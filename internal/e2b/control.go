package e2b

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/size"
)

// Settings are the config file's "e2b" section.
//
//	"e2b": {
//	  "templates": {
//	    "base": {"image": "roche/python:local", "provider": "docker", "memory": "512m"},
//	    "gvisor": {"image": "roche/python:local", "provider": "docker", "cpus": 2}
//	  },
//	  "no_local_key": false
//	}
type Settings struct {
	// Templates map E2B template names (or ids) to Roche configs; DefaultTemplates are
	// added unless named here.
	Templates map[string]Template `json:"templates"`
	// NoLocalKey: roched makes no key of its own (tenant "e2b"); only its tenants'
	// tokens of E2B's form (e2b_ and hex) are keys.
	NoLocalKey bool `json:"no_local_key"`
}

// Template is a Roche config an E2B template name stands for.
type Template struct {
	// Provider is the Roche provider ("" for roched's default).
	Provider  string  `json:"provider,omitempty"`
	Image     string  `json:"image"`
	Memory    string  `json:"memory,omitempty"`
	CPUs      float64 `json:"cpus,omitempty"`
	PidsLimit int     `json:"pids_limit,omitempty"`
	Disk      string  `json:"disk,omitempty"`
	// ReadOnly keeps the root file system read-only (E2B's sandboxes are writable).
	ReadOnly bool `json:"read_only,omitempty"`
	// Network gives the sandbox a network; E2B's allow_internet_access must then not be
	// false.
	Network bool   `json:"network,omitempty"`
	Workdir string `json:"workdir,omitempty"`
}

// DefaultTemplates are E2B's default template and the code interpreter's, on the local
// test image.
var DefaultTemplates = map[string]Template{
	"base":                {Image: "roche/python:local"},
	"code-interpreter-v1": {Image: "roche/python:local"},
}

func parseSettings(raw json.RawMessage) (Settings, error) {
	var s Settings
	if len(raw) > 0 {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&s); err != nil {
			return s, fmt.Errorf("%w: config \"e2b\": %v (see docs/e2b.md)", roche.ErrInvalidConfig, err)
		}
	}
	if s.Templates == nil {
		s.Templates = map[string]Template{}
	}
	for name, t := range DefaultTemplates {
		if _, ok := s.Templates[name]; !ok {
			s.Templates[name] = t
		}
	}
	for name, t := range s.Templates {
		if t.Image == "" {
			return s, fmt.Errorf("%w: config \"e2b\": template %q names no image", roche.ErrInvalidConfig, name)
		}
	}
	return s, nil
}

// apiError is E2B's error body.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, apiError{Code: status, Message: msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// statusOf is the HTTP status of a Roche error.
func statusOf(err error) int {
	switch {
	case errors.Is(err, roche.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, roche.ErrInvalidConfig), errors.Is(err, roche.ErrImageNotFound):
		return http.StatusBadRequest
	case errors.Is(err, roche.ErrPermission):
		return http.StatusForbidden
	case errors.Is(err, roche.ErrExhausted):
		return http.StatusTooManyRequests
	case errors.Is(err, roche.ErrUnavailable):
		return http.StatusServiceUnavailable
	case errors.Is(err, roche.ErrUnsupported):
		return http.StatusNotImplemented
	case errors.Is(err, roche.ErrInUse):
		return http.StatusConflict
	case errors.Is(err, roche.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

func writeErr(w http.ResponseWriter, err error) { writeError(w, statusOf(err), err.Error()) }

// keyed wraps a control-plane handler with the API key check (X-API-Key).
func (s *Server) keyed(h func(w http.ResponseWriter, r *http.Request, tenant string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		tenant, ok := s.tenantOfKey(r.Header.Get("X-API-Key"))
		if !ok {
			writeError(w, http.StatusUnauthorized, "missing or unknown API key: send X-API-Key: e2b_... (roched's E2B_API_KEY, roche e2b env, or a tenant's token of that form)")
			return
		}
		h(w, r, tenant)
	}
}

func (s *Server) controlPlane() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /sandboxes", s.keyed(s.create))
	mux.HandleFunc("POST /v2/sandboxes", s.keyed(s.create))
	mux.HandleFunc("GET /sandboxes", s.keyed(s.listV1))
	mux.HandleFunc("GET /v2/sandboxes", s.keyed(s.list))
	mux.HandleFunc("GET /sandboxes/{id}", s.keyed(s.info))
	mux.HandleFunc("DELETE /sandboxes/{id}", s.keyed(s.kill))
	mux.HandleFunc("POST /sandboxes/{id}/timeout", s.keyed(s.setTimeout))
	mux.HandleFunc("POST /sandboxes/{id}/refreshes", s.keyed(s.setTimeout))
	mux.HandleFunc("POST /sandboxes/{id}/connect", s.keyed(s.connect))
	mux.HandleFunc("POST /v2/sandboxes/{id}/connect", s.keyed(s.connect))
	mux.HandleFunc("POST /sandboxes/{id}/pause", s.keyed(s.pause))
	mux.HandleFunc("POST /sandboxes/{id}/resume", s.keyed(s.connect))
	mux.HandleFunc("/", s.keyed(func(w http.ResponseWriter, r *http.Request, _ string) {
		writeError(w, http.StatusNotImplemented, fmt.Sprintf("%s %s is not served by roched's E2B listener (docs/e2b.md lists what is)", r.Method, r.URL.Path))
	}))
	return mux
}

// newSandbox is the create body (E2B's NewSandbox and NewSandboxV2).
type newSandbox struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int              `json:"timeout"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	AutoPause           bool              `json:"autoPause"`
	Secure              *bool             `json:"secure"`
	// Asked for, and not served: refused rather than ignored.
	MCP          json.RawMessage `json:"mcp"`
	Network      json.RawMessage `json:"network"`
	VolumeMounts json.RawMessage `json:"volumeMounts"`
	IAM          json.RawMessage `json:"iam"`
	AutoResume   json.RawMessage `json:"autoResume"`
}

// unserved names the first create setting roched does not serve, or "".
func (n newSandbox) unserved(t Template) string {
	given := func(r json.RawMessage) bool {
		s := strings.TrimSpace(string(r))
		return s != "" && s != "null" && s != "{}" && s != "[]"
	}
	switch {
	case given(n.MCP):
		return "mcp: roched runs no MCP gateway in sandboxes"
	case given(n.VolumeMounts):
		return "volumeMounts: E2B volumes are not served; Roche's workspaces are (docs/workspaces.md)"
	case given(n.IAM):
		return "iam: not served"
	case given(n.AutoResume):
		return "autoResume: not served"
	case given(n.Network) && t.Network:
		return "network rules: a template with a network has Roche's network, with no per-sandbox rules; use a template without one (no network at all)"
	}
	return ""
}

// sandboxJSON is E2B's Sandbox (create and connect responses).
type sandboxJSON struct {
	TemplateID      string `json:"templateID"`
	SandboxID       string `json:"sandboxID"`
	ClientID        string `json:"clientID"`
	EnvdVersion     string `json:"envdVersion"`
	EnvdAccessToken string `json:"envdAccessToken"`
	Domain          string `json:"domain"`
	Alias           string `json:"alias,omitempty"`
}

// clientID is what E2B's responses carry as clientID.
const clientID = "roched"

// maxBody bounds a control-plane request body.
const maxBody = 1 << 20

func decodeBody(r *http.Request, v any) error {
	b, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return err
	}
	if len(b) > maxBody {
		return fmt.Errorf("%w: request body over %d bytes", roche.ErrInvalidConfig, maxBody)
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%w: request body: %v", roche.ErrInvalidConfig, err)
	}
	return nil
}

// template resolves a template name (E2B's "name:tag" and "team/name" forms too).
func (s *Server) template(name string) (Template, string, error) {
	if name == "" {
		name = "base"
	}
	for _, n := range []string{name, strings.SplitN(name, ":", 2)[0], name[strings.LastIndex(name, "/")+1:]} {
		if t, ok := s.settings.Templates[n]; ok {
			return t, n, nil
		}
	}
	names := make([]string, 0, len(s.settings.Templates))
	for n := range s.settings.Templates {
		names = append(names, n)
	}
	sort.Strings(names)
	return Template{}, "", fmt.Errorf("%w: template %q is not one of roched's (%s): add it to the config file's \"e2b\" section (docs/e2b.md)",
		roche.ErrNotFound, name, strings.Join(names, ", "))
}

func (s *Server) create(w http.ResponseWriter, r *http.Request, tenant string) {
	var req newSandbox
	if err := decodeBody(r, &req); err != nil {
		writeErr(w, err)
		return
	}
	t, name, err := s.template(req.TemplateID)
	if err != nil {
		writeErr(w, err)
		return
	}
	if why := req.unserved(t); why != "" {
		writeError(w, http.StatusNotImplemented, why)
		return
	}
	if err := metadataKeys(req.Metadata); err != nil {
		writeErr(w, err)
		return
	}
	if req.AutoPause {
		writeError(w, http.StatusNotImplemented, "autoPause: roched destroys a sandbox at its timeout; it cannot keep it paused instead")
		return
	}
	cfg := roche.DefaultConfig()
	cfg.Image = t.Image
	cfg.Writable = !t.ReadOnly
	cfg.Network = t.Network
	cfg.Workdir = t.Workdir
	if t.Memory != "" {
		cfg.Memory = t.Memory
	}
	if t.CPUs > 0 {
		cfg.CPUs = t.CPUs
	}
	if t.PidsLimit > 0 {
		cfg.PidsLimit = t.PidsLimit
	}
	if t.Disk != "" {
		cfg.Disk = t.Disk
	}
	cfg.TimeoutSecs = 300 // E2B's default
	if req.Timeout != nil {
		if *req.Timeout <= 0 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("timeout %d: give a positive number of seconds", *req.Timeout))
			return
		}
		cfg.TimeoutSecs = *req.Timeout
	}
	// allow_internet_access=true is E2B's default, which older SDKs send on every
	// create: the template decides whether there is a network at all (Roche's default
	// is none), so it asks for nothing more. false takes a template's network away.
	if req.AllowInternetAccess != nil && !*req.AllowInternetAccess {
		cfg.Network = false
	}
	cfg.Env = req.EnvVars
	// The template's name is kept with the sandbox, as Roche's metadata, so that a
	// roched restarted on the same state still knows it (templateOf).
	cfg.Metadata = map[string]string{TemplateKey: name}
	maps.Copy(cfg.Metadata, req.Metadata)
	c, err := s.client(tenant)
	if err != nil {
		writeErr(w, err)
		return
	}
	sb, _, err := c.Create(r.Context(), t.Provider, cfg)
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.sandboxJSON(tenant, sb.ID, name))
}

func (s *Server) sandboxJSON(tenant, rid, template string) sandboxJSON {
	id := s.e2bID(tenant, rid)
	return sandboxJSON{
		TemplateID: template, SandboxID: id, ClientID: clientID, EnvdVersion: EnvdVersion,
		EnvdAccessToken: s.accessToken(id), Domain: s.domain,
	}
}

// roche is the Roche id of the sandbox a control-plane path names, when it is the
// caller's.
func (s *Server) rocheID(r *http.Request, tenant string) (string, error) {
	id := r.PathValue("id")
	t, rid, ok := s.parseID(id)
	if !ok || t != tenant {
		return "", fmt.Errorf("%w: sandbox %s not found", roche.ErrNotFound, id)
	}
	return rid, nil
}

// TemplateKey is the metadata key under which a sandbox made through the E2B listener
// keeps its template's name. E2B's metadata does not show it, and a create whose
// metadata names it is refused.
const TemplateKey = "e2b.template"

// templateOf names the template a sandbox was made from, or, for one not made through
// the listener, its image.
func (s *Server) templateOf(sb roche.SandboxInfo) string {
	if t, ok := sb.Metadata[TemplateKey]; ok {
		return t
	}
	return sb.Image
}

// listedSandbox is E2B's ListedSandbox and, with the access token, SandboxDetail.
type listedSandbox struct {
	TemplateID      string            `json:"templateID"`
	Alias           string            `json:"alias,omitempty"`
	SandboxID       string            `json:"sandboxID"`
	ClientID        string            `json:"clientID"`
	StartedAt       time.Time         `json:"startedAt"`
	EndAt           time.Time         `json:"endAt"`
	CPUCount        int               `json:"cpuCount"`
	MemoryMB        int               `json:"memoryMB"`
	DiskSizeMB      int               `json:"diskSizeMB"`
	Metadata        map[string]string `json:"metadata"`
	State           string            `json:"state"`
	EnvdVersion     string            `json:"envdVersion"`
	EnvdAccessToken string            `json:"envdAccessToken,omitempty"`
	Domain          string            `json:"domain,omitempty"`
}

// sizes are the CPUs, memory and disk (MiB) of a template's sandboxes: its limits, or
// Roche's defaults.
func (s *Server) sizes(template string) (cpus, memMB, diskMB int) {
	t := s.settings.Templates[template]
	c := cmp.Or(t.CPUs, roche.DefaultCPUs)
	cpus = int(math.Ceil(c))
	if m, err := size.Parse(cmp.Or(t.Memory, roche.DefaultMemory)); err == nil {
		memMB = int(m >> 20)
	}
	if d, err := size.Parse(cmp.Or(t.Disk, roche.DefaultDisk)); err == nil {
		diskMB = int(d >> 20)
	}
	return cpus, memMB, diskMB
}

func (s *Server) listed(tenant string, sb roche.SandboxInfo, detail bool) listedSandbox {
	state := "running"
	if sb.State == roche.StatePaused {
		state = "paused"
	}
	end := sb.ExpiresAt
	if end.IsZero() {
		end = sb.CreatedAt.Add(24 * time.Hour)
	}
	l := listedSandbox{
		TemplateID: s.templateOf(sb), SandboxID: s.e2bID(tenant, sb.ID), ClientID: clientID,
		StartedAt: sb.CreatedAt.UTC(), EndAt: end.UTC(),
		Metadata: map[string]string{}, State: state, EnvdVersion: EnvdVersion,
	}
	maps.Copy(l.Metadata, sb.Metadata)
	delete(l.Metadata, TemplateKey)
	l.CPUCount, l.MemoryMB, l.DiskSizeMB = s.sizes(l.TemplateID)
	if detail {
		l.EnvdAccessToken, l.Domain = s.accessToken(l.SandboxID), s.domain
	}
	return l
}

// metadataKeys refuses E2B metadata whose keys Roche cannot keep as they are (Roche's
// key grammar, docs/labels.md): a key is never rewritten, so that the sandbox lists and
// filters under the key it was given.
func metadataKeys(md map[string]string) error {
	if len(md) == 0 {
		return nil
	}
	if _, ok := md[TemplateKey]; ok {
		return fmt.Errorf("%w: metadata key %q is roched's own (the sandbox's template): rename the key", roche.ErrInvalidConfig, TemplateKey)
	}
	if err := (roche.ListFilter{Metadata: md}).Validate(); err != nil {
		return fmt.Errorf("%w (roched keeps E2B metadata as Roche's sandbox metadata, docs/labels.md: rename the key)", err)
	}
	return nil
}

// sandboxes lists tenant's live sandboxes whose metadata has every pair of md, oldest
// first.
func (s *Server) sandboxes(ctx context.Context, tenant string, md map[string]string) ([]roche.SandboxInfo, error) {
	p, err := s.provider(tenant)
	if err != nil {
		return nil, err
	}
	list, err := p.ListFiltered(ctx, roche.ListFilter{Metadata: md})
	// A provider that did not answer is left out of the list, as roche list does (the
	// log says which); any other error is the answer.
	var partial *roche.PartialError
	if err != nil && !errors.As(err, &partial) {
		return nil, err
	}
	if partial != nil {
		s.log.Warn("e2b list: providers left out", "err", err)
	}
	out := list[:0]
	for _, sb := range list {
		if sb.State == roche.StateRunning || sb.State == roche.StatePaused {
			out = append(out, sb)
		}
	}
	slices.SortFunc(out, func(a, b roche.SandboxInfo) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}

func (s *Server) listV1(w http.ResponseWriter, r *http.Request, tenant string) {
	list, err := s.sandboxes(r.Context(), tenant, nil)
	if err != nil {
		writeErr(w, err)
		return
	}
	out := []listedSandbox{}
	for _, sb := range list {
		if sb.State == roche.StateRunning {
			out = append(out, s.listed(tenant, sb, false))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// list is GET /v2/sandboxes: state and metadata filters, limit and nextToken paging
// (the token is the id of the next sandbox in creation order).
func (s *Server) list(w http.ResponseWriter, r *http.Request, tenant string) {
	q := r.URL.Query()
	// E2B's SDKs send the filter as one parameter, itself URL-encoded: metadata=k%3Dv%26k2%3Dv2.
	var md map[string]string
	if v := q.Get("metadata"); v != "" {
		pairs, err := url.ParseQuery(v)
		if err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("metadata filter %q: give URL-encoded key=value pairs joined by &", v))
			return
		}
		md = map[string]string{}
		for k, vs := range pairs {
			if len(vs) != 1 {
				writeError(w, http.StatusBadRequest, fmt.Sprintf("metadata filter %q: key %q is given %d times; give it once", v, k, len(vs)))
				return
			}
			md[k] = vs[0]
		}
		if err := metadataKeys(md); err != nil {
			writeErr(w, err)
			return
		}
	}
	states := map[string]bool{}
	for _, v := range q["state"] {
		for _, st := range strings.Split(v, ",") {
			states[st] = true
		}
	}
	limit := 100
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("limit %q: give 1 to 1000", v))
			return
		}
		limit = n
	}
	list, err := s.sandboxes(r.Context(), tenant, md)
	if err != nil {
		writeErr(w, err)
		return
	}
	if q.Get("order") == "desc" {
		slices.Reverse(list)
	}
	var match []listedSandbox
	for _, sb := range list {
		l := s.listed(tenant, sb, false)
		if len(states) > 0 && !states[l.State] {
			continue
		}
		if tpl := q.Get("template"); tpl != "" && l.TemplateID != tpl {
			continue
		}
		match = append(match, l)
	}
	start := 0
	if tok := q.Get("nextToken"); tok != "" {
		start = slices.IndexFunc(match, func(l listedSandbox) bool { return l.SandboxID == tok })
		if start < 0 {
			start = len(match) // that sandbox is gone: so is the rest of the page order
		}
	}
	page := match[start:]
	if len(page) > limit {
		w.Header().Set("X-Next-Token", page[limit].SandboxID)
		page = page[:limit]
	}
	if page == nil {
		page = []listedSandbox{}
	}
	writeJSON(w, http.StatusOK, page)
}

func (s *Server) inspect(r *http.Request, tenant string) (roche.SandboxInfo, error) {
	id, err := s.rocheID(r, tenant)
	if err != nil {
		return roche.SandboxInfo{}, err
	}
	ctx := r.Context()
	p, err := s.provider(tenant)
	if err != nil {
		return roche.SandboxInfo{}, err
	}
	sb, err := p.Inspect(ctx, id)
	if err == nil && sb.State != roche.StateRunning && sb.State != roche.StatePaused {
		err = fmt.Errorf("%w: sandbox %s is %s", roche.ErrNotFound, id, sb.State)
	}
	return sb, err
}

func (s *Server) info(w http.ResponseWriter, r *http.Request, tenant string) {
	sb, err := s.inspect(r, tenant)
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.listed(tenant, sb, true))
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request, tenant string) {
	// Roche's destroy is idempotent; E2B's kill of a sandbox that is gone is NotFound.
	sb, err := s.inspect(r, tenant)
	var p *client.Provider
	if err == nil {
		p, err = s.provider(tenant)
	}
	if err == nil {
		err = p.Destroy(r.Context(), sb.ID)
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// setTimeout is E2B's set_timeout ({"timeout": seconds}) and the older refresh
// ({"duration": seconds}): the sandbox ends that many seconds from now, sooner or later
// than it would have, within the tenant's maximum lifetime (docs/labels.md).
func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request, tenant string) {
	var req struct {
		Timeout  *int `json:"timeout"`
		Duration *int `json:"duration"`
	}
	if err := decodeBody(r, &req); err != nil {
		writeErr(w, err)
		return
	}
	secs := req.Timeout
	if strings.HasSuffix(r.URL.Path, "/refreshes") {
		secs = req.Duration
	}
	if secs == nil || *secs <= 0 {
		writeError(w, http.StatusBadRequest, "give the sandbox's new timeout as a positive number of seconds from now")
		return
	}
	sb, err := s.inspect(r, tenant)
	if err == nil {
		err = s.extend(r.Context(), tenant, sb.ID, *secs)
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// extend makes sandbox id end secs seconds from now.
func (s *Server) extend(ctx context.Context, tenant, id string, secs int) error {
	p, err := s.provider(tenant)
	if err != nil {
		return err
	}
	_, err = p.SetTimeout(ctx, id, time.Duration(secs)*time.Second)
	return err
}

// connect is E2B's connect (and the older resume): a paused sandbox is resumed.
func (s *Server) connect(w http.ResponseWriter, r *http.Request, tenant string) {
	var req struct {
		Timeout *int `json:"timeout"`
	}
	if err := decodeBody(r, &req); err != nil {
		writeErr(w, err)
		return
	}
	sb, err := s.inspect(r, tenant)
	if err != nil {
		writeErr(w, err)
		return
	}
	status := http.StatusOK
	if sb.State == roche.StatePaused {
		p, _ := s.provider(tenant)
		if err := p.Unpause(r.Context(), sb.ID); err != nil {
			writeErr(w, err)
			return
		}
		status = http.StatusCreated
	}
	if req.Timeout != nil && !sb.ExpiresAt.IsZero() && time.Until(sb.ExpiresAt) < time.Duration(*req.Timeout)*time.Second {
		// E2B's connect extends a sandbox's lifetime to at least the timeout, never
		// shortens it.
		if err := s.extend(r.Context(), tenant, sb.ID, *req.Timeout); err != nil {
			writeErr(w, err)
			return
		}
	}
	writeJSON(w, status, s.sandboxJSON(tenant, sb.ID, s.templateOf(sb)))
}

func (s *Server) pause(w http.ResponseWriter, r *http.Request, tenant string) {
	sb, err := s.inspect(r, tenant)
	if err != nil {
		writeErr(w, err)
		return
	}
	if sb.State == roche.StatePaused {
		writeError(w, http.StatusConflict, "sandbox "+r.PathValue("id")+" is already paused")
		return
	}
	p, _ := s.provider(tenant)
	if err := p.Pause(r.Context(), sb.ID); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
