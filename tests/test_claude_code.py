"""The real Claude Code, interactive (the sessions that declare the tasks extension), in tmux, against a
scripted Anthropic endpoint on 127.0.0.1: the model's hermes_run becomes a background MCP task, and the
model later receives its completion with the final block, without a single hermes_status call; a question
from Hermes becomes Claude Code's own dialog, and the user's answer reaches Hermes."""
import html
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_worktrees import make_repo

from conftest import require_component
from fake_anthropic import FakeAnthropic
from harness import CLAUDE_CODE, CLAUDE_CODE_VERSION, MCP_LINE, SERVER, Bridge, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.posix("tmux and the fake hermes"),
              pytest.mark.skipif(MCP_LINE < 2, reason="the tasks extension needs the 2.x SDK line")]
API_KEY = "sk-ant-api03-" + "t" * 80


class ClaudeInTmux:
    """Claude Code in a tmux session of its own (its own socket), with a throwaway HOME that has onboarding,
    the folder's trust dialog and the API key already accepted."""

    def __init__(self, bridge: Bridge, claude: Path, base_url: str, **server_env: str):
        self.socket = str(bridge.tmp / "tmux.sock")
        home = bridge.tmp / "claude-home"
        home.mkdir()
        (home / ".claude.json").write_text(json.dumps({
            "hasCompletedOnboarding": True, "lastOnboardingVersion": CLAUDE_CODE_VERSION,
            "customApiKeyResponses": {"approved": [API_KEY[-20:]], "rejected": []},
            "projects": {str(bridge.root): {"hasTrustDialogAccepted": True, "hasCompletedProjectOnboarding": True}}}))
        mcp_config = bridge.tmp / "mcp.json"
        mcp_config.write_text(json.dumps({"mcpServers": {"hermes": {
            "command": sys.executable, "args": [str(SERVER)], "env": dict(bridge.env, **server_env)}}}))
        env = {"HOME": str(home), "PATH": bridge.env["PATH"], "TERM": "xterm-256color", "ANTHROPIC_BASE_URL": base_url,
               "ANTHROPIC_API_KEY": API_KEY, "DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1",
               "DISABLE_ERROR_REPORTING": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
               "ENABLE_TOOL_SEARCH": "false"}  # the bridge's tools in the request itself, not behind a search
        command = [str(claude), "--mcp-config", str(mcp_config), "--strict-mcp-config", "--allowedTools", "mcp__hermes"]
        self.tmux("new-session", "-d", "-x", "200", "-y", "50", "-c", str(bridge.root),
                  "env", "-i", *(f"{key}={value}" for key, value in env.items()), *command)

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-S", self.socket, *args], capture_output=True, text=True, timeout=30).stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "0")

    def type(self, text: str) -> None:
        self.tmux("send-keys", "-t", "0", "-l", text)
        time.sleep(0.5)
        self.tmux("send-keys", "-t", "0", "Enter")

    def close(self) -> None:
        self.tmux("kill-server")


def tool_results_of(requests: list[dict]) -> list[dict]:
    return [block for request in requests for message in request["body"].get("messages", [])
            for block in (message.get("content") if isinstance(message.get("content"), list) else [])
            if isinstance(block, dict) and block.get("type") == "tool_result"]


def notification_of(requests: list[dict]) -> str | None:
    """The task notification Claude Code put before the model, if a request carried one."""
    for request in requests:
        for message in request["body"].get("messages", []):
            for block in message.get("content") if isinstance(message.get("content"), list) else []:
                text = block.get("text", "") if isinstance(block, dict) else ""
                if "<task-notification>" in text:
                    return text
    return None


def ask_for_a_run(session: ClaudeInTmux, api: FakeAnthropic, task: str) -> None:
    """Type the request until the model calls hermes_run: the prompt shows before the MCP servers are
    connected, and until then the model is offered no hermes tools."""
    wait_until(lambda: "❯" in session.screen() or None, 60, "Claude Code's prompt")
    for _ in range(6):
        def called_or_refused(refusals: int = session.screen().count("NO HERMES TOOLS")) -> object:
            return tool_results_of(api.requests()) or session.screen().count("NO HERMES TOOLS") > refusals or None

        session.type(f"HERMES_RUN: {task}")
        if wait_until(called_or_refused, 20, "the model's call or its answer") is not True:
            return
    raise AssertionError("Claude Code never offered the bridge's tools:\n" + session.screen())


