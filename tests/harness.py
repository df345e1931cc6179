"""Test harness shared by the tests and the benchmark: a throwaway bridge (roots, jobs folder, config, fake
hermes) and the official MCP client driving a real server process over stdio, callable from sync code."""
from __future__ import annotations

import atexit
import dataclasses
import json
import os
import queue
import select
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from contextlib import asynccontextmanager, suppress
from datetime import timedelta
from importlib.metadata import version as installed_version
from pathlib import Path
from typing import Any, Callable, TypeVar

import psutil
from anyio.from_thread import start_blocking_portal
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from claude_hermes_bridge.bodies import Listing, ToolBody, run_tool_body
from claude_hermes_bridge.cli import either
from claude_hermes_bridge.config import SETTINGS_ENV, Config, load_config
from claude_hermes_bridge.jobs import JobRecord, JobState, JobStore
from claude_hermes_bridge.render import ANSWER_PREFIX
from claude_hermes_bridge.safe_io import ProcessId

REPO = Path(__file__).resolve().parent.parent
MCP_LINE = int(installed_version("mcp").split(".")[0])
READ_TIMEOUT: Any = 90.0 if MCP_LINE >= 2 else timedelta(seconds=90)  # 2.x takes seconds, 1.x a timedelta
SERVER = REPO / "server.py"
FAKE_HERMES = Path(__file__).resolve().parent / "fake_hermes.py"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def under_wine() -> bool:
    """Whether this Windows CPython runs under Wine (the Windows lane, tests/windows_lane.sh): Wine's ntdll
    exports wine_get_version, Windows' does not."""
    if os.name != "nt":
        return False
    import ctypes

    return hasattr(ctypes.WinDLL("ntdll"), "wine_get_version")  # type: ignore[attr-defined]


UNDER_WINE = under_wine()
# Wall-clock bounds in tests ("returns in bounded time", not speed) stretch under Wine, whose process
# creation and file locking are several times slower than Windows' (5.6 s for a 5 s bound on a loaded CI machine).
BOUND_STRETCH = 3 if UNDER_WINE else 1


T = TypeVar("T")


FAKE_PERSONALITIES = ("0.19", "0.20", "0.21")


def make_fake_hermes(prefix: Path, personality: str = "0.19", version: str | None = "0.19.0",
                     console_script: bool = False) -> Path:
    """A fake install laid out like a venv: bin/hermes speaking one Hermes version's command line, and a
    hermes_agent dist-info claiming `version` when it is set (which need not match the personality). bin/hermes
    is a shell script, or with console_script a Python one as pip writes Hermes' own (what a standby bound late
    needs). On Windows, Scripts/hermes.exe (see windows_launcher)."""
    if os.name == "nt":
        exe = windows_launcher(prefix / "Scripts", personality)
        site = prefix / "Lib" / "site-packages"
    else:
        bin_dir = prefix / "bin"
        bin_dir.mkdir(parents=True, exist_ok=True)
        exe = bin_dir / "hermes"
        exe.write_text(console_script_text(sys.executable, personality) if console_script else
                       f'#!/bin/sh\nFAKE_HERMES_VERSION={personality} exec "{sys.executable}" "{FAKE_HERMES}" "$@"\n')
        exe.chmod(0o755)
        site = prefix / "lib" / "python3.11" / "site-packages"
    if version:
        (site / f"hermes_agent-{version}.dist-info").mkdir(parents=True)
    return exe


def console_script_text(python: str, personality: str) -> str:
    """A console script that runs the fake in its own process, as pip's run Hermes' entry point."""
    return (f"#!{python}\nimport os, runpy, sys\n"
            f"os.environ['FAKE_HERMES_VERSION'] = {personality!r}\n"
            f"sys.argv[0] = {str(FAKE_HERMES)!r}\n"
            f"runpy.run_path({str(FAKE_HERMES)!r}, run_name='__main__')\n")


def windows_launcher(bin_dir: Path, personality: str) -> Path:
    """hermes.exe as pip installs a console script (distlib's launcher, this Python, and a zipped script
    that runs the fake): a real executable, because the bridge refuses a .cmd Hermes."""
    from pip._vendor.distlib.scripts import ScriptMaker

    source = bin_dir.parent / "launcher-source"
    source.mkdir(parents=True, exist_ok=True)
    (source / "hermes").write_text(console_script_text("python", personality))
    bin_dir.mkdir(parents=True, exist_ok=True)
    [exe] = ScriptMaker(str(source), str(bin_dir)).make("hermes")  # its shebang names this Python
    return Path(exe)


