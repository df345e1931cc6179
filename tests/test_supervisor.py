"""The supervisor and process control: its loop against a fake process starter (what it starts, how each way of
ending is recorded), and through real jobs what a host depends on: a timeout or a cancel leaves none of the
job's processes behind, a job outlives the server that started it and any later server answers for it, a
killed server, supervisor or Hermes is reported for what it is, and only the job's own processes are ever
signalled (pid reuse, the marker copied or dropped, another jobs folder's job of the same id)."""
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from claude_hermes_bridge.config import Config, load_config
from claude_hermes_bridge.hermes_cli import describe_exit
from claude_hermes_bridge.job_watching import ResumeBackstop
from claude_hermes_bridge.jobs import FINAL_STATES, JobRecord, JobState, JobStore
from claude_hermes_bridge.launch import JobRequest, launch_job
from claude_hermes_bridge.preflight import SERVER_DIR
from claude_hermes_bridge.processes import (
    JOB_MARKER,
    Ownership,
    carries_marker,
    marked_processes,
    still_running,
    stop_tree,
)
from claude_hermes_bridge.safe_io import ProcessId, running_process
from claude_hermes_bridge.supervisor import Supervisor
from claude_hermes_bridge.tools import LaunchArguments, job_request, request_cancel
from harness import (
    Bridge,
    live_pids,
    wait_gone,
    wait_until,
)

pytestmark = pytest.mark.posix("the fake's processes are stopped with POSIX signals")

SPAWN_CHILD = ("import subprocess, sys, time; "
               "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
               "open('child.pid', 'w').write(str(child.pid)); time.sleep(60)")


