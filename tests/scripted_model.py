"""A scripted OpenAI-compatible model endpoint on 127.0.0.1, for running the real Hermes CLI offline.

The task text is the script. Each line `RUN: <command>` (a `terminal` call with that command) or `CALL: <tool>
<JSON arguments>` (any tool) in the latest user message is one step: the model makes the first step's call,
then the next once a tool result is back, and after the last, answers `SCRIPTED DONE: <first line of the last
tool output>`. Without such lines the answer is `SCRIPTED ANSWER`. A line `PACE: <seconds>` makes every reply
take that long, as a real model's does.
Every request is appended to requests.jsonl, so tests can assert on what Hermes sent (the earlier
conversation on resume, the skill text in the system prompt).

Run as `python scripted_model.py LOG_DIR` for a manual try: it prints the base URL.
"""
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

MODEL = "scripted"
# OpenRouter-style prices in USD per token, so Hermes estimates a cost: $10 per million input and $20 per million
# output tokens, 10 + 5 tokens a call, $0.0002 a call. /api/v1/models is 404, or Hermes takes the endpoint for an
# LM Studio server, which it prices at nothing.
PRICING = {"prompt": "0.00001", "completion": "0.00002"}


def text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "\n".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""


def next_step(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """What the scripted model says next, decided from the conversation since the last user message."""
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    task = text_of(messages[last_user]) if last_user >= 0 else ""
    tool_results = [m for m in messages[last_user + 1:] if m.get("role") == "tool"]
    steps = [{"name": "terminal", "arguments": json.dumps({"command": line[4:].strip()})} if line.startswith("RUN:")
             else {"name": line[5:].split(None, 1)[0], "arguments": line[5:].split(None, 1)[1].strip()}
             for line in task.splitlines() if line.startswith(("RUN:", "CALL:"))]
    if len(tool_results) < len(steps):
        return {"tool_call": steps[len(tool_results)]}
    if tool_results:
        output = text_of(tool_results[-1]).strip().splitlines()
        return {"content": f"SCRIPTED DONE: {output[0] if output else ''}"}
    return {"content": "SCRIPTED ANSWER"}


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": MODEL, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


class Handler(BaseHTTPRequestHandler):
    server: "ScriptedModel"

    def log_message(self, *args: Any) -> None:
        pass

    def _json(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        path = self.path.rstrip("/")
        if path.endswith("/models") and not path.endswith("/api/v1/models"):
            self._json(200, {"object": "list", "data": [
                {"id": MODEL, "object": "model", "owned_by": "tests", "pricing": PRICING}]})
        else:
            self._json(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        request = json.loads(self.rfile.read(length) or b"{}")
        self.server.record({"path": self.path, "request": request, "at": time.time()})
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._json(404, {"error": {"message": "not found"}})
            return
        pace = [line[5:].strip() for message in request.get("messages", []) if message.get("role") == "user"
                for line in text_of(message).splitlines() if line.startswith("PACE:")]
        time.sleep(float(pace[-1]) if pace else 0)
        step: dict[str, Any] = (next_step(request.get("messages", [])) if request.get("tools")
                                else {"content": "scripted title"})
        if step.get("tool_call"):
            call = step["tool_call"]
            call_id = f"call_{int(time.time() * 1000)}"
            delta: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [
                {"index": 0, "id": call_id, "type": "function",
                 "function": {"name": call["name"], "arguments": call["arguments"]}}]}
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [
                {"id": call_id, "type": "function", "function": call}]}
            finish = "tool_calls"
        else:
            delta = {"role": "assistant", "content": step["content"]}
            message = {"role": "assistant", "content": step["content"]}
            finish = "stop"
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        if not request.get("stream"):
            self._json(200, {"id": "chatcmpl-scripted", "object": "chat.completion", "created": int(time.time()),
                             "model": MODEL, "usage": usage,
                             "choices": [{"index": 0, "message": message, "finish_reason": finish}]})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        final = chunk({}, finish)
        final["usage"] = usage
        for event in (chunk(delta), final):
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True


Server = TypeVar("Server", bound="RecordingServer")


class RecordingServer(ThreadingHTTPServer):
    """A scripted endpoint on 127.0.0.1 serving from a daemon thread, each request it received appended to a JSONL
    file (kept for a failed test's reader), written and read back under one lock, so a read never meets a line
    half written."""

    daemon_threads = True

    def __init__(self, log_path: Path, handler: type[BaseHTTPRequestHandler]):
        super().__init__(("127.0.0.1", 0), handler)
        self.log_path = log_path
        self._lock = threading.Lock()

    def record(self, entry: dict[str, Any]) -> None:
        with self._lock, open(self.log_path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry) + "\n")

    def entries(self) -> list[dict[str, Any]]:
        with self._lock:
            if not self.log_path.exists():
                return []
            return [json.loads(line) for line in self.log_path.read_text(encoding="utf-8").splitlines()]

    def __enter__(self: "Server") -> "Server":
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
        self.server_close()


class ScriptedModel(RecordingServer):
    """The OpenAI-compatible endpoint; `requests()` reads back what Hermes sent."""

    def __init__(self, log_dir: Path):
        super().__init__(Path(log_dir) / "requests.jsonl", Handler)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # Hermes stopped mid-reply by a cap or a cancel
            super().handle_error(request, client_address)

    def requests(self) -> list[dict[str, Any]]:
        return [entry["request"] for entry in self.entries()]

    def first_request_with(self, text: str) -> float | None:
        """When the first request whose last user message is text arrived (time.time()), or None."""
        for entry in self.entries():
            users = [m for m in entry["request"].get("messages") or [] if m.get("role") == "user"]
            if users and text_of(users[-1]) == text:
                return float(entry["at"])
        return None

if __name__ == "__main__":
    with ScriptedModel(Path(sys.argv[1] if len(sys.argv) > 1 else ".")) as model:
        print(model.base_url, flush=True)
        threading.Event().wait()
