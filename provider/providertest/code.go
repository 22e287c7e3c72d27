package providertest

import (
	"bytes"
	"errors"
	"fmt"
	"image"
	_ "image/png" // the charts come back as PNG
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kit"
)

// cellTimeout bounds a cell in the code checks: the first one starts an interpreter, and
// the first import of matplotlib in a fresh sandbox builds its font cache.
const cellTimeout = 3 * time.Minute

// testCode checks code contexts (roche.CodeRunner) for a provider whose Capabilities
// list a language: state kept across calls, errors, streaming, interrupts, a dying
// interpreter replaced, isolation between sandboxes, and, with RichResults, charts,
// DataFrames and display calls as their rich forms.
func (s *suite) testCode(t *testing.T) {
	cr, ok := s.p.(roche.CodeRunner)
	if !ok {
		t.Fatalf("Capabilities.Code is %v but the provider does not implement roche.CodeRunner", s.caps.Code)
	}
	if !slices.Contains(s.caps.Code, roche.LanguagePython) {
		t.Fatalf("Capabilities.Code %v lacks python", s.caps.Code)
	}
	id := s.create(t, s.opts.Config)
	run := func(t *testing.T, req roche.CodeRequest) roche.Execution {
		t.Helper()
		if req.Timeout == 0 {
			req.Timeout = cellTimeout
		}
		ex, err := cr.RunCode(ctxFor(t, cellTimeout+time.Minute), id, req)
		if err != nil {
			t.Fatalf("RunCode %q: %v", req.Code, err)
		}
		return ex
	}
	ok2 := func(t *testing.T, req roche.CodeRequest) roche.Execution {
		t.Helper()
		ex := run(t, req)
		if ex.Error != nil {
			t.Fatalf("RunCode %q: %s: %s\n%s", req.Code, ex.Error.Name, ex.Error.Value, ex.Error.Traceback)
		}
		return ex
	}

	t.Run("StatePersists", func(t *testing.T) {
		ok2(t, roche.CodeRequest{Code: "x = 41"})
		var streamed []roche.CodeResult
		ex := ok2(t, roche.CodeRequest{Code: "x + 1", OnResult: func(r roche.CodeResult) { streamed = append(streamed, r) }})
		if ex.Text() != "42" || ex.Context == "" || ex.ExecutionCount < 2 {
			t.Fatalf("x + 1 after x = 41: text %q, context %q, count %d", ex.Text(), ex.Context, ex.ExecutionCount)
		}
		if len(streamed) != 1 || streamed[0].Text != "42" {
			t.Fatalf("OnResult got %+v, want the one result", streamed)
		}
	})
	t.Run("Exception", func(t *testing.T) {
		ex := run(t, roche.CodeRequest{Code: "def f():\n    return 1 / 0\nf()"})
		if ex.Error == nil || ex.Error.Name != "ZeroDivisionError" || ex.Error.Value != "division by zero" ||
			!strings.Contains(ex.Error.Traceback, "return 1 / 0") {
			t.Fatalf("error: %+v", ex.Error)
		}
	})
	t.Run("StdoutStreamed", func(t *testing.T) {
		w := &firstWrite{}
		ex := ok2(t, roche.CodeRequest{Code: "import time\nprint('early', flush=True)\ntime.sleep(1.5)\nprint('late')", Stdout: w})
		returned := time.Now()
		if got := strings.Join(ex.Logs.Stdout, ""); got != "early\nlate\n" {
			t.Fatalf("stdout %q", got)
		}
		if at := w.at(); at.IsZero() || returned.Sub(at) < time.Second {
			t.Fatalf("the first line reached the caller %s before the cell ended, not as it was printed", returned.Sub(at))
		}
	})
	t.Run("TimeoutInterrupts", func(t *testing.T) {
		ok2(t, roche.CodeRequest{Code: "kept = 'still here'"})
		ex := run(t, roche.CodeRequest{Code: "while True:\n    pass", Timeout: 2 * time.Second})
		if !ex.TimedOut || ex.Error == nil {
			t.Fatalf("an endless loop at a 2 s timeout: timed out %v, error %+v", ex.TimedOut, ex.Error)
		}
		if s.caps.Processes && ex.Error.Name != "KeyboardInterrupt" {
			t.Fatalf("interrupted cell's error %+v, want a KeyboardInterrupt", ex.Error)
		}
		if strings.Contains(ex.Error.Traceback, "roche-kernel") {
			t.Fatalf("the interrupted cell's traceback shows the kernel's own frames: %q", ex.Error.Traceback)
		}
		after := run(t, roche.CodeRequest{Code: "kept"})
		switch {
		case after.Text() == "'still here'" && !after.Restarted:
		case !s.caps.Processes && after.Restarted && after.Error != nil && after.Error.Name == "NameError":
			// An interpreter without signals (python.wasm) cannot be interrupted: it was
			// stopped, and the next call says it starts afresh.
		default:
			t.Fatalf("after the interrupt: text %q, restarted %v, error %+v; the context must keep its variables (or, without signals, say it restarted)",
				after.Text(), after.Restarted, after.Error)
		}
	})
	t.Run("InterpreterDies", func(t *testing.T) {
		ok2(t, roche.CodeRequest{Code: "doomed = 1"})
		ex := run(t, roche.CodeRequest{Code: "import os\nos._exit(3)"})
		if ex.Error == nil {
			t.Fatalf("os._exit reported no error: %+v", ex)
		}
		next := ok2(t, roche.CodeRequest{Code: "'doomed' in globals()"})
		if !next.Restarted || next.Text() != "False" {
			t.Fatalf("the call after os._exit: restarted %v, text %q", next.Restarted, next.Text())
		}
	})
	t.Run("ContextsListAndRemove", func(t *testing.T) {
		cc, err := cr.CreateContext(ctxFor(t, cellTimeout), id, roche.ContextOptions{
			Language: roche.LanguagePython, Cwd: "/tmp", Env: map[string]string{"ROCHE_CONTEXT": "mine"}})
		if err != nil {
			t.Fatalf("CreateContext: %v", err)
		}
		if ex := ok2(t, roche.CodeRequest{Context: cc.ID, Code: "import os\n(os.environ.get('ROCHE_CONTEXT'), os.getcwd())"}); ex.Text() != "('mine', '/tmp')" {
			t.Fatalf("the context's env and cwd: %s, want ('mine', '/tmp')", ex.Text())
		}
		ok2(t, roche.CodeRequest{Context: cc.ID, Code: "mine = 5"})
		if ex := ok2(t, roche.CodeRequest{Code: "'mine' in globals()"}); ex.Text() != "False" {
			t.Fatalf("the default context sees another context's variable")
		}
		list, err := cr.Contexts(ctxFor(t, time.Minute), id)
		if err != nil || !slices.ContainsFunc(list, func(c roche.CodeContext) bool { return c.ID == cc.ID }) {
			t.Fatalf("Contexts = %+v, %v; want %s in it", list, err, cc.ID)
		}
		if err := cr.RestartContext(ctxFor(t, cellTimeout), id, cc.ID); err != nil {
			t.Fatalf("RestartContext: %v", err)
		}
		if ex := ok2(t, roche.CodeRequest{Context: cc.ID, Code: "'mine' in globals()"}); ex.Text() != "False" {
			t.Fatalf("a restarted context kept its variables")
		}
		if err := cr.RemoveContext(ctxFor(t, time.Minute), id, cc.ID); err != nil {
			t.Fatalf("RemoveContext: %v", err)
		}
		list, _ = cr.Contexts(ctxFor(t, time.Minute), id)
		if slices.ContainsFunc(list, func(c roche.CodeContext) bool { return c.ID == cc.ID }) {
			t.Fatalf("removed context %s still listed: %+v", cc.ID, list)
		}
		_, err = cr.RunCode(ctxFor(t, time.Minute), id, roche.CodeRequest{Context: cc.ID, Code: "1"})
		if !errors.Is(err, roche.ErrNotFound) {
			t.Fatalf("RunCode in a removed context: %v, want ErrNotFound", err)
		}
	})
	t.Run("ForkContext", func(t *testing.T) {
		fk, ok := cr.(roche.ContextForker)
		if !ok {
			return // wasm: python.wasm cannot fork; roched and the CLI refuse in one line
		}
		a, err := cr.CreateContext(ctxFor(t, cellTimeout), id, roche.ContextOptions{Language: roche.LanguagePython})
		if err != nil {
			t.Fatalf("CreateContext: %v", err)
		}
		defer func() { _ = cr.RemoveContext(ctxFor(t, time.Minute), id, a.ID) }()
		ok2(t, roche.CodeRequest{Context: a.ID, Code: "x = 1"})
		b, err := fk.ForkContext(ctxFor(t, cellTimeout), id, a.ID)
		if err != nil {
			t.Fatalf("ForkContext: %v", err)
		}
		defer func() { _ = cr.RemoveContext(ctxFor(t, time.Minute), id, b.ID) }()
		if b.ID == a.ID || b.Language != roche.LanguagePython {
			t.Fatalf("the fork of %s: %+v", a.ID, b)
		}
		if ex := ok2(t, roche.CodeRequest{Context: b.ID, Code: "x"}); ex.Text() != "1" || ex.Restarted {
			t.Fatalf("the fork's x: %q (restarted %v), want 1", ex.Text(), ex.Restarted)
		}
		ok2(t, roche.CodeRequest{Context: b.ID, Code: "x = 2"})
		if ex := ok2(t, roche.CodeRequest{Context: a.ID, Code: "x"}); ex.Text() != "1" {
			t.Fatalf("A sees x = %s after its fork set it to 2", ex.Text())
		}
		if ex := ok2(t, roche.CodeRequest{Context: b.ID, Code: "x"}); ex.Text() != "2" {
			t.Fatalf("the fork's x = %s, want 2", ex.Text())
		}
		if _, err := fk.ForkContext(ctxFor(t, time.Minute), id, "nosuchcontext"); !errors.Is(err, roche.ErrNotFound) {
			t.Fatalf("ForkContext of no context: %v, want ErrNotFound", err)
		}
	})
	t.Run("SandboxesIsolated", func(t *testing.T) {
		ex := ok2(t, roche.CodeRequest{Code: "secret = 'sandbox one'"})
		other := s.create(t, s.opts.Config)
		got, err := cr.RunCode(ctxFor(t, cellTimeout), other, roche.CodeRequest{Code: "'secret' in globals()", Timeout: cellTimeout})
		if err != nil || got.Error != nil || got.Text() != "False" {
			t.Fatalf("another sandbox's default context: %+v, %v", got, err)
		}
		_, err = cr.RunCode(ctxFor(t, time.Minute), other, roche.CodeRequest{Context: ex.Context, Code: "secret"})
		if !errors.Is(err, roche.ErrNotFound) {
			t.Fatalf("another sandbox ran code in this sandbox's context %s: %v", ex.Context, err)
		}
	})
	if cw, ok := s.p.(kit.CodeWarmer); ok {
		// A warm pool's sandboxes: the interpreter started ahead goes, fresh, to the next
		// context started with the sandbox's own env and workdir. Where the sandbox has
		// processes, its pid is below that of a command run after the warm-up and before
		// the context was made (pids count up in the sandbox's namespace), where an
		// interpreter started for the context would be above. python.wasm has no pids:
		// the wasm provider's own tests check its hand-over.
		t.Run("WarmedInterpreter", func(t *testing.T) {
			if err := cw.WarmCode(ctxFor(t, cellTimeout), id, roche.LanguagePython); err != nil {
				t.Fatal(err)
			}
			after := -1
			if !slices.Contains(s.caps.NotApplicable, "pids_limit") {
				res, err := s.p.Exec(ctxFor(t, time.Minute), id, roche.ExecRequest{Cmd: append(append([]string{}, s.opts.Python...), "-c", "import os; print(os.getpid())")})
				if err != nil || res.ExitCode != 0 {
					t.Fatalf("exec: %+v %v", res, err)
				}
				after, _ = strconv.Atoi(strings.TrimSpace(res.Stdout))
			}
			cc, err := cr.CreateContext(ctxFor(t, cellTimeout), id, roche.ContextOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cr.RemoveContext(ctxFor(t, time.Minute), id, cc.ID) })
			ex := ok2(t, roche.CodeRequest{Context: cc.ID, Code: "import os\n(getattr(os, 'getpid', lambda: 0)(), 'x' in globals())"})
			var pid int
			var seen string
			if _, err := fmt.Sscanf(ex.Text(), "(%d, %s", &pid, &seen); err != nil || seen != "False)" || ex.ExecutionCount != 1 {
				t.Fatalf("the first cell in the warmed context: %q (count %d), want its pid, False, and count 1", ex.Text(), ex.ExecutionCount)
			}
			if after != -1 && (after == 0 || pid >= after) {
				t.Fatalf("the context's interpreter is pid %d, a command run after the warm-up was %d: the warmed one was not taken", pid, after)
			}
			if err := cw.WarmCode(ctxFor(t, time.Minute), id, "cobol"); err == nil {
				t.Fatal("warmed a cobol interpreter")
			}
		})
	}
	t.Run("UnsupportedLanguage", func(t *testing.T) {
		_, err := cr.RunCode(ctxFor(t, time.Minute), id, roche.CodeRequest{Language: "cobol", Code: "1"})
		if err == nil {
			t.Fatal("a cobol cell ran")
		}
	})
	if !s.caps.RichResults {
		t.Run("TextOnly", func(t *testing.T) {
			ex := ok2(t, roche.CodeRequest{Code: "class H:\n    def _repr_html_(self): return '<b>x</b>'\nH()"})
			if ex.Text() == "" {
				t.Fatalf("no text result: %+v", ex.Results)
			}
		})
		return
	}
	t.Run("MatplotlibPNG", func(t *testing.T) {
		ex := ok2(t, roche.CodeRequest{Code: "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [4, 1, 9])\nplt.show()"})
		checkPNG(t, ex, 640, 480)
		// A figure left open at the end of a cell comes back too.
		ex = ok2(t, roche.CodeRequest{Code: "fig = plt.figure(figsize=(3, 2))\n_ = plt.bar(['a', 'b'], [1, 2])"})
		checkPNG(t, ex, 300, 200)
		if ex := ok2(t, roche.CodeRequest{Code: "len(plt.get_fignums())"}); ex.Text() != "0" {
			t.Fatalf("figures still open after being sent: %s", ex.Text())
		}
	})
	t.Run("DataFrameHTML", func(t *testing.T) {
		ex := ok2(t, roche.CodeRequest{Code: "import pandas as pd\npd.DataFrame({'name': ['a', 'b'], 'n': [1, 2]})"})
		var main roche.CodeResult
		for _, r := range ex.Results {
			if r.IsMainResult {
				main = r
			}
		}
		if !strings.Contains(main.HTML, "<table") || !strings.Contains(main.Text, "name") {
			t.Fatalf("DataFrame result: html %q, text %q", main.HTML, main.Text)
		}
	})
	t.Run("DisplaySVG", func(t *testing.T) {
		ex := ok2(t, roche.CodeRequest{Code: "class C:\n    def _repr_svg_(self):\n        return '<svg xmlns=\"http://www.w3.org/2000/svg\"/>'\ndisplay(C())\nprint('after')"})
		if len(ex.Results) != 1 || !strings.HasPrefix(ex.Results[0].SVG, "<svg") || ex.Results[0].IsMainResult {
			t.Fatalf("display of an SVG object: %+v", ex.Results)
		}
	})
	if s.caps.Processes {
		t.Run("OOMReplacesInterpreter", func(t *testing.T) {
			cfg := s.opts.Config
			cfg.Memory = "256m"
			small := s.create(t, cfg)
			ex, err := cr.RunCode(ctxFor(t, cellTimeout), small, roche.CodeRequest{Code: "kept = 1\nb = b'x' * (1 << 30)", Timeout: cellTimeout})
			if err != nil {
				t.Fatal(err)
			}
			if ex.Error == nil || !strings.Contains(ex.Error.Value, "memory") {
				t.Fatalf("1 GiB under a 256m limit: error %+v", ex.Error)
			}
			next, err := cr.RunCode(ctxFor(t, cellTimeout), small, roche.CodeRequest{Code: "'kept' in globals()", Timeout: cellTimeout})
			if err != nil || !next.Restarted || next.Text() != "False" {
				t.Fatalf("after the OOM kill: %+v, %v", next, err)
			}
		})
	}
}

// checkPNG finds a PNG result and checks that it decodes to w×h.
func checkPNG(t *testing.T, ex roche.Execution, w, h int) {
	t.Helper()
	for _, r := range ex.Results {
		if len(r.PNG) == 0 {
			continue
		}
		cfg, format, err := image.DecodeConfig(bytes.NewReader(r.PNG))
		if err != nil || format != "png" {
			t.Fatalf("PNG result does not decode: %v (format %q)", err, format)
		}
		if cfg.Width != w || cfg.Height != h {
			t.Fatalf("PNG is %dx%d, want %dx%d", cfg.Width, cfg.Height, w, h)
		}
		return
	}
	t.Fatalf("no PNG among %d results (stderr %q)", len(ex.Results), ex.Logs.Stderr)
}

// firstWrite records when it was first written to.
type firstWrite struct {
	mu    sync.Mutex
	first time.Time
}

func (w *firstWrite) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.first.IsZero() {
		w.first = time.Now()
	}
	return len(p), nil
}

func (w *firstWrite) at() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.first
}
