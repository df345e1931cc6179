"""The platform decisions, as pure functions called with the other platform's inputs, so Linux CI checks the
Windows and macOS branches that only real runners can execute (.github/workflows/ci.yml runs those)."""
import os
import subprocess
import sys
import time

import psutil
import pytest

from claude_hermes_bridge.config import Config, audit, path_advice
from claude_hermes_bridge.hermes_cli import argv_problem, executable_problem
from claude_hermes_bridge.jobs import JobRecord, JobState, JobStore
from claude_hermes_bridge.preflight import SERVER_DIR
from claude_hermes_bridge.processes import (
    CREATE_BREAKAWAY_FROM_JOB,
    CREATE_NEW_PROCESS_GROUP,
    CREATE_NO_WINDOW,
    CREATE_SUSPENDED,
    Ownership,
    hermes_creation_flags,
    popen_kwargs,
    stop_tree,
    supervisor_creation_flags,
)
from claude_hermes_bridge.safe_io import create_time_tolerance, within_root
from harness import SERVER, raw_exchange

DETACHED_PROCESS = 0x00000008


def test_supervisor_flags_hide_its_console_without_detaching_and_try_breakaway_first():
    first, fallback = supervisor_creation_flags(windows=True)
    assert first is not None and fallback is not None
    for flags in (first, fallback):
        assert flags & CREATE_NO_WINDOW and flags & CREATE_NEW_PROCESS_GROUP
        assert not flags & DETACHED_PROCESS  # it would make CREATE_NO_WINDOW a no-op: a visible console per job
    assert first & CREATE_BREAKAWAY_FROM_JOB and not fallback & CREATE_BREAKAWAY_FROM_JOB
    assert supervisor_creation_flags(windows=False) == [None]
    assert popen_kwargs(None) == {"start_new_session": True}


def test_hermes_shares_the_supervisors_console_in_its_own_group_and_starts_suspended_for_its_job_object():
    flags = hermes_creation_flags(windows=True)
    assert flags is not None
    assert flags & CREATE_NEW_PROCESS_GROUP and flags & CREATE_SUSPENDED
    assert not flags & CREATE_NO_WINDOW and not flags & DETACHED_PROCESS
    assert hermes_creation_flags(windows=False) is None


@pytest.mark.parametrize(("platform", "tolerance"), [("linux", 0.5), ("win32", 0.001), ("darwin", 0.001)])
def test_create_time_tolerance_is_tight_where_times_are_exact(platform, tolerance):
    assert create_time_tolerance(platform) == tolerance


@pytest.mark.posix("uses the sleep command")
def test_a_stop_that_cannot_be_sent_does_not_wait_the_grace_period(monkeypatch):
    child = subprocess.Popen(["sleep", "60"], env=dict(os.environ, HERMES_BRIDGE_JOB="20261130-000000-1"))
    try:
        time.sleep(0.2)
        monkeypatch.setattr("claude_hermes_bridge.processes.interrupt", lambda _proc: False)
        started = time.monotonic()
        # anchored on the child, not on this worker, whose other children belong to other tests
        owner = Ownership("20261130-000000-1", frozenset({child.pid}))
        report = stop_tree(owner, psutil.Process(child.pid), [], grace_s=60)
        assert report.survivors == [] and time.monotonic() - started < 30
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize(("task", "fits"), [
    ("plain words " * 2000, True),
    ("\\" * 20000 + '"', False),          # backslashes before a quote are doubled, the quote escaped
    ('say "hi" ' * 3000, False),           # 27,000 characters, over 32,767 once every quote is escaped
    ("a trailing backslash\\", True),
], ids=["plain", "backslashes-before-quote", "many-quotes", "trailing-backslash"])
def test_windows_length_is_checked_on_the_quoted_command_line(task, fits):
    argv = ["C:\\hermes\\hermes.exe", "chat", "--query=" + task, "-Q"]
    assert (argv_problem(argv, windows=True) is None) == fits
    assert argv_problem(argv, windows=False) is None  # one argument well under 128 KiB


def test_posix_length_is_checked_per_argument():
    assert "allows 131071" in str(argv_problem(["hermes", "--query=" + "x" * 200_000], windows=False))


