"""Native background tasks (issue 21): the MCP tasks extension on protocol 2026-07-28, over raw JSON-RPC with
the extension declared per request; the same calls without it, and on the legacy handshake, get today's
replies. Needs the 2.x SDK line (the 1.x line has no extension API: hermes_health says so)."""
import time
from typing import Any

import pytest

from claude_hermes_bridge.config import Config
from claude_hermes_bridge.health import tasks_line
from claude_hermes_bridge.jobs import JobRecord, JobState, JobStore
from claude_hermes_bridge.mcp_edge import TASK_MESSAGE_CHARS, JobTasks
from claude_hermes_bridge.safe_io import ProcessId
from harness import MCP_LINE, TASKS_EXTENSION, Bridge, ModernClient, Result, raw_exchange, text_of

pytestmark = [pytest.mark.posix("the fake hermes is a shell script"),
              pytest.mark.skipif(MCP_LINE < 2, reason="the tasks extension needs the 2.x SDK line")]


def modern(bridge: Bridge, **env: str) -> ModernClient:
    return ModernClient(dict(bridge.env, **env))


def started(client: ModernClient, tool: str = "hermes_run", **arguments: Any) -> str:
    task = client.call(tool, **arguments)
    assert task["resultType"] == "task" and task["status"] in ("working", "completed"), task
    assert set(task) >= {"taskId", "createdAt", "lastUpdatedAt", "ttlMs", "pollIntervalMs"}
    return str(task["taskId"])


def terminal(task: dict[str, Any]) -> bool:
    return task["status"] in ("completed", "failed", "cancelled")


def test_discover_advertises_the_extension(bridge):
    with modern(bridge) as client:
        discovered = client.request("server/discover")["result"]
    assert discovered["capabilities"]["extensions"] == {TASKS_EXTENSION: {}}


def test_a_run_is_a_task_polled_to_completed_with_the_block_hermes_status_gives(bridge):
    with modern(bridge) as client:
        task_id = started(client, task="!sleep=2 build it", cwd=str(bridge.root))
        working = client.request("tasks/get", {"taskId": task_id})["result"]
        done = client.poll(task_id, terminal)
        status = client.call("hermes_status", tasks=False, job_id=task_id)
    assert working["status"] == "working" and working["statusMessage"].startswith("Hermes")
    assert len(working["statusMessage"]) <= TASK_MESSAGE_CHARS
    assert bridge.record(task_id).state is JobState.OK  # the task id is the job id
    assert done["status"] == "completed" and done["result"]["isError"] is False
    assert text_of(done["result"]) == text_of(status)
    assert Result(text_of(done["result"]), False).field("STATUS") == "ok"
    assert "structuredContent" not in done["result"]  # Claude Code would drop the text for it


def test_the_working_message_says_what_hermes_is_doing(bridge):
    with modern(bridge) as client:
        task_id = started(client, task="!tool-sleep=4")
        doing = client.poll(task_id, lambda t: "sleep 4" in t.get("statusMessage", ""), timeout=20)
    assert doing["status"] == "working" and doing["statusMessage"].startswith("Hermes: terminal: sleep 4 (running")
    # issue 49: the task is the job, said where a host shows the task (Claude Code: "started server-side task")
    assert doing["statusMessage"].endswith(f" (JOB_ID {task_id})")


def test_a_failed_job_is_completed_with_is_error(bridge):
    with modern(bridge) as client:
        done = client.poll(started(client, task="!exit=3 fail"), terminal)
    assert done["status"] == "completed" and done["result"]["isError"] is True
    assert Result(text_of(done["result"]), True).field("STATUS") == "error"


def test_cancel_twice_is_idempotent_and_the_task_ends_cancelled_for_good(bridge):
    with modern(bridge) as client:
        task_id = started(client, task="!sleep=60 long")
        first = client.request("tasks/cancel", {"taskId": task_id})
        second = client.request("tasks/cancel", {"taskId": task_id})
        cancelled = client.poll(task_id, terminal, timeout=30)
        third = client.request("tasks/cancel", {"taskId": task_id})
        again = client.request("tasks/get", {"taskId": task_id})["result"]
    for reply in (first, second, third):
        assert "error" not in reply and set(reply["result"]) <= {"resultType", "_meta"}, reply
    assert cancelled["status"] == "cancelled"
    assert bridge.record(task_id).state is JobState.CANCELLED
    assert again["status"] == "cancelled" and "result" not in again


