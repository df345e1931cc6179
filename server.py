#!/usr/bin/env python3
# /// script
# requires-python = ">=3.10"
# dependencies = ["mcp>=1.24,<2", "psutil>=5.9", "PyYAML>=6", "filelock>=3.12"]
# ///
"""claude-hermes-bridge: an MCP stdio server that gives a planner (Claude Desktop or any MCP host) an
executor, the Hermes Agent CLI, on the same machine.

The one decision that shapes it: a job never lives inside a request. A job is a record, a log and a
detached supervisor process on disk, so every tool returns within seconds, a job outlives the server
process that started it, and any later server process can answer for it or cancel it.

Read top to bottom in the order data flows: stdio guard, config, confinement, job store, Hermes CLI,
supervisor and process control, rendering, the MCP tools, command line.
"""

import os
import sys


# ------------------------------------------------------------------------------------------ stdio guard
def guard_stdio() -> tuple[int, int]:
    """Move the client's pipes to private fds; fd 0 becomes the null device and fd 1 becomes stderr.

    After this a print() anywhere, or a child that inherits fd 1, writes to stderr and can never corrupt
    the JSON-RPC stream. os.dup() returns non-inheritable fds, so no child ever holds the protocol pipes.
    """
    protocol_in, protocol_out = os.dup(0), os.dup(1)
    null_fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null_fd, 0)
    os.close(null_fd)
    os.dup2(2, 1)
    return protocol_in, protocol_out


PROTOCOL_FDS = guard_stdio() if __name__ == "__main__" and sys.argv[1:] == [] else None

import dataclasses  # noqa: E402  (the guard must run before anything else can print)
import hashlib  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import stat  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

try:
    import psutil
except ImportError:  # reported with its fix by missing_dependencies()
    psutil = None  # type: ignore[assignment]

VERSION = "0.1.0"
SERVER_FILE = Path(__file__).resolve()
SERVER_DIR = SERVER_FILE.parent
IS_WINDOWS = os.name == "nt"
TOOL_NAMES = (
    "hermes_run", "hermes_resume", "hermes_status", "hermes_jobs",
    "hermes_read", "hermes_capabilities", "hermes_health", "hermes_cancel",
)


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
        major_minor = tuple(int(p) for p in re.findall(r"\d+", found or "0")[:2])
        if found is None or major_minor < (1, 24) or major_minor >= (2, 0):
            return (f"claude-hermes-bridge needs the MCP Python SDK 1.x (mcp>=1.24,<2); interpreter "
                    f"{sys.executable} has {'no mcp' if found is None else 'mcp ' + found}. "
                    f"Fix: \"{sys.executable}\" -m pip install \"mcp>=1.24,<2\"")
    for module, package in (("psutil", "psutil"), ("yaml", "PyYAML"), ("filelock", "filelock")):
        if importlib.util.find_spec(module) is None:
            return (f"claude-hermes-bridge needs {package}; interpreter {sys.executable} does not have it. "
                    f"Fix: {fix}")
    return None


class Refused(Exception):
    """Bad input or a state that forbids the request: reported as STATUS: refused, nothing started."""


# ----------------------------------------------------------------------------------------------- config
MAX_WAIT_CEILING_S = 50.0
START_GRACE_S = 30.0  # a launched job whose supervisor has not reported by then is orphaned


@dataclasses.dataclass
class Config:
    """config.json as the server uses it. Every problem found while loading is kept, never raised."""

    path: Path
    hermes_exe: str | None = None
    hermes_home: str | None = None
    allowed_roots: list[str] = dataclasses.field(default_factory=list)
    default_cwd: str | None = None
    default_timeout_s: float = 1800
    max_timeout_s: float = 14400
    default_max_turns: int | None = None
    max_wait_s: float = 45
    max_output_chars: int = 8000
    max_running_jobs: int = 4
    yolo: bool = False
    hermes_cli_form: str = "auto"
    extra_args: list[str] = dataclasses.field(default_factory=list)
    jobs_dir: str | None = None
    logs_dir: str | None = None
    read_anywhere: bool = False
    kill_grace_s: float = 5
    retention_days: float = 30
    retention_max_jobs: int = 1000
    audit_max_bytes: int = 1_000_000
    problems: list[str] = dataclasses.field(default_factory=list)

    def _dir(self, value: str | None, default: str) -> Path:
        if not value:
            return SERVER_DIR / default
        path = Path(os.path.expanduser(value))
        return path if path.is_absolute() else self.path.parent / path

    @property
    def jobs_path(self) -> Path:
        return self._dir(self.jobs_dir, "jobs")

    @property
    def logs_path(self) -> Path:
        return self._dir(self.logs_dir, "logs")

    @property
    def roots(self) -> list[str]:
        """The allowed roots that exist, resolved: the only places a job may start."""
        resolved = []
        for root in self.allowed_roots:
            real = os.path.realpath(os.path.expanduser(root))
            if os.path.isdir(real):
                resolved.append(real)
        return resolved

    @property
    def hermes_home_path(self) -> Path:
        if self.hermes_home:
            return Path(os.path.expanduser(self.hermes_home))
        if os.environ.get("HERMES_HOME"):
            return Path(os.environ["HERMES_HOME"])
        if IS_WINDOWS and os.environ.get("LOCALAPPDATA"):
            return Path(os.environ["LOCALAPPDATA"]) / "hermes"
        return Path.home() / ".hermes"


CONFIG_TYPES: dict[str, tuple[str, tuple[type, ...]]] = {
    "hermes_exe": ("a path string or null", (str, type(None))),
    "hermes_home": ("a path string or null", (str, type(None))),
    "allowed_roots": ("a list of folder paths", (list,)),
    "default_cwd": ("a folder path or null", (str, type(None))),
    "default_timeout_s": ("a number of seconds", (int, float)),
    "max_timeout_s": ("a number of seconds", (int, float)),
    "default_max_turns": ("a whole number or null", (int, type(None))),
    "max_wait_s": ("a number of seconds", (int, float)),
    "max_output_chars": ("a whole number", (int,)),
    "max_running_jobs": ("a whole number", (int,)),
    "yolo": ("true or false", (bool,)),
    "hermes_cli_form": ('"auto", "query-file" or "query-arg"', (str,)),
    "extra_args": ("a list of strings", (list,)),
    "jobs_dir": ("a folder path or null", (str, type(None))),
    "logs_dir": ("a folder path or null", (str, type(None))),
    "read_anywhere": ("true or false", (bool,)),
    "kill_grace_s": ("a number of seconds", (int, float)),
    "retention_days": ("a number of days", (int, float)),
    "retention_max_jobs": ("a whole number", (int,)),
    "audit_max_bytes": ("a whole number of bytes", (int,)),
}


def config_path() -> Path:
    override = os.environ.get("HERMES_BRIDGE_CONFIG")
    return Path(override).expanduser().resolve() if override else SERVER_DIR / "config.json"


