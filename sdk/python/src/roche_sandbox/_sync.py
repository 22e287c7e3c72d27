# Generated from _async.py by sdk/python/unasync.py: do not edit. Edit _async.py, then
# run `python3 sdk/python/unasync.py` (a test fails while this file is stale).
"""The synchronous API: Roche, Sandbox and ExecStream, the same surface as the asyncio one.
Calls block the calling thread; Roche is safe to share between threads."""

from __future__ import annotations

import dataclasses
from types import TracebackType
# typing.List: inside these classes "list" names their list() method.
from typing import Iterator, List, Mapping, Optional, Sequence, Type, Union

from . import _syncio, _discovery, _tls
from ._files import Files
from ._commands import Commands
from ._pty import Pty
from ._transport import CLITransport, ConnectClient, DaemonTransport, Transport
from ._choice import PROBE_TIMEOUT, Choice, no_context, remaining_life
from ._deadline import Deadline
from ._wire import StreamItem
from .errors import InvalidConfig, RocheError
from .types import (
    DEFAULT_CODE_TIMEOUT,
    CodeCallbacks,
    CodeRequest,
    Context,
    ContextLike,
    CopyReport,
    Execution,
    Handler,
    ExecRequest,
    ExecResult,
    MountLike,
    OutputEvent,
    SandboxInfo,
    SnapshotInfo,
    EgressDecision,
    Secret,
    StoredSecret,
    WorkspaceInfo,
    context_id,
    make_code_request,
    check_list_filter,
    make_config,
    make_exec_request,
    timeout_seconds,
)

