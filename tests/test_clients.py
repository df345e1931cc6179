"""Independent MCP clients: the MCP Inspector CLI (npm), and a Claude Desktop-style config entry."""
import json
import subprocess
import sys

import pytest

from claude_hermes_bridge.cli import either
from claude_hermes_bridge.jobs import JobState
from claude_hermes_bridge.preflight import dependency_version, version_tuple
from conftest import require_component
from harness import APP_ONLY_TOOLS, EXPECTED_ARGS, INSPECTOR, READ_ONLY, SERVER, BridgeClient

pytestmark = [pytest.mark.e2e, pytest.mark.posix("the fake hermes is a shell script")]


@pytest.fixture
def inspector(bridge):
    launcher = require_component(INSPECTOR, "the MCP Inspector CLI")
    home = bridge.tmp / "inspector-home"
    home.mkdir()

    def run(method, *extra):
        # the connect timeout is 15 s by default; a loaded machine (the suite beside the Windows lane) passed it
        argv = ["node", str(launcher), "--cli", "-q", "--format", "json", "--connect-timeout", "60000",
                "-e", f"HERMES_BRIDGE_CONFIG={bridge.config}", "-e", f"FAKE_HERMES_TRACE={bridge.trace}",
                sys.executable, str(SERVER), "--method", method, *extra]
        done = subprocess.run(argv, env=dict(bridge.env, HOME=str(home)), capture_output=True, text=True,
                              timeout=120, stdin=subprocess.DEVNULL)
        payload = json.loads(done.stdout or done.stderr or "{}")
        return done.returncode, payload
    return run


def tool_text(payload):
    return "\n".join(c["text"] for c in payload["result"]["content"] if c["type"] == "text")


def field(text, name):
    return next(line.split(": ", 1)[1] for line in text.splitlines() if line.startswith(name + ": "))


def test_inspector_sees_instructions_tools_and_annotations(bridge, inspector):
    code, payload = inspector("initialize")
    assert code == 0, payload
    assert str(bridge.root) in payload["result"]["instructions"]
    code, payload = inspector("tools/list")
    assert code == 0, payload
    tools = {t["name"]: t for t in payload["result"]["tools"]}
    assert set(tools) == set(EXPECTED_ARGS) - APP_ONLY_TOOLS  # the Inspector declares no MCP Apps
    for name, tool in tools.items():
        assert tool["annotations"]["readOnlyHint"] is (name in READ_ONLY)
        assert set(tool["inputSchema"].get("required", [])) == EXPECTED_ARGS[name][0]
    assert tools["hermes_cancel"]["annotations"]["destructiveHint"] is True


def test_inspector_health_succeeds_and_a_refusal_is_a_tool_error(bridge, inspector):
    code, payload = inspector("tools/call", "--tool-name", "hermes_health")
    assert code == 0 and field(tool_text(payload), "BRIDGE").startswith("claude-hermes-bridge"), payload
    code, payload = inspector("tools/call", "--tool-name", "hermes_run", "--tool-args-json",
                              json.dumps({"task": "x", "cwd": "/etc"}))
    assert code == 5, payload
    assert bridge.runs() == []


def test_inspector_run_and_status_round_trip_ends_ok(inspector):
    code, payload = inspector("tools/call", "--tool-name", "hermes_run", "--tool-args-json",
                              json.dumps({"task": "inspector job !sleep=1", "wait_s": 0}))
    assert code == 0 and field(tool_text(payload), "STATUS") == "running", payload
    job_id = field(tool_text(payload), "JOB_ID")
    code, payload = inspector("tools/call", "--tool-name", "hermes_status", "--tool-args-json",
                              json.dumps({"job_id": job_id, "wait_s": 30}))
    assert code == 0, payload
    text = tool_text(payload)
    assert field(text, "STATUS") == "ok" and field(text, "EXIT_CODE") == "0"
    assert "FAKE DONE: inspector job" in text


def test_server_starts_from_a_claude_desktop_config_entry(bridge):
    desktop = bridge.tmp / "claude_desktop_config.json"
    desktop.write_text(json.dumps({"mcpServers": {"hermes": {"command": sys.executable, "args": [str(SERVER)]}}}))
    entry = json.loads(desktop.read_text())["mcpServers"]["hermes"]
    with BridgeClient(bridge.env, command=[entry["command"], *entry["args"]]) as client:
        assert either(client.init, "server_info").name == "hermes"
        assert client.call("hermes_health").field("BRIDGE").startswith("claude-hermes-bridge")


@pytest.mark.skipif(version_tuple(dependency_version("mcp") or "0")[0] < 2,
                    reason="the tasks extension needs the 2.x SDK line")
def test_inspector_on_the_modern_era_gets_a_task_polls_it_and_prints_the_final_block(bridge, inspector):
    code, payload = inspector("tools/call", "--protocol-era", "modern", "--tool-name", "hermes_run",
                              "--tool-args-json", json.dumps({"task": "modern inspector job !sleep=8"}))
    assert code == 0, payload
    text = tool_text(payload)  # without a task the call would answer STATUS: running after its 5 s wait
    assert field(text, "STATUS") == "ok" and "FAKE DONE: modern inspector job" in text
    assert bridge.record(field(text, "JOB_ID")).state is JobState.OK
