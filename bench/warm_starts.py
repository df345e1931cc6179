"""The benchmark's rows that run the real Hermes over ACP (installed by tests/install_e2e.sh): warm starts against
cold ones (issues 39, 51, 65), and the evidence behind issue 65's design (late binding)."""
import contextlib
import functools
import json
import os
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rows import Row, ms_since
from test_real_hermes import write_hermes_home
from test_worktrees import make_repo

from claude_hermes_bridge.hermes_acp import WarmHermes
from claude_hermes_bridge.late_standby import LATE_PLACE
from claude_hermes_bridge.safe_io import read_json
from claude_hermes_bridge.standby import is_alive_standby
from harness import REAL_HERMES_VERSIONS, Bridge, BridgeClient, Result, wait_until
from scripted_model import ScriptedModel

REPO = Path(__file__).resolve().parent.parent
LATE_BOUND = Path(__file__).resolve().parent / "late_bound_hermes.py"


def first_request_s(client: BridgeClient, model: ScriptedModel, task: str, tool: str = "hermes_run",
                    **arguments: Any) -> tuple[float, Result]:
    """From the tool's call (hermes_run or hermes_resume) to the model's first request, in seconds, and the job's
    final block."""
    started = time.time()
    job_id = client.call(tool, task=task, wait_s=0, **arguments).field("JOB_ID")
    arrived = wait_until(lambda: model.first_request_with(task), 120, "the model's first request for the task")
    return arrived - started, client.wait_final(job_id)


def installed_acp_versions(rows_of: str, versions: Sequence[str]) -> Iterator[tuple[str, Path]]:
    """Each of these real Hermes versions with ACP that tests/install_e2e.sh installed, with its executable; a
    missing one is said."""
    for version in versions:
        exe = REAL_HERMES_VERSIONS[version]
        if exe.exists():
            yield version, exe
        else:
            print(f"{rows_of} rows: the real Hermes {version} is not installed (bash tests/install_e2e.sh)")


def warm_start_rows(runs: int, versions: Sequence[str], worktree: bool = False, folders: int = 1,
                    resumed: bool = False, network: str = "ask", new_folders: bool = False) -> list[Row]:
    """Issue 39: hermes_run until the model's first request with a warm Hermes against a cold start, alternating,
    for each of these versions of the real Hermes with ACP (installed by tests/install_e2e.sh), the next job in the
    same folder; with worktree (issue 51), the next worktree job on the same repository; with folders (issue 65),
    jobs taking turns in that many folders (the first job in each readies its folder's standby, not measured);
    resumed (issue 65), hermes_resume of the first job's session each time (with worktree: in its worktree, the
    first warm one a resume too, which readies the standby there); network (issue 65): each job's own
    network mode (a limited one waits behind a proxy of its own, warm or cold); new_folders (issue 65): each job in
    a folder no job ran in, warm_start_any_folder on (the standby bound late). Each on a
    server past its first tool call (first_job_rows measure a server's first job)."""
    rows = []
    for version, exe in installed_acp_versions("warm start", versions):
        with tempfile.TemporaryDirectory() as tmp, ScriptedModel(Path(tmp)) as model:
            bridge = Bridge.create(Path(tmp))
            write_hermes_home(bridge.tmp / "real-home", model.base_url)
            times: dict[str, list[float]] = {"warm": [], "cold": []}
            sessions: list[str] = []  # each place's first job's, which resumed jobs continue
            worktrees: list[str] = []  # each place's first job's folder (with worktree: its worktree)
            places = [{"cwd": str(make_repo(bridge.root / "repo")), "isolation": "worktree"}] if worktree else [
                {"cwd": str(bridge.root / f"project-{number}")} for number in range(folders)]
            for place in places:
                Path(place["cwd"]).mkdir(exist_ok=True)
            try:
                for n in range(runs + len(places)):
                    where = places[n % len(places)]
                    for side in ("cold", "warm"):
                        if new_folders and n >= len(places):  # each side's job in a folder no job ran in
                            where = {"cwd": str(bridge.root / f"new-{n}-{side}")}
                            Path(where["cwd"]).mkdir()
                        bridge.configure(hermes_exe=str(exe), hermes_home=str(bridge.tmp / "real-home"),
                                         hermes_driver="acp", approvals="yolo", warm_start=side == "warm",
                                         warm_start_folders=len(places) + (worktree and resumed),
                                         warm_start_any_folder=new_folders)
                        with bridge.client() as client:
                            client.call("hermes_jobs")  # a server past its first call, as a host's session holds
                            if side == "warm" and n >= len(places):  # the first in each readies its standby
                                waits = functools.partial(standby_waits_in, bridge.jobs, {"cwd": worktrees[0]}) \
                                    if worktree and resumed else functools.partial(standby_waits_in, bridge.jobs, where)
                                wait_until(waits, 120, "a ready standby")
                            # a resume in a worktree readies the next one's standby: the first warm one resumes too
                            resuming = {"tool": "hermes_resume", "session_id": sessions[n % len(places)]} \
                                if resumed and (n >= len(places) or (worktree and side == "warm")) else {}
                            limit = {} if network == "ask" else {"network": network}
                            placed = {} if worktree and resuming else where  # a resume runs where its session did
                            took, final = first_request_s(client, model, f"bench {side} {n}", **placed, **resuming,
                                                          **limit)
                        start = final.field("START")
                        assert start.startswith(side) or (n < len(places) and side == "warm"), start
                        if n >= len(places):
                            times[side].append(took)
                        elif side == "cold":
                            sessions.append(final.field("SESSION_ID"))
                            worktrees.append(final.field("CWD"))
            finally:
                bridge.kill_leftovers()  # the last standby too
        warm, bound = statistics.median(times["warm"]), 1.5 if worktree else 1.0
        kind = ("a resumed worktree job" if worktree and resumed else "a worktree job" if worktree
                else "hermes_resume" if resumed else "hermes_run in a new folder, bound late" if new_folders
                else "hermes_run" if folders == 1
                else f"jobs taking turns in {folders} folders") + (
            " (network ask, the default)" if network == "ask" else f" (network {network})")
        rows.append(Row(f"{kind} until the model's first request, Hermes {version} over ACP, warm (floor: cold)",
                        times["warm"], times["cold"], "s", f"warm {warm:.2f} s {'PASS' if warm <= bound else 'MISS'}",
                        f"warm <= {bound} s"))
    return rows


