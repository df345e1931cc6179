"""Hermes asks, the user answers (issue 20): the ACP driver against the fake Hermes' ACP side. Which driver a
job gets, what each approvals setting lets reach Hermes, every way a question is answered (the bridge itself,
hermes_approve, elicitation, nobody), activity from events, cancel and resume over ACP."""
import json
import re
import sys
import threading
import time
from typing import Any

import psutil
import pytest
from mcp import types

from claude_hermes_bridge.bodies import wait_for_end
from claude_hermes_bridge.config import Config, load_config
from claude_hermes_bridge.hermes_acp import ACP_SESSION_RE, approval_policy_dir
from claude_hermes_bridge.hermes_cli import hermes_env
from claude_hermes_bridge.jobs import RECORD_MAX_BYTES, JobRecord, JobState, JobStore
from claude_hermes_bridge.mcp_edge import elicited_decision
from claude_hermes_bridge.render import QUESTIONS_SHOWN
from claude_hermes_bridge.safe_io import ProcessId, machine_clock
from claude_hermes_bridge.tools import answer_approval
from harness import SERVER, Bridge, BridgeClient, hermes_answer, make_fake_hermes, refused, wait_gone, wait_until

pytestmark = pytest.mark.posix("the fake hermes is a shell script")


@pytest.fixture
def acp(bridge: Bridge) -> Bridge:
    """The bridge with a fake Hermes that has its acp extra, and approvals that time out in seconds."""
    bridge.configure(approval_timeout_s=6)
    return bridge


def client_of(bridge: Bridge, extra: bool = True, command: list[str] | None = None, **kwargs: Any) -> BridgeClient:
    client = bridge.client(command=command, **kwargs)
    client.params.env = dict(bridge.env, FAKE_HERMES_ACP="1" if extra else "0")
    return client


def wait_question(client: BridgeClient, job_id: str) -> Any:
    return wait_until(lambda: r if (r := client.call("hermes_status", job_id=job_id, wait_s=5)).field("STATUS")
                      == "needs_approval" else None, 40, f"job {job_id} to ask")


def approvals_of(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("- ") and " -> " in line]


# ------------------------------------------------------------------ 1. which driver
def test_auto_picks_acp_when_hermes_has_its_extra_and_the_record_keeps_it(acp):
    with client_of(acp) as client:
        result = client.call("hermes_run", task="hello over acp", wait_s=30)
        health = client.call("hermes_health")
    assert result.field("STATUS") == "ok", result.text
    assert acp.record(result.field("JOB_ID")).driver == "acp"
    assert health.field("DRIVER").startswith("acp (auto: `hermes acp --check` passed)")
    assert acp.runs()[0]["argv"] == ["acp"]


def test_without_the_extra_auto_falls_back_to_the_cli_and_says_how_to_get_acp(acp):
    acp.configure(approvals="ask")
    with client_of(acp, extra=False) as client:
        result = client.call("hermes_run", task="hello over the cli", wait_s=30)
        health = client.call("hermes_health")
    assert result.field("STATUS") == "ok" and acp.record(result.field("JOB_ID")).driver == "cli"
    assert "cannot forward its questions" in result.text and "hermes-agent[acp]" in result.text
    assert health.field("DRIVER").startswith("cli (auto: `hermes acp --check` fails")
    assert "pip install 'hermes-agent[acp]'" in health.field("DRIVER")
    assert "cannot forward questions: they are denied" in health.field("APPROVALS")


def test_hermes_driver_acp_without_the_extra_is_refused_with_the_fix(acp):
    acp.configure(hermes_driver="acp")
    with client_of(acp, extra=False) as client:
        refused(client.call("hermes_run", task="x", wait_s=0), "hermes_driver is acp", "hermes-agent[acp]")


