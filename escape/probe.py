# The escape suite's program inside the sandbox (escape/escape_test.go runs it as the
# sandbox user). Each attempt prints what the kernel answered: an errno name ("EPERM"),
# "ok..." when the forbidden thing worked, "none" when a search found nothing, or
# "nosurface: why" when this sandbox has no such thing to try (a WASI guest has no
# ctypes, no /proc, no sockets). It never writes a byte to anything it opens outside its
# own /tmp, and sends no packet: addresses off the sandbox are tried with a UDP connect,
# which only asks the routing table.
#
#   python3 -c "$PROBE" MODE JSON-ARGS
#
# MODE: probe (every attempt in one sandbox), mark (leave traces and hold them: the
# first of two sandboxes), look (the second sandbox looks for the first's), hog (exhaust
# and hold), neighbour (what the second sandbox can still do while the first hogs).
import errno, json, os, stat, sys, time

MODE = sys.argv[1]
ARGS = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
R = {}


def name(e):
    return errno.errorcode.get(e, str(e))


def attempt(key, fn):
    try:
        r = fn()
        R[key] = 'ok' if r is None else r
    except OSError as e:
        R[key] = name(e.errno) if e.errno else 'error: ' + str(e)[:120]
    except AttributeError as e:  # a WASI build lacks the call
        R[key] = 'nosurface: ' + str(e)[:120]
    except Exception as e:  # noqa: a probe reports, never stops
        R[key] = 'error: %s: %s' % (type(e).__name__, str(e)[:120])


try:
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    NOCTYPES = None
except Exception as e:  # a WASI build has no ctypes
    ctypes = libc = None
    NOCTYPES = 'nosurface: no ctypes (%s)' % type(e).__name__

try:
    import socket
    socket.AF_UNIX, socket.SOCK_RAW  # a WASI build has the module without these
    NOSOCKETS = None
except Exception as e:
    socket = None
    NOSOCKETS = 'nosurface: no sockets (%s)' % type(e).__name__

ARCH = os.uname().machine
NR = {
    'x86_64': dict(ptrace=101, process_vm_readv=310, bpf=321, perf_event_open=298,
                   userfaultfd=323, keyctl=250, add_key=248, io_uring_setup=425,
                   init_module=175, finit_module=313, unshare=272, mount=165, setns=308,
                   modify_ldt=154),
    'aarch64': dict(ptrace=117, process_vm_readv=270, bpf=280, perf_event_open=241,
                    userfaultfd=282, keyctl=219, add_key=217, io_uring_setup=425,
                    init_module=105, finit_module=273, unshare=97, mount=40, setns=268),
}.get(ARCH, {})


def sys_call(nr_name, *args):
    """A raw system call: its result, or OSError with the errno."""
    if libc is None:
        raise RuntimeError(NOCTYPES)
    conv = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(NR[nr_name]), *conv)
    if r < 0:
        raise OSError(ctypes.get_errno(), nr_name)
    return r


def needs_ctypes(key, fn):
    if libc is None:
        R[key] = NOCTYPES
    elif not NR:
        R[key] = 'nosurface: no system call table for ' + ARCH
    else:
        attempt(key, fn)


def needs_sockets(key, fn):
    if socket is None:
        R[key] = NOSOCKETS
    else:
        attempt(key, fn)


