"""Hostile input: every trick is refused with a clear reason, and nothing starts and nothing is read."""
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import server
from harness import MCP_LINE, Bridge, BridgeClient, make_fake_hermes, nothing_started, raw_exchange, refused

pytestmark = pytest.mark.posix("the fake hermes is a shell script; FIFOs and sockets")


@pytest.fixture(scope="module")
def playground(tmp_path_factory) -> Iterator[tuple[Bridge, BridgeClient]]:
    """One bridge and server for the case tables below, its root laid with every trap they name: a sibling
    folder that shares the root's prefix, symlinks out and in a loop, a file, a FIFO and a socket."""
    bridge = Bridge.create(tmp_path_factory.mktemp("playground"))
    root = bridge.root
    (root.parent / (root.name + "b")).mkdir()
    (root.parent / (root.name + "b") / "secret.txt").write_text("secret")
    (root / "out").symlink_to("/etc")
    (root / "loop").symlink_to(root / "loop")
    (root / "file.txt").write_text("not a folder")
    os.mkfifo(root / "fifo")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(root / "sock"))
    with bridge.client() as client:
        yield bridge, client
    listener.close()
    bridge.kill_leftovers()


def in_playground(root: Path, spelling: str) -> str:
    """A case's path: <root>, <root-name> and <sibling> stand for the playground's folders."""
    return (spelling.replace("<root-name>", root.name).replace("<root>", str(root))
            .replace("<sibling>", str(root.parent / (root.name + "b"))))


@pytest.mark.parametrize(("cwd", "word"), [
    ("relative/dir", "relative"), ("../a", "relative"), ("<root>/../<root-name>b", "outside"),
    ("<sibling>", "outside"), ("<root>/out", "outside"), ("<root>/loop", "cannot be resolved"),
    ("<root>/file.txt", "not a folder"), ("<root>/missing", "does not exist"), ("<root>/x\x00y", "NUL"),
    ("/" + "/".join(["d" * 200] * 30), ""),
], ids=["relative", "dot-dot", "sibling-via-dot-dot", "sibling-sharing-the-prefix", "symlink-out", "symlink-loop",
        "a-file", "missing", "NUL", "too-long"])
def test_cwd_tricks_are_refused(playground, monkeypatch, cwd, word):
    bridge, _ = playground
    arguments = server.LaunchArguments("anything", in_playground(bridge.root, cwd))
    refused(bridge.call_body(monkeypatch, "hermes_run", lambda cfg: server.run_tool(cfg, arguments, 0)), word)
    nothing_started(bridge, settle_s=0)


def test_no_roots_refuses_every_run_with_the_fix(bridge):
    bridge.configure(allowed_roots=[])
    with bridge.client() as client:
        refused(client.call("hermes_run", task="anything", cwd=str(bridge.root), wait_s=0), "no allowed_roots")
    nothing_started(bridge)


@pytest.mark.parametrize(("path", "word"), [
    ("relative.txt", "relative"), ("<root>/../<root-name>b/secret.txt", "outside"), ("<root>/out/passwd", "outside"),
    ("<root>/loop", "cannot be resolved"), ("/etc/passwd", "outside"), ("<root>/\x00", "NUL"),
    ("<root>/fifo", "not a regular file"), ("<root>/sock", "not a regular file"),
], ids=["relative", "sibling-via-dot-dot", "symlink-out", "symlink-loop", "outside", "NUL", "fifo", "socket"])
def test_read_tricks_are_refused(playground, monkeypatch, path, word):
    bridge, _ = playground
    path = in_playground(bridge.root, path)
    refused(bridge.call_body(monkeypatch, "hermes_read",
                             lambda cfg: server.listing_tool(server.read_path, cfg, path, None, None)), word)


@pytest.mark.parametrize("tool", ["hermes_status", "hermes_cancel"])
@pytest.mark.parametrize("job_id", ["../../etc/passwd", "/etc/passwd", "", "1" * 10_240, "20261130-000000-1;rm -rf ~",
                                    "$(reboot)", "20261130-000000-1/../../x", "`id`", "20261130-000000-1\n"],
                         ids=["dot-dot", "absolute", "empty", "huge", "command", "substitution", "suffix-traversal",
                              "backticks", "newline"])
def test_job_id_tricks_are_refused(playground, monkeypatch, tool, job_id):
    bridge, _ = playground
    bodies = {"hermes_status": lambda cfg: server.status_tool(cfg, job_id, 0),
              "hermes_cancel": lambda cfg: server.cancel_tool(cfg, job_id)}
    refused(bridge.call_body(monkeypatch, tool, bodies[tool]), "is not a job id")
    nothing_started(bridge, settle_s=0)