class Roche:
    """Creates sandboxes with secure defaults on one provider ("docker", "wasm", ...).

        roche = Roche()
        with roche.create() as sandbox:
            result = sandbox.exec(["python3", "-c", code])

    Calls go to roched when it answers on its socket (ROCHE_SOCKET, else the default
    path) and serves the provider; otherwise to the roche CLI (ROCHE_CLI, else roche on
    PATH). ``transport="daemon"`` or ``"cli"`` forces one. ``request_timeout`` bounds
    how long any call waits for Roche beyond the time a command may run. A roched on TCP
    (``address=``) wants a token: ``token=``, ``token_file=`` (a file only you can read),
    ``ROCHE_TOKEN_FILE`` or ``ROCHE_TOKEN``. At an ``https://`` address its certificate is
    verified against ``ca=`` (a PEM file), else ``ROCHE_CA_FILE``, else the system's CAs;
    ``client_cert=`` and ``client_key=`` (or ``ROCHE_CLIENT_CERT``, ``ROCHE_CLIENT_KEY``)
    present a client certificate to a roched with ``--client-ca``. ``traceparent=`` (a W3C
    traceparent, e.g. opentelemetry's ``propagate.inject({})["traceparent"]``) is sent with
    every call to roched, whose spans are then children of that span (docs/traces.md).
    """

    def __init__(self, provider: str = "docker", *, transport: str = "auto", socket: Optional[str] = None,
                 address: Optional[str] = None, token: Optional[str] = None, cli: Optional[str] = None,
                 request_timeout: float = 60.0, token_file: Optional[str] = None, ca: Optional[str] = None,
                 client_cert: Optional[str] = None, client_key: Optional[str] = None,
                 traceparent: Optional[str] = None) -> None:
        self._choice = Choice(provider, transport, socket, address, token, cli, request_timeout, token_file,
                              ca, client_cert, client_key, traceparent)
        self._chosen: _syncio.Once[Transport] = _syncio.Once()

    @property
    def provider(self) -> str:
        return self._choice.provider

    @property
    def transport(self) -> str:
        """"daemon" or "cli": how this Roche reaches Roche (decided on first use)."""
        return self._resolve().name

    def _resolve(self) -> Transport:
        return self._chosen.get(self._choose)

    def _choose(self) -> Transport:
        c = self._choice
        why: Optional[RocheError] = None
        if c.transport in ("auto", "daemon"):
            try:
                health = ConnectClient(c.endpoint).health(PROBE_TIMEOUT)
            except RocheError as e:
                why = e
            else:
                if c.serves(health):
                    return DaemonTransport(c.endpoint)
                why = c.not_served(health)
            # A roched whose certificate is not trusted is no reason to run elsewhere.
            if c.transport == "daemon" or isinstance(why, _tls.TLSFailure):
                raise c.no_daemon(why)
        path = _discovery.find_cli(c.cli)
        if path is None:
            raise c.no_cli(why.message if why else "transport='cli' was asked for")
        return CLITransport(path)

    def _deadline(self) -> Deadline:
        return Deadline(self._choice.request_timeout)

    def create(self, image: Optional[str] = None, *, network: bool = False, writable: bool = False,
               timeout_secs: int = 300, memory: Union[str, int] = "512m", cpus: float = 1.0,
               pids_limit: int = 64, env: Optional[Mapping[str, str]] = None,
               mounts: Optional[Sequence[MountLike]] = None, workdir: Optional[str] = None,
               user: Optional[str] = None,
               network_allowlist: Optional[Sequence[str]] = None, workspace: Optional[str] = None,
               from_snapshot: Optional[str] = None, disk: Union[str, int] = "1g",
               workspace_size: Union[str, int, None] = None, leased: bool = True,
               metadata: Optional[Mapping[str, str]] = None, secrets: Optional[Sequence[Secret]] = None,
               egress_learn: bool = False) -> "Sandbox":
        """Creates a sandbox. Every default is the safe one; override what you need.

        ``image`` defaults to $ROCHE_IMAGE, else python:3.12-slim. ``timeout_secs`` is the
        sandbox's lifetime: it is destroyed after. Use it as a context manager to destroy
        it as soon as you are done, even when the body raises. The sandbox is also tied to
        this process (leased): when the process ends, however it ends (``kill -9``
        included), or this Roche is closed, it is destroyed within seconds (the async
        API holds it from a thread, not a task: it outlives the event loop that created
        it, ``asyncio.run``'s). For one meant to outlive the process (found later with
        ``get(id)``), pass ``leased=False``: it then lives until destroyed or until its
        lifetime ends. ``network_allowlist`` (e.g. ``["pypi.org", "*.npmjs.org"]``) lets
        it reach only those hosts over HTTP(S), through a proxy roched runs; it still has
        no network otherwise. ``workspace="name"`` mounts that persistent workspace at
        /workspace (writable even on the read-only root; made if new): its files outlive
        the sandbox, for the next one created with the same name.
        ``from_snapshot="name"`` starts from a snapshot's files (see ``snapshot``)
        instead of the image. ``disk`` bounds what a writable root may hold (``"1g"`` by
        default; past it writes fail with ENOSPC; ``"0"`` is no limit), and
        ``workspace_size`` the size of a new workspace (``"1g"`` by default; an existing
        workspace keeps its own, and asking it for another is InvalidConfig).
        ``metadata={"user": "alice"}`` labels the sandbox (E2B's ``metadata``): it is
        kept with it, returned in ``info.metadata`` and by ``list``, which can select on
        it; at most 32 pairs, keys of letters, digits, '_', '.' and '-' not starting
        with "roche" (Roche's own), values up to 512 bytes.
        ``secrets=[Secret("API_TOKEN", ["api.example.com"], value=tok, header="Authorization")]``
        brokers credentials the sandbox never sees (its ``API_TOKEN`` holds a placeholder
        the proxy replaces on requests to those hosts only; ``from_store=True`` takes the
        value from roched's secret store). ``egress_learn=True`` is learn mode: the proxy
        allows only the allowlist (nothing without one) and ``egress_suggest()`` then
        names every entry the refusals needed.
        """
        cfg = make_config(image, network, writable, timeout_secs, memory, cpus, pids_limit, env, mounts,
                          workdir, user, network_allowlist, workspace, from_snapshot,
                          disk, workspace_size, leased, metadata, secrets, egress_learn)
        t = self._resolve()
        info = t.create(self.provider, cfg, self._deadline())
        return Sandbox(self, t, info)

    def get(self, sandbox_id: str) -> "Sandbox":
        """A handle on an existing sandbox; SandboxNotFound when there is none."""
        t = self._resolve()
        return Sandbox(self, t, t.inspect(sandbox_id, self._deadline()))

    def resume(self, sandbox_id: str) -> "Sandbox":
        """Brings back a sandbox paused to disk (``sandbox.pause(to_disk=True)``), where it
        was: its processes, code contexts and open files, with the lifetime it had left;
        returns a handle on it. Also from another process or after a restart of roched,
        for a sandbox made with ``leased=False`` (a leased one goes with the process that
        made it). Providers without memory snapshots (all but vm's qemu) refuse it with
        Unsupported."""
        t = self._resolve()
        return Sandbox(self, t, t.resume(sandbox_id, self._deadline()))

    def inspect(self, sandbox_id: str) -> SandboxInfo:
        """Describes a sandbox, also one that ended within roched's --ended-retention (1 h
        by default): its state is then "exited" and ``end`` says why it ended (oom, pids,
        lifetime, lease_lost, destroyed and by whom, ...) with the evidence. SandboxNotFound
        for one never known or forgotten; the CLI transport in direct mode keeps no ends."""
        return self._resolve().inspect_ended(sandbox_id, self._deadline())

    def list(self, metadata: Optional[Mapping[str, str]] = None,
             state: Optional[str] = None) -> list[SandboxInfo]:
        """This provider's sandboxes (a daemon's idle pooled ones are not listed): with
        ``metadata``, those created with every pair of it; with ``state``, those
        ``"running"``, ``"paused"``, ``"exited"`` or ``"created"``."""
        check_list_filter(metadata, state)
        return self._resolve().list(self.provider, self._deadline(), metadata, state)

    def snapshots(self) -> List[SnapshotInfo]:
        """This provider's snapshots."""
        return self._resolve().snapshots(self.provider, self._deadline())

    def delete_snapshot(self, name: str) -> None:
        """Deletes a snapshot; InUse while a sandbox made from it lives."""
        self._resolve().delete_snapshot(self.provider, name, self._deadline())

    def workspaces(self) -> List[WorkspaceInfo]:
        """This provider's persistent workspaces, with the sandboxes using each."""
        return self._resolve().workspaces(self.provider, self._deadline())

    def delete_workspace(self, name: str) -> None:
        """Deletes a workspace and its files; InUse while a sandbox has it mounted."""
        self._resolve().delete_workspace(self.provider, name, self._deadline())

    def set_secret(self, name: str, value: str, *,
                   sandbox: Union[str, "Sandbox", None] = None) -> List[str]:
        """Stores ``value`` under ``name`` in roched's secret store (your tenant's), for
        sandboxes created with ``Secret(name, hosts, from_store=True)``; setting it again
        rotates it: every running sandbox that took it from the store sends the new value
        from its next request on, without a restart. Returns those sandboxes' ids. With
        ``sandbox=`` (an id or a sandbox), replaces the value of that running sandbox's
        secret only, stores nothing, and returns its id. roched holds values in memory
        only (a restarted roched has none: set them again); the value crosses roched's
        API, or the roche CLI's standard input (never its command line). At most 64 KiB,
        no control characters (it goes in a header): else InvalidConfig."""
        sid = sandbox if isinstance(sandbox, str) or sandbox is None else sandbox.id
        return self._resolve().set_secret(name, value, sid, self._deadline())

    def list_secrets(self) -> List[StoredSecret]:
        """Your stored secrets, never their values: when each was set, and the running
        sandboxes that took it from the store."""
        return self._resolve().list_secrets(self._deadline())

    def remove_secret(self, name: str) -> None:
        """Takes a secret out of the store (SandboxNotFound, saying so, when it is not
        there). Running sandboxes keep the value they have: destroy them, or
        ``set_secret(name, other, sandbox=...)``, to revoke it there."""
        self._resolve().remove_secret(name, self._deadline())

    def close(self) -> None:
        """Releases kept connections, and lets go of the sandboxes this Roche created
        leased (the default), which are then destroyed within seconds; those created
        with ``leased=False`` are left as they are."""
        t = self._chosen.made()
        if t is not None:
            t.close()