def in_child(fn):
    """Runs fn in a forked child (for calls that change the caller, like unshare) and
    returns what it returned, or raises its OSError."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            out = fn()
            out = 'ok' if out is None else out
        except OSError as e:
            out = '!' + name(e.errno)
        except Exception as e:
            out = 'error: %s: %s' % (type(e).__name__, e)
        os.write(w, out.encode()[:500])
        os._exit(0)
    os.close(w)
    got = b''
    while True:
        b = os.read(r, 4096)
        if not b:
            break
        got += b
    os.close(r)
    os.waitpid(pid, 0)
    got = got.decode()
    if got.startswith('!'):
        raise OSError(getattr(errno, got[1:], 0), got[1:])
    return got


def open_write(path):
    """Opens path for writing, never writing or truncating; the open itself is the
    attack (a write would be the harm)."""
    fd = os.open(path, os.O_WRONLY)
    os.close(fd)


def first_error(paths, fn):
    """Tries fn on every path: "ok:PATH" for the first that worked, else the errno of
    each, joined (one name when all agree), or "none" when there was none to try."""
    seen = []
    for p in paths:
        try:
            fn(p)
            return 'ok:' + p
        except OSError as e:
            if name(e.errno) not in seen:
                seen.append(name(e.errno))
    return ','.join(sorted(seen)) or 'none'


# --- the runc-class CVEs -----------------------------------------------------------------

def cve_2019_5736():
    # Overwriting the binary that the runtime (here the agent, PID 1) runs, through
    # /proc: the process's own exe, PID 1's, PID 1's reopened from an O_PATH descriptor
    # (the CVE's trick), the parent's (the agent forked this probe), the agent by path.
    attempt('exe.self', lambda: open_write('/proc/self/exe'))
    attempt('exe.pid1', lambda: open_write('/proc/1/exe'))

    def reopen():
        fd = os.open('/proc/1/exe', getattr(os, 'O_PATH', 0o10000000))
        try:
            open_write('/proc/self/fd/%d' % fd)
        finally:
            os.close(fd)
    attempt('exe.pid1.reopen', reopen)
    attempt('exe.parent', lambda: open_write('/proc/%d/exe' % os.getppid()))
    agents = [p for p in ('/.roche/roche-agent', '/init', '/sbin/init') if os.path.lexists(p)]
    R['exe.agent.path'] = first_error(agents, open_write)


def cve_2024_21626():
    # Descriptors leaked into the command: anything beyond stdio that names a file, a
    # directory or a socket of the host.
    try:
        fds = os.listdir('/proc/self/fd')
        leaked = []
        for fd in fds:
            try:
                target = os.readlink('/proc/self/fd/' + fd)
            except OSError:
                continue  # the listing's own descriptor, closed by now
            if int(fd) <= 2 and (target.startswith(('pipe:', 'socket:', '/dev/null', '/dev/pts/')) or target == 'anon_inode:[eventfd]'):
                continue
            leaked.append('%s->%s' % (fd, target))
        R['fd.self'] = ('ok:' + ' '.join(leaked)) if leaked else 'none'
    except OSError as e:
        R['fd.self'] = name(e.errno)
    attempt('fd.pid1', lambda: os.listdir('/proc/1/fd') is not None and 'ok:listed')
    # The workdir half: a process whose cwd is a leaked directory descriptor. Every
    # /proc/self/fd/N a command could be started in, tried as this process.
    def chdirs():
        here = os.getcwd()
        out = []
        for n in range(3, 12):
            try:
                os.chdir('/proc/self/fd/%d' % n)
                out.append('ok:%d=%s' % (n, os.getcwd()))
                os.chdir(here)
            except OSError as e:
                if name(e.errno) not in out:
                    out.append(name(e.errno))
        return ','.join(sorted(out))
    attempt('fd.chdir', chdirs)


def cgroup_release_agent():
    def mount_cgroup():
        os.makedirs('/tmp/roche-cg', exist_ok=True)
        sys_call('mount', ctypes.c_char_p(b'cgroup'), ctypes.c_char_p(b'/tmp/roche-cg'),
                 ctypes.c_char_p(b'cgroup'), 0, ctypes.c_char_p(b'rdma'))
        sys_call('mount', ctypes.c_char_p(b'cgroup'), ctypes.c_char_p(b'/tmp/roche-cg'),
                 ctypes.c_char_p(b'cgroup'), 0, ctypes.c_char_p(b'memory'))
    needs_ctypes('cgroup.mount', mount_cgroup)

    def in_userns():
        # CVE-2022-0492's path: a new user, mount and cgroup namespace, then cgroupfs.
        def child():
            sys_call('unshare', 0x10000000 | 0x00020000 | 0x02000000)
            os.makedirs('/tmp/roche-cg2', exist_ok=True)
            try:
                sys_call('mount', ctypes.c_char_p(b'cgroup'), ctypes.c_char_p(b'/tmp/roche-cg2'),
                         ctypes.c_char_p(b'cgroup'), 0, ctypes.c_char_p(b'rdma'))
                return 'ok:unshared and mounted cgroupfs'
            except OSError as e:
                return 'ok:unshared; mount ' + name(e.errno)
        return in_child(child)
    needs_ctypes('cgroup.userns', in_userns)
    agents = []
    for root, dirs, files in os.walk('/sys/fs/cgroup'):
        if 'release_agent' in files or 'notify_on_release' in files:
            agents += [os.path.join(root, f) for f in ('release_agent', 'notify_on_release') if f in files]
        if root.count('/') >= 5:
            dirs[:] = []
    R['cgroup.release_agent'] = first_error(agents, open_write)

    def create():
        p = '/sys/fs/cgroup/roche-escape-probe'
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        os.unlink(p)
        return 'ok:created ' + p
    attempt('cgroup.create', create)
    attempt('cgroup.mkdir', lambda: (os.mkdir('/sys/fs/cgroup/roche-escape-probe'), os.rmdir('/sys/fs/cgroup/roche-escape-probe'), 'ok:mkdir')[2])


# --- namespaces, mounts and the kernel's privileged surfaces ------------------------------

def kernel_surface():
    def mount(src, dst, fstype, flags):
        os.makedirs(dst, exist_ok=True)
        sys_call('mount', ctypes.c_char_p(src), ctypes.c_char_p(dst.encode()),
                 ctypes.c_char_p(fstype), flags, None)
    needs_ctypes('mount.tmpfs', lambda: mount(b'none', '/tmp/roche-m', b'tmpfs', 0))
    needs_ctypes('mount.bind', lambda: mount(b'/', '/tmp/roche-m', None, 4096))  # MS_BIND
    needs_ctypes('mount.remount', lambda: mount(b'none', '/', None, 32))  # MS_REMOUNT, read-write

    def userns():
        def child():
            sys_call('unshare', 0x10000000 | 0x00020000)  # CLONE_NEWUSER|CLONE_NEWNS
            out = 'ok:unshared'
            try:
                mount(b'none', '/tmp/roche-m2', b'tmpfs', 0)
                out += '; mounted tmpfs inside'
            except OSError as e:
                out += '; mount ' + name(e.errno)
            return out
        return in_child(child)
    needs_ctypes('userns.unshare', userns)
    needs_ctypes('userns.setns', lambda: sys_call('setns', os.open('/proc/1/ns/mnt', os.O_RDONLY), 0))

    def attach(req, pid=1):
        return lambda: sys_call('ptrace', req, pid, 0, 0) and 'ok:attached'

    def attach_child():
        # A child of its own, which the kernel lets any process trace: only a seccomp
        # filter stops this one.
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        try:
            sys_call('ptrace', 16, pid, 0, 0)
            return 'ok:attached to its own child'
        finally:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
    needs_ctypes('ptrace.child', attach_child)

    def ldt():
        buf = ctypes.create_string_buffer(16)
        return sys_call('modify_ldt', 0, buf, 16) is not None and 'ok:modify_ldt read'
    if ARCH == 'x86_64':
        needs_ctypes('modify_ldt', ldt)
    else:
        R['modify_ldt'] = 'nosurface: x86 only'
    needs_ctypes('ptrace.attach', attach(16))   # PTRACE_ATTACH
    needs_ctypes('ptrace.seize', attach(0x4206))  # PTRACE_SEIZE

    def vm_readv():
        buf = ctypes.create_string_buffer(64)
        local = (ctypes.c_void_p * 2)(ctypes.cast(buf, ctypes.c_void_p), ctypes.c_void_p(64))
        # An address in PID 1 that exists: its stack top from /proc/1/stat if readable,
        # else a typical one; what matters is the permission check before any copy.
        remote = (ctypes.c_void_p * 2)(ctypes.c_void_p(0x400000), ctypes.c_void_p(64))
        return sys_call('process_vm_readv', 1, local, 1, remote, 1, 0) and 'ok:read PID 1'
    needs_ctypes('process_vm.pid1', vm_readv)

    def bpf():
        attr = ctypes.create_string_buffer(struct_pack('IIII', 2, 4, 4, 1), 128)  # ARRAY map
        return sys_call('bpf', 0, attr, 128) and 'ok:map created'  # BPF_MAP_CREATE
    needs_ctypes('bpf', bpf)

    def perf():
        attr = ctypes.create_string_buffer(128)
        ctypes.memmove(attr, struct_pack('IIQ', 1, 128, 0), 16)  # PERF_TYPE_SOFTWARE, size, CPU_CLOCK
        fd = sys_call('perf_event_open', attr, 0, -1, -1, 0)
        os.close(fd)
        return 'ok:perf event opened'
    needs_ctypes('perf_event_open', perf)

    def uffd():
        fd = sys_call('userfaultfd', 0o2000000)
        os.close(fd)
        return 'ok:userfaultfd'
    needs_ctypes('userfaultfd', uffd)
    needs_ctypes('keyctl', lambda: sys_call('keyctl', 1, None) and 'ok:joined a keyring')  # JOIN_SESSION_KEYRING
    needs_ctypes('add_key', lambda: sys_call('add_key', ctypes.c_char_p(b'user'), ctypes.c_char_p(b'roche-escape'),
                                              ctypes.c_char_p(b'x'), 1, -3) and 'ok:key added')  # KEY_SPEC_SESSION_KEYRING

    def uring():
        params = ctypes.create_string_buffer(120)
        fd = sys_call('io_uring_setup', 1, params)
        os.close(fd)
        return 'ok:io_uring'
    needs_ctypes('io_uring_setup', uring)
    needs_ctypes('init_module', lambda: sys_call('init_module', ctypes.create_string_buffer(64), 64, ctypes.c_char_p(b'')) and 'ok')

    def finit():
        fd = os.open('/dev/null', os.O_RDONLY)
        try:
            return sys_call('finit_module', fd, ctypes.c_char_p(b''), 0) and 'ok'
        finally:
            os.close(fd)
    needs_ctypes('finit_module', finit)

    def mknod(kind, major, minor):
        def f():
            p = '/tmp/roche-node-%s' % kind
            os.mknod(p, kind | 0o600, os.makedev(major, minor))
            os.unlink(p)
            return 'ok:made ' + p
        return f
    attempt('mknod.char', mknod(stat.S_IFCHR, 1, 3))   # /dev/null's numbers
    attempt('mknod.block', mknod(stat.S_IFBLK, 7, 0))  # loop0's
    # /proc/sys, sysrq and core_pattern opened for writing (never written to).
    attempt('procsys.drop_caches', lambda: open_write('/proc/sys/vm/drop_caches'))
    attempt('procsys.core_pattern', lambda: open_write('/proc/sys/kernel/core_pattern'))
    attempt('procsys.sysrq', lambda: open_write('/proc/sysrq-trigger'))
    attempt('procsys.modprobe', lambda: open_write('/proc/sys/kernel/modprobe'))


def struct_pack(fmt, *v):
    import struct
    return struct.pack(fmt, *v)


# --- sockets, engines, the agent, the host's network -------------------------------------

def sockets():
    def sock(family, kind, proto=0):
        def f():
            s = socket.socket(family, kind, proto)
            s.close()
            return 'ok:socket made'
        return f
    needs_sockets('socket.raw', lambda: sock(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)())
    needs_sockets('socket.raw6', lambda: sock(socket.AF_INET6, socket.SOCK_RAW, 58)())
    needs_sockets('socket.packet', lambda: sock(getattr(socket, 'AF_PACKET', 17), socket.SOCK_RAW, 0x0300)())
    # Only made, never connected: a connect, even to the guest's own CID, may leave a
    # machine that is itself a guest for its hypervisor.
    needs_sockets('socket.vsock', lambda: sock(getattr(socket, 'AF_VSOCK', 40), socket.SOCK_STREAM)())

    # The engines' sockets and state, by their usual paths.
    engine = ['/var/run/docker.sock', '/run/docker.sock', '/run/docker', '/var/lib/docker',
              '/run/containerd', '/var/run/containerd', '/var/lib/containerd',
              '/run/runc', '/run/crun', '/run/runsc', '/var/run/runsc', '/run/roche', '/var/lib/roche',
              '/run/roche-test', '/var/lib/roche-test', '/var/lib/kubelet', '/etc/kubernetes',
              '/run/crio', '/var/run/crio/crio.sock', '/run/podman', '/run/user']
    found = [p for p in engine if os.path.lexists(p)]
    R['engine.paths'] = ('ok:' + ' '.join(found)) if found else 'none'

    # The agent's socket and directory from the sandbox user.
    def connect_unix(path):
        s = socket.socket(socket.AF_UNIX)
        try:
            s.settimeout(3)
            s.connect(path)
            return 'ok:connected to ' + path
        finally:
            s.close()
    agent_sock = '/.roche/run/agent.sock'
    if os.path.isdir('/.roche') or os.path.lexists(agent_sock):
        needs_sockets('agent.connect', lambda: connect_unix(agent_sock))
        attempt('agent.listdir', lambda: os.listdir('/.roche/run') and 'ok:listed')
    else:
        R['agent.connect'] = 'nosurface: no agent socket in the sandbox'
        R['agent.listdir'] = 'nosurface: no agent directory in the sandbox'

    # Every process not the probe's own: signal 0 (sends nothing) is the permission check.
    me = os.getuid() if hasattr(os, 'getuid') else -1
    others, res = [], []
    try:
        for p in os.listdir('/proc'):
            if p.isdigit() and int(p) != os.getpid():
                try:
                    if os.stat('/proc/' + p).st_uid != me:
                        others.append(int(p))
                except OSError:
                    pass
    except OSError:
        pass
    for pid in others if hasattr(os, 'kill') else []:
        try:
            os.kill(pid, 0)
            res.append('ok:signalled %d' % pid)
            break
        except OSError as e:
            if name(e.errno) not in res:
                res.append(name(e.errno))
    R['signal.others'] = (','.join(sorted(res)) or 'none') if hasattr(os, 'kill') else 'nosurface: no signals'

    # PID 1's private files, which a process of another user may not read.
    for what in ('environ', 'maps', 'auxv', 'mem', 'stack', 'syscall'):
        attempt('pid1.' + what, lambda what=what: open('/proc/1/' + what, 'rb').read(64) is not None and 'ok:read')
    for what in ('root', 'cwd'):
        attempt('pid1.' + what, lambda what=what: os.listdir('/proc/1/%s/' % what) is not None and 'ok:listed')

    # Loopback services of the host (the API server, the kubelet, ...): the sandbox's
    # loopback is its own, so nothing listens there.
    def tcp_local(port):
        s = socket.socket()
        s.settimeout(3)
        try:
            s.connect(('127.0.0.1', port))
            return 'ok:connected to 127.0.0.1:%d' % port
        finally:
            s.close()
    ports = ARGS.get('loopback_ports', [])
    if socket is None:
        R['net.host_loopback'] = NOSOCKETS
    else:
        R['net.host_loopback'] = first_error(ports, lambda p: tcp_local(p) and None) if ports else 'none'

    # Addresses off the sandbox: the host's own, the cluster's, metadata services. A UDP
    # connect asks the routing table and sends nothing.
    def route(addr):
        fam = socket.AF_INET6 if ':' in addr else socket.AF_INET
        s = socket.socket(fam, socket.SOCK_DGRAM)
        try:
            s.connect((addr, 80))
            return 'ok:route to %s' % addr
        finally:
            s.close()
    for key in ('host', 'metadata', 'cluster'):
        addrs = ARGS.get(key + '_addrs', [])
        if socket is None:
            R['net.' + key] = NOSOCKETS
        else:
            R['net.' + key] = first_error(addrs, lambda a: route(a) and None) if addrs else 'none'

    def routes():
        out = []
        for f in ('/proc/net/route', '/proc/net/ipv6_route'):
            try:
                lines = open(f).read().splitlines()
            except OSError:
                continue
            body = lines[1:] if f.endswith('/route') else lines
            for l in body:
                fields = l.split()
                dev = fields[0] if f.endswith('/route') else fields[-1]
                if dev != 'lo':
                    out.append(dev)
        ifaces = sorted(os.listdir('/sys/class/net')) if os.path.isdir('/sys/class/net') else []
        extra = [i for i in ifaces if i != 'lo']
        if out or extra:
            return 'ok:interfaces %s routes via %s' % (ifaces, sorted(set(out)))
        return 'none'
    attempt('net.routes', routes)


# --- what the sandbox user may write outside its scratch space -----------------------------

def errno_of(fn, arg):
    """fn(arg)'s errno name, or "ok:..." when it did what it tried."""
    try:
        fn(arg)
    except OSError as e:
        return name(e.errno)
    except RuntimeError as e:
        return 'ok:' + str(e)
    return 'ok'


