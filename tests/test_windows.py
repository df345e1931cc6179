"""Windows only: what a Linux runner cannot show. Run by the Windows lane (tests/windows_lane.sh: the official
Windows CPython under Wine, from .ci/run) and by .github/workflows/ci.yml on windows-latest; what Wine lacks is
marked wine_lacks and named in docs/verification.md."""
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest
from test_real_hermes import write_hermes_home

from claude_hermes_bridge.config import Config, confine_cwd
from claude_hermes_bridge.drivers import usable_hermes
from claude_hermes_bridge.launch import JobRequest
from claude_hermes_bridge.processes import (
    held_in_job_object,
    hermes_creation_flags,
    supervisor_creation_flags,
)
from claude_hermes_bridge.safe_io import Refused
from claude_hermes_bridge.tools import check_launch
from conftest import require_component
from harness import REPO, WINDOWS_HERMES, wait_gone, wait_until
from scripted_model import ScriptedModel

pytestmark = pytest.mark.skipif(os.name != "nt", reason="Windows only: job objects, junctions, subst drives, batch "
                                                        "files, console windows")


def test_a_batch_file_hermes_is_refused_before_anything_starts(tmp_path):
    shim = tmp_path / "hermes.cmd"
    shim.write_text("@echo off\r\necho started > %~dp0started.txt\r\n")
    cfg = Config(path=tmp_path / "config.json", hermes_exe=str(shim), allowed_roots=[str(tmp_path)])
    request = JobRequest(kind="run", task='"&calc&"', cwd=str(tmp_path), max_turns=None, timeout_s=60,
                                skills=[], toolsets=[])
    with pytest.raises(Refused, match="cmd.exe"):
        check_launch(cfg, usable_hermes(cfg), request)
    assert not (tmp_path / "started.txt").exists()


def test_a_root_reached_in_another_case_is_the_same_folder(tmp_path):
    (tmp_path / "Work").mkdir()
    cfg = Config(path=tmp_path / "config.json", allowed_roots=[str(tmp_path / "Work")])
    assert confine_cwd(cfg, str(tmp_path / "work"))


@pytest.mark.wine_lacks("junctions: Wine 8's mklink /J and CreateJunction answer 'Request not supported'")
def test_a_junction_pointing_out_of_the_root_is_outside(tmp_path):
    (tmp_path / "root").mkdir()
    (tmp_path / "outside").mkdir()
    subprocess.run(["cmd", "/c", "mklink", "/J", str(tmp_path / "root" / "out"), str(tmp_path / "outside")],
                   check=True, capture_output=True)
    cfg = Config(path=tmp_path / "config.json", allowed_roots=[str(tmp_path / "root")])
    with pytest.raises(Refused, match="outside"):
        confine_cwd(cfg, str(tmp_path / "root" / "out"))


def test_the_job_object_stops_a_tree_whose_middle_process_exited():
    """Windows never re-parents: the grandchild of an exited child is found only through the job object."""
    sleeper = f"import time; time.sleep(120); '{uuid.uuid4().hex}'"  # this test's own: others run beside it
    code = (f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {sleeper!r}],"
            " creationflags=0x00000200); time.sleep(1)")
    sentinel = subprocess.Popen([sys.executable, "-c", sleeper])
    proc = subprocess.Popen([sys.executable, "-c", code], creationflags=hermes_creation_flags(True) or 0)
    job = held_in_job_object(proc)
    proc.wait(30)

    def sleepers() -> list[psutil.Process]:
        return [p for p in psutil.process_iter(["cmdline"]) if sleeper in " ".join(p.info["cmdline"] or [])
                and p.pid != sentinel.pid]
    assert wait_until(sleepers, 10, "the grandchild of the exited process")
    job.terminate()
    time.sleep(1)
    assert sleepers() == []
    assert sentinel.poll() is None, "an unrelated process was stopped"
    sentinel.kill()


def test_a_supervisors_own_console_host_is_never_one_of_the_jobs_processes():
    """A process with a hidden console of its own (as start_job starts a supervisor) has a conhost.exe child
    that inherits its environment, the job's marker included: the bridge must count it as its own."""
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); "  # the embeddable CPython ignores the folder
            "import json, psutil; from claude_hermes_bridge.processes import own_console_hosts, protected_pids; "
            "hosts = own_console_hosts(); "
            "print(json.dumps([hosts, sorted(protected_pids()), "
            "[psutil.Process(pid).cmdline()[0] for pid in hosts]]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=str(REPO),
                          stdin=subprocess.DEVNULL, creationflags=supervisor_creation_flags(True)[-1] or 0)
    assert done.returncode == 0, done.stderr
    hosts, protected, programs = json.loads(done.stdout)
    assert hosts and set(hosts) <= set(protected)
    assert all(program.lower().endswith("conhost.exe") for program in programs)


