"""Issue 51: a job over max_running_jobs is accepted and waits (STATUS: queued, its place said), starts in the
order accepted when a slot frees, whether a server runs then or not, exactly once with several servers on one
jobs folder; a cancel while queued starts nothing; the queue has a bound of its own; its timeout counts from
its start."""
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psutil
import pytest

from harness import Bridge, live_pids, wait_until

pytestmark = pytest.mark.posix("the fake hermes is a shell script")


def running_hermes(bridge: Bridge) -> int:
    """How many fake Hermes runs are alive now, from the processes themselves."""
    return len(live_pids([run["pid"] for run in bridge.runs()]))


def test_ten_jobs_from_two_servers_run_two_at_a_time_in_the_order_accepted(bridge: Bridge) -> None:
    bridge.configure(max_running_jobs=2)
    most, done = 0, threading.Event()

    def watch() -> None:
        nonlocal most
        while not done.is_set():
            most = max(most, running_hermes(bridge))
            time.sleep(0.02)
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with bridge.client() as one, bridge.client() as two:
            def launch(n: int) -> Any:
                client = one if n % 2 else two
                return client.call("hermes_run", task=f"job {n} !sleep=1", wait_s=0)
            with ThreadPoolExecutor(4) as pool:
                started = list(pool.map(launch, range(10)))
            states = [result.field("STATUS") for result in started]
            queued = [result for result in started if result.field("STATUS") == "queued"]
            ids = sorted(result.field("JOB_ID") for result in started)
            finals = [one.wait_final(job_id, timeout=120) for job_id in ids]
    finally:
        done.set()
        watcher.join()
    assert all(not result.is_error for result in started), [r.text for r in started if r.is_error]
    assert states.count("queued") >= 6 and queued, states
    assert queued[0].field("QUEUE").split(";")[0].endswith(tuple(f"of {n}" for n in range(1, 9))), queued[0].text
    assert "max_running_jobs 2" in queued[0].field("QUEUE")
    assert [final.field("STATUS") for final in finals] == ["ok"] * 10, [f.text for f in finals]
    assert most <= 2, f"{most} Hermes ran at once"
    assert len(bridge.runs()) == 10  # each started exactly once
    records = [bridge.record(job_id) for job_id in ids]
    dequeued = [record for record in records if record.dequeued_at is not None]
    assert [r.id for r in sorted(dequeued, key=lambda r: r.dequeued_at or 0)] == [r.id for r in dequeued]  # in order
    assert all((r.start or "").startswith("cold: it waited ") for r in dequeued), [r.start for r in dequeued]


def test_a_queued_job_is_cancelled_without_starting_hermes_and_the_queue_goes_on(bridge: Bridge) -> None:
    bridge.configure(max_running_jobs=1)
    with bridge.client() as client:
        first = client.call("hermes_run", task="first !sleep=2", wait_s=0).field("JOB_ID")
        second = client.call("hermes_run", task="second !sleep=0", wait_s=0)
        third = client.call("hermes_run", task="third !sleep=0", wait_s=0).field("JOB_ID")
        assert second.field("STATUS") == "queued" and second.field("QUEUE").startswith("1st of 1; 1 running")
        again = client.call("hermes_run", task="second !sleep=0", wait_s=0)  # identical: the same queued job
        cancelled = client.call("hermes_cancel", job_id=second.field("JOB_ID"))
        finals = [client.wait_final(job_id, timeout=60) for job_id in (first, third)]
    assert again.field("JOB_ID") == second.field("JOB_ID") and "already queued" in again.text, again.text
    assert cancelled.field("STATUS") == "cancelled", cancelled.text
    assert "cancelled while queued; Hermes was never started" in cancelled.text
    assert [final.field("STATUS") for final in finals] == ["ok", "ok"]
    assert sorted(run["task"].split()[0] for run in bridge.runs()) == ["first", "third"]


def test_past_max_queued_jobs_the_launch_is_refused_naming_it(bridge: Bridge) -> None:
    bridge.configure(max_running_jobs=1, max_queued_jobs=1)
    with bridge.client() as client:
        first = client.call("hermes_run", task="a !sleep=5", wait_s=0).field("JOB_ID")
        queued = client.call("hermes_run", task="b !sleep=0", wait_s=0)
        refused = client.call("hermes_run", task="c !sleep=0", wait_s=0)
        for job_id in (first, queued.field("JOB_ID")):
            client.call("hermes_cancel", job_id=job_id)
    assert queued.field("STATUS") == "queued"
    assert refused.is_error and "1 wait in the queue, the most max_queued_jobs allows" in refused.text, refused.text


