"""The ACP driver as a unit: AcpConversation fed Hermes' messages by hand over a pipe, and what it sends back,
records and writes to the log; AcpRun's outcome and its cached answers; the driver seam as the supervisor uses
it (a stop asks the driver first, then stops the tree). No process of Hermes is started here."""
import contextlib
import io
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from claude_hermes_bridge.acp_conversation import AcpConversation
from claude_hermes_bridge.config import DRIVER_NAMES, Config
from claude_hermes_bridge.drivers import DRIVERS, AcpRun, HermesRun, LaunchPlan, start_hermes
from claude_hermes_bridge.hermes_acp import COMMAND_SHOWN_CHARS
from claude_hermes_bridge.hermes_cli import exe_fingerprint, flags_cache_path
from claude_hermes_bridge.jobs import DECISIONS_KEPT, RECORD_MAX_BYTES, JobRecord, JobState, JobStore, Outcome, observe
from claude_hermes_bridge.processes import StopReport, stop_tree
from claude_hermes_bridge.render import render_status
from claude_hermes_bridge.safe_io import Refused, machine_clock, write_atomic
from claude_hermes_bridge.supervisor import Supervisor
from claude_hermes_bridge.tools import answer_approval
from harness import wait_until


class Collected(io.BytesIO):
    """The bridge's side of Hermes' stdin: keeps every line written, survives close()."""

    closed_by_bridge = False

    def close(self) -> None:
        self.closed_by_bridge = True


class FakeAcpProcess:
    """Stands in for the `hermes acp` process: Hermes' stdout is a pipe the test writes, its stdin collects."""

    def __init__(self) -> None:
        read_end, write_end = os.pipe()
        self.stdout = os.fdopen(read_end, "rb")
        self.hermes = os.fdopen(write_end, "wb")
        self.stdin = Collected()

    def say(self, message: dict[str, Any]) -> None:
        self.hermes.write(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")
        self.hermes.flush()

    def sent(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.stdin.getvalue().splitlines()]


class Talk:
    """One conversation under test, with its record, store, log and fake process."""

    def __init__(self, tmp_path: Path, approvals: str = "deny", session: str | None = None):
        root = tmp_path / "root"
        root.mkdir(exist_ok=True)
        self.cfg = Config(path=tmp_path / "config.json", allowed_roots=[str(root)],
                                 jobs_dir=str(tmp_path / "jobs"), approvals=approvals, approval_timeout_s=30)
        self.store = JobStore.of(self.cfg)
        self.store.ensure()
        job_id = self.store.claim_id(b"the task")
        self.record = JobRecord(id=job_id, cwd=str(root), session_requested=session, driver="acp",
                                       approval_mode=approvals, created_at=time.time())
        self.store.write(self.record)
        self.root = root
        self.log: list[str] = []
        self.proc = FakeAcpProcess()
        self.talk = AcpConversation(self.proc, self.record, self.cfg, self.store,  # type: ignore[arg-type]
                                           "the task", self.log.append)

    def pump_until(self, done: Any, what: str) -> Any:
        def probe() -> Any:
            self.talk.pump()
            return done()
        return wait_until(probe, 5, what, interval=0.02)

    def last_sent(self) -> dict[str, Any]:
        return self.proc.sent()[-1]

    def handshake(self) -> str:
        """initialize and session/new answered; the session id Hermes gave."""
        self.proc.say({"id": self.last_sent()["id"], "result": {"agentInfo": {"version": "0.22.2"}}})
        self.pump_until(lambda: self.last_sent()["method"] == "session/new", "session/new")
        session = "0b0e7c38-1d7b-4a4e-9b1a-6f1c2b9f2e11"
        self.proc.say({"id": self.last_sent()["id"], "result": {"sessionId": session}})
        self.pump_until(lambda: self.last_sent()["method"] == "session/prompt", "session/prompt")
        return session

    def permission(self, tool_call: dict[str, Any], request_id: int = 7) -> dict[str, Any]:
        """Hermes asks; the bridge's reply to that request."""
        options = [{"optionId": "allow_once", "kind": "allow_once"}, {"optionId": "deny", "kind": "reject_once"}]
        self.proc.say({"id": request_id, "method": "session/request_permission",
                       "params": {"sessionId": "s", "toolCall": tool_call, "options": options}})
        return self.pump_until(lambda: next((m for m in self.proc.sent() if m.get("id") == request_id
                                             and "result" in m), None), "the answer to the permission")


def edit(path: str | None) -> dict[str, Any]:
    content = [{"type": "diff", "path": path, "oldText": None, "newText": "x"}] if path is not None else []
    return {"toolCallId": "edit-approval-1", "kind": "edit", "status": "pending", "content": content,
            "rawInput": {"tool": "write_file", "arguments": {"path": path} if path is not None else {}}}


# ------------------------------------------------------------------ the handshake, in order
def test_initialize_offers_hermes_no_file_system_and_no_terminal(tmp_path):
    talk = Talk(tmp_path)
    [initialize] = talk.proc.sent()
    assert initialize["method"] == "initialize"
    assert initialize["params"]["clientCapabilities"] == {"fs": {"readTextFile": False, "writeTextFile": False},
                                                          "terminal": False}


def test_the_handshake_goes_initialize_new_session_then_the_prompt_with_the_task(tmp_path):
    talk = Talk(tmp_path)
    session = talk.handshake()
    methods = [message["method"] for message in talk.proc.sent()]
    assert methods == ["initialize", "session/new", "session/prompt"]
    new, prompt = talk.proc.sent()[1:]
    assert new["params"] == {"cwd": str(talk.root), "mcpServers": []}
    assert prompt["params"] == {"sessionId": session, "prompt": [{"type": "text", "text": "the task"}]}
    assert talk.store.read(talk.record.id).session_id == session


def test_a_resume_loads_its_session_and_a_cancel_during_the_load_reaches_it(tmp_path):
    session = "0b0e7c38-1d7b-4a4e-9b1a-6f1c2b9f2e11"
    talk = Talk(tmp_path, session=session)
    talk.proc.say({"id": talk.last_sent()["id"], "result": {}})
    load = talk.pump_until(lambda: talk.last_sent() if talk.last_sent()["method"] == "session/load" else None,
                           "session/load")
    assert load["params"] == {"sessionId": session, "cwd": str(talk.root), "mcpServers": []}
    talk.talk.cancel()
    assert talk.last_sent() == {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session}}


