"""[both] Whether this Hermes speaks ACP and which driver a job gets; [supervisor] the conversation over JSON-RPC."""
import contextlib
import functools
import json
import os
import queue
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable, Generator, cast

from .config import Config, audit
from .hermes_cli import describe_exit, exe_fingerprint, flags_cache_path, hermes_env
from .hermes_store import ANSWER_MAX_CHARS, COUNTER_LIMIT, TOOL_ARGUMENT_CHARS
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
from .safe_io import (
    IS_WINDOWS,
    Refused,
    clean_str,
    clock_words,
    escaped,
    is_number,
    is_whole_number,
    machine_clock,
    read_capped,
    read_json,
    shown,
    shown_whole,
    within_any,
    write_atomic,
)
from .worktrees import job_roots

# Hermes' Agent Client Protocol (`hermes acp`, JSON-RPC 2.0 over its stdin and stdout, with Hermes' `acp`
# extra): Hermes asks before a dangerous command or a file edit, reports its tools and its answer as events,
# and stops on session/cancel. The bridge is the client. Checked with Hermes 0.19.0 and 0.22.2.
ACP_SESSION_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
ACP_LINE_MAX = 8 << 20
ACP_CANCEL_GRACE_S = 3.0
ACP_EXIT_GRACE_S = 5.0
ACP_OUTPUT_CHARS = 2000
HERMES_019_APPROVAL_TIMEOUT_S = 60.0  # Hermes 0.19's ACP denies an unanswered question after a fixed 60 s
ACP_EXTRA_FIX = ("install Hermes' acp extra (pip install 'hermes-agent[acp]' in Hermes' environment; on 0.22: "
                 "hermes pm install --extra acp)")


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


ACP_RECHECK_S = 600  # a "no" is asked again after this: installing the extra does not touch the hermes script


def known_acp(cfg: Config, exe: str) -> bool | None:
    """Whether this Hermes can speak ACP, as an earlier probe found; None when it was never asked, or when a
    "no" is old enough that the extra may have been installed since."""
    cache = read_json(flags_cache_path(cfg))
    found = cache.get(exe_fingerprint(exe) + "|acp") if isinstance(cache, dict) else None
    if not (isinstance(found, dict) and isinstance(found.get("acp"), bool) and is_number(found.get("at"))):
        return None
    if not found["acp"] and time.time() - found["at"] > ACP_RECHECK_S:
        return None
    return cast(bool, found["acp"])


def acp_available(cfg: Config, exe: str) -> bool:
    """Whether this Hermes can speak ACP (`hermes acp --check` exits 0 only with its acp extra), asked once
    per executable and cached beside the CLI options."""
    known = known_acp(cfg, exe)
    if known is not None:
        return known
    key = exe_fingerprint(exe) + "|acp"
    path = flags_cache_path(cfg)
    cache = read_json(path)
    cache = cache if isinstance(cache, dict) else {}
    try:
        done = subprocess.run([exe, "acp", "--check"], stdin=subprocess.DEVNULL, capture_output=True, timeout=60,
                              env=hermes_env(cfg))
    except (OSError, subprocess.SubprocessError):
        return False  # not cached: asked again next time
    cache[key] = {"acp": done.returncode == 0, "at": time.time()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(cache, indent=1).encode())
    except OSError:
        pass
    return done.returncode == 0


def driver_line(cfg: Config, exe: str | None, probe: bool) -> str:
    """DRIVER for hermes_health (probe=False: never starts Hermes) and --check (probe=True)."""
    if exe is None:
        return "DRIVER: unknown: no usable Hermes"
    if cfg.hermes_driver == "cli":
        return f"DRIVER: cli (hermes_driver cli in {shown(str(cfg.path))})"
    if not probe and known_acp(cfg, exe) is None:
        return "DRIVER: not known yet: the first job asks `hermes acp --check` once and caches the answer"
    try:
        driver, why = choose_driver(cfg, exe)
    except Refused as exc:
        return f"DRIVER: NONE: {exc}"
    return f"DRIVER: {driver} ({why})"