# ------------------------------------------------------------------ 2. what each setting lets reach Hermes
@pytest.mark.parametrize("extra", [True, False], ids=["acp", "cli"])
def test_the_bundle_defaults_yolo_false_and_approvals_deny_leave_every_bypass_off(acp, extra):
    command = [sys.executable, str(SERVER), "--yolo", "false", "--approvals", "deny"]
    acp.configure(yolo=True, approvals="yolo")  # a config file that would loosen it
    client = client_of(acp, extra=extra, command=command)
    client.params.env = dict(client.params.env or {}, HERMES_YOLO_MODE="1")  # inherited from the host's environment
    with client:
        result = client.call("hermes_run", task="!ask=touch+denied.txt", wait_s=40)
    assert result.field("STATUS") == "ok", result.text
    run = acp.runs()[0]
    assert "--yolo" not in run["argv"] and run.get("yolo_env") is None
    if extra:
        assert "mode: manual" in run["policy"] and "timeout: 6" in run["policy"]
        assert approvals_of(result.text) == [f"- {acp.record(result.field('JOB_ID')).decisions[0]['id']}: run "
                                             "`touch denied.txt` (dangerous) -> deny by the bridge: approvals deny"]
        assert not (acp.root / "denied.txt").exists()
        assert result.text.splitlines()[2] == ("DENIED: 1 command Hermes asked to run was denied (see APPROVALS): the "
                                               "work may be incomplete; check it with hermes_read"), result.text


def test_yolo_allows_and_says_so_over_acp_and_passes_yolo_to_the_cli(acp):
    acp.configure(approvals="yolo")
    with client_of(acp) as client:
        over_acp = client.call("hermes_run", task="!ask=touch+allowed.txt", wait_s=40)
    assert (acp.root / "allowed.txt").exists() and "-> allow by the bridge: approvals yolo" in over_acp.text
    acp.configure(hermes_exe=str(make_fake_hermes(acp.tmp / "cli-hermes")))  # probed afresh: no acp extra
    with client_of(acp, extra=False) as client:
        client.call("hermes_run", task="over the cli", wait_s=30)
    [cli_run] = [run for run in acp.runs() if run["argv"][0] == "chat"]
    assert "--yolo" in cli_run["argv"] and cli_run["policy"] == ""


@pytest.mark.parametrize("approvals", ["deny", "ask"])
def test_under_the_cli_driver_hermes_gets_a_policy_that_denies_at_once_unless_yolo(acp, approvals):
    """Issue 28: a one-shot CLI has nobody to ask; 0.19 would wait its 60 s approval timeout."""
    acp.configure(approvals=approvals)
    with client_of(acp, extra=False) as client:
        client.call("hermes_run", task="over the cli", wait_s=30)
    [run] = acp.runs()
    assert "mode: manual" in run["policy"] and "timeout: 0" in run["policy"]
    assert "single_query_mode: deny" in run["policy"] and "--yolo" not in run["argv"]


def test_a_file_edit_inside_the_roots_is_allowed_and_one_outside_denied_in_every_mode(acp):
    outside = acp.tmp / "outside.txt"
    with client_of(acp) as client:
        result = client.call("hermes_run", task=f"!edit=inside.txt:fine !edit={outside}:bad", wait_s=40)
    assert result.field("STATUS") == "ok", result.text
    assert (acp.root / "inside.txt").read_text() == "fine"
    assert not outside.exists()


