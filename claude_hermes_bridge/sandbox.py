"""[both] Writes limited by the operating system for Hermes and everything it starts (Linux: Landlock; macOS:
Seatbelt through sandbox-exec, by review only): what this machine supports, and the step between the supervisor
and Hermes that confines the process that then becomes Hermes. Imports nothing of the package: the Linux step
runs before Hermes starts, in a process of its own."""
import ctypes
import functools
import os
import re
import sys

SANDBOX_MODES = ("auto", "required", "off")
SANDBOX_STEP = "claude_hermes_bridge.sandbox"  # `python -m`-like: confine, then exec Hermes

# Landlock's stable kernel ABI (include/uapi/linux/landlock.h): the system calls are the same on x86_64 and
# arm64, and no maintained Python binding covers the scopes of ABI 6, so a few lines of ctypes call it.
SYSCALLS = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446), "arm64": (444, 445, 446)}
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH, RULE_NET_PORT = 1, 2
BIND_TCP, CONNECT_TCP = 1 << 0, 1 << 1  # handled_access_net, from ABI 4
NETWORK_ABI = 4
PR_SET_NO_NEW_PRIVS = 38
READ_FILE = 1 << 2
WRITE_FILE, REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR, MAKE_REG = 1 << 1, 1 << 4, 1 << 5, 1 << 6, 1 << 7, 1 << 8
MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM, REFER, TRUNCATE = 1 << 9, 1 << 10, 1 << 11, 1 << 12, 1 << 13, 1 << 14
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1
FILE_RIGHTS = WRITE_FILE | TRUNCATE | READ_FILE  # the rights a rule on a file (not a folder) may carry
# Root's capabilities a sandboxed job keeps: file work in folders it owns (tar and npm as root set owners and modes).
# The bounding set loses the rest before Hermes is started, so they are gone after its exec: those that reach past
# Landlock (modules, raw I/O, mounts, raw sockets, the firewall) and CAP_SYS_ADMIN with CAP_PERFMON, either of which
# lets root read another process's /proc/<pid>/environ, which Landlock's ptrace scope refuses everyone else (Linux
# 6.18, measured).
PR_CAPBSET_READ, PR_CAPBSET_DROP, LAST_CAPABILITY, CAPABILITY_VERSION_3 = 23, 24, 63, 0x20080522
# DAC_READ_SEARCH (2) is not kept: DAC_OVERRIDE reads as well, and it alone opens a file by its handle
# (open_by_handle_at), which reaches beneath a mount that covers it (late_binding's covers).
ROOT_KEEPS = frozenset({0, 1, 3, 4, 5, 6, 7, 10})  # CHOWN, DAC_OVERRIDE, FOWNER .. SETUID, NET_BIND_SERVICE
# What a shell, a pty of the job's own and Python's multiprocessing write to. Landlock cannot grant a new pty
# without /dev/pts (the peer of /dev/ptmx is opened under its path's rules, so Hermes' pty mode needs the folder):
# the step gives the job a /dev/pts and a /dev/shm of its own first (private_devices), and where it cannot, typing
# into another terminal (TIOCSTI, TIOCLINUX) is still refused by seccomp.
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


class NetPortAttr(ctypes.Structure):
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


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


@functools.cache  # one handle per process: hermes_health asks on every call
def libc() -> ctypes.CDLL:
    library = ctypes.CDLL(None, use_errno=True)
    library.syscall.restype = ctypes.c_long
    return library


@functools.cache
def landlock_abi() -> tuple[int, str]:
    """The Landlock ABI this kernel offers (0 when none), and why not in words: asked once per process (the
    kernel does not change under it)."""
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


def confine(writable: list[str], readable: list[str] | None = None, connect_port: int | None = None,
            also_ports: tuple[int, ...] = ()) -> int:
    """This process and every process it starts from now on may write only beneath `writable` (folders, or
    single files), may not signal a process outside them, nor reach an abstract Unix socket outside (ABI 6);
    given `readable`, it may read files only beneath those and `writable` (listing folders stays allowed); given
    `connect_port`, it may open TCP connections to that port only (and also_ports: an ssh executor's), bind none
    (ABI 4), and make no socket but Unix and TCP ones (seccomp); run as root, the program it becomes keeps only
    ROOT_KEEPS of root's capabilities. Returns the ABI enforced; OSError when Landlock refuses."""
    ruleset, abi = landlock_ruleset(writable, readable, connect_port, also_ports)
    enter_ruleset(ruleset, connect_port is not None)
    return abi


