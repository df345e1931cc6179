"""[both] Writes limited by the operating system for Hermes and everything it starts (Linux: Landlock; macOS:
Seatbelt through sandbox-exec, by review only): what this machine supports, and the step between the supervisor
and Hermes that confines the process that then becomes Hermes. Imports nothing of the package: the Linux step
runs before Hermes starts, in a process of its own."""
import ctypes
import os
import re
import sys

SANDBOX_MODES = ("auto", "required", "off")
SANDBOX_STEP = "claude_hermes_bridge.sandbox"  # `python -m`-like: confine, then exec Hermes

# Landlock's stable kernel ABI (include/uapi/linux/landlock.h): the system calls are the same on x86_64 and
# arm64, and no maintained Python binding covers the scopes of ABI 6, so a few lines of ctypes call it.
SYSCALLS = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446), "arm64": (444, 445, 446)}
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38
WRITE_FILE, REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR, MAKE_REG = 1 << 1, 1 << 4, 1 << 5, 1 << 6, 1 << 7, 1 << 8
MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM, REFER, TRUNCATE = 1 << 9, 1 << 10, 1 << 11, 1 << 12, 1 << 13, 1 << 14
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1
FILE_RIGHTS = WRITE_FILE | TRUNCATE  # the rights a rule on a file (not a folder) may carry
# What a shell, a pty of the job's own and Python's multiprocessing write to. /dev/pts holds the user's terminals
# too, and Landlock cannot grant a new pty without them (the peer of /dev/ptmx is opened under its path's rules, so
# Hermes' pty mode needs the folder); typing into another terminal (TIOCSTI, TIOCLINUX) is refused by seccomp.
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/ptmx",
           "/dev/pts", "/dev/shm")
# The user's session services, reached through sockets Landlock ABI 7 does not govern (connecting to a named
# socket is not a write): their addresses are not handed to a sandboxed job. This stops their use by accident
# (ssh to a remote with the user's keys, a desktop notification); it is not a barrier (docs/security.md).
SESSION_SERVICES = ("SSH_AUTH_SOCK", "DBUS_SESSION_BUS_ADDRESS", "TMUX", "TMUX_PANE", "DOCKER_HOST",
                    "GPG_AGENT_INFO", "WAYLAND_DISPLAY", "DISPLAY", "XAUTHORITY")


class RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


SANDBOX_EXEC = "/usr/bin/sandbox-exec"


class Mechanism:
    """What confines a job on this machine: its name in words (empty when none), why none, and whether it also
    keeps the job from signalling processes outside it. (A plain class: the step imports neither typing nor
    dataclasses, each a few milliseconds of every job's start.)"""

    def __init__(self, name: str, why_not: str, signals_scoped: bool):
        self.name, self.why_not, self.signals_scoped = name, why_not, signals_scoped


def mechanism() -> Mechanism:
    if sys.platform == "darwin":
        if os.path.exists(SANDBOX_EXEC):
            return Mechanism("Seatbelt, sandbox-exec", "", True)
        return Mechanism("", f"{SANDBOX_EXEC} is not on this Mac", False)
    if sys.platform == "win32":
        return Mechanism("", "Windows has no mechanism the bridge applies: a job object bounds Hermes' processes, "
                             "not the paths they write", False)
    abi, why_not = landlock_abi()
    return Mechanism(f"Landlock ABI {abi}" if abi else "", why_not, abi >= 6)


def libc() -> ctypes.CDLL:
    library = ctypes.CDLL(None, use_errno=True)
    library.syscall.restype = ctypes.c_long
    return library


def landlock_abi() -> tuple[int, str]:
    """The Landlock ABI this kernel offers (0 when none), and why not in words."""
    if not sys.platform.startswith("linux"):
        return 0, f"Landlock is Linux's; this is {sys.platform}"
    numbers = SYSCALLS.get(os.uname().machine)
    if numbers is None:
        return 0, f"Landlock's system calls are not known here for {os.uname().machine}"
    abi = libc().syscall(numbers[0], None, ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION))
    if abi < 1:
        error = ctypes.get_errno()
        return 0, ("the kernel has Landlock disabled (boot with lsm=...,landlock)" if error == 95
                   else f"this kernel has no Landlock (Linux 5.13 or later): {os.strerror(error)}")
    return int(abi), ""


def write_rights(abi: int) -> int:
    """Every right that writes, for this ABI (REFER from 2, TRUNCATE from 3); reading is not handled."""
    rights = (WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_CHAR | MAKE_DIR | MAKE_REG | MAKE_SOCK | MAKE_FIFO
              | MAKE_BLOCK | MAKE_SYM)
    return rights | (REFER if abi >= 2 else 0) | (TRUNCATE if abi >= 3 else 0)


