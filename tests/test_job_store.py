"""The jobs folder: records read back whole and checked field by field, ids claimed atomically, outcomes final, files
planted at future ids, retention and the audit log."""
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from claude_hermes_bridge.config import Config
from claude_hermes_bridge.jobs import JOB_ID_RE, RECORD_ALWAYS_WRITTEN, JobRecord, JobState, JobStore, validate_job_id
from claude_hermes_bridge.launch import JobRequest, prune_jobs
from claude_hermes_bridge.safe_io import DamagedRecord, ProcessId, Refused
from claude_hermes_bridge.tools import list_jobs, observed_job
from harness import (
    SERVER,
    BridgeClient,
    config_for,
    running_record,
)


def plant_future_ids(jobs: Path, outside: Path, seconds: int = 8, per_second: int = 100) -> None:
    """At the next ids' names: FIFOs (a plain open blocks on them), symlinks to a file outside the roots,
    sparse files of a gigabyte, in the log, record, task and cancel names, round-robin."""
    jobs.mkdir(exist_ok=True)
    now = time.time()
    for second in range(seconds):
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now + second))
        for counter in range(1, per_second + 1):
            name = f"{stamp}-{counter}" + (".log", ".log", ".log", ".json", ".task", ".cancel")[counter % 6]
            path = jobs / name
            kind = counter % 3
            if kind == 0:
                os.mkfifo(path)
            elif kind == 1:
                path.symlink_to(outside)
            else:
                with open(path, "wb") as handle:
                    handle.truncate(1 << 30)


def audit_lines(bridge):
    return [json.loads(line) for line in (bridge.tmp / "logs" / "audit.log").read_text().splitlines()]


def test_a_record_reads_back_as_the_json_a_launch_writes(tmp_path):
    """The typed record changes nothing on disk: the keys a launch writes, in that order, and the optional
    ones only once they are known."""
    store = JobStore(tmp_path)
    store.ensure()
    request = JobRequest(kind="run", task="do  it\n", cwd="/w", max_turns=3, timeout_s=60.0, skills=["a"],
                                toolsets=[])
    record = request.record("20261130-000000-1", "/jobs/20261130-000000-1.log")
    store.write(record)
    on_disk = json.loads(store.record_path(record.id).read_text())
    assert list(on_disk) == list(RECORD_ALWAYS_WRITTEN)
    assert on_disk["state"] == "starting" and on_disk["task_preview"] == "do it" and on_disk["supervisor"] is None
    record.hermes = ProcessId(42, 1.5)
    record.tree = [ProcessId(43, 2.5)]
    record.started_at = 10.0
    store.write(record)
    on_disk = json.loads(store.record_path(record.id).read_text())
    assert on_disk["hermes"] == {"pid": 42, "create_time": 1.5} and on_disk["tree"] == [[43, 2.5]]
    assert "ended_at" not in on_disk and "usage" not in on_disk
    assert store.read(record.id) == record


@pytest.mark.parametrize(("field", "value"), [
    ("state", "paused"), ("state", 1), ("created_at", "yesterday"), ("timeout_s", True), ("exit_code", 1.5),
    ("skills", "a,b"), ("skills", [1]), ("cwd", ["/w"]), ("supervisor", [1, 2]), ("hermes", {"pid": "1"}),
    ("hermes", {"pid": True, "create_time": 1.0}), ("tree", {"1": 2.0}), ("tree", [[1, 2.0, 3.5]]),
    ("tree", [["1", 2.0]]), ("usage", {"tokens_in": "many"}), ("changes", "lots"), ("id", "20261130-000000-2"),
    ("changes", {"created": 1, "modified": 0, "deleted": 0, "more": 0, "lines": 5}), ("changes", {"note": 5}),
    ("created_at", float("nan")), ("max_turns", float("inf")), ("hermes", {"pid": 1, "create_time": float("inf")}),
])
def test_a_record_field_of_the_wrong_shape_is_damaged_never_trusted(tmp_path, field, value):
    store = JobStore(tmp_path)
    store.ensure()
    data = running_record(cwd="/w").to_json() | {field: value}
    store.record_path("20261130-000000-1").write_text(json.dumps(data))
    with pytest.raises(DamagedRecord):
        store.read("20261130-000000-1")


def test_a_record_of_an_older_bridge_with_fewer_fields_is_read(tmp_path):
    store = JobStore(tmp_path)
    store.ensure()
    store.record_path("20261130-000000-1").write_text('{"id": "20261130-000000-1", "state": "ok", "extra": 1}')
    record = store.read("20261130-000000-1")
    assert record.state is JobState.OK and record.tree == [] and record.cwd is None


def test_job_ids_are_claimed_atomically(tmp_path):
    store = JobStore(tmp_path / "jobs")
    ids = {store.claim_id(b"task") for _ in range(50)}
    assert len(ids) == 50 and all(JOB_ID_RE.fullmatch(i) for i in ids)


