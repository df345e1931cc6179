"""[supervisor] One job's conversation with `hermes acp` (AcpConversation), with Hermes' questions (AcpQuestions)
and the user's steers (AcpSteers) kept in classes of their own. The driver AcpRun holds one per job."""
import contextlib
import functools
import json
import os
import queue
import subprocess
import threading
import time
from typing import Any, Callable, Generator, cast

from .config import Config, audit
from .hermes_acp import (
    COMMAND_SHOWN_CHARS,
    FOLDER_KEEPING_KINDS,
    INITIALIZE,
    WarmHermes,
    content_text,
    described_command,
    edit_decision,
    edit_targets,
    error_words,
    read_messages,
    send_message,
)
from .hermes_cli import describe_exit
from .hermes_store import COUNTER_LIMIT, FINAL_TEXT_MAX_CHARS, TOOL_ARGUMENT_CHARS
from .jobs import (
    ANSWERERS,
    QUESTIONS_KEPT,
    QUESTIONS_MAX_BYTES,
    SESSION_NAME_RE,
    SESSION_OPTION,
    STEER_TOO_LATE,
    STEERS_KEPT,
    TEXT_FIELD_MAX_BYTES,
    JobRecord,
    JobState,
    JobStore,
    Outcome,
    fit_json,
    write_record,
)
from .safe_io import clean_str, clock_words, escaped, is_number, is_whole_number, machine_clock, shown, shown_whole
from .worktrees import job_roots

Send = Callable[[dict[str, Any]], None]  # one JSON-RPC message to Hermes
ACP_OUTPUT_CHARS = 2000
HERMES_019_APPROVAL_TIMEOUT_S = 60.0  # Hermes 0.19's ACP denies an unanswered question after a fixed 60 s

# Guidance for a running turn (hermes_steer) is a second session/prompt on the job's session: `/steer TEXT`
# reaches the model after the current tool batch, `/queue TEXT` is a turn after this one (0.19.0 and 0.22.2).
# Hermes answers it with a message chunk just before that prompt's result; these are its openings.
STEER_COMMANDS = {"now": "/steer", "next_turn": "/queue"}
STEER_REPLIES = ("\u23e9", "\u26a0", "No active turn", "Queued for the next turn", "Redirected the active turn",
                 "Usage: /")
STEER_REFUSALS = ("\u26a0", "Usage: /")  # "Steer failed: ...", a command without its text
STEER_AFTER_PROMPT_S = 2.0  # a steer sent before Hermes has claimed the turn would run as the turn itself
# Stop reasons besides end_turn, in words (max_tokens and max_turn_requests: upstream's main branch)
STOP_REASONS = {
    "refusal": "Hermes refused the prompt (stopReason refusal); a session made with the CLI cannot be continued "
               "over ACP",
    "max_tokens": "the model stopped at its output token limit (stopReason max_tokens): the turn was cut short and "
                  "may be part-done",
    "max_turn_requests": "Hermes stopped at its own turn limit (stopReason max_turn_requests; agent.max_turns in "
                         "its config.yaml): the work may be part-done",
}


