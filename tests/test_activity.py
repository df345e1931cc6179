"""What the planner sees of a job beyond its state (issue 14): live activity and the current tool while it
runs; usage, the files it changed and Hermes' own answer when it ends. With the fake Hermes, which keeps
its session store as the real one does (tests/test_real_hermes.py shows the same with the real CLI)."""
import os
import sqlite3
import time

import pytest

from harness import BridgeClient, hermes_answer, wait_until

pytestmark = pytest.mark.posix("the fake hermes is a shell script")


def poll_until(client, job_id, predicate, timeout=30):
    def block():
        result = client.call("hermes_status", job_id=job_id, wait_s=0)
        return result if predicate(result) else None
    return wait_until(block, timeout, f"the expected status block of job {job_id}", interval=0.3)


def test_running_block_names_the_tool_and_the_final_block_has_usage_changes_and_answer(bridge):
    (bridge.root / "keep.txt").write_text("unchanged")
    (bridge.root / "edit.txt").write_text("old")
    (bridge.root / "gone.txt").write_text("bye")
    (bridge.root / "node_modules").mkdir()
    (bridge.root / "node_modules" / "dep.js").write_text("skipped")
    with bridge.client() as client:
        task = "!tool-sleep=4 !write=edit.txt:new-content !delete=gone.txt"
        job_id = client.call("hermes_run", task=task, wait_s=0).field("JOB_ID")
        running = poll_until(client, job_id, lambda r: "CURRENT_TOOL: terminal: sleep 4 (running" in r.text)
        assert running.field("ACTIVITY") == "1 API call, 1 tool call, tokens in 1,000 / out 100"
        final = client.wait_final(job_id)
    assert final.field("STATUS") == "ok", final.text
    assert final.field("USAGE") == "2 API calls, 1 tool call, tokens in 2,000 / out 200"
    assert final.field("CHANGED_FILES") == "0 created, 1 modified, 1 deleted (under CWD, since the job started)"
    assert "~ edit.txt (11 B)" in final.text and "- gone.txt" in final.text
    assert "keep.txt" not in final.text and "dep.js" not in final.text
    answer = hermes_answer(final.text)
    assert answer == f"FAKE ANSWER: {task}"


def test_created_files_are_listed_and_a_long_list_is_cut_with_counts(bridge):
    with bridge.client() as client:
        one = client.call("hermes_run", task="one file !write=f00.txt:x", wait_s=20)
        assert one.field("CHANGED_FILES").startswith("1 created, 0 modified, 0 deleted")
        assert "+ f00.txt (1 B)" in one.text
    for i in range(60):
        (bridge.root / f"old{i:02d}.txt").write_text("x")
    with bridge.client() as client:
        result = client.call("hermes_run", task="!sleep=3", wait_s=0)
        bridge.wait_for_runs(2)  # Hermes runs, so the start listing has been taken
        time.sleep(0.5)
        for i in range(60):
            os.remove(bridge.root / f"old{i:02d}.txt")
        final = client.wait_final(result.field("JOB_ID"))
    assert final.field("CHANGED_FILES").startswith("0 created, 0 modified, 60 deleted")
    assert "... and 10 more" in final.text


def test_a_folder_too_large_to_track_says_so(bridge):
    bridge.configure(changed_files_max_entries=5)
    for i in range(10):
        (bridge.root / f"f{i}.txt").write_text("x")
    with bridge.client() as client:
        result = client.call("hermes_run", task="!write=new.txt:x", wait_s=20)
    assert result.field("CHANGED_FILES") == "not tracked (more than 5 files under CWD)"


@pytest.mark.parametrize("damage", ["missing", "locked"])
def test_a_store_that_cannot_be_read_makes_the_lines_unavailable_without_delaying_the_block(bridge, damage):
    store = bridge.tmp / "hermes-home" / "state.db"
    with bridge.client() as client:
        job_id = client.call("hermes_run", task="!tool-sleep=6", wait_s=0).field("JOB_ID")
        poll_until(client, job_id, lambda r: "CURRENT_TOOL: terminal" in r.text)
        holder = None
        if damage == "missing":
            for suffix in ("", "-wal", "-shm"):
                if os.path.exists(f"{store}{suffix}"):
                    os.rename(f"{store}{suffix}", f"{store}{suffix}.away")
        else:
            holder = sqlite3.connect(store, isolation_level=None, timeout=10)
            holder.execute("PRAGMA locking_mode=EXCLUSIVE")
            holder.execute("BEGIN EXCLUSIVE")
        try:
            started = time.monotonic()
            running = client.call("hermes_status", job_id=job_id, wait_s=0)
            elapsed = time.monotonic() - started
        finally:
            if holder:
                holder.rollback()
                holder.close()
            for suffix in ("", "-wal", "-shm"):
                if os.path.exists(f"{store}{suffix}.away"):
                    os.rename(f"{store}{suffix}.away", f"{store}{suffix}")
        client.wait_final(job_id)
    assert running.field("STATUS") == "running"
    assert running.field("ACTIVITY").startswith("unavailable: ")
    assert ("no session store" if damage == "missing" else "locked") in running.field("ACTIVITY")
    assert elapsed < 10  # one short connection with a 1 s busy timeout, not a wait on Hermes


def test_progress_notifications_carry_the_activity_line(bridge):
    messages = []

    async def on_progress(_progress, _total, message):
        messages.append(message)
    with bridge.client() as client:
        job_id = client.call("hermes_run", task="!tool-sleep=9", wait_s=0).field("JOB_ID")
        client.portal.call(lambda: client.session.call_tool("hermes_status", {"job_id": job_id, "wait_s": 20},
                                                            progress_callback=on_progress))
        assert "Deprecat" not in client.stderr()  # no MCPDeprecationWarning on either SDK line
    assert any(m and m.startswith(f"job {job_id} is running: 1 API call, 1 tool call")
               and "terminal: sleep 9 (running" in m for m in messages), messages


def test_jobs_lists_token_totals_of_finished_jobs(bridge):
    with bridge.client() as client:
        client.call("hermes_run", task="counted", wait_s=20)
        listing = client.call("hermes_jobs")
    assert "tokens 1,000/100" in listing.text


def test_the_store_is_read_with_a_bounded_number_of_rows(bridge):
    """A session of 100,000 messages: the status block still reads only a few rows (benchmarked in bench/)."""
    with bridge.client() as client:
        job_id = client.call("hermes_run", task="!tool-sleep=8", wait_s=0).field("JOB_ID")
        poll_until(client, job_id, lambda r: "CURRENT_TOOL" in r.text)
        db = sqlite3.connect(bridge.tmp / "hermes-home" / "state.db", timeout=10)
        with db:
            db.executemany("INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, 'user', 'x', ?)",
                           [("other-session", time.time()) for _ in range(100_000)])
        db.close()
        result = client.call("hermes_status", job_id=job_id, wait_s=0)
        assert "CURRENT_TOOL: terminal: sleep 8" in result.text
        client.wait_final(job_id)


def test_a_later_server_process_reports_the_same_final_block(bridge):
    with bridge.client() as client:
        job_id = client.call("hermes_run", task="!write=a.txt:1", wait_s=20).field("JOB_ID")
    with BridgeClient(bridge.env) as later:
        final = later.call("hermes_status", job_id=job_id)
    assert final.field("USAGE").startswith("1 API call,") and final.field("CHANGED_FILES").startswith("1 created")