def landlock_ruleset(writable: list[str], readable: list[str] | None = None, connect_port: int | None = None,
                     also_ports: tuple[int, ...] = ()) -> tuple[int, int]:
    """confine's rules, made but not yet applied (enter_ruleset applies them): each rule holds the folder or file
    its path names now, whatever is mounted there later. The ruleset's descriptor and the ABI."""
    abi, why_not = landlock_abi()
    if not abi:
        raise OSError(why_not)
    if connect_port is not None and abi < NETWORK_ABI:
        raise OSError(f"Landlock ABI {abi} here cannot limit the network (ABI {NETWORK_ABI}, Linux 6.7, can)")
    create, add_rule, _ = SYSCALLS[os.uname().machine]
    call = libc().syscall
    handled = handled_rights(readable is not None)
    network = BIND_TCP | CONNECT_TCP if connect_port is not None else 0
    attr = RulesetAttr(handled, network, SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0)
    size = 24 if abi >= 6 else 16 if abi >= NETWORK_ABI else 8  # the fields this ABI knows
    ruleset = call(create, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}")
    try:
        add_path_rules(ruleset, writable, handled)
        add_path_rules(ruleset, readable or [], READ_FILE)
        for port in (connect_port, *also_ports) if connect_port is not None else ():
            port_rule = NetPortAttr(CONNECT_TCP, port)
            if call(add_rule, ruleset, RULE_NET_PORT, ctypes.byref(port_rule), ctypes.c_uint32(0)) < 0:
                error = ctypes.get_errno()
                raise OSError(error, f"landlock_add_rule port {port}: {os.strerror(error)}")
    except OSError:
        os.close(ruleset)
        raise
    return ruleset, abi


def handled_rights(readable: bool) -> int:
    """What a ruleset of landlock_ruleset governs of files here: writing, and reading when it is given reads."""
    return write_rights(landlock_abi()[0]) | (READ_FILE if readable else 0)


def add_path_rules(ruleset: int, paths: list[str], rights: int) -> None:
    """A rule for each path that exists now (a file's rule carries a file's rights alone); a path to write that
    cannot be opened is an error, a path to read that is gone or out of this user's reach (a link into a folder it
    cannot enter) is nothing it could read."""
    add_rule = SYSCALLS[os.uname().machine][1]
    for path in paths:
        try:
            descriptor = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            if rights == READ_FILE:
                continue
            raise
        try:
            is_folder = os.path.isdir(f"/proc/self/fd/{descriptor}")
            rule = PathBeneathAttr(rights if is_folder else rights & FILE_RIGHTS, descriptor)
            if libc().syscall(add_rule, ruleset, RULE_PATH_BENEATH, ctypes.byref(rule), ctypes.c_uint32(0)) < 0:
                error = ctypes.get_errno()
                raise OSError(error, f"landlock_add_rule {path}: {os.strerror(error)}")
        finally:
            os.close(descriptor)


def enter_ruleset(ruleset: int, limit_network: bool) -> None:
    """Apply a ruleset (landlock_ruleset) to this process and all it starts, then the seccomp filter, and drop
    root's capabilities but ROOT_KEEPS from what it starts; the descriptor is closed. OSError when refused."""
    call = libc().syscall
    try:
        if libc().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if call(SYSCALLS[os.uname().machine][2], ruleset, ctypes.c_uint32(0)) < 0:
            error = ctypes.get_errno()
            raise OSError(error, f"landlock_restrict_self: {os.strerror(error)}")
    finally:
        os.close(ruleset)
    install_seccomp(limit_network=limit_network)
    drop_root_capabilities()