def load_config(path: Path | None = None) -> Config:
    """Read config.json; a missing or broken file yields defaults plus a list of problems, never an error."""
    path = path or config_path()
    cfg = Config(path=path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        cfg.problems.append(f"no config file at {path}: copy config.example.json to config.json and set "
                            "allowed_roots")
        return cfg
    except json.JSONDecodeError as exc:
        cfg.problems.append(f"{path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}; "
                            "fix that spot (config.example.json shows the format)")
        return cfg
    except (OSError, UnicodeDecodeError) as exc:
        cfg.problems.append(f"cannot read {path}: {exc}")
        return cfg
    if not isinstance(raw, dict):
        cfg.problems.append(f"{path} must hold a JSON object {{...}}, not {type(raw).__name__}")
        return cfg
    for key, value in raw.items():
        if key.startswith("_"):
            continue  # "_comment" keys document the file
        if key not in CONFIG_TYPES:
            cfg.problems.append(f"unknown key {key!r} in {path.name} (ignored); known keys: "
                                + ", ".join(CONFIG_TYPES))
            continue
        described, types = CONFIG_TYPES[key]
        wrong_bool = isinstance(value, bool) and bool not in types
        if wrong_bool or not isinstance(value, types) or (
                isinstance(value, list) and not all(isinstance(v, str) for v in value)):
            cfg.problems.append(f"{key} must be {described}, got {json.dumps(value)[:60]} (default used)")
            continue
        setattr(cfg, key, value)
    validate_config(cfg)
    return cfg


def validate_config(cfg: Config) -> None:
    """Problems that only show once the values are read: missing roots, out-of-range numbers."""
    if not cfg.allowed_roots:
        cfg.problems.append("allowed_roots is empty: no job can start until you list at least one folder")
    for root in cfg.allowed_roots:
        expanded = os.path.expanduser(root)
        if not os.path.isabs(expanded):
            cfg.problems.append(f"allowed root {root!r} is not an absolute path (ignored)")
        elif not os.path.isdir(expanded):
            cfg.problems.append(f"allowed root {root!r} does not exist or is not a folder (ignored)")
    if cfg.hermes_cli_form not in ("auto", "query-file", "query-arg"):
        cfg.problems.append(f"hermes_cli_form {cfg.hermes_cli_form!r} is not auto, query-file or query-arg "
                            "(auto used)")
        cfg.hermes_cli_form = "auto"
    if cfg.max_wait_s > MAX_WAIT_CEILING_S or cfg.max_wait_s < 1:
        cfg.problems.append(f"max_wait_s {cfg.max_wait_s} is outside 1..{MAX_WAIT_CEILING_S:g} "
                            "(hosts cut calls off at about 60 s); clamped")
        cfg.max_wait_s = min(max(cfg.max_wait_s, 1), MAX_WAIT_CEILING_S)
    for key, low in (("default_timeout_s", 1), ("max_timeout_s", 1), ("max_output_chars", 200),
                     ("max_running_jobs", 1), ("kill_grace_s", 0), ("retention_days", 0),
                     ("retention_max_jobs", 1), ("audit_max_bytes", 10_000)):
        value = getattr(cfg, key)
        if not math.isfinite(value) or value < low:
            default = getattr(Config(path=cfg.path), key)
            cfg.problems.append(f"{key} {value} must be at least {low} (default {default} used)")
            setattr(cfg, key, default)
    if cfg.default_max_turns is not None and cfg.default_max_turns < 1:
        cfg.problems.append("default_max_turns must be at least 1 (Hermes' own default used)")
        cfg.default_max_turns = None
    if cfg.hermes_exe and not os.path.exists(os.path.expanduser(cfg.hermes_exe)):
        cfg.problems.append(f"hermes_exe {cfg.hermes_exe!r} does not exist")
    if cfg.default_cwd and not within_any(os.path.realpath(os.path.expanduser(cfg.default_cwd)), cfg.roots):
        cfg.problems.append(f"default_cwd {cfg.default_cwd!r} is not an existing folder inside allowed_roots")


# ------------------------------------------------------------------------------------------ confinement
def same_case(path: str) -> str:
    """Windows paths compare case-insensitively; elsewhere case matters."""
    return os.path.normcase(path)


def within_any(resolved: str, roots: list[str]) -> bool:
    """True when a resolved path sits inside one of the resolved roots, compared by whole components."""
    for root in roots:
        try:
            if os.path.commonpath([same_case(resolved), same_case(root)]) == same_case(root):
                return True
        except ValueError:  # different drives on Windows
            continue
    return False


def resolve_path(path: str, what: str) -> str:
    """An absolute path with every symlink followed, or Refused saying what is wrong with it."""
    if not isinstance(path, str) or not path.strip():
        raise Refused(f"{what} is empty: give an absolute path")
    if "\x00" in path:
        raise Refused(f"{what} contains a NUL byte: give a plain absolute path")
    expanded = os.path.expanduser(path)
    if not os.path.isabs(expanded):
        raise Refused(f"{what} {path!r} is relative: give an absolute path")
    try:
        return os.path.realpath(expanded, strict=True)
    except FileNotFoundError:
        raise Refused(f"{what} {path!r} does not exist") from None
    except OSError as exc:  # symlink loop, name too long, permission
        raise Refused(f"{what} {path!r} cannot be resolved: {exc.strerror or exc}") from None


def confine_cwd(cfg: Config, cwd: str | None) -> str:
    """The job's working folder, resolved and inside an allowed root; never 'allow all'."""
    roots = cfg.roots
    if not roots:
        raise Refused("no allowed_roots are configured, so no job may start. Fix: list the folders Hermes "
                      f"may work in under allowed_roots in {cfg.path}")
    chosen = cwd if cwd not in (None, "") else (cfg.default_cwd or roots[0])
    resolved = resolve_path(chosen, "cwd")
    if not within_any(resolved, roots):
        raise Refused(f"cwd {chosen!r} resolves to {resolved}, which is outside the allowed roots "
                      f"({', '.join(roots)}). Use a folder inside one of them, or add a root in {cfg.path}")
    if not os.path.isdir(resolved):
        raise Refused(f"cwd {chosen!r} is not a folder")
    return resolved


def confine_read(cfg: Config, path: str) -> str:
    """A path hermes_read may open: inside the roots or the bridge's own job files, unless read_anywhere."""
    resolved = resolve_path(path, "path")
    if cfg.read_anywhere:
        return resolved
    readable = cfg.roots + [os.path.realpath(cfg.jobs_path)]
    if not within_any(resolved, readable):
        raise Refused(f"path {path!r} resolves to {resolved}, outside the allowed roots and the job files "
                      f"({', '.join(readable)}). Set read_anywhere in {cfg.path} to widen hermes_read")
    return resolved


# ------------------------------------------------------------------------------------------- audit log
AUDIT_HANDLERS: dict[str, Any] = {}


def first_words(text: Any, count: int = 8) -> str:
    """Enough of a task to recognise it in a log, never the whole (it may hold what the user typed)."""
    words = str(text or "").split()
    shown = " ".join(words[:count])[:80]
    return shown + (" ..." if len(words) > count or len(shown) == 80 else "")


def audit(cfg: Config, **fields: Any) -> None:
    """One JSON line per tool call or job state change in logs/audit.log, rotated by size. Never raises:
    a full disk must not turn into a failed tool call. No outputs and no secrets are written."""
    import logging.handlers

    path = str(cfg.logs_path / "audit.log")
    try:
        handler = AUDIT_HANDLERS.get(path)
        if handler is None:
            cfg.logs_path.mkdir(parents=True, exist_ok=True)
            handler = logging.handlers.RotatingFileHandler(path, maxBytes=cfg.audit_max_bytes, backupCount=3,
                                                           encoding="utf-8", delay=True)
            AUDIT_HANDLERS[path] = handler
        line = json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "pid": os.getpid(), **fields})
        handler.handle(logging.makeLogRecord({"msg": line, "levelno": logging.INFO, "levelname": "INFO"}))
    except Exception:  # noqa: BLE001
        pass


# -------------------------------------------------------------------------------------------- job store
JOB_ID_RE = re.compile(r"\d{8}-\d{6}-\d{1,6}")
FINAL_STATES = ("ok", "error", "timeout", "cancelled")


class DamagedRecord(Exception):
    """A job record that cannot be read as one: listed as damaged, never fatal."""


NUMBER_OR_NONE = (int, float, type(None))
RECORD_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "created_at": NUMBER_OR_NONE, "started_at": NUMBER_OR_NONE, "ended_at": NUMBER_OR_NONE,
    "timeout_s": NUMBER_OR_NONE, "exit_code": (int, type(None)), "cwd": (str, type(None)),
    "log": (str, type(None)), "task_preview": (str,), "session_id": (str, type(None)),
    "supervisor": (dict, type(None)), "hermes": (dict, type(None)), "tree": (list,),
}


def validate_job_id(job_id: Any) -> str:
    if not isinstance(job_id, str) or not JOB_ID_RE.fullmatch(job_id):
        shown = repr(job_id)[:60]
        raise Refused(f"job_id {shown} is not a job id: ids look like 20261106-101500-1 (see hermes_jobs)")
    return job_id


def job_sort_key(job_id: str) -> tuple[str, int]:
    stamp, _, counter = job_id.rpartition("-")
    return stamp, int(counter)