def test_the_queue_drains_with_no_server_left_and_after_a_supervisor_is_killed(bridge: Bridge) -> None:
    """Finishing supervisors start the next job (no server runs then); a killed one frees its slot, and the next
    look (a status call) starts the queue."""
    bridge.configure(max_running_jobs=1)
    with bridge.client() as client:
        ids = [client.call("hermes_run", task=f"gone {n} !sleep=1", wait_s=0).field("JOB_ID") for n in range(3)]
    wait_until(lambda: all(bridge.record(job_id).state.value == "ok" for job_id in ids) or None, 60,
               "the queue to drain with no server")
    with bridge.client() as client:
        stuck = client.call("hermes_run", task="stuck !sleep=60", wait_s=0).field("JOB_ID")
        waiting = client.call("hermes_run", task="waiting !sleep=0", wait_s=0).field("JOB_ID")
        supervisor = bridge.wait_record(stuck, "supervisor")
        hermes = bridge.wait_record(stuck, "hermes")
        for pid in (supervisor.pid, hermes.pid):
            psutil.Process(pid).kill()
        final = client.wait_final(waiting, timeout=60)
        orphan = client.call("hermes_status", job_id=stuck, wait_s=0)
    assert final.field("STATUS") == "ok", final.text
    assert orphan.field("STATUS") == "orphaned"


def test_a_queued_jobs_timeout_counts_from_its_start_not_its_acceptance(bridge: Bridge) -> None:
    bridge.configure(max_running_jobs=1)
    with bridge.client() as client:
        client.call("hermes_run", task="ahead !sleep=4", wait_s=0)
        behind = client.call("hermes_run", task="behind !sleep=1", timeout_s=3, wait_s=0)
        assert behind.field("STATUS") == "queued" and "counted from its start" in behind.field("TIMEOUT_S")
        final = client.wait_final(behind.field("JOB_ID"), timeout=60)
    assert final.field("STATUS") == "ok", final.text  # 4 s queued + 1 s run, against a 3 s timeout


@pytest.mark.e2e
def test_a_batch_of_four_real_hermes_jobs_with_a_limit_of_two(bridge: Bridge) -> None:
    """The real Hermes 0.22.2 (CLI, the scripted model on 127.0.0.1): four jobs handed over at once with
    max_running_jobs 2 each end ok; the two queued start only once a slot freed (after an earlier job ended)."""
    from test_real_hermes import write_hermes_home

    from conftest import require_component
    from harness import REAL_HERMES_VERSIONS
    from scripted_model import ScriptedModel

    exe = require_component(REAL_HERMES_VERSIONS["0.22.2"], "the real Hermes CLI 0.22.2")
    with ScriptedModel(bridge.tmp) as model:
        write_hermes_home(bridge.tmp / "real-home", model.base_url)
        bridge.configure(hermes_exe=str(exe), hermes_home=str(bridge.tmp / "real-home"), hermes_driver="cli",
                         approvals="yolo", max_running_jobs=2, kill_grace_s=5)
        with bridge.client() as client:
            started = [client.call("hermes_run", task=f"Batch {n}.\nRUN: sleep 1 && echo batch {n}", wait_s=0)
                       for n in range(4)]
            finals = [client.wait_final(result.field("JOB_ID"), timeout=240) for result in started]
    assert [result.field("STATUS") for result in started].count("queued") == 2, [r.text for r in started]
    assert [final.field("STATUS") for final in finals] == ["ok"] * 4, [f.text for f in finals]
    records = [bridge.record(result.field("JOB_ID")) for result in started]
    ended = sorted(record.ended_at or 0 for record in records if record.dequeued_at is None)
    for record in records:
        if record.dequeued_at is not None:
            assert record.dequeued_at >= ended[0] - 0.5, (record.id, record.dequeued_at, ended)
    assert all("SCRIPTED DONE: " in final.text and f"batch {n}" in final.text for n, final in enumerate(finals))
