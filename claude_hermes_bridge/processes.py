"""[both] Process creation flags, Ownership (the proof before any signal), stop_tree, the Windows job object."""
import contextlib
import dataclasses
import functools
import os
import signal
import subprocess
import sys
import time
from typing import Any

import psutil

from .safe_io import IS_WINDOWS, ProcessId, is_alive, plural

JOB_MARKER = "HERMES_BRIDGE_JOB"  # set in the supervisor's and Hermes' environment: the proof of ownership


# Win32 process creation flags, spelled out so the decisions below can be tested on any platform.
CREATE_SUSPENDED = 0x00000004
CREATE_NEW_PROCESS_GROUP = 0x00000200
CREATE_BREAKAWAY_FROM_JOB = 0x01000000
CREATE_NO_WINDOW = 0x08000000


def supervisor_creation_flags(windows: bool) -> list[int | None]:
    """How to start a supervisor that outlives the host, best first; None means POSIX (a new session).

    Windows: a hidden console of its own (CREATE_NO_WINDOW; DETACHED_PROCESS would make that a no-op, and a
    venv's python.exe redirector would then open a visible console per job) in a new process group, and out
    of the host's job object when the host allows it (breakaway is refused where the job forbids it)."""
    if not windows:
        return [None]
    base = CREATE_NO_WINDOW | CREATE_NEW_PROCESS_GROUP
    return [base | CREATE_BREAKAWAY_FROM_JOB, base]


def hermes_creation_flags(windows: bool) -> int | None:
    """Hermes shares the supervisor's hidden console, so CTRL_BREAK reaches it, in a process group of its
    own, so the break does not reach the supervisor; it starts suspended until it sits in its job object."""
    return CREATE_NEW_PROCESS_GROUP | CREATE_SUSPENDED if windows else None


def popen_kwargs(creation_flags: int | None) -> dict[str, Any]:
    return {"start_new_session": True} if creation_flags is None else {"creationflags": creation_flags}


def interrupt(proc: "psutil.Process") -> bool:
    """The polite stop: SIGTERM (CTRL_BREAK on Windows); Hermes then stops its own tools. False when it
    could not be sent, so the caller does not wait a grace period for nothing."""
    try:
        if IS_WINDOWS:
            os.kill(proc.pid, signal.CTRL_BREAK_EVENT)  # type: ignore[attr-defined]
        else:
            proc.terminate()
        return True
    except (psutil.Error, OSError):
        return False


def interrupt_group(pid: int) -> bool:
    """Ctrl-C for a Hermes that leads its own process group (it was started in a new session): SIGINT to the
    group, so Hermes ends its turn and saves its session as at a terminal, and the tools in its group get
    the same; CTRL_BREAK on Windows, where a new process group ignores CTRL_C. False when not sent."""
    try:
        if IS_WINDOWS:
            os.kill(pid, signal.CTRL_BREAK_EVENT)  # type: ignore[attr-defined]
        elif os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGINT)
        else:
            return False
        return True
    except OSError:
        return False


class WindowsJob:
    """A Win32 job object holding Hermes and everything it starts: Windows never re-parents, so a tool
    whose parent exits escapes a walk by parent links, but never its job. Stopped with TerminateJobObject."""

    def __init__(self) -> None:
        import ctypes

        self.kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]
        self.handle = self.kernel32.CreateJobObjectW(None, None)
        if not self.handle:
            raise OSError(ctypes.get_last_error(), "CreateJobObjectW failed")  # type: ignore[attr-defined]

    def assign(self, popen: subprocess.Popen[bytes]) -> None:
        import ctypes

        if not self.kernel32.AssignProcessToJobObject(self.handle, ctypes.c_void_p(int(popen._handle))):  # type: ignore[attr-defined]
            raise OSError(ctypes.get_last_error(), "AssignProcessToJobObject failed")  # type: ignore[attr-defined]

    def terminate(self) -> None:
        self.kernel32.TerminateJobObject(self.handle, 1)


def held_in_job_object(popen: subprocess.Popen[bytes]) -> WindowsJob:
    """A process started suspended (hermes_creation_flags) in a job object of its own, then let run whatever
    happened: OSError when no job object could hold it (nested jobs refused), and it runs unheld."""
    try:
        job = WindowsJob()
        job.assign(popen)
        return job
    finally:
        psutil.Process(popen.pid).resume()


def started_process(pid: int) -> "psutil.Process | None":
    """A child just started, or None when it has already exited: Windows forgets an exited process at once,
    even while its Popen holds its handle (POSIX keeps it, a zombie, until it is reaped), and its exit code
    is still the Popen's to tell."""
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


