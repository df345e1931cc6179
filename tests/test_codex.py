"""The real Codex CLI (`codex exec`, from npm) as the host, its model a scripted Responses endpoint on 127.0.0.1:
registered by register_with_claude.py as a user would, a hermes_run then a hermes_status to ok with the whole
block in what the model receives, only the model's tools offered, and a question under `exec` (nobody to ask)
recorded as the host's decline, not the user's."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from scripted_responses import ScriptedResponses, offered_tools

from conftest import require_component
from harness import E2E, REPO, Bridge

pytestmark = [pytest.mark.e2e, pytest.mark.posix("the fake hermes is a shell script")]
CODEX = E2E / "codex" / "node_modules" / ".bin" / "codex"
CODEX_VERSION = "0.171.0"


class CodexHost:
    """A throwaway HOME whose ~/.codex/config.toml names the scripted model, with the bridge registered by
    register_with_claude.py, plus what this test's bridge needs in the entry's env table (a user's own keys)."""

    def __init__(self, bridge: Bridge, model: ScriptedResponses, *register_options: str):
        self.bridge, self.model = bridge, model
        self.home = bridge.tmp / "codex-home"
        config = self.home / ".codex" / "config.toml"
        config.parent.mkdir(parents=True)
        config.write_text(f'model = "scripted"\nmodel_provider = "scripted"\n\n[model_providers.scripted]\n'
                          f'name = "scripted"\nbase_url = "{model.base_url}"\nwire_api = "responses"\n'
                          'env_key = "SCRIPTED_API_KEY"\nrequest_max_retries = 0\nstream_max_retries = 0\n')
        self.env = {"PATH": "/usr/bin:/bin", "HOME": str(self.home)}
        registered = subprocess.run([sys.executable, str(REPO / "register_with_claude.py"), "--host", "codex",
                                     *register_options], env=self.env, capture_output=True, text=True, timeout=120)
        assert registered.returncode == 0, registered.stdout + registered.stderr
        server_env = {"HERMES_BRIDGE_CONFIG": str(bridge.config), "FAKE_HERMES_ACP": "1",
                      "FAKE_HERMES_TRACE": str(bridge.trace)}
        with open(config, "a", encoding="utf-8") as out:
            out.write("\n[mcp_servers.hermes.env]\n" + "".join(f'{key} = {json.dumps(value)}\n'
                                                               for key, value in server_env.items()))

    def exec(self, *script: str) -> subprocess.CompletedProcess[str]:
        codex = require_component(CODEX, f"the real Codex CLI {CODEX_VERSION}")
        return subprocess.run([str(codex), "exec", "--skip-git-repo-check", "-C", str(self.bridge.root),
                               "\n".join(script)], env=dict(self.env, SCRIPTED_API_KEY="scripted"),
                              capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)


def call(tool: str, **arguments: object) -> str:
    return f"CALL: {tool} {json.dumps(arguments)}".replace('"JOB"', '"{JOB_ID}"')


def test_codex_exec_runs_a_job_with_the_registered_entry_and_its_model_reads_the_whole_block(bridge, tmp_path):
    with ScriptedResponses(tmp_path) as model:
        host = CodexHost(bridge, model, "--approve-tools")
        done = host.exec(call("hermes_run", task="say hi", cwd=str(bridge.root), wait_s=0),
                         call("hermes_status", job_id="JOB", wait_s=30))
        assert done.returncode == 0, done.stdout + done.stderr
        offered = {name for space, name in offered_tools(model.requests()[0])
                   if space == "mcp__hermes"}
        started, final = model.tool_outputs()
    assert {"hermes_run", "hermes_status", "hermes_approve", "hermes_land"} <= offered
    assert not [name for name in offered if name.startswith("hermes_view_")]  # Codex renders no MCP Apps
    assert "STATUS: running" in started and "JOB_ID: " in started
    for line in ("STATUS: ok", "EXIT_CODE: 0", "SESSION_ID: ", "REASON: ", "--- HERMES ANSWER ---"):
        assert line in final, final  # the whole block, not its tail
    assert "PLANNER DONE" in done.stdout


def test_without_approve_tools_codex_exec_refuses_every_call_and_starts_nothing(bridge, tmp_path):
    with ScriptedResponses(tmp_path) as model:
        host = CodexHost(bridge, model)
        done = host.exec(call("hermes_run", task="say hi", cwd=str(bridge.root), wait_s=0))
        [refused] = model.tool_outputs()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "JOB_ID" not in refused and "approval" in refused.lower(), refused
    assert not list(bridge.trace.glob("*.json"))  # no Hermes ran


def test_a_question_under_codex_exec_is_the_hosts_decline_not_the_users(bridge, tmp_path):
    bridge.configure(approvals="ask", approval_timeout_s=60, hermes_driver="acp")
    with ScriptedResponses(tmp_path) as model:
        host = CodexHost(bridge, model, "--approve-tools")
        done = host.exec(call("hermes_run", task="!ask=touch+declined.txt", cwd=str(bridge.root), wait_s=40),
                         call("hermes_status", job_id="JOB", wait_s=30))
        outputs = model.tool_outputs()
    assert done.returncode == 0, done.stdout + done.stderr
    final = outputs[-1]
    assert "STATUS: ok" in final, final
    by = "the host, declined without asking anyone (it answered at once)"
    assert f"-> deny by {by}" in final, final
    assert not (bridge.root / "declined.txt").exists()
    audit = Path(bridge.tmp / "logs" / "audit.log").read_text()
    assert f'"by": "{by}"' in audit and '"by": "the user' not in audit
