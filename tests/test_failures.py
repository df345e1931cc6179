"""The machine fails under a job (issue 27): a full disk and a read-only jobs folder (a small tmpfs and a
read-only bind mount: these need root, and skip with the reason elsewhere), a step of the wall clock (an
offset inside the bridge's own processes, as a real step looks to them: time.time and the boot time psutil
reads move together), processes killed or frozen at every point; and the smaller promises of the same issue:
an orphan's recorded tools stopped, tools Hermes leaves behind swept, orphans pruned, exit 2 worded from the
log."""
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from claude_hermes_bridge.config import START_GRACE_S, Config, load_config
from claude_hermes_bridge.folder_changes import FolderWatch
from claude_hermes_bridge.job_watching import Heartbeat
from claude_hermes_bridge.jobs import HEARTBEAT_S, JobRecord, JobState, JobStore, observe
from claude_hermes_bridge.launch import prune_jobs
from claude_hermes_bridge.safe_io import ProcessId
from claude_hermes_bridge.supervised_job import SupervisedJob
from claude_hermes_bridge.supervisor import Supervisor
from harness import IN_CI, Bridge, BridgeClient, refused, wait_gone, wait_until

pytestmark = pytest.mark.posix("mounts, POSIX signals and the fake hermes as a shell script")


# ------------------------------------------------------------------ helpers: a disk that refuses, a clock that steps
def mount_or_skip(*command: str) -> None:
    """Run a mount command; where it cannot run (not root, no mount), skip with the reason, as CI=true does not
    excuse: there the tests run as root."""
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        message = f"cannot `{' '.join(command)}` here ({done.stderr.strip() or done.returncode}): needs root"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture
def small_disk(bridge: Bridge) -> Iterator[Path]:
    """The bridge's jobs folder on a tmpfs of its own (8 MiB), unmounted afterwards."""
    bridge.jobs.mkdir()
    mount_or_skip("mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(bridge.jobs))
    try:
        yield bridge.jobs
    finally:
        bridge.kill_leftovers()
        subprocess.run(["umount", "-l", str(bridge.jobs)], check=False)


def fill(folder: Path) -> Path:
    """Fill folder's disk to the last byte; the filler, to remove to give the space back."""
    filler = folder / f"filler-{uuid.uuid4().hex}"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        for size in (65536, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)
    return filler


class ReadOnly:
    """The jobs folder made read-only for new opens by a read-only bind mount over it (files already open
    for writing stay writable, as on a real remount), until lifted."""

    def __init__(self, folder: Path):
        self.folder = folder
        mount_or_skip("mount", "--bind", str(folder), str(folder))
        self.on = True
        mount_or_skip("mount", "-o", "remount,bind,ro", str(folder))

    def lift(self) -> None:
        if self.on:
            subprocess.run(["umount", "-l", str(self.folder)], check=False)
            self.on = False


CLOCK = """
import os, sys, time
_path = os.environ.get("BRIDGE_TEST_CLOCK")
_bridge = "--supervise" in sys.orig_argv or any(arg.endswith("server.py") for arg in sys.orig_argv)
if _path and _bridge:
    _real_time, _real_time_ns = time.time, time.time_ns
    def _offset():
        try:
            with open(_path) as handle:
                return float(handle.read() or 0)
        except (OSError, ValueError):
            return 0.0
    time.time = lambda: _real_time() + _offset()
    time.time_ns = lambda: _real_time_ns() + int(_offset() * 1e9)
    try:
        import psutil._pslinux as _linux
        _real_boot = _linux.boot_time
        _linux.boot_time = lambda: _real_boot() + _offset()
    except ImportError:
        pass
if os.environ.get("BRIDGE_TEST_SUPERVISOR_DIES") and "--supervise" in sys.orig_argv:
    os._exit(3)
"""


@pytest.fixture
def stepped(bridge: Bridge, tmp_path: Path) -> tuple[Bridge, Path]:
    """The bridge's processes (server, supervisors) see the wall clock plus the offset in the returned file."""
    folder = tmp_path / "clock-site"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(CLOCK)
    offset = tmp_path / "clock-offset"
    offset.write_text("0")
    bridge.extra_env = {"PYTHONPATH": str(folder), "BRIDGE_TEST_CLOCK": str(offset)}
    return bridge, offset


def client_with(bridge: Bridge, **env: str) -> BridgeClient:
    client = bridge.client()
    client.params.env = dict(bridge.env, **env)
    return client


def status(client: BridgeClient, job_id: str, wait_s: float = 0) -> str:
    return client.call("hermes_status", job_id=job_id, wait_s=wait_s).text


def field(text: str, name: str) -> str:
    return next((line[len(name) + 2:] for line in text.splitlines() if line.startswith(name + ": ")), "")


def hermes_pid(bridge: Bridge, job_id: str) -> int:
    return bridge.wait_record(job_id, "hermes").pid


# ------------------------------------------------------------------ 6. a full disk, a read-only folder
def test_a_full_disk_when_the_job_ends_keeps_the_outcome_until_space_comes_back(small_disk, bridge):
    bridge.configure(approvals="yolo")  # no managed policy in the jobs folder, whose removal would free the space
    with client_with(bridge) as client:
        job_id = client.call("hermes_run", task="work !sleep=3", wait_s=0).field("JOB_ID")
        pid = hermes_pid(bridge, job_id)
        filler = fill(small_disk)
        assert wait_gone([pid], 20) == []
        waiting = wait_until(lambda: t if "waits for the disk" in (t := status(client, job_id)) else None, 20,
                             "the block to say the outcome waits for the disk")
        assert field(waiting, "STATUS") == "running" and "is full" in field(waiting, "CONDITION"), waiting
        assert "orphaned" not in waiting
        assert "NOT writable" in client.call("hermes_health").field("JOBS_DIR")
        time.sleep(12)  # longer than the old 10 s of retries
        assert field(status(client, job_id), "STATUS") == "running"
        filler.unlink()
        final = client.wait_final(job_id, timeout=30)
    # the fake's own output failed on the full disk too (exit 1): the outcome is Hermes' real one, kept
    assert final.field("STATUS") in ("ok", "error") and final.field("EXIT_CODE") != "none", final.text
    assert "the jobs folder refused writes until then" in final.field("OUTCOME_NOTE")
    assert "No space left on device" in final.field("OUTCOME_NOTE")


def test_a_record_write_the_disk_refused_is_tried_again_at_the_next_poll_not_the_next_heartbeat(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once space returns, the record catches up within a poll (0.1 s), not a heartbeat (5 s) later."""
    store = JobStore(tmp_path / "jobs")
    store.ensure()
    store.write(JobRecord(id="20261205-000000-1", state=JobState.RUNNING))
    job = SupervisedJob("20261205-000000-1", Config(path=tmp_path / "config.json"), store)
    heartbeat = Heartbeat(job, FolderWatch(str(tmp_path), [], 100, 5))
    written = store.write

    def refused(_: JobRecord) -> None:
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(store, "write", refused)
    heartbeat.stamp(100.0)
    assert job.unsaved and job.record.heartbeat and store.read(job.job_id).heartbeat is None
    monkeypatch.setattr(store, "write", written)
    heartbeat.stamp(100.0 + HEARTBEAT_S / 50)
    assert not job.unsaved and store.read(job.job_id).heartbeat == job.record.heartbeat


def test_a_full_disk_refuses_a_launch_clearly_and_leaves_no_claimed_file(small_disk, bridge):
    with client_with(bridge) as client:
        client.call("hermes_health")
        filler = fill(small_disk)
        before = set(os.listdir(small_disk)) | {"launch.lock"}  # the lock file is the folder's, not a job's
        result = client.call("hermes_run", task="never starts", wait_s=0)
        health = client.call("hermes_health")
    reason = refused(result, "No space left on device")
    assert "internal error" not in reason
    assert set(os.listdir(small_disk)) | {"launch.lock"} == before, "files claimed for the failed launch were left"
    assert "is full" in health.field("JOBS_DIR")
    assert bridge.runs() == []
    filler.unlink()


def test_a_read_only_jobs_folder_for_twenty_seconds_keeps_the_outcome_and_refuses_launch_and_cancel(bridge):
    with client_with(bridge) as client:
        job_id = client.call("hermes_run", task="work !sleep=4", wait_s=0).field("JOB_ID")
        pid = hermes_pid(bridge, job_id)
        read_only = ReadOnly(bridge.jobs)
        try:
            launch = client.call("hermes_run", task="another", wait_s=0)
            cancel = client.call("hermes_cancel", job_id=job_id)
            assert wait_gone([pid], 20) == []
            waiting = wait_until(lambda: t if "waits for the disk" in (t := status(client, job_id)) else None, 20,
                                 "the block to say the outcome waits for the disk")
            time.sleep(max(0.0, 20 - 6))
            assert field(status(client, job_id), "STATUS") == "running"
        finally:
            read_only.lift()
        final = client.wait_final(job_id, timeout=30)
    assert "read-only" in field(waiting, "CONDITION"), waiting
    for answer in (launch, cancel):
        assert answer.is_error and "refuses writes" in answer.text and "internal error" not in answer.text, answer
    assert final.field("STATUS") == "ok", final.text
    assert "Read-only file system" in final.field("OUTCOME_NOTE")


def test_a_supervisor_whose_first_write_is_refused_starts_nothing_and_writes_its_outcome_later(bridge, monkeypatch):
    cfg = load_config(bridge.config)
    store = JobStore.of(cfg)
    store.ensure()
    job_id = store.claim_id(b"never runs")
    store.write(JobRecord(id=job_id, cwd=str(bridge.root), created_at=time.time(), timeout_s=60))
    real_write = JobStore.write
    refusals = [OSError(28, "No space left on device", str(store.record_path(job_id)))] * 3

    def full_then_fine(self: JobStore, record: JobRecord) -> bool:
        if refusals:
            raise refusals.pop()
        return real_write(self, record)
    monkeypatch.setattr(JobStore, "write", full_then_fine)
    monkeypatch.setattr("claude_hermes_bridge.job_finishing.OUTCOME_RETRY_MAX_WAIT_S", 0.2)
    Supervisor(job_id, cfg, store).run()
    final = store.read(job_id)
    assert final.state is JobState.ERROR and "Hermes was not started" in (final.reason or "")
    assert "No space left on device" in (final.outcome_note or "")
    assert bridge.runs() == [] and final.hermes is None


# ------------------------------------------------------------------ 7. a clock step
def test_a_clock_step_leaves_live_jobs_running_and_a_cancel_never_overwrites_a_real_outcome(stepped):
    bridge, offset = stepped
    bridge.configure(max_running_jobs=1)
    with client_with(bridge) as client:
        job_id = client.call("hermes_run", task="work !sleep=15", wait_s=0).field("JOB_ID")
        hermes_pid(bridge, job_id)
        for step in ("2", "-3600", "7200"):
            offset.write_text(step)
            block = status(client, job_id)
            assert field(block, "STATUS") == "running", block
            assert 0 <= int(field(block, "ELAPSED_S")) < 60, block
        second = client.call("hermes_run", task="a second job", wait_s=0)  # stepped clock: queued, in order
        assert second.field("STATUS") == "queued", second.text
        final = client.wait_final(job_id, timeout=40)
        after = client.wait_final(second.field("JOB_ID"), timeout=40)
    assert final.field("STATUS") == "ok" and after.field("STATUS") == "ok", (final.text, after.text)
    assert len(bridge.runs()) == 2


def test_a_clock_step_neither_ends_a_job_early_nor_lets_one_run_past_its_timeout(stepped):
    bridge, offset = stepped
    with client_with(bridge) as client:
        short = client.call("hermes_run", task="short !sleep=120", timeout_s=8, wait_s=0).field("JOB_ID")
        long = client.call("hermes_run", task="long !sleep=120", timeout_s=600, wait_s=0).field("JOB_ID")
        hermes_pid(bridge, short)
        hermes_pid(bridge, long)
        started = time.monotonic()
        offset.write_text("-3600")
        time.sleep(2)
        offset.write_text("3600")
        time.sleep(3)
        assert field(status(client, long), "STATUS") == "running"
        final = client.wait_final(short, timeout=30)
        took = time.monotonic() - started
        client.call("hermes_cancel", job_id=long)
    assert final.field("STATUS") == "timeout", final.text
    assert 5 < took < 20


def test_ids_stay_unique_and_newest_first_across_a_step_back(tmp_path, monkeypatch):
    store = JobStore(tmp_path / "jobs")

    def launch(task: bytes) -> str:  # as start_job does: the id claimed, then its record written
        job_id = store.claim_id(task)
        store.write(JobRecord(id=job_id, created_at=time.time()))
        return job_id
    first = launch(b"before the step")
    real_time, real_strftime = time.time, time.strftime
    monkeypatch.setattr(time, "time", lambda: real_time() - 3600)  # the wall clock steps back an hour
    monkeypatch.setattr(time, "strftime", lambda form, moment=None: real_strftime(
        form, time.localtime(time.time()) if moment is None else moment))
    second = launch(b"after the step")
    third = launch(b"after the step, again")
    assert len({first, second, third}) == 3
    assert store.list_ids() == [first, second, third]


def test_a_supervisor_that_dies_before_its_first_write_is_seen_gone_at_once_and_frees_its_slot(stepped):
    bridge, _ = stepped
    bridge.configure(max_running_jobs=1)
    with client_with(bridge, BRIDGE_TEST_SUPERVISOR_DIES="1") as client:
        started = time.monotonic()
        job_id = client.call("hermes_run", task="never supervised", wait_s=0).field("JOB_ID")
        orphaned = wait_until(lambda: t if field(t := status(client, job_id), "STATUS") == "orphaned" else None, 20,
                              "the job to read orphaned")
        took = time.monotonic() - started
    assert took < START_GRACE_S / 3, took
    assert "supervisor is gone" in field(orphaned, "REASON")
    with client_with(bridge) as client:
        second = client.call("hermes_run", task="the slot is free !sleep=0", wait_s=30)
    assert second.field("STATUS") == "ok", second.text


# ------------------------------------------------------------------ 8. processes: orphans, sweeps, frozen supervisors
def test_cancelling_an_orphan_whose_hermes_is_gone_stops_its_recorded_tools(bridge):
    with client_with(bridge) as client:
        job_id = client.call("hermes_run", task="tools !grandchild=120 !sleep=120", wait_s=0).field("JOB_ID")
        pids = bridge.wait_for_traced(3)
        bridge.wait_in_tree(job_id, pids)
        record = bridge.record(job_id)
        os.kill(record.supervisor.pid, signal.SIGKILL)  # type: ignore[union-attr]
        os.kill(record.hermes.pid, signal.SIGKILL)  # type: ignore[union-attr]
        tools = [pid for pid in pids if pid != record.hermes.pid]  # type: ignore[union-attr]
        assert wait_gone([record.hermes.pid], 10) == [] and len(tools) == 2  # type: ignore[union-attr]
        orphaned = wait_until(lambda: t if field(t := status(client, job_id), "STATUS") == "orphaned" else None, 10,
                              "orphaned")
        assert "Hermes is not running" in field(orphaned, "REASON")
        cancelled = client.call("hermes_cancel", job_id=job_id)
    assert wait_gone(tools) == [], "the orphan's recorded tools are still running"
    reason = cancelled.field("REASON")
    assert cancelled.field("STATUS") == "cancelled" and "2 processes" in reason, cancelled.text
    assert "no process" not in reason


def test_tools_hermes_leaves_running_are_stopped_when_it_exits_and_the_block_says_so(bridge):
    with client_with(bridge) as client:
        final = client.call("hermes_run", task="leaves tools !grandchild=120 !sleep=1.5", wait_s=30)
        if final.field("STATUS") == "running":
            final = client.wait_final(final.field("JOB_ID"))
    tools = [pid for pid in bridge.traced_pids() if pid != bridge.runs()[0]["pid"]]
    assert final.field("STATUS") == "ok", final.text
    assert len(tools) == 2 and wait_gone(tools) == []
    assert "tool processes it left running" in final.field("STOPPED")
    assert "(2 processes)" in final.field("STOPPED")


def test_a_frozen_supervisor_is_told_apart_and_a_cancel_ends_it(bridge):
    with client_with(bridge) as client:
        job_id = client.call("hermes_run", task="work !sleep=120", wait_s=0).field("JOB_ID")
        hermes = hermes_pid(bridge, job_id)
        supervisor = bridge.record(job_id).supervisor.pid  # type: ignore[union-attr]
        os.kill(supervisor, signal.SIGSTOP)
        try:
            wait_until(lambda: psutil.Process(supervisor).status() == psutil.STATUS_STOPPED, 10, "the stop")
            frozen = status(client, job_id)
            cancelled = client.call("hermes_cancel", job_id=job_id)
        finally:
            with_suppressed_kill(supervisor, signal.SIGCONT)
    assert "frozen" in field(frozen, "CONDITION"), frozen
    assert cancelled.field("STATUS") == "cancelled", cancelled.text
    assert "frozen and was ended" in cancelled.field("REASON")
    assert wait_gone([hermes, supervisor]) == []


def with_suppressed_kill(pid: int, signum: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signum)


def test_orphaned_jobs_are_pruned_by_retention_like_finished_ones(bridge):
    cfg = load_config(bridge.config)
    store = JobStore.of(cfg)
    store.ensure()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone = ProcessId(dead.pid, time.time() - 5, 1)
    old_id = "20200101-000000-1"
    store.task_path(old_id).write_text("old")
    store.write(JobRecord(id=old_id, state=JobState.RUNNING, created_at=time.time() - 40 * 86400,
                                 supervisor=gone, hermes=gone))
    store.mark_active(old_id)
    assert observe(store.read(old_id)).state is JobState.ORPHANED
    prune_jobs(store, cfg)
    assert not store.record_path(old_id).exists() and old_id not in store.active_ids()


def test_exit_2_says_the_command_line_was_rejected_only_when_hermes_printed_a_usage_error(bridge):
    with client_with(bridge) as client:
        plain = client.call("hermes_run", task="fails !exit=2", wait_s=30)
    assert plain.field("STATUS") == "error"
    assert plain.field("REASON") == "Hermes exited with code 2"
