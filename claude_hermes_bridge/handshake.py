"""[server] The host's `initialize` answered before the MCP SDK is imported.

A host gives a server a few seconds to answer `initialize`, and on a busy two-core machine importing the SDK
can take longer than that on its own (0.6 CPU-seconds; 2.1-4.4 s of wall time were seen at load 7). What it answers is
fixed by what the host asked, this server's code, its settings and the SDK itself: the answer it gave is kept
under a key made of all of those (answer_key), and the next start with the same key answers from it at once,
before any import, then reads the same request into the SDK and drops the SDK's own answer, comparing the two
(a difference is said on stderr and the kept answer replaced). A first start, a new host or any change of
code, settings or SDK is answered by the SDK as before. Windows reads no message early (select() there does
not take a pipe): it is answered by the SDK as before."""
import contextlib
import dataclasses
import hashlib
import io
import json
import os
import select
import sys
import time
from pathlib import Path
from typing import Any

from .config import SETTINGS_ENV, config_path
from .preflight import PACKAGE_DIR, VERSION, dependency_version, user_dir
from .safe_io import IS_WINDOWS, read_capped, write_atomic

FIRST_MESSAGE_WAIT_S = 0.5  # how long the host's first message may take before the server goes on without it
FIRST_MESSAGE_MAX = 1 << 20
CONFIG_MAX = 1 << 20
ANSWERS_KEPT = 16  # one per host and SDK the user has; the oldest beyond this are removed


@dataclasses.dataclass
class EarlyStart:
    """What happened before the SDK was imported: what was read of the host's input (the SDK reads it first),
    and for an `initialize` request first, its id, its key, and the result already sent (None: the SDK answers
    it)."""

    read: bytes = b""
    request_id: Any = None
    key: str = ""
    answered: dict[str, Any] | None = None


def answers_folder() -> Path:
    """Beside the bridge's bytecode, in the per-user cache: a folder no sandboxed job can write."""
    return user_dir("cache") / "initialize"


def answer_key(params: Any, argv: list[str]) -> str:
    """Everything the SDK's answer depends on: the request, the command line and settings the host gave, the
    config file (where, and its bytes), the bridge's code, the Python and the SDK."""
    config_file = str(config_path())
    try:
        config = [config_file, hashlib.sha256(read_capped(config_file, CONFIG_MAX)).hexdigest()]
    except (OSError, ValueError):
        config = [config_file, "none"]
    code = []
    for path in sorted(PACKAGE_DIR.glob("*.py")):
        with contextlib.suppress(OSError):
            status = path.stat()
            code.append([path.name, status.st_mtime_ns, status.st_size])
    parts = [params, argv, os.environ.get(SETTINGS_ENV), os.environ.get("HERMES_BRIDGE_CONFIG"), config, VERSION,
             code, sys.version, dependency_version("mcp")]
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def first_message(fd: int, wait_s: float) -> bytes:
    """What the host wrote first, up to its first newline, waiting at most wait_s (b"" on Windows)."""
    if IS_WINDOWS:
        return b""
    read, deadline = b"", time.monotonic() + wait_s
    while b"\n" not in read and len(read) < FIRST_MESSAGE_MAX:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        read += chunk
    return read


def kept_answer(key: str) -> dict[str, Any] | None:
    try:
        kept = json.loads(read_capped(str(answers_folder() / f"{key}.json"), FIRST_MESSAGE_MAX))
    except (OSError, ValueError):
        return None
    return kept if isinstance(kept, dict) else None


def keep_answer(key: str, result: Any) -> None:
    """The SDK's answer under its key; the oldest answers beyond ANSWERS_KEPT removed. Best effort."""
    folder = answers_folder()
    with contextlib.suppress(OSError):
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(folder / f"{key}.json", json.dumps(result).encode())
        kept = sorted(folder.glob("*.json"), key=lambda path: path.stat().st_mtime)
        for old in kept[:-ANSWERS_KEPT]:
            old.unlink(missing_ok=True)


def answer_early(protocol_fds: tuple[int, int], argv: list[str]) -> EarlyStart:
    """Read the host's first message; if it is `initialize` and an answer is kept for it, send that answer."""
    read = first_message(protocol_fds[0], FIRST_MESSAGE_WAIT_S)
    line = read.split(b"\n", 1)[0]
    try:
        message = json.loads(line) if read.count(b"\n") else None
    except ValueError:
        message = None
    if not isinstance(message, dict) or message.get("method") != "initialize" or "id" not in message:
        return EarlyStart(read)
    start = EarlyStart(read, message["id"], answer_key(message.get("params"), argv))
    start.answered = kept_answer(start.key)
    if start.answered is not None:
        reply = json.dumps({"jsonrpc": "2.0", "id": start.request_id, "result": start.answered}) + "\n"
        os.write(protocol_fds[1], reply.encode())  # a pipe takes a small write whole: nobody else writes yet
    return start


class PrefixedInput(io.RawIOBase):
    """The host's input: what was read before the SDK, then the pipe."""

    def __init__(self, fd: int, prefix: bytes):
        super().__init__()
        self.fd, self.prefix = fd, prefix

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.prefix[:len(buffer)] if self.prefix else os.read(self.fd, len(buffer))
        self.prefix = self.prefix[len(data):]
        buffer[:len(data)] = data
        return len(data)


class AnswerFilter:
    """The SDK's output, but for its answer to the `initialize` read early: dropped if that was answered
    already (compared: a difference is said and kept instead), else kept for the next start."""

    def __init__(self, stream: Any, start: EarlyStart):
        self.stream, self.start, self.pending = stream, start, ""

    def write(self, text: str) -> int:
        if self.start.request_id is None:
            return int(self.stream.write(text))
        self.pending += text
        while "\n" in self.pending and self.start.request_id is not None:
            line, self.pending = self.pending.split("\n", 1)
            if not self.is_the_answer(line):
                self.stream.write(line + "\n")
        if self.start.request_id is None and self.pending:
            self.stream.write(self.pending)
            self.pending = ""
        return len(text)

    def is_the_answer(self, line: str) -> bool:
        try:
            message = json.loads(line)
        except ValueError:
            return False
        if not isinstance(message, dict) or message.get("id") != self.start.request_id or "method" in message:
            return False
        result, answered = message.get("result"), self.start.answered
        self.start.request_id = None
        if answered is None:
            if result is not None:
                keep_answer(self.start.key, result)
            return False
        if result != answered:
            sys.stderr.write("[bridge] the initialize answer sent early differed from the SDK's; the SDK's is kept "
                             "for the next start\n")
            keep_answer(self.start.key, result)
        return True

    def flush(self) -> None:
        self.stream.flush()
