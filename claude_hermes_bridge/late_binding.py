"""[both] A warm Hermes bound to its job's folder late (issue 65): the step runs in Hermes' own Python, enters
the sandbox a job would get with the folders a job may be given (the allowed roots, the tool caches) covered by
empty read-only mounts, imports Hermes' modules, and waits. Given a job, a helper it forked before it confined
itself shows, beneath those covers, what the job's own rules let it see (its folder writable, what it may read
read-only), and the step confines itself to the job's own rules, moves to its folder and runs Hermes' entry
point. What runs before the job is known runs inside a sandbox narrower than any job's. Imports nothing of the
package but sandbox (docs/performance.md, "A standby bound to its folder late")."""
import contextlib
import ctypes
import json
import os
import select
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
THREAD_STARTERS_MAX = 8  # modules left out of what is imported ahead before it is given up
COVER_FLAGS = sandbox.MS_NOSUID | sandbox.MS_NODEV  # then bound read-only (cover_read_only)


class MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


def late_step_argv(python: str, script: str, spec: dict[str, Any]) -> list[str]:
    """Hermes' Python running the late step for the console script `script`. spec: "writable" and "unreadable"
    (the first layer: what any job may write and read here, the covered folders included), "covers", "mounts"
    (the job-independent ones, sandbox.private_devices), "ports" (the proxy's, first), "own_network" (a
    descriptor, or None), "helper" (the descriptor of the supervisor's end of the helper's socket), "folder"
    (where it waits), "modules" (to import ahead), "tested" (whether none of them starts a thread: else
    without_thread_starters finds out, within "import_s" seconds a try)."""
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


def planned_view(covers: list[str], writable: list[str], grants: list[str]) -> list[tuple[str, bool]]:
    """What to show beneath the covers for a job, as (path, writable), shallowest first: a cover that a read grant
    holds whole and read-only, else the grants beneath it read-only; then the
    job's writable paths beneath it, writable. The same rules as the job's Landlock layer, held by mounts."""
    shown: dict[str, bool] = {}
    for cover in covers:
        if any(within(cover, grant) for grant in grants):
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


def show(plan: list[tuple[str, bool]], covers: dict[str, int], job_mounts: list[str], namespace: int) -> None:
    """The helper's work: each planned path cloned from this (uncovered) namespace, then placed at its own path in
    the step's namespace, read-only or writable: over its cover when the cover shows whole, else on a mount point
    made in the cover through the cover's writable clone (covers: each cover's), which the step's namespace never
    sees writable; then the job's own mounts made there (sandbox.make_mounts)."""
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
        set_read_only(call, clone, not rw, path)
        clones.append((path, clone))
    if call.setns(namespace, sandbox.CLONE_NEWNS) != 0:
        raise failed("setns")
    for path, clone in clones:
        if path not in covers and not os.path.lexists(path):
            cover = max((cover for cover in covers if within(path, cover)), key=len)
            made_beneath(covers[cover], os.path.relpath(path, cover), clone)
        if isinstance(clone, int):
            if call.syscall(MOVE_MOUNT, clone, b"", AT_FDCWD, path.encode(),
                            ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH)) != 0:
                raise failed(f"move_mount {path}")
            os.close(clone)
    sandbox.make_mounts(call, tuple(job_mounts))


def set_read_only(call: ctypes.CDLL, mount: int, read_only: bool, path: str) -> None:
    """A detached mount (and all beneath it) made read-only or writable."""
    attr = MountAttr(MOUNT_ATTR_RDONLY if read_only else 0, 0 if read_only else MOUNT_ATTR_RDONLY, 0, 0)
    if call.syscall(MOUNT_SETATTR, mount, b"", ctypes.c_uint(AT_EMPTY_PATH | AT_RECURSIVE), ctypes.byref(attr),
                    ctypes.c_size_t(ctypes.sizeof(attr))) != 0:
        raise failed(f"mount_setattr {path}")


def made_beneath(tree: int, relative: str, clone: int | str) -> None:
    """A mount point at relative beneath a cover's writable clone (tree): its folders, then a folder for a folder's
    clone, an empty file for a file's, or the symlink itself (clone: its target); nothing followed."""
    parts = relative.split("/")
    folder = os.dup(tree)
    try:
        for part in parts[:-1]:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o755, dir_fd=folder)
            inner = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=folder)
            os.close(folder)
            folder = inner
        if isinstance(clone, str):
            os.symlink(clone, parts[-1], dir_fd=folder)
        elif os.path.isdir(f"/proc/self/fd/{clone}"):
            os.mkdir(parts[-1], 0o755, dir_fd=folder)
        else:
            os.close(os.open(parts[-1], os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600, dir_fd=folder))
    finally:
        os.close(folder)


def cover_read_only(call: ctypes.CDLL, cover: str) -> None:
    flags = sandbox.MS_REMOUNT | sandbox.MS_BIND | COVER_FLAGS | sandbox.MS_RDONLY
    if call.mount(None, cover.encode(), None, ctypes.c_ulong(flags), None) != 0:
        raise failed(f"remount {cover}")


