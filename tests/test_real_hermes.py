"""The real Hermes CLI behind the bridge, driven by a scripted model endpoint on 127.0.0.1: Hermes 0.19.0
(PyPI) and 0.20.1 (upstream v0.20.1 repackaged on PyPI), each with hermes_cli_form left on auto."""
import re
import socket
import subprocess
import time

import psutil
import pytest

from claude_hermes_bridge.hermes_acp import ACP_EXIT_GRACE_S
from conftest import require_component
from harness import REAL_HERMES_VERSIONS, hermes_answer, refused, wait_gone, wait_until
from scripted_model import ScriptedModel, next_step

pytestmark = [pytest.mark.e2e,
              pytest.mark.posix("the e2e install (tests/install_e2e.sh) is a bash script with POSIX venv paths")]

SKILL_MARKER = "PROBE-SKILL-BODY-7f3a"


def write_hermes_home(home, base_url):
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text(
        "model:\n  provider: custom\n  base_url: " + base_url + "\n  default: scripted\n  api_key: test-key\n"
        "security:\n  tirith_enabled: false\n  allow_lazy_installs: false\n"
        # 0.22 retries a dead endpoint, then runs 5 "auto-recovery cycles" of growing waits: past a job's timeout.
        # The environment probe (`python3 -m pip --version` and the like, for one line of the system prompt) costs
        # about 2 of the 7-8 CPU-seconds of a run, and no test looks at it.
        "agent:\n  api_max_retries: 1\n  auto_recovery_cycles: 0\n  environment_probe: false\n")


@pytest.fixture(params=sorted(REAL_HERMES_VERSIONS), ids=lambda v: f"hermes-{v}")
def real(bridge, request):
    exe = require_component(REAL_HERMES_VERSIONS[request.param], f"the real Hermes CLI {request.param}")
    home = bridge.tmp / "real-home"
    with ScriptedModel(bridge.tmp) as model:
        write_hermes_home(home, model.base_url)
        bridge.configure(hermes_exe=str(exe), hermes_home=str(home), kill_grace_s=5, hermes_driver="cli")
        with bridge.client() as client:
            yield bridge, model, client


def descendants(bridge, job_id):
    hermes = bridge.record(job_id).hermes
    if not hermes:
        return []
    try:
        root = psutil.Process(hermes.pid)
        return [root] + root.children(recursive=True)
    except psutil.Error:
        return []


def wait_for_command(bridge, job_id, needle, timeout=90):
    """Every pid of the job's tree once a process running `needle` shows up in it."""
    def tree_running_needle():
        tree = descendants(bridge, job_id)
        for proc in tree:
            try:
                if needle in " ".join(proc.cmdline()):
                    return [p.pid for p in tree]
            except psutil.Error:
                continue
        return None
    return wait_until(tree_running_needle, timeout, f"a process running {needle!r} in job {job_id}", interval=0.2)


def finish(client, result, timeout=120):
    return client.wait_final(result.field("JOB_ID"), timeout=timeout) if result.field("STATUS") == "running" else result


def assert_turn_ended(result, status="ok", exit_code="0"):
    """The job's turn ended with this status and exit code, or with the two ends seen from a real Hermes after its
    turn was saved, each reported as that: 0.22.2 segfaults on its way out in about one resume of 40, and on a
    loaded machine its way out (a model call naming the session) once outlasted the bridge's grace."""
    if result.field("STATUS") == "error" and "on its way out, after its turn had ended" in result.text:
        assert result.field("REASON").startswith("Hermes crashed (SIGSEGV, 11)"), result.text
        assert result.field("EXIT_CODE") == "-11", result.text
        return
    stopped = f"then had not exited {ACP_EXIT_GRACE_S:g} s after its input was closed"
    if status == "ok" and stopped in result.text:  # a loaded machine
        assert result.field("STATUS") == "ok" and result.field("EXIT_CODE") in ("-15", "-9"), result.text
        return
    assert result.field("STATUS") == status, result.text
    assert result.field("EXIT_CODE") == exit_code, result.text


def test_run_writes_the_file_and_captures_the_session_then_resume_continues_it(real):
    bridge, model, client = real
    task = "Create the file.\nRUN: printf 'real content' > made.txt && echo wrote"
    result = finish(client, client.call("hermes_run", task=task, wait_s=45))
    assert_turn_ended(result)
    assert (bridge.root / "made.txt").read_text() == "real content"
    session = result.field("SESSION_ID")
    assert re.match(r"^\d{8}_\d{6}_[0-9a-f]+$", session), session
    assert "SCRIPTED DONE" in result.text

    resumed = finish(client, client.call("hermes_resume", session_id=session, task="What did you write?", wait_s=45))
    assert_turn_ended(resumed)
    assert resumed.field("SESSION_ID") == session
    assert "SESSION_NOTE" not in resumed.text
    last = [r for r in model.requests() if r.get("tools")][-1]
    contents = [str(m.get("content")) for m in last["messages"]]
    assert any("RUN: printf 'real content'" in c for c in contents), "the earlier conversation was not sent"
    assert contents[-1] == "What did you write?"