# ------------------------------------------------------------------ 3. questions relayed
@pytest.mark.parametrize("decision", ["allow", "deny"])
@pytest.mark.sdk_lines
def test_ask_relays_the_question_and_hermes_approve_answers_it(acp, decision):
    acp.configure(approvals="ask", approval_timeout_s=60)
    with client_of(acp) as client:
        job_id = client.call("hermes_run", task="!ask=touch+asked.txt", wait_s=0).field("JOB_ID")
        asking = wait_question(client, job_id)
        assert asking.field("APPROVAL") == "Hermes asks to run `touch asked.txt` (dangerous)"
        assert 0 < int(asking.field("APPROVAL_WAITS_S").split()[0]) <= 60
        policy = acp.jobs / "policies" / job_id / "config.yaml"  # the job's managed policy, in the jobs folder
        assert "mode: manual" in policy.read_text()
        approval_id = asking.field("APPROVAL_ID")
        refused(client.call("hermes_approve", job_id=job_id, approval_id="9-abcdef", decision="allow"),
                "not waiting for an answer")
        refused(client.call("hermes_approve", job_id=job_id, approval_id=approval_id, decision="maybe"),
                'decision must be "allow", "allow_for_job" or "deny"')
        answered = client.call("hermes_approve", job_id=job_id, approval_id=approval_id, decision=decision)
        assert answered.field("STATUS") in ("running", "ok"), answered.text
        final = client.wait_final(job_id)
        again = client.call("hermes_approve", job_id=job_id, approval_id=approval_id, decision=decision)
    assert final.field("STATUS") == "ok" and not policy.parent.exists()  # removed by the job's cleanup
    assert (acp.root / "asked.txt").exists() == (decision == "allow")
    assert approvals_of(final.text) == [f"- {approval_id}: run `touch asked.txt` (dangerous) -> {decision} by the "
                                        "planner (hermes_approve)"]
    assert again.is_error


def test_an_unanswered_question_is_denied_by_hermes_and_a_late_answer_refused(acp):
    acp.configure(approvals="ask", approval_timeout_s=5)
    with client_of(acp) as client:
        job_id = client.call("hermes_run", task="!ask=touch+late.txt", wait_s=0).field("JOB_ID")
        approval_id = wait_question(client, job_id).field("APPROVAL_ID")
        final = wait_until(lambda: r if (r := client.call("hermes_status", job_id=job_id, wait_s=5)).field(
            "STATUS") not in ("running", "needs_approval") else None, 60, f"job {job_id} to end")
        late = client.call("hermes_approve", job_id=job_id, approval_id=approval_id, decision="allow")
        again = client.call("hermes_status", job_id=job_id, wait_s=0)
    assert final.field("STATUS") == "ok" and not (acp.root / "late.txt").exists()
    assert "-> deny by Hermes itself" in final.text
    refused(late, "was decided already: deny by Hermes itself", " at ", "this answer (allow) was not relayed")
    assert again.field("LATE_ANSWERS").startswith("1 answer came after the question was decided")
    assert f"- {approval_id}: allow by the planner (hermes_approve) at " in again.text


def test_a_late_answer_while_the_job_runs_is_kept_for_its_final_block(acp):
    """An answer after Hermes decided (its deadline passed) but before the job ends: refused, and still in the
    final block, with who gave it and when, so nobody takes it for a decision."""
    acp.configure(approvals="ask", approval_timeout_s=5)
    with client_of(acp) as client:
        job_id = client.call("hermes_run", task="!ask=touch+late.txt !tool-sleep=12", wait_s=0).field("JOB_ID")
        asking = wait_question(client, job_id)
        approval_id = asking.field("APPROVAL_ID")
        time.sleep(int(asking.field("APPROVAL_WAITS_S").split()[0]) + 1.5)  # past Hermes' deadline: it denied
        # the command by itself and went on to its next tool
        late = client.call("hermes_approve", job_id=job_id, approval_id=approval_id, decision="allow")
        assert client.call("hermes_status", job_id=job_id, wait_s=0).field("STATUS") == "running"
        final = client.wait_final(job_id)
    assert refused(late) and "decided already: deny by Hermes itself" in late.text, late.text
    assert final.field("LATE_ANSWERS").startswith("1 answer came after the question was decided"), final.text
    assert f"- {approval_id}: allow by the planner (hermes_approve) at " in final.text
    assert not (acp.root / "late.txt").exists()