@pytest.mark.parametrize(("task", "word"), [("", "empty"), ("  \n ", "empty"), ("a\x00b", "NUL"),
                                        ("x" * 2**20, "command line")],
                         ids=["empty", "blank", "NUL", "too-long-for-the-command-line"])
def test_task_tricks_are_refused(playground, monkeypatch, task, word):
    bridge, _ = playground
    arguments = server.LaunchArguments(task)
    refused(bridge.call_body(monkeypatch, "hermes_run", lambda cfg: server.run_tool(cfg, arguments, None)), word)
    nothing_started(bridge, settle_s=0)


def test_a_host_gets_each_refusal_over_stdio(playground):
    """The tables above run the tool bodies in this process; one case of each, as a host sends it."""
    bridge, client = playground
    refused(client.call("hermes_run", task="anything", cwd=str(bridge.root / "out"), wait_s=0), "outside")
    refused(client.call("hermes_run", task="a\x00b"), "NUL")
    refused(client.call("hermes_read", path=str(bridge.root / "fifo")), "not a regular file")
    for tool in ("hermes_status", "hermes_cancel"):
        refused(client.call(tool, job_id="20261130-000000-1/../../x"), "is not a job id")
    nothing_started(bridge, settle_s=0)


def test_sparse_files_crowded_folders_and_devices_are_bounded_or_refused(bridge):
    root = bridge.root
    with open(root / "sparse.bin", "wb") as handle:
        handle.truncate(10 * 2**30)
    crowd = root / "crowd"
    crowd.mkdir()
    for n in range(100_000):
        open(crowd / f"f{n:06d}", "w").close()
    with bridge.client() as client:
        sparse = client.call("hermes_read", path=str(root / "sparse.bin"), max_bytes=10**15)
        assert sparse.field("RANGE") == f"bytes 0-262144 of {10 * 2**30}"
        assert "clamped" in sparse.text and sparse.field("BINARY").startswith("yes")
        started = time.monotonic()
        listing = client.call("hermes_read", path=str(crowd))
        assert time.monotonic() - started < 10
        assert listing.field("ENTRIES") == "100000" and "99800 more entries not shown" in listing.text
        assert len(listing.text) < 20_000
        bridge.configure(read_anywhere=True)
        for device in ("/dev/zero", "/dev/null", "/dev/urandom"):
            refused(client.call("hermes_read", path=device), "not a regular file")
        assert "root:" in client.call("hermes_read", path="/etc/passwd").text


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
    with pytest.raises(server.Refused, match="must be a number"):
        server.clamp_number("wait_s", float("nan"), 5, 0, 45)


@pytest.mark.parametrize(("arguments", "word"), [
    (dict(timeout_s=-1), "positive"), (dict(timeout_s=0), "positive"), (dict(max_turns=-3), "max_turns"),
    (dict(max_turns=10**9), "max_turns"), (dict(wait_s="soon"), "wait_s"), (dict(max_turns="many"), "max_turns"),
    (dict(max_turns=1.5), "max_turns"), (dict(timeout_s=[1]), "timeout_s"),
], ids=["negative-timeout", "zero-timeout", "negative-turns", "huge-turns", "text-wait", "text-turns",
        "fraction-turns", "list-timeout"])
def test_numbers_out_of_range_or_of_the_wrong_type_are_errors_naming_the_argument(playground, arguments, word):
    bridge, client = playground
    result = client.call("hermes_run", task="n", **arguments)
    assert result.is_error and word in result.text, result.text
    nothing_started(bridge, settle_s=0)


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


def test_a_resume_says_its_clamped_timeout_as_a_run_does(bridge):
    """The twin of the run's clamp: a resume once dropped its timeout_s note into a throwaway list."""
    with bridge.client() as client:
        session = client.call("hermes_run", task="start a session", wait_s=20).field("SESSION_ID")
        result = client.call("hermes_resume", session_id=session, task="go on !sleep=0", timeout_s=10**300)
        assert "timeout_s=1e+300 was clamped to 14400" in result.text, result.text
        assert client.wait_final(result.field("JOB_ID")).field("STATUS") == "ok"


def test_the_server_opens_no_listening_socket(bridge):
    with bridge.client() as client:
        client.call("hermes_run", task="listen? !sleep=2", wait_s=0)
        processes = [psutil.Process(client.server_pid)]
        processes += processes[0].children(recursive=True)
        for proc in processes:
            assert [c for c in proc.net_connections(kind="all") if c.status == psutil.CONN_LISTEN] == []
            assert [c for c in proc.net_connections(kind="inet")] == []
