"""A stand-in for the `hermes` CLI, driven by directives in the task text.

It parses the command line like the real one, in the personality FAKE_HERMES_VERSION chooses (DESIGN.md
section 5): 0.19 (`chat -q TASK -Q`, prints `session_id:`), 0.20 (adds `--in DIR`), 0.21 (adds
`--query-file -` and `--oneshot`, prints no session line). Flags the personality does not declare end in
exit 2 with "unrecognized arguments", as the real CLI does; `chat --help` lists the declared ones.

Like the real one it keeps a session store, $HERMES_HOME/state.db (SQLite, WAL, table `sessions` with `cwd`),
and a resume moves to the session's recorded folder whatever it was started in, announcing
`↻ Working directory: DIR` on stderr.

Directives (words in the task): !sleep=S  !exit=N  !print=BYTES  !longline=BYTES  !binary  !ansi
!write=REL:TEXT (\\n: a line break)  !delete=REL  !shell=SCRIPT (sh SCRIPT)  !commit=MSG (git add -A, commit)
!uncommitted=REL:TEXT (after it)
!tool-sleep=S  !announce-move=DIR  !double-fork  !rate-limited  !model-down
!calls=N (N API calls, see api_calls)
!grandchild=S (a tool process in its own session that starts one more of its own)
!ignore-term (this process and its descendants ignore SIGTERM and SIGINT)  !session=ID  !fresh-session  !stdout-noise
!escape (a tool that drops the job's environment and double-forks into a new session: `env -i sh -c
'(setsid sleep 300 &)'`; its pid is traced)  !store-fifo=SUFFIX (after its last row, makes state.db+SUFFIX a
FIFO, as a hostile job could: -journal, -wal, or "" for the database itself)

`hermes sessions delete ID --yes` deletes a session from the store, as the real one does.

With FAKE_HERMES_TRACE set, every invocation writes TRACE/<pid>.invoked (its argv), every run writes
TRACE/<pid>.json (argv, cwd, task, env) and every process it spawns writes TRACE/<pid>.child, so tests can
count runs and probes and check that no process is left.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # run_path (the Windows launcher) adds no folder
import fake_acp  # noqa: E402  (beside this file: its ACP side, and the managed policy both sides trace)

CHILD_CODE = """
import os, signal, subprocess, sys, time
trace, seconds, ignore, depth = sys.argv[1], float(sys.argv[2]), sys.argv[3] == '1', int(sys.argv[4])
if ignore:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
if trace:
    open(os.path.join(trace, f'{os.getpid()}.child'), 'w').write(str(depth))
if depth < 2:
    subprocess.Popen([sys.executable, '-c', sys.argv[5], trace, str(seconds), sys.argv[3], str(depth + 1),
                      sys.argv[5]], start_new_session=True)
time.sleep(seconds)
"""


DOUBLE_FORK_CODE = """
import subprocess, sys
ORPHAN = ('import os, sys, time; open(os.path.join(sys.argv[1], f"{os.getpid()}.child"), "w").write("o"); '
          'time.sleep(120)')