@pytest.mark.sdk_lines
def test_waiting_on_several_jobs_returns_when_one_asks_and_counts_a_repeated_id_once(acp):
    acp.configure(approvals="ask", approval_timeout_s=60)
    with client_of(acp) as client:
        asking = client.call("hermes_run", task="!ask=touch+asked.txt", wait_s=0).field("JOB_ID")
        busy = client.call("hermes_run", task="busy !tool-sleep=40", wait_s=0).field("JOB_ID")
        started = time.monotonic()
        waited = client.call("hermes_status", job_ids=[asking, busy, busy], until="all", wait_s=30)
        took = time.monotonic() - started
        for job_id in (asking, busy):
            client.call("hermes_cancel", job_id=job_id)
    assert took < 20, f"waited {took:.0f} s although a job asked a question"
    assert waited.text.startswith("JOBS: 0 of 2 ended"), waited.text
    assert f"- {asking}: needs_approval, " in waited.text and waited.text.count(f"- {busy}: running") == 1


def test_the_question_carries_its_deadline_wherever_it_is_shown(acp):
    """Issue 28: a dialog left open past Hermes' deadline must say when that deadline is."""
    acp.configure(approvals="ask", approval_timeout_s=60)
    asked: list[str] = []

    async def elicit(_context: Any, params: Any) -> Any:
        asked.append(params.message)
        return types.ElicitResult(action="decline")
    with client_of(acp) as client:
        job_id = client.call("hermes_run", task="!ask=touch+deadline.txt", wait_s=0).field("JOB_ID")
        block = wait_question(client, job_id)
        client.call("hermes_approve", job_id=job_id, approval_id=block.field("APPROVAL_ID"), decision="deny")
    with client_of(acp, elicitation_callback=elicit) as client:
        client.call("hermes_run", task="!ask=touch+deadline2.txt", wait_s=30)
    waits = block.field("APPROVAL_WAITS_S")
    assert re.fullmatch(r"\d+ \(Hermes denies this by itself at \d\d:\d\d:\d\d \(in \d+ s\) if nobody "
                               r"answers\)", waits), waits
    assert asked and re.search(r"Allow it\? Hermes denies this by itself at \d\d:\d\d:\d\d \(in \d+ s\)",
                                      asked[0]), asked


@pytest.mark.sdk_lines
def test_a_client_that_can_elicit_is_asked_directly_and_the_result_says_the_user_answered(acp):
    acp.configure(approvals="ask", approval_timeout_s=60)
    asked: list[str] = []

    async def elicit(_context: Any, params: Any) -> Any:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"allow": True})
    with client_of(acp, elicitation_callback=elicit) as client:
        result = client.call("hermes_run", task="!ask=touch+by-user.txt", wait_s=40)
    assert result.field("STATUS") == "ok", result.text
    assert asked and "asks to run `touch by-user.txt` (dangerous). Allow it?" in asked[0]
    assert (acp.root / "by-user.txt").exists()
    assert "-> allow by the user (elicitation)" in result.text


@pytest.mark.parametrize("delay_s", [0.0, 1.5], ids=["at-once", "after-reading"])
@pytest.mark.sdk_lines
def test_a_decline_no_person_could_have_given_is_the_hosts_not_the_users(acp, delay_s):
    """Issue 49: `codex exec` declines every elicitation at once, with nobody asked; that is recorded as the host's
    decline, never as the user's (the audit log is the user's record). A decline that took a person's time is
    the user's."""
    import anyio

    acp.configure(approvals="ask", approval_timeout_s=60)

    async def elicit(_context: Any, _params: Any) -> Any:
        await anyio.sleep(delay_s)
        return types.ElicitResult(action="decline")
    with client_of(acp, elicitation_callback=elicit) as client:
        result = client.call("hermes_run", task="!ask=touch+declined.txt", wait_s=40)
    assert result.field("STATUS") == "ok", result.text
    by = ("the host, declined without asking anyone (it answered at once)" if delay_s == 0
          else "the user (elicitation)")
    assert f"-> deny by {by}" in result.text, result.text
    audit = (acp.tmp / "logs" / "audit.log").read_text()
    assert f'"by": "{by}"' in audit