def drop_root_capabilities() -> None:
    """Root's capabilities but ROOT_KEEPS out of the bounding set, so the program this process becomes has none
    of them, and out of this process's own (a late-bound Hermes runs on in it, with no exec between). Nothing to
    do for a user, whose capabilities end at exec."""
    if os.geteuid() != 0:
        return
    for capability in range(LAST_CAPABILITY + 1):  # first: dropping one needs CAP_SETPCAP, which capset drops
        held = libc().prctl(PR_CAPBSET_READ, capability, 0, 0, 0)
        if held < 0:  # past this kernel's last capability
            break
        if held and capability not in ROOT_KEEPS and libc().prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"prctl(PR_CAPBSET_DROP, {capability}) failed")
    keep = sum(1 << capability for capability in ROOT_KEEPS)
    header = (ctypes.c_uint32 * 2)(CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)(keep, keep, 0, 0, 0, 0)  # effective, permitted, inheritable; then the high words
    if libc().capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), f"capset: {os.strerror(ctypes.get_errno())}")


# A seccomp filter (classic BPF, the kernel's stable ABI; no maintained binding is in the standard library): the
# ioctls that type into a terminal (TIOCSTI) or paste a selection (TIOCLINUX) fail with EPERM, whatever terminal,
# and so does every call of another ABI (i386's int 0x80 and x32 would pass a filter keyed on x86_64's numbers).
# With the network limited: no socket but Unix and TCP (no UDP, raw, packet, netlink, SCTP: Landlock's port rules
# govern TCP only) and no io_uring (its operations pass no system call a filter sees).
SECCOMP_ARCHES = {"x86_64": (0xC000003E, 16, 41), "aarch64": (0xC00000B7, 29, 198), "arm64": (0xC00000B7, 29, 198)}
X32_BIT = 0x40000000
IO_URING_CALLS = (425, 426, 427)  # io_uring_setup, _enter, _register: one number on every architecture
TIOCSTI, TIOCLINUX = 0x5412, 0x541C
AF_UNIX, AF_INET, AF_INET6, SOCK_STREAM, SOCK_TYPE_MASK, IPPROTO_TCP = 1, 2, 10, 1, 0xF, 6
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JGE_K, BPF_AND_K, BPF_RET_K = 0x20, 0x15, 0x35, 0x54, 0x06
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO_EPERM = 0x7FFF0000, 0x00050000 | 1
NR, ARCH, ARG0, ARG1, ARG2 = 0, 4, 16, 24, 32  # offsets in struct seccomp_data (an argument's low word)


class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(SockFilter))]


def seccomp_program(machine: str, limit_network: bool) -> list[tuple[int, int, int, int]]:
    """The filter's instructions. Written with labels (a jump names the label it goes to, "" to fall through),
    resolved to BPF's relative offsets at the end."""
    arch, ioctl, socket_call = SECCOMP_ARCHES[machine]
    code: list[tuple[str, int, str, str, int]] = [  # (label, opcode, jump if true, jump if false, operand)
        ("", BPF_LD_W_ABS, "", "", ARCH), ("", BPF_JEQ_K, "", "deny", arch), ("", BPF_LD_W_ABS, "", "", NR)]
    if machine == "x86_64":
        code.append(("", BPF_JGE_K, "deny", "", X32_BIT))
    code.append(("", BPF_JEQ_K, "ioctl", "", ioctl))
    if limit_network:
        code.append(("", BPF_JEQ_K, "socket", "", socket_call))
        code += [("", BPF_JEQ_K, "deny", "", number) for number in IO_URING_CALLS]
    code += [("", BPF_RET_K, "", "", SECCOMP_RET_ALLOW),
             ("ioctl", BPF_LD_W_ABS, "", "", ARG1), ("", BPF_JEQ_K, "deny", "", TIOCSTI),
             ("", BPF_JEQ_K, "deny", "allow", TIOCLINUX)]
    if limit_network:
        code += [("socket", BPF_LD_W_ABS, "", "", ARG0), ("", BPF_JEQ_K, "allow", "", AF_UNIX),
                 ("", BPF_JEQ_K, "inet", "", AF_INET), ("", BPF_JEQ_K, "inet", "deny", AF_INET6),
                 ("inet", BPF_LD_W_ABS, "", "", ARG1), ("", BPF_AND_K, "", "", SOCK_TYPE_MASK),
                 ("", BPF_JEQ_K, "", "deny", SOCK_STREAM), ("", BPF_LD_W_ABS, "", "", ARG2),
                 ("", BPF_JEQ_K, "allow", "", 0), ("", BPF_JEQ_K, "allow", "deny", IPPROTO_TCP)]
    code += [("allow", BPF_RET_K, "", "", SECCOMP_RET_ALLOW), ("deny", BPF_RET_K, "", "", SECCOMP_RET_ERRNO_EPERM)]
    where = {label: index for index, (label, *_) in enumerate(code) if label}

    def offset(index: int, label: str) -> int:
        return where[label] - index - 1 if label else 0
    return [(opcode, offset(index, true), offset(index, false), operand)
            for index, (_, opcode, true, false, operand) in enumerate(code)]


