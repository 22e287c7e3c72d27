package wire

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/provider/kit"
)

// Each test fills every field of one side with a value that is not its zero, converts
// there and back, and wants it all again: a field that exists on one side only (or that
// a converter forgets) comes back zero and fails the test by name.

// offWire names the Go fields that deliberately do not cross the wire: a reader or a
// writer cannot; stdin travels as bytes beside the request, the output as chunks. A
// config's owner is not one of its fields at all: roched sets it, never a caller
// (SandboxInfo.Owner does cross).
// StreamOnly says what each side keeps of the output it passes on, which is its own
// business: the daemon's ExecStream keeps none, the client decides for itself.
var offWire = map[string]bool{
	"ExecRequest.Stdin": true, "ExecRequest.Stdout": true, "ExecRequest.Stderr": true,
	"ExecRequest.StreamOnly": true,
	"CodeRequest.Stdout":     true, "CodeRequest.Stderr": true, "CodeRequest.OnResult": true,
	// roched sets a command's bound itself (--max-commands); a caller cannot.
	"CommandRequest.MaxRunning": true,
}

func TestGoToProtoAndBack(t *testing.T) {
	roundTrip(t, func(c roche.Config) roche.Config {
		got, leased := ConfigFromProto(ConfigToProto(c, true))
		if !leased {
			t.Error("a leased create came back unleased")
		}
		return got
	})
	roundTrip(t, func(i roche.SandboxInfo) roche.SandboxInfo {
		// An end's kind is an enum on the wire: a valid one goes (fillGo's would read
		// back unknown), and comes back as fillGo made it if it survived.
		end := *i.End
		kind := end.Kind
		end.Kind = roche.EndOOM
		i.End = &end
		got := InfoFromProto(InfoToProto(i))
		if got.End != nil && got.End.Kind == roche.EndOOM {
			got.End.Kind = kind
		}
		return got
	})
	roundTrip(t, func(r roche.ExecResult) roche.ExecResult {
		// The receipt's end is that enum too, as the sandbox's above.
		rc := *r.Receipt
		kind := rc.End
		rc.End = roche.EndOOM
		r.Receipt = &rc
		got := ResultFromProto(ResultToProto(r, true))
		if got.Receipt != nil && got.Receipt.End == roche.EndOOM {
			got.Receipt.End = kind
		}
		return got
	})
	roundTrip(t, func(c roche.Capabilities) roche.Capabilities { return CapsFromProto(CapsToProto(c)) })
	roundTrip(t, func(w roche.Workspace) roche.Workspace { return WorkspaceFromProto(WorkspaceToProto(w)) })
	roundTrip(t, func(s roche.Snapshot) roche.Snapshot { return SnapshotFromProto(SnapshotToProto(s)) })
	roundTrip(t, func(e roche.Execution) roche.Execution { return ExecutionFromProto(ExecutionToProto(e, true)) })
	roundTrip(t, func(c roche.CodeContext) roche.CodeContext { return ContextFromProto(ContextToProto(c)) })
	roundTrip(t, func(o roche.ContextOptions) roche.ContextOptions {
		return ContextOptionsFromProto(ContextOptionsToProto("sb", o))
	})
	t.Run("RunCode", func(t *testing.T) {
		roundTrip(t, func(r roche.CodeRequest) roche.CodeRequest {
			r.Language, r.Cwd = roche.LanguageBash, "/x" // valid ones; fillGo's would be refused
			got, err := CodeFromProto(CodeToProto("sb", r))
			if err != nil {
				t.Fatal(err)
			}
			got.Language, got.Cwd = "x-string", "x-string"
			return got
		})
	})
	for name, toProto := range map[string]func(string, roche.ExecRequest, []byte) ExecParams{
		"Exec":       func(id string, r roche.ExecRequest, in []byte) ExecParams { return ExecToProto(id, r, in) },
		"ExecStream": func(id string, r roche.ExecRequest, in []byte) ExecParams { return ExecStreamToProto(id, r, in) },
	} {
		t.Run(name, func(t *testing.T) {
			roundTrip(t, func(r roche.ExecRequest) roche.ExecRequest {
				got, err := ExecFromProto(toProto("sb", r, []byte("input")))
				if err != nil {
					t.Fatal(err)
				}
				if in, _ := io.ReadAll(got.Stdin); string(in) != "input" {
					t.Errorf("stdin came back as %q, want %q", in, "input")
				}
				return got
			})
		})
	}
}