subprocess.Popen([sys.executable, '-c', ORPHAN, sys.argv[1]], start_new_session=True)
"""


def directives(task: str) -> dict[str, str]:
    found = {}
    for word in task.split():
        if word.startswith("!"):
            name, _, value = word[1:].partition("=")
            found[name] = value
    return found


def parser_for(version: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hermes chat")
    parser.add_argument("-q", "--query")
    parser.add_argument("-Q", "--quiet", action="store_true")
    parser.add_argument("--max-turns", type=int)
    parser.add_argument("--resume", "-r")
    parser.add_argument("--no-restore-cwd", action="store_true")
    parser.add_argument("-s", "--skills", action="append")
    parser.add_argument("-t", "--toolsets")
    parser.add_argument("--yolo", action="store_true")
    if version >= "0.20":
        parser.add_argument("--in", dest="in_dir")
    if version >= "0.21":
        parser.add_argument("--query-file")
        parser.add_argument("--oneshot", action="store_true")
    return parser


SCHEMA = [
    "PRAGMA journal_mode=WAL",
    "CREATE TABLE IF NOT EXISTS messages (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, "
    "role TEXT NOT NULL, content TEXT, tool_call_id TEXT, tool_calls TEXT, tool_name TEXT, "
    "timestamp REAL NOT NULL, finish_reason TEXT, active INTEGER NOT NULL DEFAULT 1)",
    "CREATE INDEX IF NOT EXISTS idx_messages_session ON messages(session_id, timestamp)",  # as Hermes has
    "CREATE TABLE IF NOT EXISTS sessions (id TEXT PRIMARY KEY, source TEXT NOT NULL, model TEXT, "
    "started_at REAL NOT NULL, ended_at REAL, message_count INTEGER DEFAULT 0, tool_call_count INTEGER "
    "DEFAULT 0, api_call_count INTEGER DEFAULT 0, input_tokens INTEGER DEFAULT 0, output_tokens INTEGER "
    "DEFAULT 0, cwd TEXT, parent_session_id TEXT, estimated_cost_usd REAL, cost_status TEXT)",
]


def session_store() -> sqlite3.Connection:
    """The store, created on first use. Two fakes starting together race to switch it to WAL, which SQLite
    answers with 'database is locked' at once (no busy wait for that), so the setup is retried."""
    home = os.environ.get("HERMES_HOME") or os.path.join(os.path.expanduser("~"), ".hermes")
    os.makedirs(home, exist_ok=True)
    deadline = time.time() + 30
    while True:
        db = sqlite3.connect(os.path.join(home, "state.db"), timeout=10)
        try:
            for statement in SCHEMA:
                db.execute(statement)
            return db
        except sqlite3.OperationalError:
            db.close()
            if time.time() > deadline:
                raise
            time.sleep(0.05 + random.random() * 0.1)


def record_turn(session: str, content: str | None = None, tool_command: str | None = None,
                tool_result_for: str | None = None) -> None:
    """One row of the conversation, as Hermes writes it: an API call's counters with each assistant row."""
    db = session_store()
    with db:
        if tool_result_for:
            db.execute("INSERT INTO messages (session_id, role, content, tool_call_id, timestamp) VALUES "
                       "(?, 'tool', 'done', ?, ?)", (session, tool_result_for, time.time()))
        else:
            calls = json.dumps([{"id": "call_1", "type": "function", "function": {
                "name": "terminal", "arguments": json.dumps({"command": tool_command})}}]) if tool_command else None
            db.execute("INSERT INTO messages (session_id, role, content, tool_calls, timestamp) VALUES "
                       "(?, 'assistant', ?, ?, ?)", (session, content, calls, time.time()))
            priced = os.environ.get("FAKE_HERMES_PRICE")  # dollars per API call; unset: a model Hermes cannot price
            db.execute("UPDATE sessions SET api_call_count = api_call_count + 1, tool_call_count = tool_call_count "
                       "+ ?, input_tokens = input_tokens + 1000, output_tokens = output_tokens + 100, "
                       "estimated_cost_usd = coalesce(estimated_cost_usd, 0) + ?, cost_status = ? WHERE id = ?",
                       (1 if tool_command else 0, float(priced or 0), "estimated" if priced else "unknown", session))
    db.close()


class AcpStore:
    """The session store as the fake's ACP side uses it: ACP sessions are recorded with source 'acp'."""

    def new_session(self, session: str, cwd: str | None) -> None:
        db = session_store()
        with db:
            db.execute("INSERT INTO sessions (id, source, model, started_at, cwd) VALUES (?, 'acp', 'fake', ?, ?)",
                       (session, time.time(), cwd))
        db.close()

    def has_session(self, session: Any) -> bool:
        db = session_store()
        found = db.execute("SELECT 1 FROM sessions WHERE id = ?", (session,)).fetchone() is not None
        db.close()
        return found

    def add_answer(self, session: str, answer: str) -> None:
        record_turn(session, content=answer)

    def api_call(self, session: str, command: str) -> None:
        record_turn(session, tool_command=command)