def standby_waits(ready: Path) -> bool | None:
    return is_alive_standby(read_json(ready)) or None


def standby_waits_in(jobs: Path, where: dict[str, str], count: int = 1) -> bool | None:
    """Whether standbys of count slots wait for a job there (a worktree job's place: any standby, one slot; a
    resumed worktree job's: the one readied in that worktree, standby_place)."""
    return sum(is_alive_standby(ready) and ("isolation" in where or str(ready.get("folder")).startswith(
        f"{where['cwd']} (the worktree of job ") or ready.get("folder") in (where["cwd"], LATE_PLACE))
               for ready in (read_json(path) for path in jobs.glob("standby*/ready.json"))) >= count or None


def first_job_rows(runs: int, versions: Sequence[str]) -> list[Row]:
    """Issue 65: a server's first job, in the folder of the last job before the server was restarted (no standby
    survives the restart): warm, once the standby the server's start readies for that folder is ready, against
    cold (warm_start off), alternating, for each of these versions of the real Hermes with ACP."""
    rows = []
    for version, exe in installed_acp_versions("first job", versions):
        with tempfile.TemporaryDirectory() as tmp, ScriptedModel(Path(tmp)) as model:
            bridge = Bridge.create(Path(tmp))
            write_hermes_home(bridge.tmp / "real-home", model.base_url)
            ready = bridge.jobs / "standby" / "ready.json"
            times: dict[str, list[float]] = {"warm": [], "cold": []}
            try:
                for n in range(runs):
                    for side in ("cold", "warm"):
                        bridge.kill_leftovers()
                        bridge.configure(hermes_exe=str(exe), hermes_home=str(bridge.tmp / "real-home"),
                                         hermes_driver="acp", approvals="yolo", warm_start=side == "warm")
                        with bridge.client() as client:
                            if side == "warm":
                                wait_until(functools.partial(standby_waits, ready), 120,
                                           "the standby of the server's start")
                            took, final = first_request_s(client, model, f"first {side} {n}")
                        start = final.field("START")
                        assert start.startswith(side), start
                        times[side].append(took)
            finally:
                bridge.kill_leftovers()
        warm = statistics.median(times["warm"])
        rows.append(Row(f"a server's first job until the model's first request, Hermes {version} over ACP, warm "
                        "(floor: cold)", times["warm"], times["cold"], "s",
                        f"warm {warm:.2f} s {'PASS' if warm <= 1.0 else 'MISS'}", "warm <= 1.0 s"))
    return rows