def test_an_error_reply_ends_the_conversation_naming_the_step(tmp_path):
    talk = Talk(tmp_path)
    talk.proc.say({"id": talk.last_sent()["id"], "error": {"code": -32603, "message": "boom"}})
    talk.pump_until(lambda: talk.talk.finished, "the failure")
    assert talk.talk.outcome(1).reason == "Hermes answered initialize with an error: boom"


def test_a_reply_to_an_id_never_asked_is_ignored(tmp_path):
    talk = Talk(tmp_path)
    talk.proc.say({"id": 999, "result": {"sessionId": "forged"}})
    talk.proc.say({"id": talk.last_sent()["id"], "result": {}})
    talk.pump_until(lambda: talk.last_sent()["method"] == "session/new", "session/new")
    for _ in range(5):
        talk.talk.pump()
    assert talk.talk.session_id is None and talk.talk.failure is None and len(talk.proc.sent()) == 2


def test_a_refusal_ends_the_job_with_the_reason_that_explains_it(tmp_path):
    talk = Talk(tmp_path)
    talk.handshake()
    talk.proc.say({"id": talk.last_sent()["id"], "result": {"stopReason": "refusal"}})
    talk.pump_until(lambda: talk.talk.finished, "the prompt's reply")
    outcome = talk.talk.outcome(0)
    assert outcome.state is JobState.ERROR
    assert "refused the prompt (stopReason refusal)" in (outcome.reason or "")
    assert "a session made with the CLI cannot be continued over ACP" in (outcome.reason or "")


# ------------------------------------------------------------------ events
def test_a_failed_tool_call_shows_as_failed_and_its_output_reaches_the_log(tmp_path):
    talk = Talk(tmp_path)
    talk.handshake()
    talk.proc.say({"method": "session/update", "params": {"update": {
        "sessionUpdate": "tool_call", "kind": "execute", "content": [{"type": "content", "content": {
            "type": "text", "text": "$ make build"}}]}}})
    talk.pump_until(lambda: (talk.record.acp or {}).get("tool_status") == "running", "the tool call")
    talk.proc.say({"method": "session/update", "params": {"update": {
        "sessionUpdate": "tool_call_update", "status": "failed", "content": [{"type": "content", "content": {
            "type": "text", "text": "make: *** No rule to make target"}}]}}})
    talk.pump_until(lambda: (talk.record.acp or {}).get("tool_status") == "failed", "the failed update")
    assert talk.store.read(talk.record.id).acp["tool_status"] == "failed"  # type: ignore[index]
    assert any("failed" in line and "No rule to make target" in line for line in talk.log)