def open_session(args: argparse.Namespace, todo: dict[str, str]) -> str | None:
    """The session this run continues or starts; a resume moves to the recorded folder, as the real CLI does."""
    db = session_store()
    with db:
        if args.resume and "fresh-session" not in todo:
            row = db.execute("SELECT cwd FROM sessions WHERE id = ?", (args.resume,)).fetchone()
            if row is None:
                print(f"Session not found: {args.resume}", file=sys.stderr)
                return None
            if row[0] and os.path.isdir(row[0]) and os.path.realpath(row[0]) != os.path.realpath(os.getcwd()):
                os.chdir(row[0])
                print(f"↻ Working directory: {row[0]}", file=sys.stderr, flush=True)
            return args.resume
        session = todo.get("session") or time.strftime("%Y%m%d_%H%M%S_") + f"{random.randrange(16**6):06x}"
        db.execute("INSERT OR REPLACE INTO sessions (id, source, model, started_at, cwd) "
                   "VALUES (?, 'cli', 'fake', ?, ?)",
                   (session, time.time(), os.getcwd()))
    db.close()
    return session


def read_task(args: argparse.Namespace) -> str | None:
    if getattr(args, "query_file", None) == "-":
        return sys.stdin.read()
    return args.query


def trace_run(trace: str, argv: list[str], task: str) -> None:
    if trace:
        with open(os.path.join(trace, f".{os.getpid()}.tmp"), "w") as handle:
            json.dump({"argv": argv, "cwd": os.getcwd(), "task": task, "pid": os.getpid(),
                       "hermes_home": os.environ.get("HERMES_HOME"), "marker": os.environ.get("HERMES_BRIDGE_JOB"),
                       "policy": fake_acp.managed_policy()}, handle)
        os.replace(os.path.join(trace, f".{os.getpid()}.tmp"), os.path.join(trace, f"{os.getpid()}.json"))


def stopped_by(signum: int, _frame: object) -> None:
    print(f"fake hermes: stopped by {signal.Signals(signum).name}", flush=True)
    sys.exit(130)


def start_processes(todo: dict[str, str], trace: str) -> None:
    """The directives that leave processes behind, or announce a move, before any work."""
    for polite in (signal.SIGTERM, signal.SIGINT):  # the real CLI exits 130 on either, after its session line
        signal.signal(polite, signal.SIG_IGN if "ignore-term" in todo else stopped_by)
    if "announce-move" in todo:  # what a resume that restores another folder prints
        print(f"↻ Working directory: {todo['announce-move']}", file=sys.stderr, flush=True)
    if "double-fork" in todo:  # a tool whose child outlives it, re-parented away from Hermes
        subprocess.run([sys.executable, "-c", DOUBLE_FORK_CODE, trace], check=True)
    if "escape" in todo:
        subprocess.run(["env", "-i", "sh", "-c", '(setsid sleep 300 & : > "$1/$!.child")', "sh", trace], check=True)
    if "grandchild" in todo:
        subprocess.Popen([sys.executable, "-c", CHILD_CODE, trace, todo["grandchild"] or "60",
                          "1" if "ignore-term" in todo else "0", "1", CHILD_CODE], start_new_session=True)


def print_output(todo: dict[str, str], task: str) -> None:
    """The directives that shape what Hermes prints (!rate-limited and !model-down: what 0.19-0.22 print before
    they exit 1)."""
    if "rate-limited" in todo:
        sys.stderr.write("API call failed: Error code: 429 - {'error': {'message': 'Rate limit exceeded'}}\n")
    if "model-down" in todo:
        sys.stderr.write("API call failed after 3 retries: Connection error.\n")
    if "stdout-noise" in todo:
        os.write(1, b"noise on fd 1 without a newline")
    out = sys.stdout
    if "print" in todo:
        line = "x" * 99 + "\n"
        remaining = int(todo["print"])
        while remaining > 0:
            chunk = (line * 1000)[:remaining]
            out.write(chunk)
            remaining -= len(chunk)
    if "longline" in todo:
        out.write("y" * int(todo["longline"]) + "\n")
    if "binary" in todo:
        out.flush()
        os.write(1, b"bad utf-8: \xff\xfe\xc3\x28 end\n")
    if "ansi" in todo:
        out.write("\x1b[31mred\x1b[0m \x1b]0;title\x07plain\n")
    out.write(f"working on: {task[:80]}\n")
    out.flush()