func roundTrip[T any](t *testing.T, there func(T) T) {
	t.Helper()
	var want T
	fillGo(reflect.ValueOf(&want).Elem())
	got := there(want)
	gv, wv := reflect.ValueOf(got), reflect.ValueOf(want)
	typ := wv.Type()
	for i := range typ.NumField() {
		f := typ.Field(i)
		if !f.IsExported() || offWire[typ.Name()+"."+f.Name] {
			continue
		}
		if !equalGo(gv.Field(i), wv.Field(i)) {
			t.Errorf("%s.%s did not survive the wire: sent %v, got %v (a field on one side only, or a converter that forgets it)",
				typ.Name(), f.Name, wv.Field(i).Interface(), gv.Field(i).Interface())
		}
	}
}

func equalGo(a, b reflect.Value) bool {
	if ta, ok := a.Interface().(time.Time); ok {
		return ta.Equal(b.Interface().(time.Time))
	}
	return reflect.DeepEqual(a.Interface(), b.Interface())
}

var (
	timeType  = reflect.TypeOf(time.Time{})
	stateType = reflect.TypeOf(roche.StateRunning)
)

// fillGo sets every exported field to a valid value that is not the zero value.
func fillGo(v reflect.Value) {
	switch {
	case v.Type() == timeType:
		v.Set(reflect.ValueOf(time.Date(2026, 11, 23, 10, 8, 0, 123456789, time.Local)))
		return
	case v.Type() == stateType:
		v.Set(reflect.ValueOf(roche.StatePaused))
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fillGo(v.Field(i))
			}
		}
	case reflect.String:
		v.SetString("x-" + v.Type().Name())
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int32, reflect.Int64:
		v.SetInt(7)
		if v.Type() == reflect.TypeOf(time.Duration(0)) {
			v.SetInt(int64(1500 * time.Millisecond))
		}
	case reflect.Uint32, reflect.Uint8:
		v.SetUint(7)
	case reflect.Float64:
		v.SetFloat(1.5)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 1, 1)
		fillGo(s.Index(0))
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fillGo(k)
		fillGo(e)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		fillGo(p.Elem())
		v.Set(p)
	case reflect.Interface, reflect.Func:
		// Readers, writers and callbacks: see offWire.
	default:
		panic(fmt.Sprintf("fillGo: no value for %s", v.Type()))
	}
}

