"""[both] Names, escaping, path decisions, safe opening, atomic writes, a file lock, process identity."""
import contextlib
import dataclasses
import errno
import json
import math
import os
import re
import stat
import sys
import time
import unicodedata
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar, cast

import psutil

# Small pieces every later section uses. Every file the bridge reads may have been written by a job running
# as the user, so reading means open_regular (no FIFO, no symlink, capped) and writing means write_atomic.
T = TypeVar("T")


IS_WINDOWS = os.name == "nt"
# The tools every host lists; the job view's own are listed only to a host that declared MCP Apps.
TOOL_NAMES = (
    "hermes_run", "hermes_resume", "hermes_status", "hermes_jobs",
    "hermes_read", "hermes_capabilities", "hermes_health", "hermes_cancel", "hermes_approve", "hermes_steer",
    "hermes_land",
)
APP_ONLY_TOOL_NAMES = ("hermes_view_job", "hermes_view_patch", "hermes_view_answer", "hermes_view_steer")


def plural(count: int, noun: str) -> str:
    """'1 problem', '2 problems', '2 processes'."""
    return f"{count:,} {noun}" + ("" if count == 1 else "es" if noun.endswith("s") else "s")


class Refused(Exception):
    """Bad input or a state that forbids the request: reported as STATUS: refused, nothing started."""


# Characters that reorder, hide or control text where a person reads it are told by their Unicode category, not
# by a list: controls (Cc: C0, DEL and C1, where U+009B is an 8-bit CSI), formats (Cf: bidi embeddings, overrides
# and isolates, zero-width characters, U+061C, U+2060, U+00AD, U+180E, the byte order mark), and the line and
# paragraph separators (Zl, Zp). Printable ASCII never is one: only other characters are looked up.
HIDING_CATEGORIES = ("Cc", "Cf", "Zl", "Zp")
NOT_PRINTABLE_ASCII_RE = re.compile(r"[^\x20-\x7e]")


def is_hiding(char: str, keep: str = "") -> bool:
    """Whether char is a control, format or separator character (not one of keep)."""
    return char not in keep and unicodedata.category(char) in HIDING_CATEGORIES


def as_escape(match: re.Match[str]) -> str:
    return match.group().encode("unicode_escape").decode("ascii")


def escape_hiding(text: str, keep: str = "") -> str:
    """Every control, format and separator character but those in keep as its visible escape (\\n, \\u202e)."""
    return NOT_PRINTABLE_ASCII_RE.sub(lambda match: as_escape(match) if is_hiding(match.group(), keep)
                                      else match.group(), text)


def count_hiding(text: str, keep: str = "") -> int:
    return sum(1 for match in NOT_PRINTABLE_ASCII_RE.finditer(text) if is_hiding(match.group(), keep))


def unhidden(text: str) -> str:
    """Text as a person should read it: line breaks and tabs kept, every other hiding character as its escape."""
    return escape_hiding(text, "\n\t\r")


def escaped(text: str) -> str:
    """Every control, line-separating or text-hiding character as its visible escape (\\n, \\u202e)."""
    return escape_hiding(text)


def shown(value: Any, limit: int = 200) -> str:
    """A value quoted back to the model: at most `limit` characters, control characters escaped, so an
    argument or a folder name can neither flood a reply nor forge a line of it."""
    text = value if isinstance(value, str) else repr(value)
    cut = len(text) > limit
    return escaped(text[:limit]) + (f"... ({len(value) if isinstance(value, str) else '?'} chars)" if cut else "")


def disk_error(exc: BaseException) -> str:
    """An error of the disk in words: the file and what the system said (No space left on device)."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    return f"{type(exc).__name__}: {shown(str(exc), 200)}"


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