def test_a_completed_task_never_changes_after(bridge):
    with modern(bridge) as client:
        task_id = started(client, task="quick")
        done = client.poll(task_id, terminal)
        client.request("tasks/cancel", {"taskId": task_id})
        record = bridge.jobs / f"{task_id}.json"
        rewritten = record.read_text().replace('"state": "ok"', '"state": "cancelled"')  # as a job could
        assert rewritten != record.read_text()
        record.write_text(rewritten)
        after = client.request("tasks/get", {"taskId": task_id})["result"]
    assert done["status"] == "completed" and after["status"] == "completed"
    assert after["result"] == done["result"]


@pytest.mark.parametrize("task_id", ["20200101-000000-1", "../x", ""], ids=["unknown", "traversal", "empty"])
@pytest.mark.parametrize("method", ["tasks/get", "tasks/cancel", "tasks/update"])
def test_an_unknown_task_id_is_a_json_rpc_error(bridge, method, task_id):
    with modern(bridge) as client:
        reply = client.request(method, {"taskId": task_id, "inputResponses": {}})
    assert reply["error"]["code"] == -32602, reply


def test_a_refusal_stays_an_ordinary_result_and_starts_nothing(bridge, tmp_path):
    with modern(bridge) as client:
        result = client.call("hermes_run", task="x", cwd=str(tmp_path))
    assert result.get("resultType") == "complete" and result["isError"] is True
    assert Result(text_of(result), True).field("STATUS") == "refused"
    assert list(bridge.jobs.glob("2*.json")) == []


def test_a_resume_is_a_task_too(bridge):
    with modern(bridge) as client:
        first = client.poll(started(client, task="first"), terminal)
        session_id = Result(text_of(first["result"]), False).field("SESSION_ID")
        resumed = client.poll(started(client, "hermes_resume", session_id=session_id, task="second"), terminal)
    assert Result(text_of(resumed["result"]), False).field("STATUS") == "ok"


def test_without_the_extension_the_reply_is_todays(bridge):
    with modern(bridge) as client:
        result = client.call("hermes_run", tasks=False, task="!sleep=30 plain", wait_s=0)
    assert result["resultType"] == "complete" and "taskId" not in result
    text = Result(text_of(result), False)
    assert text.field("STATUS") == "running" and "Do not re-run the task" in text.text


def test_the_legacy_handshake_gets_todays_reply_and_no_task_methods(bridge):
    declared = '{"io.modelcontextprotocol/clientCapabilities": {"extensions": {"%s": {}}}}' % TASKS_EXTENSION
    replies = raw_exchange(bridge.env, ['{"name": "hermes_run", "arguments": {"task": "!sleep=30 old", "wait_s": 0},'
                                        ' "_meta": ' + declared + '}'])
    result = replies[0]["result"]
    assert "taskId" not in result and "resultType" not in result
    assert Result(text_of(result), False).field("STATUS") == "running"
    with modern(bridge) as client:
        legacy = client.request("tasks/get", {"taskId": Result(text_of(result), False).field("JOB_ID")}, modern=False)
    assert "error" in legacy