def confine(writable: list[str]) -> int:
    """This process and every process it starts from now on may write only beneath `writable` (folders, or
    single files), may not signal a process outside them, nor reach an abstract Unix socket outside (ABI 6).
    Returns the ABI enforced; OSError when Landlock refuses."""
    abi, why_not = landlock_abi()
    if not abi:
        raise OSError(why_not)
    create, add_rule, restrict = SYSCALLS[os.uname().machine]
    call = libc().syscall
    handled = write_rights(abi)
    attr = RulesetAttr(handled, 0, SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0)
    size = ctypes.sizeof(RulesetAttr) if abi >= 6 else 8  # the fields this ABI knows
    ruleset = call(create, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}")
    try:
        for path in writable:
            descriptor = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                is_folder = os.path.isdir(f"/proc/self/fd/{descriptor}")
                rule = PathBeneathAttr(handled if is_folder else handled & FILE_RIGHTS, descriptor)
                if call(add_rule, ruleset, RULE_PATH_BENEATH, ctypes.byref(rule), ctypes.c_uint32(0)) < 0:
                    error = ctypes.get_errno()
                    raise OSError(error, f"landlock_add_rule {path}: {os.strerror(error)}")
            finally:
                os.close(descriptor)
        if libc().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if call(restrict, ruleset, ctypes.c_uint32(0)) < 0:
            error = ctypes.get_errno()
            raise OSError(error, f"landlock_restrict_self: {os.strerror(error)}")
    finally:
        os.close(ruleset)
    refuse_typing_into_terminals()
    return abi


# A seccomp filter (classic BPF, the kernel's stable ABI; no maintained binding is in the standard library): the
# ioctls that type into a terminal (TIOCSTI) or paste a selection (TIOCLINUX) fail with EPERM, whatever terminal.
SECCOMP_ARCHES = {"x86_64": (0xC000003E, 16), "aarch64": (0xC00000B7, 29), "arm64": (0xC00000B7, 29)}
TIOCSTI, TIOCLINUX = 0x5412, 0x541C
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
BPF_LD_W_ABS, BPF_JEQ_K, BPF_RET_K = 0x20, 0x15, 0x06
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO_EPERM = 0x7FFF0000, 0x00050000 | 1


class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(SockFilter))]


def refuse_typing_into_terminals() -> None:
    """Install the filter on this process and all it starts (no_new_privs is already set). OSError if refused."""
    arch, ioctl = SECCOMP_ARCHES[os.uname().machine]
    program = [(BPF_LD_W_ABS, 0, 0, 4), (BPF_JEQ_K, 0, 5, arch),  # another architecture's calls: allowed
               (BPF_LD_W_ABS, 0, 0, 0), (BPF_JEQ_K, 0, 3, ioctl),
               (BPF_LD_W_ABS, 0, 0, 24),  # the ioctl's request (an unsigned int: the low word of args[1])
               (BPF_JEQ_K, 2, 0, TIOCSTI), (BPF_JEQ_K, 1, 0, TIOCLINUX),
               (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW), (BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO_EPERM)]
    filters = (SockFilter * len(program))(*(SockFilter(*instruction) for instruction in program))
    fprog = SockFprog(len(program), filters)
    if libc().prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"seccomp filter refused: {os.strerror(ctypes.get_errno())}")


def step_argv(writable: list[str], argv: list[str]) -> list[str]:
    """The command that confines itself to `writable`, then becomes argv (same process, same pid, same
    environment). Linux: `python -I -S -B` spends no time on site packages and writes no bytecode beside the
    package (compiling this module costs less than reading the per-user cache, which -X pycache_prefix would
    extend to every standard module). macOS: sandbox-exec with the profile made from the same list."""
    if sys.platform == "darwin":
        return [SANDBOX_EXEC, "-p", seatbelt_profile(writable), *argv]
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    boot = (f"import sys; sys.path.insert(0, sys.argv.pop(1)); from {SANDBOX_STEP} import step; step()")
    return [sys.executable, "-I", "-S", "-B", "-c", boot, package_parent, *writable, "--", *argv]


def seatbelt_profile(writable: list[str]) -> str:
    """A Seatbelt profile with the Landlock rules' meaning: everything allowed but writing, which is allowed
    beneath each writable folder (or to each file), and signalling, allowed within the sandbox only. Paths are
    resolved (/tmp is /private/tmp to Seatbelt) and quoted as Scheme strings."""
    def quoted(path: str) -> str:
        return '"' + os.path.realpath(path).replace("\\", "\\\\").replace('"', '\\"') + '"'
    rules = [f"(subpath {quoted(path)})" if os.path.isdir(path) else f"(literal {quoted(path)})" for path in writable]
    return "\n".join(["(version 1)", "(allow default)", "(deny file-write*)",
                      f"(allow file-write* {' '.join(rules)})", "(deny signal (target others))"]) + "\n"


