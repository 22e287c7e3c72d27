package e2b

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/roche-sandbox/roche"
	fspb "github.com/roche-sandbox/roche/internal/e2b/envd/filesystem"
	"github.com/roche-sandbox/roche/internal/e2b/envd/filesystem/filesystemconnect"
	procpb "github.com/roche-sandbox/roche/internal/e2b/envd/process"
	"github.com/roche-sandbox/roche/internal/e2b/envd/process/processconnect"
)

// envd: E2B's in-sandbox API, served here on Roche's durable commands (process.Process)
// and files API (filesystem.Filesystem, /files). Each request names its sandbox in
// E2b-Sandbox-Id and carries the sandbox's access token.

// keepAliveInterval is how long a stream stays quiet before a keepalive event.
const keepAliveInterval = 10 * time.Second

type callKey struct{}

func withCall(ctx context.Context, c sandboxCall) context.Context {
	return context.WithValue(ctx, callKey{}, c)
}

// callOf is the sandbox call authSandbox put in the request's context.
func callOf(ctx context.Context) sandboxCall {
	c, _ := ctx.Value(callKey{}).(sandboxCall)
	return c
}

func (s *Server) envd() http.Handler {
	mux := http.NewServeMux()
	opts := []connect.HandlerOption{connect.WithReadMaxBytes(8 << 20)}
	mux.Handle(processconnect.NewProcessHandler(&processService{s: s}, opts...))
	mux.Handle(filesystemconnect.NewFilesystemHandler(&filesystemService{s: s}, opts...))
	mux.HandleFunc("GET /files", s.getFile)
	mux.HandleFunc("POST /files", s.postFiles)
	// E2B's SDKs take a 502 from /health for a sandbox that is not running (is_running).
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		c := callOf(r.Context())
		sb, err := c.p.Inspect(r.Context(), c.id)
		if err != nil || sb.State != roche.StateRunning {
			writeError(w, http.StatusBadGateway, "sandbox "+r.Header.Get("E2b-Sandbox-Id")+" is not running")
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, http.StatusNotImplemented, "envd /metrics: roched does not sample a sandbox's usage")
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		call, ok := s.authSandbox(w, r, true)
		if !ok {
			return
		}
		mux.ServeHTTP(w, r.WithContext(withCall(r.Context(), call)))
	})
}

// connectErr turns a Roche error into a Connect error of the code E2B's SDKs map.
func connectErr(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	code := connect.CodeInternal
	switch {
	case errors.Is(err, roche.ErrNotFound):
		code = connect.CodeNotFound
	case errors.Is(err, roche.ErrInvalidConfig):
		code = connect.CodeInvalidArgument
	case errors.Is(err, roche.ErrPermission):
		code = connect.CodePermissionDenied
	case errors.Is(err, roche.ErrExhausted):
		code = connect.CodeResourceExhausted
	case errors.Is(err, roche.ErrUnavailable):
		code = connect.CodeUnavailable
	case errors.Is(err, roche.ErrUnsupported):
		code = connect.CodeUnimplemented
	case errors.Is(err, roche.ErrInUse):
		code = connect.CodeFailedPrecondition
	case errors.Is(err, roche.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		code = connect.CodeDeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = connect.CodeCanceled
	}
	return connect.NewError(code, err)
}

// ---- process.Process ----

type processService struct {
	processconnect.UnimplementedProcessHandler
	s *Server
}

func selector(sel *procpb.ProcessSelector) (roche.CommandSelector, error) {
	switch v := sel.GetSelector().(type) {
	case *procpb.ProcessSelector_Pid:
		return roche.CommandSelector{PID: int(v.Pid)}, nil
	case *procpb.ProcessSelector_Tag:
		return roche.CommandSelector{Tag: v.Tag}, nil
	}
	return roche.CommandSelector{}, connect.NewError(connect.CodeInvalidArgument, errors.New("name the process by its pid or its tag"))
}

// eventSender serialises a stream's sends: output and keepalives come from different
// goroutines.
type eventSender struct {
	mu   sync.Mutex
	send func(*procpb.ProcessEvent) error
	last time.Time
}

func (e *eventSender) event(ev *procpb.ProcessEvent) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.last = time.Now()
	return e.send(ev)
}