class AcpQuestions:
    """Hermes' permission requests in one job: an edit decided by the bridge against the roots, a command by the
    approval mode or by an earlier "allow for this job", the rest asked. An asked question is kept in the record
    (questions, each with its own id) until its answer comes back through the job's answers file (claim_answer)
    or its deadline passes; every decision, wherever taken, is kept, logged and audited."""

    def __init__(self, record: JobRecord, cfg: Config, store: JobStore, send: Send,
                 log: Callable[[str], None]) -> None:
        self.record, self.cfg, self.store, self.send, self.log = record, cfg, store, send, log
        self.asked: dict[str, tuple[Any, dict[Any, Any], str]] = {}  # approval id -> request id, options, command
        self.allowed_for_job: dict[str, tuple[float, str]] = {}  # command -> when and by whom it was allowed
        self.question_bytes: dict[str, int] = {}  # approval id -> its size in the record
        self.questions_asked = 0
        self.timeout_s = cfg.approval_timeout_s
        self.folder_may_have_moved = False  # a command ran: Hermes' terminal folder may not be the job's now
        self.changed = False

    def permission(self, request_id: Any, params: dict[str, Any]) -> None:
        given = params.get("toolCall")
        tool: dict[str, Any] = given if isinstance(given, dict) else {}
        options = params.get("options")
        offered = [o for o in (options if isinstance(options, list) else []) if isinstance(o, dict)]
        by_kind = {o.get("kind"): o.get("optionId") for o in reversed(offered)}
        if any(o.get("optionId") == SESSION_OPTION for o in offered):  # 0.19/0.22 give it the kind of "always"
            by_kind[SESSION_OPTION] = SESSION_OPTION
        self.questions_asked += 1
        approval_id = f"{self.questions_asked}-{os.urandom(3).hex()}"
        if tool.get("kind") == "edit":
            paths = edit_targets(tool)
            roots_name = ("the job's worktree (the main tree changes only through hermes_land)"
                          if self.record.worktree else "the allowed roots")
            decision, why = edit_decision(paths, self.record.cwd or "", self.folder_may_have_moved,
                                          job_roots(self.cfg, self.record), roots_name)
            what = "edit " + (", ".join(shown(path, 300) for path in paths[:20]) if paths else "(no path Hermes "
                              "states in its arguments)")
            self._decide(request_id, by_kind, approval_id, what, decision, f"the bridge: {why}")
            return
        given_raw = tool.get("rawInput")
        raw: dict[str, Any] = given_raw if isinstance(given_raw, dict) else {}
        command = described_command(tool)
        reason = raw.get("description") if isinstance(raw.get("description"), str) else ""
        what = f"run `{shown_whole(command, COMMAND_SHOWN_CHARS)}`" + (f" ({shown(reason, 200)})" if reason else "")
        if len(command) > COMMAND_SHOWN_CHARS:
            what += (f"; the command is {len(command):,} characters, too long to show whole: its whole text is in "
                     "the job log (FULL_LOG)")
            self.log(f"\n[bridge] the whole command of approval {approval_id}: {escaped(command)}\n")
        mode = self.record.approval_mode or self.cfg.approval_mode
        if mode != "ask":
            self._decide(request_id, by_kind, approval_id, what, "allow" if mode == "yolo" else "deny",
                         f"the bridge: approvals {mode}")
            return
        if command in self.allowed_for_job:  # the exact text, allowed for this job by an earlier answer
            self._decide(request_id, by_kind, approval_id, what, "allow", "the bridge: allowed for this job ("
                         f"first allowed{clock_words(self.allowed_for_job[command][0])} by "
                         f"{self.allowed_for_job[command][1]})")
            return
        now = time.time()
        question = {"id": approval_id, "what": what, "asked_at": now, "expires_at": now + self.timeout_s,
                    "expires_clock": machine_clock() + self.timeout_s}
        size = len(json.dumps(question, ensure_ascii=False).encode())
        waiting = sum(self.question_bytes.values())
        if len(self.record.questions) >= QUESTIONS_KEPT or waiting + size > QUESTIONS_MAX_BYTES:
            self._decide(request_id, by_kind, approval_id, what, "deny", f"the bridge: "
                         f"{len(self.record.questions):,} questions were already waiting for an answer")
            return
        self.asked[approval_id] = (request_id, by_kind, command)
        self.question_bytes[approval_id] = size
        self.record.questions.append(question)
        self.changed = True
        self.log(f"\n[bridge] Hermes asks to {what}; waiting for an answer (approval {approval_id})\n")

    def _decide(self, request_id: Any, by_kind: dict[Any, Any], approval_id: str, what: str, decision: str,
                by: str) -> None:
        if decision == "allow_for_job":  # Hermes' "for this session" where offered, never "always" (it persists)
            option = by_kind.get(SESSION_OPTION) or by_kind.get("allow_once")
        else:
            option = by_kind.get("allow_once" if decision == "allow" else "reject_once")
        outcome = {"outcome": "selected", "optionId": option} if isinstance(option, str) else {"outcome": "cancelled"}
        self.send({"id": request_id, "result": {"outcome": outcome}})
        self._record_decision(approval_id, what, decision, by)

    def _record_decision(self, approval_id: str, what: str, decision: str, by: str) -> None:
        """Every decision, wherever it was taken, is kept, logged and audited where it is applied."""
        self.record.add_decision({"id": approval_id, "what": what, "decision": decision, "by": by, "at": time.time()})
        self.changed = True
        self.log(f"\n[bridge] approval {approval_id}: {what} -> {decision} by {by}\n")
        audit(self.cfg, event="decision", job_id=self.record.id, approval_id=approval_id, decision=decision, by=by,
              what=what)

    def check_answers(self) -> None:
        """Each pending question: expired (checked first: an answer read after Hermes' deadline never
        decides), or decided by the answer claimed for it."""
        if not self.record.questions:
            return
        answers: dict[str, Any] | None = None
        for question in list(self.record.questions):
            if question["id"] not in self.asked:  # the supervisor's own (a network question) or already decided
                continue
            if machine_clock() > question["expires_clock"]:
                self._expire(question, f"Hermes itself: no answer within {self.timeout_s:g} s")
                continue
            if answers is None:
                answers = self.store.answers_file(self.record.id)[0]
            given = answers.get(question["id"])
            if given is None:
                continue
            request_id, by_kind, command = self.asked.pop(question["id"])
            self._forget(question)
            by = ANSWERERS.get(given["by"], ANSWERERS["planner"])
            if given["decision"] == "allow_for_job":
                self.allowed_for_job[command] = (time.time(), by)
            self._decide(request_id, by_kind, question["id"], question["what"], given["decision"], by)

    def _expire(self, question: dict[str, Any], by: str) -> None:
        """A question no longer waited for: Hermes denies it (the request is never withdrawn)."""
        self.asked.pop(question["id"], None)
        self._forget(question)
        self._record_decision(question["id"], question["what"], "deny", by)

    def _forget(self, question: dict[str, Any]) -> None:
        self.question_bytes.pop(question["id"], None)
        self.record.questions = [q for q in self.record.questions if q["id"] != question["id"]]

    def expire_all(self) -> None:
        """At the end of the job: no question is left pending."""
        for question in [question for question in self.record.questions if question["id"] in self.asked]:
            self._expire(question, "Hermes itself: it stopped waiting for an answer"
                         if machine_clock() >= question["expires_clock"] - 2
                         else "nobody: the job ended while Hermes waited")