def helper(from_step: socket.socket, supervisor: int) -> None:
    """The forked helper, never confined and never running Hermes' code: takes the step's namespace from the step
    once (its namespace, and each cover's writable clone), then one request from the supervisor only ({"writable",
    "unreadable", "mounts"}), shows the job's view (show) and answers "bound" or why not."""
    for descriptor in (0, 1):
        os.dup2(os.open(os.devnull, os.O_RDWR), descriptor)
    covered, descriptors, _, _ = socket.recv_fds(from_step, 65536, 256)
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
            grants = sandbox.read_grants(job["unreadable"])
            covers = dict(zip(json.loads(covered), descriptors[1:], strict=True))
            show(planned_view(list(covers), job["writable"], grants), covers, job["mounts"], descriptors[0])
            channel.sendall(b"bound\n")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            channel.sendall(f"refused: {exc}\n".encode(errors="replace")[:BIND_REPLY_MAX])
            os._exit(1)
    os._exit(0)


def enter_unbound(spec: dict[str, Any]) -> int:
    """The step's own part, before any of Hermes runs: the job's namespace (sandbox.private_devices), the helper
    forked in it, the first layer's rules made while the covered folders are still the real ones, then a namespace
    of its own with each cover mounted, sent to the helper, and the first layer entered. The helper's pid."""
    ports = spec["ports"]
    sandbox.private_devices(tuple(spec["mounts"]), spec["own_network"] is not None)
    if spec["own_network"] is not None:
        sandbox.hand_listener(spec["own_network"], ports[0])
    to_helper, from_step = socket.socketpair()
    helper_pid = os.fork()
    if helper_pid == 0:
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
    writable_clones = []
    for cover in spec["covers"]:
        if call.mount(b"tmpfs", cover.encode(), b"tmpfs", ctypes.c_ulong(COVER_FLAGS), b"mode=0755") != 0:
            raise failed(f"cover {cover}")
        clone = call.syscall(OPEN_TREE, AT_FDCWD, cover.encode(), ctypes.c_uint(OPEN_TREE_CLONE | os.O_CLOEXEC))
        if clone < 0:
            raise failed(f"clone {cover}")
        writable_clones.append(clone)  # the helper's, to make mount points in: detached, seen by no one else
        cover_read_only(call, cover)
    # Landlock checks no folder a mount hides, so a job's folder mounted in a cover is reached through the cover's
    # own root: the first layer's rule for what it covers goes there too (the cover itself stays read-only).
    sandbox.add_path_rules(ruleset, spec["covers"], sandbox.handled_rights(True))
    namespace = os.open("/proc/self/ns/mnt", os.O_RDONLY)
    socket.send_fds(to_helper, [json.dumps(spec["covers"]).encode()], [namespace, *writable_clones])
    for descriptor in (namespace, *writable_clones):
        os.close(descriptor)
    to_helper.close()
    sandbox.enter_ruleset(ruleset, bool(ports))
    os.chdir(spec["folder"])
    return helper_pid


def import_ahead(modules: list[str]) -> int:
    """Import what a Hermes session loads, as far as it imports here; how many modules are loaded after."""
    for name in modules:
        try:
            __import__(name)
        except Exception:  # noqa: BLE001  (one of another platform or version: the job imports what it needs)
            continue
    return len(sys.modules)


def thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


def first_thread_starter(modules: list[str], timeout_s: float) -> str | None:
    """The first of modules whose import (in order, as import_ahead does) starts a thread, found in a forked child
    so that this process starts none; None when none does. OSError: the child did not finish in time."""
    reading, writing = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(reading)
        for descriptor in (0, 1):  # this process's stdin and stdout are Hermes' protocol
            os.dup2(os.open(os.devnull, os.O_RDWR), descriptor)
        for name in modules:
            with contextlib.suppress(BaseException):  # a module that exits or fails: not a thread
                __import__(name)
            if thread_count() > 1:
                os.write(writing, name.encode())
                break
        os._exit(0)
    os.close(writing)
    deadline, said = time.monotonic() + timeout_s, b""
    try:
        while (left := deadline - time.monotonic()) > 0 and select.select([reading], [], [], left)[0]:
            chunk = os.read(reading, 4096)
            if not chunk:
                return said.decode() or None
            said += chunk
        raise OSError(f"importing ahead took over {timeout_s:g} s")
    finally:
        os.close(reading)
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, 9)
        os.waitpid(child, 0)


def without_thread_starters(modules: list[str], timeout_s: float) -> tuple[list[str], list[str]]:
    """modules less those whose import starts a thread, found one by one (first_thread_starter: a module left out
    may be imported by a later one), and those left out. A thread would keep the first layer only: the job's is
    entered by the calling thread (sandbox.confine)."""
    left_out: list[str] = []
    while starter := first_thread_starter(modules, timeout_s):
        if len(left_out) >= THREAD_STARTERS_MAX:
            raise OSError(f"more than {THREAD_STARTERS_MAX} modules start a thread at import: {', '.join(left_out)}")
        left_out.append(starter)
        modules = [name for name in modules if name != starter]
    return modules, left_out


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
        helper_pid = enter_unbound(spec)
    except OSError as exc:
        notify({"refused": f"its sandbox could not be entered: {exc}"})
        sys.exit(126)
    started = time.monotonic()
    modules, left_out = spec["modules"], list[str]()
    if not spec["tested"]:
        try:
            modules, left_out = without_thread_starters(modules, spec["import_s"])
        except OSError as exc:
            notify({"refused": str(exc)})
            sys.exit(126)
    loaded = import_ahead(modules)
    threads = thread_count()
    notify({"modules": loaded, "import_s": round(time.monotonic() - started, 3), "threads": threads,
            "left_out": left_out})
    job = wait_for_the_job()
    os.waitpid(helper_pid, 0)  # it answered the supervisor, then exits: Hermes keeps no child it did not start
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