def api_calls(todo: dict[str, str], session: str, max_turns: int | None = None) -> bool:
    """!calls=N: N API calls with a tool call each, 0.3 s apart (1,000 tokens in and 100 out each), stopping at
    max_turns as the CLI does; False when the cap ended them (0.19 then says so and exits 0)."""
    for number in range(int(todo.get("calls") or 0)):
        if max_turns is not None and number >= max_turns:
            sys.stdout.write("No reply: the maximum tool-iteration limit was reached\n")
            return False
        record_turn(session, tool_command=f"echo step {number + 1}")
        time.sleep(0.3)
    return True


def do_work(todo: dict[str, str], session: str, task: str, max_turns: int | None = None) -> None:
    """Tool calls, file changes, the time it takes, the answer, and what it leaves in its store."""
    if not api_calls(todo, session, max_turns):
        return
    if "tool-sleep" in todo:  # a terminal tool call that runs for a while, saved as Hermes saves it
        record_turn(session, tool_command=f"sleep {todo['tool-sleep']}")
        time.sleep(float(todo["tool-sleep"]))
        record_turn(session, tool_result_for="call_1")
    fake_acp.file_work(todo, os.getcwd())
    deadline = time.time() + float(todo.get("sleep") or 0)
    while time.time() < deadline:
        time.sleep(min(0.1, max(0.0, deadline - time.time())))
    sys.stdout.write(f"FAKE DONE: {task[:60]}\n")
    sys.stdout.flush()
    record_turn(session, content=f"FAKE ANSWER: {task[:60]}")
    if "store-fifo" in todo:
        store = os.path.join(os.environ.get("HERMES_HOME") or os.path.expanduser("~/.hermes"), "state.db")
        if not todo["store-fifo"]:
            os.replace(store, store + ".real")
        os.mkfifo(store + todo["store-fifo"])


def main() -> int:
    version = os.environ.get("FAKE_HERMES_VERSION", "0.19")
    argv = sys.argv[1:]
    trace = os.environ.get("FAKE_HERMES_TRACE", "")
    if trace:
        with open(os.path.join(trace, f"{os.getpid()}.invoked"), "w") as handle:
            json.dump(argv, handle)
    if argv == ["--version"]:
        print("Hermes Agent v0.19.0 (fake)")
        return 0
    if argv[:1] == ["acp"]:
        return fake_acp.main(argv, AcpStore(), trace)
    if argv[:2] == ["sessions", "delete"] and argv[3:] == ["--yes"]:  # as Hermes 0.19 to 0.22 delete one
        db = session_store()
        with db:
            db.execute("DELETE FROM messages WHERE session_id = ?", (argv[2],))
            deleted = db.execute("DELETE FROM sessions WHERE id = ?", (argv[2],)).rowcount
        db.close()
        print(f"Deleted session '{argv[2]}'." if deleted else f"Session '{argv[2]}' not found.")
        return 0
    if argv[:1] != ["chat"]:
        print("usage: hermes chat ...", file=sys.stderr)
        return 2
    args = parser_for(version).parse_args(argv[1:])
    task = read_task(args)
    if task is None:
        print("error: no query given", file=sys.stderr)
        return 2
    if getattr(args, "in_dir", None):
        os.chdir(args.in_dir)
    todo = directives(task)
    session = open_session(args, todo)
    if session is None:
        return 1
    trace_run(trace, argv, task)
    start_processes(todo, trace)
    print_output(todo, task)
    do_work(todo, session, task, getattr(args, "max_turns", None))
    if version < "0.21":
        sys.stderr.write(f"session_id: {session}\n")
        sys.stderr.flush()
    return int(todo.get("exit") or 0)


if __name__ == "__main__":
    sys.exit(main())