def write_atomic(path: Path, data: bytes) -> None:
    """Whole-file write: a reader sees the old content or the new, never half."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        for attempt in range(10):
            try:
                os.replace(tmp, path)
                return
            except PermissionError:  # Windows: a reader holds the target open for a moment
                if attempt == 9 or not IS_WINDOWS:
                    raise
                time.sleep(0.05)
    finally:
        if tmp.exists():
            tmp.unlink()


class JobStore:
    """The jobs folder: <id>.json record, <id>.log output, <id>.task text, active/<id> while unfinished."""

    def __init__(self, root: Path):
        self.root = root
        self.active = root / "active"

    def ensure(self) -> None:
        self.active.mkdir(parents=True, exist_ok=True)

    def record_path(self, job_id: str) -> Path:
        return self.root / f"{job_id}.json"

    def log_path(self, job_id: str) -> Path:
        return self.root / f"{job_id}.log"

    def task_path(self, job_id: str) -> Path:
        return self.root / f"{job_id}.task"

    def cancel_path(self, job_id: str) -> Path:
        return self.root / f"{job_id}.cancel"

    def claim_id(self, task: bytes) -> str:
        """A new id, claimed by creating its task file exclusively so two processes never share one."""
        self.ensure()
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for counter in range(1, 1_000_000):
            job_id = f"{stamp}-{counter}"
            try:
                fd = os.open(self.task_path(job_id), os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_BINARY", 0))
            except FileExistsError:
                continue
            try:
                os.write(fd, task)
            finally:
                os.close(fd)
            return job_id
        raise Refused("no free job id this second; try again")

    def write(self, record: dict[str, Any]) -> None:
        write_atomic(self.record_path(record["id"]), json.dumps(record, indent=1).encode())

    def read(self, job_id: str) -> dict[str, Any]:
        try:
            data = self.record_path(job_id).read_bytes()
        except FileNotFoundError:
            raise Refused(f"no job {job_id} in {self.root} (it may have been pruned; see hermes_jobs)") from None
        except OSError as exc:
            raise DamagedRecord(f"unreadable: {exc.strerror or exc}") from None
        try:
            record = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise DamagedRecord(f"not JSON ({len(data)} bytes)") from None
        if not isinstance(record, dict) or record.get("id") != job_id or not isinstance(record.get("state"), str):
            raise DamagedRecord("not a job record (wrong shape)")
        for field, types in RECORD_FIELD_TYPES.items():
            if field in record and not (isinstance(record[field], types) and not isinstance(record[field], bool)):
                raise DamagedRecord(f"field {field} has the wrong type")
        return record

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
        with_missing_ok(lambda: (self.active / job_id).unlink())

    def remove(self, job_id: str) -> None:
        for path in (self.record_path(job_id), self.log_path(job_id), self.task_path(job_id),
                     self.cancel_path(job_id)):
            with_missing_ok(path.unlink)

    def latest_session_id(self, scan_limit: int = 5000) -> str | None:
        for job_id in reversed(self.list_ids()[-scan_limit:]):
            try:
                session_id = self.read(job_id).get("session_id")
            except (Refused, DamagedRecord):
                continue
            if session_id:
                return session_id
        return None


def with_missing_ok(action: Callable[[], Any]) -> None:
    try:
        action()
    except FileNotFoundError:
        pass


def process_identity(proc: "psutil.Process") -> dict[str, float]:
    return {"pid": proc.pid, "create_time": proc.create_time()}


def alive(identity: dict[str, Any] | None) -> "psutil.Process | None":
    """The process if it still runs and is the same one (pid and start time), else None: pids get reused."""
    if not isinstance(identity, dict):
        return None
    try:
        proc = psutil.Process(int(identity["pid"]))
        if abs(proc.create_time() - float(identity["create_time"])) > 0.5:
            return None
        return None if proc.status() == psutil.STATUS_ZOMBIE else proc
    except (psutil.Error, KeyError, TypeError, ValueError):
        return None


@dataclasses.dataclass
class JobView:
    """A record plus what the disk and the process table say about it now."""

    record: dict[str, Any]
    state: str
    reason: str | None = None

    @property
    def running(self) -> bool:
        return self.state in ("starting", "running")


def observe(record: dict[str, Any]) -> JobView:
    """The job's state as a reader should report it: a dead supervisor without an outcome is orphaned."""
    state = record.get("state")
    if state in FINAL_STATES:
        return JobView(record, state, record.get("reason"))
    if "supervisor" not in record:
        return JobView(record, "running_untracked", "this record has no supervisor pid (written by an older "
                       "bridge), so whether it still runs cannot be told")
    if alive(record.get("supervisor")):
        return JobView(record, "running" if state == "running" else "starting")
    if record.get("supervisor") is None and time.time() - float(record.get("created_at", 0)) < START_GRACE_S:
        return JobView(record, "starting")
    hermes = alive(record.get("hermes"))
    hermes_note = (f"Hermes (pid {hermes.pid}) is still running; hermes_cancel stops it" if hermes
                   else "Hermes is not running")
    return JobView(record, "orphaned", f"the job's supervisor is gone and wrote no outcome; {hermes_note}. "
                   "Inspect the log and the files before re-running.")


# ------------------------------------------------------------------------------------------- Hermes CLI
# Linux caps one argument at 128 KiB (MAX_ARG_STRLEN counts the terminating NUL); Windows caps a whole
# command line at 32,767 characters, so leave room there for the executable and the other flags.
ARGV_TASK_LIMIT = 30_000 if IS_WINDOWS else 131072 - 1
SESSION_ID_RE = re.compile(r"^session_id:\s*(\S+)\s*$", re.MULTILINE)
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}")
CLI_FORMS = ("query-file", "query-arg")


def find_hermes(cfg: Config) -> str | None:
    import shutil

    if cfg.hermes_exe:
        exe = os.path.expanduser(cfg.hermes_exe)
        return exe if os.path.isfile(exe) else None
    return shutil.which("hermes")


def hermes_version_on_disk(exe: str) -> str | None:
    """Hermes' version from the dist-info beside its install; reading it costs no process."""
    prefix = Path(os.path.realpath(exe)).parent.parent
    patterns = ("Lib/site-packages/hermes_agent-*.dist-info",) if IS_WINDOWS else (
        "lib/python*/site-packages/hermes_agent-*.dist-info",)
    for pattern in patterns:
        for dist_info in sorted(prefix.glob(pattern)):
            return dist_info.name[len("hermes_agent-"):-len(".dist-info")]
    return None


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def form_cache_path(cfg: Config) -> Path:
    return cfg.jobs_path / "cli_form_cache.json"


def exe_fingerprint(exe: str) -> str:
    real = os.path.realpath(exe)
    try:
        return f"{real}|{os.stat(real).st_mtime_ns}"
    except OSError:
        return real


def known_cli_form(cfg: Config, exe: str | None) -> tuple[str | None, str]:
    """The command-line form without starting a process: config, version on disk, or an earlier probe."""
    if cfg.hermes_cli_form != "auto":
        return cfg.hermes_cli_form, "set in config"
    if not exe:
        return None, "unknown: Hermes not found"
    version = hermes_version_on_disk(exe)
    if version:
        form = "query-file" if version_tuple(version) >= (0, 20) else "query-arg"
        return form, f"from version {version} on disk"
    try:
        cached = json.loads(form_cache_path(cfg).read_text()).get(exe_fingerprint(exe))
    except (OSError, ValueError, AttributeError):
        cached = None
    if cached in CLI_FORMS:
        return cached, "probed earlier with `hermes chat --help`"
    return None, "not known yet: the first job probes `hermes chat --help`"


def probe_cli_form(cfg: Config, exe: str) -> str:
    """Ask `hermes chat --help` once per executable and remember the answer (about 0.7 s)."""
    result = subprocess.run([exe, "chat", "--help"], stdin=subprocess.DEVNULL, capture_output=True,
                            timeout=60, env=hermes_env(cfg))
    form = "query-file" if b"--query-file" in result.stdout + result.stderr else "query-arg"
    path = form_cache_path(cfg)
    try:
        cache = json.loads(path.read_text())
        cache = cache if isinstance(cache, dict) else {}
    except (OSError, ValueError):
        cache = {}
    cache[exe_fingerprint(exe)] = form
    write_atomic(path, json.dumps(cache, indent=1).encode())
    return form


def hermes_env(cfg: Config) -> dict[str, str]:
    env = dict(os.environ)
    if cfg.hermes_home:
        env["HERMES_HOME"] = str(cfg.hermes_home_path)
    return env


def hermes_command(form: str, exe: str, record: dict[str, Any], task: str, cfg: Config) -> list[str]:
    """The argv for one job. The task is one argv element or stdin, never passed through a shell."""
    if form == "query-file":
        argv = [exe, "chat", "--query-file", "-", "-Q", "--oneshot", "--in", record["cwd"]]
    else:
        argv = [exe, "chat", "-q", task, "-Q"]
    if record.get("max_turns"):
        argv += ["--max-turns", str(record["max_turns"])]
    if record.get("session_requested"):
        argv += ["--resume", record["session_requested"]]
        if form == "query-arg":
            argv.append("--no-restore-cwd")
    if record.get("skills"):
        argv += ["--skills" if form == "query-file" else "-s", ",".join(record["skills"])]
    if record.get("toolsets"):
        argv += ["--toolsets" if form == "query-file" else "-t", ",".join(record["toolsets"])]
    if cfg.yolo:
        argv.append("--yolo")
    return argv + list(cfg.extra_args)


def read_tail(path: Path, max_bytes: int) -> tuple[bytes, int]:
    """The last max_bytes of a file by seek, and its size: a log's size never costs memory."""
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            handle.seek(max(0, size - max_bytes))
            return handle.read(max_bytes), size
    except OSError:
        return b"", 0


def session_id_from_log(path: Path) -> str | None:
    tail, _ = read_tail(path, 65536)
    found = SESSION_ID_RE.findall(tail.decode("utf-8", "replace"))
    return found[-1] if found else None


# ------------------------------------------------------------------------ supervisor and process control
POLL_S = 0.2


def detached_popen_kwargs() -> list[dict[str, Any]]:
    """Ways to start a process that outlives its parent's session, best first (Windows may refuse breakaway)."""
    if not IS_WINDOWS:
        return [{"start_new_session": True}]
    base = subprocess.DETACHED_PROCESS | subprocess.CREATE_NEW_PROCESS_GROUP | subprocess.CREATE_NO_WINDOW
    return [{"creationflags": base | subprocess.CREATE_BREAKAWAY_FROM_JOB}, {"creationflags": base}]


def own_group_popen_kwargs() -> dict[str, Any]:
    """Hermes gets its own process group, so an interrupt reaches it and not the supervisor."""
    if IS_WINDOWS:
        return {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP | subprocess.CREATE_NO_WINDOW}
    return {"start_new_session": True}


def interrupt(proc: "psutil.Process") -> None:
    """The polite stop: SIGTERM (CTRL_BREAK on Windows). Hermes then stops its own tools."""
    try:
        if IS_WINDOWS:
            os.kill(proc.pid, signal.CTRL_BREAK_EVENT)
        else:
            proc.terminate()
    except (psutil.Error, OSError):
        pass


def tree_of(root: "psutil.Process | None", known: dict[int, float]) -> list["psutil.Process"]:
    """The root, its descendants now, and every earlier-seen descendant that is still the same process."""
    procs: dict[int, psutil.Process] = {}
    if root is not None:
        try:
            procs[root.pid] = root
            for child in root.children(recursive=True):
                procs[child.pid] = child
        except psutil.Error:
            pass
    for pid, create_time in known.items():
        if pid not in procs:
            proc = alive({"pid": pid, "create_time": create_time})
            if proc:
                procs[pid] = proc
    return list(procs.values())