def free_drive_letter() -> str:
    import string

    for letter in reversed(string.ascii_uppercase[3:]):
        if not os.path.exists(f"{letter}:\\"):
            return f"{letter}:"
    pytest.fail("no free drive letter for subst")


@pytest.mark.wine_lacks("subst drives: Wine 8's subst exits 0 and makes no drive")
def test_a_root_reached_through_a_subst_drive_is_the_same_folder_and_no_more(tmp_path):
    (tmp_path / "work" / "sub").mkdir(parents=True)
    (tmp_path / "other").mkdir()
    drive = free_drive_letter()
    subprocess.run(["subst", drive, str(tmp_path)], check=True, capture_output=True)
    try:
        root_by_drive = Config(path=tmp_path / "config.json", allowed_roots=[drive + "\\work"])
        root_by_path = Config(path=tmp_path / "config.json", allowed_roots=[str(tmp_path / "work")])
        assert confine_cwd(root_by_drive, str(tmp_path / "work" / "sub"))
        assert confine_cwd(root_by_path, drive + "\\work\\sub")
        with pytest.raises(Refused, match="outside"):
            confine_cwd(root_by_drive, drive + "\\other")
    finally:
        subprocess.run(["subst", drive, "/d"], capture_output=True)


WINDOWS_TASKS = {
    "double-quotes": 'say "hi" and "bye"',
    "backslashes": "C:\\path\\with\\backslashes and \\\\server\\share",
    "trailing-backslash": "ends in a backslash \\",
    "backslash-before-quote": 'a \\" b \\\\" c',
    "cmd-metacharacters": "&|^%!<> (calc) %PATH% ^& \"&calc&\"",
}


@pytest.mark.parametrize("task", list(WINDOWS_TASKS.values()), ids=list(WINDOWS_TASKS))
def test_a_task_reaches_hermes_byte_for_byte(bridge, task):
    """Hermes is a real .exe here (harness.windows_launcher), so the task goes through CreateProcess' own
    quoting, and cmd.exe never sees it."""
    with bridge.client() as client:
        result = client.call("hermes_run", task=task, wait_s=40)
        assert result.field("STATUS") == "ok", result.text
    assert bridge.runs()[-1]["task"] == task


def visible_window_pids() -> set[int]:
    """The processes owning a visible top-level window (a console's window belongs to its conhost.exe,
    a child of the process that opened the console)."""
    import ctypes
    from ctypes import wintypes

    user32 = ctypes.WinDLL("user32", use_last_error=True)  # type: ignore[attr-defined]
    pids: set[int] = set()

    @ctypes.WINFUNCTYPE(wintypes.BOOL, wintypes.HWND, wintypes.LPARAM)  # type: ignore[attr-defined]
    def collect(hwnd: int, _: int) -> bool:
        if user32.IsWindowVisible(hwnd):
            pid = wintypes.DWORD()
            user32.GetWindowThreadProcessId(hwnd, ctypes.byref(pid))
            pids.add(pid.value)
        return True
    user32.EnumWindows(collect, 0)
    return pids


def test_no_process_of_a_job_shows_a_window_and_cancel_leaves_nothing_but_the_sentinel(bridge):
    sentinel = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        with bridge.client() as client:
            job_id = client.call("hermes_run", task="windowless !grandchild=60 !sleep=60", wait_s=0).field("JOB_ID")
            bridge.wait_record(job_id, "hermes")
            bridge.wait_for_traced(3, timeout=20)
            supervisor = psutil.Process(bridge.record(job_id).supervisor.pid)
            job_pids = {supervisor.pid} | {child.pid for child in supervisor.children(recursive=True)}
            assert len(job_pids) >= 3
            assert job_pids & visible_window_pids() == set()
            cancelled = client.call("hermes_cancel", job_id=job_id)
            if cancelled.field("STATUS") == "running":  # the call's bounded wait passed (Wine beside the suite)
                cancelled = client.wait_final(job_id)
            assert cancelled.field("STATUS") == "cancelled", cancelled.text
        assert wait_gone(bridge.traced_pids() + [supervisor.pid], timeout=20) == []
        assert sentinel.poll() is None, "an unrelated process was stopped"
    finally:
        sentinel.kill()