class AcpSteers:
    """The user's guidance for a running turn (hermes_steer): each steer the server wrote to the job's steer file
    sent once as its own session/prompt, Hermes' reply to it kept with it in the record, and at the end none left
    unsaid."""

    def __init__(self, record: JobRecord, store: JobStore, send: Send, log: Callable[[str], None],
                 new_id: Callable[[], int]) -> None:
        self.record, self.store, self.send, self.log, self.new_id = record, store, send, log, new_id
        self.steering: dict[int, dict[str, Any]] = {}  # request id -> the record's steer waiting for Hermes' reply
        self.stamp: tuple[int, int, int] | None = None
        self.changed = False

    def awaits(self, request_id: Any) -> bool:
        """Whether a reply with this id is Hermes' result for a steer's prompt."""
        return request_id in self.steering

    def took_reply(self, text: str) -> bool:
        """A message chunk that is Hermes' reply to a steer (it answers its prompts in order), kept with it."""
        if not (self.steering and text.startswith(STEER_REPLIES)):
            return False
        steer = next(iter(self.steering.values()))
        steer["hermes"] = fit_json(clean_str(text), 600)
        self.log(f"\n[hermes] {clean_str(text)}\n")
        return True

    def send_new(self, session_id: str | None) -> None:
        """Guidance the server wrote to the steer file, each sent once as its own session/prompt on the job's
        session: called only while the job's turn runs (AcpConversation.pump)."""
        try:
            found = os.stat(self.store.steers_path(self.record.id))
        except OSError:
            return
        stamp = (found.st_mtime_ns, found.st_size, found.st_ino)
        if stamp == self.stamp:
            return
        self.stamp = stamp
        known = {steer["id"] for steer in self.record.steers}
        for request in self.store.steers_file(self.record.id):
            if request["id"] in known or len(self.record.steers) >= STEERS_KEPT:
                continue
            request_id = self.new_id()
            steer = self.steering[request_id] = {**request, "state": "sent", "hermes": ""}
            self.record.steers = [*self.record.steers, steer]
            self.changed = True
            self.send({"id": request_id, "method": "session/prompt", "params": {
                "sessionId": session_id,
                "prompt": [{"type": "text", "text": f"{STEER_COMMANDS[request['when']]} {request['text']}"}]}})
            self.log(f"\n[bridge] steer {request['id']} by {request['by']} sent to Hermes ({request['when']}): "
                     f"{escaped(request['text'][:300])}\n")

    def reply(self, message: dict[str, Any]) -> None:
        """Hermes' result for a steer's prompt: taken (its message chunk said how), or refused."""
        steer = self.steering.pop(message["id"])
        error = message.get("error")
        if "error" in message or not isinstance(message.get("result"), dict):
            text = error.get("message") if isinstance(error, dict) else error
            steer["state"], steer["hermes"] = "refused", fit_json(f"an error: {shown(text, 300)}", 600)
        else:
            steer["state"] = "refused" if steer["hermes"].startswith(STEER_REFUSALS) else "acknowledged"
        self.changed = True

    def end(self) -> None:
        """At the end, no steer is left unsaid: one Hermes never answered, one the server relayed too late."""
        for steer in self.steering.values():
            steer["state"], steer["hermes"] = "not delivered", "Hermes did not answer it before the job ended"
        self.steering.clear()
        known = {steer["id"] for steer in self.record.steers}
        late = [{**request, "state": "not delivered", "hermes": STEER_TOO_LATE}
                for request in self.store.steers_file(self.record.id) if request["id"] not in known]
        if late:
            self.record.steers = [*self.record.steers, *late][-STEERS_KEPT:]
        self.changed = self.changed or bool(late)


