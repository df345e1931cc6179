"""The supervisor's loop against a fake process starter, in this process: what it starts, how each way of
ending is recorded, and that a cancel or a timeout leaves none of the job's processes behind."""
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import server
from harness import live_pids, wait_gone, wait_until

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
               form: str = "query-arg") -> tuple[server.Supervisor, FakeStarter]:
    """A job on disk as a launch leaves it, and its supervisor with the fake starter."""
    root = tmp_path / "root"
    root.mkdir()
    exe = tmp_path / "hermes"
    exe.write_text("#!/bin/sh\nexit 9\n")  # never run: the starter is the fake
    exe.chmod(0o755)
    cfg = server.Config(path=tmp_path / "config.json", allowed_roots=[str(root)], jobs_dir=str(tmp_path / "jobs"),
                        logs_dir=str(tmp_path / "logs"), hermes_exe=str(exe), hermes_home=str(tmp_path / "home"),
                        hermes_cli_form=form, kill_grace_s=1)
    store = server.JobStore(cfg.jobs_path)
    request = server.JobRequest(kind="run", task=task, cwd=str(root), max_turns=None, timeout_s=timeout_s,
                                skills=[], toolsets=[])
    job_id = store.claim_id(task.encode())
    store.write(request.record(job_id, str(store.log_path(job_id))))
    store.mark_active(job_id)
    starter = FakeStarter(program, store.log_path(job_id))
    return server.Supervisor(job_id, cfg, store, starter), starter


def test_a_job_that_exits_0_is_ok_and_the_record_says_who_ran_it(tmp_path):
    supervisor, starter = supervised(tmp_path, "print('done')")
    supervisor.run()
    record = supervisor.store.read(supervisor.job_id)
    assert record.state is server.JobState.OK and record.exit_code == 0 and record.ended_at
    [call] = starter.calls
    assert call["argv"][2] == "--query=-do it" and record.argv and record.argv[2] == "--query=<task>"
    assert call["folder"] == str(tmp_path / "root") and call["env"][server.JOB_MARKER] == supervisor.job_id
    assert record.hermes and record.supervisor and record.supervisor.pid == server.psutil.Process().pid
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
    assert record.state is server.JobState.ERROR and record.exit_code == 3
    assert record.reason == server.describe_exit(3)


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
    assert record.state is server.JobState.ERROR and record.exit_code == -11
    assert record.reason and record.reason.startswith("Hermes crashed (SIGSEGV, 11)") and says in record.reason
    assert "from outside the bridge" not in record.reason
    assert record.session_id == ("20261202_013955_eebde4" if session_line else None)


def test_a_cancel_before_hermes_starts_starts_nothing(tmp_path):
    supervisor, starter = supervised(tmp_path, "print('never')")
    supervisor.store.cancel_path(supervisor.job_id).write_text("now")
    supervisor.run()
    record = supervisor.store.read(supervisor.job_id)
    assert record.state is server.JobState.CANCELLED and starter.calls == [] and record.hermes is None
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
    assert record.state is (server.JobState.CANCELLED if ending == "cancel" else server.JobState.TIMEOUT)
    assert child in {process_id.pid for process_id in record.tree}
    assert record.hermes is not None
    assert wait_gone([record.hermes.pid, child]) == [], live_pids([record.hermes.pid, child])


def announce(log: Path, text: str) -> None:
    with open(log, "ab") as out:
        out.write(text.encode())


def resumed(tmp_path: Path) -> server.Supervisor:
    supervisor, _ = supervised(tmp_path, "pass")
    supervisor.record.session_requested = "20261201_100000_aaaaaa"  # the backstop watches resumes only
    return supervisor


def test_the_resume_backstop_reads_a_move_line_split_across_two_polls(tmp_path):
    supervisor = resumed(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    log = supervisor.store.log_path(supervisor.job_id)
    line = f"↻ Working directory: {outside}\n"
    announce(log, line[:30])  # Hermes has written half the line when the supervisor polls
    assert supervisor._moved_outside_roots() is None
    announce(log, line[30:])
    assert supervisor._moved_outside_roots() == str(outside)


def test_the_resume_backstop_resolves_a_symlink_from_inside_a_root_to_outside(tmp_path):
    supervisor = resumed(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    inside = tmp_path / "root" / "looks-inside"
    inside.symlink_to(outside)
    log = supervisor.store.log_path(supervisor.job_id)
    announce(log, f"↻ Working directory: {tmp_path / 'root'}\n")
    assert supervisor._moved_outside_roots() is None  # a move inside the roots is no reason to stop
    announce(log, f"↻ Working directory: {inside}\n")
    assert supervisor._moved_outside_roots() == str(inside)


def test_a_failed_resume_on_a_hermes_that_prints_no_session_line_captures_nothing(tmp_path):
    supervisor, _ = supervised(tmp_path, "import sys; sys.exit(1)", form="query-file")  # 0.21: no session line
    supervisor.record.session_requested = "20261201_100000_aaaaaa"
    supervisor.run()
    record = supervisor.store.read(supervisor.job_id)
    assert record.state is server.JobState.ERROR and record.exit_code == 1
    assert record.session_id is None  # the session it was asked to resume was not continued: nothing to resume


def test_a_job_that_already_has_an_outcome_when_its_supervisor_starts_never_starts_hermes(tmp_path):
    supervisor, starter = supervised(tmp_path, "print('must not run')")
    record = supervisor.store.read(supervisor.job_id)
    record.change_state(server.JobState.CANCELLED, "cancelled as an orphan")
    supervisor.store.write(record)
    supervisor.record = supervisor.store.read(supervisor.job_id)
    assert supervisor.run() == 0
    assert starter.calls == []
    assert supervisor.store.read(supervisor.job_id).state is server.JobState.CANCELLED
