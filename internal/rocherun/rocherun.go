// Package rocherun is what the thin roche knows of roche-run, the binary that runs a
// command whose providers it links in its own process: its name, those providers
// (Direct), whether roche-run makes a one-shot roche run's sandbox in its own process
// (InProcess), and the early hand-off of one (Early). It imports only standard packages
// that Go initialises early anyway (not path, path/filepath or os/user, which it
// initialises after protobuf's), so that the thin roche can decide and make that
// hand-off before it initialises the packages only its own commands need (package
// early).
package rocherun

import (
	"errors"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Name is roche-run's file name.
const Name = "roche-run"

// Direct are the providers roche-run links (internal/inproc/direct), sorted: the thin
// roche hands a command that needs only these in its own process to roche-run, which
// starts faster than roched, and any other to roched. catalog.Direct is this list.
var Direct = []string{"docker", "oci", "wasm"}

// defaultProvider is catalog.Default, the provider of a create that names none
// (TestEarlyMatchesCatalog).
const defaultProvider = "docker"

// OneShot is the provider of the one-shot roche run that args (without the program
// name) and the environment getenv reads ask for, or "" when they are not one: the
// subcommand run first (no global flag before it), then the last --provider before
// "--", else ROCHE_PROVIDER, else the default provider. It reads the command line only
// as far as that, so a provider named oddly (the value of another flag that reads
// "--provider") may be misread: what it is for may only cost time when it is.
// Help, --version, --socket and --address make it "" (nothing to start early).
func OneShot(args []string, getenv func(string) string) string {
	if len(args) == 0 || args[0] != "run" {
		return ""
	}
	provider := getenv("ROCHE_PROVIDER")
	if provider == "" {
		provider = defaultProvider
	}
	rest := args[1:]
	for i := 0; i < len(rest); i++ {
		a := rest[i]
		if a == "--" {
			break // the command's own arguments
		}
		name, value, hasValue := strings.Cut(a, "=")
		switch name {
		case "-h", "--help", "--version", "--socket", "--address":
			return ""
		case "--provider":
			if !hasValue {
				if i+1 >= len(rest) {
					return ""
				}
				i++
				value = rest[i]
			}
			provider = value
		}
	}
	return provider
}

// InProcess is the provider of the one-shot roche run that args (without the program
// name) and the environment getenv reads ask for (OneShot) when roche-run would make
// its sandbox in its own process, or "" when it would not: a provider of Direct, and no
// roched to use (no ROCHE_ADDRESS, no file where roched's socket would be). It decides
// only what starts early (Early, ociwarm): a socket file no roched answers on counts as
// a roched, and roche-run, finding none, makes the sandbox itself all the same.
func InProcess(args []string, getenv func(string) string) string {
	provider := OneShot(args, getenv)
	if !slices.Contains(Direct, provider) || getenv("ROCHE_ADDRESS") != "" {
		return ""
	}
	socket := getenv("ROCHE_SOCKET")
	if socket == "" {
		socket = StandardSocket(getenv)
	}
	if _, err := os.Lstat(socket); !errors.Is(err, fs.ErrNotExist) {
		return ""
	}
	return provider
}

// Early reports whether the thin roche, started with args (without the program name)
// and the environment getenv reads, is to hand the command to roche-run before it has
// initialised anything else, and if so, roche-run's path. That is a one-shot roche run
// that roche-run would make in its own process (InProcess: on one of Direct, with no
// roched to use), and roche-run beside this executable. The thin roche would hand such
// a command to roche-run anyway, after its own start-up (cli.handoff), and roche-run,
// the same command line with more in it, does with it whatever the thin roche would,
// so a misread command line costs time, not behaviour.
// Anything else, or ROCHE_DEBUG (which logs each step of the usual way), takes the
// usual way.
//
// executable returns this executable's path, symbolic links resolved; it is called
// only for a command that may go.
func Early(args []string, getenv func(string) string, executable func() (string, error)) (string, bool) {
	if getenv("ROCHE_DEBUG") != "" || InProcess(args, getenv) == "" {
		return "", false
	}
	self, err := executable()
	if err != nil || !strings.HasPrefix(self, "/") {
		return "", false
	}
	run := self[:strings.LastIndexByte(self, '/')+1] + Name
	fi, err := os.Stat(run)
	if err != nil || !fi.Mode().IsRegular() {
		return "", false
	}
	if me, err := os.Stat(self); err != nil || os.SameFile(me, fi) {
		return "", false
	}
	return run, true
}

// StandardSocket is roched's socket when ROCHE_SOCKET names none (defaults.StandardSocket
// is this, cleaned): $XDG_RUNTIME_DIR/roche/roched.sock, else ~/.roche/roched.sock, else
// roche-UID/roched.sock under the temp dir. It is joined without path/filepath; a path
// that names the same file another way would do as well: the early hand-off only asks
// whether a file is there.
func StandardSocket(getenv func(string) string) string {
	if d := getenv("XDG_RUNTIME_DIR"); d != "" {
		return strings.TrimSuffix(d, "/") + "/roche/roched.sock"
	}
	if home, err := os.UserHomeDir(); err == nil && home != "" {
		return strings.TrimSuffix(home, "/") + "/.roche/roched.sock"
	}
	return strings.TrimSuffix(os.TempDir(), "/") + "/roche-" + strconv.Itoa(os.Getuid()) + "/roched.sock"
}
