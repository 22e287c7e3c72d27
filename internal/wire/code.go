package wire

import (
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
)

// CodeToProto asks for a cell to be run in sandbox id.
func CodeToProto(id string, r roche.CodeRequest) *rochev1.RunCodeRequest {
	return &rochev1.RunCodeRequest{
		SandboxId: id, Code: r.Code, Language: r.Language, ContextId: r.Context,
		TimeoutSecs: r.Timeout.Seconds(), OutputLimit: r.OutputLimit, Env: r.Env, Cwd: r.Cwd,
	}
}

// CodeFromProto is CodeToProto's inverse, refusing what roche.CodeRequest.Validate
// refuses; a zero timeout stays zero (the provider's DefaultCodeTimeout).
func CodeFromProto(pb *rochev1.RunCodeRequest) (roche.CodeRequest, error) {
	timeout, err := ExecTimeout(pb.GetTimeoutSecs())
	if err != nil {
		return roche.CodeRequest{}, err
	}
	r := roche.CodeRequest{
		Code: pb.GetCode(), Language: pb.GetLanguage(), Context: pb.GetContextId(),
		Timeout: timeout, OutputLimit: pb.GetOutputLimit(), Env: pb.GetEnv(), Cwd: pb.GetCwd(),
	}
	return r, r.Validate()
}

// CodeResultToProto carries one rich result.
func CodeResultToProto(r roche.CodeResult) *rochev1.CodeResult {
	return &rochev1.CodeResult{
		Text: r.Text, Html: r.HTML, Markdown: r.Markdown, Svg: r.SVG, Png: r.PNG, Jpeg: r.JPEG,
		Json: r.JSON, Latex: r.LaTeX, Javascript: r.JavaScript, IsMainResult: r.IsMainResult,
	}
}

// CodeResultFromProto is CodeResultToProto's inverse.
func CodeResultFromProto(pb *rochev1.CodeResult) roche.CodeResult {
	return roche.CodeResult{
		Text: pb.GetText(), HTML: pb.GetHtml(), Markdown: pb.GetMarkdown(), SVG: pb.GetSvg(), PNG: pb.GetPng(),
		JPEG: pb.GetJpeg(), JSON: pb.GetJson(), LaTeX: pb.GetLatex(), JavaScript: pb.GetJavascript(),
		IsMainResult: pb.GetIsMainResult(),
	}
}

// ExecutionToProto summarises a cell. RunCode's stream leaves the logs and results out
// (withOutput false): its output and result events carried them.
func ExecutionToProto(e roche.Execution, withOutput bool) *rochev1.CodeExecution {
	pb := &rochev1.CodeExecution{
		ExecutionCount: int32(e.ExecutionCount), ContextId: e.Context, TimedOut: e.TimedOut,
		Restarted: e.Restarted, Truncated: e.Truncated, Duration: durationpb.New(e.Duration),
	}
	if e.Error != nil {
		pb.Error = &rochev1.CodeError{Name: e.Error.Name, Value: e.Error.Value, Traceback: e.Error.Traceback}
	}
	if withOutput {
		pb.Stdout, pb.Stderr = e.Logs.Stdout, e.Logs.Stderr
		for _, r := range e.Results {
			pb.Results = append(pb.Results, CodeResultToProto(r))
		}
	}
	return pb
}

// ExecutionFromProto is ExecutionToProto's inverse.
func ExecutionFromProto(pb *rochev1.CodeExecution) roche.Execution {
	e := roche.Execution{
		Logs:           roche.CodeLogs{Stdout: pb.GetStdout(), Stderr: pb.GetStderr()},
		ExecutionCount: int(pb.GetExecutionCount()), Context: pb.GetContextId(), TimedOut: pb.GetTimedOut(),
		Restarted: pb.GetRestarted(),
		Truncated: pb.GetTruncated(), Duration: pb.GetDuration().AsDuration(),
	}
	if pe := pb.GetError(); pe != nil {
		e.Error = &roche.CodeError{Name: pe.GetName(), Value: pe.GetValue(), Traceback: pe.GetTraceback()}
	}
	for _, r := range pb.GetResults() {
		e.Results = append(e.Results, CodeResultFromProto(r))
	}
	return e
}

// ContextToProto describes a context.
func ContextToProto(c roche.CodeContext) *rochev1.CodeContext {
	return &rochev1.CodeContext{Id: c.ID, Language: c.Language, Cwd: c.Cwd, Default: c.Default}
}

// ContextFromProto is ContextToProto's inverse.
func ContextFromProto(pb *rochev1.CodeContext) roche.CodeContext {
	return roche.CodeContext{ID: pb.GetId(), Language: pb.GetLanguage(), Cwd: pb.GetCwd(), Default: pb.GetDefault()}
}

// ContextOptionsToProto asks for a context in sandbox id.
func ContextOptionsToProto(id string, o roche.ContextOptions) *rochev1.CreateContextRequest {
	return &rochev1.CreateContextRequest{SandboxId: id, Language: o.Language, Cwd: o.Cwd, Env: o.Env}
}

// ContextOptionsFromProto is ContextOptionsToProto's inverse.
func ContextOptionsFromProto(pb *rochev1.CreateContextRequest) roche.ContextOptions {
	return roche.ContextOptions{Language: pb.GetLanguage(), Cwd: pb.GetCwd(), Env: pb.GetEnv()}
}
