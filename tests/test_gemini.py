"""The real Gemini CLI (`gemini -p`, from npm) as the host, its model a scripted Gemini API endpoint on 127.0.0.1:
registered by register_with_claude.py as a user would, a hermes_run then a hermes_status to ok with the whole
block in what the model receives, and the job view's tools not offered to a host that renders no MCP Apps."""
import json
import os
import subprocess
import sys

import pytest
from scripted_gemini import ScriptedGemini, declared

from conftest import require_component
from harness import E2E, REPO

pytestmark = [pytest.mark.e2e, pytest.mark.posix("the fake hermes is a shell script")]
GEMINI = E2E / "gemini" / "node_modules" / ".bin" / "gemini"
GEMINI_VERSION = "0.61.0"


def test_gemini_p_runs_a_job_with_the_registered_entry_and_its_model_reads_the_whole_block(bridge, tmp_path):
    gemini = require_component(GEMINI, f"the real Gemini CLI {GEMINI_VERSION}")
    home = bridge.tmp / "gemini-home"
    settings = home / ".gemini" / "settings.json"
    settings.parent.mkdir(parents=True)
    settings.write_text(json.dumps({"security": {"auth": {"selectedType": "gemini-api-key"},
                                                 "folderTrust": {"enabled": False}}}))
    env = {"PATH": os.environ["PATH"], "HOME": str(home)}
    registered = subprocess.run([sys.executable, str(REPO / "register_with_claude.py"), "--host", "gemini",
                                 "--approve-tools"], env=env, capture_output=True, text=True, timeout=120)
    assert registered.returncode == 0, registered.stdout + registered.stderr
    entry = json.loads(settings.read_text())
    entry["mcpServers"]["hermes"]["env"] = {"HERMES_BRIDGE_CONFIG": str(bridge.config),
                                            "FAKE_HERMES_TRACE": str(bridge.trace)}  # the user's own keys
    settings.write_text(json.dumps(entry))
    script = "\n".join([f'CALL: hermes_run {json.dumps({"task": "say hi", "cwd": str(bridge.root), "wait_s": 0})}',
                        'CALL: hermes_status {"job_id": "{JOB_ID}", "wait_s": 30}'])
    with ScriptedGemini(tmp_path) as model:
        done = subprocess.run([str(gemini), "-p", script], cwd=bridge.root, capture_output=True, text=True,
                              timeout=240, stdin=subprocess.DEVNULL,
                              env=dict(env, GEMINI_API_KEY="scripted", GOOGLE_GEMINI_BASE_URL=model.base_url))
        assert done.returncode == 0, done.stdout + done.stderr
        offered = {name for request in model.requests() for name in declared(request)}
        started, final = model.function_responses()
    ours = {name for name in offered if name.startswith("mcp_hermes_")}
    assert {"mcp_hermes_hermes_run", "mcp_hermes_hermes_status", "mcp_hermes_hermes_approve"} <= ours
    assert not [name for name in ours if "hermes_view_" in name]  # Gemini CLI lists every tool it is given
    assert "STATUS: running" in started and "JOB_ID: " in started
    for line in ("STATUS: ok", "EXIT_CODE: 0", "SESSION_ID: ", "REASON: ", "--- HERMES ANSWER ---"):
        assert line in final, final
    assert "PLANNER DONE: STATUS: ok" in done.stdout