def test_cancel_during_a_tool_call_leaves_no_process(real):
    bridge, model, client = real
    job_id = client.call("hermes_run", task="Wait.\nRUN: sleep 61", wait_s=0).field("JOB_ID")
    tree = wait_for_command(bridge, job_id, "sleep 61")
    result = client.call("hermes_cancel", job_id=job_id)
    if result.field("STATUS") == "running":
        result = client.wait_final(job_id)
    assert result.field("STATUS") == "cancelled", result.text
    assert wait_gone(tree) == []
    assert not [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "61"]]


def test_timeout_during_a_tool_call_leaves_no_process(real):
    bridge, model, client = real
    # The timeout leaves room for a cold start on a loaded CI machine (25 s once ran out before the command began).
    job_id = client.call("hermes_run", task="Wait long.\nRUN: sleep 62", timeout_s=50, wait_s=0).field("JOB_ID")
    tree = wait_for_command(bridge, job_id, "sleep 62", timeout=49)
    result = client.wait_final(job_id, timeout=90)
    assert result.field("STATUS") == "timeout", result.text
    assert wait_gone(tree) == []


def test_a_model_endpoint_that_is_down_ends_error_with_hermes_exit_code_and_message(real):
    bridge, model, client = real
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    write_hermes_home(bridge.tmp / "real-home", f"http://127.0.0.1:{closed_port}/v1")
    result = finish(client, client.call("hermes_run", task="Say hello.", wait_s=45), timeout=180)
    assert_turn_ended(result, "error", "1")
    output = result.text.split("--- HERMES OUTPUT ---", 1)[1].lower()
    assert "connect" in output or "error" in output


def test_a_session_made_outside_the_roots_cannot_be_resumed_through_the_bridge(real):
    bridge, model, client = real
    outside = bridge.tmp / "outside"
    outside.mkdir()
    exe = bridge.settings["hermes_exe"]
    env = dict(bridge.env, HERMES_HOME=str(bridge.tmp / "real-home"))
    done = subprocess.run([exe, "chat", "-q", "Say hello.", "-Q"], cwd=outside, env=env, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    # 0.22.2 now and then segfaults on its way out, after it printed its session id: the session is saved
    assert done.returncode == 0 or (done.returncode == -11 and "session_id: " in done.stderr), done.stderr
    session = re.findall(r"session_id: (\S+)", done.stderr)[-1]
    result = client.call("hermes_resume", session_id=session, task="RUN: printf x > escaped.txt",
                         cwd=str(bridge.root), wait_s=30)
    refused(result, str(outside), "outside the allowed roots")
    time.sleep(2)
    assert not (outside / "escaped.txt").exists() and not (bridge.root / "escaped.txt").exists()


def test_a_bridge_session_from_root_a_resumed_with_cwd_b_runs_in_a_and_says_so(real):
    bridge, model, client = real
    root_b = bridge.tmp / "roots" / "b"
    root_b.mkdir()
    bridge.configure(allowed_roots=[str(bridge.root), str(root_b)])
    first = finish(client, client.call("hermes_run", task="Note this.\nRUN: echo first", wait_s=45))
    assert_turn_ended(first)
    resumed = finish(client, client.call("hermes_resume", session_id=first.field("SESSION_ID"), cwd=str(root_b),
                                         task="Again.\nRUN: printf resumed > resumed.txt", wait_s=45))
    assert_turn_ended(resumed)
    assert resumed.field("CWD") == str(bridge.root.resolve())
    assert "not in the cwd asked for" in resumed.text
    assert (bridge.root / "resumed.txt").read_text() == "resumed"
    assert not (root_b / "resumed.txt").exists()


def test_capabilities_read_a_hermes_skills_tree_and_skills_reach_hermes(real):
    bridge, model, client = real
    skills = bridge.tmp / "real-home" / "skills"
    layout = {
        "software-development/code-review/SKILL.md": ("code-review", "Review code changes", "[review, quality]"),
        "software-development/testing/pytest-runner/SKILL.md": ("pytest-runner", "Run pytest suites", "[pytest]"),
        "research/probe-skill/SKILL.md": ("probe-skill", "A probe skill for tests", "[probe]"),
        "note-taking/SKILL.md": ("note-taking", "Uncategorised notes", "[]"),
    }
    for rel, (name, description, tags) in layout.items():
        path = skills / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"---\nname: {name}\ndescription: {description}\nversion: 1.0.0\nmetadata:\n  hermes:\n"
                        f"    tags: {tags}\n    related_skills: []\n---\n# {name}\n{SKILL_MARKER} {name}\n")
    summary = client.call("hermes_capabilities")
    assert "SKILLS: 4" in summary.text
    assert "software-development (2): code-review, pytest-runner" in summary.text
    assert "uncategorised (1): note-taking" in summary.text
    found = client.call("hermes_capabilities", query="pytest")
    assert "- pytest-runner [software-development]" in found.text
    result = client.call("hermes_run", task="Use the skill.", skills=["probe-skill"], wait_s=45)
    assert_turn_ended(finish(client, result))
    first = [r for r in model.requests() if r.get("tools")][0]
    system = " ".join(str(m.get("content")) for m in first["messages"] if m.get("role") == "system")
    assert f"{SKILL_MARKER} probe-skill" in system


