"""Issue 41 with the real Hermes 0.19.0 and 0.22.2 over ACP and the scripted model: guidance sent while the
turn's first tool call runs reaches the model's next request as the user's words and the job ends ok, two
steers in a row both arrive, `next_turn` runs as a turn after the answer, a CLI job refuses with the reason,
and a steer racing the job's end is taken or said not delivered."""
from typing import Any

import pytest
from test_real_acp import final_of
from test_real_hermes import wait_for_command, write_hermes_home

from conftest import require_component
from harness import REAL_ACP_VERSIONS, REAL_HERMES_VERSIONS, Bridge, refused
from scripted_model import ScriptedModel, text_of

pytestmark = [pytest.mark.e2e,
              pytest.mark.posix("the e2e install (tests/install_e2e.sh) is a bash script with POSIX venv paths")]

SLOW_TOOL = "Build it.\nRUN: sleep 6 && echo built"


@pytest.fixture(params=REAL_ACP_VERSIONS, ids=lambda v: f"hermes-{v}")
def real_hermes(bridge: Bridge, request: Any) -> Any:
    exe = require_component(REAL_HERMES_VERSIONS[request.param], f"the real Hermes CLI {request.param}")
    with ScriptedModel(bridge.tmp) as model:
        write_hermes_home(bridge.tmp / "real-home", model.base_url)
        bridge.configure(hermes_exe=str(exe), hermes_home=str(bridge.tmp / "real-home"), kill_grace_s=5,
                         hermes_driver="acp")
        yield bridge, model


def words_after_the_first_request(model: ScriptedModel) -> str:
    """What every later request carried: 0.19.0 appends a steer to the tool's result, 0.22.2 sends it as a
    user message of its own."""
    return "\n".join(text_of(m) for request in model.requests()[1:] for m in request.get("messages") or [])


def test_guidance_during_a_tool_call_reaches_the_models_next_request_and_the_job_goes_on(real_hermes: Any) -> None:
    bridge, model = real_hermes
    with bridge.client() as client:
        job_id = client.call("hermes_run", task=SLOW_TOOL, wait_s=0).field("JOB_ID")
        wait_for_command(bridge, job_id, "sleep 6")
        first = client.call("hermes_steer", job_id=job_id, guidance="Use pytest, not unittest.")
        second = client.call("hermes_steer", job_id=job_id, guidance="Keep the public API as it is.")
        final = final_of(client, job_id)
    assert "-> taken by Hermes: \u23e9 Steer queued for the active turn: Use pytest" in first.text, first.text
    assert "-> taken by Hermes: \u23e9 Steer queued for the active turn: Keep the public" in second.text, second.text
    assert final.field("STATUS") == "ok", final.text
    steered = [line for line in final.text.splitlines() if line.startswith("STEERED: ")]
    assert len(steered) == 2 and all("taken by Hermes" in line for line in steered)
    first_request = "\n".join(text_of(m) for m in model.requests()[0].get("messages") or [])
    assert "Use pytest" not in first_request  # the task alone
    later = words_after_the_first_request(model)
    assert "Use pytest, not unittest." in later and "Keep the public API as it is." in later, later


def test_next_turn_runs_the_guidance_as_a_turn_after_the_answer(real_hermes: Any) -> None:
    bridge, model = real_hermes
    with bridge.client() as client:
        job_id = client.call("hermes_run", task=SLOW_TOOL, wait_s=0).field("JOB_ID")
        wait_for_command(bridge, job_id, "sleep 6")
        reply = client.call("hermes_steer", job_id=job_id, guidance="Now write the changelog.", when="next_turn")
        final = final_of(client, job_id)
    assert "(next_turn)" in reply.text and "-> taken by Hermes: Queued for the next turn." in reply.text, reply.text
    assert final.field("STATUS") == "ok", final.text
    answer = final.text.split("--- HERMES ANSWER ---")[1]
    assert "SCRIPTED ANSWER" in answer and answer.index("SCRIPTED DONE: ") < answer.index("SCRIPTED ANSWER"), answer
    assert model.first_request_with("Now write the changelog.") is not None  # its own turn: the last user message


def test_a_cli_job_refuses_guidance_with_the_reason(real_hermes: Any) -> None:
    bridge, _ = real_hermes
    bridge.configure(hermes_driver="cli")
    with bridge.client() as client:
        job_id = client.call("hermes_run", task=SLOW_TOOL, wait_s=0).field("JOB_ID")
        wait_for_command(bridge, job_id, "sleep 6")
        result = client.call("hermes_steer", job_id=job_id, guidance="Use pytest.")
        final = final_of(client, job_id)
    assert refused(result, "runs with the CLI driver, which has no channel to Hermes while it runs")
    assert final.field("STATUS") == "ok" and "STEERED" not in final.text


def test_a_steer_racing_the_jobs_end_is_taken_or_said_not_delivered(real_hermes: Any) -> None:
    bridge, _ = real_hermes
    accepted = 0
    with bridge.client() as client:
        job_id = client.call("hermes_run", task="Quick.\nRUN: sleep 1 && echo quick", wait_s=0).field("JOB_ID")
        wait_for_command(bridge, job_id, "sleep 1")
        for number in range(40):
            reply = client.call("hermes_steer", job_id=job_id, guidance=f"Note {number}.")
            if reply.is_error:
                assert "has ended" in reply.text, reply.text
                break
            accepted += 1
        final = final_of(client, job_id)
    steered = [line for line in final.text.splitlines() if line.startswith("STEERED: ")]
    assert accepted and len(steered) == accepted, final.text
    assert all("taken by Hermes" in line or "NOT delivered" in line for line in steered), steered
