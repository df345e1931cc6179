"""Hostile input: every trick is refused with a clear reason, and nothing starts and nothing is read."""
import os
import socket
import time
from typing import Any

import psutil
import pytest

import server
from harness import MCP_LINE, make_fake_hermes, nothing_started, raw_exchange, refused

pytestmark = pytest.mark.posix("the fake hermes is a shell script; FIFOs and sockets")


def test_cwd_tricks_are_refused(bridge):
    root = bridge.root
    (root.parent / (root.name + "b")).mkdir()
    outside = bridge.tmp / "outside"
    outside.mkdir()
    (root / "out").symlink_to(outside)
    (root / "loop").symlink_to(root / "loop")
    (root / "file.txt").write_text("not a folder")
    cases = {
        "relative/dir": "relative", "../a": "relative", str(root / ".." / (root.name + "b")): "outside",
        str(root.parent / (root.name + "b")): "outside", str(root / "out"): "outside",
        str(root / "loop"): "cannot be resolved", str(root / "file.txt"): "not a folder",
        str(root / "missing"): "does not exist", str(root) + "/x\x00y": "NUL",
        "/" + "/".join(["d" * 200] * 30): "",
    }
    with bridge.client() as client:
        for cwd, word in cases.items():
            refused(client.call("hermes_run", task="anything", cwd=cwd, wait_s=0), word)
        bridge.configure(allowed_roots=[])
        refused(client.call("hermes_run", task="anything", cwd=str(root), wait_s=0), "no allowed_roots")
    nothing_started(bridge)


def test_read_tricks_special_files_and_huge_inputs_are_refused_or_bounded(bridge):
    root = bridge.root
    (root.parent / (root.name + "b")).mkdir()
    (root.parent / (root.name + "b") / "secret.txt").write_text("secret")
    (root / "out").symlink_to("/etc")
    (root / "loop").symlink_to(root / "loop")
    os.mkfifo(root / "fifo")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(root / "sock"))
    with open(root / "sparse.bin", "wb") as handle:
        handle.truncate(10 * 2**30)
    crowd = root / "crowd"
    crowd.mkdir()
    for n in range(100_000):
        open(crowd / f"f{n:06d}", "w").close()
    with bridge.client() as client:
        for path, word in {"relative.txt": "relative", str(root / ".." / (root.name + "b") / "secret.txt"): "outside",
                           str(root / "out" / "passwd"): "outside", str(root / "loop"): "cannot be resolved",
                           "/etc/passwd": "outside", str(root) + "/\x00": "NUL"}.items():
            refused(client.call("hermes_read", path=path), word)
        for special in ("fifo", "sock"):
            refused(client.call("hermes_read", path=str(root / special)), "not a regular file")
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
    listener.close()


def test_job_id_tricks_are_refused(bridge):
    with bridge.client() as client:
        for job_id in ("../../etc/passwd", "/etc/passwd", "", "1" * 10_240, "20261130-000000-1;rm -rf ~",
                       "$(reboot)", "20261130-000000-1/../../x", "`id`", "20261130-000000-1\n"):
            for tool in ("hermes_status", "hermes_cancel"):
                refused(client.call(tool, job_id=job_id), "is not a job id")


def test_task_tricks_reach_hermes_byte_for_byte_or_are_refused(bridge):
    hostile = "it's \"quoted\" $HOME $(id) `id` ; rm -rf / | cat & > /tmp/bridge-hostile-marker \\ ' \n\t émoji 🚀"
    with bridge.client() as client:
        for task, word in (("", "empty"), ("  \n ", "empty"), ("a\x00b", "NUL"), ("x" * 2**20, "command line")):
            refused(client.call("hermes_run", task=task), word)
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
        server.clamp_number("wait_s", float("nan"), 5, 0, 45, [])


def test_numbers_out_of_range_or_of_the_wrong_type(bridge):
    with bridge.client() as client:
        arguments: dict[str, Any]
        for arguments, word in ((dict(timeout_s=-1), "positive"), (dict(timeout_s=0), "positive"),
                                (dict(max_turns=-3), "max_turns"), (dict(max_turns=10**9), "max_turns")):
            refused(client.call("hermes_run", task="n", **arguments), word)
        for arguments in (dict(wait_s="soon"), dict(max_turns="many"), dict(max_turns=1.5), dict(timeout_s=[1])):
            assert client.call("hermes_run", task="n", **arguments).is_error, arguments
        assert client.call("hermes_jobs", limit="all").is_error
        assert "clamped" in client.call("hermes_jobs", limit=10**12).text
        result = client.call("hermes_run", task="numbers !sleep=0", timeout_s=10**300, wait_s=-10**300)
        assert "timeout_s=1e+300 was clamped to 14400" in result.text and "clamped to 0" in result.text
        final = client.wait_final(result.field("JOB_ID"))
        assert final.field("STATUS") == "ok"
        far_back = client.call("hermes_read", path=final.field("FULL_LOG"), offset=-10**30)
        assert far_back.field("RANGE").startswith("bytes 0-")
    assert len(bridge.runs()) == 1


def test_the_server_opens_no_listening_socket(bridge):
    with bridge.client() as client:
        client.call("hermes_run", task="listen? !sleep=2", wait_s=0)
        processes = [psutil.Process(client.server_pid)]
        processes += processes[0].children(recursive=True)
        for proc in processes:
            assert [c for c in proc.net_connections(kind="all") if c.status == psutil.CONN_LISTEN] == []
            assert [c for c in proc.net_connections(kind="inet")] == []
