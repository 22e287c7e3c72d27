//go:build linux

// Command seccompgen writes Roche's seccomp profile (provider/internal/seccomp's
// seccomp.json): the default profile of today's Docker engines, from
// github.com/moby/profiles/seccomp, without the system calls in denied below.
//
// The profile is generated once and checked in, rather than built when a sandbox is
// made, so that what Roche applies is reviewable in the repository and changes only in
// a commit that says so: the test beside this file fails when the module's default
// profile moves, until the file is regenerated (go generate ./provider/internal/seccomp).
// It also keeps the profile's Docker form free of a package that builds only on Linux,
// since the Docker client may drive a remote engine from anywhere.
//
// The JSON is in the format Docker has read since 20.10 (archMap, names, errnoRet,
// includes/excludes by caps, arches and minKernel). The one newer field it carries,
// defaultErrnoRet (1, EPERM), is ignored by a 20.10 engine, whose default errno for
// SCMP_ACT_ERRNO is EPERM as well.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"

	"github.com/moby/profiles/seccomp"
)

// denied are the calls Roche's profile refuses on top of Docker's default profile, each
// with why (docs/security.md lists the same). Docker's current default
// already refuses io_uring; it is listed so that the profile keeps refusing it whatever
// a later default does, because engines older than 25.0 (such as Debian's 20.10) allow
// it with their built-in profile.
var denied = []struct{ name, why string }{
	{"io_uring_setup", "io_uring: a large, fast-moving kernel interface behind many privilege escalations (Google disabled it on ChromeOS, Android and its servers); refused by Docker only since 25.0"},
	{"io_uring_enter", "io_uring, as above"},
	{"io_uring_register", "io_uring, as above"},
	{"ptrace", "debugging other processes: untrusted code has no need to, and ptrace has a history of privilege escalations (CVE-2019-13272); Docker allows it on kernels from 4.8"},
	{"process_vm_readv", "reads another process's memory: the power of ptrace without ptrace"},
	{"process_vm_writev", "writes another process's memory, as above"},
	{"modify_ldt", "16-bit segment tables, needed only by Wine and DOSEMU, with a history of kernel bugs (CVE-2015-5157, CVE-2017-17053)"},
	{"name_to_handle_at", "file handles, half of the open_by_handle_at container escape (open_by_handle_at is already refused); nothing a sandboxed program needs"},
}

// Profile returns Roche's profile as indented JSON.
func Profile() ([]byte, error) {
	p := seccomp.DefaultProfile()
	drop := map[string]bool{}
	for _, d := range denied {
		drop[d.name] = true
	}
	kept := p.Syscalls[:0]
	for _, rule := range p.Syscalls {
		// Only rules that allow are trimmed: a rule that refuses (clone3 answers ENOSYS,
		// so that libc falls back to clone) stays as it is.
		if rule.Action == "SCMP_ACT_ALLOW" {
			rule.Names = slices.DeleteFunc(rule.Names, func(n string) bool { return drop[n] })
			if len(rule.Names) == 0 {
				continue
			}
		}
		kept = append(kept, rule)
	}
	p.Syscalls = kept
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "\t")
	if err := enc.Encode(p); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func main() {
	out := flag.String("o", "seccomp.json", "file to write")
	flag.Parse()
	b, err := Profile()
	if err == nil {
		err = os.WriteFile(*out, b, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "seccompgen:", err)
		os.Exit(1)
	}
}