# ------------------------------------------------------------------ 4. events, cancel, resume
def test_activity_current_tool_usage_and_answer_come_from_the_events(acp):
    with client_of(acp) as client:
        job_id = client.call("hermes_run", task="!tool-sleep=6", wait_s=0).field("JOB_ID")
        running = wait_until(lambda: r if "CURRENT_TOOL: execute: sleep 6 (running" in (
            r := client.call("hermes_status", job_id=job_id, wait_s=1)).text else None, 30, "the current tool")
        final = client.wait_final(job_id)
    assert running.field("ACTIVITY").startswith("1 tool call, context 1,234 / 256,000 tokens") or \
        running.field("ACTIVITY").startswith("1 tool call")
    assert final.field("USAGE") == "1 tool call, context 1,234 / 256,000 tokens"  # the tokens: SPEND's alone
    assert re.search(r"; tokens [\d,]+ \(in [\d,]+ / out [\d,]+\)", final.field("SPEND"))
    assert hermes_answer(final.text) == "FAKE ANSWER: !tool-sleep=6"
    log = (acp.jobs / f"{job_id}.log").read_text()
    assert "[hermes] execute: sleep 6" in log and "FAKE ANSWER" in log


def test_cancel_over_acp_stops_the_running_command_and_leaves_no_process(acp):
    with client_of(acp) as client:
        job_id = client.call("hermes_run", task="!tool-sleep=120", wait_s=0).field("JOB_ID")
        tool = wait_until(lambda: [int(p.stem) for p in acp.trace.glob("*.child")], 30, "the tool")
        client.call("hermes_cancel", job_id=job_id)
        final = client.wait_final(job_id)
    assert final.field("STATUS") == "cancelled"
    assert wait_gone(tool + acp.traced_pids()) == []


def test_an_acp_session_is_resumed_over_acp_with_session_load(acp):
    with client_of(acp) as client:
        first = client.call("hermes_run", task="start a session", wait_s=30)
        session = first.field("SESSION_ID")
        assert ACP_SESSION_RE.fullmatch(session)
        resumed = client.call("hermes_resume", session_id=session, task="continue it", wait_s=30)
    assert resumed.field("STATUS") == "ok", resumed.text
    assert resumed.field("SESSION_ID") == session
    record = acp.record(resumed.field("JOB_ID"))
    assert record.driver == "acp" and record.session_requested == session


# ------------------------------------------------------------------ 5. the small rules, as units
def asking_job(bridge: Bridge, expires_in: float = 60) -> tuple[Config, JobRecord]:
    """A running job (its supervisor: this process) waiting on a question."""
    cfg = load_config(bridge.config)
    store = JobStore.of(cfg)
    store.ensure()
    job_id = store.claim_id(b"asks")
    record = JobRecord(id=job_id, state=JobState.RUNNING, created_at=time.time(),
                              supervisor=ProcessId.of(psutil.Process()), questions=[{
                                  "id": "1-abcdef", "what": "run `rm -rf build`", "asked_at": time.time(),
                                  "expires_at": time.time() + expires_in,
                                  "expires_clock": machine_clock() + expires_in}])
    store.write(record)
    return cfg, record


def audit_lines(bridge: Bridge) -> list[dict[str, Any]]:
    path = bridge.tmp / "logs" / "audit.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_every_relayed_answer_leaves_one_audit_line(bridge):
    cfg, record = asking_job(bridge)
    answer_approval(cfg, record.id, "1-abcdef", "deny", "planner")
    [line] = [entry for entry in audit_lines(bridge) if entry.get("event") == "approval"]
    assert line["job_id"] == record.id and line["decision"] == "deny" and line["by"] == "planner"