@pytest.mark.parametrize("bad", ["../x", "", "20261130-000000-1/../../etc", None, 5, "a" * 10_000],
                         ids=["dotdot", "empty", "traversal", "none", "number", "huge"])
def test_job_ids_are_validated(bad):
    with pytest.raises(Refused):
        validate_job_id(bad)


def test_damaged_records_are_reported_not_raised(tmp_path):
    cfg = config_for(tmp_path, jobs_dir=str(tmp_path / "jobs"), allowed_roots=[str(tmp_path)])
    store = JobStore(cfg.jobs_path)
    store.ensure()
    for n, content in enumerate([b"", b"{trunc", b"[1, 2]", b'{"id": "other", "state": "ok"}'], start=1):
        store.record_path(f"20261130-000000-{n}").write_bytes(content)
    listing = list_jobs(cfg, None, None)
    assert listing.count("damaged") == 4
    with pytest.raises(Refused, match="damaged"):
        observed_job(cfg, "20261130-000000-1")


def test_records_are_written_whole_while_a_reader_races_and_no_temp_file_is_left(tmp_path):
    import threading

    store = JobStore(tmp_path)
    store.ensure()
    record = running_record(tree=[ProcessId(n, 1.0) for n in range(2000)])  # ~100 KB: a plain write fails
    store.write(record)
    damaged = []
    stop = threading.Event()

    def read_forever():
        while not stop.is_set():
            try:
                store.read("20261130-000000-1")
            except DamagedRecord as exc:
                damaged.append(exc)
    reader = threading.Thread(target=read_forever)
    reader.start()
    try:
        for n in range(50):
            record.tree.append(ProcessId(100000 + n, 2.0))
            store.write(record)
    finally:
        stop.set()
        reader.join()
    assert damaged == []
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_forged_changes_without_their_more_count_make_the_record_damaged():
    data = JobRecord(id="20261130-000000-1", state=JobState.OK).to_json()
    data["changes"] = {"created": 1, "modified": 0, "deleted": 0, "lines": ["+ x (1 B)"]}
    with pytest.raises(DamagedRecord):
        JobRecord.from_json(data, "20261130-000000-1")


@pytest.mark.posix("FIFOs, symlinks and POSIX signals")
def test_fifos_symlinks_and_big_files_at_future_ids_neither_wedge_launches_nor_leak_output(bridge):
    outside = bridge.tmp / "outside.txt"
    outside.write_text("untouched\n")
    plant_future_ids(bridge.jobs, outside)
    with bridge.client() as client:
        for n in range(3):
            result = client.call("hermes_run", task=f"launch {n} past the planted files", wait_s=20)
            assert result.field("STATUS") == "ok", result.text
            assert "FAKE DONE" in result.text
    assert outside.read_text() == "untouched\n"