def test_jobs_logs_and_the_bytecode_cache_go_to_the_per_user_folders_under_localappdata(bridge):
    """With no jobs_dir or logs_dir set, a job's record and log live in %LOCALAPPDATA%\\claude-hermes-bridge,
    where a bundle update (which replaces the bundle's folder) cannot reach them."""
    for setting in ("jobs_dir", "logs_dir"):
        del bridge.settings[setting]
    bridge.configure()
    app_folder = Path(os.environ["LOCALAPPDATA"]) / "claude-hermes-bridge"
    with bridge.client() as client:
        result = client.call("hermes_run", task="per-user folders", wait_s=40)
        assert result.field("STATUS") == "ok", result.text
        job_id = result.field("JOB_ID")
        with bridge.client() as second:  # another server process finds the job in the same per-user folder
            listing = second.call("hermes_jobs").text
    log = Path(result.field("FULL_LOG"))
    try:
        assert log.is_relative_to(app_folder) and log.exists()
        record = app_folder / "jobs" / f"{job_id}.json"
        assert record.exists(), sorted(p.name for p in app_folder.rglob("*"))[:20]
        assert job_id in listing
    finally:
        for leftover in app_folder.rglob(f"{job_id}*"):
            leftover.unlink()


@pytest.mark.e2e
@pytest.mark.timeout(1200)  # a real Hermes under Wine beside the suite once took 115 s to start
def test_a_real_hermes_job_on_windows_answers_and_its_session_resumes(bridge):
    """The real Hermes 0.19.0, installed from Windows wheels (tests/windows_lane.sh), behind the bridge on the
    Windows CPython, with the scripted model on 127.0.0.1."""
    exe = require_component(WINDOWS_HERMES, "the real Hermes 0.19.0 for Windows")  # its job once ended orphaned:
    # the sweep after Hermes exited killed the supervisor's own conhost.exe (it carries the marker), and with it
    # the supervisor
    home = bridge.tmp / "real-home"
    with ScriptedModel(bridge.tmp) as model:
        write_hermes_home(home, model.base_url)
        bridge.configure(hermes_exe=str(exe), hermes_home=str(home), kill_grace_s=5, hermes_driver="cli")
        with bridge.client() as client:
            result = client.call("hermes_run", task="Say hello.", wait_s=45, timeout_s=600)
            if result.field("STATUS") == "running":
                result = client.wait_final(result.field("JOB_ID"), timeout=600)
            assert result.field("STATUS") == "ok", result.text
            assert result.field("EXIT_CODE") == "0", result.text
            assert "SCRIPTED ANSWER" in result.text
            session = result.field("SESSION_ID")
            resumed = client.call("hermes_resume", session_id=session, task="And again?", wait_s=45, timeout_s=600)
            if resumed.field("STATUS") == "running":
                resumed = client.wait_final(resumed.field("JOB_ID"), timeout=600)
            assert resumed.field("STATUS") == "ok", resumed.text
            assert resumed.field("SESSION_ID") == session
        contents = [str(m.get("content")) for m in model.requests()[-1]["messages"]]
        assert any("Say hello." in c for c in contents), "the earlier conversation was not sent on resume"


def test_the_sandbox_is_not_available_on_windows_so_required_refuses_and_auto_says_so(bridge):
    """Issue 38: no mechanism is applied on Windows; `required` refuses the job before Hermes starts, naming
    why, and `auto` runs it saying it is unconfined."""
    why = "Windows has no mechanism the bridge applies: a job object bounds Hermes' processes, not the paths they write"
    bridge.configure(sandbox="required")
    with bridge.client() as client:
        refused = client.call("hermes_run", task="sandboxed !write=made.txt:x", wait_s=30)
        if refused.field("STATUS") == "running":
            refused = client.wait_final(refused.field("JOB_ID"))
        health = client.call("hermes_health")
    assert refused.field("STATUS") == "error", refused.text
    assert refused.field("REASON") == (f"sandbox is required, and this machine cannot give one ({why}); Hermes was "
                                       "not started. Set sandbox to auto or off to run unconfined"), refused.text
    assert not (bridge.root / "made.txt").exists() and bridge.runs() == []
    assert health.field("SANDBOX") == f"not available here ({why}): every job is refused (sandbox: required)"
    bridge.configure(sandbox="auto")
    with bridge.client() as client:
        ran = client.call("hermes_run", task="unconfined !write=made.txt:x", wait_s=30)
        if ran.field("STATUS") == "running":
            ran = client.wait_final(ran.field("JOB_ID"))
    assert ran.field("STATUS") == "ok" and (bridge.root / "made.txt").read_text() == "x", ran.text
    assert ran.field("SANDBOX") == f"not available here ({why}): the job writes wherever your account can"


def acp_client(bridge: Any) -> Any:
    """A client whose fake Hermes speaks ACP (`hermes acp --check` passes only with FAKE_HERMES_ACP=1)."""
    client = bridge.client()
    client.params.env = dict(bridge.env, FAKE_HERMES_ACP="1")
    return client


def finished(client: Any, result: Any, timeout: float = 120) -> Any:
    return client.wait_final(result.field("JOB_ID"), timeout=timeout) if result.field("STATUS") == "running" else result