def install_seccomp(limit_network: bool) -> None:
    """Install the filter on this process and all it starts (no_new_privs is already set). OSError if refused."""
    program = seccomp_program(os.uname().machine, limit_network)
    filters = (SockFilter * len(program))(*(SockFilter(*instruction) for instruction in program))
    fprog = SockFprog(len(program), filters)
    if libc().prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"seccomp filter refused: {os.strerror(ctypes.get_errno())}")


UNREADABLE_MARK = "--unreadable"  # between the writable and the unreadable paths of the step's command
CONNECT_MARK = "--connect"  # before the writable paths: the one TCP port the job may connect to


def step_argv(writable: list[str], argv: list[str], unreadable: list[str] | None = None,
              connect_port: int | None = None, mounts: list[str] | None = None,
              also_ports: tuple[int, ...] = (), own_network: int | None = None) -> list[str]:
    """The command that confines itself to `writable` (and, given `unreadable`, reading to everything else: see
    read_grants, listed by the step itself right before it confines; given `connect_port`, the network to that
    port; given `mounts`, those made in its mount namespace: see private_devices), then becomes argv (same process,
    same pid, same environment). Linux: `python -I -S -B` spends no time
    on site packages and writes no bytecode beside the package (compiling this module costs less than reading
    the per-user cache, which -X pycache_prefix would extend to every standard module). macOS: sandbox-exec with
    the profile made from the same lists. also_ports: more ports it may connect to (an ssh executor's).
    own_network (Linux, with connect_port): the descriptor to send the proxy's listener on, from a network
    namespace of the job's own (hand_listener); start_hermes passes it on (handed_descriptors)."""
    if sys.platform == "darwin":
        return [SANDBOX_EXEC, "-p", seatbelt_profile(writable, unreadable or [], connect_port, also_ports), *argv]
    network = [word for port in (connect_port, *also_ports) for word in (CONNECT_MARK, str(port))] \
        if connect_port is not None else []
    mounting = [word for spec in mounts or [] for word in (MOUNT_MARK, spec)]
    reading = [UNREADABLE_MARK, *unreadable] if unreadable is not None else []
    namespace = [NAMESPACE_MARK, str(own_network)] if own_network is not None and connect_port is not None else []
    return [*this_module_calling("step"), *network, *namespace, *mounting, *writable, *reading, "--", *argv]


def handed_descriptors(argv: list[str]) -> tuple[int, ...]:
    """The descriptors a step command (step_argv) is handed: its own_network channel, if any."""
    step = this_module_calling("step")
    if argv[:len(step)] != step or "--" not in argv:
        return ()
    given = argv[len(step):argv.index("--")]
    return tuple(int(given[index + 1]) for index, word in enumerate(given[:-1]) if word == NAMESPACE_MARK)


def this_module_calling(function: str) -> list[str]:
    """A Python that imports this module alone and calls one of its functions of no argument."""
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    boot = f"import sys; sys.path.insert(0, sys.argv.pop(1)); from {SANDBOX_STEP} import {function}; {function}()"
    return [sys.executable, "-I", "-S", "-B", "-c", boot, package_parent]