def test_a_question_is_input_required_and_tasks_update_answers_it(bridge):
    bridge.configure(approvals="ask", approval_timeout_s=60)
    with modern(bridge, FAKE_HERMES_ACP="1") as client:
        task_id = started(client, task="!ask=touch+asked.txt")
        asking = client.poll(task_id, lambda t: t["status"] == "input_required", timeout=30)
        (key, request), = asking["inputRequests"].items()
        ignored = client.request("tasks/update", {"taskId": task_id, "inputResponses": {
            "9-abcdef": {"action": "accept", "content": {"allow": True}}}})
        still = client.request("tasks/get", {"taskId": task_id})["result"]
        answered = client.request("tasks/update", {"taskId": task_id, "inputResponses": {
            key: {"action": "accept", "content": {"allow": True}}}})
        done = client.poll(task_id, terminal)
    assert request["method"] == "elicitation/create" and request["params"]["mode"] == "form"
    assert "touch asked.txt" in request["params"]["message"]
    assert request["params"]["requestedSchema"]["properties"]["allow"]["type"] == "boolean"
    assert key == bridge.record(task_id).decisions[0]["id"]
    assert "error" not in ignored and still["status"] == "input_required"
    assert "error" not in answered and set(answered["result"]) <= {"resultType", "_meta"}
    assert (bridge.root / "asked.txt").exists()
    assert f"- {key}: run `touch asked.txt` (dangerous) -> allow by the user (elicitation)" in text_of(done["result"])


def asking_task(client: ModernClient, task: str) -> tuple[str, str]:
    """A task started with this task, once it asks: its id and its one question's key."""
    task_id = started(client, task=task)
    (key, _), = client.poll(task_id, lambda t: t["status"] == "input_required", timeout=30)["inputRequests"].items()
    return task_id, key


def test_a_declined_question_denies(bridge):
    bridge.configure(approvals="ask", approval_timeout_s=60)
    with modern(bridge, FAKE_HERMES_ACP="1") as client:
        task_id, key = asking_task(client, "!ask=touch+declined.txt")
        client.request("tasks/update", {"taskId": task_id, "inputResponses": {key: {"action": "decline"}}})
        done = client.poll(task_id, terminal)
    assert not (bridge.root / "declined.txt").exists()
    assert "-> deny by the user (elicitation)" in text_of(done["result"])


def test_a_network_question_is_the_tasks_dialog_too_and_its_answer_lets_the_request_through(bridge):
    """Issue 48, network: ask: a tool's request to an unlisted host waits in the job's proxy as the user's
    question, which a tasks client gets as input_required (as Hermes' own questions); allowed, it goes through."""
    from test_network import network_question

    with network_question(bridge) as (port, script), modern(bridge) as client:
        task_id = started(client, task=f"!shell={script}")
        asking = client.poll(task_id, lambda t: t["status"] == "input_required", timeout=60)
        (key, request), = asking["inputRequests"].items()
        client.request("tasks/update", {"taskId": task_id, "inputResponses": {
            key: {"action": "accept", "content": {"allow": True}}}})
        done = client.poll(task_id, terminal)
    assert f"The job (job {task_id}) asks to connect to 127.0.0.1:{port}" in request["params"]["message"], request
    assert request["params"]["requestedSchema"]["properties"].keys() == {"allow"}  # no "same exact command"
    assert (bridge.root / "code.txt").read_text() == "200"
    decided = bridge.record(task_id).decisions[-1]
    assert decided["id"] == key and decided["decision"] == "allow" and decided["by"] == "the user (elicitation)"
    assert "NETWORK: ask (" in text_of(done["result"]) and "refused" not in text_of(done["result"])


def test_a_modern_client_that_declares_elicitation_but_not_tasks_is_shown_the_question(bridge):
    """2026-07-28 has no back-channel for elicitation/create: the question comes back as needs_approval."""
    bridge.configure(approvals="ask", approval_timeout_s=60)
    with modern(bridge, FAKE_HERMES_ACP="1") as client:
        result = client.call("hermes_run", tasks=False, elicitation=True, task="!ask=touch+shown.txt", wait_s=20)
    assert Result(text_of(result), False).field("STATUS") == "needs_approval", text_of(result)


def test_health_says_whether_this_sdk_line_serves_tasks():
    assert tasks_line("2.3.0").startswith("served")
    assert tasks_line("1.24.0").startswith("not served on the 1.x SDK line (mcp 1.24.0)")


