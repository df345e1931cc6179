"""Retention prunes finished jobs only; the audit log has one line per tool call and job state change."""
import json
import time

import pytest

import server

pytestmark = pytest.mark.posix("the fake hermes is a shell script")


def test_prune_removes_old_and_excess_finished_jobs_never_running_ones(tmp_path):
    cfg = server.Config(path=tmp_path / "config.json", jobs_dir=str(tmp_path / "jobs"), retention_days=30,
                        retention_max_jobs=2)
    store = server.JobStore(cfg.jobs_path)
    store.ensure()
    today = time.strftime("%Y%m%d")
    ids = ["20200101-000000-1", "20200101-000000-2"] + [f"{today}-00000{n}-1" for n in range(1, 5)]
    for job_id in ids:
        store.write(server.JobRecord(id=job_id, state=server.JobState.OK))
        store.task_path(job_id).write_text("t")
        store.log_path(job_id).write_text("log")
    store.mark_active("20200101-000000-2")  # old, but still running
    assert server.prune_jobs(store, cfg) == 3
    assert store.list_ids() == ["20200101-000000-2", f"{today}-000003-1", f"{today}-000004-1"]
    assert not store.log_path("20200101-000000-1").exists() and not store.task_path(f"{today}-000001-1").exists()


def test_launching_prunes_beyond_retention_max_jobs_and_never_reuses_an_id(bridge):
    bridge.configure(retention_max_jobs=2)
    bridge.jobs.mkdir()
    old = [f"20261101-00000{n}-1" for n in range(1, 5)]
    for job_id in old:
        server.JobStore(bridge.jobs).write(server.JobRecord(id=job_id, state=server.JobState.OK))
    with bridge.client() as client:
        ids = [client.call("hermes_run", task=f"job {n}", wait_s=20).field("JOB_ID") for n in range(4)]
        listing = client.call("hermes_jobs").text
    assert len(set(ids)) == 4
    assert listing.startswith("JOBS: 4 on disk")  # jobs of the last minute are kept whatever the count
    assert all(job_id not in listing for job_id in old)


def audit_lines(bridge):
    return [json.loads(line) for line in (bridge.tmp / "logs" / "audit.log").read_text().splitlines()]


def test_audit_log_has_each_tool_call_and_state_change_without_outputs(bridge):
    secret_tail = "and then the rest of a long task that must never be logged in full SECRETWORD"
    with bridge.client() as client:
        job_id = client.call("hermes_run", task=f"write the report now please {secret_tail}",
                             wait_s=20).field("JOB_ID")
        client.call("hermes_run", task="escape", cwd="/etc")
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