@pytest.mark.parametrize("exe", ["C:\\tools\\hermes.cmd", "C:\\tools\\HERMES.BAT"])
def test_a_batch_hermes_is_refused_on_windows(exe):
    problem = str(executable_problem(exe, windows=True))
    assert "cmd.exe" in problem and "hermes_exe" in problem
    assert executable_problem("C:\\venv\\Scripts\\hermes.exe", windows=True) is None
    assert executable_problem(exe, windows=False) is None


def case_insensitive_identity(path):
    """What stat() says on a case-insensitive volume: both spellings are the same folder."""
    return (1, hash(path.lower()))


@pytest.mark.parametrize(("path", "inside"), [
    ("/Users/me/work", True), ("/Users/me/WORK/site", True), ("/Users/me/Work2", False),
    ("/Users/me/other", False), ("/Users/ME/work/x", True),
])
def test_case_insensitive_volumes_compare_folders_by_identity(path, inside):
    root = "/Users/me/Work"
    assert within_root(path, root, folds_case=True, identity=case_insensitive_identity) == inside
    assert not within_root("/Users/me/work", root, folds_case=False, identity=case_insensitive_identity)


def test_identity_never_widens_a_case_sensitive_comparison(tmp_path):
    (tmp_path / "work").mkdir()
    (tmp_path / "work2").mkdir()
    assert not within_root(str(tmp_path / "work2"), str(tmp_path / "work"), folds_case=True)
    assert within_root(str(tmp_path / "work" / "x"), str(tmp_path / "work"), folds_case=True)


def test_macos_path_advice_names_what_launchds_path_lacks():
    advice = str(path_advice("/usr/bin:/bin:/usr/sbin:/sbin", "darwin", "/Users/me"))
    assert "/Users/me/.local/bin, /opt/homebrew/bin, /usr/local/bin" in advice and "hermes_exe" in advice
    full = "/Users/me/.local/bin:/opt/homebrew/bin:/usr/local/bin:/usr/bin:/bin"
    assert path_advice(full, "darwin", "/Users/me") is None
    assert path_advice("/usr/bin:/bin", "linux", "/home/me") is None


def test_an_audit_failure_never_prints_and_never_raises(tmp_path, capfd):
    blocker = tmp_path / "logs"
    blocker.write_text("a file where the logs folder should be")
    cfg = Config(path=tmp_path / "config.json", logs_dir=str(blocker))
    audit(cfg, event="tool", tool="x")
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == ""


def test_audit_rotates_without_losing_lines_while_several_processes_write(tmp_path):
    cfg_path = tmp_path / "config.json"
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import pathlib\n"
            "from claude_hermes_bridge.config import Config, audit\n"
            "cfg = Config(path=pathlib.Path(sys.argv[2]), logs_dir=sys.argv[3], audit_max_bytes=10000)\n"
            "[audit(cfg, event='tool', n=i, who=sys.argv[4]) for i in range(300)]\n")
    writers = [subprocess.Popen([sys.executable, "-c", code, str(SERVER_DIR), str(cfg_path),
                                 str(tmp_path / "logs"), str(n)]) for n in range(3)]
    assert [w.wait(120) for w in writers] == [0, 0, 0]
    files = sorted((tmp_path / "logs").glob("audit.log*"))
    assert [f.name for f in files] == ["audit.log", "audit.log.1", "audit.log.2", "audit.log.3", "audit.log.lock"]
    assert all(f.stat().st_size <= 10000 for f in files)


def test_pruning_removes_the_record_last(tmp_path):
    store = JobStore(tmp_path)
    store.ensure()
    store.write(JobRecord(id="20261101-000000-1", state=JobState.OK))
    store.log_path("20261101-000000-1").mkdir()  # a log that cannot be removed (held open, on Windows)
    with pytest.raises(OSError, match="20261101-000000-1"):
        store.remove("20261101-000000-1")
    assert store.record_path("20261101-000000-1").exists()  # still listed, pruned on a later launch


@pytest.mark.posix("closes fd 2 with the shell")
def test_a_server_started_without_a_stderr_opens_the_null_device_and_serves(bridge):
    """A Windows GUI host can start a server with no valid fd 2; the stdio guard points it at the null
    device before it moves stdout there, so the server serves instead of dying at its first line."""
    command = ["/bin/sh", "-c", 'exec "$0" "$1" 2>&-', sys.executable, str(SERVER)]
    [reply] = raw_exchange(bridge.env, ['{"name":"hermes_health","arguments":{}}'], command=command)
    assert "BRIDGE: claude-hermes-bridge" in reply["result"]["content"][0]["text"]