@pytest.mark.parametrize(("response", "decision"), [
    ({"action": "accept", "content": {"allow": True}}, "allow"),
    ({"action": "accept", "content": {"allow": False}}, "deny"),
    ({"action": "decline"}, "deny"),
    ({"action": "cancel"}, None),
    ({"action": "accept", "content": {}}, None),
    ("accept", None),
], ids=["allow", "accepted-unchecked-denies", "declined", "cancelled-decides-nothing", "no-choice", "not-a-form"])
@pytest.mark.sdk_lines
def test_an_elicited_answer_is_allow_deny_or_nothing(response, decision):
    assert elicited_decision(response) == decision


@pytest.mark.sdk_lines
def test_a_question_already_shown_makes_the_next_wait_wait_for_its_answer_not_return_at_once(acp):
    """Issue 49: while a person decides, a planner polling hermes_status is not answered at once every time (4
    calls in 80 ms under Gemini CLI): the question it was shown is waited through, for the answer or wait_s."""
    acp.configure(approvals="ask", approval_timeout_s=60)
    with client_of(acp) as client:
        job_id = client.call("hermes_run", task="!ask=touch+asked.txt", wait_s=0).field("JOB_ID")
        asking = wait_question(client, job_id)
        started = time.monotonic()
        again = client.call("hermes_status", job_id=job_id, wait_s=3)
        waited = time.monotonic() - started
        assert again.field("STATUS") == "needs_approval" and waited >= 2.5, (waited, again.text)
        answer = threading.Timer(1.0, lambda: answer_approval(
            load_config(acp.config), job_id, asking.field("APPROVAL_ID"), "allow", "view"))
        answer.start()
        final = client.call("hermes_status", job_id=job_id, wait_s=30)  # the answer ends the wait, then the job
        answer.join()
        assert final.field("STATUS") == "ok", final.text


def test_a_waiting_call_returns_as_soon_as_a_question_nobody_in_it_can_answer_is_pending(bridge):
    import anyio

    cfg, record = asking_job(bridge)
    started = time.monotonic()
    view = anyio.run(wait_for_end, cfg, record.id, 30.0, None)
    assert view.pending_questions and time.monotonic() - started < 10


@pytest.mark.parametrize("approvals", ["deny", "ask"])
def test_hermes_yolo_mode_is_removed_unless_the_bridge_says_yolo(tmp_path, monkeypatch, approvals):
    monkeypatch.setenv("HERMES_YOLO_MODE", "1")
    cfg = Config(path=tmp_path / "config.json", approvals=approvals)
    assert "HERMES_YOLO_MODE" not in hermes_env(cfg)
    assert hermes_env(Config(path=tmp_path / "c.json", approvals="yolo"))["HERMES_YOLO_MODE"] == "1"


def test_over_a_managed_policy_the_bridges_mode_and_timeout_win_and_its_other_keys_stay(tmp_path, monkeypatch):
    import yaml

    managed = tmp_path / "managed"
    managed.mkdir()
    (managed / "config.yaml").write_text(yaml.safe_dump({"approvals": {"mode": "smart", "timeout": 9, "cron": "x"},
                                                         "model": {"default": "corp-model"}}))
    (managed / ".env").write_text("CORP_KEY=1\n")
    monkeypatch.setenv("HERMES_MANAGED_DIR", str(managed))
    folder = approval_policy_dir(42, tmp_path / "jobs" / "policies" / "20261205-120000-1")
    assert folder.stat().st_mode & 0o777 == 0o700
    policy = yaml.safe_load((folder / "config.yaml").read_text())
    assert policy == {"approvals": {"mode": "manual", "timeout": 42, "cron": "x", "single_query_mode": "deny"},
                      "model": {"default": "corp-model"}}
    assert (folder / ".env").read_text() == "CORP_KEY=1\n"


