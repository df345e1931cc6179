"""[both] A warm Hermes bound to its job's folder late (issue 65): the step runs in Hermes' own Python, enters
the sandbox a job would get with the folders a job may be given (the allowed roots, the tool caches) covered by
empty read-only mounts, imports Hermes' modules, and waits. Given a job, a helper it forked before it confined
itself shows, beneath those covers, what the job's own rules let it see (its folder writable, what it may read
read-only), and the step confines itself to the job's own rules, moves to its folder and runs Hermes' entry
point. What runs before the job is known runs inside a sandbox narrower than any job's. Imports nothing of the
package but sandbox (docs/performance.md, "A standby bound to its folder late")."""
import ctypes
import json
import os
import socket
import sys
import time
from typing import Any

from . import sandbox

STEP_FUNCTION = "late_step"
IMPORTED = "bridge/imported"  # the notification the step writes on its stdout once it is ready to be bound
BIND_REPLY_MAX = 4096
OPEN_TREE, MOVE_MOUNT, MOUNT_SETATTR = 428, 429, 442  # the new mount API's calls: one number on every architecture
OPEN_TREE_CLONE, AT_RECURSIVE, AT_EMPTY_PATH, AT_FDCWD, MOVE_MOUNT_F_EMPTY_PATH = 1, 0x8000, 0x1000, -100, 4
MOUNT_ATTR_RDONLY = 1
COVER_FLAGS = sandbox.MS_NOSUID | sandbox.MS_NODEV  # then bound read-only (cover_read_only)


class MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


def late_step_argv(python: str, script: str, spec: dict[str, Any]) -> list[str]:
    """Hermes' Python running the late step for the console script `script`. spec: "writable" and "unreadable"
    (the first layer: what any job may write and read here, the covered folders included), "covers", "mounts"
    (the job-independent ones, sandbox.private_devices), "ports" (the proxy's, first), "own_network" (a
    descriptor, or None), "helper" (the descriptor of the supervisor's end of the helper's socket), "folder"
    (where it waits), "modules" (to import ahead)."""
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    boot = (f"import sys; sys.path.insert(0, sys.argv.pop(1)); from claude_hermes_bridge.late_binding import "
            f"{STEP_FUNCTION}; sys.path.pop(0); {STEP_FUNCTION}()")
    return [python, "-c", boot, package_parent, script, json.dumps(spec)]


def entry_python(script: str) -> str | None:
    """The Python a console script (`hermes`) runs on, from its first line, or None when it names none."""
    try:
        with open(script, "rb") as handle:
            first = handle.readline(4096)
    except OSError:
        return None
    words = first[2:].decode(errors="replace").split() if first.startswith(b"#!") else []
    python = words[0] if len(words) == 1 else ""
    return python if os.path.basename(python).startswith("python") and os.access(python, os.X_OK) else None


def within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def planned_view(covers: list[str], writable: list[str], grants: list[str] | None) -> list[tuple[str, bool]]:
    """What to show beneath the covers for a job, as (path, writable), shallowest first: a cover that a read grant
    holds (or all of it, with no read rules) whole and read-only, else the grants beneath it read-only; then the
    job's writable paths beneath it, writable. The same rules as the job's Landlock layer, held by mounts."""
    shown: dict[str, bool] = {}
    for cover in covers:
        if grants is None or any(within(cover, grant) for grant in grants):
            shown[cover] = False
        else:
            for grant in grants:
                if within(grant, cover) and grant != cover and not any(within(grant, path) for path in writable):
                    shown[grant] = False
        for path in writable:
            if within(path, cover):
                shown[path] = True
    ordered = sorted(shown.items(), key=lambda item: item[0].count("/"))
    return [(path, rw) for index, (path, rw) in enumerate(ordered)
            if not any(within(path, earlier) and rw == earlier_rw for earlier, earlier_rw in ordered[:index])]


def failed(what: str) -> OSError:
    error = ctypes.get_errno()
    return OSError(error, f"{what}: {os.strerror(error)}")