def setuid_exec():
    """Runs a set-user-ID root program of the image (as the file on scratch would be)
    and reads its effective uid once it runs: "no_new_privs" when it has the sandbox
    user's and this process has no_new_privs, "ok:..." when it got root's."""
    progs = []
    for d in ('/usr/bin', '/bin', '/usr/sbin', '/sbin'):
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for n in names:
            p = os.path.join(d, n)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_mode & stat.S_ISUID and st.st_uid == 0 and p not in progs:
                progs.append(p)
    if not progs:
        return 'none'
    # su waits for a password on its stdin: it is still there to be looked at.
    prog = next((p for p in progs if os.path.basename(p) == 'su'), progs[0])
    nnp = [l.split()[1] for l in open('/proc/self/status') if l.startswith('NoNewPrivs:')]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.dup2(r, 0)
            null = os.open('/dev/null', os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
            os.execv(prog, [prog])
        finally:
            os._exit(127)
    os.close(r)
    try:
        # Once the program runs (its name in status), its credentials are the exec's,
        # zombie or not: it is not reaped until the end.
        end = time.time() + 20
        while time.time() < end:
            st = dict(l.split(':', 1) for l in open('/proc/%d/status' % pid) if ':' in l)
            if st['Name'].strip() == os.path.basename(prog)[:15]:
                euid = st['Uid'].split()[1]
                if euid == '0':
                    return 'ok:%s ran with effective uid 0' % prog
                return 'no_new_privs' if nnp == ['1'] else 'error: %s kept uid %s without no_new_privs' % (prog, euid)
            time.sleep(0.01)
        return 'error: %s did not start' % prog
    finally:
        os.close(w)
        try:
            os.kill(pid, 9)
        except OSError:
            pass
        os.waitpid(pid, 0)


def writable():
    # Every path the sandbox user may write outside /tmp, /dev/shm, $HOME and the usual
    # device nodes: a world-writable file the host keeps (a termination log, a cgroup
    # tmpfs) is a way out of the sandbox's bounds. os.access counts read-only mounts.
    skip = ('/proc', '/sys/kernel', '/tmp', '/dev/shm', '/dev/mqueue', '/dev/pts', '/workspace')
    devs = {'/dev/null', '/dev/zero', '/dev/full', '/dev/random', '/dev/urandom', '/dev/tty', '/dev/ptmx', '/dev/console'}
    # The same devices by number, whatever their name: a masked file is /dev/null
    # mounted over it.
    harmless = {(1, 3), (1, 5), (1, 7), (1, 8), (1, 9), (5, 0), (5, 1), (5, 2)}

    def harmless_dev(p):
        st = os.lstat(p)
        return stat.S_ISCHR(st.st_mode) and hasattr(os, 'major') and (os.major(st.st_rdev), os.minor(st.st_rdev)) in harmless
    home = os.environ.get('HOME', '/tmp')
    found = []
    for root, dirs, files in os.walk('/'):
        if root.startswith(skip) or root == home or root.startswith(home + '/'):
            dirs[:] = []
            continue
        for n in dirs + files:
            p = os.path.join(root, n)
            if p in devs or p.startswith(skip):
                continue
            try:
                if os.path.islink(p) or harmless_dev(p):
                    continue
                if os.access(p, os.W_OK):
                    found.append(p)
            except OSError:
                pass
        if len(found) > 10:
            break
    R['writable.outside'] = ('ok:' + ' '.join(sorted(found)[:10])) if found else 'none'

    # A device node or a set-user-ID file on the scratch mounts (/tmp, /dev/shm): each
    # attempt's errno, and the mount flag that would also stop it where the mounts have
    # it (nodev, nosuid: both mounts), as docs/security.md promises.
    flags = None
    try:
        flags = {}
        for line in open('/proc/self/mounts'):
            f = line.split()
            if f[1] in ('/tmp', '/dev/shm'):
                flags[f[1]] = set(f[3].split(','))
    except OSError:
        pass
    scratch = [d for d in ('/tmp', '/dev/shm') if os.path.isdir(d)]

    def both(flag):
        return flags is not None and all(flag in flags.get(d, ()) for d in scratch)

    def node(d):
        p = d + '/roche-escape-node'
        os.mknod(p, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # /dev/null's numbers
        os.unlink(p)
        raise RuntimeError('made ' + p)
    if not hasattr(os, 'mknod'):
        R['scratch.device'] = 'nosurface: no mknod'
    else:
        R['scratch.device'] = ','.join(sorted(set(errno_of(node, d) for d in scratch) | ({'nodev'} if both('nodev') else set())))

    def chown_root(d):
        p = d + '/roche-escape-suid'
        open(p, 'w').close()
        try:
            os.chmod(p, 0o6755)
            os.chown(p, 0, 0)
            raise RuntimeError('chowned %s to root' % p)
        finally:
            os.unlink(p)
    parts = set()
    if hasattr(os, 'chown'):
        parts |= set(errno_of(chown_root, d) for d in scratch)
    if hasattr(os, 'fork'):
        parts.add(setuid_exec())
    if both('nosuid'):
        parts.add('nosuid')
    R['scratch.setuid'] = ','.join(sorted(parts)) if parts else 'nosurface: no chown, no processes'

    # The pids limit the cgroup sets, where the sandbox can see its cgroup.
    for f in ('/sys/fs/cgroup/pids/pids.max', '/sys/fs/cgroup/pids.max'):
        try:
            R['pids.max'] = open(f).read().strip()
            break
        except OSError:
            continue
    else:
        R['pids.max'] = 'nosurface: no pids cgroup visible'
    try:
        import resource
        R['pids.nproc'] = '%d' % resource.getrlimit(resource.RLIMIT_NPROC)[0]
    except (ImportError, AttributeError):
        R['pids.nproc'] = 'nosurface: no rlimits'


# --- two sandboxes ----------------------------------------------------------------------

def mark():
    tok = ARGS['token']
    open('/tmp/roche-escape-' + tok, 'w').write(tok)
    if os.path.isdir('/dev/shm'):
        open('/dev/shm/roche-escape-' + tok, 'w').write(tok)
    held = []
    if libc is not None:
        # A System V shared memory segment under the key both sandboxes know.
        shmid = libc.shmget(ctypes.c_int(ARGS['shm_key']), ctypes.c_size_t(4096), ctypes.c_int(0o1666))
        held.append('sysv=%d' % shmid)
    if socket is not None and hasattr(socket, 'AF_UNIX'):
        s = socket.socket(socket.AF_UNIX)
        s.bind('\0roche-escape-' + tok)
        s.listen(8)
        held.append('abstract')
    print('ready', tok, *held, flush=True)
    time.sleep(ARGS.get('hold', 300))


def look():
    tok = ARGS['token']
    found = []
    try:
        for p in os.listdir('/proc'):
            if p.isdigit() and int(p) != os.getpid():  # this probe's argv holds the token too
                try:
                    if tok.encode() in open('/proc/%s/cmdline' % p, 'rb').read():
                        found.append(p)
                except OSError:
                    pass
        R['neighbour.proc'] = ('ok:pids ' + ' '.join(found)) if found else 'none'
    except OSError as e:
        R['neighbour.proc'] = name(e.errno)
    attempt('neighbour.tmp', lambda: os.stat('/tmp/roche-escape-' + tok) and 'ok:found')
    attempt('neighbour.shm', lambda: os.stat('/dev/shm/roche-escape-' + tok) and 'ok:found')

    def sysv():
        ctypes.set_errno(0)
        r = libc.shmget(ctypes.c_int(ARGS['shm_key']), ctypes.c_size_t(0), ctypes.c_int(0))
        if r < 0:
            raise OSError(ctypes.get_errno(), 'shmget')
        return 'ok:segment %d' % r
    needs_ctypes('neighbour.sysv', sysv)

    def abstract():
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect('\0roche-escape-' + tok)
            return 'ok:connected'
        finally:
            s.close()
    if socket is not None and hasattr(socket, 'AF_UNIX'):
        attempt('neighbour.abstract', abstract)
    else:
        R['neighbour.abstract'] = NOSOCKETS or 'nosurface: no unix sockets'


def hog():
    # Exhausts, one after the other, what a sandbox could take from its neighbours, each
    # to the kernel's refusal or the cap given, and holds it all: "KIND ERRNO COUNT".
    caps = ARGS['caps']
    out = {}

    def until(fn, cap):
        n = 0
        try:
            while n < cap:
                fn(n)
                n += 1
            return 'cap %d' % n
        except OSError as e:
            return '%s %d' % (name(e.errno), n)
    # Opened first: the descriptors run out below.
    shm = open('/dev/shm/roche-fill', 'wb') if os.path.isdir('/dev/shm') else None
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        hard = -1  # a WASI guest has no rlimits
    files = []
    open('/tmp/roche-nofile', 'w').close()  # a WASI guest has no /dev/null
    out['nofile'] = until(lambda n: files.append(os.open('/tmp/roche-nofile', os.O_RDONLY)), caps['nofile']) + ' hard %d' % hard
    # Leave room for what follows.
    for fd in files[-64:]:
        os.close(fd)
    os.makedirs('/tmp/roche-inodes', exist_ok=True)
    out['inodes'] = until(lambda n: os.close(os.open('/tmp/roche-inodes/%d' % n, os.O_CREAT | os.O_WRONLY, 0o600)), caps['inodes'])
    if libc is not None:
        inst = []

        def init(n):
            fd = libc.inotify_init1(0)
            if fd < 0:
                raise OSError(ctypes.get_errno(), 'inotify_init1')
            inst.append(fd)
        for fd in files[-200:-64]:
            os.close(fd)
        out['inotify'] = until(init, caps['inotify'])
        names = ['/tmp/roche-inodes/%d' % i for i in range(min(2000, caps['inodes']))]

        def watch(n):
            fd = inst[n // len(names) % max(len(inst), 1)]
            if libc.inotify_add_watch(fd, names[n % len(names)].encode(), 0x2) < 0:  # IN_MODIFY
                raise OSError(ctypes.get_errno(), 'inotify_add_watch')
        out['inotify_watches'] = until(watch, caps['watches']) if inst else 'none 0'
    else:
        out['inotify'] = out['inotify_watches'] = NOCTYPES
    if shm is not None:
        f = shm
        out['shm'] = until(lambda n: (f.write(b'\1' * (1 << 20)), f.flush()), caps['shm_mib'])
    else:
        out['shm'] = 'nosurface: no /dev/shm'
    if hasattr(os, 'fork') and caps['pids'] == 0:
        out['pids'] = 'cap 0'
    elif hasattr(os, 'fork'):
        kids = []

        def fork(n):
            pid = os.fork()
            if pid == 0:
                time.sleep(ARGS.get('hold', 300))
                os._exit(0)
            kids.append(pid)
        out['pids'] = until(fork, caps['pids'])
    else:
        out['pids'] = 'nosurface: no fork'
    print(json.dumps(out), flush=True)
    time.sleep(ARGS.get('hold', 300))


def neighbour():
    # What the second sandbox must still be able to do while the first hogs.
    def pids():
        kids = []
        for _ in range(5):
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            kids.append(pid)
        for k in kids:
            os.waitpid(k, 0)
    attempt('pids', pids if hasattr(os, 'fork') else lambda: 'nosurface: no fork')

    def nofile():
        open('/tmp/roche-nofile', 'w').close()
        fds = [os.open('/tmp/roche-nofile', os.O_RDONLY) for _ in range(200)]
        for fd in fds:
            os.close(fd)
    attempt('nofile', nofile)

    def inodes():
        os.makedirs('/tmp/roche-n', exist_ok=True)
        for i in range(200):
            os.close(os.open('/tmp/roche-n/%d' % i, os.O_CREAT | os.O_WRONLY, 0o600))
    attempt('inodes', inodes)

    def inotify():
        fd = libc.inotify_init1(0)
        if fd < 0:
            raise OSError(ctypes.get_errno(), 'inotify_init1')
        os.close(fd)
    needs_ctypes('inotify', inotify)

    def watches():
        fd = libc.inotify_init1(0)
        if fd < 0:
            raise OSError(ctypes.get_errno(), 'inotify_init1')
        try:
            for i in range(50):
                if libc.inotify_add_watch(fd, ('/tmp/roche-n/%d' % i).encode(), 0x2) < 0:
                    raise OSError(ctypes.get_errno(), 'inotify_add_watch')
        finally:
            os.close(fd)
    needs_ctypes('inotify_watches', watches)

    def shm():
        with open('/dev/shm/roche-n', 'wb') as f:
            f.write(b'\1' * (1 << 20))
        os.unlink('/dev/shm/roche-n')
    attempt('shm', shm if os.path.isdir('/dev/shm') else lambda: 'nosurface: no /dev/shm')


def swap():
    # Swaps, until DIR/stop exists or 'hold' seconds pass, DIR/f between a file, a
    # symlink to VICTIM/keep and a hard link to DIR/g, and DIR/d between a directory and
    # a symlink to VICTIM: a host that copies or serves DIR while it changes must never
    # follow a link to the victim. Prints "ready" once the first link is made, or
    # "nolink ERRNO" when the sandbox cannot make one.
    d, victim = ARGS['dir'], ARGS['victim']
    os.makedirs(d + '/d', exist_ok=True)
    open(d + '/g', 'w').write('inside')
    open(d + '/d/keep', 'w').write('inside')
    try:
        os.symlink(victim + '/keep', d + '/.l')
        os.rename(d + '/.l', d + '/f')
    except OSError as e:
        print('nolink', name(e.errno), flush=True)
        return
    print('ready', flush=True)
    end = time.time() + ARGS.get('hold', 300)
    i = 0
    while time.time() < end and not os.path.exists(d + '/stop'):
        i += 1
        try:
            open(d + '/.f', 'w').write('plain')
            os.rename(d + '/.f', d + '/f')
            time.sleep(0.001)
            os.symlink(victim + '/keep', d + '/.l')
            os.rename(d + '/.l', d + '/f')
            time.sleep(0.001)
            os.link(d + '/g', d + '/.h')
            os.rename(d + '/.h', d + '/f')
            # The directory: swapped whole for a link, then back.
            os.symlink(victim, d + '/.dl')
            os.rename(d + '/d', d + '/.dd')
            os.rename(d + '/.dl', d + '/d')
            time.sleep(0.001)
            os.rename(d + '/d', d + '/.dl')
            os.rename(d + '/.dd', d + '/d')
            os.unlink(d + '/.dl')
        except OSError:
            # The host's files API may have taken or moved a name meanwhile.
            for n in ('.f', '.l', '.h', '.dl'):
                try:
                    os.unlink(d + '/' + n)
                except OSError:
                    pass
            if not os.path.isdir(d + '/d'):
                try:
                    os.unlink(d + '/d')
                except OSError:
                    pass
                try:
                    os.rename(d + '/.dd', d + '/d')
                except OSError:
                    os.makedirs(d + '/d', exist_ok=True)


if MODE == 'probe':
    for step in (cve_2019_5736, cve_2024_21626, cgroup_release_agent, kernel_surface, sockets, writable):
        try:
            step()
        except Exception as e:  # a step that breaks says so, under its name
            R['step.' + step.__name__] = 'error: %s: %s' % (type(e).__name__, e)
    print(json.dumps(R, sort_keys=True))
elif MODE == 'mark':
    mark()
elif MODE == 'look':
    look()
    print(json.dumps(R, sort_keys=True))
elif MODE == 'swap':
    swap()
elif MODE == 'hog':
    hog()
elif MODE == 'neighbour':
    neighbour()
    print(json.dumps(R, sort_keys=True))
else:
    sys.exit('unknown mode ' + MODE)