# ------------------------------------------------------------------ questions decided by the bridge
@pytest.mark.parametrize(("path", "why"), [("../outside.txt", "outside"), ("link/escape.txt", "outside"),
                                       (None, "cannot tell which files")],
                         ids=["climbs-out", "through-a-symlink", "no-path"])
def test_an_edit_that_leaves_the_roots_or_names_no_path_is_denied(tmp_path, path, why):
    talk = Talk(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    (talk.root / "link").symlink_to(tmp_path / "elsewhere")
    talk.handshake()
    reply = talk.permission(edit(path))
    assert reply["result"] == {"outcome": {"outcome": "selected", "optionId": "deny"}}
    [decision] = talk.record.decisions
    assert decision["decision"] == "deny" and why in decision["by"] and "inside" not in decision["by"]


def test_an_edit_inside_the_roots_is_allowed(tmp_path):
    talk = Talk(tmp_path)
    talk.handshake()
    reply = talk.permission(edit("notes/inside.txt"))
    assert reply["result"] == {"outcome": {"outcome": "selected", "optionId": "allow_once"}}


def test_an_answer_applies_only_to_the_question_whose_id_it_names(tmp_path):
    talk = Talk(tmp_path, approvals="ask")
    talk.handshake()
    talk.proc.say({"id": 7, "method": "session/request_permission", "params": {"toolCall": {
        "kind": "execute", "rawInput": {"command": "rm -rf build", "description": "delete"}}, "options": [
        {"optionId": "allow_once", "kind": "allow_once"}, {"optionId": "deny", "kind": "reject_once"}]}})
    [pending] = talk.pump_until(lambda: talk.record.questions, "the question")
    write_atomic(talk.store.answers_path(talk.record.id),
                        json.dumps({"9-abcdef": {"decision": "allow", "by": "planner"}}).encode())
    for _ in range(5):
        talk.talk.pump()
    assert talk.record.questions == [pending] and not any(m.get("id") == 7 for m in talk.proc.sent())
    answer_approval(talk.cfg, talk.record.id, pending["id"], "deny", "planner")
    reply = talk.pump_until(lambda: next((m for m in talk.proc.sent() if m.get("id") == 7), None), "the answer")
    assert reply["result"]["outcome"]["optionId"] == "deny"


def test_an_answer_after_the_deadline_is_never_recorded_as_the_decision(tmp_path):
    talk = Talk(tmp_path, approvals="ask")
    talk.handshake()
    talk.proc.say({"id": 7, "method": "session/request_permission", "params": {"toolCall": {
        "kind": "execute", "rawInput": {"command": "rm -rf build"}}, "options": []}})
    [pending] = talk.pump_until(lambda: talk.record.questions, "the question")
    talk.record.questions = [{**pending, "expires_clock": machine_clock() - 1}]
    talk.store.write(talk.record)
    with pytest.raises(Refused, match="came too late"):
        answer_approval(talk.cfg, talk.record.id, pending["id"], "allow", "planner")
    write_atomic(talk.store.answers_path(talk.record.id),
                        json.dumps({pending["id"]: {"decision": "allow", "by": "planner"}}).encode())
    talk.talk.pump()
    [decision] = talk.record.decisions
    assert decision["decision"] == "deny" and decision["by"].startswith("Hermes itself")


# ------------------------------------------------------------------ AcpRun
def fingerprinted(cfg: Config, exe: Path) -> dict[str, Any]:
    cache = {exe_fingerprint(str(exe)): ["--query"], exe_fingerprint(str(exe)) + "|acp": {
        "acp": True, "at": time.time()}}
    flags_cache_path(cfg).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(flags_cache_path(cfg), json.dumps(cache).encode())
    return cache


def test_hermes_acp_ending_without_a_session_forgets_that_it_speaks_acp_and_keeps_the_cli_probe(tmp_path):
    talk = Talk(tmp_path)
    exe = tmp_path / "hermes"
    exe.write_text("#!/bin/sh\n")
    cache = fingerprinted(talk.cfg, exe)
    run = AcpRun(talk.cfg, talk.store, talk.record, str(exe), talk.log.append)
    run.conversation = talk.talk
    assert run.outcome(1).state is JobState.ERROR
    left = json.loads(flags_cache_path(talk.cfg).read_text())
    assert left == {key: value for key, value in cache.items() if not key.endswith("|acp")}


def test_every_driver_name_has_its_driver():
    assert set(DRIVERS) == set(DRIVER_NAMES)
    assert all(issubclass(driver, HermesRun) for driver in DRIVERS.values())


class Recorder(HermesRun):
    """A driver that runs a sleeping process and records what the supervisor asked of it, and when."""

    stop_grace_s = 0.6
    calls: list[tuple[str, float]] = []

    @classmethod
    def plan(cls, cfg: Any, exe: str, record: Any, task: str, folder: str, task_path: Any,  # noqa: ARG003
             probe: Any) -> LaunchPlan:  # noqa: ARG003
        return LaunchPlan([sys.executable, "-c", "import time; time.sleep(60)"], ["sleeper"], folder, None, [])

    @staticmethod
    def start_default(argv: list[str], folder: str, stdin: Any, env: dict[str, str]) -> subprocess.Popen[bytes]:
        Recorder.calls.append(("start", time.monotonic()))
        return start_hermes(argv, folder, env, stdin, None, None)

    def start(self, plan: LaunchPlan, env: dict[str, str]) -> subprocess.Popen[bytes]:
        return self.start_process(plan.argv, plan.folder, subprocess.DEVNULL, env)

    def ask_to_stop(self) -> None:
        Recorder.calls.append(("ask_to_stop", time.monotonic()))

    def outcome(self, exit_code: int) -> Outcome:
        return Outcome(JobState.OK, exit_code, None)

    def session(self, exit_code: int | None) -> tuple[str | None, str | None]:  # noqa: ARG002
        return None, None


def supervised_by(driver: type[HermesRun], tmp_path: Path, monkeypatch: Any) -> tuple[Talk, Supervisor]:
    """A job whose supervisor (in this process) runs the given driver in place of ACP's."""
    talk = Talk(tmp_path)
    monkeypatch.setitem(DRIVERS, "acp", driver)
    exe = tmp_path / "hermes"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    talk.cfg.hermes_exe = str(exe)
    talk.record.timeout_s = 60
    talk.store.write(talk.record)
    talk.store.task_path(talk.record.id).write_text("t")
    return talk, Supervisor(talk.record.id, talk.cfg, talk.store)


@pytest.mark.posix("the sleeper is stopped with POSIX signals")
def test_a_stop_asks_the_driver_first_and_stops_the_tree_only_after_its_grace(tmp_path, monkeypatch):
    talk, supervisor = supervised_by(Recorder, tmp_path, monkeypatch)
    stopped: list[float] = []

    def recording_stop_tree(*args: Any, **kwargs: Any) -> StopReport:
        stopped.append(time.monotonic())
        return stop_tree(*args, **kwargs)
    monkeypatch.setattr("claude_hermes_bridge.job_watching.stop_tree", recording_stop_tree)
    Recorder.calls = []

    def cancel_once_started() -> None:
        wait_until(lambda: Recorder.calls, 10, "the start")
        talk.store.cancel_path(talk.record.id).write_text("")
    threading.Thread(target=cancel_once_started, daemon=True).start()
    supervisor.run()
    final = talk.store.read(talk.record.id)
    assert final.state is JobState.CANCELLED
    names = [name for name, _ in Recorder.calls]
    assert names == ["start", "ask_to_stop"]
    asked_at = Recorder.calls[1][1]
    assert stopped and stopped[0] >= asked_at + Recorder.stop_grace_s


# ------------------------------------------------------------------ what a buggy or hostile Hermes sends (issue 27)
def permission(talk: Talk, request_id: Any, command: str) -> None:
    talk.proc.say({"id": request_id, "method": "session/request_permission", "params": {"toolCall": {
        "kind": "execute", "rawInput": {"command": command, "description": "dangerous"}}, "options": [
        {"optionId": "allow_once", "kind": "allow_once"}, {"optionId": "deny", "kind": "reject_once"}]}})


def replies_to(talk: Talk, request_id: Any) -> list[dict[str, Any]]:
    return [m for m in talk.proc.sent() if "method" not in m and m.get("id") == request_id]


@pytest.mark.parametrize("message", [
    {"method": "session/update", "params": [1, 2]},
    {"id": 900, "method": "session/request_permission", "params": "run everything"},
    {"id": 901, "method": "session/request_permission", "params": {"toolCall": {"kind": "execute"}, "options": 5}},
    {"id": 902, "method": "session/request_permission", "params": {"toolCall": "x", "options": ["allow"]}},
    {"method": "session/update", "params": {"update": {"sessionUpdate": "tool_call", "kind": ["x"],
                                                       "content": 7, "rawInput": []}}},
    {"method": "session/update", "params": {"update": {"sessionUpdate": "agent_message_chunk", "content": [3]}}},
], ids=["update-params-a-list", "permission-params-a-string", "options-a-number", "tool-call-a-string",
        "tool-call-of-wrong-types", "chunk-of-numbers"])
def test_a_message_of_the_wrong_shape_is_ignored_and_the_conversation_goes_on(tmp_path, message):
    talk = Talk(tmp_path)
    session = talk.handshake()
    talk.proc.say(message)
    talk.proc.say({"method": "session/update", "params": {"sessionId": session, "update": {
        "sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "still here"}}}})
    talk.pump_until(lambda: (talk.record.acp or {}).get("answer") == "still here", "the next message handled")
    if "id" in message:  # a request is never left without a reply
        assert len(replies_to(talk, message["id"])) == 1


@pytest.mark.parametrize("line", [b"this is not json", b"[" * 200_000 + b"]" * 200_000, b'"a string"', b"\xff\xfe"],
                         ids=["not-json", "nested-200000-deep", "not-an-object", "not-utf8"])
def test_a_line_that_is_no_message_is_noted_once_and_the_reader_lives_on(tmp_path, line):
    talk = Talk(tmp_path)
    talk.handshake()
    for _ in range(3):
        talk.proc.hermes.write(line + b"\n")
    talk.proc.hermes.flush()
    prompt = talk.last_sent()
    talk.proc.say({"id": prompt["id"], "result": {"stopReason": "end_turn"}})
    talk.pump_until(lambda: talk.talk.finished, "the prompt's reply, read after the bad lines")
    assert talk.talk.reader.is_alive()
    assert sum("ignored" in entry for entry in talk.log) == 1, talk.log


def test_a_thousand_questions_at_once_are_all_kept_each_with_its_own_id_and_all_expire_at_the_end(tmp_path):
    talk = Talk(tmp_path, approvals="ask")
    talk.handshake()
    for n in range(998):
        permission(talk, n, f"rm -rf ./build-{n}")
    permission(talk, 0, "rm -rf ./reused-id")
    permission(talk, None, "rm -rf ./null-id")
    talk.pump_until(lambda: len(talk.record.questions) == 1000, "every question kept")
    on_disk = talk.store.read(talk.record.id)
    assert len({q["id"] for q in on_disk.questions}) == 1000
    view = observe(on_disk, talk.store.root)
    block = render_status(view, talk.cfg)
    assert "STATUS: needs_approval" in block and "QUESTIONS_WAITING: 1000" in block
    permission(talk, 5000, "rm -rf ./one-too-many")  # past what a record keeps: the bridge denies at once
    [reply] = talk.pump_until(lambda: replies_to(talk, 5000), "the bridge's own answer")
    assert reply["result"]["outcome"]["optionId"] == "deny"
    assert "1,000 questions were already waiting" in talk.record.decisions[-1]["by"]
    first, second = on_disk.questions[:2]
    answer_approval(talk.cfg, talk.record.id, second["id"], "allow", "planner")
    answer_approval(talk.cfg, talk.record.id, first["id"], "deny", "planner")
    talk.pump_until(lambda: len(replies_to(talk, 1)) == 1 and len(replies_to(talk, 0)) == 1, "the two answers")
    assert replies_to(talk, 1)[0]["result"]["outcome"]["optionId"] == "allow_once"
    assert replies_to(talk, 0)[0]["result"]["outcome"]["optionId"] == "deny"
    talk.talk.drain()
    assert talk.record.questions == []
    assert talk.record.decided == {"allow": 1, "deny": 1000}
    assert len(replies_to(talk, 0)) == 1  # the answered one; Hermes stopped waiting for the rest by itself
    assert len(talk.record.decisions) == DECISIONS_KEPT
    JobStore.of(talk.cfg).read(talk.record.id)  # still readable


def test_a_second_answer_to_a_question_is_refused_naming_the_first_and_only_the_first_is_applied(tmp_path):
    talk = Talk(tmp_path, approvals="ask")
    talk.handshake()
    permission(talk, 7, "rm -rf build")
    [question] = talk.pump_until(lambda: talk.record.questions, "the question")
    answer_approval(talk.cfg, talk.record.id, question["id"], "allow", "user")
    with pytest.raises(Refused, match=r"decided already: allow by the user \(elicitation\)"):
        answer_approval(talk.cfg, talk.record.id, question["id"], "deny", "planner")
    talk.pump_until(lambda: replies_to(talk, 7), "the answer applied")
    with pytest.raises(Refused, match="decided already: allow by the user"):
        answer_approval(talk.cfg, talk.record.id, question["id"], "deny", "planner")
    assert [m["result"]["outcome"]["optionId"] for m in replies_to(talk, 7)] == ["allow_once"]
    [decision] = talk.record.decisions
    assert decision["decision"] == "allow" and decision["by"] == "the user (elicitation)"


def test_answers_racing_from_two_threads_are_claimed_once(tmp_path):
    talk = Talk(tmp_path, approvals="ask")
    talk.handshake()
    permission(talk, 7, "rm -rf build")
    [question] = talk.pump_until(lambda: talk.record.questions, "the question")
    outcomes: list[str] = []

    def answer(decision: str, by: str) -> None:
        try:
            answer_approval(talk.cfg, talk.record.id, question["id"], decision, by)
            outcomes.append(f"relayed {decision}")
        except Refused as exc:
            outcomes.append(str(exc))
    threads = [threading.Thread(target=answer, args=pair) for pair in [("allow", "user"), ("deny", "planner")] * 4]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    [won] = [outcome for outcome in outcomes if outcome.startswith("relayed")]
    assert all("decided already: " + won.split()[1] in o for o in outcomes if o != won), outcomes
    talk.pump_until(lambda: replies_to(talk, 7), "the answer applied")
    assert talk.record.decisions[0]["decision"] == won.split()[1]


def test_a_folder_planted_at_the_answers_name_is_moved_aside_and_the_question_stays_answerable(tmp_path):
    talk = Talk(tmp_path, approvals="ask")
    talk.handshake()
    permission(talk, 7, "rm -rf build")
    [question] = talk.pump_until(lambda: talk.record.questions, "the question")
    planted = talk.store.answers_path(talk.record.id)
    planted.mkdir()
    for _ in range(3):
        talk.talk.pump()  # the supervisor reads past it
    assert talk.record.questions == [question]
    answer_approval(talk.cfg, talk.record.id, question["id"], "deny", "planner")
    reply = talk.pump_until(lambda: replies_to(talk, 7), "the answer applied")
    assert reply[0]["result"]["outcome"]["optionId"] == "deny" and planted.is_file()


def test_every_decision_is_audited_where_it_is_applied_the_bridges_own_and_expiries_too(tmp_path):
    talk = Talk(tmp_path, approvals="ask")
    talk.cfg.logs_dir = str(tmp_path / "logs")
    talk.handshake()
    talk.permission(edit("inside.txt"), request_id=1)
    talk.permission(edit("../outside.txt"), request_id=2)
    permission(talk, 3, "rm -rf build")
    talk.pump_until(lambda: talk.record.questions, "the question")
    talk.talk.drain()
    lines = [json.loads(line) for line in (tmp_path / "logs" / "audit.log").read_text().splitlines()]
    decisions = [(line["decision"], line["by"].split(":")[0]) for line in lines if line["event"] == "decision"]
    assert decisions == [("allow", "the bridge"), ("deny", "the bridge"), ("deny", "nobody")]


def test_a_thousand_and_one_allowed_edits_and_a_huge_answer_keep_the_record_readable(tmp_path):
    talk = Talk(tmp_path)
    talk.handshake()
    for n in range(1001):
        talk.proc.say({"id": n, "method": "session/request_permission", "params": {"toolCall": edit(f"n/{n}.txt"),
                                                                                   "options": []}})
    talk.pump_until(lambda: sum((talk.record.decided or {}).values()) == 1001, "1001 edits decided")
    talk.proc.say({"method": "session/update", "params": {"update": {
        "sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "\u0436\u0001" * (1 << 19)}}}})
    talk.pump_until(lambda: len((talk.record.acp or {}).get("answer", "")) > 1000, "the answer")
    assert talk.store.record_path(talk.record.id).stat().st_size < RECORD_MAX_BYTES
    on_disk = talk.store.read(talk.record.id)
    assert on_disk.decided == {"allow": 1001} and len(on_disk.decisions) == DECISIONS_KEPT


@pytest.mark.parametrize("raw", [True, False], ids=["raw-input", "content-only"])
def test_the_whole_multi_line_command_is_what_the_question_shows(tmp_path, raw):
    """From Hermes' own argument, or without it from the content's `$ ` line and every line after it."""
    talk = Talk(tmp_path, approvals="ask")
    talk.handshake()
    command = "echo updating the docs index\nrm -rf ./build"
    raw_input = {"rawInput": {"command": command, "description": "recursive delete"}} if raw else {}
    talk.proc.say({"id": 7, "method": "session/request_permission", "params": {"toolCall": {
        "kind": "execute", "title": "recursive delete: echo updating the docs index",
        "content": [{"type": "content", "content": {"type": "text",
                                                    "text": f"recursive delete\n$ {command}"}}],
        **raw_input}, "options": []}})
    [question] = talk.pump_until(lambda: talk.record.questions, "the question")
    assert question["what"] == ("run `echo updating the docs index\\nrm -rf ./build`"
                                + (" (recursive delete)" if raw else ""))


def test_a_command_too_long_to_show_whole_says_so_and_its_whole_text_is_in_the_log(tmp_path):
    talk = Talk(tmp_path, approvals="ask")
    talk.handshake()
    command = "echo start; " + "x" * 5000 + "; rm -rf ./hidden-at-the-end"
    permission(talk, 7, command)
    [question] = talk.pump_until(lambda: talk.record.questions, "the question")
    what = question["what"]
    assert what.startswith("run `echo start; ") and "rm -rf ./hidden-at-the-end`" in what
    assert f"[... {len(command) - COMMAND_SHOWN_CHARS:,} characters NOT SHOWN ...]" in what
    assert "too long to show whole" in what and len(what) < 1400
    assert any(command in entry for entry in talk.log)


class FailingDriver(Recorder):
    """Starts a sleeping process (and one child of its own), then fails in the supervisor's loop."""

    @classmethod
    def plan(cls, cfg: Any, exe: str, record: Any, task: str, folder: str, task_path: Any,  # noqa: ARG003
             probe: Any) -> LaunchPlan:  # noqa: ARG003
        code = "import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"
        return LaunchPlan([sys.executable, "-c", code], ["sleeper"], folder, None, [])

    def start(self, plan: LaunchPlan, env: dict[str, str]) -> subprocess.Popen[bytes]:
        self.sleeper = super().start(plan, env)
        return self.sleeper

    def pump(self) -> None:
        """Fails once the sleeper's child exists (a loaded machine may take seconds to start it)."""
        with contextlib.suppress(psutil.Error):
            if psutil.Process(self.sleeper.pid).children():
                raise RuntimeError("a bug in the loop")


@pytest.mark.posix("the sleeper is stopped with POSIX signals")
def test_a_failing_supervisor_stops_the_tree_before_it_writes_the_outcome(tmp_path, monkeypatch):
    talk, supervisor = supervised_by(FailingDriver, tmp_path, monkeypatch)
    supervisor.run()
    final = talk.store.read(talk.record.id)
    assert final.state is JobState.ERROR and "the supervisor failed (RuntimeError: a bug in the loop)" in (
        final.reason or "")
    assert "2 processes" in (final.reason or ""), final.reason
    assert final.hermes is not None and final.hermes.process() is None
    assert [seen.pid for seen in final.tree if seen.process()] == []


def test_a_relative_edit_is_decided_only_until_a_command_may_have_moved_hermes_folder(tmp_path):
    session = "0b0e7c38-1d7b-4a4e-9b1a-6f1c2b9f2e11"
    talk = Talk(tmp_path, session=session)
    talk.proc.say({"id": talk.last_sent()["id"], "result": {"agentInfo": {"version": "0.22.2"}}})
    talk.pump_until(lambda: talk.last_sent()["method"] == "session/load", "session/load")
    replayed = {"sessionUpdate": "tool_call", "kind": "execute", "rawInput": {"command": "cd /"}}
    talk.proc.say({"method": "session/update", "params": {"update": replayed}})  # history, as a load replays it
    talk.proc.say({"id": talk.last_sent()["id"], "result": {}})
    talk.pump_until(lambda: talk.last_sent()["method"] == "session/prompt", "session/prompt")
    before = talk.permission(edit("notes/a.txt"), request_id=1)
    talk.proc.say({"method": "session/update", "params": {"update": {**replayed, "rawInput": {"command": "cd /tmp"}}}})
    talk.pump_until(lambda: talk.talk.questions.folder_may_have_moved, "the command seen")
    after = talk.permission(edit("notes/b.txt"), request_id=2)
    absolute = talk.permission(edit(str(talk.root / "notes" / "c.txt")), request_id=3)
    assert [r["result"]["outcome"]["optionId"] for r in (before, after, absolute)] == ["allow_once", "deny",
                                                                                        "allow_once"]
    assert "is relative, and a command Hermes ran may have changed its folder" in talk.record.decisions[1]["by"]


# ------------------------------------------------------------------ steers (issue 50's pins)
def write_steer(talk: Talk, steer_id: str, text: str = "use tabs") -> None:
    """A steer as the server relays it (steer.add_steer): appended to the job's steer file."""
    waiting = talk.store.steers_file(talk.record.id)
    write_atomic(talk.store.steers_path(talk.record.id), json.dumps(
        [*waiting, {"id": steer_id, "text": text, "when": "now", "by": "planner", "at": time.time()}]).encode())


def steer_prompts(talk: Talk) -> list[dict[str, Any]]:
    return [message for message in talk.proc.sent() if message.get("method") == "session/prompt"
            and message["params"]["prompt"][0]["text"].startswith("/steer ")]


def test_a_steer_waits_until_hermes_has_claimed_the_turn_then_is_sent_once(tmp_path):
    talk = Talk(tmp_path)
    session = talk.handshake()
    write_steer(talk, "steer-1")
    for _ in range(5):  # the prompt is just sent and Hermes has said nothing of its turn yet
        talk.talk.pump()
        time.sleep(0.02)
    assert steer_prompts(talk) == []
    talk.proc.say({"method": "session/update", "params": {"sessionId": session, "update": {
        "sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "working"}}}})
    [sent] = talk.pump_until(lambda: steer_prompts(talk) or None, "the steer sent")
    assert sent["params"] == {"sessionId": session, "prompt": [{"type": "text", "text": "/steer use tabs"}]}
    for _ in range(3):
        talk.talk.pump()
    assert len(steer_prompts(talk)) == 1
    assert [(steer["id"], steer["state"]) for steer in talk.store.read(talk.record.id).steers] == [("steer-1", "sent")]


def test_a_steer_hermes_refused_is_recorded_refused_and_one_it_took_acknowledged(tmp_path):
    talk = Talk(tmp_path)
    session = talk.handshake()
    chunk = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "working"}}
    talk.proc.say({"method": "session/update", "params": {"sessionId": session, "update": chunk}})
    for steer_id, reply in (("steer-1", "\u26a0 Steer failed: no active tool batch"),
                            ("steer-2", "\u23e9 Redirected the active turn")):
        write_steer(talk, steer_id)
        count = int(steer_id[-1])
        sent = talk.pump_until(lambda count=count: steer_prompts(talk)[-1] if len(steer_prompts(talk)) == count
                               else None, f"{steer_id} sent")
        talk.proc.say({"method": "session/update", "params": {"sessionId": session, "update": {
            **chunk, "content": {"type": "text", "text": reply}}}})
        talk.proc.say({"id": sent["id"], "result": {"stopReason": "end_turn"}})
        talk.pump_until(lambda steer_id=steer_id: next((s for s in talk.record.steers if s["id"] == steer_id
                                                        and s["state"] != "sent"), None), f"{steer_id} settled")
    assert [(s["id"], s["state"], s["hermes"]) for s in talk.store.read(talk.record.id).steers] == [
        ("steer-1", "refused", "\u26a0 Steer failed: no active tool batch"),
        ("steer-2", "acknowledged", "\u23e9 Redirected the active turn")]
    assert "Redirected" not in (talk.record.acp or {}).get("answer", "")  # a steer's reply is not Hermes' final text


def test_a_steer_relayed_after_the_last_look_is_in_the_record_as_not_delivered(tmp_path):
    talk = Talk(tmp_path)
    session = talk.handshake()
    talk.proc.say({"id": talk.last_sent()["id"], "result": {"stopReason": "end_turn"}})
    talk.pump_until(lambda: talk.talk.finished, "the turn's end")
    write_steer(talk, "steer-late")  # the server relayed it as the turn ended: nothing sends it now
    talk.proc.hermes.close()
    talk.talk.drain()
    [late] = talk.store.read(talk.record.id).steers
    assert (late["id"], late["state"]) == ("steer-late", "not delivered")
    assert steer_prompts(talk) == [] and session
