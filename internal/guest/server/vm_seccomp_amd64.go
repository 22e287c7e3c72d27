//go:build linux

package server

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// vmDeniedSyscalls fail with EPERM for everything in a microVM sandbox (and for the agent,
// which needs none of them once the VM is set up). Docker's default profile is the model;
// most of these already fail for a user without capabilities, and the filter keeps them
// failing even if a kernel bug hands a capability back. Also closed: io_uring (a large
// attack surface Docker blocks too), user namespaces (unshare, setns), keyrings, BPF,
// perf events, userfaultfd, ptrace and cross-process memory access, and modify_ldt, as
// Roche's profile does (provider/internal/seccomp).
var vmDeniedSyscalls = []uint32{
	unix.SYS_ACCT, unix.SYS_ADD_KEY, unix.SYS_BPF, unix.SYS_CLOCK_ADJTIME, unix.SYS_CLOCK_SETTIME,
	unix.SYS_CREATE_MODULE, unix.SYS_DELETE_MODULE, unix.SYS_FINIT_MODULE, unix.SYS_GET_KERNEL_SYMS,
	unix.SYS_INIT_MODULE, unix.SYS_IOPERM, unix.SYS_IOPL, unix.SYS_KCMP, unix.SYS_KEXEC_FILE_LOAD,
	unix.SYS_KEXEC_LOAD, unix.SYS_KEYCTL, unix.SYS_LOOKUP_DCOOKIE, unix.SYS_MOUNT,
	unix.SYS_NAME_TO_HANDLE_AT, unix.SYS_NFSSERVCTL, unix.SYS_OPEN_BY_HANDLE_AT,
	unix.SYS_PERF_EVENT_OPEN, unix.SYS_PIVOT_ROOT, unix.SYS_PROCESS_VM_READV,
	unix.SYS_PROCESS_VM_WRITEV, unix.SYS_PTRACE, unix.SYS_QUERY_MODULE, unix.SYS_QUOTACTL,
	unix.SYS_REQUEST_KEY, unix.SYS_SETNS, unix.SYS_SETTIMEOFDAY, unix.SYS_SWAPON,
	unix.SYS_SWAPOFF, unix.SYS_SYSFS, unix.SYS__SYSCTL, unix.SYS_UMOUNT2, unix.SYS_UNSHARE,
	unix.SYS_USELIB, unix.SYS_USERFAULTFD, unix.SYS_USTAT, unix.SYS_VHANGUP, unix.SYS_MODIFY_LDT,
	unix.SYS_IO_URING_SETUP, unix.SYS_IO_URING_ENTER, unix.SYS_IO_URING_REGISTER,
	unix.SYS_OPEN_TREE, unix.SYS_MOVE_MOUNT, unix.SYS_FSOPEN, unix.SYS_FSCONFIG,
	unix.SYS_FSMOUNT, unix.SYS_FSPICK, unix.SYS_MOUNT_SETATTR, unix.SYS_QUOTACTL_FD,
}

// x32 syscalls are the x86_64 ones with this bit set; refusing them keeps the list above
// from being bypassed through the other ABI.
const x32SyscallBit = 0x40000000

// installSeccomp installs the filter on every thread (TSYNC): calls from any other
// architecture (the i386 ABI through int 0x80) or the x32 ABI, and the denied calls,
// fail with EPERM.
func installSeccomp() error {
	const (
		offNr   = 0 // struct seccomp_data: int nr; u32 arch; ...
		offArch = 4
		deny    = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
		allow   = unix.SECCOMP_RET_ALLOW
	)
	stmt := func(code uint16, k uint32) unix.SockFilter { return unix.SockFilter{Code: code, K: k} }
	jump := func(code uint16, k uint32, jt, jf uint8) unix.SockFilter {
		return unix.SockFilter{Code: code, Jt: jt, Jf: jf, K: k}
	}
	n := len(vmDeniedSyscalls)
	prog := []unix.SockFilter{
		stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offArch),
		jump(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, unix.AUDIT_ARCH_X86_64, 1, 0),
		stmt(unix.BPF_RET|unix.BPF_K, deny),
		stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offNr),
		jump(unix.BPF_JMP|unix.BPF_JGE|unix.BPF_K, x32SyscallBit, uint8(n+1), 0),
	}
	for i, nr := range vmDeniedSyscalls {
		// On a match jump to the deny at the end: n-i-1 more checks, then the allow.
		prog = append(prog, jump(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, nr, uint8(n-i), 0))
	}
	prog = append(prog, stmt(unix.BPF_RET|unix.BPF_K, allow), stmt(unix.BPF_RET|unix.BPF_K, deny))
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	_, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
	if errno != 0 {
		return fmt.Errorf("installing the seccomp filter: %w", errno)
	}
	return nil
}