def seatbelt_profile(writable: list[str], unreadable: list[str] | None = None, connect_port: int | None = None,
                     also_ports: tuple[int, ...] = ()) -> str:
    """A Seatbelt profile with the Landlock rules' meaning: everything allowed but writing, which is allowed
    beneath each writable folder (or to each file), reading the unreadable paths, signalling, allowed within
    the sandbox only, and given connect_port, the network but Unix sockets and the proxy's port on this machine.
    Paths are resolved (/tmp is /private/tmp to Seatbelt) and quoted as Scheme strings."""
    def quoted(path: str) -> str:
        return '"' + os.path.realpath(path).replace("\\", "\\\\").replace('"', '\\"') + '"'

    def rules(paths: list[str]) -> str:
        return " ".join(f"(subpath {quoted(path)})" if os.path.isdir(path) else f"(literal {quoted(path)})"
                        for path in paths)
    hidden = ([f"(deny file-read-data {' '.join(f'(subpath {quoted(path)})' for path in unreadable)})"]
              if unreadable else [])  # a subpath holds the path itself too, and what is made there later
    network = ["(deny network*)", f'(allow network-outbound (remote ip "localhost:{connect_port}"))',
               *(f'(allow network-outbound (remote ip "*:{port}"))' for port in also_ports),
               "(allow network-outbound (remote unix-socket))"] if connect_port is not None else []
    return "\n".join(["(version 1)", "(allow default)", "(deny file-write*)", f"(allow file-write* {rules(writable)})",
                      *hidden, "(deny signal (target others))", *network]) + "\n"


# A mount namespace of the job's own (Linux's stable ABI through libc; the standard library has no unshare or
# mount): a new devpts instance over /dev/pts, which /dev/ptmx then opens its ptys in (Linux 4.7 and later), so the
# user's terminals are not there to write to; a tmpfs over /dev/shm, gone when the job's last process is; and the
# job's mounts (Mount): what must not change bound read-only over itself (a repository's git folder, Hermes'
# install), what it must still write bound again writable beneath, and the daemons' sockets hidden under
# /dev/null. Root makes the namespace itself; a user makes it in a user namespace of its own that maps only its
# own ids. Made before Landlock applies, the job cannot undo them: a thread Landlock restricts may not mount.
# Under a limited network the namespace has a network of its own too (own_network): only a loopback, where the
# job's proxy listens (hand_listener), so a port the job gets by listen() without bind() is reachable from
# nowhere else, and nothing but the proxy leads out.
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND = 1, 2, 4, 8, 32, 4096
MS_REC, MS_PRIVATE = 0x4000, 1 << 18
# statvfs's flags that a user namespace locks on a mount (a remount must repeat them), as mount(2)'s flags
LOCKED_FLAGS = {2: MS_NOSUID, 4: MS_NODEV, 8: MS_NOEXEC, 1024: 1024, 2048: 2048, 4096: 1 << 21}
PRIVATE_MOUNTS = ((b"devpts", b"/dev/pts", MS_NOSUID | MS_NOEXEC, b"newinstance,ptmxmode=0666,mode=0620"),
                  (b"tmpfs", b"/dev/shm", MS_NOSUID | MS_NODEV, b"mode=1777"))
MOUNT_MARK = "--mount"  # before one "ro:PATH", "rw:PATH" or "hide:PATH" of the step's command, in order
MOUNT_KINDS = ("ro", "rw", "hide")
NAMESPACE_MARK = "--own-network"  # before the descriptor the step sends its proxy's listener on (hand_listener)
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP, IFREQ = 0x8913, 0x8914, 1, "16sH22x"  # struct ifreq: a name, then its flags