def live_standbys(jobs: Path) -> list[psutil.Process]:
    """The standby processes of a jobs folder, from the files each keeps there while it lives."""
    found = []
    for path in (jobs / "standby").glob("standby-*.pid"):
        with suppress(OSError, ValueError):
            identity = ProcessId(**json.loads(path.read_text()))
            if (process := identity.process()) is not None:
                found.append(process)
    return found


@dataclasses.dataclass
class Bridge:
    """One isolated bridge installation for a test: its config, folders and environment."""

    tmp: Path
    root: Path
    jobs: Path
    trace: Path
    config: Path
    hermes: Path
    settings: dict[str, Any]
    extra_env: dict[str, str] = dataclasses.field(default_factory=dict)  # more for the server and its supervisors

    @classmethod
    def create(cls, tmp_path: Path) -> "Bridge":
        """A bridge with one allowed root, its own jobs and logs folders, and the fake hermes."""
        root = tmp_path / "roots" / "a"
        root.mkdir(parents=True)
        (tmp_path / "home").mkdir()
        trace = tmp_path / "trace"
        trace.mkdir()
        hermes = make_fake_hermes(tmp_path / "hermes-venv")
        bridge = cls(tmp=tmp_path, root=root, jobs=tmp_path / "jobs", trace=trace, config=tmp_path / "config.json",
                     hermes=hermes, settings={})
        bridge.configure(hermes_exe=str(hermes), hermes_home=str(tmp_path / "hermes-home"),
                         allowed_roots=[str(root)], jobs_dir=str(bridge.jobs), logs_dir=str(tmp_path / "logs"),
                         kill_grace_s=1, default_timeout_s=120, sandbox_writable=[str(trace)],
                         warm_start=False,  # tests/test_standby.py turns it on
                         pass_environment=["FAKE_*"])  # the fake Hermes' own settings
        return bridge

    def jobs_report(self, tail_bytes: int = 3000) -> str:
        """Each job's record and the tail of its log, for a failed test's report."""
        parts = []
        for path in sorted(self.jobs.glob("*.json")) if self.jobs.is_dir() else []:
            if not path.with_suffix(".task").exists():
                continue  # not a job's record
            log = path.with_suffix(".log")
            tail = log.read_bytes()[-tail_bytes:].decode("utf-8", "replace") if log.is_file() else "(no log)"
            parts.append(f"--- {path.name}\n{path.read_text('utf-8', 'replace')}\n--- {log.name} (tail)\n{tail}")
        return "\n".join(parts) or f"no job records in {self.jobs}"

    def kill_leftovers(self) -> None:
        """Never leave a fake's tree behind, whatever a test did, nor a standby of this jobs folder."""
        for pid in live_pids(self.traced_pids()):
            with suppress(psutil.Error):
                psutil.Process(pid).kill()
        for process in live_standbys(self.jobs):
            with suppress(psutil.Error):
                for member in [process, *process.children(recursive=True)]:
                    member.kill()

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HERMES_", "FAKE_HERMES"))}
        env.update(HERMES_BRIDGE_CONFIG=str(self.config), FAKE_HERMES_TRACE=str(self.trace),
                   HOME=str(self.tmp / "home"), XDG_CACHE_HOME=str(SHARED_CACHE), **self.extra_env)
        return env

    def configure(self, **changes: Any) -> None:
        self.settings.update(changes)
        self.config.write_text(json.dumps(self.settings, indent=1))
        if "hermes_exe" in changes and Path(changes["hermes_exe"]) in (*REAL_HERMES_VERSIONS.values(), WINDOWS_HERMES):
            seed_probes(self.config, str(changes["hermes_exe"]))

    def client(self, **kwargs: Any) -> "BridgeClient":
        return BridgeClient(self.env, **kwargs)

    def call_body(self, monkeypatch: Any, tool: str, body: "ToolBody | Listing") -> "Result":
        """A tool body run in this process as the server runs it (answer: this bridge's config, a refusal or
        a bug as a result, the audit line), without MCP: for tables of cases a host sees one of end to end."""
        import anyio

        monkeypatch.setenv("HERMES_BRIDGE_CONFIG", str(self.config))
        monkeypatch.delenv(SETTINGS_ENV, raising=False)
        outcome = anyio.run(run_tool_body, tool, body)
        return Result(outcome.text, outcome.is_error)

    def runs(self) -> list[dict[str, Any]]:
        """Every fake Hermes run so far, from its trace file, in the order they were written."""
        return [json.loads(p.read_text()) for p in self.traces("*.json")]

    def invocations(self) -> list[list[str]]:
        """The argv of every fake Hermes process started so far, runs and probes alike, oldest first."""
        return [json.loads(p.read_text()) for p in self.traces("*.invoked")]

    def traces(self, pattern: str) -> list[Path]:
        """By time written, not by name: pid 10000 sorts before pid 9999 as text."""
        return sorted(self.trace.glob(pattern), key=lambda path: (path.stat().st_mtime_ns, path.name))

    def traced_pids(self) -> list[int]:
        pids = [run["pid"] for run in self.runs()]
        return pids + [int(p.stem) for p in self.trace.glob("*.child")]

    def record(self, job_id: str) -> JobRecord:
        return JobStore(self.jobs).read(job_id)

    def wait_record(self, job_id: str, field: str, timeout: float = 20) -> Any:
        """A field of a job's record once it is set, e.g. its supervisor's or Hermes' ProcessId."""
        return wait_until(lambda: getattr(self.record(job_id), field), timeout, f"job {job_id} to record {field}")

    def wait_in_tree(self, job_id: str, pids: list[int], timeout: float = 10) -> None:
        """Until the job's supervisor has recorded these pids as Hermes or its tree (it does every poll)."""
        def recorded() -> bool | None:
            record = self.record(job_id)
            known = {p.pid for p in record.tree} | ({record.hermes.pid} if record.hermes else set())
            return set(pids) <= known or None
        wait_until(recorded, timeout, f"pids {pids} in job {job_id}'s tree")

    def wait_for_runs(self, count: int, timeout: float = 30) -> list[dict[str, Any]]:
        return wait_until(lambda: runs if len(runs := self.runs()) >= count else None, timeout,
                          f"{count} Hermes runs")

    def wait_for_traced(self, count: int, timeout: float = 10) -> list[int]:
        """The traced pids (fake runs and the processes they spawned) once there are count of them: a fake's
        tree grows over a few of the supervisor's polls."""
        return wait_until(lambda: pids if len(pids := self.traced_pids()) >= count else None, timeout,
                          f"{count} traced processes")