# ------------------------------------------------------------------ 6. a buggy or hostile `hermes acp` (issue 27)
def test_junk_from_hermes_is_ignored_and_noted_once_and_the_job_ends_as_hermes_ends_it(acp):
    with client_of(acp) as client:
        result = client.call("hermes_run", task="!junk !tool-sleep=1", wait_s=40)
    assert result.field("STATUS") == "ok", result.text
    log = (acp.jobs / f"{result.field('JOB_ID')}.log").read_text()
    for said in ("a session/update whose params are not an object",
                 "a session/request_permission whose params are not an object",
                 "a line from Hermes that is not a JSON-RPC message"):
        assert log.count(said) == 1, log
    assert "supervisor failed" not in result.text
    assert wait_gone(acp.traced_pids()) == []


def test_questions_asked_together_are_all_shown_and_two_answers_at_once_from_two_servers_claim_once(acp):
    acp.configure(approvals="ask", approval_timeout_s=120)
    with client_of(acp) as client, client_of(acp) as other:
        job_id = client.call("hermes_run", task="!asks=20", wait_s=0).field("JOB_ID")
        asking = wait_until(lambda: r if "QUESTIONS_WAITING: 22" in (r := client.call(
            "hermes_status", job_id=job_id, wait_s=5)).text else None, 40, "all 22 questions shown")
        ids = [line.split(": ", 1)[1] for line in asking.text.splitlines() if line.startswith("APPROVAL_ID: ")]
        assert len(ids) == QUESTIONS_SHOWN and len(set(ids)) == len(ids)
        answers: dict[str, Any] = {}

        def answer(name: str, who: BridgeClient, decision: str) -> None:
            answers[name] = who.call("hermes_approve", job_id=job_id, approval_id=ids[0], decision=decision)
        racing = [threading.Thread(target=answer, args=("allow", client, "allow")),
                  threading.Thread(target=answer, args=("deny", other, "deny"))]
        for thread in racing:
            thread.start()
        for thread in racing:
            thread.join()
        client.call("hermes_approve", job_id=job_id, approval_id=ids[1], decision="allow")
        client.call("hermes_cancel", job_id=job_id)
        final = client.wait_final(job_id)
    [won] = [name for name, result in answers.items() if not result.is_error]
    lost = answers["deny" if won == "allow" else "allow"]
    assert f"decided already: {won} by the planner" in lost.text, lost.text
    assert f"approval {ids[0]}: {won} by the planner (hermes_approve), applied" in answers[won].text
    assert final.field("STATUS") == "cancelled"
    allowed = 1 + (won == "allow")  # ids[1], and ids[0] if the allow won the race
    assert final.field("APPROVALS").startswith(f"22 questions answered ({allowed} allow, {22 - allowed} deny)")
    decisions = [d for d in acp.record(job_id).decisions if d["id"] == ids[0]]
    assert [d["decision"] for d in decisions] == [won]


def test_a_thousand_and_one_edits_leave_a_live_job_readable_and_cancellable(acp):
    with client_of(acp) as client:
        job_id = client.call("hermes_run", task="!many-edits=1001 !tool-sleep=60", wait_s=0).field("JOB_ID")
        wait_until(lambda: sum((acp.record(job_id).decided or {}).values()) == 1001, 60, "1001 edits decided")
        live = client.call("hermes_status", job_id=job_id, wait_s=0)
        cancelled = client.call("hermes_cancel", job_id=job_id)
    assert live.field("STATUS") == "running" and "APPROVALS: 1,001 questions answered (1001 allow)" in live.text
    assert cancelled.field("STATUS") == "cancelled", cancelled.text


def test_a_huge_non_ascii_answer_keeps_the_record_within_what_the_store_reads(acp):
    with client_of(acp) as client:
        result = client.call("hermes_run", task="!big-answer=1048576", wait_s=40)
    assert result.field("STATUS") == "ok", result.text
    record_path = acp.jobs / f"{result.field('JOB_ID')}.json"
    assert record_path.stat().st_size <= RECORD_MAX_BYTES
    assert "| FAKE ANSWER: !big-answer=1048576 " + "\u0436" * 100 in result.text


