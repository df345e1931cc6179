"""Launching a job: what hermes_run and hermes_resume accept and refuse (arguments, tasks, numbers), the command line
each Hermes gets, the duplicate guard and the running-jobs limit, the stdout guard, and the tool bodies run without
MCP."""
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from mcp.types import Tool

from claude_hermes_bridge.bodies import Listing, run_tool, run_tool_body, status_tool
from claude_hermes_bridge.cli import either
from claude_hermes_bridge.config import SETTINGS_ENV, Config
from claude_hermes_bridge.drivers import plan_launch
from claude_hermes_bridge.hermes_cli import (
    FORM_FLAGS,
    POSIX_ARGUMENT_LIMIT,
    QUERY_OPTION,
    HermesCli,
    argv_problem,
    exe_fingerprint,
    hermes_command,
)
from claude_hermes_bridge.jobs import JobRecord
from claude_hermes_bridge.preflight import SERVER_DIR
from claude_hermes_bridge.render import ToolResult
from claude_hermes_bridge.safe_io import Refused
from claude_hermes_bridge.tools import LaunchArguments, clamp_number, list_jobs
from harness import (
    APP_ONLY_TOOLS,
    APPS_CAPABILITIES,
    BOUND_STRETCH,
    EXPECTED_ARGS,
    MCP_LINE,
    READ_ONLY,
    SERVER,
    Bridge,
    BridgeClient,
    listed_tools,
    make_fake_hermes,
    nothing_started,
    raw_exchange,
    refused,
    running_record,
)

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
    subprocess.run([sys.executable, "-c", "print('child writes to its inherited stdout')"])
    return await original(self, name, arguments, *rest, **options)