func TestProtoToGoAndBack(t *testing.T) {
	check := func(want proto.Message, there func(proto.Message) proto.Message) {
		t.Helper()
		fillProto(want.ProtoReflect())
		got := there(want)
		fields := want.ProtoReflect().Descriptor().Fields()
		for i := range fields.Len() {
			fd := fields.Get(i)
			w, g := want.ProtoReflect().Get(fd), got.ProtoReflect().Get(fd)
			if !g.Equal(w) {
				t.Errorf("%s.%s did not survive the core's types: sent %v, got %v (a field on one side only, or a converter that forgets it)",
					want.ProtoReflect().Descriptor().Name(), fd.Name(), w, g)
			}
		}
	}
	check(&rochev1.SandboxConfig{}, func(m proto.Message) proto.Message {
		return ConfigToProto(ConfigFromProto(m.(*rochev1.SandboxConfig)))
	})
	check(&rochev1.Sandbox{}, func(m proto.Message) proto.Message { return InfoToProto(InfoFromProto(m.(*rochev1.Sandbox))) })
	check(&rochev1.ExecResult{}, func(m proto.Message) proto.Message {
		return ResultToProto(ResultFromProto(m.(*rochev1.ExecResult)), true)
	})
	check(&rochev1.Capabilities{}, func(m proto.Message) proto.Message {
		return CapsToProto(CapsFromProto(m.(*rochev1.Capabilities)))
	})
	check(&rochev1.Workspace{}, func(m proto.Message) proto.Message {
		return WorkspaceToProto(WorkspaceFromProto(m.(*rochev1.Workspace)))
	})
	check(&rochev1.Snapshot{}, func(m proto.Message) proto.Message {
		return SnapshotToProto(SnapshotFromProto(m.(*rochev1.Snapshot)))
	})
	check(&rochev1.CodeExecution{}, func(m proto.Message) proto.Message {
		return ExecutionToProto(ExecutionFromProto(m.(*rochev1.CodeExecution)), true)
	})
	check(&rochev1.CodeContext{}, func(m proto.Message) proto.Message {
		return ContextToProto(ContextFromProto(m.(*rochev1.CodeContext)))
	})
	check(&rochev1.CreateContextRequest{}, func(m proto.Message) proto.Message {
		pb := m.(*rochev1.CreateContextRequest)
		return ContextOptionsToProto(pb.SandboxId, ContextOptionsFromProto(pb))
	})
	check(&rochev1.RunCodeRequest{}, func(m proto.Message) proto.Message {
		pb := m.(*rochev1.RunCodeRequest)
		lang, cwd := pb.Language, pb.Cwd
		pb.Language, pb.Cwd = roche.LanguagePython, "/x"
		r, err := CodeFromProto(pb)
		if err != nil {
			t.Fatal(err)
		}
		back := CodeToProto(pb.SandboxId, r)
		pb.Language, back.Language, pb.Cwd, back.Cwd = lang, lang, cwd, cwd
		return back
	})
	execBack := func(pb ExecParams) roche.ExecRequest {
		r, err := ExecFromProto(pb)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	stdinOf := func(r roche.ExecRequest) []byte {
		b, _ := io.ReadAll(r.Stdin)
		return b
	}
	check(&rochev1.ExecRequest{}, func(m proto.Message) proto.Message {
		pb := m.(*rochev1.ExecRequest)
		r := execBack(pb)
		return ExecToProto(pb.SandboxId, r, stdinOf(r))
	})
	check(&rochev1.ExecStreamRequest{}, func(m proto.Message) proto.Message {
		pb := m.(*rochev1.ExecStreamRequest)
		r := execBack(pb)
		return ExecStreamToProto(pb.SandboxId, r, stdinOf(r))
	})
}

// fillProto sets every field of m to a value that is not its default.
func fillProto(m protoreflect.Message) {
	switch m.Interface().(type) {
	case *timestamppb.Timestamp:
		m.Set(m.Descriptor().Fields().ByName("seconds"), protoreflect.ValueOfInt64(1795000000))
		m.Set(m.Descriptor().Fields().ByName("nanos"), protoreflect.ValueOfInt32(5))
		return
	case *durationpb.Duration:
		m.Set(m.Descriptor().Fields().ByName("seconds"), protoreflect.ValueOfInt64(3))
		return
	}
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		switch {
		case fd.IsMap():
			mp := m.Mutable(fd).Map()
			mp.Set(protoreflect.ValueOfString("k").MapKey(), scalar(fd.MapValue()))
		case fd.IsList():
			l := m.Mutable(fd).List()
			if fd.Kind() == protoreflect.MessageKind {
				e := l.NewElement()
				fillProto(e.Message())
				l.Append(e)
			} else {
				l.Append(scalar(fd))
			}
		case fd.Kind() == protoreflect.MessageKind:
			fillProto(m.Mutable(fd).Message())
		default:
			m.Set(fd, scalar(fd))
		}
	}
}

func scalar(fd protoreflect.FieldDescriptor) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.StringKind:
		return protoreflect.ValueOfString("x-" + string(fd.Name()))
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.Int32Kind, protoreflect.Sint32Kind:
		return protoreflect.ValueOfInt32(7)
	case protoreflect.Uint32Kind:
		return protoreflect.ValueOfUint32(7)
	case protoreflect.Int64Kind:
		return protoreflect.ValueOfInt64(7)
	case protoreflect.Uint64Kind:
		return protoreflect.ValueOfUint64(7)
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(1.5)
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte("x"))
	case protoreflect.EnumKind:
		return protoreflect.ValueOfEnum(fd.Enum().Values().Get(1).Number())
	}
	panic(fmt.Sprintf("scalar: no value for %s (%s)", fd.FullName(), fd.Kind()))
}

