"""A stand-in for the `hermes` CLI, driven by directives in the task text.

It parses the command line like the real one: the 0.19 form (`chat -q TASK -Q ...`) and, with
FAKE_HERMES_FORM=query-file, the 0.20+ form (`chat --query-file - -Q --oneshot --in DIR ...`). Flags the
chosen form does not know end in exit 2 with "unrecognized arguments", as the real CLI does.

Directives (words in the task): !sleep=S  !exit=N  !print=BYTES  !longline=BYTES  !binary  !ansi
!write=REL:TEXT  !grandchild=S (a tool process in its own session that starts one more of its own)
!ignore-term (this process and its descendants ignore SIGTERM)  !session=ID  !fresh-session  !stdout-noise

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
import subprocess
import sys
import time

CHILD_CODE = """
import os, signal, subprocess, sys, time
trace, seconds, ignore, depth = sys.argv[1], float(sys.argv[2]), sys.argv[3] == '1', int(sys.argv[4])
if ignore:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if trace:
    open(os.path.join(trace, f'{os.getpid()}.child'), 'w').write(str(depth))
if depth < 2:
    subprocess.Popen([sys.executable, '-c', sys.argv[5], trace, str(seconds), sys.argv[3], str(depth + 1),
                      sys.argv[5]], start_new_session=True)
time.sleep(seconds)
"""


def directives(task: str) -> dict[str, str]:
    found = {}
    for word in task.split():
        if word.startswith("!"):
            name, _, value = word[1:].partition("=")
            found[name] = value
    return found


def parser_for(form: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hermes chat")
    parser.add_argument("-q", "--query")
    parser.add_argument("-Q", "--quiet", action="store_true")
    parser.add_argument("--max-turns", type=int)
    parser.add_argument("--resume", "-r")
    parser.add_argument("--no-restore-cwd", action="store_true")
    parser.add_argument("-s", "--skills", action="append")
    parser.add_argument("-t", "--toolsets")
    parser.add_argument("--yolo", action="store_true")
    if form == "query-file":
        parser.add_argument("--query-file")
        parser.add_argument("--oneshot", action="store_true")
        parser.add_argument("--in", dest="in_dir")
    return parser


def main() -> int:
    form = os.environ.get("FAKE_HERMES_FORM", "query-arg")
    argv = sys.argv[1:]
    trace = os.environ.get("FAKE_HERMES_TRACE", "")
    if trace:
        with open(os.path.join(trace, f"{os.getpid()}.invoked"), "w") as handle:
            json.dump(argv, handle)
    if argv == ["--version"]:
        print("Hermes Agent v0.19.0 (fake)")
        return 0
    if argv[:1] != ["chat"]:
        print("usage: hermes chat ...", file=sys.stderr)
        return 2
    args = parser_for(form).parse_args(argv[1:])
    if form == "query-file" and args.query_file == "-":
        task = sys.stdin.read()
    elif args.query is not None:
        task = args.query
    else:
        print("error: no query given", file=sys.stderr)
        return 2
    if form == "query-file" and args.in_dir:
        os.chdir(args.in_dir)
    todo = directives(task)
    if trace:
        with open(os.path.join(trace, f"{os.getpid()}.json"), "w") as handle:
            json.dump({"argv": argv, "cwd": os.getcwd(), "task": task, "pid": os.getpid(),
                       "hermes_home": os.environ.get("HERMES_HOME")}, handle)
    if "ignore-term" in todo:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(130))
    if "grandchild" in todo:
        subprocess.Popen([sys.executable, "-c", CHILD_CODE, trace, todo["grandchild"] or "60",
                          "1" if "ignore-term" in todo else "0", "1", CHILD_CODE], start_new_session=True)
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
    if "write" in todo:
        rel, _, text = todo["write"].partition(":")
        with open(rel, "w") as handle:
            handle.write(text)
    deadline = time.time() + float(todo.get("sleep") or 0)
    while time.time() < deadline:
        time.sleep(min(0.1, max(0.0, deadline - time.time())))
    if args.resume and "fresh-session" not in todo:
        session = args.resume
    else:
        session = todo.get("session") or time.strftime("%Y%m%d_%H%M%S_") + f"{random.randrange(16**6):06x}"
    out.write(f"FAKE DONE: {task[:60]}\n")
    out.flush()
    sys.stderr.write(f"session_id: {session}\n")
    sys.stderr.flush()
    return int(todo.get("exit") or 0)


if __name__ == "__main__":
    sys.exit(main())
