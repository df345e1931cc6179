"""[both] Hermes' state.db read with a deadline: activity, usage, current tool, final text."""
import dataclasses
import json
import os
import re
import stat
import threading
from pathlib import Path
from typing import Any, Callable, cast

from .config import Config
from .jobs import SESSION_NAME_RE
from .safe_io import T, case_normalised, is_number, is_whole_number, plural, shown


# Hermes' own SQLite store (state.db in HERMES_HOME), read-only, with a deadline, every value checked: a job can
# write it. It gives the activity lines, usage, the current tool, Hermes' final text and where a session ran.
class StoreUnavailable(Exception):
    """Hermes' session store could not answer: missing, locked, another schema, or no such session."""


SPEND_CANDIDATES = 50  # sessions a job's spend can be charged with when its own is not told apart


def session_store_path(cfg: Config) -> Path:
    return cfg.hermes_home_path / "state.db"


STORE_DEADLINE_S = 3.0
STORE_FILE_SUFFIXES = ("", "-journal", "-wal", "-shm")  # the database and the side files SQLite opens
STORE_READS_IN_FLIGHT: dict[str, threading.Thread] = {}


def check_store_files(path: Path) -> None:
    """The database and every side file that exists must be a regular file: SQLite opens them blocking,
    so a FIFO planted as state.db-journal would hang the read for ever."""
    for suffix in STORE_FILE_SUFFIXES:
        side = Path(f"{path}{suffix}")
        try:
            info = os.stat(side) if not suffix else os.lstat(side)
        except FileNotFoundError:
            if not suffix:
                raise StoreUnavailable(f"no session store at {path}") from None
            continue
        except OSError as exc:
            raise StoreUnavailable(f"cannot look at {side}: {exc.strerror or exc}") from None
        if not stat.S_ISREG(info.st_mode):
            raise StoreUnavailable(f"{side} is not a regular file")


def store_fingerprint(path: Path) -> tuple[tuple[int, int] | None, ...]:
    """The size and change time of the store and its write-ahead log: Hermes' every write changes one of them,
    so a reader that polls may skip a read while they stay the same."""
    def one(side: Path) -> tuple[int, int] | None:
        try:
            info = os.stat(side)
        except OSError:
            return None
        return info.st_size, info.st_mtime_ns
    return one(path), one(Path(f"{path}-wal"))


def read_store(cfg: Config, query: Callable[[Any], T], deadline_s: float = STORE_DEADLINE_S) -> T:
    """query(connection) on Hermes' SQLite store, read-only, answered within deadline_s or not at all.

    One short-lived connection with a short busy timeout, so Hermes writing (WAL, short BEGIN IMMEDIATE
    transactions) never blocks us for long, nor we it. The query runs in a thread the caller does not wait
    past: a store that never answers (a side file swapped for a FIFO after the check, a lock held for ever)
    costs one abandoned thread, and while it hangs later reads of that store fail at once instead of piling
    up. Every failure, and every row that is not what Hermes writes, becomes StoreUnavailable."""
    import sqlite3

    path = session_store_path(cfg)
    key = str(path.absolute())
    stuck = STORE_READS_IN_FLIGHT.get(key)
    if stuck is not None and stuck.is_alive():
        raise StoreUnavailable(f"an earlier read of the session store {path} has not returned (a file beside it "
                               "may be a FIFO, or held by a lock)")
    check_store_files(path)
    found: dict[str, Any] = {}

    def work() -> None:
        try:
            connection = sqlite3.connect(path.absolute().as_uri() + "?mode=ro", uri=True, timeout=1,
                                         check_same_thread=False)
            try:
                found["value"] = query(connection)
            finally:
                connection.close()
        except sqlite3.Error as exc:
            found["error"] = StoreUnavailable(f"the session store {path} cannot answer: {exc}")
        except StoreUnavailable as exc:
            found["error"] = exc
        except (ValueError, TypeError, OverflowError, RecursionError, MemoryError) as exc:
            found["error"] = StoreUnavailable(f"a row of the session store {path} is not what Hermes writes "
                                               f"({type(exc).__name__})")

    thread = threading.Thread(target=work, name="session-store", daemon=True)
    STORE_READS_IN_FLIGHT[key] = thread
    thread.start()
    thread.join(deadline_s)
    if thread.is_alive():
        raise StoreUnavailable(f"the session store {path} did not answer within {deadline_s:g} s (a file beside it "
                               "may be a FIFO, or held by a lock)")
    if "error" in found:
        raise found["error"]
    return cast(T, found["value"])