def still_running(procs: list["psutil.Process"], timeout_s: float) -> list["psutil.Process"]:
    """Wait until these processes are gone (zombies count as gone), returning those still running.

    Polls instead of waiting on them: waiting would reap the supervisor's own child, Hermes, before
    subprocess does, and then Popen reports exit code 0 for a Hermes that was killed."""
    identities = [(proc, identity) for proc in procs
                  if (identity := process_identity_safe(proc)) and alive(identity)]
    deadline = time.monotonic() + timeout_s
    while True:
        running = [proc for proc, identity in identities if alive(identity)]
        if not running or time.monotonic() >= deadline:
            return running
        time.sleep(0.05)


def process_identity_safe(proc: "psutil.Process") -> dict[str, float] | None:
    try:
        return process_identity(proc)
    except psutil.Error:
        return None


def stop_tree(root: "psutil.Process | None", known: dict[int, float], grace_s: float) -> list[int]:
    """Interrupt the root, wait the grace period, then kill every survivor of the tree; returns survivors.

    Hermes starts each tool command in its own session, so a process-group kill would miss them: the
    snapshot by parentage (plus the pids seen earlier) is what gets killed.
    """
    snapshot = tree_of(root, known)
    if root is not None:
        interrupt(root)
        still_running([root], grace_s)
    survivors = still_running(snapshot + tree_of(root, known), 0)
    for proc in survivors:
        try:
            proc.kill()
        except psutil.Error:
            pass
    left = still_running(survivors, 3)
    if left and IS_WINDOWS and root is not None:
        subprocess.run(["taskkill", "/PID", str(root.pid), "/T", "/F"], capture_output=True, timeout=30)
        left = still_running(left, 3)
    return [proc.pid for proc in left]


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"Hermes was killed by {name} ({-code}) from outside the bridge"
    if code == 2:
        return ("Hermes exited 2: it rejected its command line (see the output); if it says 'unrecognized "
                "arguments', set hermes_cli_form in config to the form this Hermes accepts")
    if code == 130:
        return "Hermes exited 130: interrupted"
    return f"Hermes exited with code {code}"


class Supervisor:
    """Owns one job from a detached process: starts Hermes, enforces the timeout, obeys cancel, records."""

    def __init__(self, job_id: str):
        self.cfg = load_config()
        self.store = JobStore(self.cfg.jobs_path)
        self.job_id = job_id
        self.record = self.store.read(job_id)
        self.known: dict[int, float] = {}
        self.stop_signal = False

    def note(self, text: str) -> None:
        sys.stderr.write(f"[bridge] {text}\n")
        sys.stderr.flush()

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_sigterm)
        record = self.record
        record["supervisor"] = process_identity(psutil.Process())
        record["state"] = "running"
        self.store.write(record)
        try:
            state, exit_code, reason = self._run_hermes()
        except Exception as exc:  # the outcome must be written whatever went wrong
            traceback.print_exc()
            state, exit_code, reason = "error", None, f"the supervisor failed: {exc}"
        self._finish(state, exit_code, reason)
        return 0

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.stop_signal = True

    def _cancel_requested(self) -> bool:
        return self.stop_signal or self.store.cancel_path(self.job_id).exists()

    def _run_hermes(self) -> tuple[str, int | None, str | None]:
        record, cfg = self.record, self.cfg
        if self._cancel_requested():
            return "cancelled", None, "cancelled before Hermes started"
        exe = find_hermes(cfg)
        if not exe:
            return "error", None, ("Hermes executable not found (hermes_exe in config, or `hermes` on PATH); "
                                   "see hermes_health")
        form, _ = known_cli_form(cfg, exe)
        form = form or probe_cli_form(cfg, exe)
        task_path = self.store.task_path(self.job_id)
        task = task_path.read_bytes().decode("utf-8")
        if form == "query-arg" and len(task.encode()) > ARGV_TASK_LIMIT:
            return "error", None, (f"the task is {len(task.encode())} bytes; this Hermes takes the task as one "
                                   f"argument, capped at {ARGV_TASK_LIMIT} bytes. Shorten it, or put the "
                                   "details in a file under cwd and refer to it")
        argv = hermes_command(form, exe, record, task, cfg)
        record["cli_form"] = form
        record["argv"] = ["<task>" if part == task else part for part in argv]
        with open(task_path if form == "query-file" else os.devnull, "rb") as stdin:
            proc = subprocess.Popen(argv, cwd=record["cwd"], stdin=stdin, stdout=sys.stderr.fileno(),
                                    stderr=subprocess.STDOUT, env=hermes_env(cfg), close_fds=True,
                                    **own_group_popen_kwargs())
        hermes = psutil.Process(proc.pid)
        record["hermes"] = process_identity(hermes)
        record["started_at"] = time.time()
        self.store.write(record)
        audit(cfg, event="job", job_id=self.job_id, state="running", hermes_pid=proc.pid, cwd=record["cwd"],
              cli_form=form)
        deadline = record["started_at"] + float(record["timeout_s"])
        outcome: tuple[str, str] | None = None
        while True:
            try:
                exit_code = proc.wait(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                pass
            self._remember_tree(hermes)
            if outcome:
                continue
            if self._cancel_requested():
                outcome = ("cancelled", "cancelled on request; the whole process tree was stopped")
            elif time.time() > deadline:
                outcome = ("timeout", f"hit timeout_s={record['timeout_s']:g}; the whole process tree was "
                           "stopped. Work may be part-done: inspect before re-running")
            if outcome:
                self.note(f"{outcome[0]}: stopping Hermes (pid {proc.pid}) and its tree")
                left = stop_tree(hermes, self.known, self.cfg.kill_grace_s)
                if left:
                    self.note(f"could not stop pids {left}")
        if outcome:
            stop_tree(None, self.known, 0)  # tool processes Hermes left behind when it was stopped
            return outcome[0], exit_code, outcome[1]
        return ("ok", exit_code, None) if exit_code == 0 else ("error", exit_code, describe_exit(exit_code))

    def _remember_tree(self, hermes: "psutil.Process") -> None:
        try:
            children = hermes.children(recursive=True)
        except psutil.Error:
            return
        changed = False
        for child in children:
            try:
                if child.pid not in self.known:
                    self.known[child.pid] = child.create_time()
                    changed = True
            except psutil.Error:
                continue
        if changed:
            self.record["tree"] = [[pid, ctime] for pid, ctime in self.known.items()]
            self.store.write(self.record)

    def _finish(self, state: str, exit_code: int | None, reason: str | None) -> None:
        record = self.record
        record.update(state=state, exit_code=exit_code, reason=reason, ended_at=time.time(),
                      session_id=session_id_from_log(self.store.log_path(self.job_id)))
        requested = record.get("session_requested")
        if requested and record["session_id"] and record["session_id"] != requested:
            record["session_note"] = (f"asked to resume session {requested}, but Hermes reported session "
                                      f"{record['session_id']}: it started a fresh session")
        for _ in range(20):  # a full disk may free up; the outcome is worth a few seconds
            try:
                self.store.write(record)
                break
            except OSError as exc:
                self.note(f"cannot write the outcome ({exc}); retrying")
                time.sleep(0.5)
        else:
            return  # the record still says running with a dead supervisor: readers report it orphaned
        self.store.clear_active(self.job_id)
        with_missing_ok(self.store.cancel_path(self.job_id).unlink)
        audit(self.cfg, event="job", job_id=self.job_id, state=state, exit_code=exit_code, reason=reason)


def cancel_orphan(store: JobStore, cfg: Config, view: JobView) -> str:
    """Stop what is left of a job whose supervisor died, and write the outcome it could not."""
    record = view.record
    known = {int(pid): float(ctime) for pid, ctime in record.get("tree", [])}
    left = stop_tree(alive(record.get("hermes")), known, cfg.kill_grace_s)
    record.update(state="cancelled", ended_at=time.time(),
                  reason="cancelled after its supervisor had died; the bridge stopped what was left of the tree"
                  + (f" except pids {left}" if left else ""))
    store.write(record)
    store.clear_active(record["id"])
    audit(cfg, event="job", job_id=record["id"], state="cancelled", reason=record["reason"])
    return record["reason"]


# ------------------------------------------------------------------------------------------ job launch
RUNNING_SUPERVISORS: list[subprocess.Popen] = []
# Runs this same file as `server.py --supervise ID`, but imported, so from its cached bytecode: the
# supervisor starts about 15 ms faster and 5 MB smaller than compiling the source again.
SUPERVISOR_BOOT = ("import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); "
                   f"runpy.run_module({SERVER_FILE.stem!r}, run_name='__main__', alter_sys=True)")


def reap_supervisors() -> None:
    """Collect exit statuses of supervisors this process started, so none lingers as a zombie."""
    RUNNING_SUPERVISORS[:] = [p for p in RUNNING_SUPERVISORS if p.poll() is None]


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

    def dedupe_key(self) -> str:
        identity = [self.kind, self.task, self.cwd, self.session_requested, self.skills, self.toolsets]
        return hashlib.sha256(json.dumps(identity).encode()).hexdigest()


def launch_job(cfg: Config, request: JobRequest) -> tuple[dict[str, Any], str | None]:
    """Start a job, or return the identical one already running; atomic across server processes."""
    from filelock import FileLock, Timeout

    store = JobStore(cfg.jobs_path)
    try:
        store.ensure()
    except OSError as exc:
        raise Refused(f"cannot create the jobs folder {store.root}: {exc.strerror or exc}") from None
    reap_supervisors()
    key = request.dedupe_key()
    try:
        with FileLock(str(store.root / "launch.lock"), timeout=10):
            running = []
            for job_id in store.active_ids():
                try:
                    view = observe(store.read(job_id))
                except (Refused, DamagedRecord):
                    continue
                if view.running and view.record.get("dedupe_key") == key:
                    return view.record, ("an identical job is already running; this is that job, "
                                         "no second Hermes was started")
                if view.running:
                    running.append(view.record)
            if len(running) >= cfg.max_running_jobs:
                listing = "; ".join(f"{r['id']} ({r.get('task_preview', '')[:40]})" for r in running)
                raise Refused(f"{len(running)} jobs are running, the most max_running_jobs allows: {listing}. "
                              "Wait for one (hermes_status) or cancel one (hermes_cancel)")
            prune_jobs(store, cfg)
            return start_job(cfg, store, request, key), None
    except Timeout:
        raise Refused("another server process holds the launch lock; try again in a moment") from None


def start_job(cfg: Config, store: JobStore, request: JobRequest, key: str) -> dict[str, Any]:
    try:
        job_id = store.claim_id(request.task.encode())
    except OSError as exc:
        raise Refused(f"cannot write to the jobs folder {store.root}: {exc.strerror or exc}; nothing started") from None
    record = {
        "id": job_id, "kind": request.kind, "state": "starting", "created_at": time.time(),
        "task_preview": " ".join(request.task.split())[:120], "task_chars": len(request.task),
        "cwd": request.cwd, "session_requested": request.session_requested, "skills": request.skills,
        "toolsets": request.toolsets, "max_turns": request.max_turns, "timeout_s": request.timeout_s,
        "dedupe_key": key, "supervisor": None, "hermes": None, "exit_code": None, "session_id": None,
        "reason": None, "log": str(store.log_path(job_id)),
    }
    try:
        store.write(record)
        store.mark_active(job_id)
        log = open(store.log_path(job_id), "ab")
    except OSError as exc:
        store.clear_active(job_id)
        store.remove(job_id)
        raise Refused(f"cannot write the job record in {store.root}: {exc.strerror or exc}; nothing started") from None
    env = dict(os.environ, HERMES_BRIDGE_CONFIG=str(cfg.path))
    argv = [sys.executable, "-c", SUPERVISOR_BOOT, str(SERVER_DIR), "--supervise", job_id]
    with log:
        for attempt, kwargs in enumerate(detached_popen_kwargs()):
            try:
                RUNNING_SUPERVISORS.append(subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=str(SERVER_DIR), env=env,
                    close_fds=True, **kwargs))
                record_detach_mode(store, attempt == 0)
                return record
            except OSError as exc:
                failure = exc
    record.update(state="error", ended_at=time.time(), reason=f"the supervisor could not start: {failure}")
    store.write(record)
    store.clear_active(job_id)
    return record


