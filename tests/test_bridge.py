"""The bridge end to end, through the real stdio transport with the official MCP client."""
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

import server
from harness import SERVER, BridgeClient, make_fake_hermes, wait_gone

pytestmark = pytest.mark.posix("the fake hermes is a shell script")

EXPECTED_ARGS = {
    "hermes_run": ({"task"}, {"task", "cwd", "max_turns", "timeout_s", "wait_s", "skills", "toolsets"}),
    "hermes_resume": ({"session_id", "task"}, {"session_id", "task", "cwd", "max_turns", "timeout_s", "wait_s"}),
    "hermes_status": ({"job_id"}, {"job_id", "wait_s"}),
    "hermes_jobs": (set(), {"limit", "state"}),
    "hermes_read": ({"path"}, {"path", "max_bytes", "offset"}),
    "hermes_capabilities": (set(), {"query", "category", "limit"}),
    "hermes_health": (set(), set()),
    "hermes_cancel": ({"job_id"}, {"job_id"}),
    "hermes_approve": ({"job_id", "approval_id", "decision"}, {"job_id", "approval_id", "decision"}),
}
READ_ONLY = {"hermes_status", "hermes_jobs", "hermes_read", "hermes_capabilities", "hermes_health"}


def test_tools_list_exactly_the_nine_tools_with_arguments_annotations_and_instructions(bridge):
    with bridge.client() as client:
        tools = {tool.name: tool for tool in client.portal.call(client.session.list_tools).tools}
        assert set(tools) == set(EXPECTED_ARGS)
        for name, (required, allowed) in EXPECTED_ARGS.items():
            schema = server.either(tools[name], "input_schema")
            assert set(schema.get("required", [])) == required, name
            assert set(schema["properties"]) == allowed, name
            assert tools[name].description and "\n " not in tools[name].description, name
            hints = tools[name].annotations
            assert server.either(hints, "read_only_hint") is (name in READ_ONLY), name
        assert server.either(tools["hermes_cancel"].annotations, "destructive_hint") is True
        assert server.either(tools["hermes_approve"].annotations, "destructive_hint") is True
        assert server.either(tools["hermes_run"].annotations, "idempotent_hint") is False
        assert server.either(tools["hermes_run"].annotations, "open_world_hint") is True
        instructions = client.init.instructions
        assert str(bridge.root) in instructions
        assert "hermes_status" in instructions and "hermes_read" in instructions


def test_run_returns_running_fast_then_status_collects_ok_output_and_session(bridge):
    with bridge.client() as client:
        started = time.monotonic()
        first = client.call("hermes_run", task="make the thing !sleep=2 !session=20261130_104857_89284b",
                            wait_s=0)
        assert time.monotonic() - started < 5  # wait_s=0: it does not wait for the job's 2 s
        assert not first.is_error
        assert first.field("STATUS") == "running"
        job_id = first.field("JOB_ID")
        assert "Do not re-run" in first.text
        final = client.wait_final(job_id)
        assert final.field("STATUS") == "ok"
        assert final.field("EXIT_CODE") == "0"
        assert final.field("SESSION_ID") == "20261130_104857_89284b"
        assert "FAKE DONE: make the thing" in final.text
        run = bridge.runs()[0]
        assert run["cwd"] == str(bridge.root.resolve())
        assert run["task"] == "make the thing !sleep=2 !session=20261130_104857_89284b"
        assert run["argv"][1] == "--query=" + run["task"] and "-Q" in run["argv"]


def test_failing_run_ends_error_with_its_exit_code(bridge):
    with bridge.client() as client:
        result = client.call("hermes_run", task="fail please !exit=3", wait_s=20)
        assert result.field("STATUS") == "error"
        assert result.field("EXIT_CODE") == "3"
        assert "exited with code 3" in result.field("REASON")


def test_timeout_stops_the_whole_tree_grandchildren_included(bridge):
    with bridge.client() as client:
        job_id = client.call("hermes_run", task="hang !grandchild=120 !sleep=120", timeout_s=2,
                             wait_s=0).field("JOB_ID")
        bridge.wait_for_runs(1)
        final = client.wait_final(job_id)
        assert final.field("STATUS") == "timeout"
        assert final.field("EXIT_CODE") == "130"  # the fake exits 130 on SIGTERM, as Hermes does
        assert "timeout_s=2" in final.field("REASON")
        pids = bridge.traced_pids()
        assert len(pids) == 3  # hermes, its tool process, and that one's child
        assert wait_gone(pids) == []