def show(plan: list[tuple[str, bool]], covers: list[str], job_mounts: list[str], namespace: int) -> None:
    """The helper's work: each planned path cloned from this (uncovered) namespace, then, in the step's namespace,
    placed at its own path beneath its cover (a mount point made in the cover first), read-only or writable, and
    the job's own mounts made there (sandbox.make_mounts)."""
    call = sandbox.libc()
    clones: list[tuple[str, int | str]] = []
    for path, rw in plan:
        if os.path.islink(path):
            clones.append((path, os.readlink(path)))
            continue
        flags = OPEN_TREE_CLONE | AT_RECURSIVE | os.O_CLOEXEC
        clone = call.syscall(OPEN_TREE, AT_FDCWD, path.encode(), ctypes.c_uint(flags))
        if clone < 0:
            raise failed(f"clone {path}")
        attr = MountAttr(0 if rw else MOUNT_ATTR_RDONLY, MOUNT_ATTR_RDONLY if rw else 0, 0, 0)
        if call.syscall(MOUNT_SETATTR, clone, b"", ctypes.c_uint(AT_EMPTY_PATH | AT_RECURSIVE), ctypes.byref(attr),
                        ctypes.c_size_t(ctypes.sizeof(attr))) != 0:
            raise failed(f"mount_setattr {path}")
        clones.append((path, clone))
    if call.setns(namespace, sandbox.CLONE_NEWNS) != 0:
        raise failed("setns")
    for cover in covers:  # writable while its mount points are made; no job code runs meanwhile
        cover_read_only(call, cover, False)
    for path, clone in clones:
        if isinstance(clone, str):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            os.symlink(clone, path)
            continue
        if not os.path.lexists(path):
            os.makedirs(path if os.path.isdir(f"/proc/self/fd/{clone}") else os.path.dirname(path), exist_ok=True)
            if not os.path.lexists(path):
                os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
        if call.syscall(MOVE_MOUNT, clone, b"", AT_FDCWD, path.encode(), ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH)) != 0:
            raise failed(f"move_mount {path}")
        os.close(clone)
    for cover in covers:
        cover_read_only(call, cover, True)
    sandbox.make_mounts(call, tuple(job_mounts))


def cover_read_only(call: ctypes.CDLL, cover: str, read_only: bool) -> None:
    flags = sandbox.MS_REMOUNT | sandbox.MS_BIND | COVER_FLAGS | (sandbox.MS_RDONLY if read_only else 0)
    if call.mount(None, cover.encode(), None, ctypes.c_ulong(flags), None) != 0:
        raise failed(f"remount {cover}")


def helper(from_step: socket.socket, supervisor: int) -> None:
    """The forked helper, never confined and never running Hermes' code: takes the step's namespace from the step
    once, then one request from the supervisor only ({"covers", "writable", "unreadable", "mounts"}), shows the
    job's view (show) and answers "bound" or why not."""
    for descriptor in (0, 1):
        os.dup2(os.open(os.devnull, os.O_RDWR), descriptor)
    _, descriptors, _, _ = socket.recv_fds(from_step, 16, 1)
    from_step.close()
    with socket.socket(fileno=supervisor) as channel:
        request = b""
        while not request.endswith(b"\n"):
            chunk = channel.recv(65536)
            if not chunk:
                os._exit(0)  # the supervisor let the standby go
            request += chunk
        try:
            job = json.loads(request)
            unreadable = job["unreadable"]
            grants = sandbox.read_grants(unreadable) if unreadable is not None else None
            show(planned_view(job["covers"], job["writable"], grants), job["covers"], job["mounts"], descriptors[0])
            channel.sendall(b"bound\n")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            channel.sendall(f"refused: {exc}\n".encode(errors="replace")[:BIND_REPLY_MAX])
            os._exit(1)
    os._exit(0)