def step() -> None:
    """The program step_argv runs: confine, then exec Hermes; if Landlock refuses, Hermes is not started."""
    separator = sys.argv.index("--")  # writable paths are absolute: none is "--"
    writable, argv = sys.argv[1:separator], sys.argv[separator + 1:]
    try:
        confine(writable)
    except OSError as exc:
        sys.stderr.write(f"[bridge] the sandbox could not be applied ({exc}); Hermes was not started\n")
        sys.exit(126)
    os.execv(argv[0], argv)


def devices() -> list[str]:
    return [path for path in DEVICES if os.path.exists(path)]


def support_line(mode: str) -> str:
    """What a job gets here under this setting, for hermes_health and --check."""
    if mode == "off":
        return "off (setting sandbox: off): a job writes wherever your account can"
    found = mechanism()
    if found.name:
        scoped = "; it cannot signal processes outside it" if found.signals_scoped else ""
        return (f"on ({found.name}): a job writes only in its folder, its private temporary folder, Hermes' home "
                f"(its settings put back at the end) and sandbox_writable{scoped}")
    refused = ("every job is refused (sandbox: required)" if mode == "required"
               else "jobs run unconfined (sandbox: auto)")
    return f"not available here ({found.why_not}): {refused}"


# What the sandbox refused, as the job's tools said it: Landlock's own audit records need privileges, while every
# tool names the path it could not write next to the system's words for EACCES or EPERM.
REFUSAL_RE = re.compile(r"permission denied|eacces|operation not permitted", re.IGNORECASE)
PATH_IN_TEXT_RE = re.compile(r"(?<![\w.~/-])(/[^\s'\"`:,;()\[\]{}<>|\\]+)")


def refused_paths(texts: list[str], writable: list[str], limit: int) -> list[str]:
    """On each line that reports a refusal, the absolute path named nearest to its words (`sh: script: 2: cannot
    create X: Permission denied`, `EACCES: permission denied, mkdir 'X'`), outside every writable path, each once,
    in the order met (at most limit)."""
    allowed = [os.path.normpath(path) for path in writable]
    found: list[str] = []
    for text in texts:
        for line in text.replace("\\n", "\n").splitlines():
            refusal = REFUSAL_RE.search(line)
            paths = list(PATH_IN_TEXT_RE.finditer(line)) if refusal else []
            if not refusal or not paths:
                continue
            nearest = min(paths, key=lambda match: min(abs(match.end() - refusal.start()),
                                                       abs(match.start() - refusal.end())))
            path = os.path.normpath(nearest.group(1).rstrip("."))
            if path in found or any(path == root or path.startswith(root.rstrip("/") + "/") for root in allowed):
                continue
            found.append(path)
            if len(found) >= limit:
                return found
    return found


# /dev/shm is one folder for every job and the user: what a job leaves there (a named semaphore or segment) would
# outlive it. At its end the bridge removes what appeared there during the job and no process still holds.
SHARED_MEMORY = "/dev/shm"
SHARED_MEMORY_ENTRIES = 10000


def shared_memory_listing() -> dict[str, int]:
    """The entries of /dev/shm now, name -> inode (empty when there is none; bounded)."""
    found: dict[str, int] = {}
    try:
        with os.scandir(SHARED_MEMORY) as listing:
            for entry in listing:
                found[entry.name] = entry.inode()
                if len(found) >= SHARED_MEMORY_ENTRIES:
                    break
    except OSError:
        pass
    return found


def held_paths(paths: set[str]) -> set[str]:
    """Those of paths some live process has open or mapped (its descriptors and its memory map, read from
    /proc for the processes this user can see)."""
    held: set[str] = set()
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return set(paths)  # cannot tell: everything counts as held, nothing is removed
    for pid in pids:
        try:
            for descriptor in os.listdir(f"/proc/{pid}/fd"):
                with_link = os.readlink(f"/proc/{pid}/fd/{descriptor}").removesuffix(" (deleted)")
                if with_link in paths:
                    held.add(with_link)
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps:
                for line in maps:
                    mapped = line.rstrip("\n").partition("/")[2]
                    if mapped and "/" + mapped in paths:
                        held.add("/" + mapped)
        except OSError:
            continue
    return held


def left_in_shared_memory(before: dict[str, int], since: float) -> list[str]:
    """What appeared in /dev/shm since `before` was listed (at `since`) and no process holds, removed now; their
    names."""
    candidates = set()
    for name, inode in shared_memory_listing().items():
        path = os.path.join(SHARED_MEMORY, name)
        try:
            status = os.lstat(path)
        except OSError:
            continue
        if before.get(name) != inode and status.st_ctime >= since and status.st_uid == os.getuid():
            candidates.add(path)
    removed = []
    for path in sorted(candidates - held_paths(candidates)):
        try:
            os.unlink(path)
            removed.append(os.path.basename(path))
        except OSError:
            continue
    return removed