def wait_until(probe: Callable[[], T | None], timeout: float, what: str, interval: float = 0.1) -> T:
    """probe()'s first truthy answer, polled until timeout; an AssertionError naming what never came."""
    deadline = time.time() + timeout
    while True:
        answer = probe()
        if answer:
            return answer
        if time.time() > deadline:
            raise AssertionError(f"waited {timeout:g} s for {what}; it never came")
        time.sleep(interval)


def live_pids(pids: list[int]) -> list[int]:
    """Which of these pids still run (a zombie waiting for its reaper does not count)."""
    found = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                found.append(pid)
        except psutil.Error:
            pass
    return found


def wait_gone(pids: list[int], timeout: float = 10) -> list[int]:
    deadline = time.time() + timeout
    while time.time() < deadline and live_pids(pids):
        time.sleep(0.1)
    return live_pids(pids)


def refused(result: "Result", *words: str) -> str:
    """Assert a refusal whose reason names every word given; returns the reason."""
    assert result.is_error, result.text
    assert result.field("STATUS") == "refused", result.text
    reason = result.field("REASON")
    for word in words:
        assert word in reason, (word, reason)
    return reason


def nothing_started(bridge: Bridge, settle_s: float = 0.3) -> None:
    """No Hermes ran and no job record was written. A refusal never writes a record, so settle_s (time for
    a supervisor that should not exist to start Hermes) may be 0 where no record is proof enough."""
    time.sleep(settle_s)
    assert bridge.runs() == []
    assert list(bridge.jobs.glob("2*.json")) == []


def hermes_answer(text: str) -> str:
    """The HERMES ANSWER section of a final block, its lines without the prefix that marks them as quoted."""
    section = text.split("--- HERMES ANSWER ---\n", 1)[1].split("\n--- HERMES OUTPUT ---", 1)[0]
    lines = section.split("\n")
    assert all(line.startswith(ANSWER_PREFIX) for line in lines), section
    return "\n".join(line[len(ANSWER_PREFIX):] for line in lines)