def jobs_together_rows(runs: int, versions: Sequence[str], together: int = 3) -> list[Row]:
    """Issue 65: `together` jobs started at once in one folder, each from its own hermes_run call to its model's
    first request, with warm_start (a standby waiting there, and after the first run one in each of the 2 slots
    the burst before left, unless it retired) against without, alternating, for each of these versions of the
    real Hermes with ACP; the verdict counts how many started warm."""
    rows = []
    for version, exe in installed_acp_versions("jobs together", versions):
        with tempfile.TemporaryDirectory() as tmp, ScriptedModel(Path(tmp)) as model:
            bridge = Bridge.create(Path(tmp))
            write_hermes_home(bridge.tmp / "real-home", model.base_url)
            where = {"cwd": str(bridge.root)}
            times: dict[str, list[float]] = {"warm": [], "cold": []}
            starts: list[str] = []
            try:
                for n in range(runs):
                    for side in ("cold", "warm"):
                        bridge.configure(hermes_exe=str(exe), hermes_home=str(bridge.tmp / "real-home"),
                                         hermes_driver="acp", approvals="yolo", warm_start=side == "warm")
                        with bridge.client() as client:
                            client.call("hermes_jobs")  # a server past its first call, as a host's session holds
                            if side == "warm":
                                if n == 0:  # the first job readies the folder's standby
                                    client.wait_final(client.call("hermes_run", task="readies", wait_s=0,
                                                                  **where).field("JOB_ID"))
                                wait_until(functools.partial(standby_waits_in, bridge.jobs, where), 120,
                                           "a ready standby")
                                with contextlib.suppress(AssertionError):  # the second slot's, if it came
                                    wait_until(functools.partial(standby_waits_in, bridge.jobs, where, 2), 20, "")
                            called = [(time.time(), f"together {side} {n} {k}", client.call(
                                "hermes_run", task=f"together {side} {n} {k}", wait_s=0, **where).field("JOB_ID"))
                                for k in range(together)]
                            for started, task, job_id in called:
                                times[side].append(wait_until(functools.partial(model.first_request_with, task),
                                                              120, "the model's first request") - started)
                                start = client.wait_final(job_id).field("START")
                                if side == "warm":
                                    starts.append(start.split(" ", 1)[0])
            finally:
                bridge.kill_leftovers()
        rows.append(Row(f"{together} jobs started together in one folder, each until its model's first request, "
                        f"Hermes {version} over ACP, warm_start on (floor: off)", times["warm"], times["cold"], "s",
                        f"measured: {starts.count('warm')} of {len(starts)} warm", "every job warm (issue 65)"))
    return rows


def session_new_rows(runs: int, versions: Sequence[str]) -> list[Row]:
    """Issue 51: what `session/new` spends in a new folder on a `hermes acp` already warmed by a session in
    another folder (what a standby readied elsewhere would pay), against one more session in the warmed folder,
    alternating, for each of these versions of the real Hermes with ACP: whether a standby could serve any folder.
    It could not anyway: the sandbox's rules and 0.19.0's prompt are bound to the folder at Hermes' spawn, so a
    worktree standby readies the worktree first (warm_start_rows with worktree)."""
    rows = []
    for version, exe in installed_acp_versions("session/new", versions):
        with tempfile.TemporaryDirectory() as tmp, ScriptedModel(Path(tmp)) as model:
            home, warmed = Path(tmp) / "home", Path(tmp) / "warmed"
            write_hermes_home(home, model.base_url)
            warmed.mkdir()
            proc = subprocess.Popen([str(exe), "acp"], cwd=warmed, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, env=dict(os.environ, HERMES_HOME=str(home), HOME=tmp))
            hermes = WarmHermes(proc)
            times: dict[str, list[float]] = {"new": [], "same": []}
            try:
                hermes.warm_up(str(warmed), 120)
                for n in range(runs):
                    for side in ("new", "same"):
                        folder = Path(tmp) / f"new-{n}" if side == "new" else warmed
                        folder.mkdir(exist_ok=True)
                        start = time.perf_counter()
                        hermes.request("session/new", {"cwd": str(folder), "mcpServers": []}, 120)
                        times[side].append(ms_since(start))
            finally:
                proc.stdin.close()  # type: ignore[union-attr]
                proc.wait(30)
        rows.append(Row(f"session/new on a warmed hermes acp {version}, a new folder (floor: the warmed folder)",
                        times["new"], times["same"], "ms",
                        f"measured: ratio {statistics.median(times['new']) / statistics.median(times['same']):.2f}",
                        "none: what a warm worktree job would still pay"))
    return rows