@functools.cache
def protected_pids() -> frozenset[int]:
    """Processes the bridge never signals, whatever a record says: pid 1, this process, its ancestors and
    its console host. Read once per process: a stop checks it for every process on the machine
    (marked_processes)."""
    pids = {0, 1, os.getpid()}
    with contextlib.suppress(psutil.Error):
        pids.update(parent.pid for parent in psutil.Process().parents())
    pids.update(own_console_hosts())
    return frozenset(pids)


def own_console_hosts() -> list[int]:
    """The conhost.exe Windows starts as a child of a console process (the supervisor's hidden console): it
    inherits the job's marker, and killing it kills this process (seen under Wine, where the sweep after
    Hermes exited took the supervisor down with it and the job showed orphaned)."""
    if not IS_WINDOWS:
        return []
    hosts = []
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process().children():
            with contextlib.suppress(psutil.Error, OSError, IndexError):  # psutil lets OSError out under Wine
                if os.path.basename(child.cmdline()[0]).lower() == "conhost.exe":
                    hosts.append(child.pid)
    return hosts


def carries_marker(proc: "psutil.Process", marker: str) -> bool:
    try:
        return proc.environ().get(JOB_MARKER) == marker
    except (psutil.Error, OSError):  # another user's process, or gone
        return False


# Linux re-parents orphans to the nearest subreaper, so a supervisor that is one holds the whole tree of its
# job below it, whatever a tool does to its session or environment.
HAS_SUBREAPER = sys.platform.startswith("linux")
PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process (a supervisor) the reaper of its descendants' orphans; False where it cannot."""
    if not HAS_SUBREAPER:
        return False
    import ctypes

    try:
        return bool(ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


@dataclasses.dataclass(frozen=True)
class Ownership:
    """The proof that a process is a job's, checked before any signal; a record on disk is only a claim
    (Hermes' shell, or any local process, can write one naming any pid).

    marker: JOB_MARKER's value in the job's processes (the id and a random nonce, so unique machine-wide).
    anchors: live processes proven to be the job's: its supervisor, or for an orphan its Hermes. On Linux a
    process must descend from an anchor (the subreaper keeps every descendant there), so a process that only
    copied the marker into its environment is never signalled. Elsewhere the exact marker on the process or
    on one of its ancestors is the proof (a tool that scrubbed its environment is still below a marked one)."""

    marker: str
    anchors: frozenset[int] = frozenset()
    recorded: tuple[ProcessId, ...] = ()  # the job's processes as its supervisor recorded them (pid and start)
    require_descent: bool = HAS_SUBREAPER

    def owns(self, proc: "psutil.Process") -> bool:
        """Whether this process is provably the job's: below an anchor (Linux) or marked (elsewhere), or one
        the supervisor recorded, still the same process (pid and start) and still carrying the exact marker:
        the proof that stands for an orphan's tools once its Hermes is gone."""
        if proc.pid in protected_pids():
            return False
        if any(seen.pid == proc.pid and seen.process() for seen in self.recorded) and carries_marker(proc, self.marker):
            return True
        try:
            ancestors = proc.parents()
        except psutil.Error:
            return False
        if self.require_descent:
            return proc.pid in self.anchors or any(parent.pid in self.anchors for parent in ancestors)
        return carries_marker(proc, self.marker) or any(
            parent.pid not in protected_pids() and carries_marker(parent, self.marker) for parent in ancestors)

    def descendants(self) -> list["psutil.Process"]:
        found = []
        for pid in self.anchors:
            try:
                found += psutil.Process(pid).children(recursive=True)
            except psutil.Error:
                continue
        return found


def tree_of(root: "psutil.Process | None", seen: list[ProcessId]) -> list["psutil.Process"]:
    """The root, its descendants now, and every earlier-seen descendant that is still the same process."""
    procs: dict[int, psutil.Process] = {}
    if root is not None:
        try:
            procs[root.pid] = root
            for child in root.children(recursive=True):
                procs[child.pid] = child
        except psutil.Error:
            pass
    for process_id in seen:
        if process_id.pid not in procs and (proc := process_id.process()):
            procs[proc.pid] = proc
    return list(procs.values())


def still_running(procs: list["psutil.Process"], timeout_s: float) -> list["psutil.Process"]:
    """Wait until these processes are gone (zombies count as gone), returning those still running.

    Polls instead of waiting on them: waiting would reap the supervisor's own child, Hermes, before
    subprocess does, and then Popen reports exit code 0 for a Hermes that was killed."""
    identities = [(proc, process_id) for proc in procs
                  if (process_id := ProcessId.of_safe(proc)) and process_id.process()]
    deadline = time.monotonic() + timeout_s
    while True:
        running = [proc for proc, process_id in identities if process_id.process()]
        if not running or time.monotonic() >= deadline:
            return running
        time.sleep(0.05)


def marked_processes(marker: str) -> list["psutil.Process"]:
    """Every process carrying this job's marker, wherever it was re-parented: a tool that double-forked, or
    a process forked while the tree was being stopped, is no longer below Hermes but still carries it."""
    protected = protected_pids()
    return [proc for proc in psutil.process_iter() if proc.pid not in protected and carries_marker(proc, marker)]


@dataclasses.dataclass
class StopReport:
    """What a stop did, for the job's reason line: never "the whole tree" unless that was verified."""

    stopped: frozenset[int]  # the processes signalled while they ran
    survivors: list[int]
    disowned: list[int]  # carry the marker but could not be proven the job's: not signalled
    complete: bool  # the tree is known whole (a subreaper supervisor held it)

    def merged(self, later: "StopReport") -> "StopReport":
        """This stop and a later sweep as one: each process counted once, survivors as the sweep left them."""
        return StopReport(self.stopped | later.stopped, later.survivors + [
            pid for pid in self.survivors if pid not in later.survivors and psutil.pid_exists(pid)],
            sorted(set(self.disowned) | set(later.disowned)), self.complete and later.complete)

    def describe(self) -> str:
        count = len(self.stopped)
        if not count and not self.survivors:
            text = "no process of the job was still running"
        elif self.survivors:
            text = (f"stopped {plural(count, 'process')}, but pids {self.survivors[:20]} could not be verified gone; "
                    "stop them by hand")
        elif self.complete:
            text = f"the whole process tree ({plural(count, 'process')}) was stopped and verified gone"
        else:
            text = (f"{plural(count, 'process')} (found below Hermes and by the job's marker) stopped and verified "
                    "gone; a tool that left both the tree and its environment cannot be found on this system")
        if self.disowned:
            text += (f"; pids {self.disowned[:20]} carry the job's marker but do not descend from the job, so they "
                     "were not signalled")
        return text


def stop_tree(owner: Ownership, root: "psutil.Process | None", seen: list[ProcessId], grace_s: float,
              windows_job: "WindowsJob | None" = None, complete: bool = False) -> StopReport:
    """Interrupt the root, wait the grace period, then kill every survivor of the tree.

    Hermes starts each tool command in its own session, so a process-group kill would miss them: the
    snapshot by parentage (below the root, below the anchors, the pids seen earlier, and every process
    carrying the job's marker) is what gets killed, and only what the owner proves to be the job's. The
    marker sweep repeats until nothing new appears, so a process forked during the stop is caught too."""
    targets: list[psutil.Process] = []

    def proven(procs: list["psutil.Process"]) -> list["psutil.Process"]:
        """The live processes not yet targeted that prove to be the job's, now: a process stays a target once
        proven, since stopping its parent re-parents it out of the tree."""
        known = {proc.pid for proc in targets}
        unique = {proc.pid: proc for proc in procs if proc.pid not in known}
        return [proc for proc in unique.values() if is_alive(proc) and owner.owns(proc)]

    root = root if root is not None and is_alive(root) and owner.owns(root) else None
    marked = marked_processes(owner.marker)
    targets += proven(tree_of(root, seen) + owner.descendants() + marked)
    disowned = sorted({proc.pid for proc in marked} - {proc.pid for proc in targets})
    if root is not None and interrupt(root):
        still_running([root], grace_s)
    if windows_job is not None:
        windows_job.terminate()
    targets += proven(tree_of(root, seen) + owner.descendants())
    survivors = still_running(targets, 0)
    for _ in range(5):
        for proc in survivors:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        survivors = still_running(survivors, 3)
        late = proven(marked_processes(owner.marker) + owner.descendants())
        if not late:
            break
        targets += late
        survivors += late
    return StopReport(frozenset(proc.pid for proc in targets), [proc.pid for proc in survivors], disowned, complete)


def reap_orphans(keep: int) -> None:
    """Collect the exit status of this process' children that have ended, but for `keep` (Hermes, whose
    status subprocess collects): as a subreaper, a supervisor inherits every orphaned tool of its job."""
    if IS_WINDOWS:
        return
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process().children():
            if child.pid != keep and not is_alive(child):
                with contextlib.suppress(OSError):
                    os.waitpid(child.pid, os.WNOHANG)