def test_a_run_becomes_a_background_task_and_the_model_receives_its_completion(bridge):
    claude = require_component(CLAUDE_CODE, f"Claude Code {CLAUDE_CODE_VERSION}")
    if shutil.which("tmux") is None:
        require_component(Path("/usr/bin/tmux"), "tmux")
    with FakeAnthropic(bridge.tmp) as api:
        session = ClaudeInTmux(bridge, claude, api.base_url)
        try:
            ask_for_a_run(session, api, "build the site !sleep=12")
            footer = wait_until(lambda: s if "MCP task" in (s := session.screen()) else None, 60,
                                "the task in Claude Code's footer")
            notification = wait_until(lambda: notification_of(api.requests()), 90, "the task's notification")
            screen = wait_until(lambda: s if "HERMES REPORTED OK" in (s := session.screen()) else None, 30,
                                "the model's answer to the notification")
        finally:
            session.close()
    job_id = notification.split("<summary>MCP task ", 1)[1].split(" ", 1)[0]
    assert bridge.record(job_id).state.value == "ok"
    assert "<status>completed</status>" in notification and "STATUS: ok" in notification
    assert f"JOB_ID: {job_id}" in notification and "FAKE ANSWER: build the site" in notification
    tool_results = tool_results_of(api.requests())
    assert tool_results and "task notification" in json.dumps(tool_results[0])  # backgrounded, not waited on
    assert "STATUS: running" not in json.dumps(tool_results)  # not today's reply
    assert "MCP task" in footer and f"MCP task {job_id} (hermes/hermes_run) completed" in screen
    audit = (bridge.tmp / "logs" / "audit.log").read_text()
    assert "hermes_status" not in audit  # Claude Code polled the task itself; the model never called status


@pytest.mark.parametrize(("keys", "task", "decided"), [
    (("Space", "Down", "Down", "Enter"), "!ask=touch+asked.txt", ["allow"]),  # tick Allow, pass the second box
    (("Space", "Down", "Space", "Down", "Enter"), "!ask-twice=touch+asked.txt", ["allow_for_job", "allow"]),
], ids=["allow", "allow-for-the-rest-of-the-job"])
def test_a_question_from_hermes_is_claude_codes_own_dialog_and_the_users_answer_reaches_hermes(bridge, keys, task,
                                                                                              decided):
    claude = require_component(CLAUDE_CODE, f"Claude Code {CLAUDE_CODE_VERSION}")
    bridge.configure(approvals="ask", approval_timeout_s=120)
    with FakeAnthropic(bridge.tmp) as api:
        session = ClaudeInTmux(bridge, claude, api.base_url, FAKE_HERMES_ACP="1")
        try:
            ask_for_a_run(session, api, task)
            dialog = wait_until(lambda: s if "requests your input" in (s := session.screen()) else None, 60,
                                "Claude Code's dialog for the task's input request")
            assert not (bridge.root / "asked.txt").exists()
            for key in keys:
                session.tmux("send-keys", "-t", "0", key)
                time.sleep(0.5)
            notification = wait_until(lambda: notification_of(api.requests()), 60, "the task's notification")
        finally:
            session.close()
    job_id = notification.split("<summary>MCP task ", 1)[1].split(" ", 1)[0]
    assert f"Hermes (job {job_id}) asks to run `touch asked.txt` (dangerous)" in dialog
    assert "Allow for the rest of this job" in dialog
    assert "Hermes denies this by itself at" in dialog  # the deadline, in Claude Code's own dialog (issue 28)
    record = bridge.record(job_id)
    assert record.state.value == "ok" and (bridge.root / "asked.txt").exists()
    assert [d["decision"] for d in record.decisions] == decided
    assert record.decisions[0]["by"] == "the user (elicitation)"
    if len(decided) == 2:  # the same command asked again: allowed by the bridge, for the user's first answer
        assert record.decisions[1]["by"].startswith("the bridge: allowed for this job (first allowed at ")
    assert "STATUS: ok" in notification  # Claude Code escapes the result for its XML-like wrapper
    assert f"-> {decided[0]} by the user (elicitation)" in html.unescape(notification)


# ----------------------------------------------------------------- print mode: what the model reads of a result
def print_mode(bridge: Bridge, claude: Path, api: FakeAnthropic, prompt: str, **server_env: str) -> dict:
    """One `claude -p` turn in which the model calls one of the bridge's tools (HERMES_CALL); the
    tool_result the model was sent for it, as the scripted endpoint received it."""
    before = len(tool_results_of(api.requests()))
    home = bridge.tmp / "claude-print-home"
    home.mkdir(exist_ok=True)
    (home / ".claude.json").write_text(json.dumps({
        "hasCompletedOnboarding": True, "lastOnboardingVersion": CLAUDE_CODE_VERSION,
        "customApiKeyResponses": {"approved": [API_KEY[-20:]], "rejected": []}}))
    mcp_config = bridge.tmp / "mcp-print.json"
    mcp_config.write_text(json.dumps({"mcpServers": {"hermes": {
        "command": sys.executable, "args": [str(SERVER)], "env": dict(bridge.env, **server_env)}}}))
    env = {"HOME": str(home), "PATH": bridge.env["PATH"], "ANTHROPIC_BASE_URL": api.base_url,
           "ANTHROPIC_API_KEY": API_KEY, "DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1",
           "DISABLE_ERROR_REPORTING": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
           "ENABLE_TOOL_SEARCH": "false"}
    done = subprocess.run([str(claude), "-p", prompt, "--mcp-config", str(mcp_config), "--strict-mcp-config",
                           "--allowedTools", "mcp__hermes"], cwd=bridge.root, env=env, capture_output=True,
                          text=True, timeout=180, stdin=subprocess.DEVNULL)
    results = tool_results_of(api.requests())[before:]
    assert results, f"the model never got a tool_result: {done.stdout}\n{done.stderr}"
    return results[-1]