class Sandbox:
    """A sandbox. As a context manager (``with``) it is destroyed on exit, even when
    the body raises."""

    def __init__(self, roche: Roche, transport: Transport, info: SandboxInfo) -> None:
        self._roche = roche
        self._t = transport
        self.info = info

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def provider(self) -> str:
        return self.info.provider

    @property
    def files(self) -> "Files":
        """The sandbox's files, as its user (E2B's ``sandbox.files``): ``read``,
        ``write``, ``list``, ``get_info``/``stat``, ``exists``, ``make_dir``,
        ``rename``, ``remove`` and ``watch_dir``, file content streamed both ways."""
        return Files(self)

    @property
    def pty(self) -> "Pty":
        """Terminals in this sandbox (through roched): ``sandbox.pty.create(cols=, rows=,
        cmd=, on_data=)`` returns a handle with send_input, resize, kill and wait."""
        return Pty(self)

    @property
    def commands(self) -> "Commands":
        """Commands that belong to the sandbox, E2B's way: ``sandbox.commands.run(cmd,
        background=True)`` returns a handle (pid, wait, kill, send_stdin, close_stdin,
        disconnect); ``list()``, ``connect(pid, stdout_offset, stderr_offset)``,
        ``send_stdin``, ``close_stdin``, ``kill`` and ``signal`` reach any of them, also
        from another process, after a disconnect or a restart of roched."""
        return Commands(self)

    def __repr__(self) -> str:
        return f"Sandbox(id={self.id[:12]!r}, provider={self.provider!r}, image={self.info.image!r})"

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        # In the async API, a cancelled task still destroys its sandbox on the way out.
        _syncio.uncancellable(self.destroy)

    def _exec_deadline(self, req: ExecRequest) -> Deadline:
        run = req.timeout if req.timeout else remaining_life(self.info)
        if run is None:
            return Deadline(None)
        return Deadline(run + self._roche._choice.request_timeout)

    def exec(self, cmd: Sequence[str], timeout: Optional[float] = None,
             stdin: Union[bytes, str, None] = None, *, env: Optional[Mapping[str, str]] = None,
             workdir: Optional[str] = None, idempotency_key: Optional[str] = None) -> ExecResult:
        """Runs a command and waits for it.

        ``timeout`` kills the command (and all it started) after that many seconds and
        sets ``timed_out``; None means the sandbox's remaining lifetime. ``stdin`` is the
        command's whole standard input. A non-zero exit is a result, not an exception.
        ``idempotency_key`` (e.g. ``"build-42"``) makes the command the sandbox's rather
        than this call's: at most one runs per key, a call whose connection to roched is
        lost (roched restarting, a replica gone) is retried and joins it, and cancelling
        the call leaves it running (``commands.kill`` stops it).
        """
        req = make_exec_request(cmd, timeout, stdin, env, workdir)
        if idempotency_key is not None:
            if not isinstance(idempotency_key, str) or not idempotency_key:
                raise InvalidConfig(f"idempotency_key {idempotency_key!r}: give a non-empty string, or None")
            req = dataclasses.replace(req, idempotency_key=idempotency_key)
        return self._t.exec(self.id, req, self._exec_deadline(req))

    def exec_stream(self, cmd: Sequence[str], timeout: Optional[float] = None,
                    stdin: Union[bytes, str, None] = None, *, env: Optional[Mapping[str, str]] = None,
                    workdir: Optional[str] = None) -> "ExecStream":
        """Runs a command and yields its output as it is produced (OutputEvent:
        ``for event in stream``); the ExecResult is ``.result`` once the iteration
        ends. Closing the stream early (or leaving its ``with`` block) kills the
        command."""
        req = make_exec_request(cmd, timeout, stdin, env, workdir)
        return ExecStream(self._t.exec_stream(self.id, req, self._exec_deadline(req)))

    def write_file(self, path: str, data: Union[bytes, str], mode: int = 0o644) -> None:
        """Writes data to the absolute sandbox path, replacing it, creating parents."""
        if isinstance(data, str):
            data = data.encode()
        self._t.write_file(self.id, path, bytes(data), mode, self._roche._deadline())

    def read_file(self, path: str, *, max_bytes: Optional[int] = None) -> bytes:
        """The content of a file in the sandbox. A file over max_bytes (default 1 GiB)
        raises ResourceExhausted before any of it is read; a symlink, PermissionDenied."""
        return self._t.read_file(self.id, path, self._roche._deadline(), max_bytes)

    def copy_to(self, src: str, dst: str, *, max_bytes: Optional[int] = None) -> CopyReport:
        """Copies the host file or directory src to the absolute sandbox path dst. Nothing
        below src is followed (symlinks are copied as symlinks); a copy of more than
        max_bytes of file content (default 1 GiB) raises ResourceExhausted."""
        return self._t.copy_to(self.id, src, dst, self._roche._deadline(), max_bytes)

    def copy_from(self, src: str, dst: str, *, max_bytes: Optional[int] = None,
                  preserve_links: bool = False) -> CopyReport:
        """Copies the sandbox file or directory src to the host path dst (its new name).
        Nothing at or below dst is followed if it is a symlink (it is replaced); the
        sandbox's symlinks are left out, and counted in the report (``.note`` says why),
        unless preserve_links=True, and even then only those pointing inside dst are
        made. A copy of more than max_bytes (default 1 GiB) raises ResourceExhausted
        before the file that passes it is written; sparse files stay sparse."""
        return self._t.copy_from(self.id, src, dst, self._roche._deadline(), max_bytes, preserve_links)

    def set_timeout(self, seconds: Union[int, float]) -> None:
        """Ends the sandbox ``seconds`` from now instead of when it was to end, sooner or
        later (E2B's ``set_timeout``): at least 1 s, at most 24 h and, through roched, the
        tenant's maximum (InvalidConfig beyond it). ``info.expires_at`` takes the new
        end, which is also what ends the sandbox. A kubernetes sandbox can be given more
        time only up to the end it was created with (Unsupported beyond it)."""
        self.info = self._t.set_timeout(self.id, timeout_seconds(seconds), self._roche._deadline())

    def pause(self, *, to_disk: bool = False) -> None:
        """Freezes every process in the sandbox (``unpause`` thaws them). With
        ``to_disk=True`` (E2B's pause) it saves the sandbox whole instead, memory,
        processes and code contexts included, and stops it: it then holds no memory or
        CPU and its lifetime stops running until ``Roche.resume(id)`` (or ``resume()``)
        brings it back where it was. To disk is the vm provider's (qemu) only: others
        raise Unsupported, saying so in one line."""
        if to_disk:
            self._t.pause_to_disk(self.id, self._roche._deadline())
        else:
            self._t.pause(self.id, True, self._roche._deadline())

    def resume(self) -> "Sandbox":
        """Brings this sandbox back from ``pause(to_disk=True)`` (``Roche.resume``);
        ``info`` takes its new description. Returns it."""
        self.info = self._t.resume(self.id, self._roche._deadline())
        return self

    def fork(self, n: int = 1) -> "List[Sandbox]":
        """Makes ``n`` (1 to 64) new sandboxes, each a copy of this one as it is now
        (running, or paused to disk), memory, processes and code contexts included, each
        with its own id, randomness and whole lifetime; this one goes on as it was. The
        forks are not leased (roched holds none for this process): destroy them (each is
        a context manager) or let their lifetime end. The vm provider's (qemu) only:
        others raise Unsupported."""
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 64:
            raise InvalidConfig(f"fork({n!r}): give 1 to 64 forks")
        forks = self._t.fork(self.id, n, self._roche._deadline())
        return [Sandbox(self._roche, self._t, info) for info in forks]

    def unpause(self) -> None:
        """Thaws a paused sandbox."""
        self._t.pause(self.id, False, self._roche._deadline())

    def reset(self, keep_workspace: bool = True) -> "Sandbox":
        """Recreates the sandbox from its image and settings, with the lifetime it had
        left: every change to its files and every process is gone; its workspace is kept
        unless ``keep_workspace=False``. The new sandbox has a new id, which this object
        takes on (``id``, ``info``); returns it."""
        self.info = self._t.reset(self.id, keep_workspace, self._roche._deadline())
        return self

    def snapshot(self, name: str) -> SnapshotInfo:
        """Saves the sandbox's files (its /tmp, and its root's changes when writable) as
        a snapshot, for ``create(from_snapshot=name)``. Process memory is not kept, nor
        the workspace, which persists on its own."""
        return self._t.snapshot(self._roche.provider, self.id, name, self._roche._deadline())

    def egress_log(self) -> List[EgressDecision]:
        """The decisions of the sandbox's egress proxy (a sandbox made with
        ``network_allowlist``; through roched), oldest first: every connection and plain
        HTTP request it allowed or refused, the newest kept."""
        return self._t.egress_log(self.id, self._roche._deadline())

    def egress_suggest(self) -> List[str]:
        """The minimal allowlist entries that would have allowed every refusal in the
        egress log that an entry can allow (not one refused for its address)."""
        return self._t.egress_suggest(self.id, self._roche._deadline())

    def egress_allow(self, *entries: str) -> List[str]:
        """Adds entries (``"pypi.org"``, ``"*.npmjs.org"``, ``"host:8443"``) to the
        sandbox's allowlist, effective from its next connection; returns the allowlist."""
        return self._t.egress_policy(self.id, list(entries), [], self._roche._deadline())

    def egress_deny(self, *entries: str) -> List[str]:
        """Takes entries out of the sandbox's allowlist, effective from its next
        connection (open ones stay open); returns the allowlist. An entry it does not
        have is an error, and changes nothing."""
        return self._t.egress_policy(self.id, [], list(entries), self._roche._deadline())

    def _code_deadline(self, req: CodeRequest) -> Deadline:
        return Deadline((req.timeout or DEFAULT_CODE_TIMEOUT) + self._roche._choice.request_timeout)

    def run_code(self, code: str, language: Optional[str] = None, context: Optional[ContextLike] = None,
                 timeout: Optional[float] = None, on_stdout: Optional[Handler] = None,
                 on_stderr: Optional[Handler] = None, on_result: Optional[Handler] = None,
                 on_error: Optional[Handler] = None) -> Execution:
        """Runs a cell of code in a context, a long-lived interpreter that keeps its
        variables from one call to the next, and returns its Execution (E2B's shape:
        ``.text``, ``.results``, ``.logs``, ``.error``, ``.execution_count``).

        Without ``context`` the language's default context is used ("python" unless
        ``language`` says "bash" or "javascript"), started on first use. ``timeout``
        (seconds, default 300) interrupts the cell, as KeyboardInterrupt; the context
        keeps its variables and ``timed_out`` is set. An exception in the code is
        ``.error``, not raised. ``on_stdout`` and ``on_stderr`` get each OutputMessage
        as it is printed, ``on_result`` each Result as it is produced, ``on_error`` the
        ExecutionError at the end. In the async API a callback that is a coroutine
        function is awaited before the next event.
        """
        req = make_code_request(code, language, context, timeout)
        cb = CodeCallbacks(on_stdout, on_stderr, on_result, on_error)
        ex: Optional[Execution] = None
        items = self._t.run_code(self.id, req, self._code_deadline(req))
        try:
            for item in items:
                for h, arg in cb.calls(item):
                    _syncio.call(h, arg)
                if isinstance(item, Execution):
                    ex = item
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()
        if ex is None:
            raise RocheError("the code stream ended without an execution")
        return ex

    def create_code_context(self, language: Optional[str] = None, cwd: Optional[str] = None) -> Context:
        """Starts a new context (its own variables) for run_code(context=...);
        ``language`` defaults to "python", ``cwd`` to the sandbox's workdir."""
        req = make_code_request("", language, None, None)
        return self._t.create_context(self.id, req.language, cwd, self._roche._deadline())

    def list_code_contexts(self) -> List[Context]:
        """The sandbox's contexts, the default ones included once started."""
        return self._t.contexts(self.id, self._roche._deadline())

    def fork_code_context(self, context: ContextLike) -> Context:
        """Starts a new context holding a copy of ``context``'s interpreter (it forks
        itself): the same variables, after which the two go on apart. Not on wasm."""
        return self._t.fork_context(self.id, context_id(context) or no_context(), self._roche._deadline())

    def restart_code_context(self, context: ContextLike) -> None:
        """Replaces a context's interpreter with a fresh one: its variables go."""
        self._t.restart_context(self.id, context_id(context) or no_context(), self._roche._deadline())

    def remove_code_context(self, context: ContextLike) -> None:
        """Stops a context's interpreter and forgets it."""
        self._t.remove_context(self.id, context_id(context) or no_context(), self._roche._deadline())

    def destroy(self) -> None:
        """Destroys the sandbox. Destroying one already gone is not an error."""
        self._t.destroy(self.id, self._roche._deadline())


class ExecStream:
    """A running command's output events; ``result`` is set when they end."""

    def __init__(self, items: Iterator[StreamItem]) -> None:
        self._items = items
        self.result: Optional[ExecResult] = None

    def __iter__(self) -> Iterator[OutputEvent]:
        return self._events()

    def _events(self) -> Iterator[OutputEvent]:
        try:
            for item in self._items:
                if isinstance(item, ExecResult):
                    self.result = item
                else:
                    yield item
        finally:
            self.close()

    def wait(self) -> ExecResult:
        """Reads the rest of the output and returns the result."""
        for _ in self:
            pass
        if self.result is None:
            raise RocheError("the stream was closed before the command ended")
        return self.result

    def close(self) -> None:
        """Stops reading; a command still running is killed."""
        close = getattr(self._items, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> "ExecStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