def record_detach_mode(store: JobStore, survives_host: bool) -> None:
    """Remember whether jobs outlive the host (Windows job objects may forbid breakaway) for hermes_health.
    Best effort: the job has started by now, and a failure here must not make the launch look failed."""
    path = store.root / "detach.json"
    try:
        if json.loads(path.read_text()).get("survives_host") == survives_host:
            return
    except (OSError, ValueError, AttributeError):
        pass
    try:
        write_atomic(path, json.dumps({"survives_host": survives_host}).encode())
    except OSError:
        pass


def prune_jobs(store: JobStore, cfg: Config) -> int:
    """Remove finished jobs past retention_days or beyond retention_max_jobs; never a running one.

    Runs under the launch lock, where every unfinished job has its active marker, so no record is read.
    """
    active = set(store.active_ids())
    finished = [job_id for job_id in store.list_ids() if job_id not in active]

    def stamp(seconds_ago: float) -> str:
        return time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() - seconds_ago))
    cutoff, recent = stamp(cfg.retention_days * 86400), stamp(60)
    excess = max(0, len(finished) - cfg.retention_max_jobs)
    # A job of the last minute is kept whatever the count: its id could otherwise be claimed again.
    doomed = [job_id for i, job_id in enumerate(finished) if (i < excess or job_id < cutoff) and job_id < recent]
    removed = 0
    for job_id in doomed:
        try:
            store.remove(job_id)
            removed += 1
        except OSError:  # left for a later launch; pruning must never block one
            continue
    return removed


# -------------------------------------------------------------------------------------------- rendering
ANSI_RE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]|[\x00-\x08\x0b-\x1f\x7f]")
RUNNING_TAIL_CHARS = 2000


def clean_text(data: bytes) -> str:
    return ANSI_RE.sub("", data.decode("utf-8", "replace").replace("\r\n", "\n"))


def log_excerpt(path: Path, max_chars: int) -> str:
    """The end of a log, bounded by max_chars, saying how much was cut and how to read the rest."""
    tail, size = read_tail(path, max_chars * 4)
    text = clean_text(tail)
    if len(text) > max_chars:
        text = text[-max_chars:]
    shown_bytes = len(text.encode("utf-8", "replace"))
    if size <= shown_bytes:
        return text if text else "(no output)"
    hidden = size - shown_bytes
    return (f"[cut: the first {hidden} of {size} bytes are not shown; read them with "
            f"hermes_read(path=\"{path}\", offset=0, max_bytes=...)]\n...{text}")


def elapsed_s(record: dict[str, Any]) -> int:
    start = record.get("started_at") or record.get("created_at") or time.time()
    end = record.get("ended_at") or time.time()
    return max(0, int(end - float(start)))


def render_status(view: JobView, cfg: Config, notes: list[str] = ()) -> str:
    record = view.record
    job_id = record["id"]
    log = Path(record.get("log") or JobStore(cfg.jobs_path).log_path(job_id))
    lines = [f"STATUS: {'running' if view.running else view.state}", f"JOB_ID: {job_id}"]
    if view.running:
        lines += [f"CWD: {record.get('cwd')}", f"ELAPSED_S: {elapsed_s(record)}",
                  f"TIMEOUT_S: {record.get('timeout_s', 0):g} (hard cap we enforce)", f"FULL_LOG: {log}"]
        lines += [f"NOTE: {note}" for note in notes]
        lines += ["Still running. This is NOT a failure and NOT a timeout.",
                  f'Collect the result with hermes_status(job_id="{job_id}").',
                  "Do not re-run the task -- it is already executing.",
                  "--- OUTPUT SO FAR (tail) ---", log_excerpt(log, RUNNING_TAIL_CHARS)]
        return "\n".join(lines)
    exit_code = record.get("exit_code")
    lines += [f"EXIT_CODE: {'none' if exit_code is None else exit_code}",
              f"SESSION_ID: {record.get('session_id') or 'none captured'}",
              f"CWD: {record.get('cwd')}", f"ELAPSED_S: {elapsed_s(record)}", f"FULL_LOG: {log}"]
    if view.reason and view.state != "ok":
        lines.append(f"REASON: {view.reason}")
    if record.get("session_note"):
        lines.append(f"SESSION_NOTE: {record['session_note']}")
    lines += [f"NOTE: {note}" for note in notes]
    if view.state == "orphaned":
        lines.append(f'Stop what is left with hermes_cancel(job_id="{job_id}").')
    if view.state in ("timeout", "cancelled", "orphaned"):
        lines.append("Work may be part-done: inspect the files with hermes_read before re-running.")
    lines += ["--- HERMES OUTPUT ---", log_excerpt(log, cfg.max_output_chars)]
    return "\n".join(lines)


def render_refused(reason: str) -> str:
    return f"STATUS: refused\nREASON: {reason}\nNothing was started."


# --------------------------------------------------------------------------------- tool logic (no MCP)
READ_DEFAULT_BYTES = 20000
READ_MAX_BYTES = 262144
DIR_LIMIT = 200
JOBS_SCAN_LIMIT = 5000