def acp_turn_until_request(model: ScriptedModel, proc: subprocess.Popen[bytes], folder: Path, task: str,
                           started: float) -> float:
    """Seconds from started to the model's first request for task, asked of this `hermes acp` in folder."""
    threading.Thread(target=lambda: [None for _ in proc.stderr or ()], daemon=True).start()
    hermes = WarmHermes(proc)
    hermes.warm_up(str(folder), 120)
    hermes.request("session/prompt", {"sessionId": hermes.warm_session, "prompt": [{"type": "text", "text": task}]},
                   120)
    return wait_until(lambda: model.first_request_with(task), 120, "the model's first request") - started


def late_binding_rows(runs: int, versions: Sequence[str]) -> list[Row]:
    """Issue 65: a Hermes whose modules were imported before any job was known, then bound to a job's folder and
    sandbox in its own process (bench/late_bound_hermes.py: the mount namespace and Landlock by the sandbox step's
    own code), against a cold `hermes acp` in a new folder, alternating: what a standby for any folder would give.
    The modules are those a first session loaded (recorded once, unmeasured). Not the product."""
    rows = []
    for version, exe in installed_acp_versions("late binding", versions):
        with tempfile.TemporaryDirectory() as tmp, ScriptedModel(Path(tmp)) as model:
            write_hermes_home(Path(tmp) / "home", model.base_url)
            times, found = late_binding_times(runs, exe, model, Path(tmp))
        rows.append(Row(f"Hermes {version}'s modules imported first, then bound to a new folder and its sandbox in "
                        f"its own process (floor: a cold hermes acp there)", times["late"], times["cold"], "s",
                        f"measured: {found.get('modules')} modules, {found.get('threads')} thread(s) after them, "
                        f"namespace {found.get('namespace')}, the folder read at import by "
                        f"{len(found.get('folder_reads', []))} module(s)", "none: evidence for issue 65's design"))
        print(f"late binding, Hermes {version}: what the imports did: {json.dumps(found)}")
    return rows


def late_binding_times(runs: int, exe: Path, model: ScriptedModel, root: Path) -> tuple[dict[str, list[float]],
                                                                                     dict[str, Any]]:
    """late_binding_rows' runs in root (Hermes' home in root/home): seconds to the model's first request, late
    bound and cold, and what the last late-bound Hermes' imports did."""
    python, modules, report = str(exe.parent / "python"), root / "modules.json", root / "report.json"
    env = dict(os.environ, HERMES_HOME=str(root / "home"), HOME=str(root), TMPDIR=str(root))

    def hermes(argv: list[str], folder: Path) -> subprocess.Popen[bytes]:
        folder.mkdir()
        return subprocess.Popen(argv, cwd=folder, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)

    def running(proc: subprocess.Popen[bytes]) -> bool:
        """True while proc runs; once it exited, AssertionError with its stderr's end."""
        if proc.poll() is not None:
            raise AssertionError(f"the late-bound Hermes exited {proc.returncode}: "
                                 f"{(proc.stderr.read() if proc.stderr else b'').decode(errors='replace')[-3000:]}")
        return True

    def imported(proc: subprocess.Popen[bytes]) -> bool:
        return report.exists() or not running(proc)

    def bound() -> dict[str, Any] | None:
        found: dict[str, Any] = json.loads(report.read_text())
        return found if "namespace" in found else None
    recording = hermes([python, str(LATE_BOUND), "record", str(modules)], root / "recorded")
    try:
        acp_turn_until_request(model, recording, root / "recorded", "record", time.time())
        recording.send_signal(signal.SIGUSR1)
        wait_until(lambda: modules.exists() or None, 30, "the recorded modules")
    finally:
        recording.kill()
    times: dict[str, list[float]] = {"late": [], "cold": []}
    found: dict[str, Any] = {}
    for n in range(runs):
        cold = hermes([str(exe), "acp"], root / f"cold-{n}")
        try:
            times["cold"].append(acp_turn_until_request(model, cold, root / f"cold-{n}", f"cold {n}", time.time()))
        finally:
            cold.kill()
        report.unlink(missing_ok=True)
        late, folder = hermes([python, str(LATE_BOUND), "bind", str(modules), str(report)], root / f"unbound-{n}"), \
            root / f"late-{n}"
        folder.mkdir()
        try:
            wait_until(functools.partial(imported, late), 120, "its imports, done before any job is known")
            started = time.time()
            job = {"bridge": str(REPO), "folder": str(folder), "writable": [str(folder), str(root), "/dev/null"]}
            late.stdin.write((json.dumps(job) + "\n").encode())  # type: ignore[union-attr]
            late.stdin.flush()  # type: ignore[union-attr]
            times["late"].append(acp_turn_until_request(model, late, folder, f"late {n}", started))
            found = wait_until(bound, 30, "what binding found")
        finally:
            late.kill()
    return times, found