def private_devices(mounts: tuple[str, ...] = (), own_network: bool = False) -> None:
    """Give this process (and all it starts) a /dev/pts and a /dev/shm of its own, and make its mounts ("ro:PATH"
    read-only, "rw:PATH" writable again beneath one, "hide:PATH" /dev/null over a socket), in order, and given
    own_network, a network of its own with only its loopback up; OSError naming the step that failed. A user
    tries first in a child: a user namespace left without its ids would make every file the job writes fail, so
    this process enters one only where the child's whole attempt succeeded."""
    user = os.geteuid() != 0
    if user:
        reading, writing = os.pipe()
        child = os.fork()
        if child == 0:
            try:
                enter_private_devices(user, mounts, own_network)
            except OSError as exc:
                os.write(writing, str(exc).encode())
                os._exit(1)
            os._exit(0)
        os.close(writing)
        failure = os.read(reading, 4096).decode(errors="replace")
        os.close(reading)
        if os.waitpid(child, 0)[1] != 0:
            raise OSError(failure or "the attempt in a child failed")
    enter_private_devices(user, mounts, own_network)


REFUSALS_FOUND: dict[str, str] = {}  # private_devices_refusal's answer, once per process


def private_devices_refusal() -> str:
    """Why a job here shares the user's /dev/pts and /dev/shm and gets no read-only mounts ("" when it has its
    own), tried as the step does, in a process of its own: once per process (hermes_health starts no process
    after its first call)."""
    import subprocess

    if "found" not in REFUSALS_FOUND:
        tried = subprocess.run(this_module_calling("private_devices_with_network"), capture_output=True, timeout=30)
        REFUSALS_FOUND["found"] = ("" if tried.returncode == 0 else
                                   tried.stderr.decode(errors="replace").strip().splitlines()[-1])
    return REFUSALS_FOUND["found"]


def private_devices_with_network() -> None:
    """What private_devices_refusal tries: the namespaces a job under a limited network gets."""
    private_devices(own_network=True)


def enter_private_devices(user: bool, mounts: tuple[str, ...], own_network: bool) -> None:
    call = libc()
    ids = os.getuid(), os.getgid()
    if call.unshare(CLONE_NEWNS | (CLONE_NEWUSER if user else 0) | (CLONE_NEWNET if own_network else 0)) != 0:
        raise OSError(ctypes.get_errno(), f"unshare: {os.strerror(ctypes.get_errno())}")
    if user:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{ids[0]} {ids[0]} 1"),
                           ("gid_map", f"{ids[1]} {ids[1]} 1")):
            with open(f"/proc/self/{name}", "w") as written:
                written.write(text)
    # the namespace's mounts private first: a mount made after would otherwise reach the user's namespace too
    for kind, target, flags, options in ((None, b"/", MS_REC | MS_PRIVATE, None), *PRIVATE_MOUNTS):
        if call.mount(kind, target, kind, ctypes.c_ulong(flags), options) != 0:
            raise OSError(ctypes.get_errno(), f"mount {target.decode()}: {os.strerror(ctypes.get_errno())}")
    make_mounts(call, mounts)
    if own_network:
        loopback_up()


def make_mounts(call: ctypes.CDLL, mounts: tuple[str, ...]) -> None:
    """The job's mounts ("ro:PATH", "rw:PATH", "hide:PATH"), in order, in this process's mount namespace."""
    for spec in mounts:
        how, _, path = spec.partition(":")
        if os.path.lexists(path):  # nothing there: nothing to keep
            bind(call, "/dev/null" if how == "hide" else path, path, read_only=how != "rw")


def loopback_up() -> None:
    """A new network namespace's loopback starts down (ioctl: the standard library has no netlink client)."""
    import fcntl
    import socket
    import struct

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as control:
            flags = struct.unpack(IFREQ, fcntl.ioctl(control, SIOCGIFFLAGS, struct.pack(IFREQ, b"lo", 0)))[1]
            fcntl.ioctl(control, SIOCSIFFLAGS, struct.pack(IFREQ, b"lo", flags | IFF_UP))
    except OSError as exc:
        raise OSError(exc.errno, f"loopback up: {exc.strerror}") from None


def hand_listener(channel: int, port: int | None) -> None:
    """The job's way to its proxy: a socket listening on 127.0.0.1:port inside its network namespace, sent over
    channel to the supervisor, whose proxy accepts there (network.JobProxy.namespace_channel); port None (no
    namespace was made) sends nothing. The channel is closed either way, before Hermes starts."""
    import socket

    with socket.socket(fileno=channel) as handoff:
        if port is None:
            return
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", port))
            listener.listen(64)
            socket.send_fds(handoff, [b"listening"], [listener.fileno()])