func TestErrorsRoundTrip(t *testing.T) {
	for _, s := range sentinels {
		err := fmt.Errorf("creating sandbox: %w: details", s.err)
		var ce *connect.Error
		if !errors.As(ToStatus(err), &ce) {
			t.Fatalf("ToStatus(%v) is not a connect error", err)
		}
		if ce.Code() != s.code {
			t.Errorf("%v: code %v, want %v", s.err, ce.Code(), s.code)
		}
		if ce.Message() != err.Error() {
			t.Errorf("%v: message %q, want the core's %q", s.err, ce.Message(), err.Error())
		}
		got, withDetail := FromStatus(ce)
		if !errors.Is(got, s.err) || !withDetail {
			t.Errorf("%v came back as %v (detail %v)", s.err, got, withDetail)
		}
	}
	// Not set up is unavailable too, both ways; a bare UNAVAILABLE is only unavailable.
	got, _ := FromStatus(ToStatus(kit.NotConfigured(fmt.Errorf("%w: no cluster", roche.ErrUnavailable))).(*connect.Error))
	if !errors.Is(got, roche.ErrNotConfigured) || !errors.Is(got, roche.ErrUnavailable) {
		t.Errorf("a provider not set up came back as %v", got)
	}
	if got, _ := FromStatus(connect.NewError(connect.CodeUnavailable, errors.New("x"))); got != roche.ErrUnavailable {
		t.Errorf("bare UNAVAILABLE came back as %v", got)
	}
}

// TestSkippedRoundTrip: the providers a list skipped, both ways: names, texts and
// sentinels kept; none skipped is none either way.
func TestSkippedRoundTrip(t *testing.T) {
	pe := &roche.PartialError{Skipped: []roche.SkippedProvider{
		{Provider: "docker", Err: fmt.Errorf("%w: the Docker engine is not answering", roche.ErrUnavailable)},
		{Provider: "kubernetes", Err: fmt.Errorf("listing: %w", roche.ErrTimeout)},
	}}
	back := SkippedFromProto(SkippedToProto(pe))
	var got *roche.PartialError
	if !errors.As(back, &got) || len(got.Skipped) != 2 {
		t.Fatalf("came back as %v", back)
	}
	for i, s := range pe.Skipped {
		g := got.Skipped[i]
		if g.Provider != s.Provider || g.Err.Error() != s.Err.Error() {
			t.Errorf("%d: %s %q, want %s %q", i, g.Provider, g.Err, s.Provider, s.Err)
		}
	}
	if !errors.Is(got.Skipped[0].Err, roche.ErrUnavailable) || !errors.Is(got.Skipped[1].Err, roche.ErrTimeout) {
		t.Errorf("sentinels lost: %v", got.Skipped)
	}
	if SkippedToProto(nil) != nil || SkippedToProto(errors.New("x")) != nil || SkippedFromProto(nil) != nil {
		t.Error("nothing skipped did not stay nothing")
	}
	// Without a detail the code alone decides, where it names one sentinel.
	if got, _ := FromStatus(connect.NewError(connect.CodeNotFound, errors.New("x"))); got != roche.ErrNotFound {
		t.Errorf("bare NOT_FOUND came back as %v", got)
	}
	if got, _ := FromStatus(connect.NewError(connect.CodeFailedPrecondition, errors.New("x"))); got != nil {
		t.Errorf("bare FAILED_PRECONDITION stands for two sentinels, came back as %v", got)
	}
	var ce *connect.Error
	if !errors.As(ToStatus(fmt.Errorf("waiting: %w", context.DeadlineExceeded)), &ce) || ce.Code() != connect.CodeDeadlineExceeded {
		t.Errorf("a context deadline became %v", ToStatus(context.DeadlineExceeded))
	}
	if ToStatus(nil) != nil {
		t.Error("ToStatus(nil) is not nil")
	}
}