def choose_driver(cfg: Config, exe: str, session: str | None = None) -> tuple[str, str]:
    """The driver a job runs with, and why. A resume keeps the driver its session was made with: ACP
    sessions are UUIDs, and CLI and ACP sessions do not mix (a CLI session loaded over ACP answers refusal)."""
    if session is not None and ACP_SESSION_RE.fullmatch(session):
        if not acp_available(cfg, exe):
            raise Refused(f"session {session} was made over ACP, and this Hermes cannot speak ACP now: "
                          f"{ACP_EXTRA_FIX}")
        return "acp", "the session was made over ACP"
    if session is not None:
        return "cli", "the session was made with the CLI"
    if cfg.hermes_driver == "cli":
        return "cli", f"hermes_driver cli in {cfg.path}"
    if acp_available(cfg, exe):
        return "acp", ("hermes_driver acp" if cfg.hermes_driver == "acp" else "auto") + ": `hermes acp --check` passed"
    if cfg.hermes_driver == "acp":
        raise Refused(f"hermes_driver is acp, but `hermes acp --check` fails for this Hermes: {ACP_EXTRA_FIX}")
    return "cli", f"auto: `hermes acp --check` fails (no acp extra); {ACP_EXTRA_FIX} to have Hermes' questions " \
                  "forwarded"


def approval_policy_dir(timeout_s: int) -> Path:
    """A private folder for Hermes' managed scope (HERMES_MANAGED_DIR, whose config.yaml wins over the user's
    per key; read by the CLI and ACP of 0.19 to 0.22): approvals.mode manual, so Hermes asks before every
    dangerous command whatever the user's own mode (smart would let Hermes' auxiliary model approve by itself),
    approvals.timeout, how long it waits for the answer, and single_query_mode deny, so a user's `approve`
    there cannot let a one-shot CLI run what nobody was asked about. A managed scope already in force (IT
    policy) is kept: its config is merged under ours, its .env copied."""
    import shutil
    import tempfile

    import yaml

    folder = Path(tempfile.mkdtemp(prefix="hermes-bridge-policy-"))
    existing = os.environ.get("HERMES_MANAGED_DIR") or ("" if IS_WINDOWS else "/etc/hermes")
    policy: dict[str, Any] = {}
    if existing and os.path.isdir(existing):
        try:
            loaded = yaml.safe_load(read_capped(Path(existing) / "config.yaml", 1 << 20, follow=True))
            policy = loaded if isinstance(loaded, dict) else {}
        except (OSError, yaml.YAMLError):
            policy = {}
        if os.path.isfile(Path(existing) / ".env"):
            shutil.copyfile(Path(existing) / ".env", folder / ".env")
    approvals = policy.get("approvals")
    policy["approvals"] = {**(approvals if isinstance(approvals, dict) else {}), "mode": "manual",
                           "timeout": timeout_s, "single_query_mode": "deny"}
    (folder / "config.yaml").write_text(yaml.safe_dump(policy), encoding="utf-8")
    return folder


def content_text(content: Any) -> str:
    """The text of an ACP content list (or one content block), other kinds skipped."""
    blocks = content if isinstance(content, list) else [content]
    texts = []
    for block in blocks:
        if isinstance(block, dict):
            inner = block.get("content") if block.get("type") == "content" else block
            if isinstance(inner, dict) and isinstance(inner.get("text"), str):
                texts.append(inner["text"])
    return "\n".join(texts)


def described_command(tool_call: dict[str, Any]) -> str:
    """The whole command a tool call runs, for a person: rawInput.command (Hermes' own argument, every line
    of it), else everything from the first `$ ` line of its content (the line before is the description),
    else its title (0.22.2 can send an untranslated key there)."""
    raw = tool_call.get("rawInput")
    if isinstance(raw, dict) and isinstance(raw.get("command"), str):
        return str(raw["command"])
    lines = content_text(tool_call.get("content")).split("\n")
    for index, line in enumerate(lines):
        if line.startswith("$ "):
            return "\n".join([line[2:], *lines[index + 1:]]).strip()
    title = tool_call.get("title")
    return title if isinstance(title, str) else "a tool call"


V4A_FILE_RE = re.compile(r"^\*\*\*\s+(?:Update|Add|Delete)\s+File:\s*(.+)$", re.MULTILINE)
V4A_MOVE_RE = re.compile(r"^\*\*\*\s+Move\s+File:\s*(.+?)\s*->\s*(.+)$", re.MULTILINE)
# Tool kinds that cannot change Hermes' terminal folder; any other (execute, other) may have `cd`-ed it.
FOLDER_KEEPING_KINDS = frozenset({"read", "edit", "delete", "move", "search", "fetch", "think", "switch_mode"})


