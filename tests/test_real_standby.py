"""Issue 39 with the real Hermes 0.19.0 and 0.22.2 over ACP and a scripted model: the next job in a folder takes
the warm Hermes, runs its tools in its own folder with its own temporary folder, is answered and resumable; the
throw-away session of the warm-up is what Hermes' store keeps of it."""
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from test_real_hermes import assert_turn_ended, finish, write_hermes_home
from test_standby import gone, ready

from conftest import require_component
from harness import REAL_ACP_VERSIONS, REAL_HERMES_VERSIONS, Bridge, wait_until
from scripted_model import ScriptedModel

pytestmark = pytest.mark.posix("warm starts are not built for Windows")


@pytest.fixture(params=REAL_ACP_VERSIONS, ids=lambda version: f"hermes-{version}")
def warm(bridge: Bridge, request: pytest.FixtureRequest) -> Any:
    exe = require_component(REAL_HERMES_VERSIONS[request.param], f"the real Hermes CLI {request.param}")
    home = bridge.tmp / "real-home"
    with ScriptedModel(bridge.tmp) as model:
        write_hermes_home(home, model.base_url)
        bridge.configure(hermes_exe=str(exe), hermes_home=str(home), kill_grace_s=5, hermes_driver="acp",
                         approvals="yolo", warm_start=True)
        with bridge.client() as client:
            yield bridge, model, client, home


def sessions(home: Path) -> dict[str, int]:
    """Hermes' own session list: each session and how many messages it holds."""
    with sqlite3.connect(f"file:{home / 'state.db'}?mode=ro", uri=True) as db:
        return {row[0]: row[1] for row in db.execute(
            "SELECT s.id, (SELECT COUNT(*) FROM messages m WHERE m.session_id = s.id) FROM sessions s")}


def test_the_next_job_takes_the_warm_hermes_and_runs_in_its_own_folder(warm: Any) -> None:
    bridge, model, client, home = warm
    first = finish(client, client.call("hermes_run", task="First.\nRUN: pwd", wait_s=45), timeout=180)
    assert_turn_ended(first)
    assert first.field("START").startswith("cold ("), first.text
    standby = ready(bridge, timeout=120)
    before = sessions(home)
    second = finish(client, client.call("hermes_run", task="Second.\nRUN: pwd && echo \"tmp=$TMPDIR\"", wait_s=45),
                    timeout=180)
    assert_turn_ended(second)
    assert second.field("START").startswith("warm (the task reached Hermes "), second.text
    output = second.text.split("--- HERMES ANSWER ---")[1]
    job_id = second.field("JOB_ID")
    assert f"SCRIPTED DONE: {bridge.root}" in output or str(bridge.root) in output, second.text
    assert str(bridge.jobs / "tmp") in second.text  # its TMPDIR: the standby's private one, under the sandbox
    session = second.field("SESSION_ID")
    assert session in sessions(home) and session not in before
    last = model.requests()[-1]
    assert any("Second." in str(message.get("content")) for message in last["messages"])
    assert "First." not in " ".join(str(message.get("content")) for message in last["messages"])
    assert bridge.record(job_id).marker == standby["marker"]
    assert wait_until(lambda: gone(standby["pid"]) or None, 30, "the standby that served the job to exit")

    resumed = finish(client, client.call("hermes_resume", session_id=session, task="And now?", wait_s=45),
                     timeout=180)
    assert_turn_ended(resumed)
    assert resumed.field("SESSION_ID") == session, resumed.text
    throwaway = {name: count for name, count in sessions(home).items() if name not in before and name != session}
    assert set(throwaway.values()) <= {0}, throwaway  # warm-up sessions hold no message
