#!/usr/bin/env python3
"""Writes the Python SDK's synchronous half from its asyncio half, so that a change to
the API, the transports or the PTY sessions is made once, in the async source:

    _async.py      -> _sync.py       AsyncRoche, AsyncSandbox, AsyncExecStream -> Roche, ...
    _atransport.py -> _transport.py  the Connect client, roched and CLI transports
    _apty.py       -> _pty.py        PTY sessions
    _acommands.py  -> _commands.py   durable commands (sandbox.commands)

    python3 sdk/python/unasync.py           rewrites the synchronous files
    python3 sdk/python/unasync.py --check   lists the stale ones and exits 1 (a test runs it)

Each line of a source goes through RULES (code, comments and docstrings alike, so write
prose that reads right both ways: "a context manager (``async with``)" becomes "a context
manager (``with``)"); the module docstring is replaced by the target's own, below. Where
the halves differ in more than these words, the source calls _aio (the asyncio way),
which becomes _syncio (the blocking way): the two modules offer the same names. Two
directives cover what names cannot:

    # sync: CODE        a line only the synchronous half has (at the comment's indentation)
    CODE  # async only  a line only the asyncio half has; the block it opens goes with it

Only the standard library: the SDK has no dependencies, and neither does making it.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import sys
import tokenize
from typing import Optional

PACKAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "src", "roche_sandbox")

#: (source, target, the target's module docstring).
FILES = [
    ("_async.py", "_sync.py",
     "The synchronous API: Roche, Sandbox and ExecStream, the same surface as the asyncio one.\n"
     "Calls block the calling thread; Roche is safe to share between threads."),
    ("_atransport.py", "_transport.py",
     "The two ways the synchronous API reaches Roche: roched over HTTP (the Connect protocol in\n"
     "JSON), or the roche CLI as a subprocess per call. Both offer the same calls and raise the\n"
     "same typed exceptions."),
    ("_apty.py", "_pty.py",
     "PTY sessions for the synchronous API: a command on a pseudo-terminal in the sandbox\n"
     "(default: the image's shell), driven with unary calls (input, resize, kill) and one server\n"
     "stream of its output, read by a thread of its own. Shaped like E2B's ``sandbox.pty``."),
    ("_afiles.py", "_files.py",
     "``sandbox.files`` for the synchronous API: the files API, named as E2B's SDKs name it, its\n"
     "content streamed both ways; a watch is read by a thread of its own."),
    ("_acommands.py", "_commands.py",
     "Durable commands for the synchronous API, ``sandbox.commands``, shaped like E2B's: run a\n"
     "shell command line (or an argv) in the foreground or the background, list the commands,\n"
     "connect to one from byte offsets, feed its stdin, signal and kill it. A command belongs to\n"
     "the sandbox, not to this process: it runs on when this process disconnects, is killed, or\n"
     "roched restarts, and its output is kept in the sandbox for the next connection to replay."),
]

#: Applied in order to every line.
RULES = [
    (r"\basync def\b", "def"),
    (r"\basync for\b", "for"),
    (r"\basync with\b", "with"),
    # (await f(x)).y -> f(x).y, but g(await f(x)) -> g(f(x))
    (r"(?<![\w)\]])\(await ([\w.]+\([^()]*\))\)", r"\1"),
    (r"\bawait ", ""),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\b__aiter__\b", "__iter__"),
    (r"\b__anext__\b", "__next__"),
    (r"\baclose\b", "close"),
    (r"\basynccontextmanager\b", "contextmanager"),
    (r"\bStopAsyncIteration\b", "StopIteration"),
    # AsyncGenerator[Y, S] has no return type; Generator[Y, S, R] has.
    (r"\bAsyncGenerator\[(.+?), None\]", r"Generator[\1, None, None]"),
    # AsyncRoche -> Roche, AsyncIterator -> Iterator, AsyncHTTPClient -> HTTPClient, ...
    (r"\bAsync([A-Z]\w*)", r"\1"),
    (r"\b_async\b", "_sync"),
    (r"\b_atransport\b", "_transport"),
    (r"\b_apty\b", "_pty"),
    (r"\b_afiles\b", "_files"),
    (r"\b_acommands\b", "_commands"),
    (r"\b_ahttp\b", "_http"),
    (r"\b_aio\b", "_syncio"),
]
_RULES = [(re.compile(pattern), repl) for pattern, repl in RULES]

_SYNC_LINE = re.compile(r"^(\s*)# sync: (.*)$")
_ASYNC_ONLY = re.compile(r"\s*# async only$")
_DOCSTRING = re.compile(r'\A((?:#.*\n|\s*\n)*)"""(?:.|\n)*?"""\n')


def header(source: str) -> str:
    return (f"# Generated from {source} by sdk/python/unasync.py: do not edit. Edit {source}, then\n"
            "# run `python3 sdk/python/unasync.py` (a test fails while this file is stale).\n")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _rules(text: str) -> str:
    for pattern, repl in _RULES:
        text = pattern.sub(repl, text)
    return text


def _aligned(text: str) -> dict[int, tuple[int, int]]:
    """The rows (0-based) that continue a statement aligned just after an open bracket of
    an earlier row, with that bracket's row and column: the words the rules take out
    before a bracket move it left, and what is aligned to it must follow."""
    rows = text.split("\n")
    out: dict[int, tuple[int, int]] = {}
    open_brackets: list[tuple[int, int]] = []
    in_string: set[int] = set()
    seen: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        row, col = tok.start[0] - 1, tok.start[1]
        if tok.type == tokenize.STRING and tok.end[0] - 1 > row:
            in_string.update(range(row + 1, tok.end[0]))
        if row not in seen and tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            seen.add(row)
            if row not in in_string:
                lead = _indent(rows[row])
                for br, bc in reversed(open_brackets):
                    if br < row and bc + 1 == lead:
                        out[row] = (br, bc)
                        break
        if tok.type == tokenize.OP and tok.string in "([{":
            open_brackets.append((row, col))
        elif tok.type == tokenize.OP and tok.string in ")]}":
            open_brackets.pop()
    return out


def transform(text: str) -> str:
    """The synchronous version of an async source's lines (its docstring included)."""
    lines = text.split("\n")
    aligned = _aligned(text)
    done: list[str] = []
    for r, line in enumerate(lines):
        lead = _indent(line)
        if r in aligned:
            br, bc = aligned[r]
            above = lines[br]
            lead = _indent(done[br]) + len(_rules(above[_indent(above):bc + 1]))
        done.append(" " * lead + _rules(line.lstrip()) if line.strip() else line)
    out: list[str] = []
    i = 0
    while i < len(lines):
        line, sync = lines[i], done[i]
        i += 1
        m = _SYNC_LINE.match(line)
        if m:
            out.append(m.group(1) + _rules(m.group(2)))
            continue
        if _ASYNC_ONLY.search(line):
            code = _ASYNC_ONLY.sub("", line)
            if code.rstrip().endswith(":"):
                # The block it opens: the lines after it indented deeper, blank ones
                # inside it included, those after it not.
                j = i
                while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) > _indent(code)):
                    j += 1
                while j > i and not lines[j - 1].strip():
                    j -= 1
                i = j
            if i < len(lines) and not lines[i].strip():
                # The blank lines after it separate what was before it from what follows.
                while out and not out[-1].strip():
                    out.pop()
            continue
        out.append(sync)
    return "\n".join(out)