FastMCP.call_tool = noisy_call_tool
sys.argv = [sys.argv[1]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.sdk_lines
def test_tools_list_exactly_the_tools_with_arguments_annotations_and_instructions(bridge):
    with bridge.client() as client:
        tools = {tool.name: tool for tool in client.portal.call(client.session.list_tools).tools}
        assert set(tools) == set(EXPECTED_ARGS) - APP_ONLY_TOOLS  # issue 49: this client declared no MCP Apps
        tools.update({tool["name"]: Tool.model_validate(tool) for tool in listed_tools(bridge, APPS_CAPABILITIES)})
        for name, (required, allowed) in EXPECTED_ARGS.items():
            schema = either(tools[name], "input_schema")
            assert set(schema.get("required", [])) == required, name
            assert set(schema["properties"]) == allowed, name
            assert tools[name].description and "\n " not in tools[name].description, name
            hints = tools[name].annotations
            assert either(hints, "read_only_hint") is (name in READ_ONLY), name
        assert either(tools["hermes_cancel"].annotations, "destructive_hint") is True
        assert either(tools["hermes_approve"].annotations, "destructive_hint") is True
        assert either(tools["hermes_land"].annotations, "destructive_hint") is True
        assert either(tools["hermes_view_answer"].annotations, "destructive_hint") is True
        assert either(tools["hermes_run"].annotations, "idempotent_hint") is False
        assert either(tools["hermes_run"].annotations, "open_world_hint") is True
        instructions = client.init.instructions
        assert str(bridge.root) in instructions
        assert "hermes_status" in instructions and "hermes_read" in instructions
        assert "gives you the JOB_ID as that task id" in instructions  # issue 49: the task is the job


@pytest.mark.sdk_lines
def test_run_returns_running_fast_then_status_collects_ok_output_and_session(bridge):
    with bridge.client() as client:
        started = time.monotonic()
        first = client.call("hermes_run", task="make the thing !sleep=2 !session=20261130_104857_89284b",
                            wait_s=0)
        assert time.monotonic() - started < 5 * BOUND_STRETCH  # wait_s=0: it does not wait for the job's 2 s
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


def test_identical_run_while_running_returns_the_same_job_and_starts_no_second_hermes(bridge):
    with bridge.client() as client:
        first = client.call("hermes_run", task="same work !sleep=3", wait_s=0)
        second = client.call("hermes_run", task="same work !sleep=3", wait_s=0)
        assert first.field("JOB_ID") == second.field("JOB_ID")
        assert "identical job is already running" in second.text
        client.wait_final(first.field("JOB_ID"))
        assert len(bridge.runs()) == 1


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


def test_max_running_jobs_refuses_and_lists_the_running_jobs_when_the_queue_is_off(bridge):
    bridge.configure(max_running_jobs=1, max_queued_jobs=0)
    with bridge.client() as client:
        first = client.call("hermes_run", task="occupy !sleep=30", wait_s=0)
        refused = client.call("hermes_run", task="another", wait_s=0)
        assert refused.is_error and "max_running_jobs" in refused.text
        assert first.field("JOB_ID") in refused.text
        client.call("hermes_cancel", job_id=first.field("JOB_ID"))


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


@pytest.mark.posix("FIFOs and sockets")
@pytest.mark.parametrize(("task", "word"), [("", "empty"), ("  \n ", "empty"), ("a\x00b", "NUL"),
                                        ("x" * 2**20, "command line")],
                         ids=["empty", "blank", "NUL", "too-long-for-the-command-line"])
def test_task_tricks_are_refused(playground, monkeypatch, task, word):
    bridge, _ = playground
    arguments = LaunchArguments(task)
    refused(bridge.call_body(monkeypatch, "hermes_run", lambda cfg: run_tool(cfg, arguments, None)), word)
    nothing_started(bridge, settle_s=0)


@pytest.mark.posix("a shell wrapper")
def test_a_probe_past_the_deadline_says_it_waited_on_hermes_and_its_answer_is_kept(bridge, monkeypatch):
    """A Hermes whose first start outlasts the tool's deadline (the Windows lane's under load took over 20 s):
    the result names the probe, not the disk, no job starts, and the next launch finds the answer kept."""
    import claude_hermes_bridge.bodies as bodies

    fake = make_fake_hermes(bridge.tmp / "slow-venv")
    slow = fake.parent / "hermes-slow"
    asked = bridge.trace / "asked"  # the probe runs confined: the trace folder is sandbox_writable
    slow.write_text(f'#!/bin/sh\n[ "$1 $2" = "chat --help" ] && echo >> "{asked}" && sleep 1.5\nexec "{fake}" "$@"\n')
    slow.chmod(0o755)
    bridge.configure(hermes_exe=str(slow), hermes_driver="cli")
    monkeypatch.setattr(bodies, "DISK_DEADLINE_S", 0.3)
    waited = bridge.call_body(monkeypatch, "hermes_run", lambda cfg: run_tool(cfg, LaunchArguments("a task"), 0))
    assert waited.field("STATUS") == "error", waited.text
    assert "waiting for Hermes to answer `hermes chat --help`" in waited.text and "disk" not in waited.text
    assert list(bridge.jobs.glob("2*.json")) == []
    monkeypatch.setattr(bodies, "DISK_DEADLINE_S", 20.0)
    deadline = time.monotonic() + 10
    while not (bridge.jobs / "cli_flags_cache.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # the probe goes on in its thread, and keeps its answer
    started = bridge.call_body(monkeypatch, "hermes_run", lambda cfg: run_tool(cfg, LaunchArguments("a task"), 0))
    assert started.field("STATUS") in ("running", "ok"), started.text
    assert asked.read_text() == "\n"  # asked once: the second launch used the kept answer


@pytest.mark.posix("FIFOs and sockets")
@pytest.mark.sdk_lines
def test_a_host_gets_each_refusal_over_stdio(playground):
    """The tables above run the tool bodies in this process; one case of each, as a host sends it."""
    bridge, client = playground
    refused(client.call("hermes_run", task="anything", cwd=str(bridge.root / "out"), wait_s=0), "outside")
    refused(client.call("hermes_run", task="a\x00b"), "NUL")
    refused(client.call("hermes_read", path=str(bridge.root / "fifo")), "not a regular file")
    for tool in ("hermes_status", "hermes_cancel"):
        refused(client.call(tool, job_id="20261130-000000-1/../../x"), "is not a job id")
    nothing_started(bridge, settle_s=0)


@pytest.mark.posix("FIFOs and sockets")
def test_shell_syntax_in_a_task_reaches_hermes_byte_for_byte(bridge):
    hostile = "it's \"quoted\" $HOME $(id) `id` ; rm -rf / | cat & > /tmp/bridge-hostile-marker \\ ' \n\t émoji 🚀"
    with bridge.client() as client:
        result = client.call("hermes_run", task=hostile, wait_s=20)
        assert result.field("STATUS") == "ok"
    assert bridge.runs()[0]["task"] == hostile
    assert not os.path.exists("/tmp/bridge-hostile-marker")
    big = "y" * 2**20 + " !exit=0"
    bridge.configure(hermes_exe=str(make_fake_hermes(bridge.tmp / "new", personality="0.21", version="0.21.0")))
    with bridge.client() as client:
        result = client.call("hermes_run", task=big, wait_s=30)
        assert result.field("STATUS") == "ok", result.text
    assert bridge.runs()[1]["task"] == big


@pytest.mark.posix("FIFOs and sockets")
@pytest.mark.sdk_lines
def test_lone_surrogates_and_nan_never_hang_the_server(bridge):
    """The official client cannot send these; a raw JSON-RPC peer can. A lone surrogate used to get no
    answer at all (the SDK could not parse the request), so the host waited for its timeout."""
    (bridge.root / "f.txt").write_text("text")
    replies = raw_exchange(bridge.env, [
        '{"name":"hermes_run","arguments":{"task":"bad \\ud800 text"}}',
        '{"name":"hermes_run","arguments":{"task":"\\udfff"}}',
        '{"name":"hermes_read","arguments":{"path":"%s","max_bytes":NaN}}' % (bridge.root / "f.txt"),
        '{"name":"hermes_health","arguments":{}}',
        '{"name":"hermes_read","arguments":{"path":"/nowhere/\\ud83d\\ude80"}}',
    ])
    for reply in replies[:2]:
        assert reply["result"]["isError"] and "invalid Unicode" in reply["result"]["content"][0]["text"]
    # mcp 1.x turns NaN into null before any tool sees it, so NaN acts as "not given" and the default
    # applies; mcp 2.x refuses it by name. Either way the call is answered.
    nan_reply = replies[2]["result"]["content"][0]["text"]
    assert "CUT: no" in nan_reply if MCP_LINE == 1 else "max_bytes" in nan_reply
    assert "BRIDGE: claude-hermes-bridge" in replies[3]["result"]["content"][0]["text"]
    assert "/nowhere/\U0001f680" in replies[4]["result"]["content"][0]["text"]  # an escaped pair is kept
    nothing_started(bridge)
    with pytest.raises(Refused, match="must be a number"):
        clamp_number("wait_s", float("nan"), 5, 0, 45)


@pytest.mark.posix("FIFOs and sockets")
@pytest.mark.parametrize(("arguments", "word"), [
    (dict(timeout_s=-1), "positive"), (dict(timeout_s=0), "positive"), (dict(max_turns=-3), "max_turns"),
    (dict(max_turns=10**9), "max_turns"), (dict(wait_s="soon"), "wait_s"), (dict(max_turns="many"), "max_turns"),
    (dict(max_turns=1.5), "max_turns"), (dict(timeout_s=[1]), "timeout_s"),
], ids=["negative-timeout", "zero-timeout", "negative-turns", "huge-turns", "text-wait", "text-turns",
        "fraction-turns", "list-timeout"])
@pytest.mark.sdk_lines
def test_numbers_out_of_range_or_of_the_wrong_type_are_errors_naming_the_argument(playground, arguments, word):
    bridge, client = playground
    result = client.call("hermes_run", task="n", **arguments)
    assert result.is_error and word in result.text, result.text
    nothing_started(bridge, settle_s=0)


@pytest.mark.posix("FIFOs and sockets")
@pytest.mark.sdk_lines
def test_numbers_too_large_are_clamped_and_said_so(bridge):
    with bridge.client() as client:
        assert client.call("hermes_jobs", limit="all").is_error
        assert "clamped" in client.call("hermes_jobs", limit=10**12).text
        result = client.call("hermes_run", task="numbers !sleep=0", timeout_s=10**300, wait_s=-10**300)
        assert "timeout_s=1e+300 was clamped to 14400" in result.text and "clamped to 0" in result.text
        final = client.wait_final(result.field("JOB_ID"))
        assert final.field("STATUS") == "ok"
        far_back = client.call("hermes_read", path=final.field("FULL_LOG"), offset=-10**30)
        assert far_back.field("RANGE").startswith("bytes 0-")
    assert len(bridge.runs()) == 1


@pytest.mark.posix("FIFOs and sockets")
def test_a_resume_says_its_clamped_timeout_as_a_run_does(bridge):
    """The twin of the run's clamp: a resume once dropped its timeout_s note into a throwaway list."""
    with bridge.client() as client:
        session = client.call("hermes_run", task="start a session", wait_s=20).field("SESSION_ID")
        result = client.call("hermes_resume", session_id=session, task="go on !sleep=0", timeout_s=10**300)
        assert "timeout_s=1e+300 was clamped to 14400" in result.text, result.text
        assert client.wait_final(result.field("JOB_ID")).field("STATUS") == "ok"


@pytest.mark.parametrize(("form", "expected"), [
    ("query-arg", ["hermes", "chat", "--query=-do it", "-Q", "--max-turns=5", "--resume=S", "--skills=a,b",
                   "--toolsets=t", "--yolo", "--source", "tool"]),
    ("query-file", ["hermes", "chat", "--query-file", "-", "-Q", "--oneshot", "--in=/w", "--max-turns=5",
                    "--resume=S", "--skills=a,b", "--toolsets=t", "--yolo", "--source", "tool"]),
], ids=["0.19-form", "0.21-form"])
def test_command_lines_join_every_value_to_its_option(form, expected):
    """A task or id starting with '-' can never be read as an option: each value is joined with '='."""
    cfg = Config(path=SERVER_DIR / "config.json", yolo=True, extra_args=["--source", "tool"])
    record = running_record(cwd="/w", max_turns=5, session_requested="S", skills=["a", "b"], toolsets=["t"])
    cli = HermesCli(FORM_FLAGS[form], "test")
    assert hermes_command(cli, "hermes", record, "-do it", cfg) == expected


def test_the_flags_a_0_20_hermes_declares_give_in_but_not_query_file():
    cli = HermesCli(frozenset({"--query", "--quiet", "--in", "--resume"}), "test")
    cfg = Config(path=SERVER_DIR / "config.json")
    argv = hermes_command(cli, "hermes", running_record(cwd="/w"), "task", cfg)
    assert argv == ["hermes", "chat", "--query=task", "-Q", "--in=/w"]


def test_tool_bodies_run_without_mcp_and_every_outcome_is_a_result_with_one_audit_line(tmp_path, monkeypatch):
    """The shared step every tool goes through: a refusal, a bug and a listing each come back as a result,
    never raised, and each leaves one audit line taken from the result's fields."""
    import anyio

    logs = tmp_path / "logs"
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"allowed_roots": [str(tmp_path)], "jobs_dir": str(tmp_path / "jobs"),
                                  "logs_dir": str(logs)}))
    monkeypatch.setenv("HERMES_BRIDGE_CONFIG", str(config))
    monkeypatch.delenv(SETTINGS_ENV, raising=False)

    async def broken(_cfg: Config) -> ToolResult:
        raise RuntimeError("boom")
    refused = anyio.run(run_tool_body, "hermes_status", lambda cfg: status_tool(cfg, "../x", 0))
    error = anyio.run(run_tool_body, "hermes_jobs", broken)
    listing = anyio.run(run_tool_body, "hermes_jobs",
                        Listing(list_jobs, (None, None)))
    assert refused.status == "refused" and refused.is_error and "is not a job id" in refused.text
    assert error.status == "error" and "internal error in hermes_jobs: RuntimeError: boom" in error.text
    assert listing.status == "ok" and not listing.is_error and "No jobs yet" in listing.text
    lines = [json.loads(line) for line in (logs / "audit.log").read_text().splitlines()]
    assert [(line["tool"], line["outcome"]) for line in lines] == [
        ("hermes_status", "refused"), ("hermes_jobs", "error"), ("hermes_jobs", "ok")]


