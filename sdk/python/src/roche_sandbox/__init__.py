"""Roche's Python SDK: run untrusted, LLM-written code in sandboxes with secure defaults.

    from roche_sandbox import Roche
    with Roche().create(image="python:3.12-slim") as sandbox:
        result = sandbox.exec(["python3", "-c", "print('hello')"])
        print(result.stdout)

Calls go to roched (the daemon, with warm pools) when it answers, else to the roche CLI.
"""

from ._afiles import AsyncFiles, AsyncWatchHandle
from ._apty import AsyncPty, AsyncPtyHandle
from ._files import Files, WatchHandle
from ._filesutil import EntryInfo, FilesystemEvent, FilesystemEventType, FileType, WriteInfo
from ._acommands import AsyncCommandHandle, AsyncCommands
from ._apty import AsyncPty, AsyncPtyHandle
from ._commands import CommandHandle, Commands
from ._async import AsyncExecStream, AsyncRoche, AsyncSandbox
from ._pty import Pty, PtyHandle
from ._sync import ExecStream, Roche, Sandbox
from .errors import (
    ImageNotFound,
    InUse,
    InvalidConfig,
    OutputGone,
    PermissionDenied,
    ProviderUnavailable,
    ResourceExhausted,
    RocheError,
    SandboxNotFound,
    SandboxTimeout,
    Unsupported,
)
from .types import (
    DEFAULT_COPY_MAX_BYTES,
    DEFAULT_IMAGE,
    CommandInfo,
    CommandResult,
    Context,
    CopyReport,
    EndReason,
    ExecResult,
    Execution,
    ExecutionError,
    Logs,
    Mount,
    OutputEvent,
    OutputMessage,
    Receipt,
    Result,
    SandboxInfo,
    SkippedEntry,
    SnapshotInfo,
    EgressDecision,
    Secret,
    StoredSecret,
    WorkspaceInfo,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncCommandHandle",
    "AsyncCommands",
    "AsyncExecStream",
    "AsyncFiles",
    "AsyncWatchHandle",
    "EntryInfo",
    "Files",
    "FilesystemEvent",
    "FilesystemEventType",
    "FileType",
    "WatchHandle",
    "WriteInfo",
    "AsyncPty",
    "AsyncPtyHandle",
    "AsyncRoche",
    "AsyncSandbox",
    "CommandHandle",
    "CommandInfo",
    "CommandResult",
    "Commands",
    "Context",
    "CopyReport",
    "EndReason",
    "Receipt",
    "DEFAULT_COPY_MAX_BYTES",
    "DEFAULT_IMAGE",
    "ExecResult",
    "ExecStream",
    "Execution",
    "ExecutionError",
    "ImageNotFound",
    "InUse",
    "InvalidConfig",
    "Logs",
    "Mount",
    "OutputEvent",
    "OutputGone",
    "OutputMessage",
    "PermissionDenied",
    "Pty",
    "PtyHandle",
    "ProviderUnavailable",
    "ResourceExhausted",
    "Result",
    "Roche",
    "RocheError",
    "Sandbox",
    "SandboxInfo",
    "SandboxNotFound",
    "SandboxTimeout",
    "SkippedEntry",
    "SnapshotInfo",
    "EgressDecision",
    "Secret",
    "StoredSecret",
    "Unsupported",
    "WorkspaceInfo",
]
