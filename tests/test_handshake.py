"""Issue 67: the host's `initialize` answered before the MCP SDK is imported, from the answer the SDK gave the
last start with the same request, code, settings and SDK; through the real stdio transport with the official
MCP client, and the early reading of the host's first message on a pipe."""
import json
import os
from pathlib import Path
from typing import Any

import pytest

from claude_hermes_bridge.handshake import AnswerFilter, EarlyStart, answer_early
from harness import Bridge, BridgeClient

pytestmark = pytest.mark.sdk_lines  # what the two lines write when they answer initialize

EARLY = "initialize answered before the SDK was imported"


def start(bridge: Bridge, cache: Path) -> tuple[Any, str, str]:
    """One server's start: its initialize result, its stderr, and hermes_health's STATUS through it."""
    env = dict(bridge.env, XDG_CACHE_HOME=str(cache))
    with BridgeClient(env) as client:
        health = client.call("hermes_health").text
        return client.init, client.stderr(), health


def kept_answers(cache: Path) -> list[Path]:
    return sorted((cache / "claude-hermes-bridge" / "initialize").glob("*.json"))


def test_the_next_start_answers_initialize_before_the_sdk_and_serves_as_before(bridge: Bridge, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first, first_log, _ = start(bridge, cache)
    assert EARLY not in first_log
    assert len(kept_answers(cache)) == 1
    second, second_log, health = start(bridge, cache)
    assert EARLY in second_log
    assert second.model_dump() == first.model_dump()  # the same answer, and the session goes on as before
    assert "BRIDGE: claude-hermes-bridge" in health
    assert len(kept_answers(cache)) == 1


def test_a_changed_setting_is_answered_by_the_sdk_with_what_it_changed(bridge: Bridge, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    start(bridge, cache)
    other = tmp_path / "roots" / "b"
    other.mkdir(parents=True)
    bridge.configure(allowed_roots=[str(other)])
    changed, log, _ = start(bridge, cache)
    assert EARLY not in log
    assert str(other) in (changed.instructions or "")  # the server's instructions name the new root
    assert len(kept_answers(cache)) == 2


def test_a_kept_answer_unlike_the_sdks_is_said_and_replaced(bridge: Bridge, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first, _, _ = start(bridge, cache)
    [kept] = kept_answers(cache)
    stale = json.loads(kept.read_text())
    stale["instructions"] = "an answer kept by an older server"
    kept.write_text(json.dumps(stale))
    _, log, health = start(bridge, cache)
    assert EARLY in log and "differed from the SDK's" in log
    assert "BRIDGE: claude-hermes-bridge" in health
    assert json.loads(kept.read_text())["instructions"] == first.instructions
    _, log, _ = start(bridge, cache)
    assert EARLY in log and "differed" not in log


def test_a_first_message_that_is_not_initialize_is_left_to_the_sdk() -> None:
    to_server, host_writes = os.pipe()
    host_reads, from_server = os.pipe()
    try:
        os.write(host_writes, b'{"jsonrpc": "2.0", "id": 7, "method": "ping"}\n{"jsonrpc"')
        early = answer_early((to_server, from_server), [])
        assert early.request_id is None and early.answered is None
        assert early.read == b'{"jsonrpc": "2.0", "id": 7, "method": "ping"}\n{"jsonrpc"'  # the SDK reads it all
        os.set_blocking(host_reads, False)
        with pytest.raises(BlockingIOError):  # nothing was answered
            os.read(host_reads, 100)
    finally:
        for fd in (to_server, host_writes, host_reads, from_server):
            os.close(fd)


class Lines:
    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> int:
        self.text += text
        return len(text)

    def flush(self) -> None:
        pass


def test_the_sdks_answer_is_dropped_once_even_written_in_pieces(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    out = Lines()
    answered = {"protocolVersion": "2025-06-18", "serverInfo": {"name": "hermes"}}
    written = AnswerFilter(out, EarlyStart(b"", 3, "k", answered))
    reply = json.dumps({"jsonrpc": "2.0", "id": 3, "result": answered})
    written.write(reply[:10])
    written.write(reply[10:] + "\n" + '{"jsonrpc": "2.0", "id": 3, "result": {}}\n')
    assert out.text == '{"jsonrpc": "2.0", "id": 3, "result": {}}\n'  # a later message with that id passes