def read_by_the_model(tool_result: dict) -> str:
    content = tool_result.get("content")
    return content if isinstance(content, str) else "\n".join(
        block.get("text", "") for block in content or [] if isinstance(block, dict))


def test_in_print_mode_the_model_reads_every_tools_whole_status_block(bridge):
    """Claude Code's print mode hands the model a result's structuredContent instead of its text when both
    are there (DESIGN §17): the bridge sends none, so the model reads the whole block of each tool."""
    claude = require_component(CLAUDE_CODE, f"Claude Code {CLAUDE_CODE_VERSION}")
    with FakeAnthropic(bridge.tmp) as api:
        def call(tool: str, arguments: dict) -> str:
            return read_by_the_model(print_mode(bridge, claude, api, f"HERMES_CALL: {tool} {json.dumps(arguments)}"))

        finished = call("hermes_run", {"task": "say hi !session=20261203_101010_abcdef", "wait_s": 20})
        running = call("hermes_run", {"task": "long work !sleep=30", "wait_s": 0})
        assert "JOB_ID: " in running, f"the model did not read the status block: {running}"
        job_id = running.split("JOB_ID: ", 1)[1].split()[0]
        status = call("hermes_status", {"job_id": job_id, "wait_s": 0})
        cancelled = call("hermes_cancel", {"job_id": job_id})
    assert "STATUS: ok" in finished and "JOB_ID: " in finished and "SESSION_ID: 20261203_101010_abcdef" in finished
    assert "EXIT_CODE: 0" in finished and "say hi" in finished
    assert "STATUS: running" in running and "Do not re-run" in running
    assert "STATUS: running" in status and f"JOB_ID: {job_id}" in status and "Do not re-run" in status
    assert "STATUS: cancelled" in cancelled and f"JOB_ID: {job_id}" in cancelled
    assert not any('"job_id"' in text for text in (finished, running, status, cancelled))  # not the facts' JSON


def test_in_print_mode_the_model_reads_the_approval_instructions_and_the_landing(bridge):
    claude = require_component(CLAUDE_CODE, f"Claude Code {CLAUDE_CODE_VERSION}")
    repo = make_repo(bridge.root / "repo")
    bridge.configure(approvals="ask", approval_timeout_s=120, hermes_driver="acp")
    with FakeAnthropic(bridge.tmp) as api:
        def call(tool: str, arguments: dict) -> str:
            return read_by_the_model(print_mode(bridge, claude, api, f"HERMES_CALL: {tool} {json.dumps(arguments)}",
                                                FAKE_HERMES_ACP="1"))

        asking = call("hermes_run", {"task": "!ask=touch+asked.txt", "wait_s": 20})
        assert "APPROVAL_ID: " in asking, f"the model did not read the approval block: {asking}"
        job_id = asking.split("JOB_ID: ", 1)[1].split()[0]
        approval_id = asking.split("APPROVAL_ID: ", 1)[1].split()[0]
        denied = call("hermes_approve", {"job_id": job_id, "approval_id": approval_id, "decision": "deny"})
        worked = call("hermes_run", {"task": "!write=b.txt:hello", "cwd": str(repo), "isolation": "worktree",
                                     "wait_s": 30})
        landed = call("hermes_land", {"job_id": worked.split("JOB_ID: ", 1)[1].split()[0], "action": "merge"})
    assert "STATUS: needs_approval" in asking and "APPROVAL_ID: " in asking and "hermes_approve" in asking
    assert f"JOB_ID: {job_id}" in denied
    assert "STATUS: ok" in worked and "DIFF: " in worked
    assert "STATUS: ok" in landed and (repo / "b.txt").read_text() == "hello"


def test_in_print_mode_under_load_the_tools_are_there_every_run(bridge):
    """Issue 67: `claude -p` on a two-core machine at load 10 (ten busy processes made here), five runs in a
    row: each time the model finds the bridge's tools and reads hermes_health's block (the server answers
    initialize before the SDK is imported from the second start on: the first start here is before the load,
    as a person's earlier session would be)."""
    claude = require_component(CLAUDE_CODE, f"Claude Code {CLAUDE_CODE_VERSION}")
    with FakeAnthropic(bridge.tmp) as api:
        assert "BRIDGE: " in read_by_the_model(print_mode(bridge, claude, api, "HERMES_CALL: hermes_health {}"))
        spinning = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(10)]
        try:
            read = [read_by_the_model(print_mode(bridge, claude, api, "HERMES_CALL: hermes_health {}"))
                    for _ in range(5)]
        finally:
            for process in spinning:
                process.kill()
                process.wait()
    assert all("BRIDGE: claude-hermes-bridge" in text for text in read), read