class FakeStarter:
    """Stands in for starting Hermes: runs a short Python program instead, and keeps what it was given."""

    def __init__(self, program: str, log: Path):
        self.program = program
        self.log = log
        self.calls: list[dict[str, Any]] = []

    def __call__(self, argv: list[str], folder: str, stdin: Any, env: dict[str, str]) -> subprocess.Popen:
        self.calls.append({"argv": argv, "folder": folder, "stdin": stdin.read(), "env": env})
        with open(self.log, "ab") as out:
            return subprocess.Popen([sys.executable, "-c", self.program], cwd=folder, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def supervised(tmp_path: Path, program: str, task: str = "-do it", timeout_s: float = 60,
               form: str = "query-arg") -> tuple[Supervisor, FakeStarter]:
    """A job on disk as a launch leaves it, and its supervisor with the fake starter."""
    root = tmp_path / "root"
    root.mkdir()
    exe = tmp_path / "hermes"
    exe.write_text("#!/bin/sh\nexit 9\n")  # never run: the starter is the fake
    exe.chmod(0o755)
    cfg = Config(path=tmp_path / "config.json", allowed_roots=[str(root)], jobs_dir=str(tmp_path / "jobs"),
                        logs_dir=str(tmp_path / "logs"), hermes_exe=str(exe), hermes_home=str(tmp_path / "home"),
                        hermes_cli_form=form, kill_grace_s=1, sandbox="off")  # test_sandbox starts it confined
    store = JobStore(cfg.jobs_path)
    request = JobRequest(kind="run", task=task, cwd=str(root), max_turns=None, timeout_s=timeout_s,
                                skills=[], toolsets=[])
    job_id = store.claim_id(task.encode())
    store.write(request.record(job_id, str(store.log_path(job_id))))
    store.mark_active(job_id)
    starter = FakeStarter(program, store.log_path(job_id))
    return Supervisor(job_id, cfg, store, starter), starter


def test_a_job_that_exits_0_is_ok_and_the_record_says_who_ran_it(tmp_path):
    supervisor, starter = supervised(tmp_path, "print('done')")
    supervisor.run()
    record = supervisor.store.read(supervisor.job_id)
    assert record.state is JobState.OK and record.exit_code == 0 and record.ended_at
    [call] = starter.calls
    assert call["argv"][2] == "--query=-do it" and record.argv and record.argv[2] == "--query=<task>"
    assert call["folder"] == str(tmp_path / "root") and call["env"][JOB_MARKER] == supervisor.job_id
    assert record.hermes and record.supervisor and record.supervisor.pid == psutil.Process().pid
    assert supervisor.store.active_ids() == []


def test_a_task_on_stdin_reaches_hermes_byte_for_byte(tmp_path):
    task = 'quotes " \' backslash \\ trailing \\\n&|^%!<> ünïcode'
    supervisor, starter = supervised(tmp_path, "pass", task=task, form="query-file")
    supervisor.run()
    [call] = starter.calls
    assert call["stdin"] == task.encode() and call["argv"][2:4] == ["--query-file", "-"]


def test_a_failing_exit_is_an_error_that_names_the_code(tmp_path):
    supervisor, _ = supervised(tmp_path, "raise SystemExit(3)")
    supervisor.run()
    record = supervisor.store.read(supervisor.job_id)
    assert record.state is JobState.ERROR and record.exit_code == 3
    assert record.reason == describe_exit(3)


class ExitedStarter(FakeStarter):
    """A Hermes that has exited, and that the system has forgotten, before its supervisor first looks at it: what
    Windows does to an exited process at once (under load, a fast exit outruns the supervisor)."""

    def __call__(self, argv: list[str], folder: str, stdin: Any, env: dict[str, str]) -> subprocess.Popen:
        proc = super().__call__(argv, folder, stdin, env)
        proc.wait()
        return proc


def test_a_hermes_gone_before_its_supervisor_looks_still_ends_with_its_own_exit_code(tmp_path, capsys):
    supervisor, starter = supervised(tmp_path, "raise SystemExit(3)")
    supervisor.start_process = ExitedStarter(starter.program, starter.log)
    supervisor.run()
    record = supervisor.store.read(supervisor.job_id)
    assert record.state is JobState.ERROR and record.exit_code == 3, record.reason
    assert record.reason == describe_exit(3)
    assert "had exited before its supervisor first looked at it" in capsys.readouterr().err  # the job's log


CRASH_AT_EXIT = ("import os, signal, sys; print('the answer'); sys.stdout.flush(); {session}"
                 "os.kill(os.getpid(), signal.SIGSEGV)")


@pytest.mark.parametrize(("session_line", "says"), [
    (True, "on its way out, after its turn had ended and been saved"),
    (False, "before its turn was known to have ended: work may be part-done"),
])
def test_a_crash_is_told_from_a_kill_and_one_after_the_saved_turn_from_one_during_it(tmp_path, session_line, says):
    """Hermes 0.22.2 segfaults on its way out now and then, after it printed its session id: the host is told
    the turn was over (check the work, do not run it again), not that someone killed Hermes mid-task."""
    session = "print('session_id: 20261202_013955_eebde4', file=sys.stderr); sys.stderr.flush(); "
    supervisor, _ = supervised(tmp_path, CRASH_AT_EXIT.format(session=session if session_line else ""))
    supervisor.run()
    record = supervisor.store.read(supervisor.job_id)
    assert record.state is JobState.ERROR and record.exit_code == -11
    assert record.reason and record.reason.startswith("Hermes crashed (SIGSEGV, 11)") and says in record.reason
    assert "from outside the bridge" not in record.reason
    assert record.session_id == ("20261202_013955_eebde4" if session_line else None)


def test_a_cancel_before_hermes_starts_starts_nothing(tmp_path):
    supervisor, starter = supervised(tmp_path, "print('never')")
    supervisor.store.cancel_path(supervisor.job_id).write_text("now")
    supervisor.run()
    record = supervisor.store.read(supervisor.job_id)
    assert record.state is JobState.CANCELLED and starter.calls == [] and record.hermes is None
    assert not supervisor.store.cancel_path(supervisor.job_id).exists()


def child_of_fake(root: Path) -> int:
    pid_file = root / "child.pid"
    return int(wait_until(lambda: pid_file.read_text() if pid_file.exists() else None, 20, "the fake's child"))


@pytest.mark.parametrize("ending", ["cancel", "timeout"])
def test_a_cancel_or_a_timeout_stops_the_whole_tree_and_says_work_may_be_part_done(tmp_path, ending):
    supervisor, _ = supervised(tmp_path, SPAWN_CHILD, timeout_s=2 if ending == "timeout" else 60)
    root = tmp_path / "root"
    if ending == "cancel":
        def cancel_soon() -> None:
            child_of_fake(root)
            time.sleep(0.5)  # a poll or two, so the child is in the record's tree
            supervisor.store.cancel_path(supervisor.job_id).write_text("now")
        threading.Thread(target=cancel_soon, daemon=True).start()
    supervisor.run()
    record = supervisor.store.read(supervisor.job_id)
    child = child_of_fake(root)
    assert record.state is (JobState.CANCELLED if ending == "cancel" else JobState.TIMEOUT)
    assert child in {process_id.pid for process_id in record.tree}
    assert record.hermes is not None
    assert wait_gone([record.hermes.pid, child]) == [], live_pids([record.hermes.pid, child])


def announce(log: Path, text: str) -> None:
    with open(log, "ab") as out:
        out.write(text.encode())


def resumed(tmp_path: Path) -> tuple[ResumeBackstop, Path]:
    """The resume backstop of a supervised job, and the job's log."""
    supervisor, _ = supervised(tmp_path, "pass")
    log = supervisor.store.log_path(supervisor.job_id)
    return ResumeBackstop(log, supervisor.job.roots), log


def test_the_resume_backstop_reads_a_move_line_split_across_two_polls(tmp_path):
    backstop, log = resumed(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    line = f"↻ Working directory: {outside}\n"
    announce(log, line[:30])  # Hermes has written half the line when the supervisor polls
    assert backstop.moved_outside() is None
    announce(log, line[30:])
    assert backstop.moved_outside() == str(outside)


def test_the_resume_backstop_resolves_a_symlink_from_inside_a_root_to_outside(tmp_path):
    backstop, log = resumed(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    inside = tmp_path / "root" / "looks-inside"
    inside.symlink_to(outside)
    announce(log, f"↻ Working directory: {tmp_path / 'root'}\n")
    assert backstop.moved_outside() is None  # a move inside the roots is no reason to stop
    announce(log, f"↻ Working directory: {inside}\n")
    assert backstop.moved_outside() == str(inside)


def test_a_failed_resume_on_a_hermes_that_prints_no_session_line_captures_nothing(tmp_path):
    supervisor, _ = supervised(tmp_path, "import sys; sys.exit(1)", form="query-file")  # 0.21: no session line
    supervisor.record.session_requested = "20261201_100000_aaaaaa"
    supervisor.run()
    record = supervisor.store.read(supervisor.job_id)
    assert record.state is JobState.ERROR and record.exit_code == 1
    assert record.session_id is None  # the session it was asked to resume was not continued: nothing to resume


def test_a_job_that_already_has_an_outcome_when_its_supervisor_starts_never_starts_hermes(tmp_path):
    supervisor, starter = supervised(tmp_path, "print('must not run')")
    record = supervisor.store.read(supervisor.job_id)
    record.change_state(JobState.CANCELLED, "cancelled as an orphan")
    supervisor.store.write(record)
    supervisor = Supervisor(supervisor.job_id, supervisor.cfg, supervisor.store, starter)
    assert supervisor.run() == 0
    assert starter.calls == []
    assert supervisor.store.read(supervisor.job_id).state is JobState.CANCELLED


def config_of(bridge: Bridge) -> Config:
    return load_config(bridge.config)


def final_record(store: JobStore, job_id: str, timeout: float = 60) -> JobRecord:
    return wait_until(lambda: record if (record := store.read(job_id)).state in FINAL_STATES else None,
                      timeout, f"job {job_id} to end")


WAITS = "import subprocess, sys; sys.exit(subprocess.run(sys.argv[1:]).returncode)"


FORKS_ON_SIGTERM = """
import os, signal, subprocess, sys, time
def forks(*_):
    if sys.argv[1] == "detached":  # re-parented away from this process at once
        shell = ["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"]
        late = subprocess.run(shell, capture_output=True, text=True).stdout.strip()
    else:
        late = str(subprocess.Popen(["sleep", "60"]).pid)
    open(sys.argv[2], "w").write(late)
signal.signal(signal.SIGTERM, forks)
print("ready", os.getpid(), flush=True)
while True:
    time.sleep(1)
"""


STOPS_ITS_OWN_MARKER = """
import json, os, subprocess, sys, psutil
sys.path.insert(0, sys.argv[1])
from claude_hermes_bridge.processes import Ownership, stop_tree
victim = subprocess.Popen(["sleep", "60"])
ancestor = psutil.Process().parent()
owner = Ownership(os.environ["HERMES_BRIDGE_JOB"], frozenset({ancestor.pid}), require_descent=sys.argv[2] == "1")
report = stop_tree(owner, ancestor, [], grace_s=1)
print(json.dumps({"stopped": len(report.stopped), "victim": victim.wait(timeout=10)}), flush=True)
"""


def test_timeout_stops_the_whole_tree_grandchildren_included(bridge):
    with bridge.client() as client:
        job_id = client.call("hermes_run", task="hang !grandchild=120 !sleep=120", timeout_s=2,
                             wait_s=0).field("JOB_ID")
        bridge.wait_for_runs(1)
        final = client.wait_final(job_id)
        assert final.field("STATUS") == "timeout"
        assert final.field("EXIT_CODE") == "130"  # the fake exits 130 on SIGTERM, as Hermes does
        assert "timeout_s=2" in final.field("REASON")
        pids = bridge.traced_pids()
        assert len(pids) == 3  # hermes, its tool process, and that one's child
        assert wait_gone(pids) == []


def test_cancel_ends_cancelled_and_leaves_no_process(bridge):
    with bridge.client() as client:
        job_id = client.call("hermes_run", task="long !grandchild=120 !sleep=120", wait_s=0).field("JOB_ID")
        bridge.wait_for_traced(3)
        result = client.call("hermes_cancel", job_id=job_id)
        assert result.field("STATUS") == "cancelled", result.text
        assert wait_gone(bridge.traced_pids()) == []
        again = client.call("hermes_cancel", job_id=job_id)
        assert "already ended as cancelled" in again.text


def test_a_later_server_process_collects_a_job_whose_server_was_killed(bridge):
    with bridge.client() as first:
        job_id = first.call("hermes_run", task="outlive the server !sleep=3", wait_s=0).field("JOB_ID")
        bridge.wait_for_runs(1)
        os.kill(first.server_pid, signal.SIGKILL)
    with bridge.client() as second:
        final = second.wait_final(job_id)
        assert final.field("STATUS") == "ok"
        assert final.field("EXIT_CODE") == "0"
        assert "FAKE DONE: outlive the server" in final.text


def test_cancelling_an_orphan_clears_its_active_marker(bridge):
    with bridge.client() as client:
        job_id = client.call("hermes_run", task="!sleep=60", wait_s=0).field("JOB_ID")
        bridge.wait_for_runs(1)
        supervisor = bridge.wait_record(job_id, "supervisor")
        os.kill(supervisor.pid, signal.SIGKILL)
        wait_gone([supervisor.pid])
        assert client.call("hermes_status", job_id=job_id, wait_s=0).field("STATUS") == "orphaned"
        assert client.call("hermes_cancel", job_id=job_id).field("STATUS") == "cancelled"
    assert not (bridge.jobs / "active" / job_id).exists()


@pytest.mark.posix("POSIX signals")
def test_server_killed_mid_job_repeatedly_every_job_keeps_its_real_outcome(bridge):
    expected = {}
    for exit_code in (0, 4, 0, 7):
        with bridge.client() as client:
            job_id = client.call("hermes_run", task=f"survive {exit_code} !sleep=2 !exit={exit_code}",
                                 wait_s=0).field("JOB_ID")
            expected[job_id] = exit_code
            bridge.wait_record(job_id, "hermes")
            os.kill(client.server_pid, signal.SIGKILL)
    with bridge.client() as client:
        for job_id, exit_code in expected.items():
            final = client.wait_final(job_id)
            assert final.field("STATUS") == ("ok" if exit_code == 0 else "error"), final.text
            assert final.field("EXIT_CODE") == str(exit_code)


@pytest.mark.posix("POSIX signals")
def test_supervisor_killed_reports_orphaned_at_once_and_cancel_stops_the_rest(bridge):
    with bridge.client() as client:
        job_id = client.call("hermes_run", task="lose my owner !grandchild=120 !sleep=120", wait_s=0).field("JOB_ID")
        supervisor = bridge.wait_record(job_id, "supervisor")
        hermes = bridge.wait_record(job_id, "hermes")
        bridge.wait_in_tree(job_id, bridge.wait_for_traced(3))
        os.kill(supervisor.pid, signal.SIGKILL)
        wait_gone([supervisor.pid])
        status = client.call("hermes_status", job_id=job_id, wait_s=0)
        assert status.field("STATUS") == "orphaned"
        assert f"Hermes (pid {hermes.pid}) is still running" in status.field("REASON")
        assert live_pids(bridge.traced_pids())
        cancelled = client.call("hermes_cancel", job_id=job_id)
        assert cancelled.field("STATUS") == "cancelled", cancelled.text
        assert wait_gone(bridge.traced_pids()) == []


@pytest.mark.posix("POSIX signals")
def test_hermes_killed_from_outside_ends_error_naming_the_signal(bridge):
    with bridge.client() as client:
        job_id = client.call("hermes_run", task="get killed !sleep=60", wait_s=0).field("JOB_ID")
        hermes = bridge.wait_record(job_id, "hermes")
        os.kill(hermes.pid, signal.SIGKILL)
        final = client.wait_final(job_id)
        assert final.field("STATUS") == "error"
        assert final.field("EXIT_CODE") == "-9"
        assert "SIGKILL" in final.field("REASON")


@pytest.mark.posix("POSIX signals")
def test_a_tree_that_ignores_sigterm_and_forks_new_sessions_is_gone_after_timeout_and_cancel(bridge):
    with bridge.client() as client:
        timed = client.call("hermes_run", task="stubborn one !ignore-term !grandchild=300 !sleep=300",
                            timeout_s=2, wait_s=0).field("JOB_ID")
        cancelled = client.call("hermes_run", task="stubborn two !ignore-term !grandchild=300 !sleep=300",
                                wait_s=0).field("JOB_ID")
        bridge.wait_for_runs(2)
        bridge.wait_for_traced(6)
        time.sleep(0.5)
        pids = bridge.traced_pids()
        assert len(pids) == 6
        sessions = {os.getsid(pid) for pid in live_pids(pids)}
        assert len(sessions) == 6  # every process in a session of its own
        result = client.call("hermes_cancel", job_id=cancelled)
        assert result.field("STATUS") == "cancelled" and result.field("EXIT_CODE") == "-9"
        result = client.wait_final(timed)
        assert result.field("STATUS") == "timeout" and result.field("EXIT_CODE") == "-9"
        assert wait_gone(pids) == []


@pytest.mark.posix("POSIX signals")
def test_a_reused_pid_is_not_taken_for_the_jobs_supervisor(bridge):
    bridge.jobs.mkdir()
    me = psutil.Process()
    impostor = ProcessId(me.pid, me.create_time() - 3600)
    JobStore(bridge.jobs).write(JobRecord(
        id="20261101-000000-9", state=JobState.RUNNING, created_at=time.time() - 60, cwd=str(bridge.root),
        supervisor=impostor, hermes=impostor, timeout_s=60))
    with bridge.client() as client:
        status = client.call("hermes_status", job_id="20261101-000000-9", wait_s=0)
        assert status.field("STATUS") == "orphaned"
        assert "Hermes is not running" in status.field("REASON")


@pytest.mark.posix("POSIX signals")
def test_sigterm_to_the_supervisor_cancels_the_job_cleanly(bridge):
    with bridge.client() as client:
        job_id = client.call("hermes_run", task="shut down politely !grandchild=120 !sleep=120",
                             wait_s=0).field("JOB_ID")
        supervisor = bridge.wait_record(job_id, "supervisor")
        bridge.wait_in_tree(job_id, bridge.wait_for_traced(3))
        os.kill(supervisor.pid, signal.SIGTERM)
        final = client.wait_final(job_id)
        assert final.field("STATUS") == "cancelled" and final.field("EXIT_CODE") == "130"
        assert wait_gone(bridge.traced_pids()) == []


@pytest.mark.posix("POSIX signals")
def test_cancel_stops_a_tool_that_double_forked_away_from_hermes(bridge):
    """The orphan is no longer below Hermes (re-parented to init); it still carries the job's marker."""
    with bridge.client() as client:
        job_id = client.call("hermes_run", task="!double-fork !sleep=60", wait_s=0).field("JOB_ID")
        bridge.wait_for_runs(1)
        bridge.wait_for_traced(2, timeout=20)  # the run and its double-forked orphan
        orphans = [int(p.stem) for p in bridge.trace.glob("*.child")]
        assert orphans and all(psutil.Process(pid).ppid() != bridge.runs()[0]["pid"] for pid in orphans)
        client.call("hermes_cancel", job_id=job_id)
        assert client.wait_final(job_id).field("STATUS") == "cancelled"
    assert wait_gone(bridge.traced_pids()) == []


@pytest.mark.posix("FIFOs, symlinks and POSIX signals")
def test_a_cancel_stops_only_its_own_job_when_another_jobs_folder_has_the_same_id(tmp_path):
    first, second = Bridge.create(tmp_path / "first"), Bridge.create(tmp_path / "second")
    cfgs = [config_of(first), config_of(second)]
    tasks = ["keeps running !sleep=4", "is cancelled !sleep=60 !grandchild=60"]
    requests = [job_request(cfg, "run", LaunchArguments(task)).value
                for cfg, task in zip(cfgs, tasks, strict=True)]
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() + 3600))
    for cfg in cfgs:  # ids never sort before the newest on disk, so both folders claim the same next one
        JobStore(cfg.jobs_path).ensure()
        (cfg.jobs_path / f"{stamp}-1.json").write_text("{}")
    records = [launch_job(cfg, request)[0] for cfg, request in zip(cfgs, requests, strict=True)]
    assert records[0].id == records[1].id == f"{stamp}-2"
    try:
        stores = [JobStore(cfg.jobs_path) for cfg in cfgs]
        job_id = records[0].id
        wait_until(lambda: all(store.read(job_id).hermes for store in stores), 20, "both Hermes to start")
        request_cancel(cfgs[1], job_id)
        assert final_record(stores[1], job_id).state is JobState.CANCELLED
        kept = final_record(stores[0], job_id)
        assert kept.state is JobState.OK, kept.reason
    finally:
        first.kill_leftovers()
        second.kill_leftovers()


@pytest.mark.posix("FIFOs, symlinks and POSIX signals")
def test_a_tool_that_drops_the_marker_and_double_forks_is_stopped_and_the_stop_is_verified(bridge):
    with bridge.client() as client:
        job_id = client.call("hermes_run", task="!escape !sleep=60", wait_s=0).field("JOB_ID")
        runs = bridge.wait_for_runs(1)
        escaped = wait_until(lambda: [int(p.stem) for p in bridge.trace.glob("*.child")], 20, "the escaped tool")
        assert psutil.Process(escaped[0]).environ().get(JOB_MARKER) is None
        assert psutil.Process(escaped[0]).ppid() != runs[0]["pid"]
        client.call("hermes_cancel", job_id=job_id)
        final = client.wait_final(job_id)
    assert final.field("STATUS") == "cancelled", final.text
    assert "whole process tree" in final.field("REASON") and "verified gone" in final.field("REASON")
    assert wait_gone(escaped) == []


@pytest.mark.posix("FIFOs, symlinks and POSIX signals")
def test_a_process_that_only_copies_the_marker_is_never_signalled(bridge):
    with bridge.client() as client:
        job_id = client.call("hermes_run", task="!sleep=60", wait_s=0).field("JOB_ID")
        bridge.wait_for_runs(1)
        marker = bridge.record(job_id).marker
        impostor = subprocess.Popen(["sleep", "120"], env=dict(os.environ, **{JOB_MARKER: marker}),
                                    start_new_session=True)
        try:
            time.sleep(0.3)
            client.call("hermes_cancel", job_id=job_id)
            final = client.wait_final(job_id)
            assert final.field("STATUS") == "cancelled"
            assert impostor.poll() is None, "a process the bridge did not start was signalled"
            assert f"pids [{impostor.pid}] carry the job's marker but do not descend from the job" in final.text
        finally:
            impostor.kill()
            impostor.wait()


@pytest.mark.posix("FIFOs, symlinks and POSIX signals")
def test_many_concurrent_cancels_all_answer(bridge):
    with bridge.client() as client:
        job_id = client.call("hermes_run", task="!sleep=60", wait_s=0).field("JOB_ID")
        bridge.wait_for_runs(1)
        cfg = config_of(bridge)
        answers: list[str] = []

        def cancel() -> None:
            try:
                answers.append(request_cancel(cfg, job_id)[1])
            except Exception as exc:  # noqa: BLE001
                answers.append(f"raised {exc!r}")
        threads = [threading.Thread(target=cancel) for _ in range(40)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert [a for a in answers if a.startswith("raised")] == []
        assert client.wait_final(job_id).field("STATUS") == "cancelled"


def test_liveness_needs_pid_and_start_time():
    me = psutil.Process()
    assert ProcessId.of(me).process() is not None
    assert ProcessId(me.pid, me.create_time() - 100).process() is None  # a reused pid
    assert ProcessId(2**22 + 7, 1.0).process() is None
    assert running_process(None) is None


@pytest.mark.posix("POSIX signals, sh and env")
@pytest.mark.parametrize(("fork", "require_descent"), [("child", True), ("detached", False)],
                         ids=["a-child-found-by-descent", "a-detached-process-found-by-its-marker"])
def test_a_process_forked_during_a_stop_is_caught_by_a_later_sweep(tmp_path, fork, require_descent):
    """Hermes (the root, below a supervisor) answers the polite stop by starting one more process, after the
    first snapshot was taken."""
    marker = "20261130-000000-1:" + secrets.token_hex(16)  # unique: the sweep looks at every process
    late_pid = tmp_path / "late.pid"
    hermes = ["env", f"HERMES_BRIDGE_JOB={marker}", sys.executable, "-c", FORKS_ON_SIGTERM, fork, str(late_pid)]
    supervisor = subprocess.Popen([sys.executable, "-c", WAITS, *hermes], stdout=subprocess.PIPE, text=True)
    started: list[int] = []
    try:
        assert supervisor.stdout is not None
        ready, root = supervisor.stdout.readline().split()
        started.append(int(root))
        assert ready == "ready"
        owner = Ownership(marker, frozenset({supervisor.pid}), require_descent=require_descent)
        report = stop_tree(owner, psutil.Process(int(root)), [], grace_s=2)
        started.append(late := int(late_pid.read_text()))
        assert report.survivors == [] and len(report.stopped) == 2, report
        with contextlib.suppress(psutil.NoSuchProcess):
            assert still_running([psutil.Process(late)], 5) == []
    finally:
        supervisor.kill()
        supervisor.wait()
        for pid in started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.posix("POSIX signals")
@pytest.mark.parametrize("require_descent", [True, False], ids=["by-descent", "by-marker"])
def test_a_protected_process_carrying_the_marker_is_never_signalled_by_a_stop(require_descent):
    """The stopping process and its ancestor both carry the job's marker, and a record names the ancestor
    as the job's root: only the marked child below is stopped; the stopper and the ancestor live on."""
    marker = "20261130-000000-1:" + secrets.token_hex(16)
    stopper = [sys.executable, "-c", STOPS_ITS_OWN_MARKER, str(SERVER_DIR), "1" if require_descent else "0"]
    ancestor = subprocess.run([sys.executable, "-c", WAITS, *stopper], capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, HERMES_BRIDGE_JOB=marker))
    assert ancestor.returncode == 0, ancestor.stderr
    assert json.loads(ancestor.stdout) == {"stopped": 1, "victim": -signal.SIGKILL}


def test_where_the_marker_is_the_proof_a_stop_never_signals_another_folders_job_of_the_same_id():
    """No subreaper (macOS, Windows): the marker alone proves ownership, so it holds the nonce, and a job of
    the same id in another jobs folder (another install, another test run) carries another marker."""
    job_id = "20261201-000000-1"
    mine, theirs = f"{job_id}:{'a' * 32}", f"{job_id}:{'b' * 32}"
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    ours = subprocess.Popen(sleeper, env={**os.environ, JOB_MARKER: mine}, start_new_session=True)
    other = subprocess.Popen(sleeper, env={**os.environ, JOB_MARKER: theirs}, start_new_session=True)
    try:
        wait_until(lambda: carries_marker(psutil.Process(other.pid), theirs), 10, "the other's marker")
        owner = Ownership(mine, require_descent=False)
        seen = [ProcessId.of(psutil.Process(pid)) for pid in (ours.pid, other.pid)]
        assert {proc.pid for proc in marked_processes(mine)} == {ours.pid}
        stop_tree(owner, None, seen, 1)
        assert wait_gone([ours.pid]) == [] and live_pids([other.pid]) == [other.pid]
    finally:
        for proc in (ours, other):
            proc.kill()
            proc.wait()