// keepAlive sends keepalive events while the stream is quiet, until stop.
func (e *eventSender) keepAlive() (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(keepAliveInterval / 2)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				e.mu.Lock()
				quiet := now.Sub(e.last) >= keepAliveInterval
				e.mu.Unlock()
				if quiet {
					_ = e.event(&procpb.ProcessEvent{Event: &procpb.ProcessEvent_Keepalive{Keepalive: &procpb.ProcessEvent_KeepAlive{}}})
				}
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

// follow streams a command's output from offsets and then its end.
func follow(ctx context.Context, call sandboxCall, pid int, from roche.CommandOffsets, e *eventSender) error {
	if err := e.event(&procpb.ProcessEvent{Event: &procpb.ProcessEvent_Start{Start: &procpb.ProcessEvent_StartEvent{Pid: uint32(pid)}}}); err != nil {
		return err
	}
	stop := e.keepAlive()
	end, err := call.p.ConnectCommand(ctx, call.id, roche.CommandSelector{PID: pid}, from, roche.CommandOutput{
		Data: func(stream roche.Stream, _ int64, data []byte) error {
			d := &procpb.ProcessEvent_DataEvent{}
			if stream == roche.StreamStderr {
				d.Output = &procpb.ProcessEvent_DataEvent_Stderr{Stderr: data}
			} else {
				d.Output = &procpb.ProcessEvent_DataEvent_Stdout{Stdout: data}
			}
			return e.event(&procpb.ProcessEvent{Event: &procpb.ProcessEvent_Data{Data: d}})
		},
	})
	stop()
	if err != nil {
		return connectErr(err)
	}
	return e.event(&procpb.ProcessEvent{Event: &procpb.ProcessEvent_End{End: endEvent(end)}})
}

// endEvent is how envd reports an end: exited and "exit status N", or a signal.
func endEvent(end roche.CommandEnd) *procpb.ProcessEvent_EndEvent {
	ev := &procpb.ProcessEvent_EndEvent{ExitCode: int32(end.ExitCode), Exited: end.Signal == 0 && end.Unknown == ""}
	switch {
	case end.Unknown != "":
		ev.Status = "unknown"
		ev.Error = &end.Unknown
	case end.Signal != 0:
		ev.Status = "signal: " + syscall.Signal(end.Signal).String()
	default:
		ev.Status = fmt.Sprintf("exit status %d", end.ExitCode)
	}
	if end.TimedOut {
		msg := "killed at its timeout"
		ev.Error = &msg
	}
	return ev
}

func (p *processService) Start(ctx context.Context, req *connect.Request[procpb.StartRequest], stream *connect.ServerStream[procpb.StartResponse]) error {
	call := callOf(ctx)
	if req.Msg.Pty != nil {
		return connect.NewError(connect.CodeUnimplemented, errors.New("pty: roched's E2B listener starts commands without a terminal; use roche shell or Roche's CreatePty for one"))
	}
	cfg := req.Msg.GetProcess()
	if cfg.GetCmd() == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd is empty"))
	}
	cr := roche.CommandRequest{
		Cmd: append([]string{cfg.GetCmd()}, cfg.GetArgs()...), Env: cfg.GetEnvs(), Workdir: cfg.GetCwd(),
		Tag: req.Msg.GetTag(), Stdin: req.Msg.GetStdin(),
	}
	cmd, err := call.p.StartCommand(ctx, call.id, cr)
	if err != nil {
		return connectErr(err)
	}
	e := &eventSender{send: func(ev *procpb.ProcessEvent) error { return stream.Send(&procpb.StartResponse{Event: ev}) }}
	return follow(ctx, call, cmd.PID, roche.CommandOffsets{}, e)
}

func (p *processService) Connect(ctx context.Context, req *connect.Request[procpb.ConnectRequest], stream *connect.ServerStream[procpb.ConnectResponse]) error {
	call := callOf(ctx)
	sel, err := selector(req.Msg.GetProcess())
	if err != nil {
		return err
	}
	cmds, err := call.p.Commands(ctx, call.id)
	if err != nil {
		return connectErr(err)
	}
	var found *roche.Command
	for i := range cmds {
		c := &cmds[i]
		if (sel.PID != 0 && c.PID == sel.PID) || (sel.Tag != "" && c.Tag == sel.Tag && (found == nil || c.StartedAt.After(found.StartedAt))) {
			found = c
		}
	}
	if found == nil || !found.Running {
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("process %s not found (or it has ended)", sel))
	}
	e := &eventSender{send: func(ev *procpb.ProcessEvent) error { return stream.Send(&procpb.ConnectResponse{Event: ev}) }}
	// envd's Connect streams what the process writes from now on, not what it wrote.
	return follow(ctx, call, found.PID, found.Written, e)
}