def bind(call: ctypes.CDLL, source: str, target: str, read_only: bool) -> None:
    """source bound over target, read-only or writable, keeping the flags the namespace locks on target's mount."""
    if call.mount(source.encode(), target.encode(), None, ctypes.c_ulong(MS_BIND), None) != 0:
        raise OSError(ctypes.get_errno(), f"bind {target}: {os.strerror(ctypes.get_errno())}")
    status = os.statvfs(target).f_flag
    locked = sum(flag for bit, flag in LOCKED_FLAGS.items() if status & bit)
    flags = MS_REMOUNT | MS_BIND | locked | (MS_RDONLY if read_only else 0)
    if call.mount(None, target.encode(), None, ctypes.c_ulong(flags), None) != 0:
        raise OSError(ctypes.get_errno(), f"remount {target}: {os.strerror(ctypes.get_errno())}")


def step() -> None:
    """The program step_argv runs: confine, then exec Hermes; if Landlock refuses, Hermes is not started."""
    separator = sys.argv.index("--")  # writable paths are absolute: none is a mark
    given, argv = sys.argv[1:separator], sys.argv[separator + 1:]
    ports: list[int] = []
    mounts, writable, unreadable, channel = [], [], None, None
    index = 0
    while index < len(given):
        token = given[index]
        if token == CONNECT_MARK:
            ports.append(int(given[index + 1]))
            index += 2
        elif token == MOUNT_MARK:
            mounts.append(given[index + 1])
            index += 2
        elif token == NAMESPACE_MARK:
            channel = int(given[index + 1])
            index += 2
        elif token == UNREADABLE_MARK:
            unreadable, index = given[index + 1:], len(given)
        else:
            writable.append(token)
            index += 1
    own_network = False
    try:
        private_devices(tuple(mounts), channel is not None)
        own_network = channel is not None
    except OSError as exc:
        sys.stderr.write(f"[bridge] this job shares your /dev/pts and /dev/shm and has no read-only mounts (a mount "
                         f"namespace of its own could not be made: {exc}); typing into your terminals stays refused, "
                         "and its repository's git folder is guarded and put back instead\n")
    try:
        if channel is not None:
            hand_listener(channel, ports[0] if own_network else None)
    except OSError as exc:
        sys.stderr.write(f"[bridge] the job's network has no way to its proxy ({exc}); Hermes was not started\n")
        sys.exit(126)
    try:
        confine(writable, read_grants(unreadable) if unreadable is not None else None, ports[0] if ports else None,
                tuple(ports[1:]))
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
        if found.name.startswith("Landlock"):
            refusal = private_devices_refusal()
            scoped += ("; its /dev/pts and /dev/shm are its own" if not refusal else
                       f"; it shares your /dev/pts and /dev/shm (no mount namespace of its own here: {refusal})")
        return (f"on ({found.name}): a job writes only in its folder, its private temporary folder, Hermes' home "
                f"(its settings put back at the end) and sandbox_writable{scoped}")
    refused = ("every job is refused (sandbox: required)" if mode == "required"
               else "jobs run unconfined (sandbox: auto)")
    return f"not available here ({found.why_not}): {refused}"


# What the sandbox refused, as the job's tools said it: Landlock's own audit records need privileges, while every
# tool names the path it could not write next to the system's words for EACCES or EPERM.
REFUSAL_RE = re.compile(r"permission denied|eacces|operation not permitted|read-only file system|erofs",
                        re.IGNORECASE)
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


