"""The fake Hermes' ACP side (`hermes acp`), for the fast tests: JSON-RPC 2.0 over stdin and stdout as Hermes
0.19/0.22 speak it (initialize, session/new, session/load, session/prompt, session/cancel, session/update
events, session/request_permission), driven by directives in the prompt:

!ask=CMD  a dangerous command: asks, then runs CMD with sh when allowed (reports BLOCKED when denied)
!ask-twice=CMD  the same, asked twice in a row (the answer says which option was chosen each time)
!ask-then=CMD  one more dangerous command asked after those (in CMD, + is a space and \\n a line break)
!edit=PATH:TEXT  a file edit (one per such word): asks (kind edit, a diff), then writes TEXT when allowed
!tool-sleep=S  a terminal tool call sleeping S seconds in its own session (session/cancel kills it)
!refuse  answers the prompt with stopReason refusal
!stop=REASON  answers the prompt with that stopReason (upstream's max_tokens, max_turn_requests)
!linger  after its turn, does not exit when its input closes (a Hermes whose way out hangs)

While a turn runs, a second session/prompt `/steer TEXT` is taken as Hermes takes it (a message chunk
"⏩ Steer queued for the active turn: ...", then its own result), and the answer lists what was steered;
`/queue TEXT` runs as a turn of its own after this one, before the first prompt's result. Each is traced to
TRACE/<pid>.steered. `/steer` on an idle session runs as a plain prompt, as 0.22.2's does.

Upstream's unreleased forms: !keepalive  empty message chunks (its 45 s keep-alive) through the turn;
!hermes-notices  `_hermes/*` notifications, and a `_hermes/*` request the client must refuse.

Hostile directives, for what a buggy or hostile `hermes acp` may send:
!junk  messages of the wrong shape first: a session/update whose params are a list, a permission request
       whose params are a string, one whose options are a number, a line that is not JSON, a line nested
       200,000 deep, a reply to an id never asked
!asks=N  N permission requests at once (ids 0..N-1, then one more with id 0 again and one with id null),
       each a dangerous command; the answer says how many were allowed
!many-edits=N  N edit requests at once (write_file inside the folder; nothing is written)
!big-answer=N  an answer of N non-ASCII characters
!calls=N  N API calls, 0.3 s apart, recorded in the store (ACP ignores max_turns, as Hermes' ACP does)

An unanswered question is denied after approvals.timeout from $HERMES_MANAGED_DIR/config.yaml (60 s by
default), as Hermes 0.22 does. `hermes acp --check` passes only with FAKE_HERMES_ACP=1, like a Hermes with
its acp extra. Every run is traced like the CLI form, with the managed policy it saw.
"""
from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

OUT_LOCK = threading.Lock()


def send(message: dict[str, Any]) -> None:
    with OUT_LOCK:
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
        sys.stdout.flush()


def update(session: str, body: dict[str, Any]) -> None:
    send({"method": "session/update", "params": {"sessionId": session, "update": body}})


def text(value: str) -> list[dict[str, Any]]:
    return [{"type": "content", "content": {"type": "text", "text": value}}]


def managed_policy() -> str:
    folder = os.environ.get("HERMES_MANAGED_DIR")
    try:
        return open(os.path.join(folder, "config.yaml")).read() if folder else ""
    except OSError:
        return ""


def approval_timeout() -> float:
    found = re.search(r"timeout:\s*(\d+)", managed_policy())
    return float(found.group(1)) if found else 60.0