@dataclasses.dataclass
class Result:
    text: str
    is_error: bool

    def field(self, name: str) -> str:
        for line in self.text.splitlines():
            if line.startswith(name + ": "):
                return line[len(name) + 2:]
        raise AssertionError(f"no {name} line in:\n{self.text}")


@asynccontextmanager
async def open_session(params: StdioServerParameters, errlog: Any, **session_options: Any):
    async with stdio_client(params, errlog=errlog) as (read, write), \
            ClientSession(read, write, read_timeout_seconds=READ_TIMEOUT, **session_options) as session:
        init = await session.initialize()
        yield session, init


ZYGOTE = Path(__file__).resolve().parent / "server_zygote.py"
# The default server is forked from a zygote that imported the server's modules and the MCP stack once (see
# server_zygote.py: half of the suite's CPU went to those imports). bench/ turns this off: it times real starts.
SERVERS_FORKED = os.name != "nt"
_zygote: tuple[subprocess.Popen[bytes], str] | None = None


def zygote_socket() -> str:
    """This test process's zygote (started on first use, stopped with this process), by its socket."""
    global _zygote
    if _zygote is None or _zygote[0].poll() is not None:
        folder = tempfile.mkdtemp(prefix="chb-zygote-")
        path = os.path.join(folder, "socket")
        with open(os.path.join(folder, "zygote.log"), "wb") as log:
            process = subprocess.Popen([sys.executable, str(ZYGOTE), "serve", path], stdin=subprocess.DEVNULL,
                                       stdout=subprocess.DEVNULL, stderr=log, cwd=folder)
        wait_until(lambda: os.path.exists(path) or process.poll() is not None, 60, "the server zygote")
        if process.poll() is not None:
            raise RuntimeError(f"the server zygote exited: {Path(folder, 'zygote.log').read_text()}")
        _zygote = (process, path)
        atexit.register(shutil.rmtree, folder, True)  # its own clean-up is lost when something kills it first
    return _zygote[1]


class BridgeClient:
    """The official MCP client driving a real server over stdio, callable from sync tests: forked from the
    zygote by default (the same code and stdio, without the interpreter's start), `command` started fresh."""

    def __init__(self, env: dict[str, str], command: list[str] | None = None, **session_options: Any):
        """session_options go to ClientSession, e.g. elicitation_callback for a client that can elicit."""
        self.pidfile: str | None = None
        if command is None and SERVERS_FORKED:
            self.pidfile = os.path.join(tempfile.mkdtemp(prefix="chb-server-"), "pid")
            command = [sys.executable, "-S", str(ZYGOTE), "launch", zygote_socket(), self.pidfile]
        command = command or [sys.executable, str(SERVER)]
        self.params = StdioServerParameters(command=command[0], args=command[1:], env=env)
        self.session_options = session_options
        self.errlog = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed in __exit__)
        self.server_pid: int | None = None

    def __enter__(self) -> "BridgeClient":
        before = {p.pid for p in psutil.Process().children()}
        self._portal_cm = start_blocking_portal()
        self.portal = self._portal_cm.__enter__()
        self._session_cm = self.portal.wrap_async_context_manager(open_session(self.params, self.errlog,
                                                                               **self.session_options))
        self.session, self.init = self._session_cm.__enter__()
        if self.pidfile:
            pidfile = Path(self.pidfile)
            self.server_pid = int(wait_until(lambda: pidfile.read_text() if pidfile.exists() else None, 10,
                                             "the forked server's pid"))
        else:
            new = [p for p in psutil.Process().children() if p.pid not in before]
            self.server_pid = new[0].pid if len(new) == 1 else None
        return self

    def __exit__(self, *exc: Any) -> None:
        with suppress(Exception):  # the server may have been killed on purpose
            self._session_cm.__exit__(None, None, None)
        self._portal_cm.__exit__(None, None, None)
        if self.pidfile:
            shutil.rmtree(os.path.dirname(self.pidfile), ignore_errors=True)

    def stderr(self) -> str:
        self.errlog.seek(0)
        return self.errlog.read()

    def call(self, tool: str, **arguments: Any) -> Result:
        result = self.portal.call(self.session.call_tool, tool, arguments)
        text = "\n".join(c.text for c in result.content if c.type == "text")
        return Result(text, bool(either(result, "is_error")))

    def wait_final(self, job_id: str, timeout: float = 60) -> Result:
        deadline = time.time() + timeout
        while True:
            result = self.call("hermes_status", job_id=job_id, wait_s=10)
            if result.field("STATUS") not in ("running", "queued") or time.time() > deadline:
                return result