def edit_targets(tool_call: dict[str, Any]) -> list[str] | None:
    """Every path an edit Hermes asks about would write, as Hermes reads them from its own arguments
    (rawInput: the tool and its arguments; a V4A patch names each file on a line of its own, where the diff
    shown joins them with ", "). None when they cannot be told: such an edit is denied."""
    raw = tool_call.get("rawInput")
    arguments = raw.get("arguments") if isinstance(raw, dict) else None
    if not isinstance(arguments, dict):
        return None
    tool = raw.get("tool")  # type: ignore[union-attr]
    if tool == "patch" and arguments.get("mode", "replace") == "patch":
        body = arguments.get("patch")
        if not isinstance(body, str):
            return None
        paths = [path.strip() for path in V4A_FILE_RE.findall(body)]
        paths += [path.strip() for move in V4A_MOVE_RE.findall(body) for path in move]
        return [path for path in paths if path] or None
    if tool in ("write_file", "patch"):
        path = arguments.get("path")
        return [path] if isinstance(path, str) and path else None
    return None


def edit_decision(paths: list[str] | None, folder: str, folder_may_have_moved: bool,
                  roots: list[str], roots_name: str = "the allowed roots") -> tuple[str, str]:
    """allow or deny an edit, and why, deciding from where Hermes will really write: `~` expanded as Hermes
    expands it, a relative path resolved against the session's folder (Hermes resolves it against its
    terminal's current folder, so once a command may have moved that, a relative path cannot be decided),
    symlinks followed. The reason says "inside" only of paths checked to be, and names the roots it means
    (roots_name: a worktree job's are its worktree)."""
    if not paths:
        return "deny", "cannot tell which files the edit writes"
    inside = []
    for path in paths:
        expanded = os.path.expanduser(path) if "\x00" not in path else ""
        if not expanded:
            return "deny", f"{shown(path, 300)} is not a path"
        if not os.path.isabs(expanded):
            if folder_may_have_moved:
                return "deny", (f"{shown(path, 300)} is relative, and a command Hermes ran may have changed its "
                                "folder: where it lands cannot be decided")
            expanded = os.path.join(folder, expanded)
        real = os.path.realpath(expanded)
        if not within_any(real, roots):
            return "deny", f"{shown(path, 300)} resolves to {shown(real, 300)}, outside {roots_name}"
        inside.append(shown(real, 300))
    return "allow", f"inside {roots_name}: {', '.join(inside)}"


def nesting_depth(line: bytes, limit: int) -> int:
    """How deep a JSON line nests (strings skipped), counted up to limit: json.loads recurses per level, and a
    line nested 200,000 deep would raise RecursionError in the reader."""
    depth = deepest = 0
    in_string = escape = False
    for byte in line:
        if in_string:
            if escape:
                escape = False
            elif byte == 0x5C:
                escape = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in b"[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > limit:
                return deepest
        elif byte in b"]}":
            depth -= 1
    return deepest


ACP_MAX_DEPTH = 64
COMMAND_SHOWN_CHARS = 1000
INITIALIZE = {"protocolVersion": 1, "clientCapabilities": {"fs": {"readTextFile": False, "writeTextFile": False},
                                                           "terminal": False}}


def read_messages(proc: subprocess.Popen[bytes], inbox: queue.Queue[dict[str, Any]]) -> None:
    """Hermes' stdout as messages, until it closes; a line that is not a JSON object (a stray print, junk,
    nesting deep enough to exhaust the parser) becomes {"bridge/unreadable": True}."""
    stream = cast(Any, proc.stdout)
    while True:
        try:
            line = stream.readline(ACP_LINE_MAX)
        except (OSError, ValueError):
            return
        if not line:
            return
        if not line.strip():
            continue
        try:
            if nesting_depth(line, ACP_MAX_DEPTH) > ACP_MAX_DEPTH:
                raise ValueError("nested too deep")
            message = json.loads(line)
        except (ValueError, RecursionError, MemoryError):
            message = None
        inbox.put(message if isinstance(message, dict) else {"bridge/unreadable": True})


def send_message(proc: subprocess.Popen[bytes], message: dict[str, Any]) -> None:
    try:
        stdin = cast(Any, proc.stdin)
        stdin.write((json.dumps({"jsonrpc": "2.0", **message}) + "\n").encode())
        stdin.flush()
    except (OSError, ValueError):
        pass  # Hermes is gone; its exit ends the job


