"""[supervisor] A standby for default jobs in any folder (issue 65): Hermes' Python runs the late step
(late_binding), imports Hermes' modules inside a first sandbox layer with the allowed roots and the tool caches
covered, and is bound to the job that takes it: the job's folder, rules and mounts, computed by the same functions
a cold start uses (drivers.sandbox_writable, sandbox_mounts, job_unreadable)."""
import contextlib
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psutil

from .config import Config
from .drivers import (
    any_job_writable,
    cache_environment,
    hermes_launch,
    job_unreadable,
    project_cache,
    python_prefixes,
    sandbox_mounts,
    sandbox_writable,
    start_hermes,
    tool_cache,
)
from .hermes_acp import INITIALIZE, WarmHermes
from .hermes_cli import locate_hermes, sandbox_extra
from .jobs import JobStore
from .late_binding import BIND_REPLY_MAX, IMPORTED, entry_python, late_step_argv, within
from .network import JobProxy, NetworkPolicy, enforcement
from .preflight import PACKAGE_DIR
from .processes import Ownership, started_process, stop_tree
from .sandbox import handed_descriptors, mechanism, private_devices_refusal

LATE_PLACE = "any folder (bound late)"  # a late standby's place in its key and ready.json
# What a late standby imports ahead when no Hermes could record what it imports (record_ahead): Hermes' ACP
# server, agent and tools (docs/performance.md: about half of a cold start's imports). A name a version lacks is
# skipped.
AHEAD_MODULES = ("acp_adapter.server", "run_agent", "model_tools")
MODULE_NAME = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
# A line of Python's import-time report (PYTHONPROFILEIMPORTTIME): "import time: self | cumulative | module".
IMPORT_TIME_RE = re.compile(rb"import time:\s*\d+\s*\|\s*\d+\s*\|\s*(" + MODULE_NAME.encode() + rb")\s*")
REPORT_MAX = 8 << 20  # bytes of a recording Hermes' stderr read
MODULES_MAX = 20000
RECORDING_PROMPT = "claude-hermes-bridge: recording what Hermes imports; no model is reached"
BIND_S = 10.0


def late_refusal(cfg: Config, exe: str) -> str | None:
    """Why a default job's standby here is readied for its folder rather than bound late, or None."""
    if not cfg.warm_start_any_folder:
        return "warm_start_any_folder is off"
    if not sys.platform.startswith("linux"):
        return f"binding late needs Linux's mount namespaces; this is {sys.platform}"
    if cfg.sandbox == "off" or not mechanism().name.startswith("Landlock"):
        return "binding late needs the sandbox (Landlock)"
    if refused := private_devices_refusal():
        return f"binding late needs a mount namespace of the job's own: {refused}"
    if entry_python(exe) is None:
        return f"{exe} is not a Python console script"
    own = [str(cfg.hermes_home_path), str(PACKAGE_DIR), str(JobStore.of(cfg).root), *python_prefixes(exe),
           *sandbox_extra(cfg)]
    for root in cfg.roots:
        if any(within(os.path.realpath(path), os.path.realpath(root)) for path in own):
            return (f"the allowed root {root} holds Hermes' home, its install, the jobs folder or the bridge, "
                    "which must stay seen")
    return None


def may_bind_late(cfg: Config) -> bool:
    """Whether a standby bound late is worth its start here, as far as the server tells without starting a process
    (the standby's late_refusal says the rest)."""
    if not cfg.warm_start_any_folder or not sys.platform.startswith("linux") or cfg.sandbox == "off":
        return False
    exe = locate_hermes(cfg).usable
    return exe is not None and entry_python(exe) is not None


def covers(cfg: Config, private_tmp: Path) -> list[str]:
    """The folders covered until a job is bound: the allowed roots that exist, and the tool caches (made now)."""
    roots = [os.path.realpath(root) for root in cfg.roots if os.path.isdir(root)]
    caches = tool_cache(private_tmp)
    caches.mkdir(parents=True, exist_ok=True)
    return list(dict.fromkeys([*roots, str(caches)]))


class LateHermes:
    """A late-bound Hermes' process and the supervisor's end of its helper's socket."""

    def __init__(self, warm: WarmHermes, helper: socket.socket, covered: list[str], exe: str):
        self.warm, self.helper, self.covered, self.exe = warm, helper, covered, exe

    def bind(self, cfg: Config, folder: str, private_tmp: Path) -> None:
        """Bind it to a default job in folder: the helper shows the job's view, the step confines itself to the
        job's rules and runs Hermes (initialize: once the job is its own). OSError: not bound (the standby is
        done)."""
        folder = os.path.realpath(folder)
        roots = [os.path.realpath(root) for root in cfg.roots]
        if not any(within(folder, root) for root in roots if root in self.covered):
            raise OSError(f"{folder} is in no allowed root covered when it was started")
        writable = sandbox_writable(cfg, folder, private_tmp, None)
        unreadable = job_unreadable(cfg, writable, self.exe)
        request = {"writable": writable, "unreadable": unreadable,
                   "mounts": sandbox_mounts(self.exe, folder, None, writable)}
        self.helper.settimeout(BIND_S)
        try:
            self.helper.sendall((json.dumps(request) + "\n").encode())
            reply = self.helper.recv(BIND_REPLY_MAX).decode(errors="replace").strip()
        except OSError as exc:
            raise OSError(f"its mount helper did not answer: {exc}") from None
        finally:
            self.helper.close()
        if reply != "bound":
            raise OSError(f"its mount helper could not show the job's folder: {reply or 'it exited'}")
        environment = cache_environment(project_cache(private_tmp, folder, None))
        line = {"folder": folder, "writable": writable, "unreadable": unreadable, "environment": environment}
        proc = self.warm.proc
        try:
            assert proc.stdin is not None
            proc.stdin.write((json.dumps(line) + "\n").encode())
            proc.stdin.flush()
        except OSError as exc:
            raise OSError(f"its Hermes exited before it was bound: {exc}") from None

    def initialize(self, timeout_s: float) -> None:
        """Hermes, bound and running, initialized as a standby's is before its job."""
        self.warm.agent = self.warm.request("initialize", INITIALIZE, timeout_s)