def ready_standby(bridge: Any, other_than: int | None = None, timeout: float = 120) -> dict[str, Any]:
    """The standby's published description once one is ready (other_than: not that standby process)."""
    path = bridge.jobs / "standby" / "ready.json"

    def published() -> dict[str, Any] | None:
        try:
            standby = json.loads(path.read_text())
        except (OSError, ValueError):  # not there yet, or being replaced
            return None
        return standby if standby["pid"] != other_than else None
    return wait_until(published, timeout, "a ready standby")


def test_acp_jobs_take_a_warm_hermes_and_a_warm_jobs_cancel_leaves_nothing(bridge):
    """Issue 39 on Windows, where Hermes' start is slowest: the next ACP job in a folder takes the Hermes a
    standby readied (held in its job object since it started), and a cancel of that job stops its tree."""
    bridge.configure(hermes_driver="acp", warm_start=True)
    sentinel = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        with acp_client(bridge) as client:
            first = finished(client, client.call("hermes_run", task="first !write=one.txt:1", wait_s=40))
            assert first.field("STATUS") == "ok", first.text
            assert first.field("START").startswith("cold (the task reached Hermes "), first.text
            standby = ready_standby(bridge)
            standby_tree = {child.pid for child in psutil.Process(standby["pid"]).children(recursive=True)}
            assert client.call("hermes_health").field("WARM_START").startswith("a warm Hermes waits for the next "
                                                                               f"ACP job in {bridge.root} ")
            second = finished(client, client.call("hermes_run", task="second !write=two.txt:2", wait_s=40))
            assert second.field("STATUS") == "ok", second.text
            assert second.field("START").startswith("warm (the task reached Hermes "), second.text
            assert (bridge.root / "two.txt").read_text() == "2"
            [run] = [r for r in bridge.runs() if r.get("task", "").startswith("second")]
            assert run["pid"] in standby_tree, "the second job did not run on the standby's Hermes"

            ready_standby(bridge, other_than=standby["pid"])
            job_id = client.call("hermes_run", task="third !tool-sleep=90", wait_s=0).field("JOB_ID")
            [tool] = wait_until(lambda: [int(p.stem) for p in bridge.trace.glob("*.child")] or None, 60,
                                "the warm job's tool process")
            [run] = [r for r in bridge.runs() if r.get("task", "").startswith("third")]
            third = bridge.record(job_id)
            assert third.start == "warm", third.start
            assert client.call("hermes_cancel", job_id=job_id).field("STATUS") == "cancelled"
        assert wait_gone([tool, run["pid"], third.hermes.pid, third.supervisor.pid], timeout=30) == []
        assert sentinel.poll() is None, "an unrelated process was stopped"
    finally:
        sentinel.kill()


@pytest.mark.e2e
@pytest.mark.timeout(1500)
def test_a_real_hermes_over_acp_answers_then_its_next_job_starts_warm_and_resumes(bridge):
    """The real Hermes 0.19.0 for Windows over ACP (the driver `auto` picks where the acp extra is installed):
    a cold job, the next one on the warm Hermes a standby readied, and that job's session loaded again."""
    exe = require_component(WINDOWS_HERMES, "the real Hermes 0.19.0 for Windows")
    home = bridge.tmp / "real-home"
    with ScriptedModel(bridge.tmp) as model:
        write_hermes_home(home, model.base_url)
        bridge.configure(hermes_exe=str(exe), hermes_home=str(home), kill_grace_s=5, hermes_driver="auto",
                         warm_start=True)
        with bridge.client() as client:
            first = finished(client, client.call("hermes_run", task="Say hello.", wait_s=45, timeout_s=600),
                             timeout=600)
            assert first.field("STATUS") == "ok", first.text
            assert bridge.record(first.field("JOB_ID")).driver == "acp", first.text
            assert first.field("START").startswith("cold ("), first.text
            ready_standby(bridge, timeout=300)
            second = finished(client, client.call("hermes_run", task="Say hello again.", wait_s=45, timeout_s=600),
                              timeout=600)
            assert second.field("STATUS") == "ok", second.text
            assert second.field("START").startswith("warm (the task reached Hermes "), second.text
            assert "SCRIPTED ANSWER" in second.text
            session = second.field("SESSION_ID")
            resumed = finished(client, client.call("hermes_resume", session_id=session, task="And again?", wait_s=45,
                                                   timeout_s=600), timeout=600)
            assert resumed.field("STATUS") == "ok", resumed.text
            assert resumed.field("SESSION_ID") == session
        chats = [str(m.get("content")) for request in model.requests() if isinstance(request.get("messages"), list)
                 for m in request["messages"]]
        assert any("Say hello again." in c for c in chats) and any("And again?" in c for c in chats)
