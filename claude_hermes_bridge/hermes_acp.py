"""[both] Hermes' Agent Client Protocol: whether this Hermes speaks it and which driver a job gets, the managed
policy, what its messages mean (commands, edits and their decision), the wire, and a warm `hermes acp`."""
import contextlib
import json
import os
import queue
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

from .config import Config
from .hermes_cli import exe_fingerprint, flags_cache_path, run_probe
from .safe_io import (
    IS_WINDOWS,
    Refused,
    is_number,
    read_capped,
    read_json,
    shown,
    within_any,
    write_atomic,
)

# Hermes' Agent Client Protocol (`hermes acp`, JSON-RPC 2.0 over its stdin and stdout, with Hermes' `acp`
# extra): Hermes asks before a dangerous command or a file edit, reports its tools and its answer as events,
# and stops on session/cancel. The bridge is the client. Checked with Hermes 0.19.0 and 0.22.2.
ACP_SESSION_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
ACP_LINE_MAX = 8 << 20
ACP_CANCEL_GRACE_S = 3.0
# after its turn, 0.22.2 names the session with one more model call on its way out; on a loaded machine that
# took more than 5 s (a CI run), and a Hermes stopped then loses the title
ACP_EXIT_GRACE_S = 10.0
ACP_EXTRA_FIX = ("install Hermes' acp extra (pip install 'hermes-agent[acp]' in Hermes' environment; on 0.22: "
                 "hermes pm install --extra acp)")

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
        done = run_probe(cfg, exe, "acp", "--check")
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


def approval_policy_dir(timeout_s: int, folder: Path, terminal: dict[str, Any] | None = None) -> Path:
    """A private folder for Hermes' managed scope (HERMES_MANAGED_DIR, whose config.yaml wins over the user's
    per key; read by the CLI and ACP of 0.19 to 0.22): approvals.mode manual, so Hermes asks before every
    dangerous command whatever the user's own mode (smart would let Hermes' auxiliary model approve by itself),
    approvals.timeout, how long it waits for the answer, and single_query_mode deny, so a user's `approve`
    there cannot let a one-shot CLI run what nobody was asked about. A managed scope already in force (IT
    policy) is kept: its config is merged under ours, its .env copied. folder: made afresh here (in the jobs
    folder, named by the job or standby it is for, so a supervisor killed before its cleanup leaves it where
    retention removes it; a sandboxed job cannot write there). terminal: Hermes' terminal section for a job on
    an executor (executors.terminal_section), in place of any the managed scope had."""
    import shutil

    import yaml

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(mode=0o700, parents=True)
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
    if terminal:
        policy["terminal"] = terminal
    (folder / "config.yaml").write_text(yaml.safe_dump(policy), encoding="utf-8")
    return folder


def error_words(error: Any) -> str:
    """A JSON-RPC error in words: its message, and its data's details where Hermes puts the cause (0.22.2:
    "Internal error" with "provider 'custom' resolved without credentials ..." in data.details)."""
    if not isinstance(error, dict):
        return shown(error, 300)
    data = error.get("data")
    details = data.get("details") if isinstance(data, dict) else data if isinstance(data, str) else None
    message = shown(error.get("message"), 200)
    return f"{message}: {shown(details, 500)}" if isinstance(details, str) and details.strip() else message


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
    """A `hermes acp` readied before its job (a standby): initialized, and warmed with one session in the folder
    the next job is expected in (see docs/performance.md). A job in that folder is handed the session, so it pays
    no session/new of its own; otherwise the session is a throw-away. The job's AcpConversation goes on from here:
    the same reader, the next request id."""

    def __init__(self, proc: subprocess.Popen[bytes]):
        self.proc = proc
        self.inbox: queue.Queue[dict[str, Any]] = queue.Queue()
        self.reader = threading.Thread(target=read_messages, args=(proc, self.inbox), name="acp-reader", daemon=True)
        self.reader.start()
        self.next_id = 0
        self.agent: dict[str, Any] = {}
        self.warm_session: str | None = None
        self.warm_folder: str | None = None

    def request(self, method: str, params: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send a request and wait for its result; OSError when Hermes answers with an error, exits or is
        too slow."""
        message = self.answer(method, params, timeout_s)
        result = message.get("result")
        if not isinstance(result, dict):
            raise OSError(f"Hermes answered {method} with an error: {error_words(message.get('error'))}")
        return result

    def answer(self, method: str, params: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send a request and wait for Hermes' reply to it, a result or an error; OSError when Hermes exits or is
        too slow. Anything else Hermes sends meanwhile is dropped: no job is listening yet."""
        self.next_id += 1
        send_message(self.proc, {"id": self.next_id, "method": method, "params": params})
        def is_reply(message: dict[str, Any]) -> bool:
            if "id" in message and isinstance(message.get("method"), str):  # a request: refused, nobody asked it
                send_message(self.proc, {"id": message["id"], "error": {"code": -32601, "message": "no job yet"}})
                return False
            return message.get("id") == self.next_id
        return next(message for message in self.messages(timeout_s, f"answer {method}") if is_reply(message))

    def notice(self, method: str, timeout_s: float) -> dict[str, Any]:
        """The params of the first notification of this method Hermes' process sends (the late step's); OSError
        when it exits or is too slow."""
        said = next(message for message in self.messages(timeout_s, f"say {method}")
                    if message.get("method") == method and "id" not in message)
        params = said.get("params")
        return params if isinstance(params, dict) else {}

    def messages(self, timeout_s: float, awaited: str) -> Iterator[dict[str, Any]]:
        """What Hermes' process sends, until timeout_s: then, or once it exits, OSError saying it did not do what
        was awaited ("answer initialize")."""
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                yield self.inbox.get(timeout=min(left, 0.5))
            except queue.Empty:
                if self.proc.poll() is not None:
                    raise OSError(f"Hermes exited ({self.proc.returncode}) before it would {awaited}") from None
        raise OSError(f"Hermes did not {awaited} within {timeout_s:g} s")

    def unresponsive(self, timeout_s: float) -> str | None:
        """Why this Hermes cannot take a job now (it exited, or is frozen or stuck: a request of a method no
        Hermes knows, answered at once by its JSON-RPC layer in 0.19.0 and 0.22.2, got no reply), or None."""
        try:
            self.answer("bridge/ping", {}, timeout_s)
        except OSError as exc:
            return str(exc)
        return None

    def warm_up(self, folder: str, timeout_s: float) -> None:
        self.agent = self.request("initialize", INITIALIZE, timeout_s)
        session = self.request("session/new", {"cwd": folder, "mcpServers": []}, timeout_s).get("sessionId")
        self.warm_session = session if isinstance(session, str) else None
        self.warm_folder = folder

    def hand_session(self, folder: str) -> str | None:
        """The warm-up session, opened in this folder with no MCP server as a job's own would be, given away
        once: it is the job's from now on, so nothing deletes it."""
        if folder != self.warm_folder:
            return None
        session, self.warm_session = self.warm_session, None
        return session

    def drop_pending(self) -> None:
        """What Hermes sent while waiting (the throw-away session's updates): never the job's."""
        with contextlib.suppress(queue.Empty):
            while True:
                self.inbox.get_nowait()