def session_folder(cfg: Config, session_id: str) -> str:
    """The folder Hermes recorded for a session: where a resume of it runs, whatever we ask. A relative
    folder would be resolved against the server's own folder, so it is refused like a missing one."""
    rows = read_store(cfg, lambda db: db.execute("SELECT cwd FROM sessions WHERE id = ? LIMIT 2",
                                                 (session_id,)).fetchall())
    if not rows:
        raise StoreUnavailable(f"the session store holds no session {session_id}")
    folder = rows[0][0]
    if not isinstance(folder, str) or not folder.strip() or len(folder) > 4096 or "\x00" in folder:
        raise StoreUnavailable(f"the session store records no usable folder for session {session_id}")
    if not os.path.isabs(folder):
        raise StoreUnavailable(f"the session store records a relative folder ({shown(folder)}) for session "
                               f"{session_id}")
    return folder


def session_started_in(cfg: Config, folder: str, since: float) -> tuple[str | None, str]:
    """The one session recorded in `folder` that started at or after `since`, for a Hermes that prints no
    session line; with none or several, None and why."""
    try:
        return read_store(cfg, lambda db: matched_session(db, folder, since))
    except StoreUnavailable as exc:
        return None, str(exc)


def sessions_started_in(db: Any, folder: str, since: float) -> list[str]:
    """Every session recorded in folder that started at or after since (a second of slack), oldest first."""
    rows = db.execute("SELECT id, cwd FROM sessions WHERE started_at >= ? ORDER BY started_at LIMIT 1000",
                      (since - 1,)).fetchall()
    return [sid for sid, cwd in rows if isinstance(cwd, str) and same_folder(cwd, folder)
            and isinstance(sid, str) and SESSION_NAME_RE.fullmatch(sid)]


def matched_session(db: Any, folder: str, since: float) -> tuple[str | None, str]:
    ids = sessions_started_in(db, folder, since)
    if len(ids) == 1:
        return ids[0], "found in the session store"
    return None, (f"{len(ids)} sessions in the store started in {folder} during the job" if ids
                  else f"no session in the store started in {folder} during the job")


def same_folder(a: str, b: str) -> bool:
    return case_normalised(os.path.realpath(a)) == case_normalised(os.path.realpath(b))


TOOL_ARGUMENT_CHARS = 160


@dataclasses.dataclass
class Usage:
    """A session's counters as Hermes keeps them (written after every API call)."""

    api_calls: int
    tool_calls: int
    tokens_in: int
    tokens_out: int

    def line(self) -> str:
        return (f"{plural(self.api_calls, 'API call')}, {plural(self.tool_calls, 'tool call')}, "
                f"tokens in {self.tokens_in:,} / out {self.tokens_out:,}")


COUNTER_LIMIT = 1 << 53
JSON_CELL_MAX_CHARS = 65536
JSON_CELL_MAX_DEPTH = 16
FINAL_TEXT_MAX_CHARS = 1 << 20
JSON_STRING_RE = re.compile(r'"(?:[^"\\]|\\.)*"')


def store_counter(value: Any) -> int:
    """A counter of the store: a whole number in range (None, as Hermes leaves an unset one, is 0)."""
    if value is None:
        return 0
    if not is_whole_number(value) or not 0 <= value < COUNTER_LIMIT:
        raise StoreUnavailable(f"a counter of the session store is not a count ({shown(value, 40)})")
    return cast(int, value)


def store_time(value: Any) -> float:
    """A timestamp of the store: a finite number of seconds (SQLite keeps 1e999 as infinity)."""
    if not is_number(value) or not 0 <= value < 1e11:
        raise StoreUnavailable(f"a timestamp of the session store is not a time ({shown(value, 40)})")
    return float(value)


def json_cell(raw: Any) -> Any:
    """A JSON cell of the store, parsed only once its size and nesting are known to be sane (a value nested
    50,000 deep would exhaust the parser's recursion); None when it is not such a cell."""
    if not isinstance(raw, str) or len(raw) > JSON_CELL_MAX_CHARS:
        return None
    depth = deepest = 0
    for bracket in re.findall(r"[\[\]{}]", JSON_STRING_RE.sub("", raw)):
        depth += 1 if bracket in "[{" else -1
        deepest = max(deepest, depth)
    if deepest > JSON_CELL_MAX_DEPTH:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None


def session_usage(db: Any, session_id: str) -> Usage | None:
    row = db.execute("SELECT api_call_count, tool_call_count, input_tokens, output_tokens FROM sessions "
                     "WHERE id = ?", (session_id,)).fetchone()
    return Usage(*(store_counter(value) for value in row)) if row else None