class AcpConversation:
    """The bridge's side of one `hermes acp` process: the handshake, one prompt (on a new session, or on a
    loaded one for a resume), Hermes' events written to the job's log as a readable transcript and kept in
    its record as the job's activity, and Hermes' permission requests, decided by the bridge or relayed.

    Every message is untrusted data: one of the wrong shape is ignored and noted once in the log, never
    raised. The supervisor's loop drives it (pump); nothing here blocks: a reader thread turns Hermes'
    stdout into messages. Questions that need the user go into the record (questions, every one kept, each
    with its own id) and their answers come back through the job's answers file (claim_answer)."""

    def __init__(self, proc: subprocess.Popen[bytes], record: JobRecord, cfg: Config, store: JobStore, task: str,
                 log: Callable[[str], None], save: Callable[[], None] | None = None, warm: WarmHermes | None = None):
        self.proc, self.record, self.cfg, self.store, self.task, self.log = proc, record, cfg, store, task, log
        self.save = save or functools.partial(write_record, store, record)
        self.warm = warm
        self.inbox: queue.Queue[dict[str, Any]] = warm.inbox if warm else queue.Queue()
        self.next_id = warm.next_id if warm else 0
        self.step: tuple[int, str] = (0, "")  # the request of the handshake waiting for its reply: id, method
        self.session_id: str | None = None
        self.result: dict[str, Any] | None = None
        self.failure: str | None = None
        self.text_chunks: list[str] = []
        self.questions = AcpQuestions(record, cfg, store, self._send, log)
        self.steers = AcpSteers(record, store, self._send, log, self._new_id)
        self.noted: set[str] = set()
        self.changed = False
        self.turn_seen = False  # an event of the prompt's turn arrived: Hermes has claimed it
        record.acp = {"tool_calls": 0}
        if warm:
            warm.drop_pending()
            self.reader = warm.reader
        else:
            self.reader = threading.Thread(target=read_messages, args=(proc, self.inbox), name="acp-reader",
                                           daemon=True)
            self.reader.start()
        self.steps = self._handshake()
        self._next_step(next(self.steps))

    def _handshake(self) -> Generator[tuple[str, dict[str, Any]], dict[str, Any], None]:
        """The conversation in order: initialize, then session/new (or session/load, for a resume), then one
        session/prompt. Each step yields one request; the reply to it is sent back in (see _reply)."""
        hermes = self.warm.agent if self.warm else (yield "initialize", INITIALIZE)
        agent = hermes.get("agentInfo")
        version = agent.get("version") if isinstance(agent, dict) else None
        if isinstance(version, str) and version.startswith("0.19"):
            self.questions.timeout_s = HERMES_019_APPROVAL_TIMEOUT_S
        remote = (self.record.worktree or {}).get("remote")  # an ssh job's: its commands' folder is on the host
        folder: dict[str, Any] = {"cwd": remote or self.record.cwd, "mcpServers": []}
        handed = self.warm.hand_session(folder["cwd"]) if self.warm and not self.record.session_requested else None
        if self.record.session_requested:
            self.session_id = self.record.session_requested  # known at once: a cancel during the load reaches it
            yield "session/load", {"sessionId": self.session_id, **folder}
        elif handed and SESSION_NAME_RE.fullmatch(handed):
            self.session_id = handed
        else:
            session = (yield "session/new", folder).get("sessionId")
            if not (isinstance(session, str) and SESSION_NAME_RE.fullmatch(session)):
                self.failure = "Hermes answered session/new without a usable session id"
                return
            self.session_id = session
        self.record.session_id = self.session_id
        self.record.session_source = "the ACP session"
        self.changed = True
        self.record.prompt_sent_at = time.time()
        result = yield "session/prompt", {"sessionId": self.session_id,
                                          "prompt": [{"type": "text", "text": self.task}]}
        self.result = result
        usage = result.get("usage")
        if isinstance(usage, dict):
            self._set(tokens_in=usage.get("inputTokens"), tokens_out=usage.get("outputTokens"))
        self._set(stop_reason=result.get("stopReason"))

    def _next_step(self, step: tuple[str, dict[str, Any]]) -> None:
        request_id = self._new_id()
        self.step = (request_id, step[0])
        self._send({"id": request_id, "method": step[0], "params": step[1]})

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    # -- the wire
    def _send(self, message: dict[str, Any]) -> None:
        send_message(self.proc, message)

    def note_once(self, kind: str, text: str) -> None:
        """A message of the wrong shape, said in the log the first time its kind is seen."""
        if kind not in self.noted:
            self.noted.add(kind)
            self.log(f"\n[bridge] ignored {text} (said once; later ones are ignored silently)\n")

    def cancel(self) -> None:
        if self.session_id:
            self._send({"method": "session/cancel", "params": {"sessionId": self.session_id}})

    def close(self) -> None:
        """End of input: `hermes acp` exits when its client goes away."""
        with contextlib.suppress(OSError):
            cast(Any, self.proc.stdin).close()

    @property
    def finished(self) -> bool:
        return self.result is not None or self.failure is not None

    def drain(self) -> None:
        """After Hermes exited: the last messages it wrote, then no question is left pending."""
        self.reader.join(2)
        self.pump()
        self.steers.end()
        self.questions.expire_all()
        self._save_if_changed()

    # -- the loop
    def pump(self) -> None:
        """Handle every message that arrived, the answers to pending questions, the questions Hermes has
        stopped waiting for; save the record when something changed."""
        while True:
            try:
                message = self.inbox.get_nowait()
            except queue.Empty:
                break
            try:
                self._handle(message)
            except Exception as exc:  # noqa: BLE001  (a message of a shape no check foresaw: ignored)
                self.note_once(f"raised {type(exc).__name__}", f"a message from Hermes the bridge could not handle "
                               f"({type(exc).__name__}: {shown(str(exc), 200)})")
        self.questions.check_answers()
        if self._turn_claimed():
            self.steers.send_new(self.session_id)
        self._save_if_changed()

    def _turn_claimed(self) -> bool:
        """The prompt's turn runs and Hermes has claimed it: a steer sent before would be taken for the turn."""
        prompt_sent = self.record.prompt_sent_at or 0.0
        return self.step[1] == "session/prompt" and not self.finished and (
            self.turn_seen or time.time() - prompt_sent >= STEER_AFTER_PROMPT_S)

    def _save_if_changed(self) -> None:
        if self.changed or self.questions.changed or self.steers.changed:
            self.changed = self.questions.changed = self.steers.changed = False
            self.save()

    def _handle(self, message: dict[str, Any]) -> None:
        if message.get("bridge/unreadable"):
            self.note_once("unreadable", "a line from Hermes that is not a JSON-RPC message")
            return
        method = message.get("method")
        params = message.get("params")
        if method is None and self.steers.awaits(message.get("id")):
            self.steers.reply(message)
        elif method is None and "id" in message:
            if message["id"] == self.step[0] and not self.finished:
                self._reply(message)
        elif not isinstance(params, dict) and method in ("session/request_permission", "session/update"):
            self.note_once(f"{method} params", f"a {method} whose params are not an object")
            if method == "session/request_permission" and "id" in message:
                self._send({"id": message["id"], "error": {"code": -32602, "message": "params must be an object"}})
        elif method == "session/request_permission" and "id" in message:
            self.questions.permission(message["id"], cast(dict[str, Any], params))  # any id, even null: echoed
        elif method == "session/update":
            update = cast(dict[str, Any], params).get("update")
            if isinstance(update, dict):
                self._update(update)
            else:
                self.note_once("update shape", "a session/update without an update object")
        elif "id" in message and isinstance(method, str):
            self._send({"id": message["id"], "error": {"code": -32601, "message": f"{shown(method, 80)} is not "
                                                        "supported by this client"}})

    def _reply(self, message: dict[str, Any]) -> None:
        """Hermes' reply to the handshake's current step: an error ends the conversation, a result goes on."""
        result = message.get("result")
        if "error" in message or not isinstance(result, dict):
            self.failure = f"Hermes answered {self.step[1]} with an error: {error_words(message.get('error'))}"
            return
        try:
            step = self.steps.send(result)
        except StopIteration:  # the prompt was answered: the conversation is over
            return
        self._next_step(step)

    def _set(self, **values: Any) -> None:
        """Activity fields of the record, kept only when they are of the shape the record allows, a text
        within its encoded size."""
        acp = cast(dict[str, Any], self.record.acp)
        for key, value in values.items():
            if (is_whole_number(value) and 0 <= value < COUNTER_LIMIT) or is_number(value) or isinstance(value, str):
                acp[key] = fit_json(value, TEXT_FIELD_MAX_BYTES) if isinstance(value, str) else value
                self.changed = True

    def _update(self, update: dict[str, Any]) -> None:
        kind = update.get("sessionUpdate")
        if self.step[1] == "session/prompt" and kind in ("tool_call", "agent_message_chunk", "agent_thought_chunk"):
            self.turn_seen = True
        if kind == "tool_call":
            tool_kind = update.get("kind") if isinstance(update.get("kind"), str) else "other"
            if tool_kind not in FOLDER_KEEPING_KINDS and self.step[1] == "session/prompt":  # not a replayed one
                self.questions.folder_may_have_moved = True
            command = " ".join(described_command(update).split())[:TOOL_ARGUMENT_CHARS * 2]
            acp = cast(dict[str, Any], self.record.acp)
            self._set(tool=f"{shown(tool_kind, 40)}: {command}", tool_started=time.time(),
                      tool_status="running", tool_calls=int(acp.get("tool_calls", 0)) + 1)
            self.log(f"\n[hermes] {shown(tool_kind, 40)}: {clean_str(command)}\n")
        elif kind == "tool_call_update" and update.get("status") in ("completed", "failed"):
            self._set(tool_status=str(update["status"]))
            output = content_text(update.get("content"))
            cut = output[:ACP_OUTPUT_CHARS] + (f"\n[... {len(output) - ACP_OUTPUT_CHARS} more characters]"
                                               if len(output) > ACP_OUTPUT_CHARS else "")
            self.log(f"[hermes] {update['status']}:\n{cut}\n")
        elif kind == "agent_message_chunk":
            text = content_text(update.get("content"))  # an empty one is upstream's keep-alive: nothing
            if text and not self.steers.took_reply(text) and sum(map(len, self.text_chunks)) < FINAL_TEXT_MAX_CHARS:
                self.text_chunks.append(text)
                self._set(answer="".join(self.text_chunks))  # the record's key (a format): Hermes' final text
                self.log(text)
        elif kind == "usage_update":
            self._set(context_used=update.get("used"), context_size=update.get("size"))

    def outcome(self, exit_code: int | None) -> Outcome:
        if self.failure:
            return Outcome(JobState.ERROR, exit_code, self.failure)
        stop = (self.result or {}).get("stopReason")
        if stop == "end_turn":
            return Outcome(JobState.OK, exit_code, None)
        if self.result is None:
            return Outcome(JobState.ERROR, exit_code, "Hermes exited before it answered the prompt" + (
                f" ({describe_exit(exit_code)}); see the log" if exit_code is not None else ""))
        if stop in STOP_REASONS:
            return Outcome(JobState.ERROR, exit_code, STOP_REASONS[stop])
        return Outcome(JobState.ERROR, exit_code, f"Hermes stopped with stopReason {shown(stop, 60)}")