E2E = REPO / ".e2e"
# The real Hermes versions the end-to-end tests run against, each installed by tests/install_e2e.sh.
REAL_HERMES_VERSIONS = {
    "0.19.0": E2E / "hermes-venv" / "bin" / "hermes",
    "0.20.1": E2E / "hermes020-venv" / "bin" / "hermesx",
    "0.22.2": E2E / "hermes022-venv" / "bin" / "hermes",
}
# The real Hermes 0.19.0 from Windows wheels, with its acp extra, for the Windows lane (tests/windows_lane.sh).
WINDOWS_HERMES = E2E / "windows" / "hermes0.19.0" / "Scripts" / "hermes.exe"
# The real Hermes versions installed with their acp extra, for the ACP driver.
REAL_ACP_VERSIONS = ("0.19.0", "0.22.2")
MCPB = E2E / "mcpb" / "node_modules" / ".bin" / "mcpb"
UV = E2E / "uv-venv" / "bin" / "uv"
# Every test has a home of its own; the bridge's bytecode cache (and so the standard library and the MCP stack it
# imports, compiled once) is shared, or each test's processes would compile them again: a few CPU-minutes a run.
SHARED_CACHE = E2E / "test-cache"
# uv's cache, shared by the tests that build an environment with uv (uv locks it for concurrent use): with one of
# its own each would download and unpack the MCP stack again, about 4 CPU-seconds a run.
UV_CACHE = SHARED_CACHE / "uv"
CLAUDE_CODE_VERSION = "2.1.328"
CLAUDE_CODE = E2E / "claude-code" / "node_modules" / ".bin" / "claude"
INSPECTOR = (E2E / "inspector" / "node_modules" / "@modelcontextprotocol" / "inspector" / "clients" / "launcher"
             / "build" / "index.js")


def seed_probes(config: Path, exe: str) -> None:
    """A real Hermes' answers to the bridge's two probes (`hermes chat --help`, `hermes acp --check`), asked once a
    run by the bridge's own code (probe_cli, acp_available) and copied into this bridge's cache: a real Hermes
    start costs a few CPU-seconds, and every test's first job would otherwise make two of them."""
    from claude_hermes_bridge.hermes_acp import acp_available
    from claude_hermes_bridge.hermes_cli import exe_fingerprint, flags_cache_path, probe_cli
    from claude_hermes_bridge.safe_io import locked, read_json, write_atomic

    cfg = load_config(config)
    keys = (exe_fingerprint(exe), exe_fingerprint(exe) + "|acp")
    shared = SHARED_CACHE / "real-hermes-probes.json"
    with locked(SHARED_CACHE / "real-hermes-probes.lock", 300):
        known = read_json(shared) or {}  # the Windows lane shares it, and Wine's locks may not meet Linux's
        if not all(key in known for key in keys):
            probe_cli(cfg, exe)
            acp_available(cfg, exe)
            known.update({key: value for key, value in json.loads(flags_cache_path(cfg).read_text()).items()
                          if key in keys})
            write_atomic(shared, json.dumps(known).encode())
    cache_path = flags_cache_path(cfg)
    cache = json.loads(cache_path.read_text()) if cache_path.exists() else {}
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    cache_path.write_text(json.dumps({**cache, **{key: known[key] for key in keys if key in known}}))