def enter_unbound(spec: dict[str, Any]) -> None:
    """The step's own part, before any of Hermes runs: the job's namespace (sandbox.private_devices), the helper
    forked in it, the first layer's rules made while the covered folders are still the real ones, then a namespace
    of its own with each cover mounted, sent to the helper, and the first layer entered."""
    ports = spec["ports"]
    sandbox.private_devices(tuple(spec["mounts"]), spec["own_network"] is not None)
    if spec["own_network"] is not None:
        sandbox.hand_listener(spec["own_network"], ports[0])
    to_helper, from_step = socket.socketpair()
    if os.fork() == 0:
        to_helper.close()
        try:
            helper(from_step, spec["helper"])
        finally:
            os._exit(1)
    from_step.close()
    os.close(spec["helper"])
    unreadable = spec["unreadable"]
    ruleset, _ = sandbox.landlock_ruleset(spec["writable"], sandbox.read_grants(unreadable),
                                          ports[0] if ports else None, tuple(ports[1:]))
    call = sandbox.libc()
    if call.unshare(sandbox.CLONE_NEWNS) != 0:
        raise failed("unshare")
    if call.mount(None, b"/", None, ctypes.c_ulong(sandbox.MS_REC | sandbox.MS_PRIVATE), None) != 0:
        raise failed("mount / private")
    for cover in spec["covers"]:
        if call.mount(b"tmpfs", cover.encode(), b"tmpfs", ctypes.c_ulong(COVER_FLAGS), b"mode=0755") != 0:
            raise failed(f"cover {cover}")
        cover_read_only(call, cover, True)
    namespace = os.open("/proc/self/ns/mnt", os.O_RDONLY)
    socket.send_fds(to_helper, [b"namespace"], [namespace])
    os.close(namespace)
    to_helper.close()
    sandbox.enter_ruleset(ruleset, bool(ports))
    os.chdir(spec["folder"])


def import_ahead(modules: list[str]) -> int:
    """Import what a Hermes session loads, as far as it imports here; how many modules are loaded after."""
    for name in modules:
        try:
            __import__(name)
        except Exception:  # noqa: BLE001  (one of another platform or version: the job imports what it needs)
            continue
    return len(sys.modules)


def notify(params: dict[str, Any]) -> None:
    os.write(1, (json.dumps({"jsonrpc": "2.0", "method": IMPORTED, "params": params}) + "\n").encode())


def read_line(descriptor: int) -> bytes:
    """One line, byte by byte: what follows is Hermes' own input."""
    line = b""
    while not line.endswith(b"\n"):
        byte = os.read(descriptor, 1)
        if not byte:
            sys.exit(0)  # let go before any job
        line += byte
    return line


def wait_for_the_job() -> dict[str, Any]:
    """The line naming the job; a request before it (the standby's bridge/ping) is answered as Hermes' JSON-RPC
    layer answers a method it does not know, so a frozen or stuck step is found as a frozen Hermes is."""
    while True:
        message = json.loads(read_line(0))
        if "method" not in message:
            return dict(message)
        answer = {"jsonrpc": "2.0", "id": message.get("id"), "error": {"code": -32601, "message": "not bound yet"}}
        os.write(1, (json.dumps(answer) + "\n").encode())


def late_step() -> None:
    """The program late_step_argv runs: enter the first layer, import, say so on stdout, then wait for one line
    naming the job ({"folder", "writable", "unreadable", "environment"}), sent once the helper showed its view;
    confine to it (sandbox.confine, as a cold job's step does), move there and run Hermes' console script."""
    script, spec = sys.argv[1], json.loads(sys.argv[2])
    if sys.path and sys.path[0] == "":  # `-c` puts the working folder first, where `python script` puts its own
        sys.path.pop(0)
    try:
        enter_unbound(spec)
    except OSError as exc:
        notify({"refused": str(exc)})
        sys.exit(126)
    started = time.monotonic()
    loaded = import_ahead(spec["modules"])
    threads = len(os.listdir("/proc/self/task"))
    notify({"modules": loaded, "import_s": round(time.monotonic() - started, 3), "threads": threads})
    job = wait_for_the_job()
    if threads != 1:  # a thread confine cannot reach would keep the first layer only
        sys.exit(126)
    ports = spec["ports"]
    sandbox.confine(job["writable"], sandbox.read_grants(job["unreadable"]), ports[0] if ports else None,
                    tuple(ports[1:]))
    os.chdir(job["folder"])
    os.environ.update(job["environment"], PWD=job["folder"])
    sys.argv = [script, "acp"]
    sys.path.insert(0, os.path.dirname(os.path.realpath(script)))
    import runpy

    runpy.run_path(script, run_name="__main__")
