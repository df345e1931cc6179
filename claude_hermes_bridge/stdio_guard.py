"""[both] The client's pipes moved aside before anything can print: stdout is the protocol."""
import os
import sys


def guard_stdio() -> tuple[int, int]:
    """Move the client's pipes to private fds; fd 0 becomes the null device and fd 1 becomes stderr.

    After this a print() anywhere, or a child that inherits fd 1, writes to stderr and can never corrupt
    the JSON-RPC stream. os.dup() returns non-inheritable fds, so no child ever holds the protocol pipes.
    """
    try:
        os.fstat(2)
    except OSError:  # started without a stderr (a Windows GUI host can do that): give it the null device
        err_fd = os.open(os.devnull, os.O_WRONLY)
        if err_fd != 2:
            os.dup2(err_fd, 2)
            os.close(err_fd)
    if sys.stderr is None:  # Python found no fd 2 at start either, and left sys.stderr unset
        sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115 (for life)
    protocol_in, protocol_out = os.dup(0), os.dup(1)
    null_fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null_fd, 0)
    os.close(null_fd)
    os.dup2(2, 1)
    return protocol_in, protocol_out


# Options after which the process does something else than serve the protocol; any other command line
# serves it (the host's settings are options too), so the guard runs first.
NOT_SERVING = ("--check", "--version", "--supervise", "--standby", "--offered", "--try", "--help", "-h",
               "--init-config")


def serves_protocol(argv: list[str]) -> bool:
    return not any(arg.split("=", 1)[0] in NOT_SERVING for arg in argv)
