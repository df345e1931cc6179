"""A scripted Anthropic Messages endpoint on 127.0.0.1, for driving the real Claude Code offline.

The conversation is the script. A user message holding `HERMES_RUN: <task>` makes the answer a call of the
bridge's hermes_run tool with that task (`NO HERMES TOOLS` when the request does not offer the tool yet), and
`HERMES_CALL: <tool> <JSON arguments>` a call of any of the bridge's tools; a
tool result that comes back is acknowledged with `WAITING FOR HERMES`; once any user message carries
`STATUS: ok` (the task's completion as Claude Code reports it to the model) the answer is
`HERMES REPORTED OK`. Anything else (titles, summaries) gets `OK`. Every request body is appended to
anthropic-requests.jsonl.
"""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

RUN_TOOL = "mcp__hermes__hermes_run"


def texts(message: dict[str, Any]) -> list[str]:
    """Every piece of text in a message, tool results' content included."""
    content = message.get("content")
    if isinstance(content, str):
        return [content]
    found: list[str] = []
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, dict):
            continue
        if isinstance(block.get("text"), str):
            found.append(block["text"])
        if block.get("type") == "tool_result":
            found += texts({"content": block.get("content")})
    return found


def next_answer(body: dict[str, Any]) -> dict[str, Any]:
    """The assistant's next content block, from the conversation so far."""
    messages = [m for m in body.get("messages", []) if isinstance(m, dict)]
    users = [m for m in messages if m.get("role") == "user"]
    if any("STATUS: ok" in text for m in users for text in texts(m)):
        return {"type": "text", "text": "HERMES REPORTED OK"}
    last = users[-1] if users else {}
    if any(isinstance(b, dict) and b.get("type") == "tool_result" for b in last.get("content") or []):
        return {"type": "text", "text": "WAITING FOR HERMES"}
    tools = {tool.get("name") for tool in body.get("tools", []) if isinstance(tool, dict)}
    for text in texts(last):
        if "HERMES_CALL: " in text:
            name, _, arguments = text.split("HERMES_CALL: ", 1)[1].splitlines()[0].partition(" ")
            if f"mcp__hermes__{name}" not in tools:
                return {"type": "text", "text": "NO HERMES TOOLS"}
            return {"type": "tool_use", "id": f"toolu_{len(messages)}", "name": f"mcp__hermes__{name}",
                    "input": json.loads(arguments or "{}")}
        if "HERMES_RUN: " in text:
            if RUN_TOOL not in tools:
                return {"type": "text", "text": "NO HERMES TOOLS"}
            task = text.split("HERMES_RUN: ", 1)[1].splitlines()[0]
            return {"type": "tool_use", "id": f"toolu_{len(messages)}", "name": RUN_TOOL, "input": {"task": task}}
    return {"type": "text", "text": "OK"}


def stream_events(block: dict[str, Any], model: str) -> list[tuple[str, dict[str, Any]]]:
    """The server-sent events of one message holding one content block."""
    stop = "tool_use" if block["type"] == "tool_use" else "end_turn"
    start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}} \
        if block["type"] == "tool_use" else {"type": "text", "text": ""}
    delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])} \
        if block["type"] == "tool_use" else {"type": "text_delta", "text": block["text"]}
    usage = {"input_tokens": 10, "output_tokens": 1, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    return [
        ("message_start", {"type": "message_start", "message": {
            "id": "msg_scripted", "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": usage}}),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": start}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                           "usage": {"output_tokens": 5}}),
        ("message_stop", {"type": "message_stop"}),
    ]


class FakeAnthropic:
    """The endpoint, served from a thread while the context is open."""

    def __init__(self, log_dir: Path):
        self.log = log_dir / "anthropic-requests.jsonl"
        lock = threading.Lock()
        log = self.log

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_HEAD(self) -> None:
                self.send_response(200)
                self.end_headers()

            def do_GET(self) -> None:
                self.reply({"data": [], "has_more": False})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                with lock, log.open("a") as out:
                    out.write(json.dumps({"path": self.path, "body": body}) + "\n")
                if "count_tokens" in self.path:
                    return self.reply({"input_tokens": 100})
                if not self.path.startswith("/v1/messages"):
                    return self.reply({})
                block = next_answer(body)
                model = str(body.get("model", "claude-scripted"))
                if not body.get("stream"):
                    stop = "tool_use" if block["type"] == "tool_use" else "end_turn"
                    return self.reply({"id": "msg_scripted", "type": "message", "role": "assistant", "model": model,
                                       "content": [block], "stop_reason": stop, "stop_sequence": None,
                                       "usage": {"input_tokens": 10, "output_tokens": 5}})
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.end_headers()
                for event, data in stream_events(block, model):
                    self.wfile.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())
                self.wfile.flush()
                self.close_connection = True

            def reply(self, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "FakeAnthropic":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def requests(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        text = self.log.read_text()
        complete = text[:text.rfind("\n") + 1]  # a request still being written is read on the next look
        return [json.loads(line) for line in complete.splitlines()]
