"""Test-only: run a command where no mount namespace can be made, as on a distribution that restricts user
namespaces (Ubuntu 24.04 by default): a seccomp filter answers every unshare() with EPERM, for the command and
all it starts. `python without_namespaces.py PROGRAM ARGS...` (Linux, x86_64 or aarch64)."""
import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from claude_hermes_bridge.sandbox import (  # noqa: E402
    BPF_JEQ_K,
    BPF_LD_W_ABS,
    BPF_RET_K,
    NR,
    PR_SET_NO_NEW_PRIVS,
    PR_SET_SECCOMP,
    SECCOMP_MODE_FILTER,
    SECCOMP_RET_ALLOW,
    SECCOMP_RET_ERRNO_EPERM,
    SockFilter,
    SockFprog,
    libc,
)

UNSHARE = {"x86_64": 272, "aarch64": 97}


def refuse_unshare() -> None:
    program = [(BPF_LD_W_ABS, 0, 0, NR), (BPF_JEQ_K, 0, 1, UNSHARE[os.uname().machine]),
               (BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO_EPERM), (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW)]
    filters = (SockFilter * len(program))(*(SockFilter(*instruction) for instruction in program))
    if libc().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or libc().prctl(
            PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(SockFprog(len(program), filters)), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "the seccomp filter was refused")


if __name__ == "__main__":
    refuse_unshare()
    os.execv(sys.argv[1], sys.argv[1:])