func (p *processService) List(ctx context.Context, _ *connect.Request[procpb.ListRequest]) (*connect.Response[procpb.ListResponse], error) {
	call := callOf(ctx)
	cmds, err := call.p.Commands(ctx, call.id)
	if err != nil {
		return nil, connectErr(err)
	}
	resp := &procpb.ListResponse{}
	for _, c := range cmds {
		if !c.Running || c.TTY {
			continue
		}
		info := &procpb.ProcessInfo{Pid: uint32(c.PID), Config: &procpb.ProcessConfig{Envs: c.Env}}
		if len(c.Cmd) > 0 {
			info.Config.Cmd, info.Config.Args = c.Cmd[0], c.Cmd[1:]
		}
		if c.Workdir != "" {
			info.Config.Cwd = &c.Workdir
		}
		if c.Tag != "" {
			info.Tag = &c.Tag
		}
		resp.Processes = append(resp.Processes, info)
	}
	return connect.NewResponse(resp), nil
}

func stdinOf(in *procpb.ProcessInput) ([]byte, error) {
	switch v := in.GetInput().(type) {
	case *procpb.ProcessInput_Stdin:
		return v.Stdin, nil
	case *procpb.ProcessInput_Pty:
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("pty input: roched's E2B listener starts no terminals"))
	}
	return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("input is empty"))
}

func (p *processService) SendInput(ctx context.Context, req *connect.Request[procpb.SendInputRequest]) (*connect.Response[procpb.SendInputResponse], error) {
	call := callOf(ctx)
	sel, err := selector(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	data, err := stdinOf(req.Msg.GetInput())
	if err != nil {
		return nil, err
	}
	if err := call.p.SendCommandInput(ctx, call.id, sel, data); err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&procpb.SendInputResponse{}), nil
}

func (p *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[procpb.StreamInputRequest]) (*connect.Response[procpb.StreamInputResponse], error) {
	call := callOf(ctx)
	var sel roche.CommandSelector
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *procpb.StreamInputRequest_Start:
			s, err := selector(ev.Start.GetProcess())
			if err != nil {
				return nil, err
			}
			sel = s
		case *procpb.StreamInputRequest_Data:
			if sel == (roche.CommandSelector{}) {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("input before the start event that names the process"))
			}
			data, err := stdinOf(ev.Data.GetInput())
			if err != nil {
				return nil, err
			}
			if err := call.p.SendCommandInput(ctx, call.id, sel, data); err != nil {
				return nil, connectErr(err)
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&procpb.StreamInputResponse{}), nil
}

func (p *processService) SendSignal(ctx context.Context, req *connect.Request[procpb.SendSignalRequest]) (*connect.Response[procpb.SendSignalResponse], error) {
	call := callOf(ctx)
	sel, err := selector(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	sig := int(req.Msg.GetSignal())
	if sig != int(syscall.SIGKILL) && sig != int(syscall.SIGTERM) {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("signal %d: give SIGKILL or SIGTERM", sig))
	}
	if err := call.p.SignalCommand(ctx, call.id, sel, sig); err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&procpb.SendSignalResponse{}), nil
}

func (p *processService) CloseStdin(ctx context.Context, req *connect.Request[procpb.CloseStdinRequest]) (*connect.Response[procpb.CloseStdinResponse], error) {
	call := callOf(ctx)
	sel, err := selector(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := call.p.CloseCommandInput(ctx, call.id, sel); err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&procpb.CloseStdinResponse{}), nil
}

func (p *processService) Update(context.Context, *connect.Request[procpb.UpdateRequest]) (*connect.Response[procpb.UpdateResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("update resizes a pty, and roched's E2B listener starts no terminals"))
}

// ---- filesystem.Filesystem ----

type filesystemService struct {
	filesystemconnect.UnimplementedFilesystemHandler
	s *Server
}