class Agent:
    def __init__(self, store: Any, trace: str):
        self.inbox: queue.Queue[dict[str, Any]] = queue.Queue()
        self.replies: dict[int, queue.Queue[dict[str, Any]]] = {}
        self.next_request = 0
        self.cancelled = threading.Event()
        self.chosen: list[str] = []  # the option the client chose for each question, told in the answer
        self.store = store
        self.trace = trace
        self.cwd = os.getcwd()
        self.turn: str | None = None  # the session whose turn runs now
        self.steered: list[str] = []
        self.queued: list[str] = []
        self.linger = False
        threading.Thread(target=self.read, daemon=True).start()

    def read(self) -> None:
        for line in sys.stdin:
            message = json.loads(line)
            if "method" not in message and message.get("id") in self.replies:
                self.replies[message["id"]].put(message)
            elif message.get("method") == "session/cancel":
                self.cancelled.set()
            elif message.get("method") == "session/prompt" and self.turn is not None and self.steer(message):
                pass
            else:
                self.inbox.put(message)
        self.inbox.put({"method": "eof"})

    def steer(self, message: dict[str, Any]) -> bool:
        """A /steer or /queue prompt while a turn runs, answered as Hermes does; False for any other prompt."""
        words = "".join(block.get("text", "") for block in message["params"].get("prompt") or [])
        command, _, guidance = words.partition(" ")
        if command not in ("/steer", "/queue"):
            return False
        if command == "/steer":
            self.steered.append(guidance)
            reply = f"\u23e9 Steer queued for the active turn: {guidance[:80]}"
        else:
            self.queued.append(guidance)
            reply = f"Queued for the next turn. ({len(self.queued)} queued)"
        if self.trace:
            with open(os.path.join(self.trace, f"{os.getpid()}.steered"), "a") as handle:
                handle.write(json.dumps([command, guidance]) + "\n")
        update(str(self.turn), {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": reply}})
        send({"id": message["id"], "result": {"stopReason": "end_turn"}})
        return True

    def ask(self, session: str, tool_call: dict[str, Any], options: list[dict[str, str]]) -> bool:
        request_id = self.next_request
        self.next_request += 1
        self.replies[request_id] = queue.Queue()
        send({"id": request_id, "method": "session/request_permission",
              "params": {"sessionId": session, "toolCall": tool_call, "options": options}})
        try:
            reply = self.replies[request_id].get(timeout=approval_timeout())
        except queue.Empty:
            return False  # Hermes denies by itself; the request is never withdrawn
        outcome = (reply.get("result") or {}).get("outcome") or {}
        self.chosen.append(str(outcome.get("optionId")))
        return outcome.get("outcome") == "selected" and outcome.get("optionId") in ("allow_once", "allow_session",
                                                                                  "allow_always")

    def ask_many(self, session: str, requests: list[tuple[Any, dict[str, Any]]]) -> int:
        """Several permission requests at once (ids as given, reused or null too); how many were allowed."""
        waiting: queue.Queue[dict[str, Any]] = queue.Queue()
        for request_id, tool_call in requests:
            self.replies[request_id] = waiting
            send({"id": request_id, "method": "session/request_permission", "params": {
                "sessionId": session, "toolCall": tool_call, "options": [
                    {"optionId": "allow_once", "kind": "allow_once"}, {"optionId": "deny", "kind": "reject_once"}]}})
        allowed = 0
        for _ in requests:
            try:
                reply = waiting.get(timeout=approval_timeout() + 5)
            except queue.Empty:
                break
            outcome = (reply.get("result") or {}).get("outcome") or {}
            allowed += outcome.get("optionId") == "allow_once"
        return allowed

    def junk(self) -> None:
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "method": "session/update", "params": [1, 2]}) + "\n")
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": 900, "method": "session/request_permission",
                                     "params": "run everything"}) + "\n")
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": 901, "method": "session/request_permission",
                                     "params": {"toolCall": {"kind": "execute"}, "options": 5}}) + "\n")
        sys.stdout.write("this is not json\n")
        sys.stdout.write("[" * 200_000 + "]" * 200_000 + "\n")
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": 424242, "result": {"stopReason": "end_turn"}}) + "\n")
        sys.stdout.flush()

    def hostile(self, session: str, todo: dict[str, str]) -> str:
        """The hostile directives (see the module's text); what they add to the answer."""
        extra = ""
        for _ in range(3 if "keepalive" in todo else 0):
            update(session, {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": ""}})
        if "hermes-notices" in todo:
            send({"method": "_hermes/session_title", "params": {"sessionId": session, "title": "<b>x</b>"}})
            send({"method": "_hermes/progress", "params": [1, 2, 3]})
            send({"id": 777, "method": "_hermes/ask_client", "params": {"sessionId": session}})
        if "junk" in todo:
            with OUT_LOCK:
                self.junk()
        if "asks" in todo:
            count = int(todo["asks"])
            requests: list[tuple[Any, dict[str, Any]]] = [
                (n, {"toolCallId": f"perm-check-{n}", "kind": "execute", "rawInput": {
                    "command": f"rm -rf ./build-{n}", "description": "recursive delete"}}) for n in range(count)]
            requests += [(0, {"kind": "execute", "rawInput": {"command": "rm -rf ./again", "description": "reused"}}),
                         (None, {"kind": "execute", "rawInput": {"command": "rm -rf ./null", "description": "null"}})]
            extra += f" allowed {self.ask_many(session, requests)} of {len(requests)}"
        if "many-edits" in todo:
            edits: list[tuple[Any, dict[str, Any]]] = [
                (f"edit-{n}", {"toolCallId": f"edit-approval-{n}", "kind": "edit", "rawInput": {
                    "tool": "write_file", "arguments": {"path": f"notes/{n}.txt", "content": "x"}}})
                for n in range(int(todo["many-edits"]))]
            extra += f" edits allowed {self.ask_many(session, edits)}"
        if "big-answer" in todo:
            extra += " " + "\u0436" * int(todo["big-answer"])
        return extra

    def run(self) -> int:
        while True:
            message = self.inbox.get()
            method, params = message.get("method"), message.get("params") or {}
            if method == "eof":
                if self.linger:
                    time.sleep(600)
                return 0
            if method == "initialize":
                time.sleep(float(os.environ.get("FAKE_ACP_INIT_DELAY", "0")))  # a slow start, to catch one midway
                send({"id": message["id"], "result": {"protocolVersion": 1, "agentInfo": {
                    "name": "hermes-agent", "version": os.environ.get("FAKE_ACP_VERSION", "0.22.2")},
                    "agentCapabilities": {"loadSession": True}}})
            elif method == "session/new" and os.environ.get("FAKE_ACP_NO_MODEL") == "1":  # as 0.22.2 says it
                send({"id": message["id"], "error": {"code": -32603, "message": "Internal error", "data": {
                    "details": "provider 'custom' resolved without credentials (no endpoint or API key configured)."}}})
            elif method == "session/new":
                session = str(uuid.uuid4())
                self.cwd = params.get("cwd") or self.cwd
                self.store.new_session(session, None)  # Hermes 0.19 records no folder for an ACP session
                send({"id": message["id"], "result": {"sessionId": session}})
            elif method == "session/load":
                self.cwd = params.get("cwd") or self.cwd
                if not self.store.has_session(params.get("sessionId")):
                    send({"id": message["id"], "error": {"code": -32002, "message": "session not found"}})
                else:
                    send({"id": message["id"], "result": {}})
            elif method == "session/prompt":
                import colorsys  # noqa: F401  (imported at the first prompt, as Hermes imports its model client)
                prompt = "".join(block.get("text", "") for block in params.get("prompt") or [])
                if prompt.startswith("claude-hermes-bridge: recording"):  # a late standby's recording, held up
                    time.sleep(float(os.environ.get("FAKE_ACP_RECORDING_DELAY", "0")))
                if prompt.startswith("/steer "):  # idle: the guidance runs as the prompt
                    prompt = prompt[len("/steer "):]
                self.linger = self.linger or "!linger" in prompt
                self.turn = params["sessionId"]
                try:
                    result = self.prompt(params["sessionId"], prompt)
                    while self.queued and result.get("stopReason") == "end_turn":
                        queued = self.queued.pop(0)
                        update(params["sessionId"], {"sessionUpdate": "agent_message_chunk", "content": {
                            "type": "text", "text": f" QUEUED TURN: {queued}"}})
                finally:
                    self.turn = None
                send({"id": message["id"], "result": result})
            elif "id" in message:  # as 0.19.0's and 0.22.2's JSON-RPC layer answers a method it does not know
                send({"id": message["id"], "error": {"code": -32601, "message": "Method not found",
                                                     "data": {"method": method}}})

    def prompt(self, session: str, prompt: str) -> dict[str, Any]:
        todo = {name: value for name, _, value in (w[1:].partition("=") for w in prompt.split() if w.startswith("!"))}
        if self.trace:
            with open(os.path.join(self.trace, f"{os.getpid()}.json"), "w") as handle:
                json.dump({"argv": sys.argv[1:], "cwd": self.cwd, "task": prompt, "pid": os.getpid(),
                           "hermes_home": os.environ.get("HERMES_HOME"), "marker": os.environ.get("HERMES_BRIDGE_JOB"),
                           "policy": managed_policy(), "yolo_env": os.environ.get("HERMES_YOLO_MODE")}, handle)
        if "refuse" in todo:
            return {"stopReason": "refusal"}

        extra = self.hostile(session, todo)

        allow_deny = [{"optionId": "allow_once", "kind": "allow_once", "name": "Allow once"},
                      {"optionId": "allow_session", "kind": "allow_always", "name": "Allow for session"},
                      {"optionId": "allow_always", "kind": "allow_always", "name": "Allow always"},
                      {"optionId": "deny", "kind": "reject_once", "name": "Deny"},
                      {"optionId": "deny_always", "kind": "reject_always", "name": "Deny always"}]
        asked = [todo.get("ask") or todo.get("ask-twice")] * (2 if "ask-twice" in todo else 1 if "ask" in todo else 0)
        for word in [*asked, *([todo["ask-then"]] if "ask-then" in todo else [])]:
            command = str(word).replace("+", " ").replace("\\n", "\n")
            update(session, {"sessionUpdate": "tool_call", "toolCallId": "tc-1", "kind": "execute",
                             "title": "terminal: display.preview.shell", "content": text(f"$ {command}")})
            allowed = self.ask(session, {"toolCallId": "perm-check-1", "kind": "execute", "status": "pending",
                                         "title": f"dangerous: {command}", "content": text(f"dangerous\n$ {command}"),
                                         "rawInput": {"command": command, "description": "dangerous"}}, allow_deny)
            if allowed:
                done = subprocess.run(["sh", "-c", command], cwd=self.cwd, capture_output=True, text=True)
                update(session, {"sessionUpdate": "tool_call_update", "toolCallId": "tc-1", "status": "completed",
                                 "content": text(f"exit_code: {done.returncode}\n{done.stdout}")})
            else:
                update(session, {"sessionUpdate": "tool_call_update", "toolCallId": "tc-1", "status": "failed",
                                 "content": text("BLOCKED: User denied this command")})
        edits = [word[len("!edit="):] for word in prompt.split() if word.startswith("!edit=")]
        for edit in edits:
            path, _, new_text = edit.partition(":")
            diff = {"type": "diff", "path": path, "oldText": None, "newText": new_text}
            allowed = self.ask(session, {"toolCallId": "edit-approval-1", "kind": "edit", "status": "pending",
                                         "title": f"Approve edit: {path}", "content": [diff],
                                         "rawInput": {"tool": "write_file", "arguments": {"path": path}}},
                               [allow_deny[0], allow_deny[3]])
            if allowed:
                with open(os.path.join(self.cwd, path), "w") as handle:
                    handle.write(new_text)
        for number in range(int(todo.get("calls") or 0)):  # ACP ignores agent.max_turns, as Hermes' does
            if self.cancelled.is_set():
                return {"stopReason": "cancelled"}
            self.store.api_call(session, f"echo step {number + 1}")
            time.sleep(0.3)
        if "tool-sleep" in todo:
            update(session, {"sessionUpdate": "tool_call", "toolCallId": "tc-2", "kind": "execute",
                             "title": "terminal", "content": text(f"$ sleep {todo['tool-sleep']}")})
            sleep = [sys.executable, "-c", f"import time; time.sleep({float(todo['tool-sleep'])})"]
            tool = subprocess.Popen(sleep, cwd=self.cwd, start_new_session=True)  # Windows: a process of its own
            if self.trace:
                Path(self.trace, f"{tool.pid}.child").write_text("tool")
            while tool.poll() is None:
                if self.cancelled.wait(0.1):
                    tool.kill()
                    tool.wait()
                    return {"stopReason": "cancelled"}
            update(session, {"sessionUpdate": "tool_call_update", "toolCallId": "tc-2", "status": "completed",
                             "content": text("slept")})
        file_work(todo, self.cwd)
        if "stop" in todo:
            return {"stopReason": todo["stop"]}
        steered = f" steered={'|'.join(self.steered)}" if self.steered else ""
        answer = f"FAKE ANSWER: {prompt[:60]}{extra}{steered}" + (f" chose={','.join(self.chosen)}" if self.chosen
                                                                  else "")
        for part in [answer[:10]] + [answer[i:i + 65536] for i in range(10, len(answer), 65536)]:
            update(session, {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": part}})
        update(session, {"sessionUpdate": "usage_update", "used": 1234, "size": 256000})
        self.store.add_answer(session, answer)
        return {"stopReason": "end_turn", "usage": {"inputTokens": 20, "outputTokens": 10, "totalTokens": 30}}


def file_work(todo: dict[str, str], folder: str) -> None:
    """What both forms do to files, in folder: !write=REL:TEXT (\\n in TEXT for a line break: directives are
    words), !delete=REL, !shell=SCRIPT (sh SCRIPT), !commit=MSG (git add -A and commit, as Hermes' shell
    would), !uncommitted=REL:TEXT (written after that commit)."""
    def write(value: str) -> None:
        rel, _, content = value.partition(":")
        with open(os.path.join(folder, rel), "w") as handle:
            handle.write(content.replace("\\n", "\n"))
    if "write" in todo:
        write(todo["write"])
    if "delete" in todo:
        os.remove(os.path.join(folder, todo["delete"]))
    shell = {**os.environ, "FAKE_JOB_SHELL": "1"}  # what the job's shell runs, told apart by tests' planted programs
    if "shell" in todo:  # a script of the test's, run by the job's shell in its folder (and with its rights)
        subprocess.run(["sh", todo["shell"]], cwd=folder, check=True, env=shell)
    if "commit" in todo:
        identity = {"GIT_AUTHOR_NAME": "hermes", "GIT_AUTHOR_EMAIL": "hermes@test", "GIT_COMMITTER_NAME": "hermes",
                    "GIT_COMMITTER_EMAIL": "hermes@test"}
        for command in (["git", "add", "-A"], ["git", "commit", "-q", "-m", todo["commit"] or "hermes' work"]):
            subprocess.run(command, cwd=folder, check=True, env={**shell, **identity})
    if "uncommitted" in todo:
        write(todo["uncommitted"])


def main(argv: list[str], store: Any, trace: str) -> int:
    if argv == ["acp", "--check"]:
        if os.environ.get("FAKE_HERMES_ACP") == "1":
            print("Hermes ACP check OK")
            return 0
        print("ACP dependencies not installed.", file=sys.stderr)
        return 1
    if os.environ.get("FAKE_HERMES_ACP") != "1":
        return 1
    time.sleep(0.1)
    return Agent(store, trace).run()