def session_spend(db: Any, session_id: str) -> dict[str, Any] | None:
    """What a session and the child sessions it started have spent, as Hermes counts it after every API call:
    API calls, tokens in and out, its cost estimate, and whether it could price every call (cost_status
    'unknown' is no price, not a zero cost). Where Hermes keeps session_model_usage (0.22), a session's rows
    there count, for they hold its side calls too (title generation, compression) that its sessions row
    leaves out; elsewhere its sessions row. Columns a Hermes does not have count as absent."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(sessions)")}
    ids = [session_id]
    if "parent_session_id" in columns:
        ids += [row[0] for row in db.execute("SELECT id FROM sessions WHERE parent_session_id = ? LIMIT 100",
                                             (session_id,)) if isinstance(row[0], str)]
    marks = ",".join("?" * len(ids))
    cost = "estimated_cost_usd, cost_status" if {"estimated_cost_usd", "cost_status"} <= columns else "NULL, NULL"
    rows = db.execute(f"SELECT id, api_call_count, input_tokens, output_tokens, {cost}, model FROM sessions WHERE id "
                      f"IN ({marks})", ids).fetchall()
    if not rows:
        return None
    by_model: list[tuple[Any, ...]] = []
    if db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'session_model_usage'").fetchone():
        by_model = db.execute("SELECT session_id, api_call_count, input_tokens, output_tokens, estimated_cost_usd, "
                              f"cost_status, model FROM session_model_usage WHERE session_id IN ({marks}) LIMIT 10000",
                              ids).fetchall()
    itemised = {row[0] for row in by_model}
    spend: dict[str, Any] = {"api_calls": 0, "tokens_in": 0, "tokens_out": 0, "cost_usd": 0.0, "priced": 1}
    # a side call's row has no cost_status (0.22 writes none), only an estimate: unpriced is 'unknown' there
    for (_, calls, tokens_in, tokens_out, cost_usd, status, model), unpriced in [
            *((row, ("unknown",)) for row in by_model),
            *((row, (None, "unknown")) for row in rows if row[0] not in itemised)]:
        spend["api_calls"] += store_counter(calls)
        spend["tokens_in"] += store_counter(tokens_in)
        spend["tokens_out"] += store_counter(tokens_out)
        if is_number(cost_usd) and status not in unpriced:
            spend["cost_usd"] += float(cost_usd)
        elif store_counter(calls):
            spend["priced"] = 0
        if isinstance(model, str) and "model" not in spend:
            spend["model"] = model[:100]
    return spend


def sessions_spend(db: Any, session_ids: list[str]) -> dict[str, Any] | None:
    """What the sessions spent together (session_spend of each, summed): a job whose own session cannot be told
    apart from others started in its folder meanwhile is charged for all of them, never for none."""
    total: dict[str, Any] | None = None
    for session_id in session_ids[:SPEND_CANDIDATES]:
        spend = session_spend(db, session_id)
        if spend is None:
            continue
        if total is None:
            total = spend
            continue
        for key in ("api_calls", "tokens_in", "tokens_out", "cost_usd"):
            total[key] += spend[key]
        total["priced"] = min(total["priced"], spend["priced"])
    if total is not None and len(session_ids) > 1:
        total["sessions"] = len(session_ids)
    return total


def call_parts(call: Any) -> tuple[str, Any]:
    """One tool call of a tool_calls cell: the tool's name ("tool" when it has none) and its parsed arguments."""
    function = call.get("function") if isinstance(call, dict) else None
    function = function if isinstance(function, dict) else {}
    name = function.get("name")
    arguments = function.get("arguments")
    return name if isinstance(name, str) else "tool", json_cell(arguments) if isinstance(arguments, str) else arguments


def describe_tool_call(raw: Any) -> str | None:
    """'terminal: <command>' (or the tool's name and the start of its arguments) from a tool_calls cell."""
    calls = json_cell(raw)
    if not isinstance(calls, list) or not calls or not isinstance(calls[-1], dict):
        return None
    name, parsed = call_parts(calls[-1])
    shown_args = parsed.get("command") if isinstance(parsed, dict) and isinstance(parsed.get("command"), str) else (
        json.dumps(parsed, ensure_ascii=False)[:TOOL_ARGUMENT_CHARS * 2] if parsed is not None else "")
    shown_args = " ".join(str(shown_args).split())
    if len(shown_args) > TOOL_ARGUMENT_CHARS:
        shown_args = shown_args[:TOOL_ARGUMENT_CHARS] + "..."
    return f"{shown(name, 60)}: {shown_args}"