@pytest.mark.posix("FIFOs, symlinks and POSIX signals")
def test_concurrent_writes_of_one_record_never_collide_or_tear(tmp_path):
    """Ten threads writing one record 40 times each, while two processes keep both cores busy (as another test
    run on the machine may): every write waits its turn within the record lock's deadline, none tears."""
    store = JobStore(tmp_path / "jobs")
    store.ensure()
    job_id = "20261201-000000-1"
    store.write(JobRecord(id=job_id, state=JobState.RUNNING))
    failures: list[BaseException] = []
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]

    def writer(n: int) -> None:
        try:
            for i in range(40):
                store.write(JobRecord(id=job_id, state=JobState.RUNNING, max_turns=n * 100 + i + 1))
                store.read(job_id)
        except BaseException as exc:  # noqa: BLE001  (any failure is the finding)
            failures.append(exc)
    try:
        threads = [threading.Thread(target=writer, args=(n,)) for n in range(10)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for burner in burners:
            burner.kill()
    assert failures == []
    assert [p.name for p in store.root.iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.posix("FIFOs, symlinks and POSIX signals")
def test_an_outcome_is_final_whoever_writes_next(tmp_path):
    store = JobStore(tmp_path / "jobs")
    store.ensure()
    job_id = "20261201-000000-1"
    assert store.write(JobRecord(id=job_id, state=JobState.RUNNING))
    assert store.write(JobRecord(id=job_id, state=JobState.OK, exit_code=0))
    assert not store.write(JobRecord(id=job_id, state=JobState.CANCELLED, reason="late cancel"))
    assert not store.write(JobRecord(id=job_id, state=JobState.RUNNING))
    record = store.read(job_id)
    assert record.state is JobState.OK and record.reason is None


def test_prune_removes_old_and_excess_finished_jobs_never_running_ones(tmp_path):
    cfg = Config(path=tmp_path / "config.json", jobs_dir=str(tmp_path / "jobs"), retention_days=30,
                        retention_max_jobs=2)
    store = JobStore(cfg.jobs_path)
    store.ensure()
    today = time.strftime("%Y%m%d")
    ids = ["20200101-000000-1", "20200101-000000-2"] + [f"{today}-00000{n}-1" for n in range(1, 5)]
    for job_id in ids:
        store.write(JobRecord(id=job_id, state=JobState.OK))
        store.task_path(job_id).write_text("t")
        store.log_path(job_id).write_text("log")
        for folder in (store.root / "tmp" / job_id, store.policy_path(job_id)):  # a killed supervisor's leftovers
            folder.mkdir(parents=True)
            (folder / "left.txt").write_text("x")
    store.mark_active("20200101-000000-2")  # old, but still running
    assert prune_jobs(store, cfg) == 3
    assert store.list_ids() == ["20200101-000000-2", f"{today}-000003-1", f"{today}-000004-1"]
    assert not store.log_path("20200101-000000-1").exists() and not store.task_path(f"{today}-000001-1").exists()
    assert sorted(path.name for path in (store.root / "tmp").iterdir()) == sorted(
        path.name for path in (store.root / "policies").iterdir()) == store.list_ids()


def test_launching_prunes_beyond_retention_max_jobs_and_never_reuses_an_id(bridge):
    bridge.configure(retention_max_jobs=2)
    bridge.jobs.mkdir()
    old = [f"20261101-00000{n}-1" for n in range(1, 5)]
    for job_id in old:
        JobStore(bridge.jobs).write(JobRecord(id=job_id, state=JobState.OK))
    with bridge.client() as client:
        ids = [client.call("hermes_run", task=f"job {n}", wait_s=20).field("JOB_ID") for n in range(4)]
        listing = client.call("hermes_jobs").text
    assert len(set(ids)) == 4
    assert listing.startswith("JOBS: 4 on disk")  # jobs of the last minute are kept whatever the count
    assert all(job_id not in listing for job_id in old)


def test_audit_log_has_each_tool_call_and_state_change_without_outputs(bridge):
    secret_tail = "and then the rest of a long task that must never be logged in full SECRETWORD"
    with bridge.client() as client:
        job_id = client.call("hermes_run", task=f"write the report now please {secret_tail}",
                             wait_s=20).field("JOB_ID")
        client.call("hermes_run", task="escape", cwd=str(bridge.tmp))
        client.call("hermes_status", job_id=job_id)
    lines = audit_lines(bridge)
    tools = [line for line in lines if line["event"] == "tool"]
    assert [t["tool"] for t in tools] == ["hermes_run", "hermes_run", "hermes_status"]
    run = tools[0]
    assert run["job_id"] == job_id and run["outcome"] == "ok" and run["cwd"] == str(bridge.root.resolve())
    assert run["task"].startswith("write the report now please") and "SECRETWORD" not in run["task"]
    assert tools[1]["outcome"] == "refused" and "outside the allowed roots" in tools[1]["reason"]
    states = [(line["job_id"], line["state"]) for line in lines if line["event"] == "job"]
    assert states == [(job_id, "running"), (job_id, "ok")]
    text = (bridge.tmp / "logs" / "audit.log").read_text()
    assert "SECRETWORD" not in text and "FAKE DONE" not in text


def test_audit_log_rotates_by_size(bridge):
    bridge.configure(audit_max_bytes=10_000)
    with bridge.client() as client:
        for _ in range(80):
            client.call("hermes_health")
    logs = bridge.tmp / "logs"
    assert (logs / "audit.log.1").exists()
    assert (logs / "audit.log").stat().st_size <= 10_000


@pytest.mark.posix("POSIX signals")
def test_a_jobs_dir_that_cannot_be_written_refuses_the_launch_and_starts_nothing(bridge):
    blocker = bridge.tmp / "not-a-folder"
    blocker.write_text("a file where the jobs folder should be")
    bridge.configure(jobs_dir=str(blocker / "jobs"))
    with bridge.client() as client:
        refused = client.call("hermes_run", task="nowhere to write", wait_s=0)
        assert refused.is_error and refused.field("STATUS") == "refused"
        assert "NOT writable" in client.call("hermes_health").field("JOBS_DIR")
        assert client.call("hermes_jobs").text.startswith("JOBS: 0")
    bridge.configure(jobs_dir=str(bridge.jobs))
    # A full disk: the server runs with a file-size limit that the task file fits in and the record does not.
    limited = ("import os, resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (300, 300)); "
               "os.execv(sys.executable, [sys.executable, sys.argv[1]])")
    with BridgeClient(bridge.env, command=[sys.executable, "-c", limited, str(SERVER)]) as client:
        refused = client.call("hermes_run", task="disk full", wait_s=0)
        assert refused.is_error and "nothing started" in refused.text, refused.text
        assert client.call("hermes_health").field("BRIDGE")
    time.sleep(0.5)
    assert bridge.runs() == []
    assert list(bridge.jobs.glob("2*.json")) == [] and list((bridge.jobs / "active").iterdir()) == []