def test_hermes_upgraded_in_place_at_the_same_path_is_probed_again(tmp_path):
    exe = tmp_path / "hermes"
    exe.write_text("#!/bin/sh\necho 0.19\n")
    first = exe_fingerprint(str(exe))
    exe.write_text("#!/bin/sh\necho 0.22 upgraded\n")
    os.utime(exe, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    assert exe_fingerprint(str(exe)) != first


def test_a_multibyte_task_near_the_posix_argument_limit_is_refused_by_its_bytes():
    fits = "é" * ((POSIX_ARGUMENT_LIMIT - len(QUERY_OPTION)) // 2)
    assert argv_problem(["hermes", QUERY_OPTION + fits], windows=False) is None
    too_long = fits + "é"  # fewer characters than the limit, more bytes
    assert len(QUERY_OPTION + too_long) < POSIX_ARGUMENT_LIMIT
    problem = argv_problem(["hermes", QUERY_OPTION + too_long], windows=False)
    assert problem and "bytes" in problem


@pytest.mark.posix("FIFOs, symlinks and POSIX signals")
def test_a_stale_flags_cache_costs_one_job_not_every_later_one(bridge):
    """The fake 0.19 declares no --query-file: a cache that says it does makes one job exit 2."""
    with bridge.client() as client:
        assert client.call("hermes_run", task="probe", wait_s=20).field("STATUS") == "ok"
        cache = bridge.jobs / "cli_flags_cache.json"
        forged = {key: ["--query-file", "--oneshot", "--in"] for key in json.loads(cache.read_text())}
        cache.write_text(json.dumps(forged))
        first = client.call("hermes_run", task="fails once on the forged flags", wait_s=20)
        assert first.field("STATUS") == "error" and first.field("EXIT_CODE") == "2"
        second = client.call("hermes_run", task="probed again", wait_s=20)
        assert second.field("STATUS") == "ok", second.text


@pytest.mark.posix("POSIX signals")
def test_two_servers_racing_the_identical_run_start_exactly_one_hermes(bridge):
    bridge.configure(max_running_jobs=50)
    with bridge.client() as one, bridge.client() as two, ThreadPoolExecutor(2) as pool:
        for round_number in range(20):
            barrier = threading.Barrier(2)

            def launch(client, barrier=barrier, round_number=round_number):
                barrier.wait()
                return client.call("hermes_run", task=f"race {round_number} !sleep=4", wait_s=0)
            first, second = pool.map(launch, (one, two))
            assert first.field("JOB_ID") == second.field("JOB_ID"), round_number
        bridge.wait_for_runs(20)
        time.sleep(1)
        tasks = [run["task"] for run in bridge.runs()]
        assert sorted(tasks) == sorted(f"race {n} !sleep=4" for n in range(20))
        assert len(list(bridge.jobs.glob("2*.json"))) == 20


@pytest.mark.parametrize(("driver", "form", "argv", "on_stdin"), [
    ("cli", "query-arg", ["chat", "--query=do it", "-Q"], False),
    ("cli", "query-file", ["chat", "--query-file", "-", "-Q", "--oneshot", "--in=<folder>"], True),
    ("acp", "query-arg", ["acp"], False),
], ids=["cli-task-on-the-command-line", "cli-task-on-stdin", "acp-task-in-the-prompt"])
def test_the_launch_plan_is_the_drivers_with_the_task_where_this_hermes_reads_it(tmp_path, driver, form, argv,
                                                                                  on_stdin):
    cfg = Config(path=tmp_path / "config.json", hermes_cli_form=form)
    folder = str(tmp_path)
    record = JobRecord(id="20261201-000000-1", cwd=folder, driver=driver)
    task_file = tmp_path / "task"
    plan = plan_launch(cfg, "/opt/hermes", record, "do it", folder, task_file)
    assert plan is not None
    assert plan.argv == ["/opt/hermes", *[part.replace("<folder>", folder) for part in argv]]
    assert plan.stdin_path == (task_file if on_stdin else None) and plan.folder == folder and plan.task == "do it"
    assert "do it" not in " ".join(plan.shown_argv)


def test_a_launch_plan_whose_command_line_cannot_hold_the_task_is_refused_and_unknown_options_wait(tmp_path):
    cfg = Config(path=tmp_path / "config.json", hermes_cli_form="query-arg")
    record = JobRecord(id="20261201-000000-1", cwd=str(tmp_path), driver="cli")
    with pytest.raises(Refused, match="shorten it"):
        plan_launch(cfg, "/opt/hermes", record, "x" * (POSIX_ARGUMENT_LIMIT + 1), str(tmp_path))
    auto = Config(path=tmp_path / "config.json", jobs_dir=str(tmp_path / "jobs"))
    assert plan_launch(auto, "/opt/hermes", record, "t", str(tmp_path), probe=lambda _c, _e: None) is None


def test_toolsets_and_skills_are_refused_over_acp_where_they_would_do_nothing(bridge: Bridge) -> None:
    """Issue 65: under the ACP driver toolsets=["file"] still gave Hermes its terminal, silently; they are
    refused at the call, saying why and what works, and nothing starts."""
    bridge.configure(hermes_driver="acp")
    client = bridge.client()
    client.params.env = dict(bridge.env, FAKE_HERMES_ACP="1")
    with client:
        refused_call = client.call("hermes_run", task="x", toolsets=["file"], skills=["code-review"])
        plain = client.call("hermes_run", task="x !write=a.txt:1", wait_s=30)
    assert refused(refused_call), refused_call.text
    assert ("skills and toolsets would do nothing here: this job drives Hermes over ACP" in refused_call.text
            and 'set hermes_driver to "cli"' in refused_call.text), refused_call.text
    assert plain.field("STATUS") == "ok", plain.text
    assert len(bridge.runs()) == 1