def clamp_number(name: str, value: float | None, default: float, low: float, high: float,
                 notes: list[str]) -> float:
    """A number argument brought into range, with a note when it was changed; NaN is refused."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise Refused(f"{name} must be a number, got {value!r}")
    clamped = min(max(value, low), high)
    if clamped != value:
        notes.append(f"{name}={value:g} was clamped to {clamped:g}")
    return clamped


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


def check_task(task: Any, cfg: Config) -> str:
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
    form, _ = known_cli_form(cfg, find_hermes(cfg))
    if form == "query-arg" and size > ARGV_TASK_LIMIT:
        raise Refused(f"task is {size} bytes; this Hermes takes the task as one command-line argument, "
                      f"capped at {ARGV_TASK_LIMIT} bytes. Shorten it, or write the details to a file under "
                      "cwd and tell Hermes to read it")
    return task


def job_request(cfg: Config, kind: str, task: Any, cwd: str | None, max_turns: int | None,
                timeout_s: float | None, skills: Any, toolsets: Any, session: str | None,
                notes: list[str]) -> JobRequest:
    """Validate everything about a launch before anything touches the disk or starts a process."""
    task = check_task(task, cfg)
    resolved_cwd = confine_cwd(cfg, cwd)
    if max_turns is not None and (isinstance(max_turns, bool) or not isinstance(max_turns, int)
                                  or not 1 <= max_turns <= 1000):
        raise Refused(f"max_turns must be a whole number from 1 to 1000, got {max_turns!r}")
    if timeout_s is not None and (not isinstance(timeout_s, (int, float)) or math.isnan(timeout_s)
                                  or timeout_s <= 0):
        raise Refused(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    timeout = clamp_number("timeout_s", timeout_s, cfg.default_timeout_s, 1, cfg.max_timeout_s, notes)
    return JobRequest(kind=kind, task=task, cwd=resolved_cwd, max_turns=max_turns or cfg.default_max_turns,
                      timeout_s=timeout, skills=names_argument("skills", skills),
                      toolsets=names_argument("toolsets", toolsets), session_requested=session)


def resolve_session(cfg: Config, session_id: Any) -> str:
    if not isinstance(session_id, str) or not session_id.strip():
        raise Refused('session_id is empty: give a session id from a SESSION_ID line, or "latest"')
    if session_id == "latest":
        found = JobStore(cfg.jobs_path).latest_session_id()
        if not found:
            raise Refused('session_id "latest": no job of this bridge has captured a session id yet')
        return found
    if not re.fullmatch(r"[A-Za-z0-9_.:-]{1,128}", session_id):
        raise Refused(f"session_id {session_id[:60]!r} is not a session id (they look like "
                      "20261130_104857_89284b)")
    return session_id


def job_view(cfg: Config, job_id: Any) -> JobView:
    job_id = validate_job_id(job_id)
    try:
        return observe(JobStore(cfg.jobs_path).read(job_id))
    except DamagedRecord as exc:
        raise Refused(f"the record of job {job_id} is damaged ({exc}); its log may still be read with "
                      f"hermes_read(path=\"{JobStore(cfg.jobs_path).log_path(job_id)}\")") from None


def request_cancel(cfg: Config, job_id: Any) -> tuple[JobView, str]:
    """Ask a job's supervisor to stop it, or stop an orphan directly; returns the view and a note."""
    view = job_view(cfg, job_id)
    store = JobStore(cfg.jobs_path)
    if view.state in FINAL_STATES:
        return view, f"the job had already ended as {view.state}; nothing to cancel"
    if view.state == "running_untracked":
        raise Refused(f"job {job_id} has no supervisor pid on record, so the bridge cannot stop it safely")
    if view.state == "orphaned":
        cancel_orphan(store, cfg, view)
        return observe(store.read(view.record["id"])), "the supervisor was gone; the bridge stopped the tree"
    write_atomic(store.cancel_path(view.record["id"]), str(time.time()).encode())
    return view, "cancel requested; the supervisor stops the whole process tree"