def test_cancel_ends_cancelled_and_leaves_no_process(bridge):
    with bridge.client() as client:
        job_id = client.call("hermes_run", task="long !grandchild=120 !sleep=120", wait_s=0).field("JOB_ID")
        bridge.wait_for_traced(3)
        result = client.call("hermes_cancel", job_id=job_id)
        assert result.field("STATUS") == "cancelled", result.text
        assert wait_gone(bridge.traced_pids()) == []
        again = client.call("hermes_cancel", job_id=job_id)
        assert "already ended as cancelled" in again.text


def test_a_later_server_process_collects_a_job_whose_server_was_killed(bridge):
    with bridge.client() as first:
        job_id = first.call("hermes_run", task="outlive the server !sleep=3", wait_s=0).field("JOB_ID")
        bridge.wait_for_runs(1)
        os.kill(first.server_pid, signal.SIGKILL)
    with bridge.client() as second:
        final = second.wait_final(job_id)
        assert final.field("STATUS") == "ok"
        assert final.field("EXIT_CODE") == "0"
        assert "FAKE DONE: outlive the server" in final.text


def test_identical_run_while_running_returns_the_same_job_and_starts_no_second_hermes(bridge):
    with bridge.client() as client:
        first = client.call("hermes_run", task="same work !sleep=3", wait_s=0)
        second = client.call("hermes_run", task="same work !sleep=3", wait_s=0)
        assert first.field("JOB_ID") == second.field("JOB_ID")
        assert "identical job is already running" in second.text
        client.wait_final(first.field("JOB_ID"))
        assert len(bridge.runs()) == 1


