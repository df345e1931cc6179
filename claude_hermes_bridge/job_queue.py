"""[both] Starting a job's supervisor, and the queue: a job accepted past max_running_jobs waits on disk (state
queued, no supervisor) and starts in the order it was accepted when a slot frees. Whoever looks starts it (a
supervisor that has just written its outcome, a launch, a server's start, a status call), always under the
jobs folder's launch lock, so a queued job starts exactly once however many servers share the folder."""
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

import psutil

from .config import Config, audit
from .jobs import JobRecord, JobState, JobStore
from .preflight import PACKAGE_DIR, SERVER_DIR
from .processes import JOB_MARKER, popen_kwargs, supervisor_creation_flags
from .safe_io import (
    IS_WINDOWS,
    DamagedRecord,
    LockTimeout,
    ProcessId,
    Refused,
    disk_error,
    locked,
    machine_clock,
    open_append,
    read_json,
    write_atomic,
)

# The package's own entry, found from the folder that holds it (a clone, a bundle or site-packages), whatever
# the interpreter's path: entry.console_main imports the supervisor's modules only, never the MCP stack.
SUPERVISOR_BOOT = ("import sys; sys.path.insert(0, sys.argv.pop(1)); "
                   "from claude_hermes_bridge.entry import console_main; console_main()")
OFFERED = "--offered"  # the program of a job offered to a standby first (taking.offered_main)
LAUNCH_LOCK_S = 10.0  # how long a launch or a queue start waits for another process's launch


def supervisor_argv(job_id: str, program: str = "--supervise") -> list[str]:
    """The command that starts a job's supervisor (or, with --standby, a standby for the job's folder; with
    --offered, a program that first offers the job to a standby: taking.offered_main)."""
    return [sys.executable, "-c", SUPERVISOR_BOOT, str(PACKAGE_DIR.parent), program, job_id]


def spawn_supervisor(cfg: Config, store: JobStore, record: JobRecord, log: Any, program: str = "--supervise") -> bool:
    """The job's own supervisor, detached (program `--offered`: one that first offers the job to a standby);
    False (and the record says why) when it could not be started."""
    job_id = record.id
    env = dict(os.environ, HERMES_BRIDGE_CONFIG=str(cfg.path), **{JOB_MARKER: record.marker})
    argv = supervisor_argv(job_id, program)
    for attempt, flags in enumerate(supervisor_creation_flags(IS_WINDOWS)):
        try:
            supervisor = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                          cwd=str(SERVER_DIR), env=env, close_fds=True, **popen_kwargs(flags))
            # its exit status is collected by a thread of its own, so it never lingers as a zombie
            threading.Thread(target=supervisor.wait, name=f"reap {job_id}", daemon=True).start()
            note_supervisor(store, job_id, supervisor.pid)
            record_detach_mode(store, attempt == 0)
            return True
        except OSError as exc:
            failure = exc
    record.change_state(JobState.ERROR, f"the supervisor could not start: {failure}")
    try:
        store.write(record)
        store.clear_active(job_id)
    except OSError as exc:
        raise Refused(f"the supervisor could not start ({failure}), and the jobs folder refuses writes "
                      f"({disk_error(exc)})") from None
    return False


def note_supervisor(store: JobStore, job_id: str, pid: int) -> None:
    """The supervisor's identity in its record as soon as it is started, so a supervisor that dies before
    its own first write is seen gone at once (orphaned), not after START_GRACE_S. Best effort: the supervisor
    writes itself there too."""
    try:
        started = ProcessId.of(psutil.Process(pid))
    except psutil.Error:
        return
    with contextlib.suppress(OSError, LockTimeout, DamagedRecord, Refused):
        store.update(job_id, lambda record: None if record.supervisor else setattr(record, "supervisor", started))


def record_detach_mode(store: JobStore, survives_host: bool) -> None:
    """Remember whether jobs outlive the host (Windows job objects may forbid breakaway) for hermes_health.
    Best effort: the job has started by now, and a failure here must not make the launch look failed."""
    recorded = read_json(store.detach_path)
    if isinstance(recorded, dict) and recorded.get("survives_host") == survives_host:
        return
    with contextlib.suppress(OSError):
        write_atomic(store.detach_path, json.dumps({"survives_host": survives_host}).encode())


def occupancy(store: JobStore) -> tuple[list[JobRecord], list[JobRecord]]:
    """The jobs that hold a slot (live, not queued) and the queued ones in the order they were accepted (their
    ids sort so, whatever the clock did: claim_id)."""
    running: list[JobRecord] = []
    queued: list[JobRecord] = []
    for _, observed, _ in store.observed_jobs(store.active_ids()):
        if observed is None or not observed.running:
            continue
        (queued if observed.state is JobState.QUEUED else running).append(observed.record)
    return running, sorted(queued, key=lambda record: record.id)


def start_queued_locked(cfg: Config, store: JobStore) -> list[str]:
    """Under the launch lock: the oldest queued jobs started while slots are free; the ids started. A record the
    disk refuses stays queued for the next look; one cancelled meanwhile is left as it is (store.write)."""
    running, queued = occupancy(store)
    started = []
    for record in queued[:max(0, int(cfg.max_running_jobs) - len(running))]:
        record.change_state(JobState.STARTING)
        record.dequeued_at, record.dequeued_clock = time.time(), machine_clock()
        waited = record.dequeued_at - record.created_at
        record.start = f"cold: it waited {waited:.0f} s in the queue for a free slot (max_running_jobs)"
        try:
            if not store.write(record):
                continue
            with open_append(store.log_path(record.id)) as log:
                spawned = spawn_supervisor(cfg, store, record, log, OFFERED)
        except (OSError, Refused, DamagedRecord):
            continue
        if spawned:
            started.append(record.id)
            audit(cfg, event="job", job_id=record.id, state="dequeued", waited_s=round(waited, 1))
    return started


def start_queued(cfg: Config, store: JobStore, wait_s: float = LAUNCH_LOCK_S) -> list[str]:
    """Start what the queue holds if a slot is free: a cheap look first, then the start under the lock. Never
    raises (a busy lock or a refusing disk leaves the queue to the next look)."""
    try:
        running, queued = occupancy(store)
        if not queued or len(running) >= cfg.max_running_jobs:
            return []
        with locked(store.root / "launch.lock", wait_s):
            return start_queued_locked(cfg, store)
    except (OSError, LockTimeout, Refused, DamagedRecord):
        return []


def queue_words(store: JobStore, record: JobRecord, cfg: Config) -> str:
    """A queued job's place, as its blocks say it: "2nd of 3; 4 running (max_running_jobs 4)"."""
    running, queued = occupancy(store)
    ids = [queued_record.id for queued_record in queued]
    place = ids.index(record.id) + 1 if record.id in ids else len(ids) + 1
    suffix = {1: "st", 2: "nd", 3: "rd"}.get(place % 10 if place % 100 not in (11, 12, 13) else 0, "th")
    return (f"{place}{suffix} of {max(len(ids), place)}; {len(running)} running (max_running_jobs "
            f"{cfg.max_running_jobs:g}); it starts when a slot frees, its timeout and budgets counted from then")