def current_tool(db: Any, session_id: str, since: float, now: float) -> str | None:
    """The last tool call of the session and whether its result has arrived. Hermes saves the assistant
    row holding a call before the tool runs, and the tool's row right after it ends."""
    row = db.execute("SELECT tool_calls, timestamp FROM messages WHERE session_id = ? AND timestamp >= ? AND "
                     "tool_calls IS NOT NULL AND tool_calls != '' AND tool_calls != '[]' ORDER BY timestamp DESC, "
                     "id DESC LIMIT 1", (session_id, since)).fetchone()
    if not row:
        return None
    called_at = store_time(row[1])
    calls = json_cell(row[0])
    if not isinstance(calls, list):
        raise StoreUnavailable("the last tool call in the session store is not a JSON list of a sane size and depth")
    described = describe_tool_call(row[0])
    if not described:
        return None
    call_ids = [call.get("id") for call in calls if isinstance(call, dict) and isinstance(call.get("id"), str)][:100]
    answered = db.execute(f"SELECT COUNT(*) FROM messages WHERE session_id = ? AND timestamp >= ? AND role = 'tool' "
                          f"AND tool_call_id IN ({','.join('?' * len(call_ids)) or 'NULL'})",
                          (session_id, called_at, *call_ids)).fetchone()[0]
    if call_ids and store_counter(answered) >= len(call_ids):
        return f"{described} (finished)"
    return f"{described} (running {max(0, int(now - called_at))} s)"


def final_text(db: Any, session_id: str, since: float) -> str | None:
    """Hermes' own last reply in this job: the last assistant message with text written since the job
    started (stdout also holds diff previews, and the log holds warnings)."""
    row = db.execute("SELECT substr(content, 1, ?) FROM messages WHERE session_id = ? AND timestamp >= ? AND "
                     "role = 'assistant' AND content IS NOT NULL AND content != '' ORDER BY timestamp DESC, id DESC "
                     "LIMIT 1", (FINAL_TEXT_MAX_CHARS, session_id, since)).fetchone()
    return row[0] if row and isinstance(row[0], str) else None


BLOCKED_RESULTS_KEPT = 100


REFUSALS_READ = 200  # tool results read for the writes the sandbox refused
REFUSAL_TEXT_BYTES = 65536


def refusal_texts(db: Any, session_id: str, since: float) -> list[str]:
    """The tool results of this job that report a refused write (permission denied, EACCES, not permitted),
    each cut to REFUSAL_TEXT_BYTES: where the tools' own words name what the sandbox refused."""
    rows = db.execute("SELECT substr(content, 1, ?) FROM messages WHERE session_id = ? AND timestamp >= ? AND role = "
                      "'tool' AND (content LIKE '%permission denied%' OR content LIKE '%EACCES%' OR content LIKE "
                      "'%not permitted%') ORDER BY timestamp, id LIMIT ?",
                      (REFUSAL_TEXT_BYTES, session_id, since, REFUSALS_READ)).fetchall()
    return [row[0] for row in rows if isinstance(row[0], str)]


def blocked_commands(db: Any, session_id: str, since: float) -> list[str]:
    """The commands Hermes refused to run in this job, read from its tool results (a `"status": "blocked"`
    result, written by 0.19 to 0.22), each with the command of the tool call it answers."""
    rows = db.execute("SELECT tool_call_id FROM messages WHERE session_id = ? AND timestamp >= ? AND role = 'tool' "
                      "AND content LIKE '%\"status\": \"blocked\"%' ORDER BY timestamp, id LIMIT ?",
                      (session_id, since, BLOCKED_RESULTS_KEPT)).fetchall()
    commands = []
    for (call_id,) in rows:
        if not isinstance(call_id, str):
            continue
        row = db.execute("SELECT tool_calls FROM messages WHERE session_id = ? AND role = 'assistant' AND "
                         "instr(tool_calls, ?) > 0 ORDER BY timestamp DESC LIMIT 1", (session_id, call_id)).fetchone()
        calls = json_cell(row[0]) if row else None
        call = next((c for c in calls if isinstance(c, dict) and c.get("id") == call_id), None) if isinstance(
            calls, list) else None
        arguments = call_parts(call)[1]
        command = arguments.get("command") if isinstance(arguments, dict) else None
        commands.append(command if isinstance(command, str) else "a command Hermes deemed dangerous")
    return commands
