"""A scripted OpenAI Responses endpoint on 127.0.0.1, the planner's model for a real Codex CLI (`codex exec`).

The user's prompt is the script: each line `CALL: <tool> <JSON arguments>` is one step, made as a call of the
offered tool whose name ends with `<tool>` (Codex names a server's tools after the server); `{JOB_ID}` in the
arguments is the JOB_ID line of the last tool output. After the last step's output the answer is `PLANNER DONE`
and that output's first line. Every request is kept (requests()), so a test sees what Codex offered its model
(the tools) and what the model received (each tool output, whole).
"""
import json
import re
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from scripted_model import RecordingServer

JOB_ID_RE = re.compile(r"^JOB_ID: (\S+)$", re.MULTILINE)


def item_text(item: dict[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    return "\n".join(part.get("text", "") for part in content or [] if isinstance(part, dict))


def output_text(item: dict[str, Any]) -> str:
    """A function_call_output's text: a string, or a list of content parts."""
    output = item.get("output")
    if isinstance(output, str):
        return output
    return "\n".join(part.get("text", "") for part in output or [] if isinstance(part, dict))


def offered_tools(request: dict[str, Any]) -> list[tuple[str | None, str]]:
    """The function tools the model is offered, each with its namespace (Codex puts a server's tools in one)."""
    found: list[tuple[str | None, str]] = []
    for tool in request.get("tools", []):
        if isinstance(tool, dict) and tool.get("type") == "namespace":
            found += [(tool.get("name"), inner.get("name", "")) for inner in tool.get("tools", [])]
        elif isinstance(tool, dict) and tool.get("name"):
            found.append((None, tool["name"]))
    return found


def next_item(request: dict[str, Any]) -> dict[str, Any]:
    """The model's next output item, decided from the input since the user's last message."""
    items = [item for item in request.get("input", []) if isinstance(item, dict)]
    last_user = max((n for n, item in enumerate(items) if item.get("role") == "user"), default=-1)
    script = item_text(items[last_user]) if last_user >= 0 else ""
    outputs = [output_text(item) for item in items[last_user + 1:] if item.get("type") == "function_call_output"]
    steps = [line[5:].strip().split(" ", 1) for line in script.splitlines() if line.startswith("CALL:")]
    if len(outputs) < len(steps):
        suffix, arguments = steps[len(outputs)]
        namespace, name = next(((space, tool) for space, tool in offered_tools(request) if tool.endswith(suffix)),
                               (None, suffix))
        job_ids = JOB_ID_RE.findall(outputs[-1]) if outputs else []
        if job_ids:
            arguments = arguments.replace("{JOB_ID}", job_ids[0])
        call = {"type": "function_call", "id": f"fc_{len(outputs)}", "call_id": f"call_{len(outputs)}", "name": name,
                "arguments": arguments, "status": "completed"}
        return {**call, "namespace": namespace} if namespace else call
    last = outputs[-1].splitlines()[0] if outputs and outputs[-1] else ""
    return {"type": "message", "id": "msg_0", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": f"PLANNER DONE: {last}", "annotations": []}]}


class Handler(BaseHTTPRequestHandler):
    server: "ScriptedResponses"

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = json.dumps({"object": "list", "data": []}).encode()
        self.send_response(200 if self.path.rstrip("/").endswith("/models") else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        self.server.record(request)
        item = next_item(request)
        number = len(self.server.requests())
        events: list[tuple[str, dict[str, Any]]] = [("response.created", {"response": {"id": f"resp_{number}"}}),
                  ("response.output_item.added", {"output_index": 0, "item": item})]
        if item["type"] == "message":
            events.append(("response.output_text.delta", {"output_index": 0, "content_index": 0, "item_id": "msg_0",
                                                          "delta": item["content"][0]["text"]}))
        events += [("response.output_item.done", {"output_index": 0, "item": item}),
                   ("response.completed", {"response": {"id": f"resp_{number}", "output": [item], "usage": {
                       "input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 5,
                       "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 15}}})]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        for kind, data in events:
            self.wfile.write(f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode())
        self.wfile.flush()
        self.close_connection = True


class ScriptedResponses(RecordingServer):
    def __init__(self, log_dir: Path):
        super().__init__(log_dir / "responses.jsonl", Handler)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def requests(self) -> list[dict[str, Any]]:
        return self.entries()

    def tool_outputs(self) -> list[str]:
        """Every tool output the model received, in order, from the last request (it holds the whole turn)."""
        last = self.requests()[-1] if self.requests() else {}
        return [output_text(item) for item in last.get("input", []) if isinstance(item, dict)
                and item.get("type") == "function_call_output"]