# What a sandboxed job may read in the user's home (Landlock's read rules are allow-only, which fits): the
# toolchains' public configuration and installs, relative to the home; everything else there, known or not (keys,
# hosts' logins, other servers' MCP configs, registries' tokens), is unreadable. The job's own folders, Hermes' home
# and install, the Python it runs on and sandbox_readable are added per job (drivers.readable_paths); so is every
# folder outside the private ones (PRIVATE_FOLDERS): the system stays readable.
READABLE_IN_HOME = (
    ".gitconfig", ".config/git/config", ".config/git/ignore", ".config/git/attributes",  # git's (no credentials)
    ".bashrc", ".bash_profile", ".profile", ".zshrc", ".zprofile", ".inputrc", ".editorconfig", ".vimrc",  # shells
    ".local/bin", ".local/lib", ".local/share/uv/python", ".local/share/uv/tools",  # pip --user, uv's Pythons
    ".pyenv", ".rustup", ".cargo/bin", ".nvm", ".volta", ".bun/bin", ".deno/bin", ".asdf", ".rbenv", ".sdkman",
    ".m2/repository", ".terminfo")
# Folders that hold other people's or the system's secrets, read by the same rule as the home (their entries that
# the job needs, as a Python under /root/.pyenv, stay readable).
PRIVATE_FOLDERS = ("/root", "/var/run/secrets", "/run/secrets")
READ_GRANTS_MAX = 5000


def private_folders(home: str) -> list[str]:
    """The folders read by allow-list: the home, other users' homes, root's, the system's secrets."""
    try:
        others = [os.path.join("/home", name) for name in sorted(os.listdir("/home"))]
    except OSError:
        others = []
    found = [home, *others, *PRIVATE_FOLDERS]
    return list(dict.fromkeys(os.path.realpath(path) for path in found if os.path.isdir(path)))


def unreadable_paths(home: str, extra: list[str], readable: list[str]) -> list[str]:
    """The paths a sandboxed job may not read: in each private folder (private_folders), every entry but what
    readable holds or leads to (a folder on the way to a readable path is walked: its other entries are
    unreadable), and extra (absolute) ones; resolved. A symlink is no entry: what it leads to is judged where it
    lies."""
    allowed = [os.path.realpath(path) for path in readable]

    def inside(path: str, folder: str) -> bool:
        return path == folder or path.startswith(folder.rstrip("/") + "/")
    found: list[str] = []
    for private in private_folders(home) if os.path.dirname(os.path.realpath(home)) != os.path.realpath(home) else []:
        if any(inside(private, folder) for folder in allowed):
            continue
        pending = [private]
        while pending and len(found) < READ_GRANTS_MAX:
            folder = pending.pop()
            try:
                names = sorted(os.listdir(folder))
            except OSError:
                continue
            for name in names:
                path = os.path.join(folder, name)
                if os.path.islink(path) or any(inside(path, granted) for granted in allowed):
                    continue
                if os.path.isdir(path) and any(inside(granted, path) for granted in allowed):
                    pending.append(path)
                else:
                    found.append(path)
    found += [path for path in extra if os.path.isabs(path)]
    return list(dict.fromkeys(os.path.realpath(path) for path in found))


def read_grants(unreadable: list[str]) -> list[str]:
    """What to grant reading beneath so that everything is readable but `unreadable`: every entry of each folder
    that holds an unreadable path (from / down), except those paths and the folders on the way to them, which are
    walked in turn. A file made later directly in such a folder is unreadable too; a symlink is granted only when
    it leads outside every unreadable path."""
    ancestors: set[str] = set()
    for path in unreadable:
        parent = os.path.dirname(path)
        while parent not in ancestors:
            ancestors.add(parent)
            if parent == os.path.dirname(parent):
                break
            parent = os.path.dirname(parent)

    def hidden(path: str) -> bool:
        real = os.path.realpath(path)
        return real in ancestors or any(real == denied or real.startswith(denied.rstrip("/") + "/")
                                        or denied.startswith(real.rstrip("/") + "/") for denied in unreadable)
    grants: list[str] = []
    pending = sorted(folder for folder in ancestors if os.path.dirname(folder) == folder)  # the root
    while pending and len(grants) < READ_GRANTS_MAX:
        folder = pending.pop()
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            path = os.path.join(folder, name)
            if path in ancestors and not os.path.islink(path):
                pending.append(path)
            elif not hidden(path):
                grants.append(path)
    return grants