// sandboxPath makes an E2B path absolute: a relative one is relative to the home of
// E2B's default user, /home/user, as envd reads it.
func sandboxPath(p string) (string, error) {
	if p == "" {
		return "", connect.NewError(connect.CodeInvalidArgument, errors.New("path is empty"))
	}
	if !strings.HasPrefix(p, "/") {
		p = path.Join(homeDir, p)
	}
	return p, nil
}

// homeDir is where relative paths lead.
const homeDir = "/home/user"

func entryInfo(fi roche.FileInfo) *fspb.EntryInfo {
	e := &fspb.EntryInfo{
		Name: fi.Name, Path: fi.Path, Size: fi.Size, Mode: uint32(fi.Mode.Perm()),
		Permissions: fi.Mode.String(), Owner: fi.Owner, Group: fi.Group,
		ModifiedTime: timestamppb.New(fi.ModTime),
	}
	if e.Name == "" {
		e.Name = path.Base(fi.Path)
	}
	switch {
	case fi.Symlink != "" || fi.Mode&fs.ModeSymlink != 0:
		e.Type, e.IsSymlink = fspb.FileType_FILE_TYPE_SYMLINK, true
		if fi.Symlink != "" {
			e.SymlinkTarget = &fi.Symlink
		}
		if fi.IsDir {
			e.Type = fspb.FileType_FILE_TYPE_DIRECTORY
		} else {
			e.Type = fspb.FileType_FILE_TYPE_FILE
		}
	case fi.IsDir:
		e.Type = fspb.FileType_FILE_TYPE_DIRECTORY
	default:
		e.Type = fspb.FileType_FILE_TYPE_FILE
	}
	return e
}

func (f *filesystemService) Stat(ctx context.Context, req *connect.Request[fspb.StatRequest]) (*connect.Response[fspb.StatResponse], error) {
	call := callOf(ctx)
	p, err := sandboxPath(req.Msg.Path)
	if err != nil {
		return nil, err
	}
	fi, err := call.p.Stat(ctx, call.id, p)
	if err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&fspb.StatResponse{Entry: entryInfo(fi)}), nil
}

func (f *filesystemService) MakeDir(ctx context.Context, req *connect.Request[fspb.MakeDirRequest]) (*connect.Response[fspb.MakeDirResponse], error) {
	call := callOf(ctx)
	p, err := sandboxPath(req.Msg.Path)
	if err != nil {
		return nil, err
	}
	fi, made, err := call.p.MakeDir(ctx, call.id, p)
	if err != nil {
		return nil, connectErr(err)
	}
	if !made {
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory %s already exists", p))
	}
	return connect.NewResponse(&fspb.MakeDirResponse{Entry: entryInfo(fi)}), nil
}

func (f *filesystemService) Move(ctx context.Context, req *connect.Request[fspb.MoveRequest]) (*connect.Response[fspb.MoveResponse], error) {
	call := callOf(ctx)
	src, err := sandboxPath(req.Msg.Source)
	if err != nil {
		return nil, err
	}
	dst, err := sandboxPath(req.Msg.Destination)
	if err != nil {
		return nil, err
	}
	if err := call.p.Rename(ctx, call.id, src, dst); err != nil {
		return nil, connectErr(err)
	}
	fi, err := call.p.Stat(ctx, call.id, dst)
	if err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&fspb.MoveResponse{Entry: entryInfo(fi)}), nil
}

func (f *filesystemService) ListDir(ctx context.Context, req *connect.Request[fspb.ListDirRequest]) (*connect.Response[fspb.ListDirResponse], error) {
	call := callOf(ctx)
	p, err := sandboxPath(req.Msg.Path)
	if err != nil {
		return nil, err
	}
	depth := max(int(req.Msg.Depth), 1)
	resp := &fspb.ListDirResponse{}
	err = call.p.WalkDir(ctx, call.id, p, depth, roche.MaxListEntries, func(fi roche.FileInfo) error {
		resp.Entries = append(resp.Entries, entryInfo(fi))
		return nil
	})
	if err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(resp), nil
}