def test_activity_changed_files_and_hermes_own_answer(real):
    """While the tool runs, CURRENT_TOOL names it and its command; at the end USAGE, the three kinds of
    change, and HERMES ANSWER equal to the model's final text with none of Hermes' warnings in it."""
    bridge, model, client = real
    (bridge.root / "existing.txt").write_text("before\n")
    (bridge.root / "gone.txt").write_text("bye\n")
    command = "sleep 12; printf new > created.txt; printf more >> existing.txt; rm gone.txt; echo changed three"
    job_id = client.call("hermes_run", task=f"Change files.\nRUN: {command}", wait_s=0).field("JOB_ID")
    deadline = time.time() + 90
    running = None
    while time.time() < deadline:
        status = client.call("hermes_status", job_id=job_id, wait_s=0)
        if "CURRENT_TOOL: terminal: sleep 12;" in status.text and "(running" in status.text:
            running = status
            break
        assert status.field("STATUS") == "running", status.text
        time.sleep(0.5)
    assert running is not None, "CURRENT_TOOL never named the running terminal command"
    assert re.match(r"\d+ API calls?, \d+ tool calls?, tokens in [\d,]+ / out [\d,]+$", running.field("ACTIVITY"))
    final = finish(client, client.call("hermes_status", job_id=job_id, wait_s=45))
    assert_turn_ended(final)
    assert re.match(r"\d+ API calls?, [1-9]\d* tool calls?$", final.field("USAGE"))  # the tokens: SPEND's
    assert re.search(r"; tokens [\d,]+ \(in [\d,]+ / out [\d,]+\)", final.field("SPEND"))
    assert final.field("CHANGED_FILES") == "1 created, 1 modified, 1 deleted (under CWD, since the job started)"
    assert "+ created.txt (3 B)" in final.text and "~ existing.txt (11 B)" in final.text and "- gone.txt" in final.text
    answer = hermes_answer(final.text)
    expected = next_step([r for r in model.requests() if r.get("tools")][-1]["messages"])["content"]
    assert answer == expected and expected.startswith("SCRIPTED DONE: ") and "changed three" in expected
    assert "Deprecated" not in answer and "⚠" not in answer


def test_a_dangerous_command_under_the_cli_driver_is_denied_at_once_and_listed(real):
    """Issue 28: nobody can answer a one-shot CLI. Hermes 0.19 waited its approval timeout (60 s) for an
    answer; the bridge's managed policy (approvals.timeout 0) makes every version deny at once, and the final
    block lists the denial, read from Hermes' session store."""
    bridge, model, client = real
    (bridge.root / "build").mkdir()
    started = time.monotonic()
    result = finish(client, client.call("hermes_run", task="Clean.\nRUN: rm -rf ./build", wait_s=45), timeout=120)
    took = time.monotonic() - started
    assert_turn_ended(result)
    assert took < 45, f"the denial took {took:.0f} s"
    assert (bridge.root / "build").is_dir()
    assert "- cli-1: run `rm -rf ./build` -> deny by Hermes itself: the CLI driver cannot ask anyone" in result.text


def test_a_token_budget_stops_the_cli_as_over_budget(real):
    """Issue 29: Hermes has no token cap of its own; the bridge reads the spend from the store and stops it."""
    bridge, model, client = real
    steps = "Count.\n" + "\n".join(f"RUN: echo step {n}" for n in range(1, 31))
    result = finish(client, client.call("hermes_run", task=steps, max_tokens=60, wait_s=45), timeout=120)
    assert result.field("STATUS") == "over_budget", result.text
    assert result.field("REASON").startswith("passed max_tokens: ") and " of 60" in result.field("REASON")
    assert "SPEND: " in result.text


def test_a_cost_budget_stops_the_cli_with_hermes_own_estimate(real):
    """The scripted model prices itself as OpenRouter does ($0.0002 a call) and answers in a second, as a real one
    might: Hermes estimates the cost, the bridge stops the job once the estimate passes max_cost_usd, with at most
    one call past it (the third call passes $0.0005)."""
    bridge, model, client = real
    steps = "Count.\nPACE: 1\n" + "\n".join(f"RUN: echo step {n}" for n in range(1, 31))
    result = finish(client, client.call("hermes_run", task=steps, max_cost_usd=0.0005, wait_s=45), timeout=120)
    assert result.field("STATUS") == "over_budget", result.text
    assert re.match(r"passed max_cost_usd: \$0\.000[68] of \$0\.0005 ", result.field("REASON")), result.field("REASON")
    assert "of $0.0005 (Hermes' estimate)" in result.field("SPEND")
    assert len(model.requests()) < 30