def read_path(cfg: Config, path: Any, max_bytes: int | None, offset: int | None) -> str:
    """A file's byte range or a directory listing, confined, bounded, never hanging on special files."""
    notes: list[str] = []
    resolved = confine_read(cfg, path)
    try:
        info = os.stat(resolved)
    except OSError as exc:
        raise Refused(f"cannot stat {resolved}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(info.st_mode):
        return list_directory(resolved)
    if not stat.S_ISREG(info.st_mode):
        raise Refused(f"{resolved} is not a regular file or folder (a FIFO, device or socket could hang "
                      "or never end), so it is not read")
    limit = int(clamp_number("max_bytes", max_bytes, READ_DEFAULT_BYTES, 1, READ_MAX_BYTES, notes))
    if offset is not None and (isinstance(offset, bool) or not isinstance(offset, int)):
        raise Refused(f"offset must be a whole number of bytes (negative counts from the end), got {offset!r}")
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(resolved, flags)
    with os.fdopen(fd, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        start = min(size, max(0, size + offset) if (offset or 0) < 0 else (offset or 0))
        handle.seek(start)
        data = handle.read(limit)
    end = start + len(data)
    header = [f"PATH: {resolved}", f"SIZE: {size} bytes", f"RANGE: bytes {start}-{end} of {size}"]
    header += [f"NOTE: {note}" for note in notes]
    if end < size or start > 0:
        more = f' next: hermes_read(path="{resolved}", offset={end})' if end < size else ""
        header.append(f"CUT: yes, {size - len(data)} bytes not shown;{more}")
    else:
        header.append("CUT: no")
    if b"\x00" in data:
        return "\n".join(header + ["BINARY: yes, the content is not text and is not shown"])
    return "\n".join(header + ["---", data.decode("utf-8", "replace")])


def list_directory(resolved: str) -> str:
    """Sorted entries with type, size, modified time; only the shown entries are stat'ed."""
    try:
        with os.scandir(resolved) as entries:
            found = sorted((e.name, e) for e in entries)
    except OSError as exc:
        raise Refused(f"cannot list {resolved}: {exc.strerror or exc}") from None
    lines = [f"DIRECTORY: {resolved}", f"ENTRIES: {len(found)}"]
    for name, entry in found[:DIR_LIMIT]:
        try:
            info = entry.stat(follow_symlinks=False)
            kind = "link" if entry.is_symlink() else "dir" if entry.is_dir() else "file"
            modified = time.strftime("%Y-%m-%d %H:%M", time.localtime(info.st_mtime))
            lines.append(f"{kind:4}  {info.st_size:>12}  {modified}  {name}")
        except OSError:
            lines.append(f"?     {'':>12}  {'':16}  {name}")
    if len(found) > DIR_LIMIT:
        lines.append(f"... {len(found) - DIR_LIMIT} more entries not shown")
    return "\n".join(lines)


def list_jobs(cfg: Config, limit: int | None, state: str | None) -> str:
    """The newest jobs (bounded by limit and a scan cap), with a total count; damaged records included."""
    store = JobStore(cfg.jobs_path)
    notes: list[str] = []
    shown_limit = int(clamp_number("limit", limit, 50, 1, 1000, notes))
    ids = store.list_ids()
    rows: list[str] = []
    scanned = 0
    for job_id in reversed(ids):
        if len(rows) >= shown_limit or scanned >= JOBS_SCAN_LIMIT:
            break
        scanned += 1
        try:
            view = observe(store.read(job_id))
        except (Refused, DamagedRecord) as exc:
            if state in (None, "", "damaged"):
                rows.append(f"{job_id}  damaged            -  record {exc}")
            continue
        shown_state = "running" if view.running else view.state
        if state not in (None, "") and shown_state != state:
            continue
        record = view.record
        rows.append(f"{job_id}  {shown_state:17} {elapsed_s(record):>5}s  {record.get('cwd')}  "
                    f"\"{str(record.get('task_preview', ''))[:60]}\"")
    header = [f"JOBS: {len(ids)} on disk; showing {len(rows)}, newest first"
              + (f", state={state}" if state else "")]
    if scanned >= JOBS_SCAN_LIMIT and len(rows) < shown_limit:
        header.append(f"NOTE: scanned the newest {JOBS_SCAN_LIMIT} records only")
    header += [f"NOTE: {note}" for note in notes]
    if not ids:
        header.append("No jobs yet. Start one with hermes_run.")
    return "\n".join(header + rows)


SKILL_CACHE: dict[str, tuple[tuple[int, int], dict[str, Any] | None]] = {}  # SKILL.md -> (stat, skill)
TREE_CACHE: dict[str, tuple[dict[str, int], list[str]]] = {}  # skills dir -> (folder mtimes, SKILL.md paths)


def parse_skill(path: str, skills_dir: str) -> dict[str, Any] | None:
    """A skill from its SKILL.md's YAML front matter, or None when it is malformed."""
    import yaml

    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError):
        return None
    match = re.match(r"^---\s*\n(.*?)\n---\s*(?:\n|$)", text, re.DOTALL)
    if not match:
        return None
    try:
        front = yaml.load(match.group(1), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError:
        return None
    folder = os.path.dirname(path)
    if not isinstance(front, dict) or not isinstance(front.get("name", ""), str):
        return None
    parts = os.path.relpath(path, skills_dir).split(os.sep)
    meta = front.get("metadata")
    hermes_meta = meta.get("hermes") if isinstance(meta, dict) else None
    tags = hermes_meta.get("tags") if isinstance(hermes_meta, dict) else None
    return {
        "name": front.get("name") or os.path.basename(folder),
        "category": parts[0] if len(parts) > 2 else "uncategorised",
        "description": " ".join(str(front.get("description") or "").split()),
        "tags": [str(t) for t in tags] if isinstance(tags, list) else [],
        "path": path,
    }


def skill_files(skills_dir: str) -> list[str]:
    """Every SKILL.md under skills_dir. The walk is redone only when a folder's mtime changed (a file or
    folder added, removed or renamed), so a repeated call costs one stat per folder."""
    cached = TREE_CACHE.get(skills_dir)
    if cached and all(folder_mtime(folder) == mtime for folder, mtime in cached[0].items()):
        return cached[1]
    folders: dict[str, int] = {}
    files: list[str] = []
    for folder, dirs, names in os.walk(skills_dir):
        dirs.sort()
        folders[folder] = folder_mtime(folder)
        if "SKILL.md" in names:
            files.append(os.path.join(folder, "SKILL.md"))
    TREE_CACHE[skills_dir] = (folders, files)
    return files


def folder_mtime(folder: str) -> int:
    try:
        return os.stat(folder).st_mtime_ns
    except OSError:
        return -1


def skill_index(skills_dir: Path) -> tuple[list[dict[str, Any]], int]:
    """Every skill under skills_dir (each file parsed once per version) and the count of malformed ones."""
    skills, malformed = [], 0
    for path in skill_files(str(skills_dir)):
        try:
            info = os.stat(path)
        except OSError:
            continue
        key = (info.st_mtime_ns, info.st_size)
        cached = SKILL_CACHE.get(path)
        if not cached or cached[0] != key:
            cached = (key, parse_skill(path, str(skills_dir)))
            SKILL_CACHE[path] = cached
        if cached[1] is None:
            malformed += 1
        else:
            skills.append(cached[1])
    return skills, malformed


def skill_score(skill: dict[str, Any], words: list[str]) -> int:
    name, description = skill["name"].lower(), skill["description"].lower()
    tags = [t.lower() for t in skill["tags"]]
    score = 0
    for word in words:
        score += 10 if word == name else 5 if word in name else 0
        score += 3 if word in tags else 1 if any(word in t for t in tags) else 0
        score += 1 if word in description else 0
    return score


def capabilities(cfg: Config, query: str | None, category: str | None, limit: int | None) -> str:
    notes: list[str] = []
    shown = int(clamp_number("limit", limit, 20, 1, 200, notes))
    skills_dir = cfg.hermes_home_path / "skills"
    skills, malformed = skill_index(skills_dir)
    header = [f"SKILLS_DIR: {skills_dir}", f"SKILLS: {len(skills)}"
              + (f" ({malformed} malformed SKILL.md skipped)" if malformed else "")]
    header += [f"NOTE: {note}" for note in notes]
    if not skills:
        return "\n".join(header + ["No skills found. Hermes installs its skills under HERMES_HOME/skills."])
    use = 'Preload skills with hermes_run(..., skills=["name"]).'
    if query:
        words = [w for w in re.split(r"\W+", query.lower()) if w]
        ranked = sorted(((skill_score(s, words), s) for s in skills), key=lambda p: (-p[0], p[1]["name"]))
        hits = [s for score, s in ranked if score > 0]
        lines = [f"MATCHES for {query!r}: {len(hits)}"] + [describe_skill(s) for s in hits[:shown]]
        return "\n".join(header + lines + [use])
    if category:
        members = sorted((s for s in skills if s["category"] == category), key=lambda s: s["name"])
        if not members:
            known = sorted({s["category"] for s in skills})
            raise Refused(f"no category {category!r}; categories: {', '.join(known)}")
        lines = [f"CATEGORY {category}: {len(members)} skills"] + [describe_skill(s) for s in members[:shown]]
        return "\n".join(header + lines + [use])
    by_category: dict[str, list[str]] = {}
    for skill in skills:
        by_category.setdefault(skill["category"], []).append(skill["name"])
    lines = [f"CATEGORIES: {len(by_category)}"]
    for name in sorted(by_category)[:shown]:
        members = sorted(by_category[name])
        lines.append(f"{name} ({len(members)}): {', '.join(members[:5])}" + (", ..." if len(members) > 5 else ""))
    return "\n".join(header + lines + ["Narrow with hermes_capabilities(query=...) or (category=...). " + use])


def describe_skill(skill: dict[str, Any]) -> str:
    tags = f" (tags: {', '.join(skill['tags'])})" if skill["tags"] else ""
    return f"- {skill['name']} [{skill['category']}]: {skill['description'][:200]}{tags}"


HEALTH_RECENT_JOBS = 200


def job_counts(store: JobStore) -> str:
    """Counts by state over every unfinished job (the active markers) and the newest finished ones, plus
    the total on disk: bounded, so hermes_health stays instant whatever the disk holds."""
    ids = store.list_ids()
    active = store.active_ids()
    counted = dict.fromkeys(active + ids[-HEALTH_RECENT_JOBS:])
    counts: dict[str, int] = {}
    for job_id in counted:
        try:
            view = observe(store.read(job_id))
            state = "running" if view.running else view.state
        except (Refused, DamagedRecord):
            state = "damaged"
        counts[state] = counts.get(state, 0) + 1
    by_state = ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"
    scope = "all" if len(counted) >= len(ids) else f"unfinished and newest {HEALTH_RECENT_JOBS}"
    return f"{len(ids)} on disk; by state ({scope}): {by_state}"


def health(cfg: Config) -> str:
    """Everything a user needs to see why the bridge cannot work, without starting any process."""
    exe = find_hermes(cfg)
    version = hermes_version_on_disk(exe) if exe else None
    form, form_source = known_cli_form(cfg, exe)
    store = JobStore(cfg.jobs_path)
    try:
        store.ensure()
        probe = store.root / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
        writable = "writable"
    except OSError as exc:
        writable = f"NOT writable: {exc.strerror or exc}"
    try:
        survives = json.loads((store.root / "detach.json").read_text()).get("survives_host", True)
    except (OSError, ValueError, AttributeError):
        survives = True
    lines = [
        f"BRIDGE: claude-hermes-bridge {VERSION}",
        f"PYTHON: {sys.version.split()[0]} at {sys.executable}",
        f"MCP_SDK: {dependency_version('mcp') or 'not installed'}",
        f"HERMES_EXE: {exe or 'NOT FOUND: set hermes_exe in config or put hermes on PATH'}",
        f"HERMES_VERSION: {version or 'unknown (no hermes_agent dist-info beside the executable)'}",
        f"CLI_FORM: {form or 'auto'} ({form_source})",
        f"HERMES_HOME: {cfg.hermes_home_path}",
        f"YOLO: {'on: Hermes auto-approves dangerous commands' if cfg.yolo else 'off'}",
        f"ALLOWED_ROOTS: {', '.join(cfg.roots) or 'NONE: no job can start'}",
        f"READ_SCOPE: {'anywhere' if cfg.read_anywhere else 'allowed roots and job files'}",
        f"JOBS_DIR: {store.root} ({writable})",
        "JOBS_SURVIVE_HOST: " + ("yes" if survives else "NO: the host's job object forbids breakaway, so jobs "
                                 "die when the host closes"),
        f"JOBS: {job_counts(store)}",
        f"CONFIG: {cfg.path} ({len(cfg.problems)} problems)",
    ]
    lines += [f"  - {problem}" for problem in cfg.problems]
    return "\n".join(lines)


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
        "- timeout, cancelled or orphaned mean part-done work: inspect the files before re-running.\n"
        "- Do not trust STATUS: ok alone: verify the artifacts with hermes_read.\n"
        "- hermes_resume(session_id) continues a Hermes session (\"latest\" = the newest one captured).\n"
        "- hermes_cancel(job_id) stops a job and its whole process tree.\n"
        f"- Jobs may only start inside these folders: {roots}. hermes_read reads there and the job logs."
    )


# ------------------------------------------------------------------------------------------- MCP tools
async def wait_for_end(cfg: Config, job_id: str, wait_s: float, ctx: Any) -> JobView:
    """Poll the record on disk until the job ends or wait_s passes; sends progress while it waits."""
    import anyio

    deadline = time.monotonic() + wait_s
    next_progress = time.monotonic() + 5
    while True:
        view = job_view(cfg, job_id)
        now = time.monotonic()
        if not view.running or now >= deadline:
            return view
        if ctx is not None and now >= next_progress:
            next_progress = now + 5
            try:
                await ctx.report_progress(wait_s - (deadline - now), wait_s, f"job {job_id} is running")
            except Exception:  # progress is a courtesy; a closed stream must not fail the call
                pass
        await anyio.sleep(min(0.25, max(0.0, deadline - now)))


def build_server(cfg: Config) -> Any:
    """The FastMCP server: thin tools over the plain functions above. The only place MCP is imported."""
    import inspect

    from mcp.server.fastmcp import Context, FastMCP
    from mcp.types import CallToolResult, TextContent, ToolAnnotations

    mcp = FastMCP("hermes", instructions=server_instructions(cfg))
    mcp._mcp_server.version = VERSION  # serverInfo.version: ours, not the SDK's
    read_only = ToolAnnotations(readOnlyHint=True, destructiveHint=False, idempotentHint=True, openWorldHint=False)
    launches = ToolAnnotations(readOnlyHint=False, destructiveHint=False, idempotentHint=False, openWorldHint=True)
    destructive = ToolAnnotations(readOnlyHint=False, destructiveHint=True, idempotentHint=True, openWorldHint=False)

    def tool(annotations: ToolAnnotations, title: str) -> Callable[[Callable[..., Any]], Any]:
        """Register a tool; its docstring, without the source's indentation, is the description."""
        def register(fn: Callable[..., Any]) -> Any:
            return mcp.tool(annotations=annotations, title=title, description=inspect.cleandoc(fn.__doc__))(fn)
        return register

    def result(text: str, is_error: bool = False) -> CallToolResult:
        return CallToolResult(content=[TextContent(type="text", text=text)], isError=is_error)

    async def answer(tool: str, body: Callable[[Config], Any], task: Any = None) -> CallToolResult:
        """Run a tool body with a fresh config; a refusal or a bug becomes an isError result, never a crash.
        Every call leaves one audit line: the tool, the job, the resolved cwd, the outcome."""
        cfg = load_config()
        try:
            text = body(cfg)
            if hasattr(text, "__await__"):
                text = await text
            outcome = result(text)
        except Refused as exc:
            text = render_refused(str(exc))
            outcome = result(text, is_error=True)
        except Exception as exc:
            traceback.print_exc()
            text = (f"STATUS: error\nREASON: internal error in {tool}: {type(exc).__name__}: {exc}. "
                    "The server keeps running; hermes_health may show why.")
            outcome = result(text, is_error=True)
        fields = dict(line.split(": ", 1) for line in text.splitlines()[:12] if re.match(r"^[A-Z_]+: ", line))
        audit(cfg, event="tool", tool=tool, job_id=fields.get("JOB_ID"), cwd=fields.get("CWD"),
              outcome=fields.get("STATUS", "ok"), reason=fields.get("REASON"),
              task=first_words(task) if task is not None else None)
        return outcome

    async def launch_and_wait(cfg: Config, request: JobRequest, wait_s: float | None, notes: list[str],
                              ctx: Context) -> str:
        wait = clamp_number("wait_s", wait_s, min(5.0, cfg.max_wait_s), 0, cfg.max_wait_s, notes)
        record, duplicate = launch_job(cfg, request)
        if duplicate:
            notes.append(duplicate)
        view = await wait_for_end(cfg, record["id"], wait, ctx)
        return render_status(view, cfg, notes)

    @tool(launches, "Run a task with Hermes")
    async def hermes_run(task: str, ctx: Context, cwd: str | None = None, max_turns: int | None = None,
                         timeout_s: float | None = None, wait_s: float | None = None,
                         skills: list[str] | str | None = None,
                         toolsets: list[str] | str | None = None) -> CallToolResult:
        """Start a fresh Hermes job in cwd (an absolute folder inside the allowed roots). Returns the result
        if it ends within wait_s (default 5 s), else STATUS: running and a JOB_ID to pass to hermes_status.
        The task must be self-contained: absolute paths and a definition of done."""
        async def body(cfg: Config) -> str:
            notes: list[str] = []
            request = job_request(cfg, "run", task, cwd, max_turns, timeout_s, skills, toolsets, None, notes)
            return await launch_and_wait(cfg, request, wait_s, notes, ctx)
        return await answer("hermes_run", body, task)

    @tool(launches, "Continue a Hermes session")
    async def hermes_resume(session_id: str, task: str, ctx: Context, cwd: str | None = None,
                            max_turns: int | None = None, timeout_s: float | None = None,
                            wait_s: float | None = None) -> CallToolResult:
        """Continue a Hermes session with a new task (session_id from a SESSION_ID line, or "latest" for the
        newest session a job of this bridge captured). Same waiting rules as hermes_run."""
        async def body(cfg: Config) -> str:
            notes: list[str] = []
            session = resolve_session(cfg, session_id)
            request = job_request(cfg, "resume", task, cwd, max_turns, timeout_s, None, None, session, notes)
            return await launch_and_wait(cfg, request, wait_s, notes, ctx)
        return await answer("hermes_resume", body, task)

    @tool(read_only, "Wait for a Hermes job")
    async def hermes_status(job_id: str, ctx: Context, wait_s: float | None = None) -> CallToolResult:
        """Wait up to wait_s (default 30) for a job to end, then return its final block, or STATUS: running
        again. It waits for you: do not call it in a tight loop. Reads only the disk."""
        async def body(cfg: Config) -> str:
            notes: list[str] = []
            view = job_view(cfg, job_id)
            wait = clamp_number("wait_s", wait_s, min(30.0, cfg.max_wait_s), 0, cfg.max_wait_s, notes)
            return render_status(await wait_for_end(cfg, view.record["id"], wait, ctx), cfg, notes)
        return await answer("hermes_status", body)

    @tool(read_only, "List Hermes jobs")
    async def hermes_jobs(limit: int | None = None, state: str | None = None) -> CallToolResult:
        """Jobs on disk, newest first (default limit 50): id, state, duration, cwd, first words of the task.
        state filters: running, ok, error, timeout, cancelled, orphaned, damaged."""
        return await answer("hermes_jobs", lambda cfg: list_jobs(cfg, limit, state))

    @tool(read_only, "Read a file or folder")
    async def hermes_read(path: str, max_bytes: int | None = None, offset: int | None = None) -> CallToolResult:
        """Read a file (a byte range: offset, negative = from the end, to page a job log; max_bytes, default
        20000) or list a folder, to verify Hermes' work without waking an agent. Confined to the allowed
        roots and the job files."""
        return await answer("hermes_read", lambda cfg: read_path(cfg, path, max_bytes, offset))

    @tool(read_only, "Hermes skills")
    async def hermes_capabilities(query: str | None = None, category: str | None = None,
                                  limit: int | None = None) -> CallToolResult:
        """Hermes' installed skills, read from disk. No arguments: categories with counts. query: ranked
        matches over name, description and tags. category: the skills of one category."""
        return await answer("hermes_capabilities", lambda cfg: capabilities(cfg, query, category, limit))

    @tool(read_only, "Bridge health")
    async def hermes_health() -> CallToolResult:
        """Is Hermes found, which version and command-line form, config problems, allowed roots, job counts.
        Instant: starts no process."""
        return await answer("hermes_health", health)

    @tool(destructive, "Cancel a Hermes job")
    async def hermes_cancel(job_id: str, ctx: Context) -> CallToolResult:
        """Stop a running job and its whole process tree; the job ends as cancelled. Work may be part-done."""
        async def body(cfg: Config) -> str:
            view, note = request_cancel(cfg, job_id)
            if view.running:
                view = await wait_for_end(cfg, view.record["id"], min(cfg.kill_grace_s + 5, cfg.max_wait_s), ctx)
            return render_status(view, cfg, [note])
        return await answer("hermes_cancel", body)

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
        line = self.stream.readline()
        if not LONE_SURROGATE_ESCAPE.search(line):
            return line
        try:
            message = json.loads(line)
        except ValueError:
            return line
        return json.dumps(replace_surrogates(message), ensure_ascii=False) + "\n"


async def serve(protocol_fds: tuple[int, int]) -> None:
    """Serve MCP over the client's pipes kept by the stdio guard."""
    from io import TextIOWrapper

    import anyio
    from mcp.server.stdio import stdio_server

    cfg = load_config()
    sys.stderr.write(f"claude-hermes-bridge {VERSION}: python {sys.version.split()[0]} ({sys.executable}), "
                     f"mcp {dependency_version('mcp') or 'not installed'}, config {cfg.path} ({len(cfg.problems)} problems)\n")
    sys.stderr.flush()
    server = build_server(cfg)
    stdin = anyio.wrap_file(ProtocolLines(TextIOWrapper(os.fdopen(protocol_fds[0], "rb"), encoding="utf-8",
                                                        errors="replace")))
    stdout = anyio.wrap_file(TextIOWrapper(os.fdopen(protocol_fds[1], "wb"), encoding="utf-8"))
    async with stdio_server(stdin=stdin, stdout=stdout) as (read_stream, write_stream):
        await server._mcp_server.run(read_stream, write_stream, server._mcp_server.create_initialization_options())


# ------------------------------------------------------------------------------------------ command line
async def check_server(command: list[str], env: dict[str, str] | None = None, timeout_s: float = 60) -> tuple[bool, list[str]]:
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
                async with stdio_client(params, errlog=errlog) as (read, write):
                    async with ClientSession(read, write) as session:
                        init = await session.initialize()
                        report.append(f"protocol: {init.protocolVersion}; server {init.serverInfo.name}")
                        tools = sorted(t.name for t in (await session.list_tools()).tools)
                        health_result = await session.call_tool("hermes_health", {}) if "hermes_health" in tools else None
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
    if health_result is None or health_result.isError:
        report.append("FAIL: hermes_health did not succeed")
        return False, report
    text = health_result.content[0].text
    for line in text.splitlines():
        if line.startswith(("HERMES_EXE", "HERMES_VERSION", "CLI_FORM", "ALLOWED_ROOTS", "CONFIG", "  - ")):
            report.append(line.strip())
    if "NOT FOUND" in text:
        report.append("WARN: Hermes is not installed or not found; jobs will end in error until it is")
    return ok, report


def main(argv: list[str]) -> int:
    if argv == ["--version"]:
        print(f"claude-hermes-bridge {VERSION}")
        return 0
    if len(argv) == 2 and argv[0] == "--supervise":
        problem = missing_dependencies(need_mcp=False)
        if problem:
            sys.stderr.write(problem + "\n")
            return 2
        return Supervisor(validate_job_id(argv[1])).run()
    if argv not in ([], ["--check"]):
        sys.stderr.write(f"claude-hermes-bridge: unknown arguments {argv}; use no arguments (serve MCP over "
                         "stdio), --check, --version\n")
        return 2
    problem = missing_dependencies(need_mcp=True)
    if problem:
        sys.stderr.write(problem + "\n")
        return 2
    import anyio

    if argv == ["--check"]:
        ok, report = anyio.run(check_server, [sys.executable, str(SERVER_FILE)])
        print("\n".join(report))
        print("CHECK: OK" if ok else "CHECK: FAILED")
        return 0 if ok else 1
    anyio.run(serve, PROTOCOL_FDS)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
