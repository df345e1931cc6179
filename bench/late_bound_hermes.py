"""Run by a real Hermes' own Python (bench/late_binding.py): the measurement behind issue 65's design choice,
not the product. `record MODULES`: run `hermes acp` in this folder and, on SIGUSR1, write the names of the modules
it has loaded. `bind MODULES REPORT`: import those modules (Hermes' CLI entry excepted: it starts a logging
thread) with no job known, write what the imports did to REPORT, then read one line from stdin naming the job's
folder and writable paths, enter the mount namespace and Landlock in this process with the sandbox step's own
code, move to the folder, and only then run `hermes acp`."""
import json
import os
import signal
import sys
import time
import traceback
from typing import Any

IMPORT_AUDITED = ("open", "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.fork",
                  "_thread.start_new_thread")


def record(modules_path: str) -> None:
    def write_modules(*_: Any) -> None:
        with open(modules_path + ".tmp", "w") as handle:  # whole or absent: the bench kills this process next
            json.dump(sorted(sys.modules), handle)
        os.rename(modules_path + ".tmp", modules_path)
    signal.signal(signal.SIGUSR1, write_modules)


def import_unbound(modules_path: str) -> dict[str, Any]:
    """Import the recorded modules; what they did at import: the folder read, files opened outside Python's
    own, processes or threads started, and the threads left running (a user namespace needs one)."""
    with open(modules_path) as handle:
        names = [name for name in json.load(handle) if name != "hermes_cli.main" and not name.startswith("__main__")]
    folder_reads: list[str] = []
    events: list[str] = []
    real_getcwd = os.getcwd

    def audited_getcwd() -> str:
        folder_reads.append(traceback.format_stack(limit=2)[0].strip().splitlines()[0])
        return real_getcwd()

    def audit(event: str, args: tuple[Any, ...]) -> None:
        if event in IMPORT_AUDITED and not (event == "open" and not isinstance(args[0], str)):
            what = str(args[0]) if event == "open" else f"{event} {args[1] if len(args) > 1 else args[0]}"
            if "/lib/python3" not in what and not what.endswith(".pyc"):
                events.append(what)
    os.getcwd = audited_getcwd
    sys.addaudithook(audit)
    started = time.perf_counter()
    failed = 0
    for name in names:
        try:
            __import__(name)
        except Exception:  # noqa: BLE001  (a module of another platform, or one made at run time by Hermes)
            failed += 1
    os.getcwd = real_getcwd
    found = {"import_s": round(time.perf_counter() - started, 2), "modules": len(sys.modules), "failed": failed,
             "threads": len(os.listdir("/proc/self/task")), "folder_reads": folder_reads,
             "opened_or_started": list(events)}
    events.clear()
    return found


def bind(modules_path: str, report: str) -> None:
    found = import_unbound(modules_path)
    with open(report + ".tmp", "w") as handle:
        json.dump(found, handle)
    os.rename(report + ".tmp", report)
    line = b""
    while not line.endswith(b"\n"):  # byte by byte: what follows is Hermes' ACP input
        line += os.read(0, 1)
    job = json.loads(line)
    started = time.perf_counter()
    sys.path.insert(0, job["bridge"])
    from claude_hermes_bridge import sandbox
    try:
        sandbox.private_devices((), False)
        found["namespace"] = "entered"
    except OSError as exc:
        found["namespace"] = f"refused: {exc}"
    found["landlock_abi"] = sandbox.confine(job["writable"])
    os.chdir(job["folder"])
    found["bind_s"] = round(time.perf_counter() - started, 3)
    with open(report, "w") as handle:
        json.dump(found, handle)


if __name__ == "__main__":
    mode, given = sys.argv[1], sys.argv[2:]
    sys.argv = ["hermes", "acp"]
    if mode == "record":
        record(given[0])
    else:
        bind(given[0], given[1])
    from hermes_cli.main import main
    sys.exit(main())