class WarmHermes:
    """A `hermes acp` readied before its job (a standby): initialized, and warmed with one throw-away session in
    the folder the next job is expected in, which is what makes the job's own session/new fast (see
    docs/performance.md). The job's AcpConversation goes on from here: the same reader, the next request id."""

    def __init__(self, proc: subprocess.Popen[bytes]):
        self.proc = proc
        self.inbox: queue.Queue[dict[str, Any]] = queue.Queue()
        self.reader = threading.Thread(target=read_messages, args=(proc, self.inbox), name="acp-reader", daemon=True)
        self.reader.start()
        self.next_id = 0
        self.agent: dict[str, Any] = {}
        self.warm_session: str | None = None

    def request(self, method: str, params: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send a request and wait for its result; OSError when Hermes answers with an error, exits or is
        too slow. Anything else Hermes sends meanwhile is dropped: no job is listening yet."""
        self.next_id += 1
        send_message(self.proc, {"id": self.next_id, "method": method, "params": params})
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                message = self.inbox.get(timeout=min(left, 0.5))
            except queue.Empty:
                if self.proc.poll() is not None:
                    raise OSError(f"Hermes exited ({self.proc.returncode}) before it answered {method}") from None
                continue
            if message.get("id") == self.next_id and "method" not in message:
                result = message.get("result")
                if not isinstance(result, dict):
                    raise OSError(f"Hermes answered {method} with an error: {shown(message.get('error'), 300)}")
                return result
            if "id" in message and isinstance(message.get("method"), str):  # a request: refused, nobody asked it
                send_message(self.proc, {"id": message["id"], "error": {"code": -32601, "message": "no job yet"}})
        raise OSError(f"Hermes did not answer {method} within {timeout_s:g} s")

    def warm_up(self, folder: str, timeout_s: float) -> None:
        self.agent = self.request("initialize", INITIALIZE, timeout_s)
        session = self.request("session/new", {"cwd": folder, "mcpServers": []}, timeout_s).get("sessionId")
        self.warm_session = session if isinstance(session, str) else None

    def drop_pending(self) -> None:
        """What Hermes sent while waiting (the throw-away session's updates): never the job's."""
        with contextlib.suppress(queue.Empty):
            while True:
                self.inbox.get_nowait()


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
        self.answer_chunks: list[str] = []
        self.asked: dict[str, tuple[Any, dict[Any, Any], str]] = {}  # approval id -> request id, options, command
        self.allowed_for_job: dict[str, tuple[float, str]] = {}  # command -> when and by whom it was allowed
        self.question_bytes: dict[str, int] = {}  # approval id -> its size in the record
        self.questions_asked = 0
        self.approval_timeout_s = cfg.approval_timeout_s
        self.folder_may_have_moved = False  # a command ran: Hermes' terminal folder may not be the job's now
        self.noted: set[str] = set()
        self.changed = False
        self.steering: dict[int, dict[str, Any]] = {}  # request id -> the record's steer waiting for Hermes' reply
        self.steer_stamp: tuple[int, int, int] | None = None
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
            self.approval_timeout_s = HERMES_019_APPROVAL_TIMEOUT_S
        folder: dict[str, Any] = {"cwd": self.record.cwd, "mcpServers": []}
        if self.record.session_requested:
            self.session_id = self.record.session_requested  # known at once: a cancel during the load reaches it
            yield "session/load", {"sessionId": self.session_id, **folder}
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
        self.next_id += 1
        self.step = (self.next_id, step[0])
        self._send({"id": self.next_id, "method": step[0], "params": step[1]})

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
        self._end_steers()
        for question in [question for question in self.record.questions if question["id"] in self.asked]:
            self._expire(question, "Hermes itself: it stopped waiting for an answer"
                         if machine_clock() >= question["expires_clock"] - 2
                         else "nobody: the job ended while Hermes waited")
        if self.changed:
            self.changed = False
            self.save()

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
        self._check_answers()
        self._check_steers()
        if self.changed:
            self.changed = False
            self.save()

    def _handle(self, message: dict[str, Any]) -> None:
        if message.get("bridge/unreadable"):
            self.note_once("unreadable", "a line from Hermes that is not a JSON-RPC message")
            return
        method = message.get("method")
        params = message.get("params")
        if method is None and message.get("id") in self.steering:
            self._steer_reply(message)
        elif method is None and "id" in message:
            if message["id"] == self.step[0] and not self.finished:
                self._reply(message)
        elif not isinstance(params, dict) and method in ("session/request_permission", "session/update"):
            self.note_once(f"{method} params", f"a {method} whose params are not an object")
            if method == "session/request_permission" and "id" in message:
                self._send({"id": message["id"], "error": {"code": -32602, "message": "params must be an object"}})
        elif method == "session/request_permission" and "id" in message:
            self._permission(message["id"], cast(dict[str, Any], params))  # any id, reused or null: echoed back
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
            error = message.get("error")
            text = error.get("message") if isinstance(error, dict) else error
            self.failure = f"Hermes answered {self.step[1]} with an error: {shown(text, 500)}"
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
                self.folder_may_have_moved = True
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
            if text and self.steering and text.startswith(STEER_REPLIES):
                steer = next(iter(self.steering.values()))  # Hermes answers its prompts in order
                steer["hermes"] = fit_json(clean_str(text), 600)
                self.log(f"\n[hermes] {clean_str(text)}\n")
            elif text and sum(map(len, self.answer_chunks)) < ANSWER_MAX_CHARS:
                self.answer_chunks.append(text)
                self._set(answer="".join(self.answer_chunks))
                self.log(text)
        elif kind == "usage_update":
            self._set(context_used=update.get("used"), context_size=update.get("size"))

    # -- questions
    def _permission(self, request_id: Any, params: dict[str, Any]) -> None:
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
        question = {"id": approval_id, "what": what, "asked_at": now, "expires_at": now + self.approval_timeout_s,
                    "expires_clock": machine_clock() + self.approval_timeout_s}
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
        self._send({"id": request_id, "result": {"outcome": outcome}})
        self._record_decision(approval_id, what, decision, by)

    def _record_decision(self, approval_id: str, what: str, decision: str, by: str) -> None:
        """Every decision, wherever it was taken, is kept, logged and audited where it is applied."""
        self.record.add_decision({"id": approval_id, "what": what, "decision": decision, "by": by, "at": time.time()})
        self.changed = True
        self.log(f"\n[bridge] approval {approval_id}: {what} -> {decision} by {by}\n")
        audit(self.cfg, event="decision", job_id=self.record.id, approval_id=approval_id, decision=decision, by=by,
              what=what)

    def _check_answers(self) -> None:
        """Each pending question: expired (checked first: an answer read after Hermes' deadline never
        decides), or decided by the answer claimed for it."""
        if not self.record.questions:
            return
        answers: dict[str, Any] | None = None
        for question in list(self.record.questions):
            if question["id"] not in self.asked:  # the supervisor's own (a network question) or already decided
                continue
            if machine_clock() > question["expires_clock"]:
                self._expire(question, f"Hermes itself: no answer within {self.approval_timeout_s:g} s")
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

    # -- steering
    def _check_steers(self) -> None:
        """Guidance the server wrote to the steer file, each sent once as its own session/prompt while the
        job's turn runs (not before Hermes has claimed the turn: it would take the steer for the turn)."""
        prompt_sent = self.record.prompt_sent_at or 0.0
        if self.step[1] != "session/prompt" or self.finished or not (
                self.turn_seen or time.time() - prompt_sent >= STEER_AFTER_PROMPT_S):
            return
        try:
            found = os.stat(self.store.steers_path(self.record.id))
        except OSError:
            return
        stamp = (found.st_mtime_ns, found.st_size, found.st_ino)
        if stamp == self.steer_stamp:
            return
        self.steer_stamp = stamp
        known = {steer["id"] for steer in self.record.steers}
        for request in self.store.steers_file(self.record.id):
            if request["id"] in known or len(self.record.steers) >= STEERS_KEPT:
                continue
            self.next_id += 1
            steer = self.steering[self.next_id] = {**request, "state": "sent", "hermes": ""}
            self.record.steers = [*self.record.steers, steer]
            self.changed = True
            self._send({"id": self.next_id, "method": "session/prompt", "params": {
                "sessionId": self.session_id,
                "prompt": [{"type": "text", "text": f"{STEER_COMMANDS[request['when']]} {request['text']}"}]}})
            self.log(f"\n[bridge] steer {request['id']} by {request['by']} sent to Hermes ({request['when']}): "
                     f"{escaped(request['text'][:300])}\n")

    def _steer_reply(self, message: dict[str, Any]) -> None:
        """Hermes' result for a steer's prompt: taken (its message chunk said how), or refused."""
        steer = self.steering.pop(message["id"])
        error = message.get("error")
        if "error" in message or not isinstance(message.get("result"), dict):
            text = error.get("message") if isinstance(error, dict) else error
            steer["state"], steer["hermes"] = "refused", fit_json(f"an error: {shown(text, 300)}", 600)
        else:
            steer["state"] = "refused" if steer["hermes"].startswith(STEER_REFUSALS) else "acknowledged"
        self.changed = True

    def _end_steers(self) -> None:
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