def generate(source: str, text: str, docstring: str) -> str:
    """The synchronous file for the async source named source, whose text is text."""
    body = transform(text)
    m = _DOCSTRING.match(body)
    if m is None:
        raise ValueError(f"{source} does not start with a module docstring")
    body = body[m.end():]
    result = f'{header(source)}"""{docstring}"""\n{body}'
    compile(result, source, "exec")  # a directive used wrongly fails here, not at import
    return result


def stale(package: str = PACKAGE) -> list[str]:
    """The synchronous files in package that differ from what their sources make."""
    out = []
    for source, target, docstring in FILES:
        with open(os.path.join(package, source), encoding="utf-8") as f:
            want = generate(source, f.read(), docstring)
        try:
            with open(os.path.join(package, target), encoding="utf-8") as f:
                have: Optional[str] = f.read()
        except FileNotFoundError:
            have = None
        if have != want:
            out.append(target)
    return out


def write(package: str = PACKAGE) -> list[str]:
    """Rewrites the stale synchronous files; returns their names."""
    changed = stale(package)
    for source, target, docstring in FILES:
        if target not in changed:
            continue
        with open(os.path.join(package, source), encoding="utf-8") as f:
            text = generate(source, f.read(), docstring)
        with open(os.path.join(package, target), "w", encoding="utf-8") as f:
            f.write(text)
    return changed


def main() -> int:
    ap = argparse.ArgumentParser(description="Writes the Python SDK's synchronous half from its asyncio half.")
    ap.add_argument("--check", action="store_true", help="list the stale files and exit 1 instead of writing")
    args = ap.parse_args()
    if args.check:
        bad = stale()
        for name in bad:
            print(f"unasync: {name} is stale: run python3 sdk/python/unasync.py", file=sys.stderr)
        return 1 if bad else 0
    for name in write():
        print(f"unasync: wrote {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
