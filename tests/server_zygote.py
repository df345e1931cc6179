"""Test-only: servers forked from one process that imported the server's modules and the MCP stack once.

A server's start is mostly `import mcp` (about a CPU-second on a loaded two-core machine, measured with process
accounting: half of the suite's CPU went to it). The harness's default server comes from here instead of a fresh
interpreter: the same code and the same stdio (the client's pipes are handed over with SCM_RIGHTS), the test's
environment, folder and argv; only the interpreter start and the imports are skipped. Tests that are about how
a server starts (the launchers, the bundle, --check, the benchmark) give their own command and start it fresh.

    python server_zygote.py serve SOCKET            the zygote: one per test worker (harness.zygote_socket)
    python -S server_zygote.py launch SOCKET PIDFILE    what the client starts: hands its stdio over, writes the
                                                     server's pid, and exits with the server's exit code
"""
import array
import contextlib
import json
import os
import select
import shutil
import socket
import sys
from pathlib import Path
from typing import Any

SERVER = Path(__file__).resolve().parent.parent / "server.py"
REQUEST_MAX = 1 << 20


def launch(path: str, pidfile: str) -> int:
    """Hand this process's stdin, stdout and stderr to a server forked by the zygote, then let go of stdin and
    stdout (the client must see the server's end of its pipes alone), and wait for the server's exit."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    request = json.dumps({"argv": [str(SERVER)], "env": dict(os.environ), "cwd": os.getcwd()}).encode() + b"\n"
    conn.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))])
    nothing = os.open(os.devnull, os.O_RDWR)
    os.dup2(nothing, 0)
    os.dup2(nothing, 1)
    replies = conn.makefile("r")
    pid = replies.readline().strip()
    Path(pidfile + ".tmp").write_text(pid)
    os.replace(pidfile + ".tmp", pidfile)
    ended = replies.readline().split()
    code = int(ended[1]) if len(ended) == 2 and ended[0] == "exit" else 1
    return code if code >= 0 else 128 - code


def receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """One request: its JSON line and the three descriptors that came with its first bytes."""
    data, fds = b"", array.array("i")
    while not data.endswith(b"\n"):
        chunk, ancillary, _, _ = conn.recvmsg(REQUEST_MAX, socket.CMSG_SPACE(3 * fds.itemsize))
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
        if not chunk:
            raise EOFError("the launcher went away")
        data += chunk
    return json.loads(data), list(fds)


def serve(path: str) -> dict[str, Any]:
    """Fork a server per connection; in the parent, tell each launcher its server's pid and then its exit code.
    Returns only in a forked child, with what it must become."""
    import anyio  # noqa: F401  (imported once, here: the point of the zygote)
    import mcp.server.stdio  # noqa: F401

    from claude_hermes_bridge import cli, mcp_edge  # noqa: F401

    mcp_edge.McpEdge()  # imports the installed SDK line's server, which mcp_edge itself imports only when it serves

    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".tmp")
    os.replace(path + ".tmp", path)
    listener.listen(64)
    waiting: dict[int, socket.socket] = {}
    while os.getppid() == parent:  # the test worker that started this zygote is gone: so is the zygote
        if select.select([listener], [], [], 0.05)[0]:
            conn, _ = listener.accept()
            try:
                request, fds = receive(conn)
            except (OSError, EOFError, ValueError):
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:
                for held in (listener, conn, *waiting.values()):
                    held.close()
                for target, fd in enumerate(fds):
                    os.dup2(fd, target)
                for fd in fds:
                    if fd > 2:
                        os.close(fd)
                return request
            for fd in fds:
                os.close(fd)
            conn.sendall(f"{pid}\n".encode())
            waiting[pid] = conn
        while waiting:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid not in waiting:  # only forked servers are its children; a stray one is only reaped
                continue
            conn = waiting.pop(pid)
            with_code = f"exit {os.waitstatus_to_exitcode(status)}\n".encode()
            with contextlib.suppress(OSError):
                conn.sendall(with_code)
            conn.close()
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)  # its socket and log: the run leaves nothing behind
    return {}


def become_server(request: dict[str, Any]) -> None:
    """In the forked child: the test's environment, folder and argv, then the server as server.py runs it."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = request["argv"]
    from claude_hermes_bridge.entry import console_main

    console_main()


if __name__ == "__main__":
    if sys.argv[1] == "launch":
        sys.exit(launch(sys.argv[2], sys.argv[3]))
    sys.path.insert(0, str(SERVER.parent))
    child = serve(sys.argv[2])
    if child:
        become_server(child)