NOISY_WRAPPER = """
import os, runpy, subprocess, sys
try:
    from mcp.server.mcpserver import MCPServer as FastMCP  # mcp 2.x
except ImportError:
    from mcp.server.fastmcp import FastMCP  # mcp 1.x
original = FastMCP.call_tool
async def noisy_call_tool(self, name, arguments, *rest, **options):
    print("print() from inside a tool")
    os.write(1, b"raw write to fd 1 without a newline")
    subprocess.run(["sh", "-c", "echo child writes to its inherited stdout"])
    return await original(self, name, arguments, *rest, **options)
FastMCP.call_tool = noisy_call_tool
sys.argv = [sys.argv[1]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_print_in_a_tool_and_a_child_writing_to_fd1_do_not_break_the_session(bridge):
    wrapper = bridge.tmp / "noisy_server.py"
    wrapper.write_text(NOISY_WRAPPER)
    with BridgeClient(bridge.env, command=[sys.executable, str(wrapper), str(SERVER)]) as client:
        for _ in range(3):
            assert client.call("hermes_health").field("BRIDGE").startswith("claude-hermes-bridge")
        result = client.call("hermes_run", task="noisy child !stdout-noise", wait_s=20)
        assert result.field("STATUS") == "ok"
        assert "noise on fd 1" in result.text
        assert "print() from inside a tool" in client.stderr()


def test_check_passes_on_a_good_install(bridge):
    done = subprocess.run([sys.executable, str(SERVER), "--check"], env=bridge.env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "CHECK: OK" in done.stdout
    assert "tools: 9 (exactly the declared tools)" in done.stdout


def test_check_fails_when_the_tools_differ_or_the_server_cannot_start(bridge, tmp_path):
    import anyio

    other = tmp_path / "other_server.py"
    other.write_text("try:\n    from mcp.server.mcpserver import MCPServer as FastMCP  # mcp 2.x\n"
                     "except ImportError:\n    from mcp.server.fastmcp import FastMCP  # mcp 1.x\n"
                     "mcp = FastMCP('x')\n"
                     "@mcp.tool()\ndef hermes_health() -> str:\n    return 'fine'\nmcp.run()\n")
    ok, report = anyio.run(server.check_server, [sys.executable, str(other)], bridge.env)
    assert not ok and any("MISMATCH" in line for line in report)
    ok, report = anyio.run(server.check_server, [sys.executable, "-c", "import sys; sys.exit(3)"], bridge.env, 20)
    assert not ok and any("did not complete the handshake" in line for line in report)


@pytest.mark.parametrize("found", ["3.0.0", "1.20.0"])
def test_wrong_mcp_sdk_is_one_line_with_the_fix_and_exit_2(bridge, tmp_path, found):
    shadow = tmp_path / "shadow"
    (shadow / f"mcp-{found}.dist-info").mkdir(parents=True)
    (shadow / f"mcp-{found}.dist-info" / "METADATA").write_text(f"Metadata-Version: 2.1\nName: mcp\nVersion: {found}\n")
    env = dict(bridge.env, PYTHONPATH=str(shadow))
    for args in ([], ["--check"]):
        done = subprocess.run([sys.executable, str(SERVER), *args], env=env, capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL)
        assert done.returncode == 2
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1
        assert f"mcp {found}" in lines[0] and sys.executable in lines[0] and "mcp>=1.24,<3" in lines[0]


@pytest.mark.parametrize("personality", ["0.19", "0.20", "0.21"])
def test_auto_builds_the_command_line_each_hermes_declares_whatever_its_version_on_disk_says(bridge, personality):
    """Every fake claims version 0.20.1 on disk (as an upstream 0.20.1 install does); only the flags that
    `hermes chat --help` declares decide the command line, probed once and cached."""
    exe = make_fake_hermes(bridge.tmp / f"hermes-{personality}", personality=personality, version="0.20.1")
    bridge.configure(hermes_exe=str(exe))
    task = "-leading dash with 'quotes' \"double\" $HOME `cmd` ; | & \n second line"
    with bridge.client() as client:
        assert client.call("hermes_health").field("CLI_FLAGS").startswith("not known yet")
        assert bridge.invocations() == []  # hermes_health never starts Hermes, not even to probe it
        result = client.call("hermes_run", task=task, wait_s=30)
        assert result.field("STATUS") == "ok", result.text
        run = bridge.runs()[0]
        assert run["task"] == task
        assert run["cwd"] == str(bridge.root.resolve())
        stdin_form = personality >= "0.21"
        assert ("--query-file" in run["argv"]) == stdin_form
        assert (f"--in={bridge.root.resolve()}" in run["argv"]) == (personality >= "0.20")
        assert result.field("SESSION_ID") != "none captured"  # 0.21 prints none: found in the session store
        health = client.call("hermes_health")
        assert ("--query-file" in health.field("CLI_FLAGS")) == stdin_form
        assert "<task>" in health.field("CLI_COMMAND")
        assert client.call("hermes_run", task="second run", wait_s=30).field("STATUS") == "ok"
    probes = [argv for argv in bridge.invocations() if argv == ["chat", "--help"]]
    assert len(probes) == 1  # probed once, then cached
    check = subprocess.run([sys.executable, str(SERVER), "--check"], env=bridge.env, capture_output=True,
                           text=True, timeout=120)
    assert f"CLI_FLAGS: {health.field('CLI_FLAGS')}" in check.stdout
    assert "CLI_COMMAND: " in check.stdout and "<task>" in check.stdout


@pytest.mark.parametrize(("forced", "personality"), [("query-arg", "0.21"), ("query-file", "0.19")])
def test_hermes_cli_form_in_config_wins_over_the_probe(bridge, forced, personality):
    exe = make_fake_hermes(bridge.tmp / "h", personality=personality)
    bridge.configure(hermes_exe=str(exe), hermes_cli_form=forced)
    with bridge.client() as client:
        result = client.call("hermes_run", task="forced form", wait_s=30)
    argv = bridge.invocations()[-1]
    assert ("--query-file" in argv) == (forced == "query-file")
    assert ["chat", "--help"] not in bridge.invocations()
    if forced == "query-file":  # a 0.19 given the 0.21 form rejects it, and the reason says where to look
        assert result.field("EXIT_CODE") == "2" and "hermes_health" in result.field("REASON")


def test_resume_latest_resumes_the_captured_session_and_reports_a_fresh_one(bridge):
    with bridge.client() as client:
        first = client.call("hermes_run", task="first !session=20261130_000000_aaaaaa", wait_s=20)
        assert first.field("SESSION_ID") == "20261130_000000_aaaaaa"
        resumed = client.call("hermes_resume", session_id="latest", task="continue", wait_s=20)
        assert resumed.field("STATUS") == "ok"
        assert resumed.field("SESSION_ID") == "20261130_000000_aaaaaa"
        assert "SESSION_NOTE" not in resumed.text
        argv = bridge.runs()[-1]["argv"]
        assert "--resume=20261130_000000_aaaaaa" in argv
        fresh = client.call("hermes_resume", session_id="20261130_000000_aaaaaa", task="again !fresh-session",
                            wait_s=20)
        assert "started a fresh session" in fresh.field("SESSION_NOTE")
        bad = client.call("hermes_resume", session_id="../x", task="t")
        assert bad.is_error and "not a session id" in bad.text


def test_skills_toolsets_and_argument_errors(bridge):
    with bridge.client() as client:
        result = client.call("hermes_run", task="with skills", skills=["github-pr", "code/review"],
                             toolsets="terminal,file", max_turns=7, wait_s=99999)
        assert result.field("STATUS") == "ok"
        assert "wait_s=99999 was clamped to 45" in result.text
        argv = bridge.runs()[0]["argv"]
        assert "--skills=github-pr,code/review" in argv and "--toolsets=terminal,file" in argv
        assert "--max-turns=7" in argv
        refusals: list[dict[str, Any]] = [
            dict(task=""), dict(task="   "), dict(task="x", skills=["bad name!"]), dict(task="x", skills=[""]),
            dict(task="x", timeout_s=-5), dict(task="x", timeout_s=0), dict(task="x", max_turns=0),
            dict(task="x", max_turns=100000), dict(task="a\x00b"), dict(task="x" * 200_000),
        ]
        for arguments in refusals:
            refused = client.call("hermes_run", **arguments)
            assert refused.is_error and refused.field("STATUS") == "refused", arguments
        negative = client.call("hermes_status", job_id=result.field("JOB_ID"), wait_s=-3)
        assert negative.field("STATUS") == "ok" and "clamped to 0" in negative.text
        wrong_type = client.call("hermes_status", job_id=result.field("JOB_ID"), wait_s="soon")
        assert wrong_type.is_error
    assert len(bridge.runs()) == 1


def test_max_running_jobs_refuses_and_lists_the_running_jobs(bridge):
    bridge.configure(max_running_jobs=1)
    with bridge.client() as client:
        first = client.call("hermes_run", task="occupy !sleep=30", wait_s=0)
        refused = client.call("hermes_run", task="another", wait_s=0)
        assert refused.is_error and "max_running_jobs" in refused.text
        assert first.field("JOB_ID") in refused.text
        client.call("hermes_cancel", job_id=first.field("JOB_ID"))


def test_read_pages_files_lists_folders_and_refuses_outside(bridge):
    (bridge.root / "notes.txt").write_text("0123456789" * 10)
    (bridge.root / "sub").mkdir()
    (bridge.root / "blob.bin").write_bytes(b"\x00\x01binary")
    os.mkfifo(bridge.root / "pipe")
    (bridge.root / "out").symlink_to("/etc")
    with bridge.client() as client:
        page = client.call("hermes_read", path=str(bridge.root / "notes.txt"), max_bytes=30, offset=10)
        assert page.field("RANGE") == "bytes 10-40 of 100"
        assert page.text.endswith("\n" + ("0123456789" * 3))
        assert "offset=40" in page.field("CUT")
        tail = client.call("hermes_read", path=str(bridge.root / "notes.txt"), offset=-15)
        assert tail.field("RANGE") == "bytes 85-100 of 100"
        whole = client.call("hermes_read", path=str(bridge.root / "notes.txt"))
        assert whole.field("CUT") == "no"
        listing = client.call("hermes_read", path=str(bridge.root))
        assert listing.field("ENTRIES") == "5"
        assert [line.split()[-1] for line in listing.text.splitlines()[2:]] == sorted(
            ["notes.txt", "sub", "blob.bin", "pipe", "out"])
        assert client.call("hermes_read", path=str(bridge.root / "blob.bin")).field("BINARY").startswith("yes")
        # the refusals (a FIFO, outside the roots, a symlink out, relative, devices) are test_hostile's cases
        job = client.call("hermes_run", task="log me", wait_s=20)
        log = client.call("hermes_read", path=job.field("FULL_LOG"))
        assert "FAKE DONE: log me" in log.text


def test_capabilities_summarises_ranks_and_lists_categories(bridge):
    skills = bridge.tmp / "hermes-home" / "skills"
    def skill(rel, front):
        path = skills / rel / "SKILL.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(front)
    skill("github/github-pr-workflow", "---\nname: github-pr-workflow\ndescription: Open and review pull "
          "requests\nmetadata:\n  hermes:\n    tags: [git, review]\n---\nbody\n")
    skill("github/github-issues", "---\nname: github-issues\ndescription: Triage issues\n---\n")
    skill("devops/docker/compose-up", "---\nname: compose-up\ndescription: Start services with compose\n---\n")
    skill("loose-skill", "---\nname: loose-skill\ndescription: no category\n---\n")
    skill("broken/bad-yaml", "---\nname: [unclosed\n---\n")
    skill("broken/no-front", "just text\n")
    with bridge.client() as client:
        summary = client.call("hermes_capabilities")
        assert "SKILLS: 4 (2 skipped)" in summary.text
        assert "SKIPPED: broken/bad-yaml/SKILL.md: invalid YAML" in summary.text
        assert "SKIPPED: broken/no-front/SKILL.md: no YAML front matter" in summary.text
        assert "github (2): github-issues, github-pr-workflow" in summary.text
        assert "devops (1): compose-up" in summary.text and "uncategorised (1): loose-skill" in summary.text
        ranked = client.call("hermes_capabilities", query="review pull requests")
        assert ranked.text.split("MATCHES")[1].splitlines()[1].startswith("- github-pr-workflow [github]")
        listing = client.call("hermes_capabilities", category="github", limit=1)
        assert "CATEGORY github: 2 skills" in listing.text and listing.text.count("\n- ") == 1
        missing = client.call("hermes_capabilities", category="nope")
        assert missing.is_error and "devops" in missing.text


def test_health_lists_every_config_problem_and_tools_refuse_with_the_fix(bridge):
    bridge.config.write_text('{\n "allowed_roots": [\n')
    with bridge.client() as client:
        health = client.call("hermes_health")
        assert "line 3 column 1" in health.text
        refused = client.call("hermes_run", task="x")
        assert refused.is_error and "allowed_roots" in refused.text
    bridge.config.write_text('{"allowed_roots": ["/does/not/exist"], "colour": "blue", "yolo": "yes", '
                             '"max_wait_s": 500, "hermes_exe": "' + str(bridge.hermes) + '"}')
    with bridge.client() as client:
        text = client.call("hermes_health").text
        for problem in ("'/does/not/exist' does not exist", "unknown key 'colour'", "yolo must be true or false",
                        "max_wait_s 500"):
            assert problem in text
        assert "CONFIG:" in text and "(4 problems)" in text


def test_a_waiting_status_call_sends_progress_and_returns_within_its_wait(bridge):
    with bridge.client() as client:
        job_id = client.call("hermes_run", task="slow !sleep=30", wait_s=0).field("JOB_ID")
        progress = []

        async def on_progress(done, total, message):
            progress.append((done, total, message))
        started = time.monotonic()
        result = client.portal.call(lambda: client.session.call_tool(
            "hermes_status", {"job_id": job_id, "wait_s": 6}, progress_callback=on_progress))
        took = time.monotonic() - started
        assert "STATUS: running" in result.content[0].text
        assert 5.5 <= took < 6 + 3  # waits its wait_s, and no longer (slack for a loaded machine)
        assert progress and progress[0][1] == 6 and job_id in progress[0][2]
        client.call("hermes_cancel", job_id=job_id)


def test_status_wait_is_clamped_to_max_wait_s(bridge):
    with bridge.client() as client:
        job_id = client.call("hermes_run", task="quick", wait_s=20).field("JOB_ID")
        result = client.call("hermes_status", job_id=job_id, wait_s=99999)
    assert "wait_s=99999 was clamped to 45" in result.text


def test_the_duplicate_guard_keys_on_the_folder_too(bridge):
    other = bridge.root / "sub"
    other.mkdir()
    with bridge.client() as client:
        first = client.call("hermes_run", task="same task !sleep=5", wait_s=0).field("JOB_ID")
        second = client.call("hermes_run", task="same task !sleep=5", cwd=str(other), wait_s=0).field("JOB_ID")
        again = client.call("hermes_run", task="same task !sleep=5", wait_s=0)
        assert first != second and again.field("JOB_ID") == first
        for job_id in (first, second):
            client.wait_final(job_id)


def test_cancelling_an_orphan_clears_its_active_marker(bridge):
    with bridge.client() as client:
        job_id = client.call("hermes_run", task="!sleep=60", wait_s=0).field("JOB_ID")
        bridge.wait_for_runs(1)
        supervisor = bridge.wait_record(job_id, "supervisor")
        os.kill(supervisor.pid, signal.SIGKILL)
        wait_gone([supervisor.pid])
        assert client.call("hermes_status", job_id=job_id, wait_s=0).field("STATUS") == "orphaned"
        assert client.call("hermes_cancel", job_id=job_id).field("STATUS") == "cancelled"
    assert not (bridge.jobs / "active" / job_id).exists()


def test_a_resume_without_a_session_line_claims_no_session_none(bridge):
    exe = make_fake_hermes(bridge.tmp / "h21", personality="0.21")
    bridge.configure(hermes_exe=str(exe))
    with bridge.client() as client:
        first = client.call("hermes_run", task="first", wait_s=20)
        session = first.field("SESSION_ID")
        resumed = client.call("hermes_resume", session_id=session, task="again", wait_s=20)
    assert resumed.field("STATUS") == "ok", resumed.text
    assert resumed.field("SESSION_ID") == session
    assert "None" not in resumed.text and "reported session" not in resumed.text
