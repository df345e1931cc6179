"""Issue 41 with the fake Hermes: hermes_steer's guidance reaches a running ACP job as Hermes takes it (`/steer`
during the turn, `/queue` for a turn after it), every later block lists it, what cannot be steered is refused
saying why, a steer racing the job's end is never lost; and upstream's unreleased ACP forms are read safely."""
import json
from typing import Any

import pytest
from test_approvals import audit_lines
from test_budgets import client_of

from harness import Bridge, BridgeClient, Result, refused, wait_until

pytestmark = pytest.mark.posix("the fake hermes is a shell script")


def started(client: BridgeClient, task: str) -> str:
    """A job's id once Hermes runs its turn's first tool (the fake's `!tool-sleep`)."""
    job_id = client.call("hermes_run", task=task, wait_s=0).field("JOB_ID")
    wait_until(lambda: "sleep" in client.call("hermes_status", job_id=job_id, wait_s=0).text or None, 30,
               "the job's tool call")
    return job_id


def steered_trace(bridge: Bridge) -> list[list[str]]:
    return [json.loads(line) for path in bridge.traces("*.steered") for line in path.read_text().splitlines()]


def steered_lines(result: Result) -> list[str]:
    return [line for line in result.text.splitlines() if line.startswith("STEERED: ")]


def test_a_steer_reaches_the_running_turn_and_every_later_block_lists_it(bridge: Bridge) -> None:
    with client_of(bridge, "acp") as client:
        job_id = started(client, "work !tool-sleep=3")
        reply = client.call("hermes_steer", job_id=job_id, guidance="use pytest, not unittest")
        final = client.wait_final(job_id)
    assert not reply.is_error, reply.text
    [line] = steered_lines(reply)
    assert "NOTE: " not in reply.text, reply.text  # issue 49: STEERED says it; no NOTE repeats the sentence
    assert '(now) by the planner (hermes_steer) at ' in line and '"use pytest, not unittest" -> taken by Hermes: ' \
        "\u23e9 Steer queued for the active turn: use pytest, not unittest" in line, line
    assert steered_trace(bridge) == [["/steer", "use pytest, not unittest"]]
    assert final.field("STATUS") == "ok" and "steered=use pytest, not unittest" in final.text
    assert steered_lines(final) == [line]
    session = json.loads((bridge.jobs / f"{job_id}.json").read_text())["session_id"]
    assert session and final.field("SESSION_ID") == session  # the planner resumes a steered job by it
    assert "\u23e9" not in final.text.split("--- HERMES ANSWER ---")[1].split("--- HERMES OUTPUT ---")[0]
    [audited] = [entry for entry in audit_lines(bridge) if entry.get("event") == "steer"]
    assert (audited["job_id"], audited["by"], audited["guidance"]) == (job_id, "the planner (hermes_steer)",
                                                                        "use pytest, not unittest")


def test_next_turn_queues_a_turn_after_the_answer(bridge: Bridge) -> None:
    with client_of(bridge, "acp") as client:
        job_id = started(client, "work !tool-sleep=3")
        reply = client.call("hermes_steer", job_id=job_id, guidance="then write the changelog", when="next_turn")
        final = client.wait_final(job_id)
    assert "(next_turn)" in reply.text and "-> taken by Hermes: Queued for the next turn. (1 queued)" in reply.text
    assert steered_trace(bridge) == [["/queue", "then write the changelog"]]
    answer = final.text.split("--- HERMES ANSWER ---")[1]
    assert final.field("STATUS") == "ok" and answer.index("FAKE ANSWER") < answer.index(
        "QUEUED TURN: then write the changelog")


def test_two_steers_in_a_row_both_arrive(bridge: Bridge) -> None:
    with client_of(bridge, "acp") as client:
        job_id = started(client, "work !tool-sleep=4")
        first = client.call("hermes_steer", job_id=job_id, guidance="first: keep the API")
        second = client.call("hermes_steer", job_id=job_id, guidance="second: add a test")
        final = client.wait_final(job_id)
    assert not first.is_error and not second.is_error
    assert steered_trace(bridge) == [["/steer", "first: keep the API"], ["/steer", "second: add a test"]]
    assert "steered=first: keep the API|second: add a test" in final.text
    assert len(steered_lines(final)) == 2 and all("taken by Hermes" in line for line in steered_lines(final))