# ------------------------------------------------------------------ 7. allow for the rest of this job (issue 29)
def test_allow_for_job_allows_the_same_command_again_without_asking_and_uses_the_session_option(acp):
    acp.configure(approvals="ask", approval_timeout_s=60)
    with client_of(acp) as client:
        job_id = client.call("hermes_run", task="!ask-twice=touch+again.txt", wait_s=0).field("JOB_ID")
        asking = wait_question(client, job_id)
        answered = client.call("hermes_approve", job_id=job_id, approval_id=asking.field("APPROVAL_ID"),
                               decision="allow_for_job")
        final = client.wait_final(job_id)
    assert final.field("STATUS") == "ok", final.text
    assert "allow_for_job by the planner (hermes_approve), applied" in answered.text
    decided = approvals_of(final.text)
    assert len(decided) == 2 and decided[0].endswith("-> allow_for_job by the planner (hermes_approve)")
    assert "-> allow by the bridge: allowed for this job (first allowed at " in decided[1]
    assert "by the planner (hermes_approve))" in decided[1]
    assert "chose=allow_session,allow_once" in final.text  # Hermes' "for this session", never "always"


def test_allow_for_job_allows_only_that_exact_command_and_a_multi_line_command_is_asked_whole(acp):
    """One allow_for_job is not an allow for everything: another command is asked about; and a command of
    several lines is shown whole in the question (its first line alone could hide what it does)."""
    acp.configure(approvals="ask", approval_timeout_s=60)
    with client_of(acp) as client:
        job_id = client.call("hermes_run", task="!ask=touch+first.txt !ask-then=touch+second.txt\\nrm+-rf+third",
                             wait_s=0).field("JOB_ID")
        first = wait_question(client, job_id)
        client.call("hermes_approve", job_id=job_id, approval_id=first.field("APPROVAL_ID"), decision="allow_for_job")
        second = wait_until(lambda: r if (r := client.call("hermes_status", job_id=job_id, wait_s=5)).field(
            "APPROVAL_ID") not in (None, first.field("APPROVAL_ID")) else None, 30, "the second question")
        client.call("hermes_approve", job_id=job_id, approval_id=second.field("APPROVAL_ID"), decision="deny")
        final = client.wait_final(job_id)
    assert "touch second.txt\\nrm -rf third" in second.field("APPROVAL"), second.text
    assert (acp.root / "first.txt").exists() and not (acp.root / "second.txt").exists()
    assert "chose=allow_session,deny" in final.text


@pytest.mark.sdk_lines
def test_an_elicited_answer_can_allow_for_the_rest_of_the_job():
    assert elicited_decision({"action": "accept", "content": {"allow": True, "for_this_job": True}}) == (
        "allow_for_job")
    assert elicited_decision({"action": "accept", "content": {"allow": False, "for_this_job": True}}) == "deny"


def test_an_answer_after_the_job_ended_is_refused_and_listed_in_its_block(acp):
    """Hermes can decide a question by its own deadline without a word to the bridge (0.19.0 over ACP), then end:
    an answer arriving after that is refused and still listed, so nobody takes it for a decision."""
    with client_of(acp) as client:
        job_id = client.call("hermes_run", task="quick", wait_s=0).field("JOB_ID")
        final = client.wait_final(job_id)
        late = client.call("hermes_approve", job_id=job_id, approval_id="3-a1b2c3", decision="allow")
        after = client.call("hermes_status", job_id=job_id, wait_s=0)
    assert final.field("STATUS") == "ok", final.text
    refused(late, f"job {job_id} has ended", "there is no question to answer")
    assert after.field("LATE_ANSWERS").startswith("1 answer came after the question was decided (or the job ended)")
    assert "- 3-a1b2c3: allow by the planner (hermes_approve) at " in after.text
    assert after.field("STATUS") == "ok"