func (f *filesystemService) Remove(ctx context.Context, req *connect.Request[fspb.RemoveRequest]) (*connect.Response[fspb.RemoveResponse], error) {
	call := callOf(ctx)
	p, err := sandboxPath(req.Msg.Path)
	if err != nil {
		return nil, err
	}
	if err := call.p.Remove(ctx, call.id, p); err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&fspb.RemoveResponse{}), nil
}

var eventTypes = map[roche.FileOp]fspb.EventType{
	roche.FileCreate: fspb.EventType_EVENT_TYPE_CREATE,
	roche.FileWrite:  fspb.EventType_EVENT_TYPE_WRITE,
	roche.FileRemove: fspb.EventType_EVENT_TYPE_REMOVE,
	roche.FileRename: fspb.EventType_EVENT_TYPE_RENAME,
	roche.FileChmod:  fspb.EventType_EVENT_TYPE_CHMOD,
}

func fsEvent(ev roche.FileEvent) (*fspb.FilesystemEvent, bool) {
	t, ok := eventTypes[ev.Op]
	return &fspb.FilesystemEvent{Name: ev.Name, Type: t}, ok
}

func checkWatch(include, network bool) error {
	if include {
		return connect.NewError(connect.CodeUnimplemented, errors.New("include_entry: roched's events carry no entry (envd 0.6.3); stat the path instead"))
	}
	_ = network // the files API watches whatever file system the path is on
	return nil
}

func (f *filesystemService) WatchDir(ctx context.Context, req *connect.Request[fspb.WatchDirRequest], stream *connect.ServerStream[fspb.WatchDirResponse]) error {
	call := callOf(ctx)
	p, err := sandboxPath(req.Msg.Path)
	if err != nil {
		return err
	}
	if err := checkWatch(req.Msg.IncludeEntry, req.Msg.AllowNetworkMounts); err != nil {
		return err
	}
	var mu sync.Mutex
	send := func(r *fspb.WatchDirResponse) error {
		mu.Lock()
		defer mu.Unlock()
		return stream.Send(r)
	}
	var sendErr error
	err = call.p.WatchDir(ctx, call.id, p, roche.WatchOptions{
		Recursive: req.Msg.Recursive,
		Started: func() {
			sendErr = send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Start{Start: &fspb.WatchDirResponse_StartEvent{}}})
		},
	}, func(ev roche.FileEvent) error {
		if sendErr != nil {
			return sendErr
		}
		fe, ok := fsEvent(ev)
		if !ok {
			return nil // an overflow: envd has no event for it
		}
		return send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Filesystem{Filesystem: fe}})
	})
	if err != nil && ctx.Err() == nil {
		return connectErr(err)
	}
	return nil
}

func (f *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[fspb.CreateWatcherRequest]) (*connect.Response[fspb.CreateWatcherResponse], error) {
	call := callOf(ctx)
	p, err := sandboxPath(req.Msg.Path)
	if err != nil {
		return nil, err
	}
	if err := checkWatch(req.Msg.IncludeEntry, req.Msg.AllowNetworkMounts); err != nil {
		return nil, err
	}
	c, err := f.s.client(call.tenant)
	if err != nil {
		return nil, connectErr(err)
	}
	wid, err := c.CreateWatcher(ctx, call.id, p, req.Msg.Recursive)
	if err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&fspb.CreateWatcherResponse{WatcherId: wid}), nil
}

func (f *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[fspb.GetWatcherEventsRequest]) (*connect.Response[fspb.GetWatcherEventsResponse], error) {
	call := callOf(ctx)
	c, err := f.s.client(call.tenant)
	if err != nil {
		return nil, connectErr(err)
	}
	evs, err := c.WatcherEvents(ctx, req.Msg.WatcherId)
	if err != nil {
		return nil, connectErr(err)
	}
	resp := &fspb.GetWatcherEventsResponse{}
	for _, ev := range evs {
		if fe, ok := fsEvent(ev); ok {
			resp.Events = append(resp.Events, fe)
		}
	}
	return connect.NewResponse(resp), nil
}

func (f *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[fspb.RemoveWatcherRequest]) (*connect.Response[fspb.RemoveWatcherResponse], error) {
	call := callOf(ctx)
	c, err := f.s.client(call.tenant)
	if err != nil {
		return nil, connectErr(err)
	}
	if err := c.RemoveWatcher(ctx, req.Msg.WatcherId); err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&fspb.RemoveWatcherResponse{}), nil
}