# ------------------------------------------------------------------ JobTasks as a unit
def job_on_disk(tmp_path: Any, **fields: Any) -> tuple[Config, str]:
    cfg = Config(path=tmp_path / "config.json", allowed_roots=[str(tmp_path)], jobs_dir=str(tmp_path / "jobs"))
    store = JobStore.of(cfg)
    store.ensure()
    job_id = store.claim_id(b"t")
    store.write(JobRecord(id=job_id, created_at=time.time() - 100, log=str(store.log_path(job_id)),
                                 **fields))
    return cfg, job_id


DEAD = ProcessId(2**22 + 11, 1.0)


@pytest.mark.parametrize("fields", [
    {"state": JobState.TIMEOUT, "reason": "hit timeout_s=5", "ended_at": 1.0},
    {"state": JobState.RUNNING, "supervisor": DEAD},
], ids=["timed-out", "orphaned"])
def test_a_timed_out_or_orphaned_job_is_a_completed_task_with_is_error_never_cancelled(tmp_path, fields):
    cfg, job_id = job_on_disk(tmp_path, **fields)
    task = JobTasks().task(cfg, job_id)
    assert task["status"] == "completed" and task["result"]["isError"] is True


def test_cancelling_a_task_already_reported_terminal_changes_nothing(tmp_path):
    cfg, job_id = job_on_disk(tmp_path, state=JobState.RUNNING, supervisor=DEAD)
    tasks = JobTasks()
    assert tasks.task(cfg, job_id)["status"] == "completed"  # an orphan, reported terminal
    before = JobStore.of(cfg).record_path(job_id).read_bytes()
    tasks.cancel(cfg, job_id)
    assert JobStore.of(cfg).record_path(job_id).read_bytes() == before
    assert not JobStore.of(cfg).cancel_path(job_id).exists()
    assert tasks.task(cfg, job_id)["status"] == "completed"


def test_a_second_answer_through_tasks_update_is_a_json_rpc_error_naming_the_first(bridge):
    """Issue 27: hermes_approve (deny) first, then the task's own answer (allow): only the first is applied."""
    bridge.configure(approvals="ask", approval_timeout_s=60)
    with modern(bridge, FAKE_HERMES_ACP="1") as client:
        task_id, key = asking_task(client, "!ask=touch+twice.txt")
        first = client.call("hermes_approve", tasks=False, job_id=task_id, approval_id=key, decision="deny")
        second = client.request("tasks/update", {"taskId": task_id, "inputResponses": {
            key: {"action": "accept", "content": {"allow": True}}}})
        done = client.poll(task_id, terminal)
    assert not first.get("isError"), first
    assert "decided already: deny by the planner" in second["error"]["message"], second
    assert not (bridge.root / "twice.txt").exists()
    assert f"- {key}: run `touch twice.txt` (dangerous) -> deny by the planner (hermes_approve)" in text_of(
        done["result"])


def test_an_answer_through_tasks_update_after_hermes_decided_is_refused_and_listed(bridge):
    """Issue 50: the dialog left open past Hermes' deadline (Claude Code's tasks dialog), then answered: the
    answer is refused, naming Hermes' own decision, and the final block lists it with the late answers, as a
    late hermes_approve is."""
    bridge.configure(approvals="ask", approval_timeout_s=5)
    with modern(bridge, FAKE_HERMES_ACP="1") as client:
        task_id, key = asking_task(client, "!ask=touch+late.txt !tool-sleep=12")
        client.poll(task_id, lambda t: t["status"] != "input_required", timeout=30)  # Hermes denied it itself
        late = client.request("tasks/update", {"taskId": task_id, "inputResponses": {
            key: {"action": "accept", "content": {"allow": True}}}})
        done = client.poll(task_id, terminal, timeout=60)
    message = late["error"]["message"]  # whether Hermes' own decision was recorded yet, or only its deadline passed
    assert "decided already: deny by Hermes itself" in message or "denied it itself" in message, late
    block = text_of(done["result"])
    assert "LATE_ANSWERS: 1 answer came after the question was decided" in block, block
    assert f"- {key}: allow by the user (" in block, block
    assert not (bridge.root / "late.txt").exists()