@pytest.mark.parametrize(("guidance", "when", "words"), [
    ("", "now", "guidance is empty"),
    ("   \n ", "now", "guidance is empty"),
    ("x" * 4001, "now", "at most 4,000 are sent"),
    ("a\x1b[31m b", "now", "control or invisible characters"),
    ("a \u202e b", "now", "control or invisible characters"),
    ("fine", "later", 'when must be "now" or "next_turn"'),
])
def test_guidance_that_is_not_plain_bounded_text_is_refused_and_nothing_is_sent(bridge: Bridge, guidance: str,
                                                                               when: str, words: str) -> None:
    with client_of(bridge, "acp") as client:
        job_id = started(client, "work !tool-sleep=2")
        result = client.call("hermes_steer", job_id=job_id, guidance=guidance, when=when)
        client.wait_final(job_id)
    assert refused(result, words)
    assert not steered_trace(bridge) and not (bridge.jobs / f"{job_id}.steer").exists()


def test_a_cli_job_an_ended_job_and_a_job_waiting_on_a_question_are_refused_saying_why(bridge: Bridge) -> None:
    with client_of(bridge, "cli") as client:
        cli_job = client.call("hermes_run", task="work !sleep=3", wait_s=0).field("JOB_ID")
        cli = client.call("hermes_steer", job_id=cli_job, guidance="go faster")
        client.wait_final(cli_job)
        ended = client.call("hermes_steer", job_id=cli_job, guidance="go faster")
    bridge.configure(approvals="ask", approval_timeout_s=60)
    with client_of(bridge, "acp") as client:
        asking = client.call("hermes_run", task="!ask=touch+x.txt", wait_s=0).field("JOB_ID")
        wait_until(lambda: client.call("hermes_status", job_id=asking, wait_s=0).field("STATUS") == "needs_approval"
                   or None, 30, "the question")
        waiting = client.call("hermes_steer", job_id=asking, guidance="skip that")
        client.call("hermes_cancel", job_id=asking)
    assert refused(cli, "runs with the CLI driver", "hermes_cancel", "hermes_resume")
    assert refused(ended, "has ended (ok)", "hermes_resume")
    assert refused(waiting, "waits on Hermes' question", "answer it first")
    assert not steered_trace(bridge)


def test_a_steer_racing_the_jobs_end_is_taken_or_said_not_delivered_never_lost(bridge: Bridge) -> None:
    accepted: list[str] = []
    with client_of(bridge, "acp") as client:
        job_id = started(client, "work !tool-sleep=1")
        for number in range(60):
            reply = client.call("hermes_steer", job_id=job_id, guidance=f"steer {number}")
            if reply.is_error:
                assert "has ended" in reply.text, reply.text
                break
            accepted.append(f"steer {number}")
            if "NOT delivered" in reply.text:
                break
        final = client.wait_final(job_id)
    listed = steered_lines(final)
    assert accepted and len(listed) == len(accepted), final.text
    assert all(('taken by Hermes' in line or 'NOT delivered' in line) for line in listed), listed
    traced = [guidance for _, guidance in steered_trace(bridge)]
    assert all(f'"{text}" -> taken by Hermes' in "\n".join(listed) for text in traced)


def test_a_hermes_that_does_not_exit_after_its_turn_is_stopped_and_the_block_says_so(bridge: Bridge) -> None:
    """Seen from 0.22.2 on a loaded machine: the turn ended, its input closed, and its way out took longer than
    the grace. The job is ok, and its reason says the bridge stopped it (not a kill from outside)."""
    with client_of(bridge, "acp") as client:
        result = client.call("hermes_run", task="work !linger", wait_s=40)
    assert result.field("STATUS") == "ok", result.text
    assert result.field("EXIT_CODE") == "-15", result.text
    assert result.field("REASON").startswith(
        "Hermes finished its turn, then had not exited 10 s after its input was closed; the bridge stopped it: the "
        "whole process tree"), result.text


def test_upstreams_keep_alives_hermes_notices_and_new_stop_reasons_are_read_safely(bridge: Bridge) -> None:
    with client_of(bridge, "acp") as client:
        quiet = client.call("hermes_run", task="talk !keepalive !hermes-notices", wait_s=30)
        results: dict[str, Any] = {stop: client.call("hermes_run", task=f"work !stop={stop}", wait_s=30)
                                   for stop in ("max_tokens", "max_turn_requests")}
    assert quiet.field("STATUS") == "ok", quiet.text
    assert quiet.text.split("--- HERMES ANSWER ---")[1].splitlines()[1] == "| FAKE ANSWER: talk !keepalive " \
        "!hermes-notices"
    log = (bridge.jobs / f"{quiet.field('JOB_ID')}.log").read_text()
    assert "_hermes" not in quiet.text and "ignored" not in log
    tokens, turns = results["max_tokens"], results["max_turn_requests"]
    assert tokens.field("STATUS") == "error" and "output token limit (stopReason max_tokens)" in tokens.field("REASON")
    assert tokens.field("RETRY").startswith("maybe: inspect the files, then resume the session")
    assert turns.field("STATUS") == "error" and "its own turn limit (stopReason max_turn_requests" in turns.field(
        "REASON")
    assert turns.field("RETRY").startswith("no: resume the session (hermes_resume) to go on")