def raw_exchange(env: dict[str, str], calls: list[str], timeout: float = 20,
                 command: list[str] | None = None, capabilities: str = "{}",
                 method: str = "tools/call") -> list[dict[str, Any]]:
    """Speak JSON-RPC to a real server by hand, for bytes the official client refuses to send (NaN, lone
    surrogates) and capabilities neither SDK line's client declares (MCP Apps). Each entry of calls is the raw
    JSON of one request's `params`; returns the responses, {} for a request the server did not answer within
    timeout."""
    init = ('{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18",'
            f'"capabilities":{capabilities},"clientInfo":{{"name":"raw","version":"1"}}}}}}')
    requests = [(0, init), (None, '{"jsonrpc":"2.0","method":"notifications/initialized"}')]
    requests += [(n, f'{{"jsonrpc":"2.0","id":{n},"method":"{method}","params":{params}}}')
                 for n, params in enumerate(calls, start=1)]
    proc = subprocess.Popen(command or [sys.executable, str(SERVER)], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    responses: dict[int, dict[str, Any]] = {}
    assert proc.stdin is not None and proc.stdout is not None
    replies: queue.Queue[bytes] = queue.Queue()
    stdout = proc.stdout

    def read_replies() -> None:  # in a thread: select() takes no pipe on Windows
        for reply_line in stdout:
            replies.put(reply_line)
    threading.Thread(target=read_replies, daemon=True).start()
    try:
        for request_id, line in requests:
            proc.stdin.write(line.encode() + b"\n")
            proc.stdin.flush()
            deadline = time.time() + timeout
            while request_id is not None and request_id not in responses and time.time() < deadline:
                with suppress(queue.Empty):
                    reply = json.loads(replies.get(timeout=0.2))
                    if "id" in reply:
                        responses[reply["id"]] = reply
    finally:
        proc.kill()
        proc.wait()
    return [responses.get(n, {}) for n in range(1, len(calls) + 1)]


def listed_tools(bridge: "Bridge", capabilities: str = "{}") -> list[dict[str, Any]]:
    """tools/list as a client with these capabilities gets it, over a handshake made by hand."""
    [reply] = raw_exchange(bridge.env, ["{}"], capabilities=capabilities, method="tools/list")
    tools: list[dict[str, Any]] = reply["result"]["tools"]
    return tools


class ModernClient:
    """A JSON-RPC client written by hand for protocol 2026-07-28 (no handshake: every request carries the
    protocol version and the client's capabilities in `_meta`), for what the official 1.x/2.x clients do not
    send: the tasks extension declared per request, tasks/get, tasks/update, tasks/cancel."""

    def __init__(self, env: dict[str, str], command: list[str] | None = None):
        self.proc = subprocess.Popen(command or [sys.executable, str(SERVER)], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.next_id = 0
        self.pending = b""
        self.replies: dict[int, dict[str, Any]] = {}

    def __enter__(self) -> "ModernClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.proc.kill()
        self.proc.wait()

    def request(self, method: str, params: dict[str, Any] | None = None, tasks: bool = True,
                modern: bool = True, elicitation: bool = False, timeout: float = 30) -> dict[str, Any]:
        """One request and its whole reply (`result` or `error`); tasks=False leaves the extension undeclared,
        elicitation=True declares form elicitation, modern=False sends it without the 2026-07-28 envelope."""
        self.next_id += 1
        request_id = self.next_id
        params = dict(params or {})
        if modern:
            extensions: dict[str, Any] = {TASKS_EXTENSION: {}} if tasks else {}
            params["_meta"] = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                               "io.modelcontextprotocol/clientCapabilities": {
                                   "extensions": extensions, **({"elicitation": {"form": {}}} if elicitation else {})},
                               "io.modelcontextprotocol/clientInfo": {"name": "modern-test", "version": "1"}}
        self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        deadline = time.time() + timeout
        while request_id not in self.replies:
            assert time.time() < deadline, f"no reply to {method} within {timeout} s"
            self.read(min(0.2, deadline - time.time()))
        return self.replies.pop(request_id)

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()

    def read(self, wait_s: float) -> None:
        assert self.proc.stdout is not None
        if select.select([self.proc.stdout], [], [], max(0.0, wait_s))[0]:
            chunk = os.read(self.proc.stdout.fileno(), 1 << 20)
            assert chunk, "the server closed its stdout"
            self.pending += chunk
            *complete, self.pending = self.pending.split(b"\n")
            for raw in complete:
                reply = json.loads(raw)
                if "id" in reply and "method" not in reply:
                    self.replies[reply["id"]] = reply

    def call(self, tool: str, tasks: bool = True, elicitation: bool = False, **arguments: Any) -> dict[str, Any]:
        return self.request("tools/call", {"name": tool, "arguments": arguments}, tasks=tasks,
                            elicitation=elicitation, timeout=60)["result"]

    def poll(self, task_id: str, until: Callable[[dict[str, Any]], bool], timeout: float = 60) -> dict[str, Any]:
        return wait_until(lambda: r if until(r := self.request("tasks/get", {"taskId": task_id})["result"]) else None,
                          timeout, f"task {task_id}", interval=0.3)


TASKS_EXTENSION = "io.modelcontextprotocol/tasks"


def text_of(result: dict[str, Any]) -> str:
    """The text of a CallToolResult as it travels on the wire."""
    return "\n".join(block["text"] for block in result["content"] if block.get("type") == "text")


def config_for(tmp_path: Path, **values: Any) -> Config:
    """A config read from a file holding these values, its jobs folder under tmp_path unless they say."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"jobs_dir": str(tmp_path / "jobs"), **values}))
    return load_config(path)


def running_record(**fields: Any) -> JobRecord:
    return JobRecord(id="20261130-000000-1", state=JobState.RUNNING, **fields)


def in_playground(root: Path, spelling: str) -> str:
    """A case's path: <root>, <root-name> and <sibling> stand for the playground's folders."""
    return (spelling.replace("<root-name>", root.name).replace("<root>", str(root))
            .replace("<sibling>", str(root.parent / (root.name + "b"))))


STORE_SCHEMA = [
    "CREATE TABLE sessions (id TEXT PRIMARY KEY, source TEXT, model TEXT, started_at REAL, ended_at REAL, "
    "message_count INTEGER, tool_call_count INTEGER, api_call_count INTEGER, input_tokens INTEGER, "
    "output_tokens INTEGER, cwd TEXT)",
    "CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT, role TEXT, content TEXT, "
    "tool_call_id TEXT, tool_calls TEXT, tool_name TEXT, timestamp REAL, finish_reason TEXT, active INTEGER)",
]


def make_store(home: Path, rows: Sequence[tuple[str, tuple[Any, ...]]] = ()) -> Path:
    home.mkdir(parents=True, exist_ok=True)
    path = home / "state.db"
    db = sqlite3.connect(path)
    for statement in STORE_SCHEMA:
        db.execute(statement)
    for statement, values in rows:
        db.execute(statement, values)
    db.commit()
    db.close()
    return path


# The tools as a host sees them: required and all arguments, and which are read-only.
EXPECTED_ARGS = {
    "hermes_run": ({"task"}, {"task", "cwd", "max_turns", "timeout_s", "wait_s", "skills", "toolsets", "max_tokens",
                              "max_cost_usd", "isolation", "isolation_base", "network", "executor"}),
    "hermes_resume": ({"session_id", "task"}, {"session_id", "task", "cwd", "max_turns", "timeout_s", "wait_s",
                                               "max_tokens", "max_cost_usd", "executor"}),
    "hermes_status": (set(), {"job_id", "wait_s", "job_ids", "until"}),
    "hermes_jobs": (set(), {"limit", "state"}),
    "hermes_read": ({"path"}, {"path", "max_bytes", "offset"}),
    "hermes_capabilities": (set(), {"query", "category", "limit"}),
    "hermes_health": (set(), set()),
    "hermes_cancel": ({"job_id"}, {"job_id"}),
    "hermes_approve": ({"job_id", "approval_id", "decision"}, {"job_id", "approval_id", "decision"}),
    "hermes_land": ({"job_id", "action"}, {"job_id", "action"}),
    "hermes_steer": ({"job_id", "guidance"}, {"job_id", "guidance", "when"}),
    "hermes_view_job": ({"job_id"}, {"job_id"}),  # the job view's own (app-only) tools
    "hermes_view_patch": ({"job_id"}, {"job_id", "offset"}),
    "hermes_view_answer": ({"job_id", "approval_id", "decision", "token"}, {"job_id", "approval_id", "decision",
                                                                            "token"}),
    "hermes_view_steer": ({"job_id", "guidance", "when", "token"}, {"job_id", "guidance", "when", "token"}),
}


# Listed only to a client that declared MCP Apps (the job view calls them; a model is never offered them).
APP_ONLY_TOOLS = {"hermes_view_job", "hermes_view_patch", "hermes_view_answer", "hermes_view_steer"}
APPS_CAPABILITIES = '{"extensions":{"io.modelcontextprotocol/ui":{"mimeTypes":["text/html;profile=mcp-app"]}}}'

READ_ONLY = {"hermes_status", "hermes_jobs", "hermes_read", "hermes_capabilities", "hermes_health", "hermes_view_job",
             "hermes_view_patch"}
