#!/usr/bin/env python3
# /// script
# requires-python = ">=3.10"
# dependencies = ["mcp>=1.24,<3", "psutil>=7.1", "PyYAML>=6", "platformdirs>=4"]
# ///
"""claude-hermes-bridge: an MCP stdio server that gives a planner (Claude Desktop or any MCP host) an
executor, the Hermes Agent CLI, on the same machine.

The one decision that shapes it: a job never lives inside a request. A job is a record, a log and a
detached supervisor process on disk, so every tool returns within seconds, a job outlives the server
process that started it, and any later server process can answer for it or cancel it.

Contents, in the order data flows; each section opens with a banner of the same name, marked with the
program that uses it: the file holds two, the MCP server and the per-job supervisor (`server.py --supervise
ID`, which never loads the MCP stack). Nothing is used above the section that defines it, and no [supervisor]
or [both] section uses a [server] one (tests/test_layout.py holds both promises):

  stdio guard ........ [both] the client's pipes moved aside before anything can print (stdout is the protocol)
  primitives ......... [both] names, escaping (shown, shown_whole, clean_text: controls, line separators and
                       text-hiding characters), path decisions (within_root), safe opening (open_regular,
                       read_capped), atomic writes (write_atomic, create_exclusive), a file lock (locked),
                       process identity no clock step moves (ProcessId, start_ticks), the shared machine_clock
  config ............. [both] Config (each setting declared once, in SETTINGS), where it is found, validation
  confinement ........ [both] allowed roots: resolve a folder, confine it (confine_cwd, confine_read)
  audit log .......... [both] one line per tool call and job state change
  job store .......... [both] JobRecord (every field checked, every list bounded), JobStore (the jobs folder),
                       JobView (observe: orphaned, frozen, waiting for the disk: disk_problem)
  git worktrees ...... [both] a worktree job's repository, its worktree made and removed, its work saved as a
                       commit and a patch (git: no hooks, none of the caller's git environment)
  Hermes CLI ......... [both] locating Hermes, the options it declares (probe_cli), its command line and
                       environment, its exit codes in words (describe_exit)
  Hermes session store  [both] Hermes' state.db read with a deadline: activity, usage, current tool, answer
  Hermes ACP ......... [both] whether this Hermes speaks ACP, and which driver a job gets (choose_driver);
                       [supervisor] the conversation over JSON-RPC (AcpConversation), approvals, the policy
  process control .... [both] creation flags, Ownership (the proof before any signal), stop_tree
  Hermes drivers ..... [both] the seam: HermesRun, CliRun, AcpRun, DRIVERS, and the launch plan (plan_launch)
  supervisor ......... [supervisor] Supervisor (one detached process per job), the folder snapshots
  job launch ......... [server] JobRequest, launch_job (dedupe, limits, the record), start_job
  rendering .......... [server] the status block: job_details, render_status, ToolResult
  tool logic ......... [server] plain functions per tool: arguments and the launch request; resuming a
                       session; one job and the job list; reading files; Hermes' skills; health and instructions
  tool bodies ........ [server] async bodies (run_tool, status_tool, ...), disk work off the event loop: no MCP
  MCP edge ........... [server] the tasks extension (JobTasks), the two SDK lines (McpEdge), build_server, serve
  command line ....... [server] --check, --try, --init-config; [both] main, which picks the program

One hermes_run, end to end: build_server's hermes_run → run_tool_body → run_tool → job_request (arguments, roots,
Hermes, the launch plan) → launch_and_wait → launch_job writes the record and start_job spawns
`server.py --supervise <id>` → main → Supervisor.run (_plan, _start Hermes, _watch, _finish writes the
outcome to the record) ← wait_for_end polls the record (JobStore.read → observe) → status_result →
render_status → the text the host reads; later calls of hermes_status take the same way back.
"""

import os
import sys


# ----------------------------------------------------------------------------------------- stdio guard [both]
def guard_stdio() -> tuple[int, int]:
    """Move the client's pipes to private fds; fd 0 becomes the null device and fd 1 becomes stderr.

    After this a print() anywhere, or a child that inherits fd 1, writes to stderr and can never corrupt
    the JSON-RPC stream. os.dup() returns non-inheritable fds, so no child ever holds the protocol pipes.
    """
    try:
        os.fstat(2)
    except OSError:  # started without a stderr (a Windows GUI host can do that): give it the null device
        err_fd = os.open(os.devnull, os.O_WRONLY)
        if err_fd != 2:
            os.dup2(err_fd, 2)
            os.close(err_fd)
    if sys.stderr is None:  # Python found no fd 2 at start either, and left sys.stderr unset
        sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115 (for life)
    protocol_in, protocol_out = os.dup(0), os.dup(1)
    null_fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null_fd, 0)
    os.close(null_fd)
    os.dup2(2, 1)
    return protocol_in, protocol_out


# Options after which the process does something else than serve the protocol; any other command line
# serves it (the host's settings are options too), so the guard runs first.
NOT_SERVING = ("--check", "--version", "--supervise", "--try", "--help", "-h", "--init-config")


def serves_protocol(argv: list[str]) -> bool:
    return not any(arg.split("=", 1)[0] in NOT_SERVING for arg in argv)


PROTOCOL_FDS = guard_stdio() if __name__ == "__main__" and serves_protocol(sys.argv[1:]) else None

import contextlib  # noqa: E402  (the guard must run before anything else can print)
import dataclasses  # noqa: E402
import enum  # noqa: E402
import errno  # noqa: E402
import functools  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import stat  # noqa: E402
import subprocess  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Awaitable, Callable, Generator, Generic, Iterable, Iterator, NoReturn, TypeVar, cast  # noqa: E402

try:
    import psutil
except ImportError:  # reported with its fix by missing_dependencies()
    psutil = None  # type: ignore[assignment]


# ------------------- primitives: names, escaping, paths, safe opening, atomic writes, process identity [both]
# Small pieces every later section uses. Every file the bridge reads may have been written by a job running
# as the user, so reading means open_regular (no FIFO, no symlink, capped) and writing means write_atomic.
T = TypeVar("T")
VERSION = "0.1.0"
SERVER_FILE = Path(__file__).resolve()
SERVER_DIR = SERVER_FILE.parent
IS_WINDOWS = os.name == "nt"
TOOL_NAMES = (
    "hermes_run", "hermes_resume", "hermes_status", "hermes_jobs",
    "hermes_read", "hermes_capabilities", "hermes_health", "hermes_cancel", "hermes_approve", "hermes_land",
    "hermes_view_job", "hermes_view_answer",
)


MCP_SUPPORTED = "mcp>=1.24,<3"


def version_tuple(version: str) -> tuple[int, ...]:
    """'1.24.0' -> (1, 24, 0); the leading numbers of any version string."""
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def plural(count: int, noun: str) -> str:
    """'1 problem', '2 problems', '2 processes'."""
    return f"{count:,} {noun}" + ("" if count == 1 else "es" if noun.endswith("s") else "s")


def dependency_version(package: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def missing_dependencies(need_mcp: bool) -> str | None:
    """One line naming the interpreter, what is wrong and the command that fixes it; None when all is well.

    The supervisor (need_mcp=False) only looks for modules: importlib.metadata costs it 30 ms and 4 MB."""
    fix = f'"{sys.executable}" -m pip install -r "{SERVER_DIR / "requirements.txt"}"'
    if need_mcp:
        found = dependency_version("mcp")
        if found is None or not (1, 24) <= version_tuple(found)[:2] < (3, 0):
            return (f"claude-hermes-bridge needs the MCP Python SDK {MCP_SUPPORTED} (1.24 or later on the 1.x line, "
                    f"or 2.x); interpreter {sys.executable} has {'no mcp' if found is None else 'mcp ' + found}. "
                    f"Fix: {fix}")
    for module, package in (("psutil", "psutil"), ("yaml", "PyYAML"), ("platformdirs", "platformdirs")):
        if importlib.util.find_spec(module) is None:
            return (f"claude-hermes-bridge needs {package}; interpreter {sys.executable} does not have it. "
                    f"Fix: {fix}")
    return None


class Refused(Exception):
    """Bad input or a state that forbids the request: reported as STATUS: refused, nothing started."""


# Characters that reorder or hide text where a person reads it: bidi embeddings, overrides and isolates,
# zero-width characters and marks, the byte order mark. Escaped wherever Hermes' text reaches a person.
HIDING_CHARS = "\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff"
HIDING_RE = re.compile(f"[{HIDING_CHARS}]")
# Control characters and every line separator str.splitlines knows (\x0b, \x0c, \x1c-\x1e, \x85, U+2028/9).
CONTROL_RE = re.compile(f"[\\x00-\\x1f\\x7f\\x85\\u2028\\u2029{HIDING_CHARS}]")


def as_escape(match: re.Match[str]) -> str:
    return match.group().encode("unicode_escape").decode("ascii")


def unhidden(text: str) -> str:
    """The characters that reorder or hide text as their visible escapes; everything else as it is."""
    return HIDING_RE.sub(as_escape, text)


def escaped(text: str) -> str:
    """Every control, line-separating or text-hiding character as its visible escape (\\n, \\u202e)."""
    return CONTROL_RE.sub(as_escape, text)


def shown(value: Any, limit: int = 200) -> str:
    """A value quoted back to the model: at most `limit` characters, control characters escaped, so an
    argument or a folder name can neither flood a reply nor forge a line of it."""
    text = value if isinstance(value, str) else repr(value)
    cut = len(text) > limit
    return escaped(text[:limit]) + (f"... ({len(value) if isinstance(value, str) else '?'} chars)" if cut else "")


def clock_words(at: Any) -> str:
    """' at 14:02:31' for a wall-clock time, for people; nothing for a value that is not one."""
    return f" at {time.strftime('%H:%M:%S', time.localtime(at))}" if is_number(at) else ""


def shown_whole(text: str, limit: int) -> str:
    """Text a person decides on (a command Hermes asks to run): every line of it, escaped, on one line. Too
    long to show whole, it keeps its head and its tail and says how much was cut between them, so what is
    hidden is never mistaken for all there is."""
    if len(text) <= limit:
        return escaped(text)
    half = limit // 2
    return (f"{escaped(text[:half])} [... {len(text) - 2 * half:,} characters NOT SHOWN ...] "
            f"{escaped(text[-half:])}")


ANSI_RE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]"
                     r"|[\x00-\x08\x0b-\x1f\x7f]")


def clean_text(data: bytes) -> str:
    return clean_str(data.decode("utf-8", "replace"))


def clean_str(text: str) -> str:
    """Output as the model should read it: no terminal escapes, no control characters but newline and tab,
    and the characters that reorder or hide text shown as their escapes."""
    return unhidden(ANSI_RE.sub("", text.replace("\r\n", "\n")))


class NotRegularFile(OSError):
    """A path the bridge reads that is a symlink, FIFO, device or folder where a file should be."""


NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)


def open_regular(path: Path | str, follow: bool = False) -> Any:
    """A binary handle on a regular file, opened without blocking (a FIFO would wait for a writer) and,
    unless follow, without following a final symlink. Everything on disk the bridge reads goes through here:
    Hermes' shell can write the jobs folder and its skills come from hubs."""
    try:
        fd = os.open(path, READ_FLAGS | (0 if follow else NOFOLLOW))
    except OSError as exc:
        if NOFOLLOW and exc.errno == errno.ELOOP:
            raise NotRegularFile(exc.errno, "a symlink, not a regular file", str(path)) from None
        raise
    return regular_handle(fd, path, "rb", symlink=not follow and not NOFOLLOW and os.path.islink(path))


def regular_handle(fd: int, path: Path | str, mode: str, symlink: bool = False) -> Any:
    """A handle on fd when it is a regular file (and not a symlink the open could not refuse); else the fd
    is closed and NotRegularFile raised."""
    if not stat.S_ISREG(os.fstat(fd).st_mode) or symlink:
        os.close(fd)
        raise NotRegularFile(0, "not a regular file", str(path))
    return os.fdopen(fd, mode)


def read_capped(path: Path | str, cap: int, follow: bool = False) -> bytes:
    """A regular file's first `cap` bytes (see open_regular); a longer file raises, it is never half-read."""
    with open_regular(path, follow) as handle:
        data: bytes = handle.read(cap + 1)
    if len(data) > cap:
        raise NotRegularFile(0, f"larger than {cap} bytes", str(path))
    return data


def patient_on_windows(action: Callable[[], T], patience_s: float) -> T:
    """action(), retried while Windows answers "permission denied" for a file being replaced, for up to
    patience_s. Windows refuses to replace a file any process holds open, and an open during the replace is
    refused in turn; each side holds the file for well under a millisecond, so frequent retries get through
    (found on the Windows lane: a reader in a loop beat 10 tries 50 ms apart). Elsewhere it runs once."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            return action()
        except PermissionError:
            if not IS_WINDOWS or time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def read_replaceable(path: Path | str, cap: int) -> bytes:
    """read_capped for a file another process replaces whole (write_atomic)."""
    return patient_on_windows(lambda: read_capped(path, cap), 1.0)


def read_json(path: Path | str, cap: int = 1 << 20) -> Any:
    """A small JSON file the bridge wrote itself, or None when it is missing, too big, or not JSON."""
    try:
        return json.loads(read_replaceable(path, cap))
    except (OSError, ValueError):
        return None


CREATE_FLAGS = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | getattr(os, "O_NONBLOCK", 0)
                | getattr(os, "O_BINARY", 0))
APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)


def create_exclusive(path: Path) -> int:
    """A new regular file, or FileExistsError when anything (a FIFO, a symlink, a file) has the name."""
    return os.open(path, CREATE_FLAGS, 0o600)


def open_append(path: Path) -> Any:
    """A file the bridge created, opened to append without following a symlink or blocking on a FIFO that
    replaced it; anything but a regular file raises NotRegularFile."""
    return regular_handle(os.open(path, APPEND_FLAGS), path, "ab")


def write_atomic(path: Path, data: bytes) -> None:
    """Whole-file write: a reader sees the old content or the new, never half. The temporary file has a
    random name of its own per write, created exclusively and never through a symlink (as mkstemp does,
    without tempfile, which would load shutil and three compressors into every supervisor), so two threads or
    processes writing one record never share it, and a file planted at a predictable name is never opened."""
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{os.urandom(8).hex()}.tmp"
        try:
            fd = create_exclusive(tmp)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"no free temporary name beside {path}")
    try:
        with open(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        patient_on_windows(lambda: os.replace(tmp, path), 5.0)  # a server polling the record may hold it
    finally:
        tmp.unlink(missing_ok=True)


class LockTimeout(TimeoutError):
    """Another process held a lock file past the deadline."""


def try_lock(fd: int) -> bool:
    """Take an exclusive lock on an open file without waiting: flock on POSIX, a one-byte msvcrt lock on
    Windows (what filelock does on each)."""
    try:
        if IS_WINDOWS:
            import msvcrt

            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)  # type: ignore[attr-defined]
        else:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False


@contextlib.contextmanager
def locked(path: Path, timeout_s: float) -> Iterator[None]:
    """An exclusive lock between processes on a lock file, polled until timeout_s (LockTimeout past it).
    A few lines instead of filelock, whose 4.x loads logging, decimal and OpenSSL (through hmac): 5 MB more
    in every supervisor. The lock file is opened without following a symlink or blocking on a FIFO a job
    may have planted; the lock goes with the file's closing, so a killed holder never leaves it held."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0),
                 0o600)
    try:
        deadline = time.monotonic() + timeout_s
        while not try_lock(fd):
            if time.monotonic() >= deadline:
                raise LockTimeout(f"{path} is held by another process")
            time.sleep(0.02)
        yield
    finally:
        os.close(fd)


def create_time_tolerance(platform: str) -> float:
    """How far a process start time may drift between reads where it is the identity (a record of an older
    bridge, or a system without /proc): Windows and macOS report it exactly."""
    return 0.5 if platform.startswith("linux") else 0.001


CREATE_TIME_TOLERANCE = create_time_tolerance(sys.platform)
HAS_PROC_STAT = sys.platform.startswith("linux")


def start_ticks(pid: int) -> int | None:
    """Linux: when the process started, in clock ticks since boot (field 22 of /proc/<pid>/stat). It never
    changes, and no step of the wall clock moves it, unlike psutil's create_time there (boot time as read now
    plus the ticks). None elsewhere, or when the process is gone."""
    if not HAS_PROC_STAT:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
        return int(data[data.rfind(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def machine_clock() -> float:
    """Seconds on a clock every process of this machine shares and no wall-clock step moves: Linux's
    CLOCK_BOOTTIME (it counts suspend, as process start ticks do), elsewhere the monotonic clock (system-wide
    on Windows and macOS). Deadlines and ages kept in a record, and read by other processes, use it."""
    if HAS_PROC_STAT:
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    return time.monotonic()


def is_number(value: Any) -> bool:
    """A finite int or float: JSON from disk may hold NaN or Infinity, and bool is an int to Python."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_whole_number(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class DamagedRecord(Exception):
    """A job record that cannot be read as one: listed as damaged, never fatal."""


@dataclasses.dataclass(frozen=True)
class ProcessId:
    """A process as the bridge remembers it: its pid and when it started, because pids get reused. On Linux
    the start is its clock ticks since boot (start_ticks), so a wall-clock step never makes a live job's
    process look like another; elsewhere psutil's create_time, which the system stamps once at creation. In
    a record it is {"pid", "create_time", "start_ticks"}; in a record's tree, a [pid, create_time, ticks]
    list (records of older bridges have no ticks: their create_time is compared, within a tolerance)."""

    pid: int
    create_time: float
    ticks: int | None = None

    @classmethod
    def of(cls, proc: "psutil.Process") -> "ProcessId":
        return cls(proc.pid, proc.create_time(), start_ticks(proc.pid))

    @classmethod
    def of_safe(cls, proc: "psutil.Process") -> "ProcessId | None":
        try:
            return cls.of(proc)
        except psutil.Error:
            return None

    def process(self) -> "psutil.Process | None":
        """The process if it still runs and is the same one (pid and start), else None."""
        try:
            proc = psutil.Process(self.pid)
            if self.ticks is not None and HAS_PROC_STAT:
                if start_ticks(self.pid) != self.ticks:
                    return None
            elif abs(proc.create_time() - self.create_time) > CREATE_TIME_TOLERANCE:
                return None
            return None if proc.status() == psutil.STATUS_ZOMBIE else proc
        except (psutil.Error, ValueError):
            return None

    def to_json(self) -> dict[str, float]:
        found = {"pid": self.pid, "create_time": self.create_time}
        return found if self.ticks is None else {**found, "start_ticks": self.ticks}

    @classmethod
    def from_json(cls, value: Any) -> "ProcessId":
        if not (isinstance(value, dict) and is_whole_number(value.get("pid"))
                and is_number(value.get("create_time"))
                and (value.get("start_ticks") is None or is_whole_number(value["start_ticks"]))):
            raise DamagedRecord("a process field is not {pid, create_time, start_ticks}")
        return cls(value["pid"], float(value["create_time"]), value.get("start_ticks"))

    def to_pair(self) -> list[float]:
        return [self.pid, self.create_time] + ([] if self.ticks is None else [self.ticks])

    @classmethod
    def from_pair(cls, value: Any) -> "ProcessId":
        if (not isinstance(value, list) or len(value) not in (2, 3) or not is_whole_number(value[0])
                or not is_number(value[1]) or (len(value) == 3 and not is_whole_number(value[2]))):
            raise DamagedRecord("a tree entry is not a [pid, create_time, start_ticks] list")
        return cls(value[0], float(value[1]), value[2] if len(value) == 3 else None)


def proc_status(proc: "psutil.Process") -> str:
    """A process' status (psutil's words), "dead" once it is gone."""
    try:
        return cast(str, proc.status())
    except psutil.Error:
        return psutil.STATUS_DEAD


def is_alive(proc: "psutil.Process") -> bool:
    """Running, not a zombie waiting for its reaper (a zombie is already stopped: it is not counted)."""
    return proc_status(proc) not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)


def running_process(process_id: ProcessId | None) -> "psutil.Process | None":
    return process_id.process() if process_id else None


def folder_identity(path: str) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def case_normalised(path: str) -> str:
    """The path with its case normalised where the OS does so (Windows: lower case, / as \\); macOS and
    Linux keep it as given, so equal folders there are told by identity (within_root)."""
    return os.path.normcase(path)


FOLDS_CASE = sys.platform in ("win32", "darwin")  # NTFS and APFS ignore case (APFS also normalisation)


def within_root(resolved: str, root: str, folds_case: bool = FOLDS_CASE,
                identity: Callable[[str], tuple[int, int] | None] = folder_identity) -> bool:
    """True when a resolved path sits inside a resolved root, by whole components. Where the file system
    ignores case, realpath keeps the spelling given, so a path whose spelling differs is also inside when
    one of its own ancestors is the root itself (same device and inode): equal folders are equal, and
    nothing becomes reachable that is not inside the root."""
    try:
        if os.path.commonpath([case_normalised(resolved), case_normalised(root)]) == case_normalised(root):
            return True
    except ValueError:  # different drives on Windows
        return False
    if not folds_case:
        return False
    root_id = identity(root)
    if root_id is None:
        return False
    current = resolved
    while True:
        if identity(current) == root_id:
            return True
        parent = os.path.dirname(current)
        if parent == current:
            return False
        current = parent


def within_any(resolved: str, roots: list[str]) -> bool:
    """True when a resolved path sits inside one of the resolved roots (see within_root)."""
    return any(within_root(resolved, root) for root in roots)


# ---------------------------------------------------------------------------------------------- config [both]
MAX_WAIT_CEILING_S = 50.0
APPROVAL_MODES = ("deny", "ask", "yolo")
DRIVER_NAMES = ("acp", "cli")  # the ways to drive Hermes; DRIVERS (Hermes drivers) holds their classes
ISOLATIONS = ("none", "worktree")  # where a job works: in its folder, or in a git worktree of its own
START_GRACE_S = 30.0  # a launched job whose supervisor has not reported by then is orphaned


@dataclasses.dataclass(frozen=True)
class Setting:
    """One config.json key, declared once, beside its Config field: the JSON types it takes (and the same in
    words), its bounds or its choices (the first choice is the default), and what it is for."""

    described: str
    types: tuple[type, ...]
    purpose: str
    low: float | None = None  # below it, or not finite, the default is used
    high: float | None = None  # above it the value is clamped
    choices: tuple[str, ...] = ()


def one_of(words: tuple[str, ...], quote: str = "") -> str:
    """'"deny", "ask" or "yolo"': the choices of a setting, in words."""
    quoted = [f"{quote}{word}{quote}" for word in words]
    return f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def setting(default: Any, described: str, types: tuple[type, ...], purpose: str, *, low: float | None = None,
            high: float | None = None, choices: tuple[str, ...] = ()) -> Any:
    """A Config field that is a setting: its default and its Setting (read back through SETTINGS). A setting
    of choices is described by them (described is then left empty)."""
    meta = {"setting": Setting(described or one_of(choices, '"'), types, purpose, low, high, choices)}
    if isinstance(default, list):
        return dataclasses.field(default_factory=functools.partial(list, default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


PATH_OR_NULL = ("a path string or null", (str, type(None)))
FOLDER_OR_NULL = ("a folder path or null", (str, type(None)))
SECONDS = ("a number of seconds", (int, float))
WHOLE = ("a whole number", (int,))
FLAG = ("true or false", (bool,))


@dataclasses.dataclass
class Config:
    """config.json as the server uses it: each setting is declared here once (setting), and every problem
    found while loading is kept, never raised."""

    path: Path
    hermes_exe: str | None = setting(None, *PATH_OR_NULL, "the hermes executable (else `hermes` on PATH)")
    hermes_home: str | None = setting(None, *PATH_OR_NULL, "Hermes' home: skills and sessions")
    allowed_roots: list[str] = setting([], "a list of folder paths", (list,), "the folders jobs may start in")
    default_cwd: str | None = setting(None, *FOLDER_OR_NULL, "the folder of a job given no cwd")
    default_timeout_s: float = setting(1800, *SECONDS, "a job's timeout when the call gives none", low=1)
    max_timeout_s: float = setting(14400, *SECONDS, "the most timeout_s a call may ask", low=1)
    default_max_turns: int | None = setting(None, "a whole number or null", (int, type(None)),
                                            "max_turns when the call gives none (null: Hermes' own)", low=1)
    default_max_tokens: int | None = setting(None, "a whole number or null", (int, type(None)),
                                             "a job's token budget when the call gives none (null: none)", low=1)
    max_tokens_limit: int | None = setting(None, "a whole number or null", (int, type(None)),
                                           "the most max_tokens a call may ask (null: no ceiling)", low=1)
    default_max_cost_usd: float | None = setting(None, "a number of dollars or null", (int, float, type(None)),
                                                 "a job's cost budget when the call gives none (null: none)",
                                                 low=0.000001)
    max_cost_usd_limit: float | None = setting(None, "a number of dollars or null", (int, float, type(None)),
                                               "the most max_cost_usd a call may ask (null: no ceiling)",
                                               low=0.000001)
    max_wait_s: float = setting(45, *SECONDS, "the longest a tool call waits; hosts cut calls off at about 60 s",
                                low=1, high=MAX_WAIT_CEILING_S)
    max_output_chars: int = setting(8000, *WHOLE, "how much of Hermes' output a final block quotes", low=200)
    max_running_jobs: int = setting(4, *WHOLE, "how many jobs may run at once", low=1)
    yolo: bool = setting(False, *FLAG, 'the older spelling of approvals "yolo"')
    approvals: str | None = setting(None, "", (str,),
                                    "what the bridge answers when Hermes asks before a dangerous command",
                                    choices=APPROVAL_MODES)  # unset: the older yolo decides (approval_mode)
    approval_timeout_s: float = setting(300, *SECONDS, "how long Hermes waits for an answer", low=5)
    hermes_driver: str = setting("auto", "", (str,), "how jobs drive Hermes",
                                 choices=("auto", *DRIVER_NAMES))
    hermes_cli_form: str = setting("auto", "", (str,),
                                   "the CLI's options (auto: as `hermes chat --help` declares them)",
                                   choices=("auto", "query-file", "query-arg"))
    extra_args: list[str] = setting([], "a list of strings", (list,), "more options for `hermes chat`")
    default_isolation: str = setting("none", "", (str,), "where a job given no isolation works: in its folder "
                                     "(none) or in a git worktree of its own (worktree)", choices=ISOLATIONS)
    jobs_dir: str | None = setting(None, *FOLDER_OR_NULL, "the jobs folder (else the per-user state folder)")
    logs_dir: str | None = setting(None, *FOLDER_OR_NULL, "the audit log's folder (else the per-user one)")
    read_anywhere: bool = setting(False, *FLAG, "let hermes_read read outside the allowed roots")
    kill_grace_s: float = setting(5, *SECONDS, "how long a stopped Hermes gets before it is killed", low=0)
    retention_days: float = setting(30, "a number of days", (int, float), "how long finished jobs are kept",
                                    low=0)
    retention_max_jobs: int = setting(1000, *WHOLE, "how many finished jobs are kept at most", low=1)
    audit_max_bytes: int = setting(1_000_000, "a whole number of bytes", (int,), "the audit log's size before it "
                                   "rotates", low=10_000)
    max_log_bytes: int = setting(16 << 20, "a whole number of bytes", (int,), "a job log's size past which it "
                                 "keeps its head and its newest output", low=65536)
    changed_files_skip: list[str] = setting([".git", "node_modules", ".venv", "__pycache__"],
                                            "a list of folder names", (list,), "folders CHANGED_FILES leaves out")
    changed_files_max_entries: int = setting(20_000, *WHOLE, "how many entries CHANGED_FILES lists at most", low=0)
    changed_files_max_s: float = setting(10, *SECONDS, "how long listing a job's folder may take", low=0)
    problems: list[str] = dataclasses.field(default_factory=list)
    sources: dict[str, str] = dataclasses.field(default_factory=dict)
    file_stamp: tuple[int, int] | None = None  # the config file's mtime and size when it was read

    def _dir(self, value: str | None, kind: str, legacy: str) -> Path:
        """A configured folder (relative = beside the config file); by default the per-user one, except
        in a clone that already keeps its jobs beside server.py, which goes on answering for them."""
        if value:
            path = Path(os.path.expanduser(value))
            return path if path.is_absolute() else self.path.parent / path
        if (SERVER_DIR / legacy).is_dir():
            return SERVER_DIR / legacy
        return user_dir("state") / "jobs" if kind == "state" else user_dir("log")

    @property
    def jobs_path(self) -> Path:
        return self._dir(self.jobs_dir, "state", "jobs")

    @property
    def logs_path(self) -> Path:
        return self._dir(self.logs_dir, "log", "logs")

    @property
    def roots(self) -> list[str]:
        """The allowed roots that are absolute and exist, resolved: the only places a job may start.

        A relative entry ("." or "") would resolve against the server's own folder, which the host picks,
        so it is ignored, never resolved."""
        resolved = []
        for root in self.allowed_roots:
            expanded = os.path.expanduser(root)
            if not os.path.isabs(expanded):
                continue
            real = os.path.realpath(expanded)
            if os.path.isdir(real):
                resolved.append(real)
        return resolved

    @property
    def hermes_exe_path(self) -> str | None:
        """hermes_exe as configured; a relative path is taken from the config file's folder, never the job's."""
        if not self.hermes_exe:
            return None
        expanded = os.path.expanduser(self.hermes_exe)
        return expanded if os.path.isabs(expanded) else str(self.path.parent / expanded)

    @property
    def approval_mode(self) -> str:
        """What the bridge answers when Hermes asks before a dangerous command: deny (the default), ask
        (relay the question to the user), or yolo (allow). `yolo: true` is the older spelling of yolo, and wins
        over deny: the bundle passes its "Auto-approve" box as --yolo beside --approvals deny, its default."""
        if self.yolo and self.approvals in (None, "deny"):
            return "yolo"
        return self.approvals or "deny"

    @property
    def hermes_home_path(self) -> Path:
        if self.hermes_home:
            return Path(os.path.expanduser(self.hermes_home))
        if os.environ.get("HERMES_HOME"):
            return Path(os.environ["HERMES_HOME"])
        if IS_WINDOWS and os.environ.get("LOCALAPPDATA"):
            return Path(os.environ["LOCALAPPDATA"]) / "hermes"
        return Path.home() / ".hermes"


SETTINGS: dict[str, Setting] = {field.name: field.metadata["setting"] for field in dataclasses.fields(Config)
                                if "setting" in field.metadata}


APP_NAME = "claude-hermes-bridge"
SETTINGS_ENV = "HERMES_BRIDGE_SETTINGS"  # settings the host passed on the command line, for supervisors


def user_dir(kind: str) -> Path:
    """A per-user folder (platformdirs: state, log or config) that survives reinstalling or updating the
    bridge, and lies outside a bundle's folder (which Claude Desktop replaces on update, and which the
    Microsoft Store build virtualises)."""
    import platformdirs

    return Path(getattr(platformdirs, f"user_{kind}_dir")(APP_NAME, appauthor=False))


def config_override() -> Path | None:
    override = os.environ.get("HERMES_BRIDGE_CONFIG")
    return Path(override).expanduser().resolve() if override else None


def config_places() -> list[tuple[str, Path | None]]:
    """Where the config is looked for, in order: (what, path); the first that exists is used, and with none
    the per-user one (where --init-config writes)."""
    return [("HERMES_BRIDGE_CONFIG", config_override()), ("beside server.py", SERVER_DIR / "config.json"),
            ("the per-user folder", user_dir("config") / "config.json")]


def config_path() -> Path:
    """HERMES_BRIDGE_CONFIG (what a supervisor always gets: it then never asks for the per-user folders),
    else config.json beside server.py (the clone route), else the per-user one."""
    override = config_override()
    if override:
        return override
    beside = SERVER_DIR / "config.json"
    return beside if beside.exists() else user_dir("config") / "config.json"


def config_search() -> str:
    """Every place looked at for the config, in order, and what was there: for --check."""
    found = []
    for what, path in config_places():
        state = "not set" if path is None else ("found" if path.exists() else "none")
        found.append(f"{what}: {path or ''} ({state})".replace(":  (", " ("))
    return "; ".join(found)


def config_fix() -> str:
    """How to make a config, in the words that fit this install: a clone has config.example.json to copy."""
    if (SERVER_DIR / "config.example.json").exists():
        return "copy config.example.json to config.json and set allowed_roots"
    return "run `claude-hermes-bridge --init-config --allowed-roots DIR` (or server.py --init-config)"


def read_config_file(path: Path, cfg: Config) -> dict[str, Any]:
    """The file's settings; every problem is kept in cfg.problems, never raised."""
    try:
        data = read_capped(path, 1 << 20, follow=True)
        info = os.stat(path)
        cfg.file_stamp = (info.st_mtime_ns, info.st_size)
        raw = json.loads(data.decode("utf-8"))
    except FileNotFoundError:
        if not host_settings():
            cfg.problems.append(f"no config file at {path}: {config_fix()} (or pass --allowed-roots)")
        return {}
    except json.JSONDecodeError as exc:
        cfg.problems.append(f"{path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}; "
                            "fix that spot (config.example.json shows the format)")
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        cfg.problems.append(f"cannot read {path}: {exc}")
        return {}
    if not isinstance(raw, dict):
        cfg.problems.append(f"{path} must hold a JSON object {{...}}, not {type(raw).__name__}")
        return {}
    return raw


def host_settings() -> dict[str, Any]:
    """Settings the host passed on the server's command line (main() puts them in the environment, so the
    supervisors it starts see them too); they win over the config file."""
    try:
        settings = json.loads(os.environ.get(SETTINGS_ENV) or "{}")
    except ValueError:
        return {}
    return {k: v for k, v in settings.items() if k in HOST_SETTING_KEYS} if isinstance(settings, dict) else {}


HOST_SETTING_KEYS = ("allowed_roots", "hermes_exe", "hermes_home", "yolo", "approvals")


def load_config(path: Path | None = None) -> Config:
    """Defaults, then config.json, then the host's command-line settings; a missing or broken file yields
    defaults plus a list of problems, never an error. cfg.sources says where each setting came from."""
    path = path or config_path()
    cfg = Config(path=path)
    for key, value in read_config_file(path, cfg).items():
        if key.startswith("_"):
            continue  # "_comment" keys document the file
        if key not in SETTINGS:
            cfg.problems.append(f"unknown key {key!r} in {path.name} (ignored); known keys: "
                                + ", ".join(SETTINGS))
            continue
        known = SETTINGS[key]
        wrong_bool = isinstance(value, bool) and bool not in known.types
        if wrong_bool or not isinstance(value, known.types) or (
                isinstance(value, list) and not all(isinstance(v, str) for v in value)):
            cfg.problems.append(f"{key} must be {known.described} ({known.purpose}), got {json.dumps(value)[:60]} "
                                "(default used)")
            continue
        setattr(cfg, key, value)
        cfg.sources[key] = f"config file {path}"
    pinned = host_settings()
    for key, value in pinned.items():
        setattr(cfg, key, value)
        cfg.sources[key] = "command line"
    cfg.problems += guard_file_settings(cfg, pinned)
    cfg.problems += validate_config(cfg)
    return cfg


# Options of `hermes chat` the bridge sets itself (task, folder, session, approvals, limits): extra_args may
# not carry them, or a file a job can write could move the next job out of the roots (Hermes keeps the last
# --in) or approve every command.
BRIDGE_OPTIONS = ("--query", "--query-file", "--in", "--resume", "--continue", "--oneshot", "--quiet", "--yolo",
                  "--max-turns", "--skills", "--toolsets", "--no-restore-cwd")
BRIDGE_SHORT_OPTIONS = "qQrcst"


def bridge_option(arg: str) -> bool:
    """True when a command-line word sets (or could be read as) an option the bridge sets itself: exact or
    with =value, any unambiguous prefix argparse would accept, or a short option, alone or bundled."""
    if arg.startswith("--"):
        name = arg.split("=", 1)[0]
        return len(name) > 2 and any(option.startswith(name) for option in BRIDGE_OPTIONS)
    return arg.startswith("-") and len(arg) > 1 and any(flag in BRIDGE_SHORT_OPTIONS for flag in arg[1:])


def guard_file_settings(cfg: Config, pinned: dict[str, Any]) -> list[str]:
    """What a config file (which a job can write) may not do: carry an option the bridge sets in extra_args,
    or widen what the host pinned on the command line (read_anywhere reads outside the pinned roots). The
    value is put right, and the problem returned."""
    problems = []
    claimed = [arg for arg in cfg.extra_args if bridge_option(arg)]
    if claimed:
        problems.append(f"extra_args holds options the bridge sets itself ({shown(', '.join(claimed), 200)}); "
                        "extra_args is ignored until they are removed")
        cfg.extra_args = []
    if "approvals" not in pinned and pinned.get("yolo") is False and cfg.approvals == "yolo":
        problems.append(f"approvals yolo in {cfg.path} is lowered to ask: the host pinned --yolo false")
        cfg.approvals = "ask"
    if "allowed_roots" in pinned and cfg.read_anywhere:
        problems.append(f"read_anywhere in {cfg.path} is ignored: the host pinned allowed_roots on the command "
                        "line, and a file cannot widen what the host pinned")
        cfg.read_anywhere = False
    return problems


def validate_config(cfg: Config) -> list[str]:
    """Problems that only show once the values are read: missing roots, unknown choices, out-of-range
    numbers, a Hermes or a default folder that is not there. Each bad value is replaced by its default."""
    problems = root_problems(cfg) + choice_problems(cfg) + number_problems(cfg)
    if cfg.hermes_exe_path and not os.path.exists(cfg.hermes_exe_path):
        problems.append(f"hermes_exe {cfg.hermes_exe!r} does not exist (looked at {cfg.hermes_exe_path})")
    if cfg.default_cwd and not within_any(os.path.realpath(os.path.expanduser(cfg.default_cwd)), cfg.roots):
        problems.append(f"default_cwd {cfg.default_cwd!r} is not an existing folder inside allowed_roots")
    return problems


def roots_missing(cfg: Config) -> str:
    """Why no job can start for want of roots, naming the real cause: none listed, or the listed ones absent."""
    listed = [root for root in cfg.allowed_roots if isinstance(root, str)]
    if not listed:
        return f"no allowed roots: pass --allowed-roots DIR, or {config_fix()}"
    return (f"none of the allowed roots is an existing folder ({shown(', '.join(listed), 600)}, from "
            f"{cfg.sources.get('allowed_roots', 'the config')}): create them (mkdir -p), or list folders that exist")


def root_problems(cfg: Config) -> list[str]:
    problems = []
    if not cfg.allowed_roots:
        problems.append("allowed_roots is empty: no job can start until you list at least one folder")
    for root in cfg.allowed_roots:
        expanded = os.path.expanduser(root)
        if not os.path.isabs(expanded):
            problems.append(f"allowed root {root!r} is not an absolute path (ignored)")
        elif not os.path.isdir(expanded):
            problems.append(f"allowed root {root!r} does not exist or is not a folder (ignored)")
        elif why := broad_root(os.path.realpath(expanded)):
            problems.append(f"allowed root {root!r} is {why}: every folder under it is open to jobs and "
                            "hermes_read; list project folders instead")
    return problems


def choice_problems(cfg: Config) -> list[str]:
    """Settings that take one of a few words; another word is replaced by the first, the default. approvals
    may also be unset (None): then the older yolo setting decides."""
    problems = []
    for key, known in SETTINGS.items():
        value = getattr(cfg, key)
        if known.choices and value is not None and value not in known.choices:
            problems.append(f"{key} {shown(value, 40)} is not {one_of(known.choices)} ({known.choices[0]} used)")
            setattr(cfg, key, known.choices[0])
    return problems


def number_problems(cfg: Config) -> list[str]:
    """Numbers outside their bounds: below the lowest sensible value (or not finite) the default is used,
    above the highest they are clamped."""
    problems = []
    for key, known in SETTINGS.items():
        value = getattr(cfg, key)
        if known.low is None or value is None:
            continue
        if known.high is not None and not known.low <= value <= known.high:
            clamped = min(max(value, known.low), known.high)
            problems.append(f"{key} {value} is outside {known.low:g}..{known.high:g} ({known.purpose}); clamped")
            setattr(cfg, key, clamped)
        elif not math.isfinite(value) or value < known.low:
            default = getattr(Config(path=cfg.path), key)
            instead = "Hermes' own default" if default is None else f"default {default}"
            problems.append(f"{key} {value} must be at least {known.low:g} ({instead} used)")
            setattr(cfg, key, default)
    return problems


def broad_root(resolved: str) -> str | None:
    """Why a root opens far more than a project (the file system root, a drive root, the home folder)."""
    if os.path.dirname(resolved) == resolved:
        return "the root of a drive or of the file system"
    if case_normalised(resolved) == case_normalised(os.path.realpath(os.path.expanduser("~"))):
        return "your home folder itself"
    return None


def path_advice(path_env: str, platform: str, home: str) -> str | None:
    """What the server's PATH lacks, on macOS, where Claude Desktop starts servers with launchd's PATH
    (/usr/bin:/bin:/usr/sbin:/sbin): `hermes` in ~/.local/bin is not found, nor the tools Hermes runs from
    Homebrew, though the same command works in a terminal."""
    if platform != "darwin":
        return None
    present = set(path_env.split(":"))
    usual = [f"{home}/.local/bin", "/opt/homebrew/bin", "/usr/local/bin"]
    missing = [folder for folder in usual if folder not in present]
    if not missing:
        return None
    return (f"the server's PATH lacks {', '.join(missing)} (Claude Desktop starts servers with launchd's PATH). "
            "Set hermes_exe to Hermes' absolute path, and give the server a PATH with the folders Hermes' tools "
            "need: register_with_claude.py writes both into the host entry")


# ----------------------------------------------------------------------------------------- confinement [both]
def resolve_path(path: str, what: str) -> str:
    """An absolute path with every symlink followed, or Refused saying what is wrong with it."""
    if not isinstance(path, str) or not path.strip():
        raise Refused(f"{what} is empty: give an absolute path")
    if "\x00" in path:
        raise Refused(f"{what} contains a NUL byte: give a plain absolute path")
    expanded = os.path.expanduser(path)
    if not os.path.isabs(expanded):
        raise Refused(f"{what} '{shown(path)}' is relative: give an absolute path")
    try:
        return os.path.realpath(expanded, strict=True)
    except FileNotFoundError:
        raise Refused(f"{what} '{shown(path)}' does not exist") from None
    except OSError as exc:  # symlink loop, name too long, permission
        raise Refused(f"{what} '{shown(path)}' cannot be resolved: {exc.strerror or exc}") from None


def confine_cwd(cfg: Config, cwd: str | None) -> str:
    """The job's working folder, resolved and inside an allowed root; never 'allow all'."""
    roots = cfg.roots
    if not roots:
        raise Refused("no allowed_roots are configured, so no job may start. Fix: list the folders Hermes "
                      f"may work in under allowed_roots in {cfg.path}")
    chosen = cwd if cwd not in (None, "") else (cfg.default_cwd or roots[0])
    resolved = resolve_path(chosen, "cwd")
    if not within_any(resolved, roots):
        raise Refused(f"cwd '{shown(chosen)}' resolves to {shown(resolved)}, which is outside the allowed roots "
                      f"({', '.join(roots)}). Use a folder inside one of them, or add a root in {cfg.path}")
    if not os.path.isdir(resolved):
        raise Refused(f"cwd '{shown(chosen)}' is not a folder")
    return resolved


def confine_read(cfg: Config, path: str) -> str:
    """A path hermes_read may open: inside the roots or the bridge's own job files, unless read_anywhere."""
    resolved = resolve_path(path, "path")
    if cfg.read_anywhere:
        return resolved
    readable = cfg.roots + [os.path.realpath(cfg.jobs_path)]
    if not within_any(resolved, readable):
        raise Refused(f"path '{shown(path)}' resolves to {shown(resolved)}, outside the allowed roots and the job "
                      "files "
                      f"({', '.join(readable)}). Set read_anywhere in {cfg.path} to widen hermes_read")
    return resolved


# ------------------------------------------------------------------------------------------- audit log [both]
AUDIT_FIELD_CHARS = 300
AUDIT_BACKUPS = 3


def first_words(text: Any, count: int = 8) -> str:
    """Enough of a task to recognise it in a log, never the whole (it may hold what the user typed)."""
    words = str(text or "").split()
    shown = " ".join(words[:count])[:80]
    return shown + (" ..." if len(words) > count or len(shown) == 80 else "")


def audit(cfg: Config, **fields: Any) -> None:
    """One JSON line per tool call or job state change in logs/audit.log, rotated by size. Never raises and
    never prints: a full disk must not fail a tool call, and a supervisor's stderr is the job log the model
    reads. The file is opened per line and rotated under a lock, so no process holds it open while another
    renames it (Windows refuses that), and opened without blocking or following a symlink."""
    capped = {key: shown(value, AUDIT_FIELD_CHARS) if isinstance(value, str) else value
              for key, value in fields.items()}
    line = (json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "pid": os.getpid(), **capped}) + "\n").encode()
    path = cfg.logs_path / "audit.log"
    try:
        cfg.logs_path.mkdir(parents=True, exist_ok=True)
        with locked(Path(str(path) + ".lock"), 2):
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | NOFOLLOW | getattr(os, "O_NONBLOCK", 0)
                         | getattr(os, "O_BINARY", 0), 0o600)
            try:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode):
                    return
                if info.st_size and info.st_size + len(line) > cfg.audit_max_bytes:
                    os.close(fd)
                    fd = -1
                    for index in range(AUDIT_BACKUPS, 1, -1):
                        if os.path.exists(f"{path}.{index - 1}"):
                            os.replace(f"{path}.{index - 1}", f"{path}.{index}")
                    os.replace(path, f"{path}.1")
                    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | NOFOLLOW | getattr(os, "O_BINARY", 0),
                                 0o600)
                os.write(fd, line)
            finally:
                if fd >= 0:
                    os.close(fd)
    except Exception:  # noqa: BLE001
        pass


# ------------------------------------------------------------------------------------------- job store [both]
JOB_ID_RE = re.compile(r"\d{8}-\d{6}-\d{1,6}")
RECORD_MAX_BYTES = 4 << 20  # a record holds the pids Hermes started; far below this
MAX_TASK_BYTES = 4 << 20
JOB_MARKER = "HERMES_BRIDGE_JOB"  # set in the supervisor's and Hermes' environment: the proof of ownership
SESSION_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")  # a Hermes session id, as records hold it


class JobState(str, enum.Enum):
    """A job's state. A record holds the value; orphaned is never written, only observed."""

    STARTING = "starting"
    RUNNING = "running"
    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    OVER_BUDGET = "over_budget"
    ORPHANED = "orphaned"


FINAL_STATES = frozenset({JobState.OK, JobState.ERROR, JobState.TIMEOUT, JobState.CANCELLED, JobState.OVER_BUDGET})
LIVE_STATES = frozenset({JobState.STARTING, JobState.RUNNING})
PART_DONE_STATES = frozenset({JobState.TIMEOUT, JobState.CANCELLED, JobState.OVER_BUDGET, JobState.ORPHANED})


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How a job ended, as the supervisor (or a cancel of an orphan) writes it."""

    state: JobState
    exit_code: int | None
    reason: str | None


# What a record keeps of its lists, so a live job's record never grows past what the store reads back
# (RECORD_MAX_BYTES): the questions waiting now, the newest decisions (with counts of all), the processes seen.
QUESTIONS_KEPT = 1000
QUESTIONS_MAX_BYTES = 1 << 20
DECISIONS_KEPT = 100
LATE_ANSWERS_KEPT = 20
ANSWERS_MAX_BYTES = 1 << 20
LATE_KEY = "late"  # the answers file's list of late answers, which the supervisor copies into the record
# allow_for_job: this question, and the same command (the exact text) asked again in this job, are allowed
ANSWER_DECISIONS = ("allow", "deny", "allow_for_job")
SESSION_OPTION = "allow_session"  # Hermes' "allow for this session" option, by its id
ANSWERERS = {"user": "the user (elicitation)", "planner": "the planner (hermes_approve)",  # who answered, in words
             "view": "the user (job view)"}
TREE_KEPT = 20_000
CHANGED_LINES = 50
TEXT_FIELD_MAX_BYTES = 256 << 10  # Hermes' answer as the record keeps it, JSON-encoded


def is_text_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def is_text_fields(value: Any, names: tuple[str, ...]) -> bool:
    """A dict whose named fields are all text."""
    return isinstance(value, dict) and all(isinstance(value.get(name), str) for name in names)


def is_flat_dict(value: Any) -> bool:
    """A dict of text keys whose values are text or finite numbers (activity and spend as records keep them)."""
    return isinstance(value, dict) and all(isinstance(k, str) and (isinstance(x, str) or is_number(x))
                                           for k, x in value.items())


def is_late_answer(value: Any) -> bool:
    """An answer that came after its question was decided: its question's id, the decision, who, when."""
    return is_text_fields(value, ("id", "decision", "by")) and is_number(value.get("at"))


def is_question(value: Any) -> bool:
    """A question Hermes waits on, as the supervisor keeps it: its id, what it asks, when it was asked and
    until when Hermes waits (wall clock for people, machine_clock for deciding)."""
    return (is_text_fields(value, ("id", "what")) and all(is_number(value.get(name)) for name in (
        "asked_at", "expires_at", "expires_clock")))


def fit_json(text: str, max_bytes: int) -> str:
    """The longest head of text whose JSON encoding (as records are written) takes at most max_bytes: a
    character can take six bytes there (\\u001b), so a count of characters bounds nothing."""
    if len(json.dumps(text, ensure_ascii=False).encode()) <= max_bytes:
        return text
    low, high = 0, len(text)
    while low < high:
        middle = (low + high + 1) // 2
        if len(json.dumps(text[:middle], ensure_ascii=False).encode()) <= max_bytes:
            low = middle
        else:
            high = middle - 1
    return text[:low]


def is_changes(value: Any) -> bool:
    """The changed files as compare_snapshots writes them, or a note saying why they were not tracked."""
    if not isinstance(value, dict):
        return False
    if "note" in value:
        return isinstance(value["note"], str)
    return (all(is_whole_number(value.get(count)) for count in ("created", "modified", "deleted", "more"))
            and is_text_list(value.get("lines")))


# What each plain field of a record may hold on disk (bool is never a number here).
RECORD_FIELD_CHECKS: dict[str, Callable[[Any], bool]] = {
    "created_at": is_number, "timeout_s": is_number,
    "task_preview": lambda v: isinstance(v, str),
    "skills": is_text_list, "toolsets": is_text_list, "argv": is_text_list,
    "max_turns": is_whole_number, "exit_code": is_whole_number,
    "started_at": is_number, "ended_at": is_number,
    "changes": is_changes,
    "nonce": lambda v: isinstance(v, str) and re.fullmatch(r"[0-9a-f]{16,64}", v) is not None,
    "driver": lambda v: v in DRIVER_NAMES,
    "approval_mode": lambda v: v in APPROVAL_MODES,
    "acp": is_flat_dict,
    "questions": lambda v: isinstance(v, list) and len(v) <= QUESTIONS_KEPT and all(is_question(q) for q in v),
    "decisions": lambda v: isinstance(v, list) and len(v) <= DECISIONS_KEPT
    and all(is_text_fields(d, ("id", "what", "decision", "by")) for d in v),
    "late_answers": lambda v: isinstance(v, list) and len(v) <= LATE_ANSWERS_KEPT
    and all(is_late_answer(a) for a in v),
    "decided": lambda v: isinstance(v, dict) and all(isinstance(k, str) and is_whole_number(n) for k, n in v.items()),
    "usage": lambda v: isinstance(v, dict) and all(is_number(count) for count in v.values()),
    "created_clock": is_number, "started_clock": is_number, "heartbeat": is_number, "duration_s": is_number,
    "max_tokens": is_whole_number, "max_cost_usd": is_number,
    "spend": is_flat_dict,
    "spend_base": lambda v: isinstance(v, dict) and all(is_number(x) for x in v.values()),
    "worktree": lambda v: is_flat_dict(v) and is_text_fields(v, ("repo", "path", "branch", "base")),
    "diff": lambda v: is_flat_dict(v) and all(is_whole_number(v.get(n)) for n in ("files", "insertions", "deletions",
                                                                                  "patch_bytes"))
    and isinstance(v.get("patch"), str),
    "landed": lambda v: is_flat_dict(v) and is_text_fields(v, ("action", "how")),
    **{name: (lambda v: isinstance(v, str)) for name in ("cwd", "session_requested", "dedupe_key", "session_id",
                                                          "reason", "log", "cwd_note", "session_source",
                                                          "session_note", "outcome_note", "swept")},
}
# Written by every launch, even when empty; the other fields appear once they are known.
RECORD_ALWAYS_WRITTEN = ("id", "state", "created_at", "task_preview", "cwd",
                         "session_requested", "skills", "toolsets", "max_turns", "timeout_s", "dedupe_key",
                         "supervisor", "hermes", "exit_code", "session_id", "reason", "log", "driver", "approval_mode",
                         "created_clock")


@dataclasses.dataclass
class JobRecord:
    """A job's record, <id>.json: what was asked, who runs it, how it ended. The fields are the JSON keys.

    Hermes' shell can write the jobs folder, so from_json checks every field and raises DamagedRecord;
    nothing read from a record is trusted further than its type (pids are proven before any signal)."""

    id: str
    state: JobState = JobState.STARTING
    created_at: float = 0.0
    task_preview: str = ""
    cwd: str | None = None
    session_requested: str | None = None
    skills: list[str] = dataclasses.field(default_factory=list)
    toolsets: list[str] = dataclasses.field(default_factory=list)
    max_turns: int | None = None
    timeout_s: float = 0.0
    dedupe_key: str | None = None
    supervisor: ProcessId | None = None
    hermes: ProcessId | None = None
    exit_code: int | None = None
    session_id: str | None = None
    reason: str | None = None
    log: str | None = None
    cwd_note: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    argv: list[str] | None = None
    tree: list[ProcessId] = dataclasses.field(default_factory=list)  # every descendant of Hermes seen
    changes: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    session_source: str | None = None
    session_note: str | None = None
    nonce: str | None = None  # makes the process marker unique machine-wide (see marker)
    driver: str | None = None  # cli or acp (older records: cli)
    approval_mode: str | None = None  # deny, ask or yolo, as the job was started with
    acp: dict[str, Any] | None = None  # the job's activity from Hermes' ACP events
    questions: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # Hermes' questions waiting now
    decisions: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # the newest DECISIONS_KEPT decided
    decided: dict[str, int] | None = None  # how many questions were decided each way, all told
    created_clock: float | None = None  # machine_clock() at the launch, at Hermes' start, at the last heartbeat
    started_clock: float | None = None
    heartbeat: float | None = None
    duration_s: float | None = None  # Hermes' run as the supervisor timed it (monotonic)
    outcome_note: str | None = None  # what delayed writing the outcome (a full or read-only disk)
    swept: str | None = None  # what the supervisor stopped after Hermes had exited
    late_answers: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # refused: the question was decided
    max_tokens: int | None = None  # the job's budgets, enforced by its supervisor for both drivers
    max_cost_usd: float | None = None
    spend: dict[str, Any] | None = None  # what this job spent, read from Hermes' store (see session_spend)
    spend_base: dict[str, Any] | None = None  # a resumed session's counters when the job started
    worktree: dict[str, Any] | None = None  # a worktree job's: repo, path, branch, base (see git worktrees)
    diff: dict[str, Any] | None = None  # a worktree job's work against its base: counts and the patch file
    landed: dict[str, Any] | None = None  # what hermes_land did with a worktree job's work: action, how, at

    def add_decision(self, decision: dict[str, Any]) -> None:
        """A question decided: counted, and kept among the newest DECISIONS_KEPT."""
        self.decisions = [*self.decisions, decision][-DECISIONS_KEPT:]
        counts = dict(self.decided or {})
        counts[decision["decision"]] = counts.get(decision["decision"], 0) + 1
        self.decided = counts

    @property
    def marker(self) -> str:
        """The value of JOB_MARKER in this job's processes: the id alone would be shared by a job of the same
        id in another jobs folder (another install, another test run), and a stop would kill both."""
        return f"{self.id}:{self.nonce}" if self.nonce else self.id

    @classmethod
    def from_json(cls, data: Any, job_id: str) -> "JobRecord":
        if not isinstance(data, dict) or data.get("id") != job_id or not isinstance(data.get("state"), str):
            raise DamagedRecord("not a job record (wrong shape)")
        try:
            state = JobState(data["state"])
        except ValueError:
            raise DamagedRecord(f"state {shown(data['state'], 40)} is not a job state") from None
        fields: dict[str, Any] = {}
        for name, check in RECORD_FIELD_CHECKS.items():
            value = data.get(name)
            if value is not None and not check(value):
                raise DamagedRecord(f"field {name} has the wrong type")
            if value is not None:
                fields[name] = value
        for name in ("supervisor", "hermes"):
            if data.get(name) is not None:
                fields[name] = ProcessId.from_json(data[name])
        tree = data.get("tree") or []
        if not isinstance(tree, list):
            raise DamagedRecord("field tree has the wrong type")
        return cls(id=job_id, state=state, tree=[ProcessId.from_pair(entry) for entry in tree], **fields)

    def change_state(self, state: JobState, reason: str | None = None, exit_code: int | None = None) -> None:
        """Every change of a record's state goes through here (as supervisord's change_state): an ending
        stamps its time, with the reason and the exit code it ended with."""
        self.state = state
        if state in FINAL_STATES:
            self.ended_at, self.reason, self.exit_code = time.time(), reason, exit_code

    def encoded(self) -> bytes:
        """The record as written to disk: refused (DamagedRecord) when the store could not read it back."""
        data = self.to_json()
        encoded = json.dumps(data, indent=1, ensure_ascii=False).encode()
        if len(encoded) > RECORD_MAX_BYTES:
            raise DamagedRecord(f"the record would be {len(encoded):,} bytes, more than the {RECORD_MAX_BYTES:,} the "
                                "store reads")
        JobRecord.from_json(json.loads(encoded), self.id)
        return encoded

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name not in RECORD_ALWAYS_WRITTEN and value in (None, []):
                continue
            if isinstance(value, ProcessId):
                value = value.to_json()
            elif field.name == "tree":
                value = [process_id.to_pair() for process_id in value]
            elif isinstance(value, JobState):
                value = value.value
            data[field.name] = value
        return data


def write_record(store: "JobStore", record: JobRecord) -> None:
    """A record written, for a caller that needs no answer (a driver saving its job's activity)."""
    store.write(record)


def validate_job_id(job_id: Any) -> str:
    if not isinstance(job_id, str) or not JOB_ID_RE.fullmatch(job_id):
        raise Refused(f"job_id {shown(job_id, 60)} is not a job id: ids look like 20261106-101500-1 (see hermes_jobs)")
    return job_id


def job_sort_key(job_id: str) -> tuple[str, int]:
    stamp, _, counter = job_id.rpartition("-")
    return stamp, int(counter)


RECORD_LOCK_S = 15.0  # a deadline for a stuck holder; ten writers queued on a loaded machine stay well within it


class JobStore:
    """The jobs folder: <id>.json record, <id>.log output, <id>.task text, active/<id> while unfinished."""

    def __init__(self, root: Path):
        self.root = root
        self.active = root / "active"
        self.locks = root / "locks"

    @classmethod
    def of(cls, cfg: Config) -> "JobStore":
        """The jobs folder a config names (a JobStore is only its paths: cheap to make)."""
        return cls(cfg.jobs_path)

    def views(self, job_ids: Iterable[str]) -> Iterator[tuple[str, "JobView | None", str]]:
        """Each job as observed now, in the order given; a record that cannot be trusted comes as None with
        the reason (a job can write the jobs folder: a listing shows it as damaged, never fails on it)."""
        for job_id in job_ids:
            try:
                yield job_id, observe(self.read(job_id), self.root), ""
            except (Refused, DamagedRecord) as exc:
                yield job_id, None, str(exc)

    def ensure(self) -> None:
        self.active.mkdir(parents=True, exist_ok=True)
        self.locks.mkdir(exist_ok=True)

    def record_path(self, job_id: str) -> Path:
        return self.root / f"{job_id}.json"

    def log_path(self, job_id: str) -> Path:
        return self.root / f"{job_id}.log"

    def task_path(self, job_id: str) -> Path:
        return self.root / f"{job_id}.task"

    def cancel_path(self, job_id: str) -> Path:
        return self.root / f"{job_id}.cancel"

    def patch_path(self, job_id: str) -> Path:
        """A worktree job's whole change against its base, as a binary patch."""
        return self.root / f"{job_id}.patch"

    def worktree_path(self, job_id: str) -> Path:
        """Where a worktree job's worktree is made: in the jobs folder, outside every repository."""
        return self.root / "worktrees" / job_id

    def answers_path(self, job_id: str) -> Path:
        """The answers to the questions a job waits on, {approval id: {decision, by, at}}: each claimed once,
        under the record's lock (claim_answer), and read by the job's supervisor."""
        return self.root / f"{job_id}.answers"

    def answers_file(self, job_id: str) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
        """The answers file in one read: the answers claimed for a job's questions, and the answers that came
        after their question was decided; entries of the right shape only (a job can write the file)."""
        found = read_json(self.answers_path(job_id), ANSWERS_MAX_BYTES)
        if not isinstance(found, dict):
            return {}, []
        late = found.get(LATE_KEY)
        return ({key: value for key, value in found.items() if isinstance(value, dict)
                 and value.get("decision") in ANSWER_DECISIONS and isinstance(value.get("by"), str)},
                [a for a in late if is_late_answer(a)][-LATE_ANSWERS_KEPT:] if isinstance(late, list) else [])

    @property
    def detach_path(self) -> Path:
        """Whether jobs outlive the host, as the last launch found it (Windows job objects may forbid it)."""
        return self.root / "detach.json"

    def claim_id(self, task: bytes) -> str:
        """A new id, claimed by creating its task file and its log exclusively, so two processes never share
        one. Ids are predictable, so a job may have planted a FIFO, a symlink or a file at a future id's
        names: such an id is skipped for the next, and nothing planted is ever opened or followed. An id never
        sorts before one already on disk, though the clock stepped back; a claim the disk refused leaves
        nothing behind."""
        self.ensure()
        now = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time()))
        ahead = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() + 86400))
        newest = [job_id.rpartition("-")[0] for job_id in self.list_ids()[-1:]]
        stamp = max(now, newest[0]) if newest and newest[0] <= ahead else now  # a far-future name is planted
        for counter in range(1, 1_000_000):
            job_id = f"{stamp}-{counter}"
            if any(os.path.lexists(path) for path in (self.record_path(job_id), self.cancel_path(job_id),
                                                      self.answers_path(job_id))):
                continue
            try:
                task_fd = create_exclusive(self.task_path(job_id))
            except FileExistsError:
                continue
            try:
                os.close(create_exclusive(self.log_path(job_id)))
            except FileExistsError:
                os.close(task_fd)
                self.task_path(job_id).unlink(missing_ok=True)
                continue
            except OSError:
                os.close(task_fd)
                self.task_path(job_id).unlink(missing_ok=True)
                raise
            try:
                with open(task_fd, "wb") as handle:
                    handle.write(task)
            except OSError:
                self.task_path(job_id).unlink(missing_ok=True)
                self.log_path(job_id).unlink(missing_ok=True)
                raise
            return job_id
        raise Refused("no free job id this second; try again")

    def record_lock(self, job_id: str) -> Any:
        return locked(self.locks / f"{job_id}.lock", RECORD_LOCK_S)

    def write(self, record: JobRecord) -> bool:
        """Write the record whole, unless the disk already holds an outcome: an outcome is final, so a
        cancel that took a job for an orphan never replaces what its supervisor has just written (checked
        under the record's lock). False when the record was left as it was."""
        with self.record_lock(record.id):
            try:
                if self.read(record.id).state in FINAL_STATES:
                    return False
            except (Refused, DamagedRecord):
                pass
            write_atomic(self.record_path(record.id), record.encoded())
            return True

    def update(self, job_id: str, change: Callable[[JobRecord], None], final_too: bool = False) -> JobRecord | None:
        """Read, change and write a record under its lock, so a write from another process in between is
        never lost (a launcher noting its supervisor while that supervisor writes). None when the record holds
        an outcome already (unless final_too: what became of a finished job's worktree), or is damaged: it is
        then left as it is."""
        with self.record_lock(job_id):
            try:
                record = self.read(job_id)
            except DamagedRecord:
                return None
            if record.state in FINAL_STATES and not final_too:
                return None
            change(record)
            write_atomic(self.record_path(job_id), record.encoded())
            return record

    def read(self, job_id: str) -> JobRecord:
        try:
            data = read_replaceable(self.record_path(job_id), RECORD_MAX_BYTES)
        except FileNotFoundError:
            raise Refused(f"no job {job_id} in {self.root} (it may have been pruned; see hermes_jobs)") from None
        except OSError as exc:
            raise DamagedRecord(f"unreadable: {exc.strerror or exc}") from None
        try:
            return JobRecord.from_json(json.loads(data), job_id)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise DamagedRecord(f"not JSON ({len(data)} bytes)") from None

    def list_ids(self) -> list[str]:
        """Every job id on disk, oldest first, without opening a record."""
        try:
            with os.scandir(self.root) as entries:
                ids = [e.name[:-5] for e in entries if e.name.endswith(".json") and JOB_ID_RE.fullmatch(e.name[:-5])]
        except OSError:  # no folder yet, or not a folder: hermes_health names the problem
            return []
        return sorted(ids, key=job_sort_key)

    def active_ids(self) -> list[str]:
        try:
            with os.scandir(self.active) as entries:
                return sorted((e.name for e in entries if JOB_ID_RE.fullmatch(e.name)), key=job_sort_key)
        except OSError:
            return []

    def mark_active(self, job_id: str) -> None:
        write_atomic(self.active / job_id, b"")

    def clear_active(self, job_id: str) -> None:
        (self.active / job_id).unlink(missing_ok=True)

    def remove(self, job_id: str) -> None:
        """The record goes last: a log still held open (Windows) leaves the job listed, to be pruned later,
        instead of a log without a record left behind for ever."""
        for path in (self.log_path(job_id), self.task_path(job_id), self.cancel_path(job_id),
                     self.answers_path(job_id), self.patch_path(job_id), self.locks / f"{job_id}.lock",
                     self.record_path(job_id)):
            path.unlink(missing_ok=True)

    def captured_sessions(self, scan_limit: int = 5000) -> Iterator[str]:
        """Session ids captured by jobs of this bridge, newest first, each once; bounded by scan_limit."""
        for _, session_id in self._captures(scan_limit):
            yield session_id

    def captured_session_folder(self, session_id: str, scan_limit: int = 5000) -> str | None:
        """The folder of the newest bridge job that captured this session."""
        return next((record.cwd for record, sid in self._captures(scan_limit) if sid == session_id), None)

    def _captures(self, scan_limit: int) -> Iterator[tuple[JobRecord, str]]:
        seen: set[str] = set()
        for job_id in reversed(self.list_ids()[-scan_limit:]):
            try:
                record = self.read(job_id)
            except (Refused, DamagedRecord):
                continue
            session_id = record.session_id
            if session_id and SESSION_NAME_RE.fullmatch(session_id) and session_id not in seen and record.cwd:
                seen.add(session_id)
                yield record, session_id


HEARTBEAT_S = 5.0  # how often a supervisor stamps its record while it watches a job
HEARTBEAT_STALE_S = 30.0  # a live supervisor silent for longer is not watching its job
DISK_FULL_BYTES = 1 << 20


def disk_problem(folder: Path) -> str | None:
    """Why this folder's disk refuses writes, read without writing: full (free space, as a zero-byte write
    would still succeed), or read-only. None when it takes writes, or cannot be asked."""
    import shutil

    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return None
    if free < DISK_FULL_BYTES:
        return f"the disk of {folder} is full ({free:,} bytes free)"
    if hasattr(os, "statvfs") and os.statvfs(folder).f_flag & getattr(os, "ST_RDONLY", 1):
        return f"{folder} is on a read-only file system"
    if not os.access(folder, os.W_OK):
        return f"{folder} is not writable"
    return None


@dataclasses.dataclass
class JobView:
    """A record plus what the disk and the process table say about it now. condition says what a live
    supervisor's job is doing beyond running: frozen, silent, or over with its outcome not written yet."""

    record: JobRecord
    state: JobState
    reason: str | None = None
    condition: str | None = None
    frozen: bool = False

    @property
    def running(self) -> bool:
        return self.state in LIVE_STATES

    @property
    def pending_questions(self) -> list[dict[str, Any]]:
        """The questions Hermes waits on, oldest first, while it still waits."""
        if not self.running:
            return []
        now = machine_clock()
        return [question for question in self.record.questions if now < question["expires_clock"]]

    @property
    def shown_state(self) -> str:
        """What a status block and a listing say: starting is shown as running, a question as needs_approval."""
        if self.pending_questions:
            return "needs_approval"
        return JobState.RUNNING.value if self.running else self.state.value


def observe(record: JobRecord, jobs_folder: Path | None = None) -> JobView:
    """The job's state as a reader should report it: a dead supervisor without an outcome is orphaned; a live
    one may be frozen, silent, or done with Hermes and waiting to write the outcome (jobs_folder: whose disk
    to ask why)."""
    if record.state in FINAL_STATES:
        return JobView(record, record.state, record.reason)
    live = JobState.RUNNING if record.state is JobState.RUNNING else JobState.STARTING
    if supervisor := running_process(record.supervisor):
        condition, frozen = supervisor_condition(record, supervisor, jobs_folder)
        return JobView(record, live, condition=condition, frozen=frozen)
    launched = record.created_clock
    age = machine_clock() - launched if launched is not None else time.time() - record.created_at
    if record.supervisor is None and age < START_GRACE_S:
        return JobView(record, JobState.STARTING)
    hermes = running_process(record.hermes)
    hermes_note = (f"Hermes (pid {hermes.pid}) is still running; hermes_cancel stops it" if hermes
                   else "Hermes is not running")
    return JobView(record, JobState.ORPHANED, f"the job's supervisor is gone and wrote no outcome; {hermes_note}. "
                   "Inspect the log and the files before re-running.")


def supervisor_condition(record: JobRecord, supervisor: "psutil.Process",
                         jobs_folder: Path | None) -> tuple[str | None, bool]:
    """What a live supervisor's job is doing beyond running, and whether the supervisor is frozen."""
    if proc_status(supervisor) == psutil.STATUS_STOPPED:
        return (f"the job's supervisor (pid {supervisor.pid}) is frozen (stopped by a signal): nothing watches the "
                "job, enforces its timeout or writes its outcome. hermes_cancel ends it", True)
    disk = disk_problem(jobs_folder) if jobs_folder is not None else None
    hermes_over = record.hermes is not None and running_process(record.hermes) is None
    if hermes_over:
        return ("Hermes has exited: the job is over. " + (f"Its outcome waits for the disk ({disk}); the supervisor "
                "writes it as soon as the disk takes it" if disk else "The supervisor is writing its outcome"), False)
    if disk:
        return f"the jobs folder refuses writes ({disk}); the supervisor waits for the disk", False
    silent = machine_clock() - record.heartbeat if record.heartbeat is not None else 0.0
    if silent > HEARTBEAT_STALE_S:
        return (f"the job's supervisor (pid {supervisor.pid}) has not stamped its record for {int(silent)} s: it may "
                "be stuck. hermes_cancel ends it", False)
    return None, False


# --------------------------------------------------------------------------------------- git worktrees [both]
# A job with isolation "worktree" runs in a git worktree of its own, made and owned by the bridge (Hermes'
# own --worktree is unfit: DESIGN.md section 13), in the jobs folder: outside the repository, so the main
# tree's `git status`, `git clean` and `grep -r` never see it, and readable by hermes_read like a job's log.
# The job's work (its commits and what it left uncommitted) is kept as one commit under
# refs/hermes-bridge/<id> and as a binary patch beside the record; hermes_land merges or discards it.
WORKTREE_BRANCH_PREFIX = "hermes-bridge/"
WORKTREE_REF_PREFIX = "refs/hermes-bridge/"
ISOLATION_BASES = ("head", "working-tree")
GIT_TIMEOUT_S = 60.0  # one git command; a worktree's checkout and its submodules get GIT_CHECKOUT_TIMEOUT_S
GIT_CHECKOUT_TIMEOUT_S = 600.0
REPO_LOCK_S = 30.0
BRIDGE_IDENTITY = {"GIT_AUTHOR_NAME": "claude-hermes-bridge", "GIT_AUTHOR_EMAIL": "hermes-bridge@localhost",
                   "GIT_COMMITTER_NAME": "claude-hermes-bridge", "GIT_COMMITTER_EMAIL": "hermes-bridge@localhost"}


class GitFailed(Exception):
    """A git command that failed, in words: the command and the last line git printed."""


def git(folder: str, *args: str, env: dict[str, str] | None = None, timeout_s: float = GIT_TIMEOUT_S,
        stdout: Any = None, check: bool = True, given: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """git in folder, with nothing of the caller's git environment, no hooks and no fsmonitor (a repository's
    config could name a program for either, and the bridge's own git calls run no program of the job's),
    no prompt, and messages in English. stdout: a file to stream into (a patch can be large); given: its
    input."""
    import shutil

    exe = shutil.which("git")
    if exe is None:
        raise GitFailed("git is not installed or not on PATH")
    environment = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}
    environment.update(GIT_TERMINAL_PROMPT="0", LC_ALL="C", LANGUAGE="C", **(env or {}))
    argv = [exe, "-c", f"core.hooksPath={os.devnull}", "-c", "core.fsmonitor=false", "-C", folder, *args]
    try:
        done = subprocess.run(argv, input=given, stdin=None if given is not None else subprocess.DEVNULL,
                              stdout=stdout or subprocess.PIPE, stderr=subprocess.PIPE, env=environment,
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise GitFailed(f"git {args[0]} took more than {timeout_s:g} s") from None
    except OSError as exc:
        raise GitFailed(f"git could not run: {exc.strerror or exc}") from None
    if check and done.returncode != 0:
        said = [line for line in done.stderr.decode("utf-8", "replace").splitlines() if line.strip()]
        last = said[-1] if said else f"exit {done.returncode}"
        raise GitFailed(f"git {' '.join(args[:2])} failed: {shown(last, 300)}")
    return done


def git_text(folder: str, *args: str, env: dict[str, str] | None = None) -> str:
    return git(folder, *args, env=env).stdout.decode("utf-8", "replace").strip()


@dataclasses.dataclass(frozen=True)
class Repository:
    """The repository a worktree job's cwd is in, as the launch found it."""

    top: str
    head: str
    branch: str | None  # the branch HEAD is on; None when detached
    subdir: str  # cwd below top, with / ('' for the top itself)
    uncommitted: int  # paths with uncommitted or untracked changes
    submodules: bool


def repository_of(cwd: str) -> Repository:
    """The repository around cwd, or Refused naming why a worktree cannot be made from it."""
    try:
        top = os.path.realpath(git_text(cwd, "rev-parse", "--show-toplevel"))
    except GitFailed as exc:
        raise Refused(f"isolation \"worktree\" needs cwd inside a git repository, and {shown(cwd)} is not in one "
                      f"({exc}). Run `git init` and commit, or use isolation \"none\"") from None
    try:
        head = git_text(top, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
    except GitFailed:
        raise Refused(f"isolation \"worktree\" needs a repository with at least one commit, and {shown(top)} has "
                      "none yet: commit first, or use isolation \"none\"") from None
    branch = git(top, "symbolic-ref", "--quiet", "--short", "HEAD", check=False).stdout.decode().strip() or None
    status = git(top, "status", "--porcelain", "-z", "--untracked-files=all", "--no-renames").stdout
    subdir = Path(os.path.relpath(cwd, top)).as_posix()
    return Repository(top, head, branch, "" if subdir == "." else subdir, len([e for e in status.split(b"\0") if e]),
                      os.path.isfile(os.path.join(top, ".gitmodules")))


def worktree_of(store: "JobStore", record: "JobRecord") -> dict[str, Any] | None:
    """A record's worktree, only as the bridge made it: in this jobs folder, on the branch named for the job
    that made it (a resumed job's is its first job's). A job can write its record: a worktree pointing
    anywhere else is never touched (None)."""
    worktree = record.worktree
    if not worktree:
        return None
    owner = worktree.get("job", record.id)
    if not isinstance(owner, str) or not JOB_ID_RE.fullmatch(owner):
        return None
    if worktree["path"] != str(store.worktree_path(owner)) or worktree["branch"] != WORKTREE_BRANCH_PREFIX + owner:
        return None
    return worktree


def job_roots(cfg: Config, record: "JobRecord") -> list[str]:
    """Where a job may work and edit: the allowed roots, or, for a worktree job, only its own worktree."""
    return [os.path.realpath(record.worktree["path"])] if record.worktree else cfg.roots


def repo_lock(store: "JobStore", top: str) -> Any:
    """One lock per repository (by its folder) around the bridge's changes to it: worktrees made and removed,
    merges, so two jobs or a job and a landing never interleave them."""
    import hashlib

    return locked(store.locks / f"repo-{hashlib.sha256(top.encode()).hexdigest()[:24]}.lock", REPO_LOCK_S)


def tree_commit(folder: str, parent: str, index: Path, message: str, git_dir: list[str] | None = None) -> str:
    """A commit of everything in folder's working tree (untracked files too, ignored ones not) on parent,
    made through a throwaway index: the folder's own index, stash and branches are untouched. parent itself
    when nothing differs from it."""
    env = {"GIT_INDEX_FILE": str(index), **BRIDGE_IDENTITY}
    where = git_dir or []
    index.unlink(missing_ok=True)
    try:
        git(folder, *where, "read-tree", parent, env=env)
        git(folder, *where, "add", "-A", "--", ".", env=env, timeout_s=GIT_CHECKOUT_TIMEOUT_S)
        tree = git_text(folder, *where, "write-tree", env=env)
    finally:
        index.unlink(missing_ok=True)
    if tree == git_text(folder, *where, "rev-parse", f"{parent}^{{tree}}"):
        return parent
    return git_text(folder, *where, "commit-tree", tree, "-p", parent, "-m", message, env=env)


def worktree_git(worktree: dict[str, Any]) -> list[str]:
    """The options that pin a git command to the job's own worktree: its administrative folder as recorded
    when it was made, so a `.git` file the job rewrote cannot point the bridge at another repository."""
    return [f"--git-dir={worktree['admin']}", f"--work-tree={worktree['path']}"]


def add_worktree(store: "JobStore", job_id: str, worktree: dict[str, Any]) -> list[str]:
    """Make the job's worktree (recorded in worktree: repo, path, branch, base; admin is set here): on a new
    branch at base, or from its branch when a resume finds it removed; locked with the job's id as the reason.
    A failed add leaves no branch behind. Returns notes for the log (submodules)."""
    top, path, branch = worktree["repo"], worktree["path"], worktree["branch"]
    reason = f"claude-hermes-bridge job {job_id}"
    fresh = "admin" not in worktree  # else a resumed job's worktree, made again from its branch
    notes = []
    with repo_lock(store, top):
        def branch_exists() -> bool:
            return git(top, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", check=False).returncode == 0
        existed = branch_exists()
        if fresh and existed:
            raise GitFailed(f"the repository already has a branch {branch} (another bridge's job of the same id?)")
        if fresh and worktree.get("from") == "working-tree":
            worktree["base"] = tree_commit(top, worktree["head"], store.locks / f"{job_id}.index",
                                           f"claude-hermes-bridge: the working tree as job {job_id} started")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        try:
            where = ["-b", branch, path, worktree["base"]] if fresh else [path, branch]
            git(top, "worktree", "add", "--lock", "--reason", reason, *where, timeout_s=GIT_CHECKOUT_TIMEOUT_S)
        except GitFailed:
            if not existed and branch_exists():  # git makes the branch first, and leaves it when the add fails
                git(top, "branch", "-D", branch, check=False)
            raise
        worktree["admin"] = os.path.realpath(os.path.join(path, git_text(path, "rev-parse", "--git-dir")))
    if worktree.get("submodules") == "present":
        try:
            git(path, "submodule", "update", "--init", "--recursive", timeout_s=GIT_CHECKOUT_TIMEOUT_S)
            worktree["submodules"] = "initialised"
        except GitFailed as exc:
            worktree["submodules"] = f"not initialised ({exc}): empty in the worktree"
        notes.append(f"submodules {worktree['submodules']}")
    return notes


def save_worktree_work(store: "JobStore", record: "JobRecord") -> None:
    """The job's work as one commit (its own commits, plus what it left uncommitted), kept reachable under
    refs/hermes-bridge/<id>, with the patch against the base beside the record and its stat and file list in
    the record. Called when the job ends, and for a job whose supervisor died, at the next server start."""
    worktree = cast(dict[str, Any], record.worktree)
    path, top = worktree["path"], worktree["repo"]
    if not os.path.isdir(path) or "admin" not in worktree:
        return
    pinned = worktree_git(worktree)
    head = git_text(path, *pinned, "rev-parse", "--verify", "HEAD^{commit}")
    work = tree_commit(path, head, store.locks / f"{record.id}.index",
                       f"claude-hermes-bridge: the work of job {record.id} (committed and not)", pinned)
    git(top, "update-ref", f"{WORKTREE_REF_PREFIX}{record.id}", work)
    base = worktree["base"]
    patch = store.patch_path(record.id)
    partial = patch.with_name(patch.name + ".partial")
    partial.unlink(missing_ok=True)
    with open(partial, "xb") as handle:
        git(top, "diff", "--binary", "--no-color", "--no-ext-diff", base, work, stdout=handle)
    os.replace(partial, patch)
    files = insertions = deletions = 0
    for line in git(top, "diff", "--numstat", "-z", "--no-renames", base, work).stdout.split(b"\0"):
        fields = line.split(b"\t", 2)
        if len(fields) == 3:
            files += 1
            insertions += int(fields[0]) if fields[0].isdigit() else 0
            deletions += int(fields[1]) if fields[1].isdigit() else 0
    worktree["work"] = work
    record.diff = {"files": files, "insertions": insertions, "deletions": deletions, "patch": str(patch),
                   "patch_bytes": patch.stat().st_size}
    record.changes = worktree_changes(top, base, work)


def worktree_changes(top: str, base: str, work: str) -> dict[str, Any]:
    """CHANGED_FILES of a worktree job: what its work changed against the base, as git sees it."""
    names = git(top, "diff", "--name-status", "-z", "--no-renames", base, work).stdout.decode("utf-8", "replace")
    fields = names.split("\0")
    pairs = list(zip(fields[0::2], fields[1::2], strict=False))  # the list ends with an empty field
    kinds = {"A": "+", "M": "~", "T": "~", "D": "-"}
    marked = [(kinds.get(status[:1], "~"), name) for status, name in pairs if status]
    lines = [f"{mark} {name}" for order in "+~-" for mark, name in marked if mark == order]  # as compare_snapshots
    count = {mark: sum(1 for found, _ in marked if found == mark) for mark in "+~-"}
    return {"created": count["+"], "modified": count["~"], "deleted": count["-"], "lines": lines[:CHANGED_LINES],
            "more": max(0, len(lines) - CHANGED_LINES)}


def remove_worktree(store: "JobStore", worktree: dict[str, Any], branch_too: bool, job_id: str) -> None:
    """The worktree gone (locked or not, with what it held: its work is kept under the job's ref and in the
    patch); with branch_too, its branch and the job's ref as well."""
    top = worktree["repo"]
    with repo_lock(store, top):
        if os.path.isdir(worktree["path"]):
            git(top, "worktree", "remove", "--force", "--force", worktree["path"], timeout_s=GIT_CHECKOUT_TIMEOUT_S)
        git(top, "worktree", "prune", check=False)
        if branch_too:
            git(top, "branch", "-D", worktree["branch"], check=False)
            git(top, "update-ref", "-d", f"{WORKTREE_REF_PREFIX}{job_id}", check=False)


# ------------------------------------------------------------------------------------------ Hermes CLI [both]
# Linux caps one argument at 128 KiB (MAX_ARG_STRLEN counts the terminating NUL); macOS caps the whole
# argv and environment at 1 MiB, which an argument within this limit leaves room for.
POSIX_ARGUMENT_LIMIT = 131072 - 1
QUERY_OPTION = "--query="
SESSION_ID_RE = re.compile(r"^session_id:\s*(\S+)\s*$", re.MULTILINE)
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}")
# What each hermes_cli_form override declares; "auto" asks the installed Hermes (`hermes chat --help`).
FORM_FLAGS = {
    "query-arg": frozenset({"--query", "--quiet", "--resume", "--max-turns", "--skills", "--toolsets", "--yolo"}),
    "query-file": frozenset({"--query", "--quiet", "--resume", "--max-turns", "--skills", "--toolsets", "--yolo",
                             "--query-file", "--in", "--oneshot"}),
}
LONG_FLAG_RE = re.compile(rb"(?<![\w-])--[a-z][a-z0-9-]*")


@dataclasses.dataclass(frozen=True)
class HermesExe:
    """The Hermes executable the bridge would start, where that choice came from, and why it cannot be
    started (None when it can)."""

    path: str | None
    source: str
    problem: str | None = None

    @property
    def usable(self) -> str | None:
        return self.path if self.problem is None else None


def locate_hermes(cfg: Config) -> HermesExe:
    """hermes_exe (command line or config file), else `hermes` on PATH; each problem named with the path
    and where it came from, so "not found" never hides which file is wrong and how."""
    if cfg.hermes_exe_path:
        source = ("--hermes-exe on the command line" if cfg.sources.get("hermes_exe") == "command line"
                  else f"hermes_exe in {cfg.path}")
        path = cfg.hermes_exe_path
    else:
        import shutil  # only here: shutil loads three compressors, which a supervisor given hermes_exe never needs

        found = shutil.which("hermes")
        if not found:
            return HermesExe(None, "PATH", "no `hermes` on the server's PATH: install Hermes (see README, Hermes "
                             "first), or set hermes_exe to its absolute path")
        path, source = found, "PATH"
    problem = hermes_file_problem(path) or executable_problem(path)
    return HermesExe(path, source, f"{shown(path)} (from {source}) {problem}" if problem else None)


def hermes_file_problem(path: str) -> str | None:
    """What is wrong with this file as a program to start, in words: missing, a folder, not executable, or a
    script whose interpreter (its #! line) is gone, as when the venv it was installed in was moved."""
    if not os.path.exists(path):
        return "does not exist"
    if os.path.isdir(path):
        return "is a folder, not the hermes program (point at the executable inside it, e.g. bin/hermes)"
    if not IS_WINDOWS and not os.access(path, os.X_OK):
        return "is not executable (no execute permission): chmod +x it, or point at the real hermes"
    try:
        with open_regular(path, follow=True) as handle:
            head = handle.read(4096)
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    if IS_WINDOWS or not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
    if not words:
        return "has an empty #! line"
    if os.path.basename(words[0]) == "env" and len(words) > 1:
        import shutil

        if shutil.which(words[1]):
            return None
        return f"names `{shown(words[1], 200)}` in its #! line, which is not on PATH"
    interpreter = words[0]
    if not os.path.exists(interpreter):
        return (f"is a script whose interpreter {shown(interpreter, 300)} (its #! line) does not exist: the "
                "environment Hermes was installed in was moved or removed; reinstall Hermes")
    return None


def hermes_version_on_disk(exe: str) -> str | None:
    """Hermes' version from the dist-info beside its install, for display only: the command line is decided
    by the flags Hermes declares, never by its version (no 0.20.x has --query-file, though 0.20 has --in)."""
    prefix = Path(os.path.realpath(exe)).parent.parent
    site = "Lib/site-packages" if IS_WINDOWS else "lib/python*/site-packages"
    pattern = f"{site}/hermes_agent*.dist-info"
    for dist_info in sorted(prefix.glob(pattern)):
        match = re.fullmatch(r"hermes_agent(?:_\w+)?-(.+)\.dist-info", dist_info.name)
        if match:
            return match.group(1)
    return None


def flags_cache_path(cfg: Config) -> Path:
    return cfg.jobs_path / "cli_flags_cache.json"


def exe_fingerprint(exe: str) -> str:
    """Path, mtime and size: an upgraded Hermes at the same path is probed again."""
    real = os.path.realpath(exe)
    try:
        info = os.stat(real)
        return f"{real}|{info.st_mtime_ns}|{info.st_size}"
    except OSError:
        return real


@dataclasses.dataclass(frozen=True)
class HermesCli:
    """The options the installed Hermes declares, and where that knowledge came from."""

    flags: frozenset[str]
    source: str

    @property
    def task_on_stdin(self) -> bool:
        return "--query-file" in self.flags

    def describe(self) -> str:
        used = [flag for flag in ("--query-file", "--in", "--oneshot") if flag in self.flags]
        return f"{', '.join(used) or 'only the basic options (task as --query)'} ({self.source})"


def known_cli(cfg: Config, exe: str | None) -> HermesCli | None:
    """The command line's options without starting a process: the config override or an earlier probe."""
    if cfg.hermes_cli_form != "auto":
        return HermesCli(FORM_FLAGS[cfg.hermes_cli_form], f"hermes_cli_form {cfg.hermes_cli_form} set in config")
    if not exe:
        return None
    cache = read_json(flags_cache_path(cfg))
    flags = cache.get(exe_fingerprint(exe)) if isinstance(cache, dict) else None
    if isinstance(flags, list) and all(isinstance(flag, str) for flag in flags):
        return HermesCli(frozenset(flags), "declared by `hermes chat --help`, probed once and cached")
    return None


def probe_cli(cfg: Config, exe: str) -> HermesCli:
    """Ask `hermes chat --help` once per executable (about 0.5 s) and cache the options it declares."""
    result = subprocess.run([exe, "chat", "--help"], stdin=subprocess.DEVNULL, capture_output=True,
                            timeout=60, env=hermes_env(cfg))
    flags = sorted({flag.decode() for flag in LONG_FLAG_RE.findall(result.stdout + result.stderr)})
    path = flags_cache_path(cfg)
    cache = read_json(path)
    cache = cache if isinstance(cache, dict) else {}
    cache[exe_fingerprint(exe)] = flags
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(cache, indent=1).encode())
    except OSError:
        pass  # asked again next time; the answer is still right for this job
    return HermesCli(frozenset(flags), "declared by `hermes chat --help`, probed just now")


UNKNOWN_OPTION_RE = re.compile(rb"unrecognized arguments|no such option|unknown option")
USAGE_ERROR_RE = re.compile(rb"(?m)^usage: |invalid choice|" + UNKNOWN_OPTION_RE.pattern)


def forget_probe(cfg: Config, exe: str, what: str = "") -> None:
    """Drop this executable's cached options (or, with `what="|acp"`, its cached ACP answer), so the next
    launch probes again: a cache rewritten by a job, or an extra removed since, then costs one job, not every
    later one."""
    path = flags_cache_path(cfg)
    cache = read_json(path)
    if isinstance(cache, dict) and cache.pop(exe_fingerprint(exe) + what, None) is not None:
        with contextlib.suppress(OSError):
            write_atomic(path, json.dumps(cache, indent=1).encode())


WINDOWS_COMMAND_LINE_LIMIT = 32_767 - 1_024  # CreateProcess' limit, with a margin


def argv_problem(argv: list[str], windows: bool = IS_WINDOWS) -> str | None:
    """Why this command line cannot be started, or None. Linux caps each argument at 128 KiB; Windows caps
    the whole command line, counted after quoting (list2cmdline doubles backslashes and escapes quotes)."""
    if windows:
        length = len(subprocess.list2cmdline(argv))
        if length <= WINDOWS_COMMAND_LINE_LIMIT:
            return None
        size = f"the command line would be {length} characters once quoted; Windows allows {WINDOWS_COMMAND_LINE_LIMIT}"
    else:
        longest = max(len(arg.encode("utf-8", "surrogateescape")) for arg in argv)
        if longest <= POSIX_ARGUMENT_LIMIT:
            return None
        size = f"one argument would be {longest} bytes; this system allows {POSIX_ARGUMENT_LIMIT}"
    return (f"{size}. This Hermes takes the task on its command line: shorten it, or write the details to a "
            "file under cwd and tell Hermes to read it")


def executable_problem(exe: str, windows: bool = IS_WINDOWS) -> str | None:
    """Why this Hermes executable must not be started, or None. On Windows a .cmd or .bat runs through
    cmd.exe, which parses the task ('&calc&'): never through a shell."""
    if windows and os.path.splitext(exe)[1].lower() in (".cmd", ".bat"):
        return (f"Hermes resolves to a batch file ({exe}), which Windows runs through cmd.exe, where the task "
                "would be parsed as commands. Set hermes_exe to the real executable (hermes.exe in Hermes' "
                "venv Scripts folder)")
    return None


def hermes_env(cfg: Config, marker: str | None = None) -> dict[str, str]:
    """Hermes inherits the server's environment; a job's processes also carry its marker, part of the proof
    that lets the bridge signal them (see Ownership)."""
    env = {key: value for key, value in os.environ.items() if key not in (SETTINGS_ENV, "HERMES_KANBAN_TASK")}
    if cfg.approval_mode != "yolo":  # HERMES_KANBAN_TASK above: it gives Hermes' exit codes other meanings
        env.pop("HERMES_YOLO_MODE", None)  # an approval bypass the user did not choose for the bridge
    if cfg.hermes_home:
        env["HERMES_HOME"] = str(cfg.hermes_home_path)
    if marker:
        env[JOB_MARKER] = marker
    return env


def hermes_command(cli: HermesCli, exe: str, record: JobRecord, task: str, cfg: Config) -> list[str]:
    """The argv for one job, from the options this Hermes declares. Every value is joined to its option
    with '=' so a task or id that starts with '-' can never be read as an option; no shell is involved."""
    argv = [exe, "chat"]
    argv += ["--query-file", "-"] if cli.task_on_stdin else [QUERY_OPTION + task]
    argv.append("-Q")
    if "--oneshot" in cli.flags:
        argv.append("--oneshot")
    if "--in" in cli.flags:
        argv.append(f"--in={record.cwd}")
    if record.max_turns:
        argv.append(f"--max-turns={record.max_turns}")
    if record.session_requested:
        argv.append(f"--resume={record.session_requested}")
    if record.skills:
        argv.append("--skills=" + ",".join(record.skills))
    if record.toolsets:
        argv.append("--toolsets=" + ",".join(record.toolsets))
    if cfg.approval_mode == "yolo":
        argv.append("--yolo")
    return argv + list(cfg.extra_args)


def command_preview(cli: HermesCli, exe: str, cfg: Config) -> str:
    """The command line a job would use, task and folder elided, for hermes_health and --check."""
    example = JobRecord(id="<id>", state=JobState.STARTING, cwd="<cwd>", max_turns=cfg.default_max_turns)
    argv = hermes_command(cli, exe, example, "<task>", cfg)
    return " ".join(argv) + (" (stdin: <task>)" if cli.task_on_stdin else "")


def read_tail(path: Path, max_bytes: int) -> tuple[bytes, int]:
    """The last max_bytes of a regular file by seek, and its size: a log's size never costs memory.
    A symlink, FIFO or device reads as empty."""
    try:
        with open_regular(path) as handle:
            size = os.fstat(handle.fileno()).st_size
            handle.seek(max(0, size - max_bytes))
            return handle.read(max_bytes), size
    except OSError:
        return b"", 0


def session_id_from_log(path: Path) -> str | None:
    """The last `session_id:` line Hermes printed (a compressed session continues under a new id)."""
    tail, _ = read_tail(path, 65536)
    found = [sid for sid in SESSION_ID_RE.findall(tail.decode("utf-8", "replace")) if SESSION_NAME_RE.fullmatch(sid)]
    return found[-1] if found else None


def ends_with_session_line(path: Path) -> bool:
    """Whether the log's last line is a `session_id:` line: a CLI turn prints it last, once the turn is saved."""
    tail, _ = read_tail(path, 4096)
    lines = tail.decode("utf-8", "replace").rstrip().splitlines()
    return bool(lines) and SESSION_ID_RE.fullmatch(lines[-1]) is not None


# Signals a process gets from its own fault, not from another process; and Windows' NTSTATUS codes of a crash
# (0xC0000005 access violation, 0xC0000409 fail-fast, ...) as the exit code of the process that had it.
CRASH_SIGNALS = frozenset({"SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT", "SIGSYS", "SIGTRAP"})
WINDOWS_CRASH_CODES = range(0xC0000000, 0x1_0000_0000)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def crash_name(code: int) -> str | None:
    """The fault an exit code shows ("SIGSEGV, 11", "Windows status 0xC0000005"), or None for any other end."""
    if code < 0:
        return f"{signal_name(-code)}, {-code}" if signal_name(-code) in CRASH_SIGNALS else None
    return f"Windows status 0x{code:08X}" if code in WINDOWS_CRASH_CODES else None


def describe_exit(code: int, turn_saved: bool = False, usage_error: bool = False) -> str:
    """Hermes' failing exit code in words. A crash (a fault in Hermes or its Python) is told from a kill,
    and a crash after Hermes printed its session id, the last thing a CLI turn prints once the turn is saved
    (seen here: Hermes 0.22.2 segfaults on its way out in about one resume of 40), from one during the turn."""
    crash = crash_name(code)
    if crash and turn_saved:
        return (f"Hermes crashed ({crash}) on its way out, after its turn had ended and been saved (its session id "
                "was the last line it printed): the answer is the one it gave and the work is whatever the turn "
                "did. Check the files with hermes_read rather than running the task again")
    if crash:
        return (f"Hermes crashed ({crash}) before its turn was known to have ended: work may be part-done; "
                "inspect the files with hermes_read before re-running")
    if code < 0:
        return f"Hermes was killed by {signal_name(-code)} ({-code}) from outside the bridge"
    if code == 2 and usage_error:
        return ("Hermes exited 2: it rejected its command line (see the output); hermes_health shows the options "
                "this Hermes declared and the command line the bridge built from them")
    if code == 130:
        return "Hermes exited 130: interrupted"
    return f"Hermes exited with code {code}"


RATE_LIMITED_RE = re.compile(rb"(?i)\b429\b|rate.?limit|too many requests")
UNREACHABLE_RE = re.compile(rb"(?i)connection error|connection refused|could not connect|failed to connect|"
                            rb"name or service not known|timed out connecting")


def model_trouble(log_tail: bytes) -> str | None:
    """What the end of a failed job's log says about Hermes' model endpoint, in words a planner can act on."""
    if RATE_LIMITED_RE.search(log_tail):
        return "the model endpoint rate-limited Hermes (HTTP 429 in the log)"
    if UNREACHABLE_RE.search(log_tail):
        return "Hermes could not reach its model endpoint (connection errors in the log)"
    return None


def retry_advice(state: "JobState", reason: str) -> str | None:
    """Whether running the task again as it is can help, for the final block's RETRY line."""
    if state is JobState.OVER_BUDGET:
        return "no: raise the cap the REASON names (max_tokens, max_cost_usd, max_turns) or split the task"
    if state is JobState.TIMEOUT:
        return "no: raise timeout_s or split the task; inspect the files first"
    if state is JobState.CANCELLED:
        return "only if you still want it done: inspect the files first"
    if state is JobState.ORPHANED:
        return "not yet: stop what is left (hermes_cancel) and inspect the files first"
    if state is not JobState.ERROR:
        return None
    if "rate-limited" in reason:
        return "yes, after a pause"
    if "could not reach its model" in reason:
        return "no: fix Hermes' model settings (`hermes chat -q hi` must work by hand)"
    if "rejected its command line" in reason or "Nothing was run" in reason or "Hermes cannot be started" in reason:
        return "no: fix what the REASON names (hermes_health shows the setup)"
    if "crashed" in reason or "interrupted" in reason:
        return "yes, once the files are checked (the turn may be part-done)"
    return "maybe: read the log (FULL_LOG) for why Hermes failed"


# Hermes 0.19-0.20 print these when a resumed session moves to its recorded folder (cli.py, hermes_cli/main.py).
MOVE_ANNOUNCEMENT_BYTES = 16384
FOLDER_MOVE_RE = re.compile(r"^(?:↻ Working directory|↪ restored workspace dir): (.+?)\s*$", re.MULTILINE)


# -------------------------------------------------------------------------------- Hermes session store [both]
# Hermes' own SQLite store (state.db in HERMES_HOME), read-only, with a deadline, every value checked: a job can
# write it. It gives the activity lines, usage, the current tool, Hermes' answer and where a session ran.
class StoreUnavailable(Exception):
    """Hermes' session store could not answer: missing, locked, another schema, or no such session."""


def session_store_path(cfg: Config) -> Path:
    return cfg.hermes_home_path / "state.db"


STORE_DEADLINE_S = 3.0
STORE_FILE_SUFFIXES = ("", "-journal", "-wal", "-shm")  # the database and the side files SQLite opens
STORE_READS_IN_FLIGHT: dict[str, threading.Thread] = {}


def check_store_files(path: Path) -> None:
    """The database and every side file that exists must be a regular file: SQLite opens them blocking,
    so a FIFO planted as state.db-journal would hang the read for ever."""
    for suffix in STORE_FILE_SUFFIXES:
        side = Path(f"{path}{suffix}")
        try:
            info = os.stat(side) if not suffix else os.lstat(side)
        except FileNotFoundError:
            if not suffix:
                raise StoreUnavailable(f"no session store at {path}") from None
            continue
        except OSError as exc:
            raise StoreUnavailable(f"cannot look at {side}: {exc.strerror or exc}") from None
        if not stat.S_ISREG(info.st_mode):
            raise StoreUnavailable(f"{side} is not a regular file")


def store_fingerprint(path: Path) -> tuple[tuple[int, int] | None, ...]:
    """The size and change time of the store and its write-ahead log: Hermes' every write changes one of them,
    so a reader that polls may skip a read while they stay the same."""
    def one(side: Path) -> tuple[int, int] | None:
        try:
            info = os.stat(side)
        except OSError:
            return None
        return info.st_size, info.st_mtime_ns
    return one(path), one(Path(f"{path}-wal"))


def read_store(cfg: Config, query: Callable[[Any], T], deadline_s: float = STORE_DEADLINE_S) -> T:
    """query(connection) on Hermes' SQLite store, read-only, answered within deadline_s or not at all.

    One short-lived connection with a short busy timeout, so Hermes writing (WAL, short BEGIN IMMEDIATE
    transactions) never blocks us for long, nor we it. The query runs in a thread the caller does not wait
    past: a store that never answers (a side file swapped for a FIFO after the check, a lock held for ever)
    costs one abandoned thread, and while it hangs later reads of that store fail at once instead of piling
    up. Every failure, and every row that is not what Hermes writes, becomes StoreUnavailable."""
    import sqlite3

    path = session_store_path(cfg)
    key = str(path.absolute())
    stuck = STORE_READS_IN_FLIGHT.get(key)
    if stuck is not None and stuck.is_alive():
        raise StoreUnavailable(f"an earlier read of the session store {path} has not returned (a file beside it "
                               "may be a FIFO, or held by a lock)")
    check_store_files(path)
    found: dict[str, Any] = {}

    def work() -> None:
        try:
            connection = sqlite3.connect(path.absolute().as_uri() + "?mode=ro", uri=True, timeout=1,
                                         check_same_thread=False)
            try:
                found["value"] = query(connection)
            finally:
                connection.close()
        except sqlite3.Error as exc:
            found["error"] = StoreUnavailable(f"the session store {path} cannot answer: {exc}")
        except StoreUnavailable as exc:
            found["error"] = exc
        except (ValueError, TypeError, OverflowError, RecursionError, MemoryError) as exc:
            found["error"] = StoreUnavailable(f"a row of the session store {path} is not what Hermes writes "
                                               f"({type(exc).__name__})")

    thread = threading.Thread(target=work, name="session-store", daemon=True)
    STORE_READS_IN_FLIGHT[key] = thread
    thread.start()
    thread.join(deadline_s)
    if thread.is_alive():
        raise StoreUnavailable(f"the session store {path} did not answer within {deadline_s:g} s (a file beside it "
                               "may be a FIFO, or held by a lock)")
    if "error" in found:
        raise found["error"]
    return cast(T, found["value"])


def session_folder(cfg: Config, session_id: str) -> str:
    """The folder Hermes recorded for a session: where a resume of it runs, whatever we ask. A relative
    folder would be resolved against the server's own folder, so it is refused like a missing one."""
    rows = read_store(cfg, lambda db: db.execute("SELECT cwd FROM sessions WHERE id = ? LIMIT 2",
                                                 (session_id,)).fetchall())
    if not rows:
        raise StoreUnavailable(f"the session store holds no session {session_id}")
    folder = rows[0][0]
    if not isinstance(folder, str) or not folder.strip() or len(folder) > 4096 or "\x00" in folder:
        raise StoreUnavailable(f"the session store records no usable folder for session {session_id}")
    if not os.path.isabs(folder):
        raise StoreUnavailable(f"the session store records a relative folder ({shown(folder)}) for session "
                               f"{session_id}")
    return folder


def session_started_in(cfg: Config, folder: str, since: float) -> tuple[str | None, str]:
    """The one session recorded in `folder` that started at or after `since`, for a Hermes that prints no
    session line; with none or several, None and why."""
    try:
        return read_store(cfg, lambda db: matched_session(db, folder, since))
    except StoreUnavailable as exc:
        return None, str(exc)


def matched_session(db: Any, folder: str, since: float) -> tuple[str | None, str]:
    rows = db.execute("SELECT id, cwd FROM sessions WHERE started_at >= ? ORDER BY started_at", (since - 1,)).fetchall()
    ids = [sid for sid, cwd in rows if isinstance(cwd, str) and same_folder(cwd, folder)
           and isinstance(sid, str) and SESSION_NAME_RE.fullmatch(sid)]
    if len(ids) == 1:
        return ids[0], "found in the session store"
    return None, (f"{len(ids)} sessions in the store started in {folder} during the job" if ids
                  else f"no session in the store started in {folder} during the job")


def same_folder(a: str, b: str) -> bool:
    return case_normalised(os.path.realpath(a)) == case_normalised(os.path.realpath(b))


TOOL_ARGUMENT_CHARS = 160


@dataclasses.dataclass
class Usage:
    """A session's counters as Hermes keeps them (written after every API call)."""

    api_calls: int
    tool_calls: int
    tokens_in: int
    tokens_out: int

    def line(self) -> str:
        return (f"{plural(self.api_calls, 'API call')}, {plural(self.tool_calls, 'tool call')}, "
                f"tokens in {self.tokens_in:,} / out {self.tokens_out:,}")


COUNTER_LIMIT = 1 << 53
JSON_CELL_MAX_CHARS = 65536
JSON_CELL_MAX_DEPTH = 16
ANSWER_MAX_CHARS = 1 << 20
JSON_STRING_RE = re.compile(r'"(?:[^"\\]|\\.)*"')


def store_counter(value: Any) -> int:
    """A counter of the store: a whole number in range (None, as Hermes leaves an unset one, is 0)."""
    if value is None:
        return 0
    if not is_whole_number(value) or not 0 <= value < COUNTER_LIMIT:
        raise StoreUnavailable(f"a counter of the session store is not a count ({shown(value, 40)})")
    return cast(int, value)


def store_time(value: Any) -> float:
    """A timestamp of the store: a finite number of seconds (SQLite keeps 1e999 as infinity)."""
    if not is_number(value) or not 0 <= value < 1e11:
        raise StoreUnavailable(f"a timestamp of the session store is not a time ({shown(value, 40)})")
    return float(value)


def json_cell(raw: Any) -> Any:
    """A JSON cell of the store, parsed only once its size and nesting are known to be sane (a value nested
    50,000 deep would exhaust the parser's recursion); None when it is not such a cell."""
    if not isinstance(raw, str) or len(raw) > JSON_CELL_MAX_CHARS:
        return None
    depth = deepest = 0
    for bracket in re.findall(r"[\[\]{}]", JSON_STRING_RE.sub("", raw)):
        depth += 1 if bracket in "[{" else -1
        deepest = max(deepest, depth)
    if deepest > JSON_CELL_MAX_DEPTH:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None


def session_usage(db: Any, session_id: str) -> Usage | None:
    row = db.execute("SELECT api_call_count, tool_call_count, input_tokens, output_tokens FROM sessions "
                     "WHERE id = ?", (session_id,)).fetchone()
    return Usage(*(store_counter(value) for value in row)) if row else None


def session_spend(db: Any, session_id: str) -> dict[str, Any] | None:
    """What a session and the child sessions it started have spent, as Hermes counts it after every API call:
    API calls, tokens in and out, its cost estimate, and whether it could price every call (cost_status
    'unknown' is no price, not a zero cost). Where Hermes keeps session_model_usage (0.22), a session's rows
    there count, for they hold its side calls too (title generation, compression) that its sessions row
    leaves out; elsewhere its sessions row. Columns a Hermes does not have count as absent."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(sessions)")}
    ids = [session_id]
    if "parent_session_id" in columns:
        ids += [row[0] for row in db.execute("SELECT id FROM sessions WHERE parent_session_id = ? LIMIT 100",
                                             (session_id,)) if isinstance(row[0], str)]
    marks = ",".join("?" * len(ids))
    cost = "estimated_cost_usd, cost_status" if {"estimated_cost_usd", "cost_status"} <= columns else "NULL, NULL"
    rows = db.execute(f"SELECT id, api_call_count, input_tokens, output_tokens, {cost}, model FROM sessions WHERE id "
                      f"IN ({marks})", ids).fetchall()
    if not rows:
        return None
    by_model: list[tuple[Any, ...]] = []
    if db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'session_model_usage'").fetchone():
        by_model = db.execute("SELECT session_id, api_call_count, input_tokens, output_tokens, estimated_cost_usd, "
                              f"cost_status, model FROM session_model_usage WHERE session_id IN ({marks}) LIMIT 10000",
                              ids).fetchall()
    itemised = {row[0] for row in by_model}
    spend: dict[str, Any] = {"api_calls": 0, "tokens_in": 0, "tokens_out": 0, "cost_usd": 0.0, "priced": 1}
    # a side call's row has no cost_status (0.22 writes none), only an estimate: unpriced is 'unknown' there
    for (_, calls, tokens_in, tokens_out, cost_usd, status, model), unpriced in [
            *((row, ("unknown",)) for row in by_model),
            *((row, (None, "unknown")) for row in rows if row[0] not in itemised)]:
        spend["api_calls"] += store_counter(calls)
        spend["tokens_in"] += store_counter(tokens_in)
        spend["tokens_out"] += store_counter(tokens_out)
        if is_number(cost_usd) and status not in unpriced:
            spend["cost_usd"] += float(cost_usd)
        elif store_counter(calls):
            spend["priced"] = 0
        if isinstance(model, str) and "model" not in spend:
            spend["model"] = model[:100]
    return spend


def call_parts(call: Any) -> tuple[str, Any]:
    """One tool call of a tool_calls cell: the tool's name ("tool" when it has none) and its parsed arguments."""
    function = call.get("function") if isinstance(call, dict) else None
    function = function if isinstance(function, dict) else {}
    name = function.get("name")
    arguments = function.get("arguments")
    return name if isinstance(name, str) else "tool", json_cell(arguments) if isinstance(arguments, str) else arguments


def describe_tool_call(raw: Any) -> str | None:
    """'terminal: <command>' (or the tool's name and the start of its arguments) from a tool_calls cell."""
    calls = json_cell(raw)
    if not isinstance(calls, list) or not calls or not isinstance(calls[-1], dict):
        return None
    name, parsed = call_parts(calls[-1])
    shown_args = parsed.get("command") if isinstance(parsed, dict) and isinstance(parsed.get("command"), str) else (
        json.dumps(parsed, ensure_ascii=False)[:TOOL_ARGUMENT_CHARS * 2] if parsed is not None else "")
    shown_args = " ".join(str(shown_args).split())
    if len(shown_args) > TOOL_ARGUMENT_CHARS:
        shown_args = shown_args[:TOOL_ARGUMENT_CHARS] + "..."
    return f"{shown(name, 60)}: {shown_args}"


def current_tool(db: Any, session_id: str, since: float, now: float) -> str | None:
    """The last tool call of the session and whether its result has arrived. Hermes saves the assistant
    row holding a call before the tool runs, and the tool's row right after it ends."""
    row = db.execute("SELECT tool_calls, timestamp FROM messages WHERE session_id = ? AND timestamp >= ? AND "
                     "tool_calls IS NOT NULL AND tool_calls != '' AND tool_calls != '[]' ORDER BY timestamp DESC, "
                     "id DESC LIMIT 1", (session_id, since)).fetchone()
    if not row:
        return None
    called_at = store_time(row[1])
    calls = json_cell(row[0])
    if not isinstance(calls, list):
        raise StoreUnavailable("the last tool call in the session store is not a JSON list of a sane size and depth")
    described = describe_tool_call(row[0])
    if not described:
        return None
    call_ids = [call.get("id") for call in calls if isinstance(call, dict) and isinstance(call.get("id"), str)][:100]
    answered = db.execute(f"SELECT COUNT(*) FROM messages WHERE session_id = ? AND timestamp >= ? AND role = 'tool' "
                          f"AND tool_call_id IN ({','.join('?' * len(call_ids)) or 'NULL'})",
                          (session_id, called_at, *call_ids)).fetchone()[0]
    if call_ids and store_counter(answered) >= len(call_ids):
        return f"{described} (finished)"
    return f"{described} (running {max(0, int(now - called_at))} s)"


def final_answer(db: Any, session_id: str, since: float) -> str | None:
    """Hermes' own last reply in this job: the last assistant message with text written since the job
    started (stdout also holds diff previews, and the log holds warnings)."""
    row = db.execute("SELECT substr(content, 1, ?) FROM messages WHERE session_id = ? AND timestamp >= ? AND "
                     "role = 'assistant' AND content IS NOT NULL AND content != '' ORDER BY timestamp DESC, id DESC "
                     "LIMIT 1", (ANSWER_MAX_CHARS, session_id, since)).fetchone()
    return row[0] if row and isinstance(row[0], str) else None


BLOCKED_RESULTS_KEPT = 100


def blocked_commands(db: Any, session_id: str, since: float) -> list[str]:
    """The commands Hermes refused to run in this job, read from its tool results (a `"status": "blocked"`
    result, written by 0.19 to 0.22), each with the command of the tool call it answers."""
    rows = db.execute("SELECT tool_call_id FROM messages WHERE session_id = ? AND timestamp >= ? AND role = 'tool' "
                      "AND content LIKE '%\"status\": \"blocked\"%' ORDER BY timestamp, id LIMIT ?",
                      (session_id, since, BLOCKED_RESULTS_KEPT)).fetchall()
    commands = []
    for (call_id,) in rows:
        if not isinstance(call_id, str):
            continue
        row = db.execute("SELECT tool_calls FROM messages WHERE session_id = ? AND role = 'assistant' AND "
                         "instr(tool_calls, ?) > 0 ORDER BY timestamp DESC LIMIT 1", (session_id, call_id)).fetchone()
        calls = json_cell(row[0]) if row else None
        call = next((c for c in calls if isinstance(c, dict) and c.get("id") == call_id), None) if isinstance(
            calls, list) else None
        arguments = call_parts(call)[1]
        command = arguments.get("command") if isinstance(arguments, dict) else None
        commands.append(command if isinstance(command, str) else "a command Hermes deemed dangerous")
    return commands


# ----------------------------------- Hermes ACP: can this Hermes speak it, and which driver a job gets [both]
# Hermes' Agent Client Protocol (`hermes acp`, JSON-RPC 2.0 over its stdin and stdout, with Hermes' `acp`
# extra): Hermes asks before a dangerous command or a file edit, reports its tools and its answer as events,
# and stops on session/cancel. The bridge is the client. Checked with Hermes 0.19.0 and 0.22.2.
ACP_SESSION_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
ACP_LINE_MAX = 8 << 20
ACP_CANCEL_GRACE_S = 3.0
ACP_EXIT_GRACE_S = 5.0
ACP_OUTPUT_CHARS = 2000
HERMES_019_APPROVAL_TIMEOUT_S = 60.0  # Hermes 0.19's ACP denies an unanswered question after a fixed 60 s
ACP_EXTRA_FIX = ("install Hermes' acp extra (pip install 'hermes-agent[acp]' in Hermes' environment; on 0.22: "
                 "hermes pm install --extra acp)")


ACP_RECHECK_S = 600  # a "no" is asked again after this: installing the extra does not touch the hermes script


def known_acp(cfg: Config, exe: str) -> bool | None:
    """Whether this Hermes can speak ACP, as an earlier probe found; None when it was never asked, or when a
    "no" is old enough that the extra may have been installed since."""
    cache = read_json(flags_cache_path(cfg))
    found = cache.get(exe_fingerprint(exe) + "|acp") if isinstance(cache, dict) else None
    if not (isinstance(found, dict) and isinstance(found.get("acp"), bool) and is_number(found.get("at"))):
        return None
    if not found["acp"] and time.time() - found["at"] > ACP_RECHECK_S:
        return None
    return cast(bool, found["acp"])


def acp_available(cfg: Config, exe: str) -> bool:
    """Whether this Hermes can speak ACP (`hermes acp --check` exits 0 only with its acp extra), asked once
    per executable and cached beside the CLI options."""
    known = known_acp(cfg, exe)
    if known is not None:
        return known
    key = exe_fingerprint(exe) + "|acp"
    path = flags_cache_path(cfg)
    cache = read_json(path)
    cache = cache if isinstance(cache, dict) else {}
    try:
        done = subprocess.run([exe, "acp", "--check"], stdin=subprocess.DEVNULL, capture_output=True, timeout=60,
                              env=hermes_env(cfg))
    except (OSError, subprocess.SubprocessError):
        return False  # not cached: asked again next time
    cache[key] = {"acp": done.returncode == 0, "at": time.time()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(cache, indent=1).encode())
    except OSError:
        pass
    return done.returncode == 0


def driver_line(cfg: Config, exe: str | None, probe: bool) -> str:
    """DRIVER for hermes_health (probe=False: never starts Hermes) and --check (probe=True)."""
    if exe is None:
        return "DRIVER: unknown: no usable Hermes"
    if cfg.hermes_driver == "cli":
        return f"DRIVER: cli (hermes_driver cli in {shown(str(cfg.path))})"
    if not probe and known_acp(cfg, exe) is None:
        return "DRIVER: not known yet: the first job asks `hermes acp --check` once and caches the answer"
    try:
        driver, why = choose_driver(cfg, exe)
    except Refused as exc:
        return f"DRIVER: NONE: {exc}"
    return f"DRIVER: {driver} ({why})"


def choose_driver(cfg: Config, exe: str, session: str | None = None) -> tuple[str, str]:
    """The driver a job runs with, and why. A resume keeps the driver its session was made with: ACP
    sessions are UUIDs, and CLI and ACP sessions do not mix (a CLI session loaded over ACP answers refusal)."""
    if session is not None and ACP_SESSION_RE.fullmatch(session):
        if not acp_available(cfg, exe):
            raise Refused(f"session {session} was made over ACP, and this Hermes cannot speak ACP now: "
                          f"{ACP_EXTRA_FIX}")
        return "acp", "the session was made over ACP"
    if session is not None:
        return "cli", "the session was made with the CLI"
    if cfg.hermes_driver == "cli":
        return "cli", f"hermes_driver cli in {cfg.path}"
    if acp_available(cfg, exe):
        return "acp", ("hermes_driver acp" if cfg.hermes_driver == "acp" else "auto") + ": `hermes acp --check` passed"
    if cfg.hermes_driver == "acp":
        raise Refused(f"hermes_driver is acp, but `hermes acp --check` fails for this Hermes: {ACP_EXTRA_FIX}")
    return "cli", f"auto: `hermes acp --check` fails (no acp extra); {ACP_EXTRA_FIX} to have Hermes' questions " \
                  "forwarded"


# ------------------------------------------------------------------ Hermes ACP: the conversation [supervisor]
def approval_policy_dir(timeout_s: int) -> Path:
    """A private folder for Hermes' managed scope (HERMES_MANAGED_DIR, whose config.yaml wins over the user's
    per key; read by the CLI and ACP of 0.19 to 0.22): approvals.mode manual, so Hermes asks before every
    dangerous command whatever the user's own mode (smart would let Hermes' auxiliary model approve by itself),
    approvals.timeout, how long it waits for the answer, and single_query_mode deny, so a user's `approve`
    there cannot let a one-shot CLI run what nobody was asked about. A managed scope already in force (IT
    policy) is kept: its config is merged under ours, its .env copied."""
    import shutil
    import tempfile

    import yaml

    folder = Path(tempfile.mkdtemp(prefix="hermes-bridge-policy-"))
    existing = os.environ.get("HERMES_MANAGED_DIR") or ("" if IS_WINDOWS else "/etc/hermes")
    policy: dict[str, Any] = {}
    if existing and os.path.isdir(existing):
        try:
            loaded = yaml.safe_load(read_capped(Path(existing) / "config.yaml", 1 << 20, follow=True))
            policy = loaded if isinstance(loaded, dict) else {}
        except (OSError, yaml.YAMLError):
            policy = {}
        if os.path.isfile(Path(existing) / ".env"):
            shutil.copyfile(Path(existing) / ".env", folder / ".env")
    approvals = policy.get("approvals")
    policy["approvals"] = {**(approvals if isinstance(approvals, dict) else {}), "mode": "manual",
                           "timeout": timeout_s, "single_query_mode": "deny"}
    (folder / "config.yaml").write_text(yaml.safe_dump(policy), encoding="utf-8")
    return folder


def content_text(content: Any) -> str:
    """The text of an ACP content list (or one content block), other kinds skipped."""
    blocks = content if isinstance(content, list) else [content]
    texts = []
    for block in blocks:
        if isinstance(block, dict):
            inner = block.get("content") if block.get("type") == "content" else block
            if isinstance(inner, dict) and isinstance(inner.get("text"), str):
                texts.append(inner["text"])
    return "\n".join(texts)


def described_command(tool_call: dict[str, Any]) -> str:
    """The whole command a tool call runs, for a person: rawInput.command (Hermes' own argument, every line
    of it), else everything from the first `$ ` line of its content (the line before is the description),
    else its title (0.22.2 can send an untranslated key there)."""
    raw = tool_call.get("rawInput")
    if isinstance(raw, dict) and isinstance(raw.get("command"), str):
        return str(raw["command"])
    lines = content_text(tool_call.get("content")).split("\n")
    for index, line in enumerate(lines):
        if line.startswith("$ "):
            return "\n".join([line[2:], *lines[index + 1:]]).strip()
    title = tool_call.get("title")
    return title if isinstance(title, str) else "a tool call"


V4A_FILE_RE = re.compile(r"^\*\*\*\s+(?:Update|Add|Delete)\s+File:\s*(.+)$", re.MULTILINE)
V4A_MOVE_RE = re.compile(r"^\*\*\*\s+Move\s+File:\s*(.+?)\s*->\s*(.+)$", re.MULTILINE)
# Tool kinds that cannot change Hermes' terminal folder; any other (execute, other) may have `cd`-ed it.
FOLDER_KEEPING_KINDS = frozenset({"read", "edit", "delete", "move", "search", "fetch", "think", "switch_mode"})


def edit_targets(tool_call: dict[str, Any]) -> list[str] | None:
    """Every path an edit Hermes asks about would write, as Hermes reads them from its own arguments
    (rawInput: the tool and its arguments; a V4A patch names each file on a line of its own, where the diff
    shown joins them with ", "). None when they cannot be told: such an edit is denied."""
    raw = tool_call.get("rawInput")
    arguments = raw.get("arguments") if isinstance(raw, dict) else None
    if not isinstance(arguments, dict):
        return None
    tool = raw.get("tool")  # type: ignore[union-attr]
    if tool == "patch" and arguments.get("mode", "replace") == "patch":
        body = arguments.get("patch")
        if not isinstance(body, str):
            return None
        paths = [path.strip() for path in V4A_FILE_RE.findall(body)]
        paths += [path.strip() for move in V4A_MOVE_RE.findall(body) for path in move]
        return [path for path in paths if path] or None
    if tool in ("write_file", "patch"):
        path = arguments.get("path")
        return [path] if isinstance(path, str) and path else None
    return None


def edit_decision(paths: list[str] | None, folder: str, folder_may_have_moved: bool,
                  roots: list[str]) -> tuple[str, str]:
    """allow or deny an edit, and why, deciding from where Hermes will really write: `~` expanded as Hermes
    expands it, a relative path resolved against the session's folder (Hermes resolves it against its
    terminal's current folder, so once a command may have moved that, a relative path cannot be decided),
    symlinks followed. The reason says "inside" only of paths checked to be."""
    if not paths:
        return "deny", "cannot tell which files the edit writes"
    inside = []
    for path in paths:
        expanded = os.path.expanduser(path) if "\x00" not in path else ""
        if not expanded:
            return "deny", f"{shown(path, 300)} is not a path"
        if not os.path.isabs(expanded):
            if folder_may_have_moved:
                return "deny", (f"{shown(path, 300)} is relative, and a command Hermes ran may have changed its "
                                "folder: where it lands cannot be decided")
            expanded = os.path.join(folder, expanded)
        real = os.path.realpath(expanded)
        if not within_any(real, roots):
            return "deny", f"{shown(path, 300)} resolves to {shown(real, 300)}, outside the allowed roots"
        inside.append(shown(real, 300))
    return "allow", f"inside the allowed roots: {', '.join(inside)}"


def nesting_depth(line: bytes, limit: int) -> int:
    """How deep a JSON line nests (strings skipped), counted up to limit: json.loads recurses per level, and a
    line nested 200,000 deep would raise RecursionError in the reader."""
    depth = deepest = 0
    in_string = escape = False
    for byte in line:
        if in_string:
            if escape:
                escape = False
            elif byte == 0x5C:
                escape = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in b"[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > limit:
                return deepest
        elif byte in b"]}":
            depth -= 1
    return deepest


ACP_MAX_DEPTH = 64
COMMAND_SHOWN_CHARS = 1000


class AcpConversation:
    """The bridge's side of one `hermes acp` process: the handshake, one prompt (on a new session, or on a
    loaded one for a resume), Hermes' events written to the job's log as a readable transcript and kept in
    its record as the job's activity, and Hermes' permission requests, decided by the bridge or relayed.

    Every message is untrusted data: one of the wrong shape is ignored and noted once in the log, never
    raised. The supervisor's loop drives it (pump); nothing here blocks: a reader thread turns Hermes'
    stdout into messages. Questions that need the user go into the record (questions, every one kept, each
    with its own id) and their answers come back through the job's answers file (claim_answer)."""

    def __init__(self, proc: subprocess.Popen[bytes], record: JobRecord, cfg: Config, store: JobStore, task: str,
                 log: Callable[[str], None], save: Callable[[], None] | None = None):
        import queue

        self.proc, self.record, self.cfg, self.store, self.task, self.log = proc, record, cfg, store, task, log
        self.save = save or functools.partial(write_record, store, record)
        self.inbox: "queue.Queue[dict[str, Any]]" = queue.Queue()
        self.next_id = 0
        self.step: tuple[int, str] = (0, "")  # the request of the handshake waiting for its reply: id, method
        self.session_id: str | None = None
        self.result: dict[str, Any] | None = None
        self.failure: str | None = None
        self.answer_chunks: list[str] = []
        self.asked: dict[str, tuple[Any, dict[Any, Any], str]] = {}  # approval id -> request id, options, command
        self.allowed_for_job: dict[str, tuple[float, str]] = {}  # command -> when and by whom it was allowed
        self.question_bytes: dict[str, int] = {}  # approval id -> its size in the record
        self.questions_asked = 0
        self.approval_timeout_s = cfg.approval_timeout_s
        self.folder_may_have_moved = False  # a command ran: Hermes' terminal folder may not be the job's now
        self.noted: set[str] = set()
        self.changed = False
        record.acp = {"tool_calls": 0}
        self.reader = threading.Thread(target=self._read, name="acp-reader", daemon=True)
        self.reader.start()
        self.steps = self._handshake()
        self._next_step(next(self.steps))

    def _handshake(self) -> Generator[tuple[str, dict[str, Any]], dict[str, Any], None]:
        """The conversation in order: initialize, then session/new (or session/load, for a resume), then one
        session/prompt. Each step yields one request; the reply to it is sent back in (see _reply)."""
        hermes = yield "initialize", {"protocolVersion": 1, "clientCapabilities": {
            "fs": {"readTextFile": False, "writeTextFile": False}, "terminal": False}}
        agent = hermes.get("agentInfo")
        version = agent.get("version") if isinstance(agent, dict) else None
        if isinstance(version, str) and version.startswith("0.19"):
            self.approval_timeout_s = HERMES_019_APPROVAL_TIMEOUT_S
        folder: dict[str, Any] = {"cwd": self.record.cwd, "mcpServers": []}
        if self.record.session_requested:
            self.session_id = self.record.session_requested  # known at once: a cancel during the load reaches it
            yield "session/load", {"sessionId": self.session_id, **folder}
        else:
            session = (yield "session/new", folder).get("sessionId")
            if not (isinstance(session, str) and SESSION_NAME_RE.fullmatch(session)):
                self.failure = "Hermes answered session/new without a usable session id"
                return
            self.session_id = session
        self.record.session_id = self.session_id
        self.record.session_source = "the ACP session"
        self.changed = True
        result = yield "session/prompt", {"sessionId": self.session_id,
                                          "prompt": [{"type": "text", "text": self.task}]}
        self.result = result
        usage = result.get("usage")
        if isinstance(usage, dict):
            self._set(tokens_in=usage.get("inputTokens"), tokens_out=usage.get("outputTokens"))
        self._set(stop_reason=result.get("stopReason"))

    def _next_step(self, step: tuple[str, dict[str, Any]]) -> None:
        self.next_id += 1
        self.step = (self.next_id, step[0])
        self._send({"id": self.next_id, "method": step[0], "params": step[1]})

    # -- the wire
    def _read(self) -> None:
        """Hermes' stdout as messages; a line that is not a JSON object (a stray print, junk, nesting deep
        enough to exhaust the parser) becomes a note, and the reader goes on."""
        stream = cast(Any, self.proc.stdout)
        while True:
            try:
                line = stream.readline(ACP_LINE_MAX)
            except (OSError, ValueError):
                return
            if not line:
                return
            if not line.strip():
                continue
            try:
                if nesting_depth(line, ACP_MAX_DEPTH) > ACP_MAX_DEPTH:
                    raise ValueError("nested too deep")
                message = json.loads(line)
            except (ValueError, RecursionError, MemoryError):
                message = None
            self.inbox.put(message if isinstance(message, dict) else {"bridge/unreadable": True})

    def _send(self, message: dict[str, Any]) -> None:
        try:
            stdin = cast(Any, self.proc.stdin)
            stdin.write((json.dumps({"jsonrpc": "2.0", **message}) + "\n").encode())
            stdin.flush()
        except (OSError, ValueError):
            pass  # Hermes is gone; its exit ends the job

    def note_once(self, kind: str, text: str) -> None:
        """A message of the wrong shape, said in the log the first time its kind is seen."""
        if kind not in self.noted:
            self.noted.add(kind)
            self.log(f"\n[bridge] ignored {text} (said once; later ones are ignored silently)\n")

    def cancel(self) -> None:
        if self.session_id:
            self._send({"method": "session/cancel", "params": {"sessionId": self.session_id}})

    def close(self) -> None:
        """End of input: `hermes acp` exits when its client goes away."""
        with contextlib.suppress(OSError):
            cast(Any, self.proc.stdin).close()

    @property
    def finished(self) -> bool:
        return self.result is not None or self.failure is not None

    def drain(self) -> None:
        """After Hermes exited: the last messages it wrote, then no question is left pending."""
        self.reader.join(2)
        self.pump()
        for question in list(self.record.questions):
            self._expire(question, "Hermes itself: it stopped waiting for an answer"
                         if machine_clock() >= question["expires_clock"] - 2
                         else "nobody: the job ended while Hermes waited")
        if self.changed:
            self.changed = False
            self.save()

    # -- the loop
    def pump(self) -> None:
        """Handle every message that arrived, the answers to pending questions, the questions Hermes has
        stopped waiting for; save the record when something changed."""
        import queue

        while True:
            try:
                message = self.inbox.get_nowait()
            except queue.Empty:
                break
            try:
                self._handle(message)
            except Exception as exc:  # noqa: BLE001  (a message of a shape no check foresaw: ignored)
                self.note_once(f"raised {type(exc).__name__}", f"a message from Hermes the bridge could not handle "
                               f"({type(exc).__name__}: {shown(str(exc), 200)})")
        self._check_answers()
        if self.changed:
            self.changed = False
            self.save()

    def _handle(self, message: dict[str, Any]) -> None:
        if message.get("bridge/unreadable"):
            self.note_once("unreadable", "a line from Hermes that is not a JSON-RPC message")
            return
        method = message.get("method")
        params = message.get("params")
        if method is None and "id" in message:
            if message["id"] == self.step[0] and not self.finished:
                self._reply(message)
        elif not isinstance(params, dict) and method in ("session/request_permission", "session/update"):
            self.note_once(f"{method} params", f"a {method} whose params are not an object")
            if method == "session/request_permission" and "id" in message:
                self._send({"id": message["id"], "error": {"code": -32602, "message": "params must be an object"}})
        elif method == "session/request_permission" and "id" in message:
            self._permission(message["id"], cast(dict[str, Any], params))  # any id, reused or null: echoed back
        elif method == "session/update":
            update = cast(dict[str, Any], params).get("update")
            if isinstance(update, dict):
                self._update(update)
            else:
                self.note_once("update shape", "a session/update without an update object")
        elif "id" in message and isinstance(method, str):
            self._send({"id": message["id"], "error": {"code": -32601, "message": f"{shown(method, 80)} is not "
                                                        "supported by this client"}})

    def _reply(self, message: dict[str, Any]) -> None:
        """Hermes' reply to the handshake's current step: an error ends the conversation, a result goes on."""
        result = message.get("result")
        if "error" in message or not isinstance(result, dict):
            error = message.get("error")
            text = error.get("message") if isinstance(error, dict) else error
            self.failure = f"Hermes answered {self.step[1]} with an error: {shown(text, 500)}"
            return
        try:
            step = self.steps.send(result)
        except StopIteration:  # the prompt was answered: the conversation is over
            return
        self._next_step(step)

    def _set(self, **values: Any) -> None:
        """Activity fields of the record, kept only when they are of the shape the record allows, a text
        within its encoded size."""
        acp = cast(dict[str, Any], self.record.acp)
        for key, value in values.items():
            if (is_whole_number(value) and 0 <= value < COUNTER_LIMIT) or is_number(value) or isinstance(value, str):
                acp[key] = fit_json(value, TEXT_FIELD_MAX_BYTES) if isinstance(value, str) else value
                self.changed = True

    def _update(self, update: dict[str, Any]) -> None:
        kind = update.get("sessionUpdate")
        if kind == "tool_call":
            tool_kind = update.get("kind") if isinstance(update.get("kind"), str) else "other"
            if tool_kind not in FOLDER_KEEPING_KINDS and self.step[1] == "session/prompt":  # not a replayed one
                self.folder_may_have_moved = True
            command = " ".join(described_command(update).split())[:TOOL_ARGUMENT_CHARS * 2]
            acp = cast(dict[str, Any], self.record.acp)
            self._set(tool=f"{shown(tool_kind, 40)}: {command}", tool_started=time.time(),
                      tool_status="running", tool_calls=int(acp.get("tool_calls", 0)) + 1)
            self.log(f"\n[hermes] {shown(tool_kind, 40)}: {clean_str(command)}\n")
        elif kind == "tool_call_update" and update.get("status") in ("completed", "failed"):
            self._set(tool_status=str(update["status"]))
            output = content_text(update.get("content"))
            cut = output[:ACP_OUTPUT_CHARS] + (f"\n[... {len(output) - ACP_OUTPUT_CHARS} more characters]"
                                               if len(output) > ACP_OUTPUT_CHARS else "")
            self.log(f"[hermes] {update['status']}:\n{cut}\n")
        elif kind == "agent_message_chunk":
            text = content_text(update.get("content"))
            if text and sum(map(len, self.answer_chunks)) < ANSWER_MAX_CHARS:
                self.answer_chunks.append(text)
                self._set(answer="".join(self.answer_chunks))
                self.log(text)
        elif kind == "usage_update":
            self._set(context_used=update.get("used"), context_size=update.get("size"))

    # -- questions
    def _permission(self, request_id: Any, params: dict[str, Any]) -> None:
        given = params.get("toolCall")
        tool: dict[str, Any] = given if isinstance(given, dict) else {}
        options = params.get("options")
        offered = [o for o in (options if isinstance(options, list) else []) if isinstance(o, dict)]
        by_kind = {o.get("kind"): o.get("optionId") for o in reversed(offered)}
        if any(o.get("optionId") == SESSION_OPTION for o in offered):  # 0.19/0.22 give it the kind of "always"
            by_kind[SESSION_OPTION] = SESSION_OPTION
        self.questions_asked += 1
        approval_id = f"{self.questions_asked}-{os.urandom(3).hex()}"
        if tool.get("kind") == "edit":
            paths = edit_targets(tool)
            decision, why = edit_decision(paths, self.record.cwd or "", self.folder_may_have_moved,
                                        job_roots(self.cfg, self.record))
            what = "edit " + (", ".join(shown(path, 300) for path in paths[:20]) if paths else "(no path Hermes "
                              "states in its arguments)")
            self._decide(request_id, by_kind, approval_id, what, decision, f"the bridge: {why}")
            return
        given_raw = tool.get("rawInput")
        raw: dict[str, Any] = given_raw if isinstance(given_raw, dict) else {}
        command = described_command(tool)
        reason = raw.get("description") if isinstance(raw.get("description"), str) else ""
        what = f"run `{shown_whole(command, COMMAND_SHOWN_CHARS)}`" + (f" ({shown(reason, 200)})" if reason else "")
        if len(command) > COMMAND_SHOWN_CHARS:
            what += (f"; the command is {len(command):,} characters, too long to show whole: its whole text is in "
                     "the job log (FULL_LOG)")
            self.log(f"\n[bridge] the whole command of approval {approval_id}: {escaped(command)}\n")
        mode = self.record.approval_mode or self.cfg.approval_mode
        if mode != "ask":
            self._decide(request_id, by_kind, approval_id, what, "allow" if mode == "yolo" else "deny",
                         f"the bridge: approvals {mode}")
            return
        if command in self.allowed_for_job:  # the exact text, allowed for this job by an earlier answer
            self._decide(request_id, by_kind, approval_id, what, "allow", "the bridge: allowed for this job ("
                         f"first allowed{clock_words(self.allowed_for_job[command][0])} by "
                         f"{self.allowed_for_job[command][1]})")
            return
        now = time.time()
        question = {"id": approval_id, "what": what, "asked_at": now, "expires_at": now + self.approval_timeout_s,
                    "expires_clock": machine_clock() + self.approval_timeout_s}
        size = len(json.dumps(question, ensure_ascii=False).encode())
        waiting = sum(self.question_bytes.values())
        if len(self.record.questions) >= QUESTIONS_KEPT or waiting + size > QUESTIONS_MAX_BYTES:
            self._decide(request_id, by_kind, approval_id, what, "deny", f"the bridge: "
                         f"{len(self.record.questions):,} questions were already waiting for an answer")
            return
        self.asked[approval_id] = (request_id, by_kind, command)
        self.question_bytes[approval_id] = size
        self.record.questions.append(question)
        self.changed = True
        self.log(f"\n[bridge] Hermes asks to {what}; waiting for an answer (approval {approval_id})\n")

    def _decide(self, request_id: Any, by_kind: dict[Any, Any], approval_id: str, what: str, decision: str,
                by: str) -> None:
        if decision == "allow_for_job":  # Hermes' "for this session" where offered, never "always" (it persists)
            option = by_kind.get(SESSION_OPTION) or by_kind.get("allow_once")
        else:
            option = by_kind.get("allow_once" if decision == "allow" else "reject_once")
        outcome = {"outcome": "selected", "optionId": option} if isinstance(option, str) else {"outcome": "cancelled"}
        self._send({"id": request_id, "result": {"outcome": outcome}})
        self._record_decision(approval_id, what, decision, by)

    def _record_decision(self, approval_id: str, what: str, decision: str, by: str) -> None:
        """Every decision, wherever it was taken, is kept, logged and audited where it is applied."""
        self.record.add_decision({"id": approval_id, "what": what, "decision": decision, "by": by, "at": time.time()})
        self.changed = True
        self.log(f"\n[bridge] approval {approval_id}: {what} -> {decision} by {by}\n")
        audit(self.cfg, event="decision", job_id=self.record.id, approval_id=approval_id, decision=decision, by=by,
              what=what)

    def _check_answers(self) -> None:
        """Each pending question: expired (checked first: an answer read after Hermes' deadline never
        decides), or decided by the answer claimed for it."""
        if not self.record.questions:
            return
        answers: dict[str, Any] | None = None
        for question in list(self.record.questions):
            if machine_clock() > question["expires_clock"]:
                self._expire(question, f"Hermes itself: no answer within {self.approval_timeout_s:g} s")
                continue
            if answers is None:
                answers = self.store.answers_file(self.record.id)[0]
            given = answers.get(question["id"])
            if given is None or question["id"] not in self.asked:
                continue
            request_id, by_kind, command = self.asked.pop(question["id"])
            self._forget(question)
            by = ANSWERERS.get(given["by"], ANSWERERS["planner"])
            if given["decision"] == "allow_for_job":
                self.allowed_for_job[command] = (time.time(), by)
            self._decide(request_id, by_kind, question["id"], question["what"], given["decision"], by)

    def _expire(self, question: dict[str, Any], by: str) -> None:
        """A question no longer waited for: Hermes denies it (the request is never withdrawn)."""
        self.asked.pop(question["id"], None)
        self._forget(question)
        self._record_decision(question["id"], question["what"], "deny", by)

    def _forget(self, question: dict[str, Any]) -> None:
        self.question_bytes.pop(question["id"], None)
        self.record.questions = [q for q in self.record.questions if q["id"] != question["id"]]

    def outcome(self, exit_code: int | None) -> Outcome:
        if self.failure:
            return Outcome(JobState.ERROR, exit_code, self.failure)
        stop = (self.result or {}).get("stopReason")
        if stop == "end_turn":
            return Outcome(JobState.OK, exit_code, None)
        if self.result is None:
            return Outcome(JobState.ERROR, exit_code, "Hermes exited before it answered the prompt" + (
                f" ({describe_exit(exit_code)}); see the log" if exit_code is not None else ""))
        if stop == "refusal":
            return Outcome(JobState.ERROR, exit_code, "Hermes refused the prompt (stopReason refusal); a session "
                           "made with the CLI cannot be continued over ACP")
        return Outcome(JobState.ERROR, exit_code, f"Hermes stopped with stopReason {shown(stop, 60)}")


# ------------------------------------------------------------------------------------- process control [both]
# Win32 process creation flags, spelled out so the decisions below can be tested on any platform.
CREATE_SUSPENDED = 0x00000004
CREATE_NEW_PROCESS_GROUP = 0x00000200
CREATE_BREAKAWAY_FROM_JOB = 0x01000000
CREATE_NO_WINDOW = 0x08000000


def supervisor_creation_flags(windows: bool) -> list[int | None]:
    """How to start a supervisor that outlives the host, best first; None means POSIX (a new session).

    Windows: a hidden console of its own (CREATE_NO_WINDOW; DETACHED_PROCESS would make that a no-op, and a
    venv's python.exe redirector would then open a visible console per job) in a new process group, and out
    of the host's job object when the host allows it (breakaway is refused where the job forbids it)."""
    if not windows:
        return [None]
    base = CREATE_NO_WINDOW | CREATE_NEW_PROCESS_GROUP
    return [base | CREATE_BREAKAWAY_FROM_JOB, base]


def hermes_creation_flags(windows: bool) -> int | None:
    """Hermes shares the supervisor's hidden console, so CTRL_BREAK reaches it, in a process group of its
    own, so the break does not reach the supervisor; it starts suspended until it sits in its job object."""
    return CREATE_NEW_PROCESS_GROUP | CREATE_SUSPENDED if windows else None


def popen_kwargs(creation_flags: int | None) -> dict[str, Any]:
    return {"start_new_session": True} if creation_flags is None else {"creationflags": creation_flags}


def interrupt(proc: "psutil.Process") -> bool:
    """The polite stop: SIGTERM (CTRL_BREAK on Windows); Hermes then stops its own tools. False when it
    could not be sent, so the caller does not wait a grace period for nothing."""
    try:
        if IS_WINDOWS:
            os.kill(proc.pid, signal.CTRL_BREAK_EVENT)  # type: ignore[attr-defined]
        else:
            proc.terminate()
        return True
    except (psutil.Error, OSError):
        return False


def interrupt_group(pid: int) -> bool:
    """Ctrl-C for a Hermes that leads its own process group (it was started in a new session): SIGINT to the
    group, so Hermes ends its turn and saves its session as at a terminal, and the tools in its group get
    the same; CTRL_BREAK on Windows, where a new process group ignores CTRL_C. False when not sent."""
    try:
        if IS_WINDOWS:
            os.kill(pid, signal.CTRL_BREAK_EVENT)  # type: ignore[attr-defined]
        elif os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGINT)
        else:
            return False
        return True
    except OSError:
        return False


class WindowsJob:
    """A Win32 job object holding Hermes and everything it starts: Windows never re-parents, so a tool
    whose parent exits escapes a walk by parent links, but never its job. Stopped with TerminateJobObject."""

    def __init__(self) -> None:
        import ctypes

        self.kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]
        self.handle = self.kernel32.CreateJobObjectW(None, None)
        if not self.handle:
            raise OSError(ctypes.get_last_error(), "CreateJobObjectW failed")  # type: ignore[attr-defined]

    def adopt(self, popen: subprocess.Popen[bytes]) -> None:
        """Assign a process started suspended, then let it run."""
        import ctypes

        if not self.kernel32.AssignProcessToJobObject(self.handle, ctypes.c_void_p(int(popen._handle))):  # type: ignore[attr-defined]
            psutil.Process(popen.pid).resume()
            raise OSError(ctypes.get_last_error(), "AssignProcessToJobObject failed")  # type: ignore[attr-defined]
        psutil.Process(popen.pid).resume()

    def terminate(self) -> None:
        self.kernel32.TerminateJobObject(self.handle, 1)


@functools.cache
def protected_pids() -> frozenset[int]:
    """Processes the bridge never signals, whatever a record says: pid 1, this process, its ancestors and
    its console host. Read once per process: a stop checks it for every process on the machine
    (marked_processes)."""
    pids = {0, 1, os.getpid()}
    with contextlib.suppress(psutil.Error):
        pids.update(parent.pid for parent in psutil.Process().parents())
    pids.update(own_console_hosts())
    return frozenset(pids)


def own_console_hosts() -> list[int]:
    """The conhost.exe Windows starts as a child of a console process (the supervisor's hidden console): it
    inherits the job's marker, and killing it kills this process (seen under Wine, where the sweep after
    Hermes exited took the supervisor down with it and the job showed orphaned)."""
    if not IS_WINDOWS:
        return []
    hosts = []
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process().children():
            with contextlib.suppress(psutil.Error, OSError, IndexError):  # psutil lets OSError out under Wine
                if os.path.basename(child.cmdline()[0]).lower() == "conhost.exe":
                    hosts.append(child.pid)
    return hosts


def carries_marker(proc: "psutil.Process", marker: str) -> bool:
    try:
        return proc.environ().get(JOB_MARKER) == marker
    except (psutil.Error, OSError):  # another user's process, or gone
        return False


# Linux re-parents orphans to the nearest subreaper, so a supervisor that is one holds the whole tree of its
# job below it, whatever a tool does to its session or environment.
HAS_SUBREAPER = sys.platform.startswith("linux")
PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process (a supervisor) the reaper of its descendants' orphans; False where it cannot."""
    if not HAS_SUBREAPER:
        return False
    import ctypes

    try:
        return bool(ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


@dataclasses.dataclass(frozen=True)
class Ownership:
    """The proof that a process is a job's, checked before any signal; a record on disk is only a claim
    (Hermes' shell, or any local process, can write one naming any pid).

    marker: JOB_MARKER's value in the job's processes (the id and a random nonce, so unique machine-wide).
    anchors: live processes proven to be the job's: its supervisor, or for an orphan its Hermes. On Linux a
    process must descend from an anchor (the subreaper keeps every descendant there), so a process that only
    copied the marker into its environment is never signalled. Elsewhere the exact marker on the process or
    on one of its ancestors is the proof (a tool that scrubbed its environment is still below a marked one)."""

    marker: str
    anchors: frozenset[int] = frozenset()
    recorded: tuple[ProcessId, ...] = ()  # the job's processes as its supervisor recorded them (pid and start)
    require_descent: bool = HAS_SUBREAPER

    def owns(self, proc: "psutil.Process") -> bool:
        """Whether this process is provably the job's: below an anchor (Linux) or marked (elsewhere), or one
        the supervisor recorded, still the same process (pid and start) and still carrying the exact marker:
        the proof that stands for an orphan's tools once its Hermes is gone."""
        if proc.pid in protected_pids():
            return False
        if any(seen.pid == proc.pid and seen.process() for seen in self.recorded) and carries_marker(proc, self.marker):
            return True
        try:
            ancestors = proc.parents()
        except psutil.Error:
            return False
        if self.require_descent:
            return proc.pid in self.anchors or any(parent.pid in self.anchors for parent in ancestors)
        return carries_marker(proc, self.marker) or any(
            parent.pid not in protected_pids() and carries_marker(parent, self.marker) for parent in ancestors)

    def descendants(self) -> list["psutil.Process"]:
        found = []
        for pid in self.anchors:
            try:
                found += psutil.Process(pid).children(recursive=True)
            except psutil.Error:
                continue
        return found


def tree_of(root: "psutil.Process | None", seen: list[ProcessId]) -> list["psutil.Process"]:
    """The root, its descendants now, and every earlier-seen descendant that is still the same process."""
    procs: dict[int, psutil.Process] = {}
    if root is not None:
        try:
            procs[root.pid] = root
            for child in root.children(recursive=True):
                procs[child.pid] = child
        except psutil.Error:
            pass
    for process_id in seen:
        if process_id.pid not in procs and (proc := process_id.process()):
            procs[proc.pid] = proc
    return list(procs.values())


def still_running(procs: list["psutil.Process"], timeout_s: float) -> list["psutil.Process"]:
    """Wait until these processes are gone (zombies count as gone), returning those still running.

    Polls instead of waiting on them: waiting would reap the supervisor's own child, Hermes, before
    subprocess does, and then Popen reports exit code 0 for a Hermes that was killed."""
    identities = [(proc, process_id) for proc in procs
                  if (process_id := ProcessId.of_safe(proc)) and process_id.process()]
    deadline = time.monotonic() + timeout_s
    while True:
        running = [proc for proc, process_id in identities if process_id.process()]
        if not running or time.monotonic() >= deadline:
            return running
        time.sleep(0.05)


def marked_processes(marker: str) -> list["psutil.Process"]:
    """Every process carrying this job's marker, wherever it was re-parented: a tool that double-forked, or
    a process forked while the tree was being stopped, is no longer below Hermes but still carries it."""
    protected = protected_pids()
    return [proc for proc in psutil.process_iter() if proc.pid not in protected and carries_marker(proc, marker)]


@dataclasses.dataclass
class StopReport:
    """What a stop did, for the job's reason line: never "the whole tree" unless that was verified."""

    stopped: frozenset[int]  # the processes signalled while they ran
    survivors: list[int]
    disowned: list[int]  # carry the marker but could not be proven the job's: not signalled
    complete: bool  # the tree is known whole (a subreaper supervisor held it)

    def merged(self, later: "StopReport") -> "StopReport":
        """This stop and a later sweep as one: each process counted once, survivors as the sweep left them."""
        return StopReport(self.stopped | later.stopped, later.survivors + [
            pid for pid in self.survivors if pid not in later.survivors and psutil.pid_exists(pid)],
            sorted(set(self.disowned) | set(later.disowned)), self.complete and later.complete)

    def describe(self) -> str:
        count = len(self.stopped)
        if not count and not self.survivors:
            text = "no process of the job was still running"
        elif self.survivors:
            text = (f"stopped {plural(count, 'process')}, but pids {self.survivors[:20]} could not be verified gone; "
                    "stop them by hand")
        elif self.complete:
            text = f"the whole process tree ({plural(count, 'process')}) was stopped and verified gone"
        else:
            text = (f"{plural(count, 'process')} (found below Hermes and by the job's marker) stopped and verified "
                    "gone; a tool that left both the tree and its environment cannot be found on this system")
        if self.disowned:
            text += (f"; pids {self.disowned[:20]} carry the job's marker but do not descend from the job, so they "
                     "were not signalled")
        return text


def stop_tree(owner: Ownership, root: "psutil.Process | None", seen: list[ProcessId], grace_s: float,
              windows_job: "WindowsJob | None" = None, complete: bool = False) -> StopReport:
    """Interrupt the root, wait the grace period, then kill every survivor of the tree.

    Hermes starts each tool command in its own session, so a process-group kill would miss them: the
    snapshot by parentage (below the root, below the anchors, the pids seen earlier, and every process
    carrying the job's marker) is what gets killed, and only what the owner proves to be the job's. The
    marker sweep repeats until nothing new appears, so a process forked during the stop is caught too."""
    targets: list[psutil.Process] = []

    def proven(procs: list["psutil.Process"]) -> list["psutil.Process"]:
        """The live processes not yet targeted that prove to be the job's, now: a process stays a target once
        proven, since stopping its parent re-parents it out of the tree."""
        known = {proc.pid for proc in targets}
        unique = {proc.pid: proc for proc in procs if proc.pid not in known}
        return [proc for proc in unique.values() if is_alive(proc) and owner.owns(proc)]

    root = root if root is not None and is_alive(root) and owner.owns(root) else None
    marked = marked_processes(owner.marker)
    targets += proven(tree_of(root, seen) + owner.descendants() + marked)
    disowned = sorted({proc.pid for proc in marked} - {proc.pid for proc in targets})
    if root is not None and interrupt(root):
        still_running([root], grace_s)
    if windows_job is not None:
        windows_job.terminate()
    targets += proven(tree_of(root, seen) + owner.descendants())
    survivors = still_running(targets, 0)
    for _ in range(5):
        for proc in survivors:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        survivors = still_running(survivors, 3)
        late = proven(marked_processes(owner.marker) + owner.descendants())
        if not late:
            break
        targets += late
        survivors += late
    return StopReport(frozenset(proc.pid for proc in targets), [proc.pid for proc in survivors], disowned, complete)


def reap_orphans(keep: int) -> None:
    """Collect the exit status of this process' children that have ended, but for `keep` (Hermes, whose
    status subprocess collects): as a subreaper, a supervisor inherits every orphaned tool of its job."""
    if IS_WINDOWS:
        return
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process().children():
            if child.pid != keep and not is_alive(child):
                with contextlib.suppress(OSError):
                    os.waitpid(child.pid, os.WNOHANG)


# -------------------------------------------------------------------------------------- Hermes drivers [both]
# The ways to drive Hermes, behind one seam: `hermes chat` with the task on its command line or stdin (CliRun)
# and `hermes acp` spoken to over JSON-RPC (AcpRun). The server plans a launch with them to refuse early; the
# supervisor starts, pumps, stops and reads the outcome of one. A third driver is one class and one entry in
# DRIVERS (its name in DRIVER_NAMES, and where choose_driver picks it).
@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """The command the supervisor will start, once every check before it passed."""

    argv: list[str]
    shown_argv: list[str]  # the argv with the task elided, for the record
    folder: str
    stdin_path: Path | None  # the task file, for a Hermes that reads the task on stdin
    cli_flags: list[str]
    task: str = ""


def usable_hermes(cfg: Config) -> str:
    """The Hermes executable a job would start, or Refused naming the path, where it came from, and why."""
    hermes = locate_hermes(cfg)
    if not hermes.usable:
        raise Refused(f"Hermes cannot be started: {hermes.problem}. hermes_health (or `server.py --check` in a "
                      "terminal) shows what the bridge finds")
    return hermes.usable


def start_hermes(argv: list[str], folder: str, env: dict[str, str], stdin: Any, stdout: Any,
                 stderr: Any) -> subprocess.Popen[bytes]:
    """Hermes in the job's folder, in a process group of its own, never through a shell (every driver)."""
    return subprocess.Popen(argv, cwd=folder, stdin=stdin, stdout=stdout, stderr=stderr, env=env, close_fds=True,
                            **popen_kwargs(hermes_creation_flags(IS_WINDOWS)))


Probe = Callable[[Config, str], "HermesCli | None"]
ProcessStarter = Callable[[list[str], str, Any, dict[str, str]], subprocess.Popen[bytes]]
LogWriter = Callable[[str], None]


class HermesRun:
    """One job's Hermes, driven one way. The supervisor calls start, then pump on every poll until the
    process exits (ask_to_stop when the job must stop, close once the turn is over while the process still
    runs), then drain, outcome and session. Everything a job has whatever the driver (the record, the
    deadline, the tree stop, the outcome written) stays in Supervisor."""

    stop_grace_s = 0.0  # how long Hermes gets to stop by itself after ask_to_stop, before the tree stop
    stop_request = "nothing asked"  # what ask_to_stop sends, in words
    exit_grace_s = 0.0  # how long Hermes gets to exit by itself after close, before the tree stop

    def __init__(self, cfg: Config, store: JobStore, record: JobRecord, exe: str, log: LogWriter,
                 start_process: ProcessStarter | None = None, save: Callable[[], None] | None = None):
        self.cfg, self.store, self.record, self.exe, self.log = cfg, store, record, exe, log
        self.start_process = start_process or self.start_default
        self.save = save or functools.partial(write_record, store, record)
        self.policy_dir: Path | None = None

    @classmethod
    def plan(cls, cfg: Config, exe: str, record: JobRecord, task: str, folder: str, task_path: Path | None,
             probe: Probe) -> LaunchPlan | None:
        raise NotImplementedError

    @staticmethod
    def start_default(argv: list[str], folder: str, stdin: Any, env: dict[str, str]) -> subprocess.Popen[bytes]:
        raise NotImplementedError

    def start(self, plan: LaunchPlan, env: dict[str, str]) -> subprocess.Popen[bytes]:
        raise NotImplementedError

    def pump(self) -> None:
        """Handle what Hermes sent since the last poll."""

    @property
    def finished(self) -> bool:
        """Whether Hermes' turn is over while its process still runs (then close ends it)."""
        return False

    def close(self) -> None:
        """Let a Hermes whose turn is over exit by itself."""

    def ask_to_stop(self) -> None:
        """Ask Hermes to stop by itself, before the tree stop that follows after stop_grace_s."""

    def drain(self) -> None:
        """After the process exited: what it wrote last."""

    def outcome(self, exit_code: int) -> Outcome:
        raise NotImplementedError

    def session(self, exit_code: int | None) -> tuple[str | None, str | None]:
        """The session the job ran in, and where that came from (None: as the record already says)."""
        raise NotImplementedError

    def usage(self, session_id: str) -> "Usage | None":
        """The session's counters, from Hermes' session store (StoreUnavailable when it cannot answer)."""
        return read_store(self.cfg, lambda db: session_usage(db, session_id))

    def report(self, session_id: str | None) -> None:
        """What the driver adds to the record once the job's session is known."""

    def with_policy(self, env: dict[str, str], timeout_s: int) -> dict[str, str]:
        """The environment with this job's own managed policy (approval_policy_dir), removed by cleanup."""
        self.policy_dir = approval_policy_dir(timeout_s)
        return dict(env, HERMES_MANAGED_DIR=str(self.policy_dir))

    def cleanup(self) -> None:
        """Remove what the driver made for the job: its managed policy folder."""
        if self.policy_dir is not None:
            import shutil

            shutil.rmtree(self.policy_dir, ignore_errors=True)


CLI_INTERRUPT_GRACE_S = 3.0  # how long a CLI Hermes gets to end its turn after Ctrl-C, before the tree stop


class CliRun(HermesRun):
    """`hermes chat` answering one task and exiting: the task on its command line or on stdin, its output
    straight into the job's log, its exit code the outcome, its session id from its last `session_id:` line
    (or from the session store, for a Hermes that prints none). A stop is Ctrl-C first, as at a terminal."""

    stop_grace_s = CLI_INTERRUPT_GRACE_S
    stop_request = "Ctrl-C: SIGINT to its process group"
    popen: subprocess.Popen[bytes] | None = None

    @classmethod
    def plan(cls, cfg: Config, exe: str, record: JobRecord, task: str, folder: str, task_path: Path | None,
             probe: Probe) -> LaunchPlan | None:
        cli = known_cli(cfg, exe) or probe(cfg, exe)
        if cli is None:
            return None
        argv = hermes_command(cli, exe, record, task, cfg)
        if problem := argv_problem(argv):
            raise Refused(problem)
        shown_argv = [QUERY_OPTION + "<task>" if part == QUERY_OPTION + task else part for part in argv]
        return LaunchPlan(argv, shown_argv, folder, task_path if cli.task_on_stdin else None,
                          sorted(cli.flags & {"--query-file", "--in", "--oneshot"}), task)

    @staticmethod
    def start_default(argv: list[str], folder: str, stdin: Any, env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Hermes' output goes to the supervisor's stderr, which is the job's log."""
        return start_hermes(argv, folder, env, stdin, sys.stderr.fileno(), subprocess.STDOUT)

    def start(self, plan: LaunchPlan, env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Unless yolo, with a policy that denies a dangerous command at once: a one-shot CLI has nobody to
        ask, and Hermes 0.19 would otherwise wait its approval timeout (60 s) for an answer that never comes."""
        if (self.record.approval_mode or self.cfg.approval_mode) != "yolo":
            env = self.with_policy(env, 0)
        with open_regular(plan.stdin_path) if plan.stdin_path else open(os.devnull, "rb") as stdin:
            self.popen = self.start_process(plan.argv, plan.folder, stdin, env)
            return self.popen

    def ask_to_stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            interrupt_group(self.popen.pid)

    def report(self, session_id: str | None) -> None:
        """The commands Hermes denied by itself (nobody can answer the CLI), read from its session store."""
        if not session_id or self.record.started_at is None:
            return
        since = self.record.started_at
        with contextlib.suppress(StoreUnavailable):
            for number, command in enumerate(read_store(self.cfg, lambda db: blocked_commands(db, session_id, since))):
                self.record.add_decision({"id": f"cli-{number + 1}",
                                          "what": f"run `{shown_whole(command, COMMAND_SHOWN_CHARS)}`",
                                          "decision": "deny", "by": "Hermes itself: the CLI driver cannot ask "
                                          "anyone, so a command Hermes deems dangerous is denied at once"})

    def outcome(self, exit_code: int) -> Outcome:
        """Its exit code; a command line Hermes rejected forgets the cached options, so the next launch asks."""
        if exit_code == 0:
            return Outcome(JobState.OK, exit_code, None)
        log = self.store.log_path(self.record.id)
        tail = read_tail(log, 65536)[0]
        if exit_code == 2 and UNKNOWN_OPTION_RE.search(tail):
            forget_probe(self.cfg, self.exe)
        return Outcome(JobState.ERROR, exit_code, describe_exit(exit_code, ends_with_session_line(log),
                                                                USAGE_ERROR_RE.search(tail) is not None))

    def session(self, exit_code: int | None) -> tuple[str | None, str | None]:
        record = self.record
        session_id = session_id_from_log(self.store.log_path(record.id))
        if session_id is not None:
            return session_id, None
        if record.session_requested and exit_code == 0:
            return record.session_requested, "the session resumed (this Hermes prints no session line)"
        if record.started_at and record.cwd:
            return session_started_in(self.cfg, record.cwd, record.started_at)
        return None, None


class AcpRun(HermesRun):
    """`hermes acp` in the job's folder, spoken to over its stdin and stdout (AcpConversation): Hermes' questions
    are decided or relayed, a stop is asked with session/cancel first, and a finished turn closes its input.
    Each job has its own managed policy folder (approval_policy_dir), removed at the end."""

    stop_grace_s = ACP_CANCEL_GRACE_S
    stop_request = "session/cancel"
    exit_grace_s = ACP_EXIT_GRACE_S

    def __init__(self, cfg: Config, store: JobStore, record: JobRecord, exe: str, log: LogWriter,
                 start_process: ProcessStarter | None = None, save: Callable[[], None] | None = None):
        super().__init__(cfg, store, record, exe, log, start_process, save)
        self.conversation: AcpConversation | None = None

    @classmethod
    def plan(cls, cfg: Config, exe: str, record: JobRecord, task: str, folder: str,  # noqa: ARG003 (the seam's)
             task_path: Path | None, probe: Probe) -> LaunchPlan | None:  # noqa: ARG003
        return LaunchPlan([exe, "acp"], [exe, "acp"], folder, None, [], task)  # the task goes in the prompt

    @staticmethod
    def start_default(argv: list[str], folder: str, stdin: Any, env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Pipes for the protocol; its stderr (Hermes' own log lines) goes to the job's log."""
        return start_hermes(argv, folder, env, stdin, subprocess.PIPE, sys.stderr.fileno())

    def start(self, plan: LaunchPlan, env: dict[str, str]) -> subprocess.Popen[bytes]:
        proc = self.start_process(plan.argv, plan.folder, subprocess.PIPE,
                                  self.with_policy(env, int(self.cfg.approval_timeout_s)))
        self.conversation = AcpConversation(proc, self.record, self.cfg, self.store, plan.task, self.log, self.save)
        return proc

    @property
    def talk(self) -> AcpConversation:
        return cast(AcpConversation, self.conversation)

    def pump(self) -> None:
        self.talk.pump()

    @property
    def finished(self) -> bool:
        return self.talk.finished

    def close(self) -> None:
        self.talk.close()

    def ask_to_stop(self) -> None:
        self.talk.cancel()

    def drain(self) -> None:
        self.talk.drain()

    def outcome(self, exit_code: int) -> Outcome:
        """The conversation's outcome; a `hermes acp` that did not even open a session forgets the cached
        "speaks ACP" answer, so the next launch asks again."""
        talk = self.talk
        if talk.session_id is None and talk.failure is None:
            forget_probe(self.cfg, self.exe, "|acp")
        return talk.outcome(exit_code)

    def session(self, exit_code: int | None) -> tuple[str | None, str | None]:  # noqa: ARG002 (the seam's)
        return self.record.session_id, None  # the protocol's, or none when Hermes never opened one


DRIVERS: dict[str, type[HermesRun]] = {"cli": CliRun, "acp": AcpRun}


def driver_of(record: JobRecord) -> type[HermesRun]:
    """The driver a job runs with (a record of an older bridge names none: the CLI)."""
    return DRIVERS[record.driver or "cli"]


def plan_launch(cfg: Config, exe: str, record: JobRecord, task: str, folder: str, task_path: Path | None = None,
                probe: Probe = probe_cli) -> LaunchPlan | None:
    """The one launch plan, made by the server to refuse a launch early and by the supervisor to start
    Hermes: the command line for the record's driver and this Hermes' options, the folder, and where the
    task goes. Refused when the command line cannot hold the task; None while the options are unknown (the
    server's probe failed: the supervisor probes again and reports what it finds)."""
    return driver_of(record).plan(cfg, exe, record, task, folder, task_path, probe)


# ------------------------------------------------------------------------------------ supervisor [supervisor]
# `server.py --supervise <id>`: one detached process per job that owns it from start to outcome.
POLL_S = 0.2


@dataclasses.dataclass
class FolderSnapshot:
    """The files under a job's folder (relative path -> size, mtime), or why they were not listed; identity
    is the folder's own device and inode, taken without following a symlink."""

    files: dict[str, tuple[int, int]]
    taken_ns: int
    note: str | None = None
    identity: tuple[int, int] | None = None


def lstat_folder(folder: str) -> tuple[int, int] | None:
    """The folder's device and inode, or None when it is no folder (a symlink is not followed)."""
    try:
        info = os.lstat(folder)
    except OSError:
        return None
    return (info.st_dev, info.st_ino) if stat.S_ISDIR(info.st_mode) else None


def snapshot_folder(folder: str, skip: list[str], max_entries: int, max_s: float) -> FolderSnapshot:
    """Every file under folder, walked iteratively without following symlinks (a link is listed, never
    entered), skipping folders named in skip; bounded by entries and seconds, past which it says so. The
    folder must be the same folder before and after the walk: a job that swapped it for a symlink would
    otherwise have files from elsewhere listed as its changes."""
    taken_ns = time.time_ns()
    identity = lstat_folder(folder)
    if identity is None:
        return FolderSnapshot({}, taken_ns, "not tracked (CWD is no longer a folder; replaced by a symlink?)")
    deadline = time.monotonic() + max_s
    files: dict[str, tuple[int, int]] = {}
    pending = [folder]
    entries = 0
    while pending:
        current = pending.pop()
        try:
            with os.scandir(current) as listing:
                for entry in listing:
                    entries += 1
                    if entries > max_entries:
                        return FolderSnapshot({}, taken_ns, f"not tracked (more than {max_entries} files under CWD)")
                    if entry.is_dir(follow_symlinks=False):
                        if entry.name not in skip:
                            pending.append(entry.path)
                        continue
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    files[os.path.relpath(entry.path, folder)] = (info.st_size, info.st_mtime_ns)
        except OSError:
            continue
        if time.monotonic() > deadline:
            return FolderSnapshot({}, taken_ns, f"not tracked (listing CWD took more than {max_s:g} s)")
    if lstat_folder(folder) != identity:
        return FolderSnapshot({}, taken_ns, "not tracked (CWD was replaced while it was being listed)")
    return FolderSnapshot(files, taken_ns, identity=identity)


def human_size(size: int) -> str:
    """1023 B, 1.2 KB, 3.4 MB."""
    if size < 1024:
        return f"{size} B"
    scaled = size / 1024
    for unit in ("KB", "MB"):
        if scaled < 1024:
            return f"{scaled:.1f} {unit}"
        scaled /= 1024
    return f"{scaled:.1f} GB"


def compare_snapshots(before: FolderSnapshot, after: FolderSnapshot) -> dict[str, Any]:
    """What changed between two snapshots, ready for the record: counts and at most CHANGED_LINES lines.
    A file changed while the first snapshot was being taken counts as created by the job."""
    if before.note or after.note:
        return {"note": before.note or after.note}
    if before.identity != after.identity:
        return {"note": "not tracked (CWD was replaced by another folder or a symlink during the job)"}
    old = {path: meta for path, meta in before.files.items() if meta[1] < before.taken_ns}
    created = sorted(path for path in after.files if path not in old)
    modified = sorted(path for path in after.files if path in old and after.files[path] != old[path])
    deleted = sorted(path for path in old if path not in after.files)
    lines = ([f"+ {path} ({human_size(after.files[path][0])})" for path in created]
             + [f"~ {path} ({human_size(after.files[path][0])})" for path in modified]
             + [f"- {path}" for path in deleted])
    return {"created": len(created), "modified": len(modified), "deleted": len(deleted),
            "lines": lines[:CHANGED_LINES], "more": max(0, len(lines) - CHANGED_LINES)}


class Supervisor:
    """Owns one job from a detached process: starts Hermes with the record's driver, enforces the timeout,
    obeys cancel, records. Its collaborators come in (config, store, the process starter), so tests can drive
    the loop with a fake; the driver (DRIVERS) holds everything that differs between the ways to run Hermes.

    The outcome is never lost: a record write the disk refuses mid-run is kept and tried again on the next
    poll, and the outcome is retried with back-off for OUTCOME_RETRY_S, writing nothing else meanwhile."""

    def __init__(self, job_id: str, cfg: Config, store: JobStore, start_process: ProcessStarter | None = None,
                 subreaper: bool = False):
        self.cfg = cfg
        self.store = store
        self.start_process = start_process
        self.run_: HermesRun | None = None
        self.subreaper = subreaper  # orphans of the job's tools re-parent to this process (Linux)
        self.job_id = job_id
        self.record = self.store.read(job_id)
        self.owner = Ownership(self.record.marker, frozenset({os.getpid()}))
        self.known_tree = set(self.record.tree)
        self.stop_signal = False
        self.log_offset = 0
        self.log_left_out = 0
        self.windows_job: WindowsJob | None = None
        self.hermes: psutil.Process | None = None
        self.before: FolderSnapshot | None = None
        self.snapshot_thread: threading.Thread | None = None
        self.unsaved = False
        self.next_heartbeat = 0.0
        self.next_spend_read = 0.0
        self.spend_session: str | None = None
        self.spend_fingerprint: tuple[tuple[int, int] | None, ...] = ()

    def note(self, text: str) -> None:
        self.write_log(f"[bridge] {text}\n")

    def write_log(self, text: str) -> None:
        """The job's log is this process's stderr (Hermes writes there too). A log the disk refuses loses the
        line, never the job."""
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(text)
            sys.stderr.flush()

    def save(self) -> None:
        """Write the record; a disk that refuses it (full, read-only, a lock held) leaves it to the next poll."""
        try:
            self.store.write(self.record)
            self.unsaved = False
        except (OSError, DamagedRecord):
            self.unsaved = True

    def run(self) -> int:
        record = self.record
        record.supervisor = ProcessId.of(psutil.Process())
        record.change_state(JobState.RUNNING)
        record.heartbeat = machine_clock()
        try:
            written = self.store.write(record)
        except (OSError, DamagedRecord) as exc:
            self._finish(Outcome(JobState.ERROR, None, f"the jobs folder refused the job's first write ("
                                 f"{disk_error(exc)}); Hermes was not started"))
            return 0
        if not written:
            self.note("the job already has an outcome (cancelled as an orphan before this supervisor started); "
                      "Hermes was not started")
            return 0
        try:
            outcome = self._run_hermes()
        except Exception as exc:  # the outcome must be written whatever went wrong, after the tree is stopped
            with contextlib.suppress(OSError, ValueError):
                traceback.print_exc()
            report = self._stop_everything()
            outcome = Outcome(JobState.ERROR, None, f"the supervisor failed ({type(exc).__name__}: "
                              f"{shown(str(exc), 300)}); {report.describe()}")
        self._finish(outcome)
        return 0

    def _stop_everything(self) -> StopReport:
        """After a failure of the supervisor itself: Hermes and every process proven the job's, stopped."""
        try:
            return stop_tree(self.owner, self.hermes, self.record.tree, self.cfg.kill_grace_s, self.windows_job,
                             self.subreaper)
        except Exception:  # noqa: BLE001  (the outcome is written whatever the stop met)
            return StopReport(frozenset(), [self.hermes.pid] if self.hermes else [], [], False)

    def on_sigterm(self, _signum: int, _frame: Any) -> None:
        self.stop_signal = True

    def _cancel_requested(self) -> bool:
        return self.stop_signal or self.store.cancel_path(self.job_id).exists()

    def _confined_folder(self) -> str | None:
        """Check, then use the very thing checked: the folder is re-resolved and re-confined right before
        Hermes starts, so a folder swapped for a symlink out after the launch check is not followed."""
        folder = self.record.cwd
        if not folder:
            return None
        real = os.path.realpath(folder)
        if real != folder or not within_any(real, self.roots) or not os.path.isdir(real):
            return None
        return real

    @property
    def roots(self) -> list[str]:
        return job_roots(self.cfg, self.record)

    def _run_hermes(self) -> Outcome:
        plan = self._plan()
        if isinstance(plan, Outcome):
            return plan
        self.run_ = driver_of(self.record)(self.cfg, self.store, self.record, plan.argv[0], self.write_log,
                                           self.start_process, self.save)
        proc = self._start(plan, self.run_)
        return self._watch(proc, self.run_)

    def _plan(self) -> "LaunchPlan | Outcome":
        """Everything checked before Hermes starts: the executable, its command line, the folder."""
        record, cfg = self.record, self.cfg
        if self._cancel_requested():
            return Outcome(JobState.CANCELLED, None, "cancelled before Hermes started")
        try:
            exe = usable_hermes(cfg)
            if record.worktree and not os.path.isdir(record.worktree["path"]):
                self._make_worktree(record.worktree)
            folder = self._confined_folder()
            if folder is None:
                return Outcome(JobState.ERROR, None, f"the job's folder {shown(record.cwd)} no longer resolves to "
                               "itself inside the allowed roots (moved, removed or replaced by a symlink); Hermes "
                               "was not started")
            task_path = self.store.task_path(self.job_id)
            task = read_capped(task_path, MAX_TASK_BYTES).decode("utf-8")
            return cast(LaunchPlan, plan_launch(cfg, exe, record, task, folder, task_path))  # probe_cli never None
        except Refused as exc:
            return Outcome(JobState.ERROR, None, f"{exc}. Nothing was run")
        except GitFailed as exc:
            return Outcome(JobState.ERROR, None, f"the job's worktree could not be made ({exc}); nothing was left "
                           "behind and Hermes was not started")

    def _make_worktree(self, worktree: dict[str, Any]) -> None:
        """The job's worktree, made before Hermes starts (a fresh one on its branch, or a resumed job's again
        from its branch), recorded with where git keeps it."""
        for note in add_worktree(self.store, self.job_id, worktree):
            self.note(note)
        self.note(f"worktree {worktree['path']} on branch {worktree['branch']} at {worktree['base'][:12]}")
        self.save()

    def _start(self, plan: "LaunchPlan", run: HermesRun) -> subprocess.Popen[bytes]:
        """Start Hermes as planned, after the folder listing has begun, and record who it is."""
        record, cfg = self.record, self.cfg
        if not record.worktree:  # a worktree job's changes are git's to tell
            self._start_snapshot(plan.folder)
        record.argv = plan.shown_argv
        if record.session_requested and self.watches_spend:  # a resumed session's earlier spend is not this job's
            with contextlib.suppress(StoreUnavailable):
                base = read_store(cfg, lambda db: session_spend(db, cast(str, record.session_requested)))
                record.spend_base = {key: value for key, value in (base or {}).items() if is_number(value)}
        proc = run.start(plan, hermes_env(cfg, record.marker))
        if IS_WINDOWS:
            self.windows_job = self._job_object_for(proc)
        self.hermes = psutil.Process(proc.pid)
        record.hermes = ProcessId.of(self.hermes)
        record.started_at, record.started_clock = time.time(), machine_clock()
        self.save()
        audit(cfg, event="job", job_id=self.job_id, state=JobState.RUNNING.value, hermes_pid=proc.pid,
              cwd=record.cwd, cli_flags=plan.cli_flags)
        return proc

    def _watch(self, proc: subprocess.Popen[bytes], run: HermesRun) -> Outcome:
        """Until Hermes exits: remember its tree, pump its driver, and stop it on cancel, timeout or a move
        outside the roots; then sweep what it left running, and the outcome."""
        started = time.monotonic()
        exit_code, stopping, report = self._wait(proc, run, started)
        self.record.duration_s = round(time.monotonic() - started, 3)
        run.drain()
        sweep = stop_tree(self.owner, None, self.record.tree, 0, complete=self.subreaper)
        self._keep_log_bounded()
        if stopping:
            asked = "" if report else f"Hermes stopped when asked ({run.stop_request}); "
            report = report.merged(sweep) if report else sweep
            return Outcome(stopping[0], exit_code, f"{stopping[1]}; {asked}{report.describe()}")
        if sweep.stopped or sweep.survivors:
            self.record.swept = f"after Hermes exited, tool processes it left running: {sweep.describe()}"
        # a cap that ended the turn, whatever Hermes printed (0.19/0.20 exit 0 at --max-turns, 0.22 exits 1); every
        # job's spend is read here once, so its final block and hermes_jobs say what it cost
        if passed := self._over_budget(stop_at_turns=True, fresh=True):
            return Outcome(passed[0], exit_code, passed[1])
        outcome = run.outcome(exit_code)
        if outcome.state is JobState.ERROR and (trouble := model_trouble(read_tail(
                self.store.log_path(self.job_id), 16384)[0])):
            return Outcome(outcome.state, exit_code, f"{trouble}; {outcome.reason}")
        return outcome

    def _wait(self, proc: subprocess.Popen[bytes], run: HermesRun, started: float
              ) -> tuple[int, tuple[JobState, str] | None, StopReport | None]:
        """Poll until Hermes exits. A stop first asks Hermes (the driver's ask_to_stop), then, after the
        driver's grace, stops the tree; a turn that is over while the process runs is closed, then stopped.
        The deadline is on this process' monotonic clock: a step of the wall clock neither ends a job early nor
        lets it run long."""
        record = self.record
        hermes = cast(psutil.Process, self.hermes)
        deadline = started + record.timeout_s
        stopping: tuple[JobState, str] | None = None
        report: StopReport | None = None
        stop_at = close_by = None
        while True:
            try:
                return proc.wait(timeout=POLL_S), stopping, report
            except subprocess.TimeoutExpired:
                pass
            self._remember_tree(hermes)
            reap_orphans(proc.pid)
            self._keep_log_bounded()
            now = time.monotonic()
            run.pump()
            self._stamp(now)
            if run.finished and close_by is None:
                run.close()
                close_by = now + run.exit_grace_s
            if stopping is None and (stopping := self._reason_to_stop(deadline)):
                self.note(f"{stopping[0].value}: stopping Hermes (pid {proc.pid}) and its tree")
                run.ask_to_stop()
                stop_at = now + run.stop_grace_s
            due = (stop_at is not None and (now >= stop_at or run.finished)) or (
                close_by is not None and now >= close_by)
            if due and report is None:
                report = stop_tree(self.owner, hermes, record.tree, self.cfg.kill_grace_s, self.windows_job,
                                   self.subreaper)
                if report.survivors:
                    self.note(f"could not stop pids {report.survivors}")

    def _stamp(self, now: float) -> None:
        """The heartbeat readers tell a working supervisor by, and any write the disk refused before."""
        if now >= self.next_heartbeat or self.unsaved:
            self.next_heartbeat = now + HEARTBEAT_S
            self.record.heartbeat = machine_clock()
            self.save()

    def _keep_log_bounded(self) -> None:
        """Past max_log_bytes, the log keeps its first quarter and its newest half, with a line saying how
        much was left out between. Everyone writes it in append mode, so after the cut the writes go on at the
        new end; the job's known processes are paused for the cut (milliseconds), so none of their output is
        lost or lands out of order."""
        cap = self.cfg.max_log_bytes
        try:
            if os.fstat(2).st_size <= cap:
                return
        except OSError:
            return
        paused = [proc for proc in [self.hermes, *(seen.process() for seen in self.record.tree)]
                  if proc is not None and is_alive(proc)]
        for proc in paused:
            with contextlib.suppress(psutil.Error):
                proc.suspend()
        stopping_by = time.monotonic() + 2  # a stop lands once a write in progress (10 MB at once?) has ended
        while any(is_alive(proc) and proc_status(proc) != psutil.STATUS_STOPPED for proc in paused) and (
                time.monotonic() < stopping_by):
            time.sleep(0.005)
        try:
            head, tail = cap // 4, cap // 2
            size = os.fstat(2).st_size
            with open_regular(self.store.log_path(self.job_id)) as log:
                log.seek(max(head, size - tail))
                newest = log.read()
            os.ftruncate(2, head)
            self.log_left_out += size - head - len(newest)
            os.write(2, (f"\n[bridge] {self.log_left_out:,} bytes of output were left out here (max_log_bytes "
                         f"{cap:,}): the log keeps its head and its newest output\n").encode() + newest)
        except OSError:
            return
        finally:
            for proc in paused:
                with contextlib.suppress(psutil.Error):
                    proc.resume()

    def _reason_to_stop(self, deadline: float) -> tuple[JobState, str] | None:
        record = self.record
        if self._cancel_requested():
            return JobState.CANCELLED, "cancelled on request"
        if time.monotonic() > deadline:
            return JobState.TIMEOUT, (f"hit timeout_s={record.timeout_s:g}. Work may be part-done: inspect before "
                                      "re-running")
        if moved := self._moved_outside_roots():
            return JobState.ERROR, (f"Hermes moved to {shown(moved)}, outside the allowed roots (a resumed session "
                                    "runs in its recorded folder); the job was stopped at once")
        if time.monotonic() >= self.next_spend_read and self.watches_spend:
            self.next_spend_read = time.monotonic() + SPEND_EVERY_S
            return self._over_budget(stop_at_turns=self.record.driver == "acp", fresh=False)
        return None

    @property
    def watches_spend(self) -> bool:
        """Whether this job has a budget the bridge enforces: tokens, cost, or max_turns under ACP (which
        ignores Hermes' own agent.max_turns; the CLI enforces its --max-turns itself)."""
        record = self.record
        return bool(record.max_tokens or record.max_cost_usd or (record.max_turns and record.driver == "acp"))

    def _spend(self, fresh: bool) -> dict[str, Any] | None:
        """This job's spend so far (a resumed session's earlier counters taken off), kept in the record. While
        the job runs (not `fresh`), a store that has not changed since the last read is not read again: a poll
        costs a stat. A write the change times cannot tell apart (same size, same tick) is read at the next."""
        record = self.record
        fingerprint = store_fingerprint(session_store_path(self.cfg))
        if not fresh and self.spend_session and record.spend and fingerprint == self.spend_fingerprint:
            return record.spend
        session = (record.session_id or record.session_requested or self.spend_session
                   or session_id_from_log(self.store.log_path(self.job_id)))
        started = record.started_at
        try:
            if not session and record.cwd and started is not None:
                session, _ = read_store(self.cfg, lambda db: matched_session(db, cast(str, record.cwd), started))
            if not session:
                return None
            named: str = session
            found = read_store(self.cfg, lambda db: session_spend(db, named))
            self.spend_session = named  # found once, a CLI job's session is not looked for again
            self.spend_fingerprint = fingerprint
        except StoreUnavailable:
            return None
        if found is None:
            return None
        base = record.spend_base or {}
        for key in ("api_calls", "tokens_in", "tokens_out", "cost_usd"):
            found[key] = max(0, found[key] - base.get(key, 0))
        record.spend = found
        return found

    def _over_budget(self, stop_at_turns: bool, fresh: bool) -> tuple[JobState, str] | None:
        """The budget this job has passed, read from Hermes' store, or None."""
        record = self.record
        spend = self._spend(fresh)
        if spend is None:
            return None
        tokens = spend["tokens_in"] + spend["tokens_out"]
        if record.max_tokens and tokens > record.max_tokens:
            return JobState.OVER_BUDGET, f"passed max_tokens: {tokens:,} tokens of {record.max_tokens:,}"
        if record.max_cost_usd and spend["priced"] and spend["cost_usd"] > record.max_cost_usd:
            return JobState.OVER_BUDGET, (f"passed max_cost_usd: ${spend['cost_usd']:.4f} of "
                                          f"${record.max_cost_usd:g} (Hermes' estimate)")
        if stop_at_turns and record.max_turns and spend["api_calls"] >= record.max_turns:
            return JobState.OVER_BUDGET, f"reached max_turns ({record.max_turns}): {spend['api_calls']} API calls"
        return None

    def _start_snapshot(self, folder: str) -> None:
        """The folder's files as the job starts, listed in the background so the launch is not delayed."""
        cfg = self.cfg

        def take() -> None:
            self.before = snapshot_folder(folder, cfg.changed_files_skip, cfg.changed_files_max_entries,
                                          cfg.changed_files_max_s)
        self.snapshot_thread = threading.Thread(target=take, daemon=True)
        self.snapshot_thread.start()

    def _changes(self) -> dict[str, Any] | None:
        if self.snapshot_thread is None:
            return None
        self.snapshot_thread.join(self.cfg.changed_files_max_s + 5)
        if self.before is None:
            return {"note": "not tracked (the start listing did not finish)"}
        cfg = self.cfg
        after = snapshot_folder(self.record.cwd or "", cfg.changed_files_skip, cfg.changed_files_max_entries,
                                cfg.changed_files_max_s)
        return compare_snapshots(self.before, after)

    def _usage(self, session_id: str | None) -> None:
        """The session's counters, kept in the record for hermes_jobs and for when the store is gone."""
        if not session_id or self.run_ is None:
            return
        with contextlib.suppress(StoreUnavailable):
            usage = self.run_.usage(session_id)
            if usage:
                self.record.usage = dataclasses.asdict(usage)

    def _job_object_for(self, proc: subprocess.Popen[bytes]) -> "WindowsJob | None":
        """Hermes in a job object of its own; without one (nested jobs refused) the tree walk still applies."""
        try:
            job = WindowsJob()
            job.adopt(proc)
            return job
        except OSError as exc:
            self.note(f"no job object for Hermes ({exc}); its tree is found through parent links only")
            return None

    def _moved_outside_roots(self) -> str | None:
        """The backstop for a resume: a folder Hermes announced moving to that lies outside the roots, read
        from the new part of its log. Hermes announces the move as it starts, so only the start of the log
        is read: later text is tool output, which may print anything, and a plain run never moves."""
        if not self.record.session_requested or self.log_offset >= MOVE_ANNOUNCEMENT_BYTES:
            return None
        try:
            with open_regular(self.store.log_path(self.job_id)) as log:
                log.seek(self.log_offset)
                data = log.read(MOVE_ANNOUNCEMENT_BYTES - self.log_offset)
        except OSError:
            return None
        cut = data.rfind(b"\n") + 1  # a line still being written is read on the next poll
        self.log_offset += cut
        for folder in FOLDER_MOVE_RE.findall(clean_text(data[:cut])):
            if not within_any(os.path.realpath(folder), self.roots):
                return str(folder)
        return None

    def _remember_tree(self, hermes: "psutil.Process") -> None:
        """Record every process of the job seen: Hermes' descendants and, as a subreaper, the orphans that
        were re-parented to this supervisor (they are no longer below Hermes). The record keeps TREE_KEPT;
        the marker and the subreaper find the rest."""
        try:
            children = hermes.children(recursive=True)
            if self.subreaper:
                children += [proc for proc in psutil.Process().children(recursive=True) if proc.pid != hermes.pid]
        except psutil.Error:
            return
        changed = False
        for child in children:
            process_id = ProcessId.of_safe(child)
            if process_id and process_id not in self.known_tree and len(self.record.tree) < TREE_KEPT:
                self.known_tree.add(process_id)
                self.record.tree.append(process_id)
                changed = True
        if changed:
            self.save()

    def _finish(self, outcome: Outcome) -> None:
        record = self.record
        exit_code = outcome.exit_code
        session_id: str | None = None
        if self.run_ is not None:
            try:
                self.run_.cleanup()
                session_id, source = self.run_.session(exit_code)
                record.session_source = source or record.session_source
                self.run_.report(session_id)
            except Exception as exc:  # the outcome is written whatever the driver did
                self.note(f"could not tell the job's session: {exc}")
        record.change_state(outcome.state, outcome.reason, exit_code)
        record.session_id = session_id
        record.late_answers = [*record.late_answers, *self.store.answers_file(self.job_id)[1]][-LATE_ANSWERS_KEPT:]
        try:
            if record.worktree:
                save_worktree_work(self.store, record)
            else:
                record.changes = self._changes()
            self._usage(session_id)
        except Exception as exc:  # a report of the job, never a reason to lose its outcome
            self.note(f"could not list the changes, save the worktree's work or read the usage: {exc}")
        requested = record.session_requested
        if requested and session_id and session_id != requested:
            record.session_note = (f"asked to resume session {requested}, but Hermes reported session {session_id}: "
                                   "it started a fresh session or continued a compressed one under a new id")
        if not self._write_outcome():
            return  # the record still says running with a dead supervisor: readers report it orphaned
        for path in (self.store.cancel_path(self.job_id), self.store.answers_path(self.job_id),
                     self.store.active / self.job_id):
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
        audit(self.cfg, event="job", job_id=self.job_id, state=outcome.state.value, exit_code=exit_code,
              reason=outcome.reason)

    def _write_outcome(self) -> bool:
        """The outcome, written once the disk takes it: a full or read-only jobs folder is waited out with
        back-off for OUTCOME_RETRY_S, writing nothing else to it meanwhile, and the record then says what
        delayed it. False when it never could (or another writer's outcome stands)."""
        first_failure: tuple[float, str] | None = None
        wait_s = OUTCOME_RETRY_FIRST_S
        give_up = time.monotonic() + OUTCOME_RETRY_S
        while True:
            if first_failure:
                self.record.outcome_note = (f"written {time.monotonic() - first_failure[0]:.0f} s after the job ended: "
                                            f"the jobs folder refused writes until then ({first_failure[1]})")
            try:
                self.store.write(self.record)
                return True
            except (OSError, DamagedRecord) as exc:
                first_failure = first_failure or (time.monotonic(), disk_error(exc))
            if time.monotonic() >= give_up:
                return False
            time.sleep(wait_s)
            wait_s = min(wait_s * 2, OUTCOME_RETRY_MAX_WAIT_S)


SPEND_EVERY_S = 0.5  # how often a supervisor with a budget looks at Hermes' store: a model call takes longer
OUTCOME_RETRY_S = 1800.0
OUTCOME_RETRY_FIRST_S = 0.25
OUTCOME_RETRY_MAX_WAIT_S = 5.0


def disk_error(exc: BaseException) -> str:
    """An error of the disk in words: the file and what the system said (No space left on device)."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    return f"{type(exc).__name__}: {shown(str(exc), 200)}"


# ---------------------------------------------------------------------------------------- job launch [server]
# Runs this same file as `server.py --supervise ID`, but imported, so from its cached bytecode (in the
# bridge's own cache folder, written even where PYTHONDONTWRITEBYTECODE is set): the supervisor starts faster
# and about 10 MB smaller than compiling the whole source again.
SUPERVISOR_BOOT = (
    "import importlib.util, sys\n"
    "folder, sys.pycache_prefix = sys.argv.pop(1), sys.argv.pop(1)\n"
    "sys.dont_write_bytecode = False\n"
    "sys.path.insert(0, folder)\n"
    f"spec = importlib.util.find_spec({SERVER_FILE.stem!r})\n"
    "code = spec.loader.get_code(spec.name)\n"
    "sys.pycache_prefix = None\n"
    "sys.argv[0] = spec.origin\n"
    "exec(code, {'__name__': '__main__', '__file__': spec.origin, '__builtins__': __builtins__})\n")


def supervisor_argv(job_id: str) -> list[str]:
    """The command that starts a job's supervisor, its bytecode cached outside the install folder (a
    bundle's is read-only)."""
    bytecode_cache = str(user_dir("cache") / "bytecode")
    return [sys.executable, "-c", SUPERVISOR_BOOT, str(SERVER_DIR), bytecode_cache, "--supervise", job_id]


@dataclasses.dataclass
class JobRequest:
    kind: str
    task: str
    cwd: str
    max_turns: int | None
    timeout_s: float
    skills: list[str]
    toolsets: list[str]
    session_requested: str | None = None
    cwd_note: str | None = None
    driver: str = "cli"
    approval_mode: str = "deny"
    max_tokens: int | None = None
    max_cost_usd: float | None = None
    worktree: dict[str, Any] | None = None  # isolation "worktree": the repository and base, as the launch found them

    def dedupe_key(self) -> str:
        import hashlib  # here, not at the top: it maps OpenSSL (3 MB) into every supervisor, which needs none

        identity = [self.kind, self.task, self.cwd, self.session_requested, self.skills, self.toolsets,
                    *([self.worktree.get("from")] if self.worktree else [])]
        return hashlib.sha256(json.dumps(identity).encode()).hexdigest()

    def record(self, job_id: str, log: str | None = None) -> JobRecord:
        """The record a launch of this request starts with."""
        return JobRecord(id=job_id, state=JobState.STARTING, created_at=time.time(), created_clock=machine_clock(),
                         task_preview=" ".join(self.task.split())[:120], cwd=self.cwd,
                         session_requested=self.session_requested, skills=self.skills, toolsets=self.toolsets,
                         max_turns=self.max_turns, timeout_s=self.timeout_s, dedupe_key=self.dedupe_key(), log=log,
                         cwd_note=self.cwd_note, driver=self.driver, approval_mode=self.approval_mode,
                         max_tokens=self.max_tokens, max_cost_usd=self.max_cost_usd,
                         worktree=dict(self.worktree) if self.worktree else None)


def launch_job(cfg: Config, request: JobRequest) -> tuple[JobRecord, str | None]:
    """Start a job, or return the identical one already running; atomic across server processes."""
    store = JobStore.of(cfg)
    try:
        store.ensure()
    except OSError as exc:
        raise Refused(f"cannot create the jobs folder {store.root}: {exc.strerror or exc}") from None
    key = request.dedupe_key()
    try:
        with locked(store.root / "launch.lock", 10):
            running = []
            for _, view, _ in store.views(store.active_ids()):
                if view is None:
                    continue
                if view.running and view.record.dedupe_key == key:
                    return view.record, ("an identical job is already running; this is that job, "
                                         "no second Hermes was started")
                if view.running:
                    running.append(view.record)
            if len(running) >= cfg.max_running_jobs:
                listing = "; ".join(f"{r.id} ({r.task_preview[:40]})" for r in running)
                raise Refused(f"{len(running)} jobs are running, the most max_running_jobs allows: {listing}. "
                              "Wait for one (hermes_status) or cancel one (hermes_cancel)")
            prune_jobs(store, cfg)
            return start_job(cfg, store, request), None
    except LockTimeout:
        raise Refused("another server process holds the launch lock; try again in a moment") from None
    except OSError as exc:  # the launch lock itself could not be made: the disk refuses writes
        raise Refused(f"the jobs folder refuses writes ({disk_error(exc)}); nothing started. Free space on its "
                      f"disk or make {store.root} writable, then try again") from None


def start_job(cfg: Config, store: JobStore, request: JobRequest) -> JobRecord:
    """Claim an id, write the record, start the supervisor. Runs under the launch lock, so nothing here
    opens, reads or waits on a file a job could have planted (see claim_id, open_append, write_atomic)."""
    import secrets

    try:
        job_id = store.claim_id(request.task.encode())
    except OSError as exc:
        raise Refused(f"cannot write to the jobs folder {store.root} ({disk_error(exc)}); nothing started") from None
    record = request.record(job_id, str(store.log_path(job_id)))
    record.nonce = secrets.token_hex(16)
    if record.worktree and "path" not in record.worktree:  # a fresh worktree: its place follows from the id
        path = str(store.worktree_path(job_id))
        record.worktree.update(path=path, branch=WORKTREE_BRANCH_PREFIX + job_id)
        record.cwd = os.path.join(path, *record.worktree["subdir"].split("/")) if record.worktree["subdir"] else path
    try:
        store.write(record)
        store.mark_active(job_id)
        log = open_append(store.log_path(job_id))
    except OSError as exc:
        with contextlib.suppress(OSError):
            store.clear_active(job_id)
        with contextlib.suppress(OSError):
            store.remove(job_id)
        raise Refused(f"cannot write the job record in {store.root} ({disk_error(exc)}); nothing started") from None
    env = dict(os.environ, HERMES_BRIDGE_CONFIG=str(cfg.path), **{JOB_MARKER: record.marker})
    argv = supervisor_argv(job_id)
    with log:
        for attempt, flags in enumerate(supervisor_creation_flags(IS_WINDOWS)):
            try:
                supervisor = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                              cwd=str(SERVER_DIR), env=env, close_fds=True, **popen_kwargs(flags))
                # its exit status is collected by a thread of its own, so it never lingers as a zombie
                threading.Thread(target=supervisor.wait, name=f"reap {job_id}", daemon=True).start()
                note_supervisor(store, job_id, supervisor.pid)
                record_detach_mode(store, attempt == 0)
                return record
            except OSError as exc:
                failure = exc
    record.change_state(JobState.ERROR, f"the supervisor could not start: {failure}")
    try:
        store.write(record)
        store.clear_active(job_id)
    except OSError as exc:
        raise Refused(f"the supervisor could not start ({failure}), and the jobs folder refuses writes "
                      f"({disk_error(exc)})") from None
    return record


def note_supervisor(store: JobStore, job_id: str, pid: int) -> None:
    """The supervisor's identity in its record as soon as it is started, so a supervisor that dies before
    its own first write is seen gone at once (orphaned), not after START_GRACE_S. Best effort: the supervisor
    writes itself there too."""
    try:
        started = ProcessId.of(psutil.Process(pid))
    except psutil.Error:
        return
    with contextlib.suppress(OSError, LockTimeout, DamagedRecord, Refused):
        store.update(job_id, lambda record: None if record.supervisor else setattr(record, "supervisor", started))


def record_detach_mode(store: JobStore, survives_host: bool) -> None:
    """Remember whether jobs outlive the host (Windows job objects may forbid breakaway) for hermes_health.
    Best effort: the job has started by now, and a failure here must not make the launch look failed."""
    recorded = read_json(store.detach_path)
    if isinstance(recorded, dict) and recorded.get("survives_host") == survives_host:
        return
    with contextlib.suppress(OSError):
        write_atomic(store.detach_path, json.dumps({"survives_host": survives_host}).encode())


def drop_worktree(store: JobStore, job_id: str) -> None:
    """Retention of a worktree job: its worktree, branch and ref go with it (best effort: a repository that
    is gone or busy leaves its branch; the folder in the jobs folder goes regardless)."""
    import shutil

    try:
        worktree = worktree_of(store, store.read(job_id))
    except (Refused, DamagedRecord):
        worktree = None
    if worktree:
        with contextlib.suppress(GitFailed, LockTimeout, OSError):
            remove_worktree(store, worktree, branch_too=True, job_id=job_id)
    shutil.rmtree(store.worktree_path(job_id), ignore_errors=True)


def worktree_count(store: JobStore) -> str:
    """hermes_health's count of the worktrees the bridge keeps, and where."""
    folder = store.root / "worktrees"
    try:
        count = sum(1 for entry in os.scandir(folder) if entry.is_dir(follow_symlinks=False))
    except OSError:
        count = 0
    return (f"{count} kept in {shown(str(folder))} (each until hermes_land merges or discards it, or retention "
            "removes its job)")


def recover_worktrees(cfg: Config) -> int:
    """At a server's start: a worktree whose job ended without saving its work (its supervisor died) has it
    saved now, as the patch, the ref and the record's DIFF, then is unlocked (retention or hermes_land removes
    it); nothing of a job still running is touched. Returns how many were saved."""
    store = JobStore.of(cfg)
    try:
        job_ids = [entry.name for entry in os.scandir(store.root / "worktrees") if JOB_ID_RE.fullmatch(entry.name)]
    except OSError:
        return 0
    saved = 0
    for job_id in job_ids:
        try:
            view = observe(store.read(job_id), store.root)
        except (Refused, DamagedRecord):
            continue
        record = view.record
        worktree = worktree_of(store, record)
        if not worktree or "work" in worktree or view.running or running_process(record.hermes) is not None:
            continue
        try:
            save_worktree_work(store, record)
            git(worktree["repo"], "worktree", "unlock", worktree["path"], check=False)
        except (GitFailed, OSError) as exc:
            audit(cfg, event="worktree", job_id=job_id, problem=f"its work could not be saved: {exc}")
            continue

        def keep(stored: JobRecord, found: JobRecord = record) -> None:
            stored.worktree, stored.diff, stored.changes = found.worktree, found.diff, found.changes
        store.update(job_id, keep, final_too=True)
        audit(cfg, event="worktree", job_id=job_id, saved=record.diff)
        saved += 1
    return saved


def prune_jobs(store: JobStore, cfg: Config) -> int:
    """Remove finished jobs past retention_days or beyond retention_max_jobs; never a running one. An
    orphaned job (its supervisor and its Hermes gone) counts as finished.

    Runs under the launch lock, where every unfinished job has its active marker, so only their records are
    read."""
    active = set(store.active_ids())
    dead = {job_id for job_id, view, _ in store.views(sorted(active, key=job_sort_key))
            if view is not None and view.state is JobState.ORPHANED and running_process(view.record.hermes) is None}
    finished = [job_id for job_id in store.list_ids() if job_id not in active or job_id in dead]

    def stamp(seconds_ago: float) -> str:
        return time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() - seconds_ago))
    cutoff, recent = stamp(cfg.retention_days * 86400), stamp(60)
    excess = max(0, len(finished) - cfg.retention_max_jobs)
    # A job of the last minute is kept whatever the count: its id could otherwise be claimed again.
    doomed = [job_id for i, job_id in enumerate(finished) if (i < excess or job_id < cutoff) and job_id < recent]
    removed = 0
    for job_id in doomed:
        try:
            drop_worktree(store, job_id)
            store.clear_active(job_id)
            store.remove(job_id)
            removed += 1
        except OSError:  # left for a later launch; pruning must never block one
            continue
    return removed


# ----------------------------------------------------------------------------------------- rendering [server]
RUNNING_TAIL_CHARS = 2000


def log_excerpt(path: Path, max_chars: int) -> str:
    """The end of a log, bounded by max_chars, saying how much was cut and how to read the rest."""
    tail, size = read_tail(path, max_chars * 4)
    raw = tail.decode("utf-8", "replace")
    start = 0
    if len(clean_text(tail)) > max_chars:  # keep the longest end of the raw text whose clean form fits
        low, high = 0, len(raw)
        while low < high:
            middle = (low + high) // 2
            if len(clean_str(raw[middle:])) <= max_chars:
                high = middle
            else:
                low = middle + 1
        start = low
    text = clean_str(raw[start:])
    kept_bytes = len(tail) if start == 0 else len(raw[start:].encode("utf-8", "replace"))
    hidden = size - kept_bytes
    if hidden <= 0:
        return text if text else "(no output)"
    return (f"[cut: the first {hidden} of {size} bytes are not shown; read them with "
            f"hermes_read(path=\"{shown(str(path))}\", offset=0, max_bytes=...)]\n...{text}")


def elapsed_s(record: JobRecord, running: bool) -> int:
    """How long Hermes has run (or ran): the supervisor's own monotonic measure once it ended, the shared
    machine clock while it runs; wall-clock differences only for records of older bridges."""
    if not running and record.duration_s is not None:
        return max(0, int(record.duration_s))
    if running and record.started_clock is not None:
        return max(0, int(machine_clock() - record.started_clock))
    if running and record.started_at is None and record.created_clock is not None:
        return max(0, int(machine_clock() - record.created_clock))
    start = record.started_at or record.created_at or time.time()
    end = record.ended_at or time.time()
    return max(0, int(end - start))


@dataclasses.dataclass
class JobDetails:
    """What Hermes' session store (and the record) say about a job beyond its state, for one status block."""

    activity: str | None = None
    current_tool: str | None = None
    usage: str | None = None
    answer: str | None = None

    def progress_line(self, job_id: str) -> str:
        tool = f"; {self.current_tool}" if self.current_tool and self.current_tool != "none yet" else ""
        return f"job {job_id} is running: {self.activity}{tool}"


def job_details(cfg: Config, view: JobView) -> JobDetails:
    """One short read of the session store: live counters and the current tool while the job runs; the
    usage and Hermes' own answer when it has ended. Never raises: an unreadable store is 'unavailable'."""
    record = view.record
    started = record.started_at
    if started is None:
        reason = "unavailable: Hermes has not started yet" if view.running else "unavailable: Hermes never started"
        return JobDetails(activity=reason, usage=reason, answer=reason)
    if record.acp is not None:
        return acp_details(record, view.running)
    kept_usage = None
    if not view.running and record.usage:
        with contextlib.suppress(TypeError):
            kept_usage = Usage(**record.usage).line()
    try:
        return read_store(cfg, lambda db: store_details(db, view, started, kept_usage))
    except StoreUnavailable as exc:
        unavailable = f"unavailable: {exc}"
        return JobDetails(activity=unavailable, usage=kept_usage or unavailable, answer=unavailable)


def store_details(db: Any, view: JobView, started: float, kept_usage: str | None) -> JobDetails:
    """The session store's part of job_details: live counters and the current tool of a running job, or the
    usage (the record's own copy first) and Hermes' answer of an ended one."""
    record = view.record
    session = record.session_id or record.session_requested
    if not session and view.running and record.cwd:
        session, why = matched_session(db, record.cwd, started)
        if not session:
            raise StoreUnavailable(why)
    if not session:
        raise StoreUnavailable(record.session_source or "no session was captured")
    usage = session_usage(db, session)
    if view.running:
        return JobDetails(activity=usage.line() if usage else f"unavailable: no session {session} in the store yet",
                          current_tool=current_tool(db, session, started, time.time()) or "none yet")
    return JobDetails(usage=kept_usage or (usage.line() if usage else f"unavailable: no session {session}"),
                      answer=final_answer(db, session, started) or "unavailable: Hermes wrote no reply")


def acp_details(record: JobRecord, running: bool) -> JobDetails:
    """The activity of a job driven over ACP, from Hermes' own events as the supervisor kept them."""
    acp = cast(dict[str, Any], record.acp)
    context = (f", context {int(acp['context_used']):,} / {int(acp['context_size']):,} tokens"
               if is_number(acp.get("context_used")) and is_number(acp.get("context_size")) else "")
    activity = f"{plural(int(acp.get('tool_calls', 0)), 'tool call')}{context}"
    tool = None
    if isinstance(acp.get("tool"), str):
        started = acp.get("tool_started")
        seconds = int(time.time() - cast(float, started)) if is_number(started) else 0
        status = acp.get("tool_status")
        tool = f"{acp['tool']} ({status if status in ('completed', 'failed') else f'running {seconds} s'})"
    if is_number(acp.get("tokens_in")) and is_number(acp.get("tokens_out")):
        usage = f"{activity}, tokens in {int(acp['tokens_in']):,} / out {int(acp['tokens_out']):,}"
    else:
        usage = f"{activity}, tokens unavailable: Hermes reported none"
    answer = acp.get("answer") if isinstance(acp.get("answer"), str) else None
    if running:
        return JobDetails(activity=activity, current_tool=tool or "none yet")
    return JobDetails(usage=usage, answer=answer or "unavailable: Hermes wrote no reply")


def changes_lines(record: JobRecord) -> list[str]:
    changes = record.changes
    if changes is None:
        return []
    if "note" in changes:
        return [f"CHANGED_FILES: {shown(changes['note'])}"]
    lines = [f"CHANGED_FILES: {changes['created']} created, {changes['modified']} modified, "
             f"{changes['deleted']} deleted " + ("(in the worktree, against its base, paths from the repository's top)"
                                                 if record.worktree else "(under CWD, since the job started)")]
    lines += [shown(line, 400) for line in changes["lines"][:CHANGED_LINES]]
    if changes["more"] > 0:
        lines.append(f"... and {changes['more']} more")
    return lines


QUESTIONS_SHOWN = 10


def seconds_left(question: dict[str, Any]) -> int:
    return max(0, int(question["expires_clock"] - machine_clock()))


def deadline_words(question: dict[str, Any]) -> str:
    """When Hermes stops waiting and denies a question by itself, as a person reads it: the clock time and
    how long from now."""
    return (f"Hermes denies this by itself{clock_words(question['expires_at'])} (in {seconds_left(question)} s) if "
            "nobody answers")


def approval_lines(view: JobView) -> list[str]:
    """The questions Hermes waits on, oldest first, each with its id, how long Hermes still waits, and how to
    answer it (at most QUESTIONS_SHOWN; the rest are counted and come next)."""
    pending = view.pending_questions
    job_id = view.record.id
    lines = [f"QUESTIONS_WAITING: {len(pending)} (answer each by its APPROVAL_ID)"] if len(pending) > 1 else []
    for question in pending[:QUESTIONS_SHOWN]:
        approval_id = shown(question["id"], 40)
        lines += [f"APPROVAL_ID: {approval_id}",
                  f"APPROVAL: Hermes asks to {shown(question['what'], 2400)}",
                  f"APPROVAL_WAITS_S: {seconds_left(question)} ({deadline_words(question)})"]
    if len(pending) > QUESTIONS_SHOWN:
        lines.append(f"... and {len(pending) - QUESTIONS_SHOWN} more questions, shown once these are answered")
    if pending:
        lines.append("Ask the user, then answer with hermes_approve(job_id=\"" + job_id + "\", approval_id=<an "
                     "APPROVAL_ID above>, decision=\"allow\" or \"deny\"; \"allow_for_job\" also allows this exact "
                     "command when the job asks again).")
    return lines


def decision_lines(record: JobRecord) -> list[str]:
    """The questions Hermes asked in this job, and who answered what: counts of all, the newest listed."""
    decisions = record.decisions
    counts = record.decided or {}
    total = sum(counts.values()) or len(decisions)
    if not total:
        return []
    by_kind = ", ".join(f"{count} {decision}" for decision, count in sorted(counts.items()))
    lines = [f"APPROVALS: {plural(total, 'question')} answered" + (f" ({by_kind})" if by_kind else "")
             + (f"; the newest {min(20, len(decisions))} listed" if total > 20 else "")]
    lines += [f"- {shown(d['id'], 40)}: {shown(d['what'], 2400)} -> {shown(d['decision'], 20)} by {shown(d['by'], 400)}"
              for d in decisions[-20:]]
    return lines


def spend_line(record: JobRecord) -> list[str]:
    """The job's spend against its budgets, as Hermes' store counted it (a price Hermes does not know is said,
    never shown as zero)."""
    spend = record.spend
    if not spend:
        return []
    tokens = int(spend.get("tokens_in", 0)) + int(spend.get("tokens_out", 0))
    parts = [f"{plural(int(spend.get('api_calls', 0)), 'API call')}"
             + (f" (max_turns {record.max_turns})" if record.max_turns else ""),
             f"tokens {tokens:,}" + (f" of {record.max_tokens:,}" if record.max_tokens else "")]
    if spend.get("priced"):
        parts.append(f"cost ${float(spend.get('cost_usd', 0)):.4f}" + (f" of ${record.max_cost_usd:g}"
                                                                       if record.max_cost_usd else "")
                     + " (Hermes' estimate)")
    else:
        parts.append(f"cost not priced by Hermes ({shown(spend.get('model') or 'its model', 100)})"
                     + ("; max_cost_usd cannot be enforced, the token and turn caps still hold"
                        if record.max_cost_usd else ""))
    return ["SPEND: " + "; ".join(parts)]


def late_answer_lines(record: JobRecord) -> list[str]:
    """Answers that came after their question was decided (a dialog left open past Hermes' deadline): refused
    when they came, listed so nobody takes them for decisions."""
    late = record.late_answers
    if not late:
        return []
    decided = {d["id"]: d for d in record.decisions}
    lines = [f"LATE_ANSWERS: {plural(len(late), 'answer')} came after the question was decided, and were not relayed"]
    for answer in late:
        earlier = decided.get(answer["id"])
        before = (f" (it was decided: {shown(earlier['decision'], 20)} by {shown(earlier['by'], 200)}"
                  f"{clock_words(earlier.get('at'))})" if earlier else "")
        lines.append(f"- {shown(answer['id'], 40)}: {shown(answer['decision'], 20)} by {shown(answer['by'], 100)}"
                     f"{clock_words(answer['at'])}{before}")
    return lines


ANSWER_PREFIX = "| "


def quoted_answer(answer: str, max_chars: int) -> list[str]:
    """Hermes' reply as lines of its section: escapes and control characters removed as in the log tail,
    every line (U+2028 and U+2029 break lines too) behind ANSWER_PREFIX, so no text of Hermes can pass for a
    field line such as STATUS: or JOB_ID:. Cut at max_chars, saying how much."""
    text = clean_str(answer).strip("\n")  # ACP's answer can open with blank lines: a reply starts at its text
    cut = len(text) - max_chars
    lines = [ANSWER_PREFIX + line for line in text[:max_chars].splitlines()] or [ANSWER_PREFIX]
    if cut > 0:
        lines.append(f"[cut: {cut} more characters]")
    return lines


def worktree_lines(record: "JobRecord") -> list[str]:
    """WORKTREE, DIFF, PATCH and LANDED lines of a worktree job."""
    worktree = record.worktree
    if not worktree:
        return []
    origin = "the working tree at launch" if worktree.get("from") == "working-tree" else "HEAD at launch"
    submodules = worktree.get("submodules")
    lines = [f"WORKTREE: {shown(worktree['path'])} (branch {shown(worktree['branch'])}, base "
             f"{shown(worktree['base'])[:12]}, {origin}, in repository {shown(worktree['repo'])}"
             + (f"; submodules {shown(str(submodules), 300)}" if submodules not in (None, "none", "present") else "")
             + ")"]
    diff = record.diff
    if diff:
        lines.append(f"DIFF: {plural(int(diff['files']), 'file')} changed, +{int(diff['insertions'])} "
                     f"-{int(diff['deletions'])} against the base (the job's commits and its uncommitted changes)")
        lines.append(f"PATCH: {shown(str(diff['patch']))} ({human_size(int(diff['patch_bytes']))}; read it with "
                     "hermes_read, page by page)")
    landed = record.landed
    if landed:
        lines.append(f"LANDED: {shown(str(landed['action']))}{clock_words(landed.get('at'))}: "
                     f"{shown(str(landed['how']), 600)}")
    elif record.state in FINAL_STATES and diff:
        lines.append(f'LAND: not yet. hermes_land(job_id="{record.id}", action="merge") applies it to '
                     f"{shown(worktree['repo'])}; \"discard\" drops it; \"keep\" leaves it for retention")
    return lines


def render_status(view: JobView, cfg: Config, notes: list[str] | None = None,
                  details: JobDetails | None = None) -> str:
    """The status block. The log shown is always the job's own <id>.log in the store, never a path taken
    from the record, and every value that came from disk is shown escaped."""
    record = view.record
    notes = list(notes or [])
    if record.cwd_note:
        notes.insert(0, record.cwd_note)
    log = JobStore.of(cfg).log_path(record.id)
    head = [f"STATUS: {view.shown_state}", f"JOB_ID: {record.id}"]
    body = running_lines(view, log, details) if view.running else final_lines(view, cfg, log, details)
    note_lines = [f"NOTE: {shown(note, 1000)}" for note in notes]
    return "\n".join(head + body[0] + note_lines + body[1])


def running_lines(view: JobView, log: Path, details: JobDetails | None) -> tuple[list[str], list[str]]:
    """A running job's lines before the notes, and after them."""
    record = view.record
    lines = [f"CWD: {shown(record.cwd, 1000)}", f"ELAPSED_S: {elapsed_s(record, view.running)}",
             f"TIMEOUT_S: {record.timeout_s:g} (hard cap we enforce)", f"FULL_LOG: {shown(str(log))}"]
    if view.condition:
        lines.append(f"CONDITION: {shown(view.condition, 600)}")
    lines += spend_line(record) + worktree_lines(record)
    if details:
        lines.append(f"ACTIVITY: {shown(details.activity, 400)}")
        if details.current_tool:
            lines.append(f"CURRENT_TOOL: {shown(details.current_tool, 400)}")
    lines += approval_lines(view) + decision_lines(record)
    over = record.hermes is not None and view.condition is not None and view.condition.startswith("Hermes has exited")
    first = ("Hermes has ended; the job's outcome is not written yet. This is NOT a failure." if over
             else "Still running. This is NOT a failure and NOT a timeout.")
    return lines, [first, f'Collect the result with hermes_status(job_id="{record.id}").',
                   "Do not re-run the task -- it is already executing.",
                   "--- OUTPUT SO FAR (tail) ---", log_excerpt(log, RUNNING_TAIL_CHARS)]


def final_lines(view: JobView, cfg: Config, log: Path, details: JobDetails | None) -> tuple[list[str], list[str]]:
    """An ended job's lines before the notes, and after them: advice, usage, changes, answer, output."""
    record = view.record
    exit_code, session = record.exit_code, record.session_id
    lines = [f"EXIT_CODE: {'none' if exit_code is None else exit_code}",
             f"SESSION_ID: {shown(session) if session else 'none captured'}",
             f"CWD: {shown(record.cwd, 1000)}", f"ELAPSED_S: {elapsed_s(record, view.running)}",
             f"FULL_LOG: {shown(str(log))}"]
    if view.reason and view.state is not JobState.OK:
        lines.append(f"REASON: {shown(view.reason, 2000)}")
    elif view.state is JobState.OK:
        lines.append("REASON: Hermes finished its turn" + (f" (exit {exit_code})" if exit_code is not None else ""))
    if advice := retry_advice(view.state, view.reason or ""):
        lines.append(f"RETRY: {advice}")
    if not session and record.session_source:
        lines.append(f"SESSION_NOTE: none captured: {shown(record.session_source, 1000)}")
    if record.session_note:
        lines.append(f"SESSION_NOTE: {shown(record.session_note, 1000)}")
    if record.swept:
        lines.append(f"STOPPED: {shown(record.swept, 1000)}")
    if record.outcome_note:
        lines.append(f"OUTCOME_NOTE: {shown(record.outcome_note, 600)}")
    lines += decision_lines(record) + late_answer_lines(record)
    after: list[str] = []
    if view.state is JobState.ORPHANED:
        after.append(f'Stop what is left with hermes_cancel(job_id="{record.id}").')
    if view.state in PART_DONE_STATES:
        after.append("Work may be part-done: inspect the files with hermes_read before re-running.")
    if details:
        after.append(f"USAGE: {shown(details.usage, 400)}")
    after += spend_line(record)
    after += changes_lines(record) + worktree_lines(record)
    if details:
        after += ["--- HERMES ANSWER ---", *quoted_answer(details.answer or "", cfg.max_output_chars)]
    return lines, after + ["--- HERMES OUTPUT ---", log_excerpt(log, cfg.max_output_chars)]


@dataclasses.dataclass
class ToolResult:
    """What a tool answers, and what its audit line records: taken from these fields, never parsed back out
    of the text (which quotes files and Hermes' output)."""

    text: str
    status: str = "ok"
    job_id: str | None = None
    cwd: str | None = None
    reason: str | None = None
    facts: dict[str, Any] | None = None  # the same facts as fields (structuredContent), for the job view

    @property
    def is_error(self) -> bool:
        return self.status in ("refused", "error")


def status_result(view: JobView, cfg: Config, notes: list[str] | None = None) -> ToolResult:
    """The status block with what the session store adds; reads the disk, so it runs off the event loop."""
    record = view.record
    details = job_details(cfg, view)
    text = render_status(view, cfg, notes, details)
    return ToolResult(text, view.shown_state, record.id, record.cwd, None if view.running else view.reason,
                      job_facts(view, details, notes or []))


def job_facts(view: JobView, details: JobDetails, notes: list[str]) -> dict[str, Any]:
    """What the status block says, as fields (the structuredContent a job view renders); every text that came
    from disk or from Hermes escaped as in the block."""
    record = view.record
    questions = [{"id": shown(q["id"], 40), "what": shown(q["what"], 2400), "expires_at": q["expires_at"],
                  "seconds_left": seconds_left(q), "deadline": deadline_words(q)}
                 for q in view.pending_questions[:QUESTIONS_SHOWN]]
    changes = record.changes or {}
    return {"job_id": record.id, "status": view.shown_state, "running": view.running,
            "cwd": shown(record.cwd, 1000), "elapsed_s": elapsed_s(record, view.running),
            "timeout_s": record.timeout_s,
            "deadline_at": (record.started_at or record.created_at) + record.timeout_s if view.running else None,
            "reason": shown(view.reason, 2000) if view.reason and not view.running else None,
            "activity": shown(details.activity, 400) if details.activity else None,
            "current_tool": shown(details.current_tool, 400) if details.current_tool else None,
            "spend": (spend_line(record) or [""])[0].removeprefix("SPEND: ") or None,
            "changes": {"created": changes.get("created", 0), "modified": changes.get("modified", 0),
                        "deleted": changes.get("deleted", 0),
                        "lines": [shown(line, 400) for line in changes.get("lines", [])[:CHANGED_LINES]],
                        "note": shown(changes["note"]) if "note" in changes else None},
            "answer": clean_str(details.answer[:20000]) if details.answer and not view.running else None,
            "questions": questions, "worktree": [line.split(": ", 1) for line in worktree_lines(record)],
            "landable": bool(record.worktree and record.diff and not record.landed and not view.running),
            "notes": [shown(note, 1000) for note in notes]}


def refused_result(reason: str) -> ToolResult:
    return ToolResult(f"STATUS: refused\nREASON: {reason}\nNothing was started.", "refused", reason=reason)


# --------------------------------------------- tool logic: arguments and the launch request (no MCP) [server]
@dataclasses.dataclass(frozen=True)
class Noted(Generic[T]):
    """What a check found, with what to tell the caller about it (a clamp, a folder that moved): returned,
    never appended to a list the caller passed in."""

    value: T
    notes: tuple[str, ...] = ()


def clamp_number(name: str, value: float | None, default: float, low: float, high: float) -> Noted[float]:
    """A number argument brought into range, with a note when it was changed; NaN is refused."""
    if value is None:
        return Noted(default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise Refused(f"{name} must be a number, got {value!r}")
    clamped = min(max(value, low), high)
    return Noted(clamped, (f"{name}={value:g} was clamped to {clamped:g}",) if clamped != value else ())


def names_argument(name: str, value: list[str] | str | None) -> list[str]:
    """skills/toolsets: a list of names or one comma-separated string."""
    if value is None or value == "" or value == []:
        return []
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list):
        raise Refused(f"{name} must be a list of names or a comma-separated string")
    names = [item.strip() if isinstance(item, str) else item for item in items]
    bad = [repr(n)[:40] for n in names if not isinstance(n, str) or not NAME_RE.fullmatch(n)]
    if bad:
        raise Refused(f"{name} has names that are not valid: {', '.join(bad)}; use names like "
                      "'github-pr-workflow' (see hermes_capabilities)")
    return names


def check_task(task: Any) -> str:
    if not isinstance(task, str) or not task.strip():
        raise Refused("task is empty: describe the work, with absolute paths and a definition of done")
    if "\x00" in task:
        raise Refused("task contains a NUL byte, which cannot reach Hermes; remove it")
    try:
        size = len(task.encode("utf-8"))
    except UnicodeEncodeError:
        size = -1
    if size < 0 or "\ufffd" in task:
        raise Refused("task contains invalid Unicode (a lone surrogate, or U+FFFD where text was lost in "
                      "decoding); send plain UTF-8 text")
    if size > MAX_TASK_BYTES:
        raise Refused(f"task is {size} bytes, more than the {MAX_TASK_BYTES} the bridge accepts; write the "
                      "details to a file under cwd and tell Hermes to read it")
    return task


def check_launch(cfg: Config, exe: str, request: JobRequest) -> None:
    """The last launch check, once everything else is valid: the command line fits. The first launch with a
    new Hermes probes it here (off the event loop), so a task too long for its command line is refused before
    anything starts."""
    plan_launch(cfg, exe, request.record("<id>"), request.task, request.cwd, probe=probe_cli_safely)


def probe_cli_safely(cfg: Config, exe: str) -> HermesCli | None:
    """A probe that fails leaves the question to the supervisor, which reports it with the job."""
    try:
        return probe_cli(cfg, exe)
    except (OSError, subprocess.SubprocessError):
        return None


@dataclasses.dataclass
class LaunchArguments:
    """What a host sent to hermes_run or hermes_resume, as sent: job_request checks every field and makes the
    JobRequest, or refuses naming the field and the fix."""

    task: Any
    cwd: Any = None
    max_turns: Any = None
    timeout_s: Any = None
    skills: Any = None
    toolsets: Any = None
    max_tokens: Any = None
    max_cost_usd: Any = None
    isolation: Any = None
    isolation_base: Any = None


def budget(name: str, value: Any, default: float | None, ceiling: float | None, whole: bool) -> Noted[float | None]:
    """A budget argument: positive (a whole number for tokens), the config's default when not given, clamped to
    the config's ceiling with a note, as timeout_s is."""
    if value is None:
        value = default
    elif isinstance(value, bool) or not isinstance(value, (int, float)) or (whole and not isinstance(value, int)) \
            or not math.isfinite(value) or value <= 0:
        raise Refused(f"{name} must be a positive {'whole number' if whole else 'number'}, got {shown(value)}")
    if value is None or ceiling is None or value <= ceiling:
        return Noted(value)
    return Noted(ceiling, (f"{name}={value:g} was clamped to {ceiling:g} (the config's ceiling)",))


def job_request(cfg: Config, kind: str, arguments: LaunchArguments, session: str | None = None,
                cwd_note: str | None = None, resumed: dict[str, Any] | None = None) -> Noted[JobRequest]:
    """Validate everything about a launch before anything touches the disk or starts a process: the
    request, with what to tell about it (a clamped timeout). resumed: the worktree a resumed session runs in
    (its folder, in the jobs folder, is confined to that worktree instead of the roots)."""
    task = check_task(arguments.task)
    resolved_cwd = os.path.realpath(arguments.cwd) if resumed else confine_cwd(cfg, arguments.cwd)
    max_turns, timeout_s = arguments.max_turns, arguments.timeout_s
    if max_turns is not None and (isinstance(max_turns, bool) or not isinstance(max_turns, int)
                                  or not 1 <= max_turns <= 1000):
        raise Refused(f"max_turns must be a whole number from 1 to 1000, got {shown(max_turns)}")
    if timeout_s is not None and (not isinstance(timeout_s, (int, float)) or math.isnan(timeout_s)
                                  or timeout_s <= 0):
        raise Refused(f"timeout_s must be a positive number of seconds, got {shown(timeout_s)}")
    timeout = clamp_number("timeout_s", timeout_s, cfg.default_timeout_s, 1, cfg.max_timeout_s)
    tokens = budget("max_tokens", arguments.max_tokens, cfg.default_max_tokens, cfg.max_tokens_limit, whole=True)
    cost = budget("max_cost_usd", arguments.max_cost_usd, cfg.default_max_cost_usd, cfg.max_cost_usd_limit,
                  whole=False)
    exe = usable_hermes(cfg)
    driver, _ = choose_driver(cfg, exe, session)
    isolation = (Noted(resumed) if resumed else
                 isolation_of(cfg, arguments.isolation, arguments.isolation_base, resolved_cwd))
    request = JobRequest(kind=kind, task=task, cwd=resolved_cwd, max_turns=max_turns or cfg.default_max_turns,
                         timeout_s=timeout.value, skills=names_argument("skills", arguments.skills),
                         toolsets=names_argument("toolsets", arguments.toolsets), session_requested=session,
                         cwd_note=cwd_note, driver=driver, approval_mode=cfg.approval_mode,
                         max_tokens=int(tokens.value) if tokens.value is not None else None, max_cost_usd=cost.value,
                         worktree=isolation.value)
    check_launch(cfg, exe, request)
    return Noted(request, timeout.notes + tokens.notes + cost.notes + isolation.notes)


def isolation_of(cfg: Config, isolation: Any, base: Any, cwd: str) -> Noted[dict[str, Any] | None]:
    """isolation and isolation_base checked: None for a job in its folder; for a worktree job, its repository
    and base as they are now, with what the user should know (uncommitted work the worktree will not have)."""
    isolation = cfg.default_isolation if isolation is None else isolation
    if isolation not in ISOLATIONS:
        raise Refused(f'isolation must be "none" or "worktree", got {shown(isolation, 40)}')
    if base is not None and base not in ISOLATION_BASES:
        raise Refused(f'isolation_base must be "head" or "working-tree", got {shown(base, 40)}')
    if isolation == "none":
        if base is not None:
            raise Refused('isolation_base applies to isolation "worktree" only')
        return Noted(None)
    repo = repository_of(cwd)
    if not within_any(repo.top, cfg.roots):
        raise Refused(f"cwd {shown(cwd)} is in the repository {shown(repo.top)}, whose top is outside the allowed "
                      f"roots ({', '.join(cfg.roots)}): its worktree, and a merge of its work, would reach files "
                      "outside them. Allow the repository's folder, or use isolation \"none\"")
    notes = []
    if repo.uncommitted and base != "working-tree":
        notes.append(f"the repository has {plural(repo.uncommitted, 'path')} with uncommitted or untracked changes, "
                     "which the worktree (based on HEAD) does not have; isolation_base 'working-tree' carries them")
    notes.append("a worktree holds what git tracks: ignored files (.env, node_modules, build output) and nested "
                 "repositories are not in it" + ("; its submodules are initialised in it" if repo.submodules else ""))
    planned = {"repo": repo.top, "base": repo.head, "head": repo.head, "base_branch": repo.branch or "",
               "subdir": repo.subdir, "from": base or "head", "submodules": "present" if repo.submodules else "none"}
    return Noted(planned, tuple(notes))


def check_session_id(session_id: Any) -> str:
    if not isinstance(session_id, str) or not session_id.strip():
        raise Refused('session_id is empty: give a session id from a SESSION_ID line, or "latest"')
    if not SESSION_NAME_RE.fullmatch(session_id):
        raise Refused(f"session_id '{shown(session_id, 60)}' is not a session id: ids start with a letter or "
                      "digit and look like 20261130_104857_89284b")
    return session_id


# -------------------------------------------------------------------- tool logic: resuming a session [server]
def session_home(cfg: Config, store: JobStore, session_id: str) -> tuple[str, str | None]:
    """The folder a resume of this session runs in (Hermes restores it whatever we ask), and a note when
    it had to come from the bridge job that captured the session because the store could not answer."""
    try:
        return session_folder(cfg, session_id), None
    except StoreUnavailable as exc:
        folder = store.captured_session_folder(session_id)
        if folder is None:
            raise Refused(f"cannot tell where session {session_id} would run: {exc}. Hermes resumes a session in "
                          "the folder recorded for it, so the bridge resumes only sessions whose folder it can "
                          "check. Start a fresh hermes_run instead") from None
        return folder, (f"Hermes' session store could not answer ({exc}); the folder is that of the bridge job "
                        "that captured this session")


def resolve_resume(cfg: Config, session_id: Any, cwd: str | None
                   ) -> Noted[tuple[str, str, dict[str, Any] | None]]:
    """The session to resume and the folder it will really run in, confined, with what to tell about that
    folder; refused when it is outside today's roots. "latest" is the newest captured session whose folder
    is inside them."""
    confine_cwd(cfg, None)  # no roots configured: refused here, with the fix
    store = JobStore.of(cfg)
    if session_id == "latest":
        for candidate in store.captured_sessions():
            try:
                folder, note = session_home(cfg, store, candidate)
            except Refused:
                continue
            if within_any(os.path.realpath(folder), cfg.roots) and os.path.isdir(folder):
                session = candidate
                break
        else:
            raise Refused('session_id "latest": no session captured by this bridge is recorded in a folder inside '
                          "today's allowed roots; give a session id, or start a fresh hermes_run")
    else:
        session = check_session_id(session_id)
        folder, note = session_home(cfg, store, session)
    real = os.path.realpath(folder)
    worktree = resumed_worktree(cfg, store, real)
    if worktree is not None:
        notes = [note] if note else []
        return Noted((session, real, worktree), (*notes, f"the session is worktree job {worktree['job']}'s: this job "
                                                 f"runs in its worktree, on branch {worktree['branch']}"))
    if not within_any(real, cfg.roots):
        raise Refused(f"session {session} is recorded in {shown(folder)}, outside the allowed roots "
                      f"({', '.join(cfg.roots)}). Hermes always resumes a session in its recorded folder, so this "
                      "session cannot be resumed through the bridge; start a fresh hermes_run instead")
    if not os.path.isdir(real):
        raise Refused(f"session {session} is recorded in {shown(folder)}, which no longer exists; start a fresh "
                      "hermes_run instead")
    notes = [note] if note else []
    if cwd not in (None, "") and not (isinstance(cwd, str) and same_folder(os.path.expanduser(cwd), real)):
        notes.append(f"Hermes resumes a session in the folder recorded for it, so this job runs in {shown(real)}, "
                     f"not in the cwd asked for ({shown(cwd)})")
    return Noted((session, real, None), tuple(notes))


def resumed_worktree(cfg: Config, store: JobStore, folder: str) -> dict[str, Any] | None:
    """The worktree a session recorded in a worktree job's folder runs in again (remade from its branch when
    it was removed), or None for a folder outside the bridge's worktrees. Refused when its work was discarded,
    or its repository is no longer inside the allowed roots."""
    worktrees = os.path.realpath(store.root / "worktrees")
    if not within_any(folder, [worktrees]) or folder == worktrees:
        return None
    job_id = Path(os.path.relpath(folder, worktrees)).parts[0]
    try:
        owner = store.read(validate_job_id(job_id))
    except (Refused, DamagedRecord) as exc:
        raise Refused(f"the session is recorded in {shown(folder)}, the worktree of job {shown(job_id)}, whose "
                      f"record cannot be read ({exc}); start a fresh hermes_run") from None
    worktree = owner.worktree
    if not worktree or os.path.realpath(worktree["path"]) != os.path.join(worktrees, job_id):
        raise Refused(f"the session is recorded in {shown(folder)}, which job {job_id}'s record does not name as its "
                      "worktree; start a fresh hermes_run")
    if not within_any(worktree["repo"], cfg.roots):
        raise Refused(f"job {job_id}'s repository {shown(worktree['repo'])} is outside today's allowed roots; the "
                      "session cannot be resumed through the bridge")
    if not os.path.isdir(worktree["path"]) and git(worktree["repo"], "rev-parse", "--verify", "--quiet",
                                                   f"refs/heads/{worktree['branch']}", check=False).returncode:
        raise Refused(f"job {job_id}'s worktree and its branch {worktree['branch']} were discarded: the session's "
                      "work is gone from the repository (its patch may remain); start a fresh hermes_run")
    return {key: value for key, value in worktree.items() if key != "work"} | {"job": job_id}


# -------------------------------------- tool logic: one job (view, approve, cancel) and the job list [server]
JOBS_SCAN_LIMIT = 5000


def job_view(cfg: Config, job_id: Any) -> JobView:
    job_id = validate_job_id(job_id)
    try:
        store = JobStore.of(cfg)
        return observe(store.read(job_id), store.root)
    except DamagedRecord as exc:
        raise Refused(f"the record of job {job_id} is damaged ({exc}); its log may still be read with "
                      f"hermes_read(path=\"{JobStore.of(cfg).log_path(job_id)}\")") from None


APPROVAL_ID_RE = re.compile(r"\d{1,7}-[0-9a-f]{6}")


def answer_approval(cfg: Config, job_id: Any, approval_id: Any, decision: Any, by: str) -> JobView:
    """Relay an answer to a question a job waits on: claimed exclusively under the record's lock (the
    question must be pending, unexpired and not answered by anyone yet: a second answer is refused naming
    the first), then written where the job's supervisor reads it (any server process may answer)."""
    if decision not in ANSWER_DECISIONS:
        raise Refused(f"decision must be \"allow\", \"allow_for_job\" or \"deny\", got {shown(decision, 40)}")
    if not isinstance(approval_id, str) or not APPROVAL_ID_RE.fullmatch(approval_id):
        raise Refused(f"approval_id {shown(approval_id, 40)} is not an approval id: take it from the APPROVAL_ID "
                      "line of hermes_status")
    job_id = validate_job_id(job_id)
    store = JobStore.of(cfg)
    try:
        with store.record_lock(job_id):
            view = job_view(cfg, job_id)
            claim_answer(store, view, approval_id, decision, by)
    except LockTimeout:
        raise Refused(f"job {job_id}'s record is held by another process; answer again in a moment") from None
    except OSError as exc:
        raise Refused(f"the answer could not be written: the jobs folder refuses writes ({disk_error(exc)}); "
                      "the question still waits for an answer") from None
    audit(cfg, event="approval", job_id=job_id, approval_id=approval_id, decision=decision, by=by)
    return view


def claim_answer(store: JobStore, view: JobView, approval_id: str, decision: str, by: str) -> None:
    """The claim itself, under the record's lock: refused (naming what decided the question, when and by whom)
    unless this question waits and nobody answered it; an answer to a question already decided is kept as a
    late answer, which the final block lists. A planted non-file at the answers' name is moved aside, so the
    question stays answerable."""
    record = view.record
    decided = next((d for d in reversed(record.decisions) if d["id"] == approval_id), None)
    claims, late = store.answers_file(record.id)
    first = claims.get(approval_id)
    if decided or first:
        earlier = decided or {**cast(dict[str, Any], first), "by": ANSWERERS.get(cast(dict[str, Any], first)["by"],
                                                                                   "someone")}
        note_late_answer(store, view, {"id": approval_id, "decision": decision, "by": ANSWERERS.get(by, by),
                                       "at": time.time()})
        raise Refused(f"approval {approval_id} of job {record.id} was decided already: {earlier['decision']} by "
                      f"{earlier['by']}{clock_words(earlier.get('at'))}; this answer ({decision}) was not relayed")
    if not view.running:
        raise Refused(f"job {record.id} has ended ({view.shown_state}); there is no question to answer")
    question = next((q for q in record.questions if q["id"] == approval_id), None)
    if question is None:
        raise Refused(f"approval {approval_id} of job {record.id} is not waiting for an answer: no such question "
                      "was asked")
    if machine_clock() >= question["expires_clock"]:
        note_late_answer(store, view, {"id": approval_id, "decision": decision, "by": ANSWERERS.get(by, by),
                                       "at": time.time()})
        raise Refused(f"approval {approval_id} came too late: Hermes stopped waiting "
                      f"{int(machine_clock() - question['expires_clock'])} s ago and denied it itself")
    path = store.answers_path(record.id)
    if os.path.lexists(path) and not stat.S_ISREG(os.lstat(path).st_mode):
        os.replace(path, path.with_name(f".{path.name}.not-an-answer-{os.urandom(4).hex()}"))
    claims[approval_id] = {"decision": decision, "by": by, "at": time.time()}
    write_atomic(path, json.dumps({**claims, LATE_KEY: late}).encode())


def note_late_answer(store: JobStore, view: JobView, answer: dict[str, Any]) -> None:
    """Keep an answer that came after its question was decided (under the record's lock): in the answers file
    while the job runs (its supervisor copies them into the record at the end), in the record once it ended."""
    record = view.record
    if view.running:
        claims, late = store.answers_file(record.id)
        with contextlib.suppress(OSError):
            write_atomic(store.answers_path(record.id), json.dumps(
                {**claims, LATE_KEY: [*late, answer][-LATE_ANSWERS_KEPT:]}).encode())
        return
    record.late_answers = [*record.late_answers, answer][-LATE_ANSWERS_KEPT:]
    with contextlib.suppress(OSError, DamagedRecord):
        write_atomic(store.record_path(record.id), record.encoded())  # an outcome's note: the outcome stays


def applied_answer(view: JobView, approval_id: str) -> str:
    """What became of a question once answered: the decision the job applied and who took it."""
    decided = next((d for d in reversed(view.record.decisions) if d["id"] == approval_id), None)
    if decided:
        return f"approval {approval_id}: {decided['decision']} by {decided['by']}, applied"
    if any(q["id"] == approval_id for q in view.pending_questions):
        return f"approval {approval_id}: relayed; the job's supervisor has not taken it yet"
    return f"approval {approval_id}: relayed; the job ended before it was applied"


def owned_supervisor(record: JobRecord) -> "psutil.Process | None":
    """The job's recorded supervisor, when it still runs: the same process (pid and start) carrying the job's
    exact marker. A cancel never takes a job for an orphan while this answers."""
    supervisor = running_process(record.supervisor)
    return supervisor if supervisor is not None and carries_marker(supervisor, record.marker) else None


def cancel_orphan(store: JobStore, cfg: Config, view: JobView) -> str:
    """Stop what is left of a job whose supervisor died (or froze), and write the outcome it could not. The
    pids come from the record, so only processes that prove to be this job's are signalled: its Hermes, when
    it still runs and carries the job's exact marker, anchors the rest, and the tools the supervisor recorded
    (same pid and start, the exact marker) are the job's even with Hermes gone. `cancelled` is written only
    once the supervisor and Hermes are proven gone."""
    record = view.record
    job_id = record.id
    supervisor = owned_supervisor(record)
    if supervisor is not None and view.frozen:
        with contextlib.suppress(psutil.Error):
            supervisor.kill()
        still_running([supervisor], 3)
    elif supervisor is not None:
        write_atomic(store.cancel_path(job_id), b"cancel")
        return "its supervisor is alive after all; cancel requested, the supervisor stops the whole process tree"
    hermes = running_process(record.hermes)
    anchors = frozenset({hermes.pid}) if hermes and carries_marker(hermes, record.marker) else frozenset()
    owner = Ownership(record.marker, anchors, tuple(record.tree))
    unproven = [proc.pid for proc in tree_of(hermes, record.tree) if is_alive(proc) and not owner.owns(proc)]
    report = stop_tree(owner, hermes if anchors else None, record.tree, cfg.kill_grace_s)
    if owned_supervisor(record) is not None or (anchors and running_process(record.hermes) is not None):
        return (f"the job's supervisor or Hermes could not be stopped ({report.describe()}); its outcome was not "
                "written. Stop them by hand")
    was = "had frozen and was ended" if supervisor is not None else "had died"
    reason = f"cancelled after its supervisor {was}; {report.describe()}"
    if unproven:
        reason += (f"; pids {unproven[:20]} named by the record do not carry this job's marker and were not "
                   "signalled")
    record.change_state(JobState.CANCELLED, reason, record.exit_code)
    if not store.write(record):
        return "the supervisor wrote the job's outcome first; it stands"
    store.clear_active(job_id)
    audit(cfg, event="job", job_id=job_id, state=JobState.CANCELLED.value, reason=reason)
    return reason


def request_cancel(cfg: Config, job_id: Any) -> tuple[JobView, str]:
    """Ask a job's supervisor to stop it, or stop an orphan directly; returns the view and a note."""
    view = job_view(cfg, job_id)
    store = JobStore.of(cfg)
    if view.state in FINAL_STATES:
        return view, f"the job had already ended as {view.state.value}; nothing to cancel"
    try:
        if view.state is JobState.ORPHANED or view.frozen:
            note = cancel_orphan(store, cfg, view)
            return observe(store.read(view.record.id), store.root), note
        write_atomic(store.cancel_path(view.record.id), str(time.time()).encode())
    except (OSError, LockTimeout) as exc:
        raise Refused(f"the cancel could not be written: the jobs folder refuses writes ({disk_error(exc)}). The job "
                      "goes on; free space on its disk or make it writable, then cancel again") from None
    return view, "cancel requested; the supervisor stops the whole process tree"


LAND_ACTIONS = ("merge", "discard", "keep")


def land_job(cfg: Config, job_id: Any, action: Any) -> tuple[JobView, str]:
    """hermes_land: what becomes of a finished worktree job's work. merge applies it to the repository's main
    tree (a merge of its work when that tree is clean and on the base's branch, else its patch applied
    three-way to the working tree), refusing on a conflict with the tree left as it was; discard drops the
    worktree and its branch; keep leaves both to retention. The same action again answers what was done;
    another after merge or discard is refused. Returns the job and what was done."""
    if action not in LAND_ACTIONS:
        raise Refused(f'action must be "merge", "discard" or "keep", got {shown(action, 40)}')
    view = job_view(cfg, job_id)
    record, store = view.record, JobStore.of(cfg)
    worktree = record.worktree
    if worktree and (worktree_of(store, record) is None or not within_any(os.path.realpath(worktree["repo"]),
                                                                          cfg.roots)):
        raise Refused(f"job {record.id}'s record names a worktree or repository the bridge did not make for it, or "
                      "one outside the allowed roots (was the record changed?); nothing was done")
    if not worktree:
        raise Refused(f"job {record.id} ran in its folder (isolation \"none\"): its changes are already there, "
                      "there is nothing to land")
    if view.running or (view.state is JobState.ORPHANED and running_process(record.hermes) is not None):
        raise Refused(f"job {record.id} is still running: wait for it (hermes_status) or cancel it (hermes_cancel), "
                      "then land it")
    if record.landed:
        if record.landed["action"] == action:
            return view, f"already done{clock_words(record.landed.get('at'))}: {record.landed['how']}"
        if record.landed["action"] != "keep":
            raise Refused(f"job {record.id}'s work was already {record.landed['action']}d"
                          f"{clock_words(record.landed.get('at'))} ({record.landed['how']}); nothing was changed")
    if "work" not in worktree:  # its supervisor died before saving it
        save_worktree_work(store, record)
    if "work" not in worktree and action == "merge":
        raise Refused(f"job {record.id}'s worktree {worktree['path']} is gone and its work was never saved: "
                      "there is nothing to merge")
    try:
        if action == "merge":
            how = merge_work(store, record)
        elif action == "discard":
            how = discard_work(store, record)
        else:
            how = (f"left as it is; retention removes the worktree and its branch {cfg.retention_days:g} days after "
                   "the job (the patch file goes with the job)")
    except GitFailed as exc:
        raise Refused(f"git refused: {exc}; the main tree was left as it was") from None
    except LockTimeout:
        raise Refused("another job or landing is changing this repository; try again in a moment") from None
    landed = {"action": action, "how": how, "at": time.time()}

    def note(stored: JobRecord) -> None:
        stored.landed = landed
        stored.worktree = worktree
        stored.diff = stored.diff or record.diff
        stored.changes = stored.changes or record.changes
    updated = store.update(record.id, note, final_too=True)
    audit(cfg, event="land", job_id=record.id, action=action, how=how)
    return observe(updated or store.read(record.id), store.root), how


def merge_work(store: JobStore, record: JobRecord) -> str:
    """The job's work into the main tree, or Refused naming the conflicting paths with the tree untouched."""
    worktree = cast(dict[str, Any], record.worktree)
    top, work = worktree["repo"], worktree["work"]
    with repo_lock(store, top):
        clean = not git(top, "status", "--porcelain", "-z", "--untracked-files=all").stdout
        branch = git(top, "symbolic-ref", "--quiet", "--short", "HEAD", check=False).stdout.decode().strip()
        on_base = clean and branch and branch == worktree.get("base_branch")
        ours = "HEAD" if on_base else tree_commit(top, "HEAD", store.locks / f"{record.id}.index",
                                                  f"claude-hermes-bridge: the working tree before landing {record.id}")
        merged = git(top, "merge-tree", "--write-tree", "-z", "--name-only", "--no-messages", ours, work, check=False)
        if merged.returncode not in (0, 1):
            raise GitFailed(f"git merge-tree failed (exit {merged.returncode}; it needs git 2.38 or later): "
                            f"{shown(merged.stderr.decode('utf-8', 'replace').strip(), 300)}")
        fields = merged.stdout.decode("utf-8", "replace").split("\0")
        if merged.returncode == 1:
            conflicts = sorted({name for name in fields[1:] if name})
            raise Refused(f"the job's work conflicts with the main tree in {plural(len(conflicts), 'path')}: "
                          f"{', '.join(shown(name, 200) for name in conflicts[:50])}. Nothing was changed; resolve "
                          f"it by hand from the patch ({record.diff['patch'] if record.diff else 'none'}) or resume "
                          "the job to rework it")
        if on_base:
            git(top, "merge", "--no-edit", "-m", f"Merge {worktree['branch']} (claude-hermes-bridge job {record.id})",
                work, env=BRIDGE_IDENTITY if not git_identity(top) else None)
            how = f"merged into {branch} ({git_text(top, 'rev-parse', '--short', 'HEAD')})"
        else:
            patch = git(top, "diff", "--binary", "--no-color", "--no-ext-diff", ours, fields[0]).stdout
            git(top, "apply", "--whitespace=nowarn", "-", given=patch)
            where = "had uncommitted changes" if not clean else f"was on {branch or 'a detached HEAD'}, not on " \
                f"{worktree.get('base_branch') or 'the base'}"
            how = (f"applied three-way to the working tree of {top}, not committed (the main tree {where}); "
                   "review and commit it there")
    remove_worktree(store, worktree, branch_too=False, job_id=record.id)
    return how + f"; the worktree was removed, branch {worktree['branch']} stays until retention"


def git_identity(top: str) -> bool:
    """Whether the repository (or the user) names a committer, as a merge commit needs."""
    return git(top, "config", "user.email", check=False).returncode == 0


def discard_work(store: JobStore, record: JobRecord) -> str:
    worktree = cast(dict[str, Any], record.worktree)
    remove_worktree(store, worktree, branch_too=True, job_id=record.id)
    return f"the worktree and branch {worktree['branch']} were removed (the patch file stays with the job)"


def list_jobs(cfg: Config, limit: int | None, state: str | None) -> str:
    """The newest jobs (bounded by limit and a scan cap), with a total count; damaged records included."""
    store = JobStore.of(cfg)
    clamped = clamp_number("limit", limit, 50, 1, 1000)
    shown_limit = int(clamped.value)
    ids = store.list_ids()
    rows: list[str] = []
    scanned = 0
    for job_id, view, damage in store.views(reversed(ids)):
        if len(rows) >= shown_limit or scanned >= JOBS_SCAN_LIMIT:
            break
        scanned += 1
        if view is None:
            if state in (None, "", "damaged"):
                rows.append(f"{job_id}  damaged            -  record {damage}")
            continue
        if state not in (None, "") and view.shown_state != state:
            continue
        record = view.record
        usage = record.usage
        tokens = (f"  tokens {usage.get('tokens_in', 0):,}/{usage.get('tokens_out', 0):,}"
                  if usage and not view.running else "")
        spent = record.spend or {}
        tokens += f"  cost ${float(spent.get('cost_usd', 0)):.4f}" if spent.get("priced") else ""
        rows.append(f"{job_id}  {view.shown_state:17} {elapsed_s(record, view.running):>5}s  {shown(record.cwd)}  "
                    f"\"{shown(record.task_preview, 60)}\"{tokens}")
    header = [f"JOBS: {len(ids)} on disk; showing {len(rows)}, newest first"
              + (f", state={shown(state, 40)}" if state else "")]
    if scanned >= JOBS_SCAN_LIMIT and len(rows) < shown_limit:
        header.append(f"NOTE: scanned the newest {JOBS_SCAN_LIMIT} records only")
    header += [f"NOTE: {note}" for note in clamped.notes]
    if not ids:
        header.append("No jobs yet. Start one with hermes_run.")
    return "\n".join(header + rows)


# ------------------------------------------------------------- tool logic: reading files and folders [server]
READ_DEFAULT_BYTES = 20000
READ_MAX_BYTES = 262144
DIR_LIMIT = 200


def read_path(cfg: Config, path: Any, max_bytes: int | None, offset: int | None) -> str:
    """A file's byte range or a directory listing, confined, bounded, never hanging on special files.
    What is read is the very thing that was checked: the opened file's device and inode must match the
    confined path, and the path must still resolve to itself, or the read is refused."""
    resolved = confine_read(cfg, path)
    clamped = clamp_number("max_bytes", max_bytes, READ_DEFAULT_BYTES, 1, READ_MAX_BYTES)
    limit = int(clamped.value)
    if offset is not None and (isinstance(offset, bool) or not isinstance(offset, int)):
        raise Refused(f"offset must be a whole number of bytes (negative counts from the end), got {shown(offset)}")
    try:
        checked = os.stat(resolved)
    except OSError as exc:
        raise Refused(f"cannot stat {shown(resolved)}: {exc.strerror or exc}") from None
    is_dir = stat.S_ISDIR(checked.st_mode)
    if not is_dir and not stat.S_ISREG(checked.st_mode):
        raise Refused(f"{shown(resolved)} is not a regular file or folder (a FIFO, device or socket could hang "
                      "or never end), so it is not read")
    if is_dir and IS_WINDOWS:
        return list_folder_by_path(resolved, checked)
    try:
        fd = open_confined(resolved, is_dir)
    except OSError as exc:
        raise Refused(f"cannot open {shown(resolved)} as the file that was checked: {exc.strerror or exc} (a "
                      "symlink swapped in?)") from None
    try:
        opened = os.fstat(fd)
        if (opened.st_dev, opened.st_ino) != (checked.st_dev, checked.st_ino):
            raise Refused(f"{shown(resolved)} changed while it was being opened; try again")
        if is_dir:
            return list_directory(resolved, fd)
        with os.fdopen(os.dup(fd), "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            wanted = offset or 0
            start = min(size, max(0, size + wanted) if wanted < 0 else wanted)
            handle.seek(start)
            data = handle.read(limit)
    finally:
        os.close(fd)
    end = start + len(data)
    header = [f"PATH: {shown(resolved, 1000)}", f"SIZE: {size} bytes", f"RANGE: bytes {start}-{end} of {size}"]
    header += [f"NOTE: {note}" for note in clamped.notes]
    if end < size or start > 0:
        more = f' next: hermes_read(path="{shown(resolved, 1000)}", offset={end})' if end < size else ""
        header.append(f"CUT: yes, {size - len(data)} bytes not shown;{more}")
    else:
        header.append("CUT: no")
    if b"\x00" in data:
        return "\n".join(header + ["BINARY: yes, the content is not text and is not shown"])
    text = data.decode("utf-8", "replace")
    hiding = len(HIDING_RE.findall(text))
    if hiding:  # a file can read one way and run another (bidi overrides in code): show where
        header.append(f"HIDDEN_CHARACTERS: {hiding} characters that reorder or hide text are shown as escapes "
                      "(\\u202e, \\u200b, ...)")
        text = unhidden(text)
    return "\n".join(header + ["---", text])


def open_confined(resolved: str, directory: bool) -> int:
    """Open a resolved (symlink-free) path so that no symlink is followed on the way: component by component
    with O_NOFOLLOW where the platform allows (POSIX), so a folder swapped for a symlink out after the check
    fails the open instead of leading outside. Elsewhere the path is opened directly and must still
    resolve to itself afterwards."""
    directory_flag = getattr(os, "O_DIRECTORY", 0)
    last_flags = READ_FLAGS | NOFOLLOW | (directory_flag if directory else 0)
    if not (NOFOLLOW and os.open in os.supports_dir_fd):
        fd = os.open(resolved, last_flags)
        if os.path.realpath(resolved) != resolved:
            os.close(fd)
            raise OSError(errno.ELOOP, "the path no longer resolves to itself")
        return fd
    parts = Path(resolved).parts
    fd = os.open(parts[0], os.O_RDONLY | directory_flag)
    if len(parts) == 1:
        return fd
    try:
        for part in parts[1:-1]:
            inner = os.open(part, os.O_RDONLY | directory_flag | NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = inner
        return os.open(parts[-1], last_flags, dir_fd=fd)
    finally:
        os.close(fd)


def list_folder_by_path(resolved: str, checked: os.stat_result) -> str:
    """Windows cannot open a folder as a file descriptor (os.open answers "permission denied"; found on the
    Windows lane): the folder is listed by its path, and the listing is given only if the path still resolves
    to itself and is still the folder that was checked."""
    listing = list_directory(resolved, None)
    try:
        now = os.stat(resolved)
    except OSError as exc:
        raise Refused(f"cannot stat {shown(resolved)}: {exc.strerror or exc}") from None
    if os.path.realpath(resolved) != resolved or (now.st_dev, now.st_ino) != (checked.st_dev, checked.st_ino):
        raise Refused(f"{shown(resolved)} changed while it was being listed; try again")
    return listing


def list_directory(resolved: str, fd: int | None) -> str:
    """Sorted entries with type, size, modified time; only the shown entries are stat'ed. Listed through
    the opened folder where the platform allows, and every name escaped: a folder named 'x\nSTATUS: ok'
    cannot forge a line."""
    try:
        with os.scandir(fd if fd is not None and os.scandir in os.supports_fd else resolved) as entries:
            found = sorted((e.name, e) for e in entries)
    except OSError as exc:
        raise Refused(f"cannot list {shown(resolved)}: {exc.strerror or exc}") from None
    lines = [f"DIRECTORY: {shown(resolved, 1000)}", f"ENTRIES: {len(found)}"]
    for name, entry in found[:DIR_LIMIT]:
        try:
            info = entry.stat(follow_symlinks=False)
            kind = "link" if entry.is_symlink() else "dir" if entry.is_dir(follow_symlinks=False) else "file"
            modified = time.strftime("%Y-%m-%d %H:%M", time.localtime(info.st_mtime))
            lines.append(f"{kind:4}  {info.st_size:>12}  {modified}  {shown(name)}")
        except OSError:
            lines.append(f"?     {'':>12}  {'':16}  {shown(name)}")
    if len(found) > DIR_LIMIT:
        lines.append(f"... {len(found) - DIR_LIMIT} more entries not shown")
    return "\n".join(lines)


# -------------------------------------------------- tool logic: Hermes' skills (hermes_capabilities) [server]
SKILL_FRONT_MATTER_BYTES = 64 * 1024
SKILL_TREE_DEPTH = 6  # skills/<category>/<name>/SKILL.md, with room for nested categories
SKILL_TREE_FOLDERS = 20_000
SKILL_YAML_EVENTS = 5_000
SKILL_FIELD_CHARS = {"name": 128, "description": 2000, "tag": 64}
SKILL_MAX_TAGS = 32


class SkippedSkill(Exception):
    """A SKILL.md that breaks a rule (size, YAML anchors, field types): listed as skipped with the reason."""


def front_matter(path: str) -> dict[str, Any]:
    """The YAML front matter of a SKILL.md, read as untrusted input: skills come from hubs and from Hermes
    itself. At most 64 KiB is read; anchors and aliases (the 'billion laughs' bomb) are refused before
    anything is built, and so is a document of more than a few thousand YAML events."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        with open_regular(path) as handle:
            head = handle.read(SKILL_FRONT_MATTER_BYTES)
    except OSError as exc:
        raise SkippedSkill(f"unreadable: {exc.strerror or exc}") from None
    text = head.decode("utf-8", "replace")
    match = re.match(r"^---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(?:\r?\n|$)", text, re.DOTALL)
    if not match:
        raise SkippedSkill(f"no YAML front matter within its first {SKILL_FRONT_MATTER_BYTES} bytes")
    try:
        for count, event in enumerate(yaml.parse(match.group(1), Loader=loader)):
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                raise SkippedSkill("its front matter uses YAML anchors or aliases, which skills never need")
            if count > SKILL_YAML_EVENTS:
                raise SkippedSkill(f"its front matter has more than {SKILL_YAML_EVENTS} YAML nodes")
        front = yaml.load(match.group(1), Loader=loader)
    except yaml.YAMLError as exc:
        raise SkippedSkill(f"invalid YAML: {' '.join(str(exc).split())[:120]}") from None
    if not isinstance(front, dict):
        raise SkippedSkill("its front matter is not a mapping")
    return front


def short_text(front: dict[str, Any], key: str, limit: int) -> str:
    value = front.get(key)
    if value is None:
        return ""
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise SkippedSkill(f"{key} is not text")
    text = " ".join(str(value).split())
    if len(text) > limit:
        raise SkippedSkill(f"{key} is longer than {limit} characters")
    return text


def parse_skill(path: str, skills_dir: str) -> dict[str, Any]:
    """A skill from its SKILL.md (name, category, description, tags), or SkippedSkill with the reason."""
    front = front_matter(path)
    folder = os.path.dirname(path)
    parts = os.path.relpath(path, skills_dir).split(os.sep)
    meta = front.get("metadata")
    hermes_meta = meta.get("hermes") if isinstance(meta, dict) else None
    tags = hermes_meta.get("tags") if isinstance(hermes_meta, dict) else None
    tags = tags if isinstance(tags, list) else []
    if len(tags) > SKILL_MAX_TAGS or not all(isinstance(t, str) and len(t) <= SKILL_FIELD_CHARS["tag"] for t in tags):
        raise SkippedSkill(f"its tags must be at most {SKILL_MAX_TAGS} short strings")
    return {
        "name": short_text(front, "name", SKILL_FIELD_CHARS["name"]) or os.path.basename(folder),
        "category": parts[0] if len(parts) > 2 else "uncategorised",
        "description": short_text(front, "description", SKILL_FIELD_CHARS["description"]),
        "tags": [" ".join(t.split()) for t in tags],
        "path": path,
    }


def folder_mtime(folder: str) -> int:
    try:
        return os.stat(folder, follow_symlinks=False).st_mtime_ns
    except OSError:
        return -1


class SkillIndex:
    """Hermes' skills as last read, per skills folder: the tree's folders with their mtimes and each
    SKILL.md with its stat, so a repeated call re-reads only what changed. One per server, passed to the
    tools that read skills."""

    def __init__(self) -> None:
        self.parsed: dict[str, tuple[tuple[int, int], dict[str, Any]]] = {}  # SKILL.md -> (stat, skill or skip)
        self.trees: dict[str, tuple[dict[str, int], list[str], str | None]] = {}  # dir -> (mtimes, files, note)
        self.lock = threading.Lock()

    def files(self, skills_dir: str) -> tuple[list[str], str | None]:
        """Every SKILL.md under skills_dir, walked iteratively with a depth and a folder cap (a hostile tree can
        be thousands of folders deep), without following symlinks; and a note when a cap was hit. The walk is
        redone only when a folder's mtime changed, so a repeated call costs one stat per folder."""
        cached = self.trees.get(skills_dir)
        if cached and all(folder_mtime(folder) == mtime for folder, mtime in cached[0].items()):
            return cached[1], cached[2]
        folders: dict[str, int] = {}
        files: list[str] = []
        note = None
        pending = [(skills_dir, 0)]
        while pending:
            folder, depth = pending.pop()
            if len(folders) >= SKILL_TREE_FOLDERS:
                note = f"stopped after {SKILL_TREE_FOLDERS} folders"
                break
            folders[folder] = folder_mtime(folder)
            try:
                with os.scandir(folder) as entries:
                    listed = sorted(entries, key=lambda e: e.name, reverse=True)
            except OSError:
                continue
            for entry in listed:
                if entry.name == "SKILL.md" and entry.is_file(follow_symlinks=False):
                    files.append(entry.path)
                elif entry.is_dir(follow_symlinks=False):
                    if depth + 1 > SKILL_TREE_DEPTH:
                        note = f"folders deeper than {SKILL_TREE_DEPTH} levels are not searched"
                    else:
                        pending.append((entry.path, depth + 1))
        files.sort()
        self.trees[skills_dir] = (folders, files, note)
        return files, note

    def skills(self, skills_dir: Path) -> tuple[list[dict[str, Any]], list[str]]:
        """Every skill under skills_dir (each file parsed once per version), and why others were skipped."""
        skills: list[dict[str, Any]] = []
        skipped: list[str] = []
        with self.lock:  # one walk at a time; a caller that cannot get it in time hits its tool deadline
            files, note = self.files(str(skills_dir))
            if note:
                skipped.append(f"{skills_dir}: {note}")
            for path in files:
                try:
                    info = os.stat(path, follow_symlinks=False)
                except OSError:
                    continue
                key = (info.st_mtime_ns, info.st_size)
                cached = self.parsed.get(path)
                if not cached or cached[0] != key:
                    try:
                        entry: dict[str, Any] = parse_skill(path, str(skills_dir))
                    except SkippedSkill as exc:
                        entry = {"skipped": str(exc)}
                    cached = (key, entry)
                    self.parsed[path] = cached
                if "skipped" in cached[1]:
                    skipped.append(f"{Path(os.path.relpath(path, skills_dir)).as_posix()}: {cached[1]['skipped']}")
                else:
                    skills.append(cached[1])
        return skills, skipped


def skill_score(skill: dict[str, Any], words: list[str]) -> int:
    name, description = skill["name"].lower(), skill["description"].lower()
    tags = [t.lower() for t in skill["tags"]]
    score = 0
    for word in words:
        score += 10 if word == name else 5 if word in name else 0
        score += 3 if word in tags else 1 if any(word in t for t in tags) else 0
        score += 1 if word in description else 0
    return score


SKILLS_USE = 'Preload skills with hermes_run(..., skills=["name"]).'


def capabilities(cfg: Config, index: SkillIndex, query: str | None, category: str | None, limit: int | None) -> str:
    """Hermes' skills in one of three modes: ranked matches for a query, one category, or the categories.
    The arguments are checked before the skills tree is walked."""
    if query is not None and not isinstance(query, str) or category is not None and not isinstance(category, str):
        raise Refused("query and category must be text")
    clamped = clamp_number("limit", limit, 20, 1, 200)
    count = int(clamped.value)
    skills_dir = cfg.hermes_home_path / "skills"
    skills, skipped = index.skills(skills_dir)
    header = [f"SKILLS_DIR: {shown(str(skills_dir))}", f"SKILLS: {len(skills)}"
              + (f" ({len(skipped)} skipped)" if skipped else "")]
    header += [f"NOTE: {note}" for note in clamped.notes]
    header += [f"SKIPPED: {shown(reason)}" for reason in skipped[:10]]
    if len(skipped) > 10:
        header.append(f"SKIPPED: ... and {len(skipped) - 10} more")
    if not skills:
        return "\n".join(header + ["No skills found. Hermes installs its skills under HERMES_HOME/skills."])
    if query:
        return "\n".join(header + skill_matches(skills, query, count) + [SKILLS_USE])
    if category:
        return "\n".join(header + category_members(skills, category, count) + [SKILLS_USE])
    return "\n".join(header + skill_categories(skills, count)
                     + ["Narrow with hermes_capabilities(query=...) or (category=...). " + SKILLS_USE])


def skill_matches(skills: list[dict[str, Any]], query: str, count: int) -> list[str]:
    words = [w for w in re.split(r"\W+", query.lower()) if w]
    ranked = sorted(((skill_score(s, words), s) for s in skills), key=lambda p: (-p[0], p[1]["name"]))
    hits = [s for score, s in ranked if score > 0]
    return [f"MATCHES for '{shown(query)}': {len(hits)}"] + [describe_skill(s) for s in hits[:count]]


def category_members(skills: list[dict[str, Any]], category: str, count: int) -> list[str]:
    members = sorted((s for s in skills if s["category"] == category), key=lambda s: s["name"])
    if not members:
        categories = sorted({s["category"] for s in skills})
        raise Refused(f"no category '{shown(category, 80)}'; categories: {shown(', '.join(categories), 1000)} "
                      f"({len(categories)} in all; hermes_capabilities() lists them)")
    return [f"CATEGORY {shown(category)}: {len(members)} skills"] + [describe_skill(s) for s in members[:count]]


def skill_categories(skills: list[dict[str, Any]], count: int) -> list[str]:
    by_category: dict[str, list[str]] = {}
    for skill in skills:
        by_category.setdefault(skill["category"], []).append(skill["name"])
    lines = [f"CATEGORIES: {len(by_category)}"]
    for name in sorted(by_category)[:count]:
        names = sorted(by_category[name])
        lines.append(f"{shown(name, 80)} ({len(names)}): {shown(', '.join(names[:5]), 400)}"
                     + (", ..." if len(names) > 5 else ""))
    return lines


def describe_skill(skill: dict[str, Any]) -> str:
    tags = f" (tags: {shown(', '.join(skill['tags']))})" if skill["tags"] else ""
    return f"- {shown(skill['name'])} [{shown(skill['category'])}]: {shown(skill['description'])}{tags}"


HEALTH_RECENT_JOBS = 200


# -------------------------------------------------- tool logic: health and the server's instructions [server]
def job_counts(store: JobStore) -> str:
    """Counts by state over every unfinished job (the active markers) and the newest finished ones, plus
    the total on disk: bounded, so hermes_health stays instant whatever the disk holds."""
    ids = store.list_ids()
    active = store.active_ids()
    counted = dict.fromkeys(active + ids[-HEALTH_RECENT_JOBS:])
    counts: dict[str, int] = {}
    for _, view, _ in store.views(counted):
        state = view.shown_state if view else "damaged"
        counts[state] = counts.get(state, 0) + 1
    by_state = ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"
    scope = "all" if len(counted) >= len(ids) else f"unfinished and newest {HEALTH_RECENT_JOBS}"
    return f"{len(ids)} on disk; by state ({scope}): {by_state}"


APPROVAL_MEANINGS = {
    "deny": "deny: a command Hermes deems dangerous is denied (no one is asked)",
    "ask": "ask: Hermes' question reaches the user (elicitation, or STATUS: needs_approval and hermes_approve)",
    "yolo": "yolo: every command Hermes deems dangerous is allowed, unasked",
}


def approvals_line(cfg: Config, exe: str | None) -> str:
    line = APPROVAL_MEANINGS[cfg.approval_mode]
    if cfg.approval_mode == "ask" and exe is not None and (
            cfg.hermes_driver == "cli" or known_acp(cfg, exe) is False):
        line += "; BUT this Hermes runs with the CLI driver, which cannot forward questions: they are denied"
    return line + f" (from {cfg.sources.get('approvals') or cfg.sources.get('yolo') or 'default'})"


def hermes_version_line(exe: str | None, version: str | None) -> str:
    if exe is None:
        return "unknown: no usable Hermes"
    return shown(version) if version else "unknown (no hermes_agent dist-info beside the executable)"


def health(cfg: Config, at_start: Config | None = None) -> str:
    """Everything a user needs to see why the bridge cannot work, without starting any process. at_start:
    the config as the server loaded it when it started, so a change of the file since (a job can write it)
    is said, not silently obeyed."""
    hermes = locate_hermes(cfg)
    exe = hermes.usable
    version = hermes_version_on_disk(exe) if exe else None
    cli = known_cli(cfg, exe)
    store = JobStore.of(cfg)
    try:
        store.ensure()
        problem = disk_problem(store.root)
        writable = f"NOT writable: {problem}" if problem else "writable"
    except OSError as exc:
        writable = f"NOT writable: {disk_error(exc)}"
    detach = read_json(store.detach_path)
    survives = detach.get("survives_host", True) if isinstance(detach, dict) else True
    if cli and exe:
        cli_lines = [f"CLI_FLAGS: {cli.describe()}", f"CLI_COMMAND: {shown(command_preview(cli, exe, cfg), 1000)}"]
    else:
        cli_lines = ["CLI_FLAGS: not known yet: the first job asks `hermes chat --help` once and caches the answer"
                     if exe else "CLI_FLAGS: unknown: Hermes not found"]
    lines = [
        f"BRIDGE: claude-hermes-bridge {VERSION}",
        f"PYTHON: {sys.version.split()[0]} at {sys.executable}",
        f"MCP_SDK: {dependency_version('mcp') or 'not installed'}",
        f"TASKS: {tasks_line(dependency_version('mcp'))}",
        f"HERMES_EXE: {shown(exe) if exe else 'NOT USABLE: ' + shown(hermes.problem, 600)}",
        f"HERMES_EXE_SOURCE: {shown(hermes.source, 600)}",
        f"HERMES_VERSION: {hermes_version_line(exe, version)}",
        *cli_lines,
        f"HERMES_HOME: {shown(str(cfg.hermes_home_path))}",
        driver_line(cfg, exe, probe=False),
        f"APPROVALS: {approvals_line(cfg, exe)}",
        f"ALLOWED_ROOTS: {shown(', '.join(cfg.roots), 2000) or 'NONE: no job can start: ' + roots_missing(cfg)}",
        f"READ_SCOPE: {'anywhere' if cfg.read_anywhere else 'allowed roots and job files'}",
        f"JOBS_DIR: {shown(str(store.root))} ({writable})",
        f"LOGS_DIR: {shown(str(cfg.logs_path))}",
        "SETTINGS: " + "; ".join(f"{key} from {cfg.sources.get(key, 'default')}" for key in HOST_SETTING_KEYS),
        "JOBS_SURVIVE_HOST: " + ("yes" if survives else "NO: the host's job object forbids breakaway, so jobs "
                                 "die when the host closes"),
        f"JOBS: {job_counts(store)}",
        f"WORKTREES: {worktree_count(store)}",
        f"CONFIG: {shown(str(cfg.path))} ({plural(len(cfg.problems), 'problem')})",
    ]
    if at_start is not None and cfg.file_stamp != at_start.file_stamp:
        lines.append("CONFIG_CHANGED: the config file changed after this server started; the settings above are "
                     "read from it now. If you did not change it, a job may have: check it")
    if advice := path_advice(os.environ.get("PATH", ""), sys.platform, os.path.expanduser("~")):
        lines.append(f"PATH_NOTE: {shown(advice, 500)}")
    lines += [f"  - {shown(problem, 500)}" for problem in cfg.problems]
    return "\n".join(lines)


def tasks_line(mcp_version: str | None) -> str:
    """Whether this SDK line can answer a run with a task (the tasks extension needs the 2.x line)."""
    if mcp_version and version_tuple(mcp_version)[:1] >= (2,):
        return ("served: a client that declares io.modelcontextprotocol/tasks on protocol 2026-07-28 (Claude "
                "Code, interactive) gets hermes_run and hermes_resume as background tasks; others get job ids")
    return (f"not served on the 1.x SDK line (mcp {mcp_version or 'not installed'}): every client gets job ids to "
            "poll with hermes_status; mcp 2.x serves them as tasks")


def server_instructions(cfg: Config) -> str:
    roots = ", ".join(cfg.roots) or "none configured yet (every hermes_run is refused until allowed_roots is set)"
    return (
        "This server hands tasks to Hermes, an unattended agent with shell, file and browser tools on this "
        "machine. You plan and verify; Hermes executes.\n"
        "- Write each task self-contained: absolute paths, what to do, and a definition of done. Hermes does "
        "not see this conversation.\n"
        "- hermes_run returns a JOB_ID, with STATUS: running if the job outlasts wait_s. Then call "
        "hermes_status(job_id); it waits up to wait_s for you, so do not call it in a tight loop.\n"
        "- Never re-run a job that is running: that starts the same work twice. STATUS: running is not a "
        "failure.\n"
        "- timeout, cancelled, over_budget or orphaned mean part-done work: inspect the files before re-running. "
        "over_budget: the job passed its max_tokens, max_cost_usd or max_turns (REASON says which).\n"
        "- Do not trust STATUS: ok alone: verify the artifacts with hermes_read.\n"
        "- hermes_resume(session_id) continues a Hermes session (\"latest\" = the newest one captured).\n"
        "- hermes_cancel(job_id) stops a job and its whole process tree.\n"
        "- STATUS: needs_approval means Hermes asks before something it deems dangerous (APPROVAL line): ask the "
        "user, then answer with hermes_approve(job_id, approval_id, decision). Never allow on your own. A host "
        "that shows the job view lets the user answer there.\n"
        "- isolation=\"worktree\" runs a job in a git worktree of its own: nothing reaches the user's tree until "
        "hermes_land(job_id, \"merge\"); show the user the DIFF first (\"discard\" drops the work).\n"
        f"- Jobs may only start inside these folders: {roots}. hermes_read reads there and the job logs."
    )


# ----------------------------------------------------------------------- tool bodies (async, no MCP) [server]
# The tool bodies: plain async functions returning a ToolResult, callable without MCP. Everything that
# touches the disk runs in a worker thread with a deadline (off_loop), so a slow disk or a hostile file
# never holds the event loop, and one slow call never delays another.
DISK_DEADLINE_S = 20.0
PROGRESS_EVERY_S = 5.0
APPROVAL_RELAY_S = 5.0  # how long hermes_approve waits to see the supervisor take the answer
Progress = Callable[[float, float, str], Awaitable[None]]


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    import anyio

    with anyio.fail_after(DISK_DEADLINE_S):
        return await anyio.to_thread.run_sync(functools.partial(fn, *args), abandon_on_cancel=True)


AskUser = Callable[[str, dict[str, Any], float], Awaitable[str | None]]  # job id, the question, seconds to wait


async def wait_for_end(cfg: Config, job_id: str, wait_s: float, progress: Progress | None,
                       ask_user: AskUser | None = None, questions_end_wait: bool = True) -> JobView:
    """Poll the record on disk until the job ends, Hermes asks a question (unless questions_end_wait is off,
    as for a cancel, which waits for the end), or wait_s passes; sends progress while it waits. A question
    goes to the user at once when the host can ask them (ask_user, elicitation); their answer is relayed like
    hermes_approve's and the wait goes on."""
    import anyio

    deadline = time.monotonic() + wait_s
    next_progress = time.monotonic()  # the first notification at once, then every PROGRESS_EVERY_S
    asked: set[str] = set()  # put to the user (answered, or left to another channel)
    while True:
        view = await off_loop(job_view, cfg, job_id)
        now = time.monotonic()
        unasked = [q for q in view.pending_questions if q["id"] not in asked]
        if unasked and ask_user is not None:
            question = unasked[0]
            asked.add(question["id"])
            decision = await ask_user(job_id, question, min(question["expires_clock"] - machine_clock(),
                                                                     max(0.0, deadline - now)))
            if decision:
                with contextlib.suppress(Refused):  # answered meanwhile by someone else: theirs stands
                    await off_loop(answer_approval, cfg, job_id, question["id"], decision, "user")
                continue
        if not view.running or now >= deadline or (unasked and questions_end_wait):
            return view
        if progress is not None and now >= next_progress:
            next_progress = now + PROGRESS_EVERY_S
            try:
                details = await off_loop(job_details, cfg, view)
                await progress(wait_s - (deadline - now), wait_s, details.progress_line(job_id))
            except Exception:  # progress is a courtesy; a closed stream must not fail the call
                pass
        await anyio.sleep(min(0.25, max(0.0, deadline - now)))


async def launch_and_wait(cfg: Config, launch: Noted[JobRequest], wait_s: float | None, progress: Progress | None,
                          ask_user: AskUser | None = None) -> ToolResult:
    request = launch.value
    wait = clamp_number("wait_s", wait_s, min(5.0, cfg.max_wait_s), 0, cfg.max_wait_s)
    record, duplicate = await off_loop(launch_job, cfg, request)
    notes = [*launch.notes, *wait.notes, *([duplicate] if duplicate else [])]
    if request.driver == "cli" and request.approval_mode == "ask":
        notes.append(CLI_CANNOT_ASK)
    view = await wait_for_end(cfg, record.id, wait.value, progress, ask_user)
    return await off_loop(status_result, view, cfg, notes)


CLI_CANNOT_ASK = ("approvals is ask, but this Hermes runs with the CLI driver (no ACP extra), which cannot forward "
                  "its questions: a command it deems dangerous is denied. " + ACP_EXTRA_FIX[0].upper()
                  + ACP_EXTRA_FIX[1:] + " to have them forwarded")


async def run_tool(cfg: Config, arguments: LaunchArguments, wait_s: Any, progress: Progress | None = None,
                   ask_user: AskUser | None = None) -> ToolResult:
    launch = await off_loop(job_request, cfg, "run", arguments)
    return await launch_and_wait(cfg, launch, wait_s, progress, ask_user)


async def resume_tool(cfg: Config, session_id: Any, arguments: LaunchArguments, wait_s: Any,
                      progress: Progress | None = None, ask_user: AskUser | None = None) -> ToolResult:
    """A resume runs where Hermes recorded the session: that folder is confined, and reported (the record
    keeps the note, so every later status says it)."""
    target = await off_loop(resolve_resume, cfg, session_id, arguments.cwd)
    session, folder, worktree = target.value
    launch = await off_loop(job_request, cfg, "resume", dataclasses.replace(arguments, cwd=folder), session,
                            "; ".join(target.notes) or None, worktree)
    return await launch_and_wait(cfg, launch, wait_s, progress, ask_user)


async def status_tool(cfg: Config, job_id: Any, wait_s: Any, progress: Progress | None = None,
                      ask_user: AskUser | None = None, job_ids: Any = None, until: Any = None) -> ToolResult:
    if job_ids is not None:
        return await status_of_many(cfg, job_ids, until, wait_s)
    view = await off_loop(job_view, cfg, job_id)
    wait = clamp_number("wait_s", wait_s, min(30.0, cfg.max_wait_s), 0, cfg.max_wait_s)
    final = await wait_for_end(cfg, view.record.id, wait.value, progress, ask_user)
    return await off_loop(status_result, final, cfg, list(wait.notes))


JOB_IDS_MAX = 50


async def status_of_many(cfg: Config, job_ids: Any, until: Any, wait_s: Any) -> ToolResult:
    """hermes_status over several jobs (a planner that fanned out): wait up to wait_s until any (or all) of
    them has ended, then the final block of each that ended and one line for each still running."""
    import anyio

    if not isinstance(job_ids, list) or not job_ids or len(job_ids) > JOB_IDS_MAX:
        raise Refused(f"job_ids must be a list of 1 to {JOB_IDS_MAX} job ids, got {shown(job_ids, 100)}")
    if until not in (None, "any", "all"):
        raise Refused(f'until must be "any" or "all", got {shown(until, 40)}')
    ids = list(dict.fromkeys(validate_job_id(job_id) for job_id in job_ids))
    wait = clamp_number("wait_s", wait_s, min(30.0, cfg.max_wait_s), 0, cfg.max_wait_s)
    deadline = time.monotonic() + wait.value
    while True:
        views = [await off_loop(job_view, cfg, job_id) for job_id in ids]
        ended = [view for view in views if not view.running]
        enough = len(ended) == len(views) if until == "all" else bool(ended)
        if enough or time.monotonic() >= deadline or any(view.pending_questions for view in views):
            break
        await anyio.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    lines = [f"JOBS: {len(ended)} of {len(views)} ended" + (f" (waited for {until})" if until else ""),
             *(f"NOTE: {note}" for note in wait.notes)]
    lines += [f"- {view.record.id}: {view.shown_state}, {elapsed_s(view.record, True)} s; "
              f'hermes_status(job_id="{view.record.id}") shows it' for view in views if view.running]
    for view in ended:
        lines.append(f"\n=== {view.record.id} ===\n{(await off_loop(status_result, view, cfg)).text}")
    return ToolResult("\n".join(lines), "ok" if ended else "running")


async def approve_tool(cfg: Config, job_id: Any, approval_id: Any, decision: Any, by: str = "planner") -> ToolResult:
    """hermes_approve (by the planner) and the job view's answer (by the user): the answer to Hermes' question,
    relayed through the job's answer file; then the job's block once the supervisor has taken it (a few
    seconds at most)."""
    import anyio

    view = await off_loop(answer_approval, cfg, job_id, approval_id, decision, by)
    deadline = time.monotonic() + APPROVAL_RELAY_S
    while view.running and any(q["id"] == approval_id for q in view.record.questions) and time.monotonic() < deadline:
        await anyio.sleep(0.2)
        view = await off_loop(job_view, cfg, view.record.id)
    return await off_loop(status_result, view, cfg, [applied_answer(view, approval_id)])


async def cancel_tool(cfg: Config, job_id: Any, progress: Progress | None = None) -> ToolResult:
    view, note = await off_loop(request_cancel, cfg, job_id)
    if view.running:
        view = await wait_for_end(cfg, view.record.id, min(cfg.kill_grace_s + 5, cfg.max_wait_s), progress,
                                  questions_end_wait=False)
    return await off_loop(status_result, view, cfg, [note])


async def view_job_tool(cfg: Config, job_id: Any) -> ToolResult:
    """The job view's poll: the block and its facts now, without waiting."""
    return await off_loop(status_result, await off_loop(job_view, cfg, job_id), cfg)


async def view_answer_tool(cfg: Config, tokens: "ViewTokens", job_id: Any, approval_id: Any, decision: Any,
                           token: Any) -> ToolResult:
    """The user's answer from the job view, which must carry a one-time token a result gave the view: a model
    that calls this tool without one is refused (hermes_approve is the planner's way, recorded as such)."""
    if not tokens.redeem(token):
        raise Refused("this answer carries no valid one-time token of the job view; answer in the job view, or "
                      "ask the user and use hermes_approve")
    return await approve_tool(cfg, job_id, approval_id, decision, "view")


async def land_tool(cfg: Config, job_id: Any, action: Any) -> ToolResult:
    view, how = await off_loop(land_job, cfg, job_id, action)
    return await off_loop(status_result, view, cfg, [f"{action}: {how}"])


async def listing_tool(fn: Callable[..., str], cfg: Config, *args: Any) -> ToolResult:
    """hermes_jobs, hermes_read, hermes_capabilities, hermes_health: text from the disk, nothing started."""
    return ToolResult(await off_loop(fn, cfg, *args))


async def run_tool_body(tool: str, body: Callable[[Config], Awaitable[ToolResult]], task: Any = None) -> ToolResult:
    """Run a tool body with a fresh config; a refusal, a deadline or a bug becomes an error result, never a
    crash. Every call leaves one audit line, from the result's fields."""
    cfg: Config | None = None
    try:
        cfg = await off_loop(load_config)
        outcome = await body(cfg)
    except Refused as exc:
        outcome = refused_result(str(exc))
    except TimeoutError:
        outcome = ToolResult(f"STATUS: error\nREASON: {tool} gave up after {DISK_DEADLINE_S:g} s waiting for the "
                             "disk (a slow disk, or a file that never ends?). The server keeps running; "
                             "hermes_health may show why.", "error", reason="disk deadline")
    except OSError as exc:  # a disk that refuses (full, read-only) where no step above said so itself
        reason = f"{tool} could not use the disk: {disk_error(exc)}"
        outcome = ToolResult(f"STATUS: error\nREASON: {reason}. Free space or make the folder writable, then try "
                             "again; hermes_health shows the jobs folder's state.", "error", reason=reason)
    except Exception as exc:
        traceback.print_exc()
        reason = f"internal error in {tool}: {type(exc).__name__}: {shown(str(exc))}"
        outcome = ToolResult(f"STATUS: error\nREASON: {reason}. The server keeps running; hermes_health may show "
                             "why.", "error", reason=reason)
    if cfg is not None:
        with contextlib.suppress(TimeoutError):
            await off_loop(lambda: audit(cfg, event="tool", tool=tool, job_id=outcome.job_id, cwd=outcome.cwd,
                                         outcome=outcome.status, reason=outcome.reason,
                                         task=first_words(task) if task is not None else None))
    return outcome


# ------------------------------------------ MCP edge: the tasks extension, the SDK lines, the server [server]
# io.modelcontextprotocol/tasks (SEP-2663, protocol 2026-07-28, the 2.x SDK line only): a client that declares
# it on a request gets hermes_run and hermes_resume answered with a task whose id is the job id, and polls
# tasks/get itself (Claude Code moves such a call to the background and tells the model when it ends). The
# task is the job: its state is read from the record on every poll, so it lives as long as the record.
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
TASKS_PROTOCOL = "2026-07-28"
TASK_TOOLS = ("hermes_run", "hermes_resume")
TASK_POLL_MS = 2000
TASK_MESSAGE_CHARS = 150
TASK_FAILED_STATES = frozenset({JobState.ERROR, JobState.TIMEOUT, JobState.OVER_BUDGET, JobState.ORPHANED})
TERMINAL_TASKS_KEPT = 10000
APPROVAL_FORM = {"type": "object", "required": ["allow"],
                 "properties": {"allow": {"type": "boolean", "title": "Allow",
                                          "description": "Allow it (true) or deny it (false)"},
                                "for_this_job": {"type": "boolean", "title": "Allow for the rest of this job",
                                                 "description": "With Allow: the same exact command, asked again "
                                                                "in this job, is allowed too", "default": False}}}


def iso_time(seconds: float) -> str:
    import datetime

    moment = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def approval_question(job_id: str, question: dict[str, Any]) -> str:
    """The question put to the user, by elicitation or as a task's input request, with its deadline: a
    dialog left open past it answers nothing."""
    return f"Hermes (job {job_id}) asks to {question['what']}. Allow it? {deadline_words(question)}."


def elicited_decision(response: Any) -> str | None:
    """allow or deny from an elicitation result; None when the user made no choice (Hermes' timeout decides)."""
    if not isinstance(response, dict):
        return None
    content = response.get("content")
    if response.get("action") == "accept" and isinstance(content, dict) and isinstance(content.get("allow"), bool):
        if not content["allow"]:
            return "deny"
        return "allow_for_job" if content.get("for_this_job") is True else "allow"
    return "deny" if response.get("action") == "decline" else None


@dataclasses.dataclass
class TaskCall:
    """One tools/call a client may take as a task: the tool body leaves its outcome here."""

    outcome: ToolResult | None = None


class JobTasks:
    """The tasks extension over the job store, without MCP: the task a job is now, its input answered, its
    cancel. A task reported terminal (completed, failed, cancelled) is kept as reported, so it never changes
    after, whatever the record says later (an orphan cancelled afterwards stays completed)."""

    def __init__(self) -> None:
        import contextvars

        self.terminal: dict[str, dict[str, Any]] = {}
        self.call: contextvars.ContextVar[TaskCall | None] = contextvars.ContextVar("task_call", default=None)

    def as_task(self) -> bool:
        """Whether the tools/call being served will be answered with a task (so it must not wait)."""
        return self.call.get() is not None

    def keep(self, outcome: ToolResult) -> None:
        if (call := self.call.get()) is not None:
            call.outcome = outcome

    def task(self, cfg: Config, job_id: Any) -> dict[str, Any]:
        """tasks/get: the job's state as a task. Refused (an unknown or damaged job) becomes a protocol error."""
        if isinstance(job_id, str) and job_id in self.terminal:
            return self.terminal[job_id]
        view = job_view(cfg, job_id)
        record = view.record
        task: dict[str, Any] = {
            "taskId": record.id, "createdAt": iso_time(record.created_at),
            "lastUpdatedAt": iso_time(record.ended_at or record.started_at or record.created_at),
            "ttlMs": int(max(cfg.retention_days * 86400, 60) * 1000), "pollIntervalMs": TASK_POLL_MS}
        if pending := view.pending_questions[:QUESTIONS_SHOWN]:
            first = approval_question(record.id, pending[0])
            more = f" (and {len(view.pending_questions) - 1} more)" if len(view.pending_questions) > 1 else ""
            return {**task, "status": "input_required", "statusMessage": shown(first, TASK_MESSAGE_CHARS - 20) + more,
                    "inputRequests": {question["id"]: {"method": "elicitation/create", "params": {
                        "mode": "form", "message": shown(approval_question(record.id, question), 2700),
                        "requestedSchema": APPROVAL_FORM}} for question in pending}}
        if view.running:
            details = job_details(cfg, view)
            doing = details.current_tool if details.current_tool not in (None, "none yet") else details.activity
            message = f"Hermes: {doing}" if view.state is JobState.RUNNING and doing else "Hermes is starting"
            message = view.condition or message
            return {**task, "status": "working", "statusMessage": shown(message, TASK_MESSAGE_CHARS)}
        if view.state is JobState.CANCELLED:
            task |= {"status": "cancelled", "statusMessage": shown(view.reason or "cancelled", TASK_MESSAGE_CHARS)}
        else:
            final = status_result(view, cfg)
            task |= {"status": "completed", "result": {"content": [{"type": "text", "text": final.text}],
                                                       "isError": view.state in TASK_FAILED_STATES}}
        if len(self.terminal) >= TERMINAL_TASKS_KEPT:
            self.terminal.pop(next(iter(self.terminal)))
        self.terminal[record.id] = task
        return task

    def update(self, cfg: Config, job_id: Any, responses: Any) -> None:
        """tasks/update: each answer to a question of the job is relayed as hermes_approve relays it; one to
        a question answered already (or expired) is refused naming what decided it, after the others are
        relayed; keys that name no question of the job are ignored, as the extension says."""
        view = job_view(cfg, job_id)
        if not isinstance(responses, dict):
            return
        record = view.record
        known = {q["id"] for q in record.questions} | {d["id"] for d in record.decisions} | set(
            JobStore.of(cfg).answers_file(record.id)[0])
        refusals = []
        for approval_id, response in responses.items():
            decision = elicited_decision(response)
            if approval_id not in known or decision is None:
                continue
            try:
                answer_approval(cfg, record.id, approval_id, decision, "user")
            except Refused as exc:
                refusals.append(str(exc))
        if refusals:
            raise Refused("; ".join(refusals))

    def cancel(self, cfg: Config, job_id: Any) -> None:
        """tasks/cancel: as hermes_cancel, without waiting; a task already terminal is left as it is."""
        view = job_view(cfg, job_id)
        if view.record.id not in self.terminal and view.state not in FINAL_STATES:
            request_cancel(cfg, view.record.id)


class McpEdge:
    """The one place that knows which MCP SDK line is installed: 2.x (MCPServer) or 1.x (FastMCP). The rest
    of the file uses what both lines share (tool decorators, ToolAnnotations and CallToolResult with camelCase
    keywords, Context.report_progress, stdio_server with explicit streams)."""

    def __init__(self) -> None:
        try:
            module = importlib.import_module("mcp.server.mcpserver")
            self.server_class: Any = module.MCPServer
            self.line = 2
        except ImportError:
            module = importlib.import_module("mcp.server.fastmcp")
            self.server_class = module.FastMCP
            self.line = 1
        self.context_class: Any = module.Context

    def new_server(self, instructions: str, tasks: JobTasks) -> Any:
        if self.line == 2:
            return self.server_class(name="hermes", instructions=instructions, version=VERSION,
                                     extensions=[self.tasks_extension(tasks)])
        server = self.server_class(name="hermes", instructions=instructions)
        server._mcp_server.version = VERSION  # serverInfo.version; 1.x has no public way to set it
        return server

    @staticmethod
    def tasks_extension(tasks: JobTasks) -> Any:
        """The tasks extension on the 2.x line's public Extension API: a tools/call interceptor that answers
        hermes_run and hermes_resume with a task when the request declares the extension on 2026-07-28 (a
        task is never returned on older protocol versions, where results are validated), and the three
        methods. A refusal stays an ordinary result; an unknown task id is a JSON-RPC error."""
        from mcp.server.extension import Extension, MethodBinding
        from mcp.shared.exceptions import MCPError
        from mcp.types import RequestParams
        from pydantic import ConfigDict

        class TaskParams(RequestParams):
            model_config = ConfigDict(extra="allow", populate_by_name=True)
            taskId: str

        class UpdateParams(TaskParams):
            inputResponses: dict[str, Any] = {}

        async def on_disk(fn: Callable[..., T], *args: Any) -> T:
            """A task method's disk work, bounded like a tool's; a refusal or a deadline is a protocol error."""
            try:
                return await off_loop(fn, await off_loop(load_config), *args)
            except Refused as exc:
                raise MCPError(code=-32602, message=str(exc)) from None
            except TimeoutError:
                raise MCPError(code=-32603, message=f"the disk did not answer within {DISK_DEADLINE_S:g} s") from None

        async def get(_ctx: Any, params: TaskParams) -> dict[str, Any]:
            return dict(await on_disk(tasks.task, params.taskId))

        async def update(_ctx: Any, params: UpdateParams) -> dict[str, Any]:
            await on_disk(tasks.update, params.taskId, params.inputResponses)
            return {}

        async def cancel(_ctx: Any, params: TaskParams) -> dict[str, Any]:
            await on_disk(tasks.cancel, params.taskId)
            return {}

        def declared(ctx: Any) -> bool:
            capabilities = ctx.session.client_capabilities
            return ctx.protocol_version == TASKS_PROTOCOL and TASKS_EXTENSION in (
                (capabilities.extensions if capabilities else None) or {})

        class Tasks(Extension):
            identifier = TASKS_EXTENSION

            def methods(self) -> list[MethodBinding]:
                versions = frozenset({TASKS_PROTOCOL})
                return [MethodBinding("tasks/get", TaskParams, get, versions),
                        MethodBinding("tasks/update", UpdateParams, update, versions),
                        MethodBinding("tasks/cancel", TaskParams, cancel, versions)]

            async def intercept_tool_call(self, params: Any, ctx: Any, call_next: Any) -> Any:
                if params.name not in TASK_TOOLS or not declared(ctx):
                    return await call_next(ctx)
                call = TaskCall()
                token = tasks.call.set(call)
                try:
                    result = await call_next(ctx)
                finally:
                    tasks.call.reset(token)
                if call.outcome is None or call.outcome.job_id is None or call.outcome.is_error:
                    return result
                return {"resultType": "task", **await on_disk(tasks.task, call.outcome.job_id)}
        return Tasks()

    def lowlevel(self, server: Any) -> Any:
        """The low-level server, run on the client's private pipes (neither line runs a high-level server on
        streams it is given, so this reaches one private attribute, here only)."""
        return server._lowlevel_server if self.line == 2 else server._mcp_server


def user_asker(ctx: Any, tasks: JobTasks) -> AskUser | None:
    """Ask the user directly (elicitation) when the client can, while a call waits on the job."""
    from mcp.types import ClientCapabilities, ElicitationCapability
    from pydantic import BaseModel, Field

    if tasks.as_task():  # answered at once with a task; its questions go out as the task's input requests
        return None
    try:  # on 2026-07-28 a request has no back-channel for elicitation/create (can_send_request is 2.x's)
        can_elicit = getattr(ctx.session, "can_send_request", True) and ctx.session.check_client_capability(
            ClientCapabilities(elicitation=ElicitationCapability()))
    except Exception:  # noqa: BLE001  (no session on this request: nobody to ask)
        can_elicit = False
    if not can_elicit:
        return None

    class Answer(BaseModel):
        allow: bool = Field(description="Allow it (true) or deny it (false)")

    async def ask(job_id: str, question: dict[str, Any], wait_s: float) -> str | None:
        import anyio

        if wait_s < 2:
            return None
        with anyio.move_on_after(wait_s):
            result = await ctx.elicit(approval_question(job_id, question), Answer)
            if result.action == "accept" and result.data is not None:
                return "allow" if result.data.allow else "deny"
            if result.action == "decline":
                return "deny"
        return None
    return ask


# The job view (MCP Apps, io.modelcontextprotocol/ui): one self-contained page (job_view.html, beside this file)
# that hermes_run, hermes_resume and hermes_status link to, and two tools only the view may call (the host keeps
# them off the model's list). A host without apps ignores all of it and reads the text as before.
JOB_VIEW_URI = "ui://claude-hermes-bridge/job"
JOB_VIEW_MIME = "text/html;profile=mcp-app"
VIEW_LINK = {"ui": {"resourceUri": JOB_VIEW_URI}, "ui/resourceUri": JOB_VIEW_URI}  # the flat key: older hosts
APP_ONLY = {"ui": {"resourceUri": JOB_VIEW_URI, "visibility": ["app"]}}
VIEW_TOKEN_S = 3600.0
# beside server.py in a clone or a bundle; the wheel installs both files under longer names (pyproject.toml)
JOB_VIEW_FILE = SERVER_DIR / ("claude_hermes_bridge_job_view.html" if SERVER_FILE.name.startswith("claude_hermes")
                              else "job_view.html")


class ViewTokens:
    """One-time tokens a result carries in its _meta for the job view, which echoes one back with the user's
    answer: the best a server can do to tell the view's click from the model calling the same tool (both are
    tools/call on one connection; keeping app-only tools from the model is the host's part)."""

    def __init__(self) -> None:
        self.issued: dict[str, float] = {}

    def issue(self) -> str:
        import secrets

        now = time.monotonic()
        self.issued = {token: until for token, until in self.issued.items() if until > now}
        token = secrets.token_urlsafe(18)
        self.issued[token] = now + VIEW_TOKEN_S
        return token

    def redeem(self, token: Any) -> bool:
        until = self.issued.pop(token, None) if isinstance(token, str) else None
        return until is not None and until > time.monotonic()


def hints(read_only: bool, destructive: bool, idempotent: bool, open_world: bool) -> Any:
    """A tool's annotations by the protocol's (camelCase) names, which both lines validate."""
    from mcp.types import ToolAnnotations

    return ToolAnnotations.model_validate({"readOnlyHint": read_only, "destructiveHint": destructive,
                                           "idempotentHint": idempotent, "openWorldHint": open_world})


def register_review(mcp: Any, tool: Callable[..., Callable[[Callable[..., Any]], Any]],
                    respond: Callable[..., Awaitable[Any]], view_tokens: ViewTokens) -> None:
    """What a person reviews a job with: hermes_land for a worktree job's work, and the job view (its page and
    its two app-only tools)."""
    from mcp.types import CallToolResult

    destructive = hints(read_only=False, destructive=True, idempotent=True, open_world=False)
    read_only = hints(read_only=True, destructive=False, idempotent=True, open_world=False)

    def job_view_page() -> str:
        return JOB_VIEW_FILE.read_text(encoding="utf-8")
    mcp.resource(JOB_VIEW_URI, name="job view", title="Hermes job", mime_type=JOB_VIEW_MIME,
                 description="A job's state, its question, Allow, Deny, Cancel, Merge, Discard")(job_view_page)

    @tool(destructive, "Land a worktree job's work")
    async def hermes_land(job_id: str, action: str) -> CallToolResult:
        """What becomes of a finished worktree job's work (its WORKTREE, DIFF and PATCH lines): "merge"
        applies it to the repository's main tree (refused on a conflict, naming the paths, with the tree left
        as it was), "discard" removes the worktree and its branch, "keep" leaves them for retention. Show the
        user the DIFF and ask first."""
        return cast(CallToolResult, await respond("hermes_land", lambda cfg: land_tool(cfg, job_id, action)))

    @tool(read_only, "Job view: the job now", APP_ONLY)
    async def hermes_view_job(job_id: str) -> CallToolResult:
        """For the job view only (the host keeps it off the model's list): the job's block and its facts."""
        return cast(CallToolResult, await respond("hermes_view_job", lambda cfg: view_job_tool(cfg, job_id)))

    @tool(destructive, "Job view: the user's answer", APP_ONLY)
    async def hermes_view_answer(job_id: str, approval_id: str, decision: str, token: str) -> CallToolResult:
        """For the job view only: the user's answer to Hermes' question, with the view's one-time token.
        The model answers with hermes_approve instead."""
        return cast(CallToolResult, await respond(
            "hermes_view_answer", lambda cfg: view_answer_tool(cfg, view_tokens, job_id, approval_id, decision, token)))


def build_server(cfg: Config, edge: McpEdge) -> Any:
    """The MCP server: the tools and the job view's page over the bodies above. The only place tools meet MCP."""
    import inspect

    from mcp.types import CallToolResult, ToolAnnotations

    tasks = JobTasks()
    view_tokens = ViewTokens()
    skill_index = SkillIndex()
    mcp = edge.new_server(server_instructions(cfg), tasks)

    read_only = hints(read_only=True, destructive=False, idempotent=True, open_world=False)
    launches = hints(read_only=False, destructive=False, idempotent=False, open_world=True)
    destructive = hints(read_only=False, destructive=True, idempotent=True, open_world=False)

    def tool(annotations: ToolAnnotations, title: str, meta: dict[str, Any] | None = None
             ) -> Callable[[Callable[..., Any]], Any]:
        """Register a tool; its docstring, without the source's indentation, is the description. A `ctx`
        parameter gets the installed line's Context class, by which the SDK recognises it."""
        def register(fn: Callable[..., Any]) -> Any:
            if "ctx" in fn.__annotations__:
                fn.__annotations__["ctx"] = edge.context_class
            return mcp.tool(annotations=annotations, title=title, description=inspect.cleandoc(fn.__doc__ or ""),
                            meta=meta)(fn)
        return register

    async def respond(tool_name: str, body: Callable[[Config], Awaitable[ToolResult]],
                      task: Any = None) -> CallToolResult:
        """The text as the model reads it; a job's facts as structuredContent, with a one-time token for the
        job view in _meta."""
        outcome = await run_tool_body(tool_name, body, task)
        tasks.keep(outcome)
        result: dict[str, Any] = {"content": [{"type": "text", "text": outcome.text}], "isError": outcome.is_error}
        if outcome.facts is not None:
            result.update(structuredContent=outcome.facts, _meta={"viewToken": view_tokens.issue()})
        return CallToolResult.model_validate(result)


    @tool(launches, "Run a task with Hermes", VIEW_LINK)
    async def hermes_run(task: str, ctx: Any, cwd: str | None = None, max_turns: int | None = None,
                         timeout_s: float | None = None, wait_s: float | None = None,
                         skills: list[str] | str | None = None, toolsets: list[str] | str | None = None,
                         max_tokens: int | None = None, max_cost_usd: float | None = None,
                         isolation: str | None = None, isolation_base: str | None = None) -> CallToolResult:
        """Start a fresh Hermes job in cwd (an absolute folder inside the allowed roots). Returns the result
        if it ends within wait_s (default 5 s), else STATUS: running and a JOB_ID to pass to hermes_status.
        The task must be self-contained: absolute paths and a definition of done. max_tokens and
        max_cost_usd (Hermes' estimate) are budgets: past one the job is stopped and ends over_budget.
        isolation "worktree" runs the job in a git worktree of its own (cwd must be in a repository): its
        work lands only through hermes_land; isolation_base "working-tree" starts it from the user's
        uncommitted files too (default: HEAD)."""
        wait, ask = 0 if tasks.as_task() else wait_s, user_asker(ctx, tasks)
        arguments = LaunchArguments(task, cwd, max_turns, timeout_s, skills, toolsets, max_tokens, max_cost_usd,
                                    isolation, isolation_base)
        return await respond("hermes_run", lambda cfg: run_tool(cfg, arguments, wait, ctx.report_progress, ask), task)

    @tool(launches, "Continue a Hermes session", VIEW_LINK)
    async def hermes_resume(session_id: str, task: str, ctx: Any, cwd: str | None = None,
                            max_turns: int | None = None, timeout_s: float | None = None,
                            wait_s: float | None = None, max_tokens: int | None = None,
                            max_cost_usd: float | None = None) -> CallToolResult:
        """Continue a Hermes session with a new task (session_id from a SESSION_ID line, or "latest" for the
        newest session a job of this bridge captured). Hermes resumes a session in the folder recorded for
        it, so the job runs there (it must be inside the allowed roots); cwd is only checked against it.
        Same waiting rules as hermes_run."""
        wait, ask = 0 if tasks.as_task() else wait_s, user_asker(ctx, tasks)
        arguments = LaunchArguments(task, cwd, max_turns, timeout_s, max_tokens=max_tokens, max_cost_usd=max_cost_usd)
        return await respond("hermes_resume",
                             lambda cfg: resume_tool(cfg, session_id, arguments, wait, ctx.report_progress, ask), task)

    @tool(read_only, "Wait for a Hermes job", VIEW_LINK)
    async def hermes_status(ctx: Any, job_id: str | None = None, wait_s: float | None = None,
                            job_ids: list[str] | None = None, until: str | None = None) -> CallToolResult:
        """Wait up to wait_s (default 30) for a job to end, then return its final block, or STATUS: running
        again. It waits for you: do not call it in a tight loop. Reads only the disk. For several jobs give
        job_ids (a list) instead, and until "any" (default: return once one has ended) or "all"."""
        return await respond("hermes_status", lambda cfg: status_tool(cfg, job_id, wait_s, ctx.report_progress,
                                                                      user_asker(ctx, tasks), job_ids, until))

    @tool(read_only, "List Hermes jobs")
    async def hermes_jobs(limit: int | None = None, state: str | None = None) -> CallToolResult:
        """Jobs on disk, newest first (default limit 50): id, state, duration, cwd, first words of the task.
        state filters: running, ok, error, timeout, cancelled, over_budget, orphaned, damaged."""
        return await respond("hermes_jobs", lambda cfg: listing_tool(list_jobs, cfg, limit, state))

    @tool(read_only, "Read a file or folder")
    async def hermes_read(path: str, max_bytes: int | None = None, offset: int | None = None) -> CallToolResult:
        """Read a file (a byte range: offset, negative = from the end, to page a job log; max_bytes, default
        20000) or list a folder, to verify Hermes' work without waking an agent. Confined to the allowed
        roots and the job files."""
        return await respond("hermes_read", lambda cfg: listing_tool(read_path, cfg, path, max_bytes, offset))

    @tool(read_only, "Hermes skills")
    async def hermes_capabilities(query: str | None = None, category: str | None = None,
                                  limit: int | None = None) -> CallToolResult:
        """Hermes' installed skills, read from disk. No arguments: categories with counts. query: ranked
        matches over name, description and tags. category: the skills of one category."""
        return await respond("hermes_capabilities",
                             lambda cfg: listing_tool(capabilities, cfg, skill_index, query, category, limit))

    @tool(read_only, "Bridge health")
    async def hermes_health() -> CallToolResult:
        """Is Hermes found, which options its command line declares, config problems, allowed roots, job
        counts. Instant: starts no process."""
        return await respond("hermes_health", lambda now: listing_tool(health, now, cfg))

    @tool(destructive, "Answer Hermes' question")
    async def hermes_approve(job_id: str, approval_id: str, decision: str) -> CallToolResult:
        """Answer the question a job waits on (STATUS: needs_approval): decision "allow" lets Hermes run what
        its APPROVAL line says, "deny" blocks it, "allow_for_job" also allows the same exact command when this
        job asks again. Ask the user first: this lets an agent run a command it
        deems dangerous. An answer after Hermes stopped waiting is refused."""
        return await respond("hermes_approve", lambda cfg: approve_tool(cfg, job_id, approval_id, decision))

    @tool(destructive, "Cancel a Hermes job")
    async def hermes_cancel(job_id: str, ctx: Any) -> CallToolResult:
        """Stop a running job and its whole process tree; the job ends as cancelled. Work may be part-done."""
        return await respond("hermes_cancel", lambda cfg: cancel_tool(cfg, job_id, ctx.report_progress))

    register_review(mcp, tool, respond, view_tokens)
    return mcp


LONE_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def replace_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        return "".join("\ufffd" if "\ud800" <= ch <= "\udfff" else ch for ch in value)
    if isinstance(value, list):
        return [replace_surrogates(item) for item in value]
    if isinstance(value, dict):
        return {replace_surrogates(k): replace_surrogates(v) for k, v in value.items()}
    return value


class ProtocolLines:
    """The client's input, line by line, with lone UTF-16 surrogates replaced by U+FFFD.

    The SDK cannot parse a request holding a lone surrogate and then never answers it, so the host would
    wait for its timeout; replaced, the request is answered (and a task holding U+FFFD is refused)."""

    def __init__(self, stream: Any):
        self.stream = stream

    def readline(self) -> str:
        line: str = self.stream.readline()
        if not LONE_SURROGATE_ESCAPE.search(line):
            return line
        try:
            message = json.loads(line)
        except ValueError:
            return line
        return json.dumps(replace_surrogates(message), ensure_ascii=False) + "\n"


def release_freed_memory() -> None:
    """Give back to the system what Python has freed by now: the syntax tree of this script, freed once the
    script returned (serve_after_the_script; importing the SDK takes far longer than that), about 10 MB that
    glibc keeps unless asked to trim. Measured: 80.4 MB with neither, 79.3 with the thread alone, 68.7 with
    both, 65.5 for a minimal server. Only glibc has malloc_trim: elsewhere this does nothing (on Windows
    ctypes.CDLL(None) raises TypeError, which once killed the server at start)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):  # musl has no malloc_trim
        ctypes.CDLL(None).malloc_trim(0)


async def serve(protocol_fds: tuple[int, int]) -> None:
    """Serve MCP over the client's pipes kept by the stdio guard."""
    from io import TextIOWrapper

    import anyio
    from mcp.server.stdio import stdio_server

    cfg = load_config()
    config = (f"config {cfg.path}" if cfg.file_stamp is not None
              else f"no config file (looked in: {config_search()})")
    sys.stderr.write(f"claude-hermes-bridge {VERSION}: python {sys.version.split()[0]} ({sys.executable}), "
                     f"mcp {dependency_version('mcp') or 'not installed'}, {config} "
                     f"({plural(len(cfg.problems), 'problem')})\n")
    sys.stderr.flush()
    edge = McpEdge()
    server = build_server(cfg, edge)
    threading.Thread(target=recover_worktrees, args=(cfg,), name="recover worktrees", daemon=True).start()
    release_freed_memory()
    lines = ProtocolLines(TextIOWrapper(os.fdopen(protocol_fds[0], "rb"), encoding="utf-8", errors="replace"))
    stdin = anyio.wrap_file(cast(Any, lines))
    stdout = anyio.wrap_file(TextIOWrapper(os.fdopen(protocol_fds[1], "wb"), encoding="utf-8"))
    lowlevel = edge.lowlevel(server)
    async with stdio_server(stdin=stdin, stdout=stdout) as (read_stream, write_stream):
        await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())


def serve_after_the_script(protocol_fds: tuple[int, int]) -> None:
    """Serve from a thread and let the script return: CPython keeps a script's whole syntax tree until the
    script ends (about 12 MB for this file), and a server's script would never end. The interpreter waits
    for the thread before it exits; Ctrl-C in a terminal ends the process at once (jobs live on in their
    supervisors)."""
    import anyio

    signal.signal(signal.SIGINT, signal.SIG_DFL)
    threading.Thread(target=anyio.run, args=(serve, protocol_fds), name="mcp-server").start()


# ------------------------------------------------------------------ command line: the server's modes [server]
def result_text(result: Any) -> str:
    """The text of a tool result, on either SDK line."""
    return "\n".join(getattr(item, "text", "") for item in result.content)


def either(result: Any, snake: str) -> Any:
    """A result attribute by its 2.x (snake_case) or 1.x (camelCase) name."""
    if hasattr(result, snake):
        return getattr(result, snake)
    head, *rest = snake.split("_")
    return getattr(result, head + "".join(part.title() for part in rest))


async def check_server(command: list[str], env: dict[str, str] | None = None,
                       timeout_s: float = 60) -> tuple[bool, list[str]]:
    """Start a server as a host would, over stdio with the official client, and check what a host needs."""
    import tempfile

    import anyio
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    report: list[str] = [f"interpreter: {sys.executable} (python {sys.version.split()[0]})",
                         f"mcp: {dependency_version('mcp') or 'not installed'}", f"server command: {' '.join(command)}"]
    params = StdioServerParameters(command=command[0], args=command[1:], env=env or dict(os.environ))
    with tempfile.TemporaryFile("w+") as errlog:
        try:
            with anyio.fail_after(timeout_s):
                async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
                    init = await session.initialize()
                    report.append(f"protocol: {either(init, 'protocol_version')}; server "
                                  f"{either(init, 'server_info').name}")
                    tools = sorted(t.name for t in (await session.list_tools()).tools)
                    health_result = (await session.call_tool("hermes_health", {})
                                     if "hermes_health" in tools else None)
                    try:
                        page = (await session.read_resource(cast(Any, JOB_VIEW_URI))).contents
                        page_text = getattr(page[0], "text", "") if page else ""
                    except Exception as exc:  # noqa: BLE001 (the page's absence is reported, not raised)
                        page_text = f"({exc})"
        except BaseException as exc:  # noqa: BLE001 (a cancelled scope or an exception group: report, do not crash)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            errlog.seek(0)
            stderr_tail = errlog.read()[-2000:].strip()
            report.append(f"FAIL: the server did not complete the handshake: {type(exc).__name__}: {exc}")
            if stderr_tail:
                report.append("server stderr:\n" + stderr_tail)
            return False, report
    ok = tools == sorted(TOOL_NAMES)
    report.append(f"tools: {len(tools)} ({'exactly the declared tools' if ok else 'MISMATCH'})")
    if not ok:
        report.append(f"FAIL: expected {sorted(TOOL_NAMES)}, got {tools}")
    if "<html" in page_text:
        report.append(f"job view: {JOB_VIEW_URI}, {len(page_text):,} characters")
    else:
        ok = False
        report.append(f"FAIL: the job view's page could not be read {page_text[:300]}; it ships beside server.py "
                      "(job_view.html)")
    if health_result is None or either(health_result, "is_error"):
        report.append("FAIL: hermes_health did not succeed")
        return False, report
    kept = ("HERMES_EXE", "HERMES_VERSION", "CLI_FLAGS", "CLI_COMMAND", "ALLOWED_ROOTS", "CONFIG", "  - ")
    report.extend(line.strip() for line in result_text(health_result).splitlines() if line.startswith(kept))
    return ok, report


def hermes_runs(cfg: Config, exe: str) -> tuple[bool, str]:
    """Start the Hermes found once, `hermes --version`, bounded: a file that exists is not yet a Hermes that
    runs (a broken venv, a wrong architecture, a missing library)."""
    try:
        done = subprocess.run([exe, "--version"], stdin=subprocess.DEVNULL, capture_output=True, timeout=60,
                              env=hermes_env(cfg))
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"NO: `{exe} --version` could not run: {exc}"
    said = clean_text(done.stdout + done.stderr).strip().splitlines()
    first = shown(said[0], 200) if said else "(it printed nothing)"
    if done.returncode != 0:
        return False, f"NO: `{exe} --version` exited {done.returncode}: {first}"
    return True, f"yes: {first}"


def check(serve_command: list[str]) -> int:
    """--check: the server as a host starts it, then Hermes started once. Exit 0 (CHECK: OK) when a job can
    run; 3 (CHECK: INCOMPLETE) when the server works but no job can run yet (no Hermes, no roots), saying
    why; 1 (CHECK: FAILED) when the server or the Hermes found does not work."""
    import anyio

    ok, report = anyio.run(check_server, serve_command)
    report.insert(1, f"config search: {config_search()}")
    blockers: list[str] = []
    if ok:
        cfg = load_config()
        hermes = locate_hermes(cfg)
        if hermes.usable:
            ran, line = hermes_runs(cfg, hermes.usable)
            report.append(f"HERMES_RUNS: {line}")
            ok = ran
            if ran:
                report += [driver_line(cfg, hermes.usable, probe=True),
                           f"APPROVALS: {approvals_line(cfg, hermes.usable)}"]
        else:
            blockers.append(f"no usable Hermes: {hermes.problem}")
        if not cfg.roots:
            blockers.append(roots_missing(cfg))
    print("\n".join(report))
    if not ok:
        print("CHECK: FAILED")
        return 1
    if blockers:
        print("CHECK: INCOMPLETE: the server works, but no job can run yet: " + "; ".join(blockers))
        return 3
    print("CHECK: OK")
    return 0


def init_config(settings: dict[str, Any], force: bool, create_roots: bool = False) -> int:
    """--init-config: a starting config in the per-user folder (the one a bundle or uvx install reads),
    every key at its default and the given settings filled in; an existing file is kept unless force. A root
    that does not exist is refused (it would be ignored), unless create_roots makes it."""
    path = cast(Path, config_places()[-1][1])
    if path.exists() and not force:
        sys.stderr.write(f"claude-hermes-bridge: {path} exists; nothing written (add --force to replace it)\n")
        return 1
    absent = [root for root in settings.get("allowed_roots", []) if not os.path.isdir(root)]
    if absent and not create_roots:
        sys.stderr.write(f"claude-hermes-bridge: --allowed-roots {', '.join(absent)}: no such folder, so jobs could "
                         "not start there; nothing written. Create it (or add --create-roots), then run this again\n")
        return 1
    for root in absent:
        os.makedirs(root, exist_ok=True)
        print(f"created {root}")
    defaults = Config(path=path)
    values = {key: settings.get(key, getattr(defaults, key)) for key in SETTINGS if key != "yolo"}
    values["approvals"] = Config(path=path, yolo=bool(settings.get("yolo")),
                                 approvals=settings.get("approvals")).approval_mode  # yolo is its older spelling
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, (json.dumps(values, indent=2) + "\n").encode())
    print(f"wrote {path}")
    if not values["allowed_roots"]:
        print("next: list the folders Hermes may work in under allowed_roots, then run --check")
    return 0


TRY_QUESTION_RE = re.compile(r"^APPROVAL_ID: (\S+)\nAPPROVAL: (.*)\nAPPROVAL_WAITS_S: (\d+) \((.*)\)$", re.MULTILINE)


async def try_task(command: list[str], task: str, cwd: str | None, terminal: bool | None = None) -> bool:
    """The first-run smoke test: the server started as a host would, one hermes_run, then hermes_status
    until the job ends, printing each block as it comes; True only on STATUS: ok. When Hermes asks, a terminal
    is asked the question (the command, why, until when Hermes waits; y or n) and its answer relayed; without
    a terminal it says how to answer (the exact hermes_approve arguments) and goes on waiting for the end."""
    import anyio
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ))
    started = time.monotonic()
    terminal = sys.stdin.isatty() if terminal is None else terminal
    told: set[str] = set()

    async def progress(_done: float, _total: Any, message: Any) -> None:
        print(f"... {message or 'running'} ({time.monotonic() - started:.0f} s)", flush=True)

    with anyio.fail_after(24 * 3600):
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            arguments: dict[str, Any] = {"task": task, "wait_s": 5}
            if cwd:
                arguments["cwd"] = cwd
            text = result_text(await session.call_tool("hermes_run", arguments))
            print(text, flush=True)
            while text.startswith(("STATUS: running", "STATUS: needs_approval")):
                job_id = cast(re.Match[str], re.search(r"^JOB_ID: (\S+)$", text, re.MULTILINE)).group(1)
                new = [found for found in TRY_QUESTION_RE.findall(text) if found[0] not in told]
                if text.startswith("STATUS: needs_approval") and not new:
                    await anyio.sleep(2)  # every question is with the user: the status would answer at once
                for approval_id, question, waits_s, deadline in new:
                    told.add(approval_id)
                    print(f"\nQUESTION {approval_id}: {question}\n{deadline}.", flush=True)
                    decision = await answer_on_terminal(int(waits_s)) if terminal else None
                    if decision is None:
                        print(f"To answer, call hermes_approve(job_id=\"{job_id}\", approval_id=\"{approval_id}\", "
                              "decision=\"allow\" or \"deny\") from your MCP host; this waits for the job's end.",
                              flush=True)
                        continue
                    answered = result_text(await session.call_tool("hermes_approve", {
                        "job_id": job_id, "approval_id": approval_id, "decision": decision}))
                    print(answered.split("\n--- ", 1)[0], flush=True)
                result = await session.call_tool("hermes_status", {"job_id": job_id, "wait_s": 30},
                                                 progress_callback=cast(Any, progress))
                shown_before, text = text, result_text(result)
                if not text.startswith("STATUS: running") and text.split("\n", 1)[0] != shown_before.split("\n", 1)[0]:
                    print(text, flush=True)
    return text.startswith("STATUS: ok")


async def answer_on_terminal(waits_s: int) -> str | None:
    """y or n from the terminal, asked until Hermes stops waiting; None when the time ran out first."""
    import anyio

    print(f"Allow it? [y/N] (Hermes decides by itself in {waits_s} s) ", end="", flush=True)
    with anyio.move_on_after(max(1, waits_s - 1)):
        reply = await anyio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
        return "allow" if reply.strip().lower() in ("y", "yes") else "deny"
    print("\n(no answer in time: Hermes decides by itself)", flush=True)
    return None


def parse_command_line(argv: list[str]) -> Any:
    """The host's settings and the modes. argparse is imported here, not at the top, so a supervisor
    (`--supervise`, parsed by hand) never loads it."""
    import argparse

    class OneLineParser(argparse.ArgumentParser):
        """A bad option is one line on stderr and exit 2, before any transport opens."""

        def error(self, message: str) -> NoReturn:
            sys.stderr.write(f"claude-hermes-bridge: {message} (server.py --help lists the options)\n")
            sys.exit(2)

    parser = OneLineParser(prog="server.py", description="claude-hermes-bridge: an MCP stdio server that runs "
                           "tasks with Hermes. With no mode option it serves MCP over stdio.")
    settings = parser.add_argument_group("settings (they win over the config file)")
    settings.add_argument("--allowed-roots", nargs="+", metavar="DIR", help="folders jobs may start in")
    settings.add_argument("--hermes-exe", metavar="PATH", help="the hermes executable")
    settings.add_argument("--hermes-home", metavar="DIR", help="Hermes' home (skills, sessions)")
    settings.add_argument("--approvals", choices=APPROVAL_MODES, help="when Hermes asks before a dangerous "
                          "command: deny it (default), ask the user, or allow it (yolo)")
    settings.add_argument("--yolo", nargs="?", const="true", choices=("true", "false"),
                          help="Hermes auto-approves commands it deems dangerous")
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--check", action="store_true", help="start the server as a host would and check it")
    modes.add_argument("--try", dest="try_task", metavar="TASK", help="run one task through the server as a "
                       "host would, and wait for its end")
    modes.add_argument("--version", action="store_true")
    modes.add_argument("--init-config", action="store_true", help="write a starting config.json in the per-user "
                       "folder, with the settings given here filled in")
    parser.add_argument("--force", action="store_true", help="with --init-config: replace an existing file")
    parser.add_argument("--create-roots", action="store_true", help="with --init-config: create the allowed roots "
                        "that do not exist yet")
    parser.add_argument("--cwd", metavar="DIR", help="with --try: the folder to run the task in")
    args = parser.parse_args(argv)
    for root in args.allowed_roots or []:
        if not os.path.isabs(os.path.expanduser(root)):
            parser.error(f"--allowed-roots {root!r} is not an absolute path")
    if args.cwd and not args.try_task:
        parser.error("--cwd goes with --try")
    if args.create_roots and not args.init_config:
        parser.error("--create-roots goes with --init-config")
    if args.init_config and args.hermes_exe is not None and not args.hermes_exe.strip():
        parser.error("--hermes-exe is empty (was it `$(which hermes)` with Hermes in a venv not on PATH?): give "
                     "Hermes' absolute path, e.g. the venv's bin/hermes (Scripts\\hermes.exe on Windows)")
    return args


def host_hermes_exe(value: str) -> str:
    """--hermes-exe as an absolute path, fixed when the server starts: a bare name is looked up on PATH now,
    and a relative path is refused (it would name whatever sits in the folder the host started us in)."""
    import shutil

    expanded = os.path.expanduser(value)
    if os.path.isabs(expanded):
        return expanded
    bare = os.sep not in expanded and (os.altsep is None or os.altsep not in expanded)
    found = shutil.which(expanded) if bare else None
    if found:
        return os.path.abspath(found)
    why = "is not on PATH" if bare else "is a relative path"
    sys.stderr.write(f"claude-hermes-bridge: --hermes-exe {value!r} {why}; give Hermes' absolute path "
                     "(server.py --help lists the options)\n")
    sys.exit(2)


def settings_of(args: Any) -> dict[str, Any]:
    """The host's settings from parsed options; an empty value (an unset bundle field) is no setting."""
    settings: dict[str, Any] = {}
    if args.allowed_roots:
        settings["allowed_roots"] = [os.path.expanduser(root) for root in args.allowed_roots if root]
    if args.hermes_exe:
        settings["hermes_exe"] = host_hermes_exe(args.hermes_exe)
    if args.hermes_home:
        settings["hermes_home"] = os.path.abspath(os.path.expanduser(args.hermes_home))
    if args.yolo is not None:
        settings["yolo"] = args.yolo == "true"
    if args.approvals:
        settings["approvals"] = args.approvals
    return settings


UNSET_PLACEHOLDER_RE = re.compile(r"\$\{user_config\.[^}]*\}")


def without_unset_settings(argv: list[str]) -> list[str]:
    """The command line without the settings a bundle host left unset. Claude Desktop (mcpb's
    getMcpConfigForManifest) keeps `${user_config.key}` as it is when an optional field is empty, so
    `--hermes-exe '${user_config.hermes_exe}'` means "no --hermes-exe": an option whose every value is such a
    placeholder is dropped with them."""
    kept: list[str] = []
    index = 0
    while index < len(argv):
        end = index + 1
        while end < len(argv) and not argv[end].startswith("-"):
            end += 1
        option, values = argv[index], argv[index + 1:end]
        if not (option.startswith("-") and values and all(UNSET_PLACEHOLDER_RE.fullmatch(v) for v in values)):
            kept += [arg for arg in argv[index:end] if not UNSET_PLACEHOLDER_RE.fullmatch(arg)]
        index = end
    return kept


# --------------------------------------------------------- command line: main, which picks the program [both]
def main(argv: list[str], protocol_fds: tuple[int, int] | None = None) -> int:
    if len(argv) == 2 and argv[0] == "--supervise":  # the fast path: no argparse, no MCP
        problem = missing_dependencies(need_mcp=False)
        if problem:
            sys.stderr.write(problem + "\n")
            return 2
        cfg = load_config()
        supervisor = Supervisor(validate_job_id(argv[1]), cfg, JobStore.of(cfg),
                                subreaper=become_subreaper())
        signal.signal(signal.SIGTERM, supervisor.on_sigterm)
        return supervisor.run()
    args = parse_command_line(without_unset_settings(argv))
    if args.version:
        print(f"claude-hermes-bridge {VERSION}")
        return 0
    settings = settings_of(args)
    if args.init_config:
        return init_config(settings, args.force, args.create_roots)
    if settings:
        os.environ[SETTINGS_ENV] = json.dumps(settings)
    problem = missing_dependencies(need_mcp=True)
    if problem:
        sys.stderr.write(problem + "\n")
        return 2
    import anyio

    serve_command = [sys.executable, str(SERVER_FILE)]
    if args.check:
        return check(serve_command)
    if args.try_task is not None:
        return 0 if anyio.run(try_task, serve_command, args.try_task, args.cwd) else 1
    assert protocol_fds is not None, "serves_protocol() and main() disagree about this command line"
    serve_after_the_script(protocol_fds)
    return 0



def console_main() -> None:
    """The wheel's console script, `claude-hermes-bridge`: the module is imported there, not run, so the
    stdio guard runs here first, before anything can print."""
    sys.exit(main(sys.argv[1:], guard_stdio() if serves_protocol(sys.argv[1:]) else None))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], PROTOCOL_FDS))