// TestRetryHintRoundTrip: a refusal's hint of when to retry goes out as a RetryInfo
// detail beside the sentinel's, and only when the core error carries one.
func TestRetryHintRoundTrip(t *testing.T) {
	err := kit.RetryAfter(fmt.Errorf("%w: pool docker/img: queue full", roche.ErrExhausted), 250*time.Millisecond)
	var ce *connect.Error
	if !errors.As(ToStatus(err), &ce) || ce.Code() != connect.CodeResourceExhausted {
		t.Fatalf("ToStatus(%v) = %v", err, ToStatus(err))
	}
	if after, ok := RetryDelay(ce); !ok || after != 250*time.Millisecond {
		t.Errorf("retry hint %v %v, want 250ms", after, ok)
	}
	// In the standard encoding: what genproto's RetryInfo, as any gRPC client has it,
	// reads back.
	var std errdetails.RetryInfo
	found := false
	for _, d := range ce.Details() {
		if d.Type() == "google.rpc.RetryInfo" {
			found = true
			if err := proto.Unmarshal(d.Bytes(), &std); err != nil || std.RetryDelay.AsDuration() != 250*time.Millisecond {
				t.Errorf("RetryInfo decoded by genproto: %v, %v; want 250ms", std.RetryDelay, err)
			}
		}
	}
	if !found {
		t.Error("no google.rpc.RetryInfo detail")
	}
	// And what a standard encoder writes, this side reads.
	for _, want := range []time.Duration{0, 7 * time.Millisecond, 3*time.Second + 5*time.Millisecond} {
		b, err := proto.Marshal(&errdetails.RetryInfo{RetryDelay: durationpb.New(want)})
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := parseRetryInfo(b); !ok || got != want {
			t.Errorf("a standard RetryInfo of %v read as %v %v", want, got, ok)
		}
	}
	if got, withDetail := FromStatus(ce); got != roche.ErrExhausted || !withDetail {
		t.Errorf("the sentinel beside the hint came back as %v (detail %v)", got, withDetail)
	}
	if !errors.As(ToStatus(fmt.Errorf("%w: no more", roche.ErrExhausted)), &ce) {
		t.Fatal("not a connect error")
	}
	if after, ok := RetryDelay(ce); ok {
		t.Errorf("a refusal without a hint came out with one: %v", after)
	}
}

// TestReasonsAreTheSDKs: the CLI's JSON errors name each sentinel as the Python SDK's
// exceptions do (sdk/python/.../errors.py), so a reason cannot drift on one side.
func TestReasonsAreTheSDKs(t *testing.T) {
	py, err := os.ReadFile("../../sdk/python/src/roche_sandbox/errors.py")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sentinels {
		if got := Reason(fmt.Errorf("x: %w: y", s.err)); got != s.name {
			t.Errorf("Reason(%v) = %q, want %q", s.err, got, s.name)
		}
		if !strings.Contains(string(py), fmt.Sprintf("reason = %q", s.name)) {
			t.Errorf("reason %q (%v) has no exception class in the Python SDK", s.name, s.err)
		}
	}
	if got := Reason(fmt.Errorf("waiting: %w", context.DeadlineExceeded)); got != "timeout" {
		t.Errorf("a context deadline's reason: %q", got)
	}
	if got := Reason(errors.New("something else")); got != "" {
		t.Errorf("an unclassified error's reason: %q", got)
	}
}

// TestConfigLeftOutTakesDefaults: a client that predates a field (or leaves it out)
// gets the secure default for it, the disk limit included, never a zero that would
// mean "no limit".
func TestConfigLeftOutTakesDefaults(t *testing.T) {
	got, leased := ConfigFromProto(&rochev1.SandboxConfig{Writable: true})
	want := roche.DefaultConfig()
	want.Writable = true
	if !reflect.DeepEqual(got, want) || leased {
		t.Fatalf("config with fields left out: %+v, want the defaults %+v", got, want)
	}
	if got.DiskBytes() != 1<<30 {
		t.Fatalf("disk left out: %q, want the 1g default", got.Disk)
	}
	zero := ""
	if got, _ := ConfigFromProto(&rochev1.SandboxConfig{Disk: &zero}); got.Disk != "" {
		t.Fatalf("disk given as empty came back as %q: fields given are used as given", got.Disk)
	}
}