def imported_names(report: bytes) -> list[str]:
    """The modules an import-time report names, each once, in the order their imports finished (what a module
    imports before it)."""
    found = (match.group(1).decode() for line in report.splitlines() if (match := IMPORT_TIME_RE.fullmatch(line)))
    return list(dict.fromkeys(found))[:MODULES_MAX]


def module_names(value: Any) -> list[str] | None:
    """value when it is a list of module names (of at most MODULES_MAX), else None."""
    if isinstance(value, list) and len(value) <= MODULES_MAX and all(
            isinstance(name, str) and re.fullmatch(MODULE_NAME, name, re.ASCII) for name in value):
        return value
    return None


def record_ahead(cfg: Config, exe: str, private_tmp: Path, policy: Path, timeout_s: float
                 ) -> tuple[list[str], str | None]:
    """The modules a Hermes started as a default job's is, in a throw-away folder of private_tmp, imports through
    initialize, its first session and, where the operating system holds its network, its first prompt up to its
    first model request (RECORDING_PROMPT, refused with every other request by a proxy that allows nothing), as
    Python's import-time report on its stderr names them; and that session's id: what a late standby imports
    ahead. It runs no task, reaches no host and sees no job's folder. OSError: it did not answer."""
    marker = "standby:" + secrets.token_hex(16)
    folder = private_tmp / f"recording-{secrets.token_hex(4)}"
    folder.mkdir()
    writable = sandbox_writable(cfg, str(folder), private_tmp, None)
    proxy, enforced = JobProxy(NetworkPolicy("model-only", (), None)), enforcement(True)[0]  # no host, no model
    argv, env = hermes_launch(cfg, [exe, "acp"], marker, writable, private_tmp, None, proxy, enforced,
                              mounts=sandbox_mounts(exe, str(folder), None, writable),
                              cache=project_cache(private_tmp, str(folder), None))
    proc = start_hermes(argv, str(folder), dict(env, HERMES_MANAGED_DIR=str(policy), PYTHONPROFILEIMPORTTIME="1"),
                        subprocess.PIPE, subprocess.PIPE, subprocess.PIPE)
    report = bytearray()

    def read_report() -> None:
        for line in proc.stderr or ():
            if len(report) < REPORT_MAX:
                report.extend(line)
    reader = threading.Thread(target=read_report, name="import-report", daemon=True)
    reader.start()
    hermes = WarmHermes(proc)
    try:
        hermes.warm_up(str(folder), timeout_s)
        if enforced and hermes.warm_session:  # its model request refused by the operating system too: never sent
            with contextlib.suppress(OSError):  # what it imported until then is recorded whatever it answers
                hermes.answer("session/prompt", {"sessionId": hermes.warm_session,
                                                 "prompt": [{"type": "text", "text": RECORDING_PROMPT}]}, timeout_s)
    finally:
        with contextlib.suppress(psutil.Error):
            stop_tree(Ownership(marker, frozenset({os.getpid()})), started_process(proc.pid), [], cfg.kill_grace_s)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
        reader.join(5)
        proxy.close()
        shutil.rmtree(folder, ignore_errors=True)
    return imported_names(bytes(report)), hermes.warm_session


def start_late(cfg: Config, exe: str, marker: str, private_tmp: Path, proxy: JobProxy | None, enforced: bool,
               policy: Path, timeout_s: float, ahead: tuple[list[str], bool]) -> tuple[LateHermes, dict[str, Any]]:
    """Hermes' Python started on the late step with everything a default job here gets that is not its folder's
    (the environment hermes_launch makes, the proxy, the job-independent mounts), waited for until its imports are
    done. ahead: the modules to import, and whether none of them is known to start a thread (else the step finds
    out: late_binding.without_thread_starters). The LateHermes and what the step said of its imports; OSError: not
    ready."""
    covered = covers(cfg, private_tmp)
    writable = [*any_job_writable(cfg, private_tmp), *covered]
    mounts = sandbox_mounts(exe, str(private_tmp), None, writable)
    argv, env = hermes_launch(cfg, [exe, "acp"], marker, writable, private_tmp, None, proxy, enforced, mounts=mounts,
                              cache=tool_cache(private_tmp))
    channel = handed_descriptors(argv)
    ours, helpers = socket.socketpair()
    spec = {"writable": writable, "unreadable": job_unreadable(cfg, writable, exe), "covers": covered,
            "mounts": mounts, "ports": [proxy.port] if proxy and enforced else [],
            "own_network": channel[0] if channel else None, "helper": helpers.fileno(), "folder": str(private_tmp),
            "modules": ahead[0], "tested": ahead[1], "import_s": timeout_s / 2}
    python = entry_python(exe) or sys.executable
    proc = start_hermes(late_step_argv(python, exe, spec), str(private_tmp), dict(env, HERMES_MANAGED_DIR=str(policy)),
                        subprocess.PIPE, subprocess.PIPE, subprocess.PIPE, handed=(*channel, helpers.detach()))
    warm = WarmHermes(proc)
    said = warm.notice(IMPORTED, timeout_s)
    if "refused" in said:
        raise OSError(str(said["refused"]))
    if said.get("threads") != 1:
        raise OSError(f"its imports left {said.get('threads')} threads")
    return LateHermes(warm, ours, covered, exe), said
