"""A scripted Gemini API endpoint on 127.0.0.1, the planner's model for a real Gemini CLI (`gemini -p`).

The user's prompt is the script, as for scripted_responses.py: each line `CALL: <tool> <JSON arguments>` is one
step, a functionCall of the declared function whose name ends with `<tool>`; `{JOB_ID}` is the JOB_ID line of
the last function response. After the last step the answer is `PLANNER DONE` and that response's first line.
Every request is kept, so a test sees the functions Gemini CLI declared and what its model received.
"""
import json
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from scripted_responses import JOB_ID_RE

from scripted_model import RecordingServer

# The CLI's own side calls (no tools: routing, next speaker) want JSON of their own schemas; one answer has every
# key they read (an easy task, the user speaks next), and each schema ignores the others.
SIDE_ANSWER = {"complexity_reasoning": "scripted", "complexity_score": 1, "reasoning": "scripted",
               "next_speaker": "user"}


def response_text(part: dict[str, Any]) -> str:
    """A functionResponse part's text, however the CLI wrapped the tool's result."""
    response = part.get("functionResponse", {}).get("response", {})
    return response if isinstance(response, str) else json.dumps(response, ensure_ascii=False)


def declared(request: dict[str, Any]) -> list[str]:
    return [function.get("name", "") for tool in request.get("tools", []) if isinstance(tool, dict)
            for function in tool.get("functionDeclarations", []) if isinstance(function, dict)]


def conversation_parts(request: dict[str, Any]) -> tuple[str, list[str]]:
    """The script (the first user text that holds one) and the function responses since."""
    script, responses = "", list[str]()
    for content in request.get("contents", []):
        for part in content.get("parts", []) if isinstance(content, dict) else []:
            if isinstance(part.get("text"), str) and "CALL:" in part["text"] and content.get("role") == "user":
                script, responses = part["text"], []
            elif "functionResponse" in part:
                responses.append(response_text(part))
    return script, responses


def next_part(request: dict[str, Any]) -> dict[str, Any]:
    script, responses = conversation_parts(request)
    steps = [line[5:].strip().split(" ", 1) for line in script.splitlines() if line.startswith("CALL:")]
    if len(responses) < len(steps):
        suffix, arguments = steps[len(responses)]
        name = next((function for function in declared(request) if function.endswith(suffix)), suffix)
        job_ids = JOB_ID_RE.findall(responses[-1].replace("\\n", "\n")) if responses else []
        if job_ids:
            arguments = arguments.replace("{JOB_ID}", job_ids[0])
        return {"functionCall": {"name": name, "args": json.loads(arguments)}}
    last = responses[-1].replace("\\n", "\n") if responses else ""
    status = next((line for line in last.splitlines() if "STATUS:" in line), "")
    return {"text": f"PLANNER DONE: {status.strip()}"}


class Handler(BaseHTTPRequestHandler):
    server: "ScriptedGemini"

    def log_message(self, *args: Any) -> None:
        pass

    def reply(self, body: dict[str, Any], stream: bool) -> None:
        data = (f"data: {json.dumps(body)}\n\n" if stream else json.dumps(body)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream" if stream else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if ":countTokens" in self.path:
            self.reply({"totalTokens": 10}, stream=False)
            return
        self.server.record({"path": self.path, "request": request})
        part = next_part(request) if declared(request) else {"text": json.dumps(SIDE_ANSWER)}
        self.reply({"candidates": [{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP",
                                    "index": 0}],
                    "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15}},
                   stream="streamGenerateContent" in self.path)

    def do_GET(self) -> None:  # noqa: N802
        self.reply({"models": []}, stream=False)


class ScriptedGemini(RecordingServer):
    def __init__(self, log_dir: Path):
        super().__init__(log_dir / "gemini.jsonl", Handler)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def requests(self) -> list[dict[str, Any]]:
        return [entry["request"] for entry in self.entries()]

    def function_responses(self) -> list[str]:
        """What the model received from each tool call, from the last request with tools."""
        with_tools = [request for request in self.requests() if declared(request)]
        return conversation_parts(with_tools[-1])[1] if with_tools else []

