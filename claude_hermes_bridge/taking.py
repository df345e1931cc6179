"""[both] Which warm Hermes a job takes (ready_standby, take_standby), the next one readied (start_standby), and
the program of a job offered to a standby first (`--offered ID`): taken by one, else supervised cold."""
import contextlib
import functools
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, cast

import psutil

from .config import Config, load_config
from .drivers import confinement_shape
from .hermes_cli import locate_hermes
from .job_queue import supervisor_argv
from .jobs import JobRecord, JobStore, is_standby_marker, validate_job_id
from .late_standby import LATE_PLACE, may_bind_late
from .preflight import SERVER_DIR
from .processes import popen_kwargs, supervisor_creation_flags
from .safe_io import (
    CREATE_FLAGS,
    IS_WINDOWS,
    DamagedRecord,
    LockTimeout,
    ProcessId,
    Refused,
    is_number,
    open_append,
    read_capped,
    read_json,
    shown,
)
from .standby import (
    PREPARED_FILE,
    TAKE_ANSWER_S,
    being_readied,
    is_alive_standby,
    launch_key,
    standby_folder,
    standby_slots,
)
from .supervisor import main as supervise
from .worktrees import STANDBY_NAME_RE, is_own_folder, standby_place, warm_worktree_refusal

STANDBY_LOG_BYTES = 1 << 20
BEING_READIED = "a warm Hermes is still being readied for this folder (it was not ready when this job started)"
# Not waited for: its first readying records what Hermes imports, and each imports them all, which may take longer
# than a cold start.
LATE_BEING_READIED = "the warm Hermes for any folder is still being readied (it was not ready when this job started)"
READIED_WAIT_S = 15.0  # the most an offered job waits for a standby being readied for it (a cold start: 3-5 s)
MIN_READIED_WAIT_S = 2.0


def warm_startable(cfg: Config, record: JobRecord) -> bool:
    """Whether a standby could be readied for the next job like this one (a job on an executor starts its own)."""
    return (record.driver == "acp" and cfg.warm_start and not record.executor
            and (not record.worktree or not warm_worktree_refusal(record.worktree)))


def ready_standby(cfg: Config, store: JobStore, record: JobRecord) -> tuple[Path, dict[str, Any]] | None:
    """The standby this job can take (its slot and what it published), with record.start and its marker set for
    it; or None, and record.start says why the job starts cold."""
    if record.driver != "acp":
        record.start = "cold: the CLI driver starts Hermes for each job"
    elif not cfg.warm_start:
        record.start = "cold: warm_start is off"
    elif record.executor:
        record.start = f"cold: a job on executor {record.executor['name']} starts a Hermes of its own"
    elif record.worktree and (refusal := warm_worktree_refusal(record.worktree)):
        record.start = f"cold: {refusal}"
    else:
        place = standby_place(record.worktree, record.cwd or "")
        shape = confinement_shape(record.network_mode or "open", record.worktree)
        whys = []
        slots = standby_slots(store, cfg.warm_start_folders, cfg.warm_start_any_folder)
        published = {slot: read_json(slot / "ready.json") for slot in slots}
        owns = [slot for slot in slots if folder_of(published[slot]) == place]
        for slot in owns + [slot for slot in slots if slot not in owns]:  # the folder's own standby first
            ready = published[slot]
            readied = being_readied(slot)
            late = not record.worktree and LATE_PLACE in (readied, folder_of(ready))
            why = (LATE_BEING_READIED if late and ready is None and readied == LATE_PLACE
                   else BEING_READIED if ready is None and readied == place
                   else standby_mismatch(cfg, ready, LATE_PLACE if late else place, shape)
                   or (readied_mismatch(store, ready) if shape["worktree"] == "new" else None))
            if why is None:
                record.start, record.standby_marker = "warm", str(ready["marker"])
                if record.worktree and shape["worktree"] == "new":  # the standby moves its worktree there on taking
                    record.worktree.update({key: ready["worktree"][key] for key in ("admin", "identity")})
                return slot, cast(dict[str, Any], ready)
            whys.append(why)
        record.start = f"cold: {nearest_reason(whys)}"
    return None


def folder_of(ready: Any) -> Any:
    """The place a published standby (ready.json) was readied for (None: none published)."""
    return ready.get("folder") if isinstance(ready, dict) else None


NONE_WAITING = "no warm Hermes is waiting (one is readied after a job starts, for the next in its folder)"
OTHER_FOLDER = "the warm Hermes waiting was readied for another folder"
COLD_REASONS_LAST = (OTHER_FOLDER, NONE_WAITING)


def nearest_reason(whys: list[str]) -> str:
    """Of each slot's reason, the one of the standby nearest to fitting: another folder's, or none waiting,
    only when no slot says more of this job."""
    return min(whys, key=lambda why: COLD_REASONS_LAST.index(why) if why in COLD_REASONS_LAST else -1)


def standby_mismatch(cfg: Config, ready: Any, folder: str, shape: dict[str, Any]) -> str | None:
    """Why this standby cannot take a job in folder confined as shape (drivers.confinement_shape), or None when
    it can."""
    if not isinstance(ready, dict) or not is_standby_marker(ready.get("marker")):
        return NONE_WAITING
    published = ready.get("shape")
    readied = published.get("network", "open") if isinstance(published, dict) else "open"
    if readied != shape["network"]:
        behind = f"behind a proxy for network {readied}" if readied != "open" else "without a proxy (network open)"
        return f"the warm Hermes waiting was started {behind}, and this job's network is {shape['network']}"
    if ready.get("folder") != folder:
        if "worktree" in ready and folder.startswith("a worktree of "):
            return "the warm Hermes waiting readied a worktree of another repository or commit (HEAD moved since)"
        return OTHER_FOLDER
    try:
        exe = locate_hermes(cfg).usable or ""
    except OSError:
        exe = ""
    if ready.get("key") != launch_key(cfg, folder, exe, shape):
        return "the warm Hermes waiting was started with other settings (config, Hermes, its home or environment)"
    if not is_alive_standby(ready):
        return "the warm Hermes waiting had exited"
    return None


def readied_mismatch(store: JobStore, ready: dict[str, Any]) -> str | None:
    """Why a standby's readied worktree cannot become a job's (None: it can): it must be a folder of the bridge's
    own making, as it made it (its name a standby's, in the jobs folder, its identity the same)."""
    readied = ready.get("worktree")
    if not isinstance(readied, dict) or not all(isinstance(readied.get(key), str) for key in ("path", "admin")):
        return "the warm Hermes waiting readied no worktree"
    path = readied["path"]
    if (os.path.dirname(path) != str(store.root / "worktrees") or not STANDBY_NAME_RE.fullmatch(os.path.basename(path))
            or not is_own_folder({"path": path, "identity": readied.get("identity")})):
        return "the worktree the warm Hermes readied is not as it made it"
    return None


def take_standby(folder: Path, record: JobRecord) -> str | None:
    """Hand the job to the standby waiting in the slot folder: claim it (one server wins), name the job, and wait
    for its answer; on none within TAKE_ANSWER_S, take the job back (one of the two renames wins), so exactly one
    supervisor serves it. None once it serves the job; else why the job starts cold, in words for START."""
    claimed, taken = folder / f"claimed-{record.id}.json", folder / f"taken-{record.id}.json"
    try:
        os.rename(folder / "ready.json", claimed)
    except OSError:
        return "another job took the warm Hermes first"
    if (read_json(claimed) or {}).get("marker") != record.standby_marker:  # another standby replaced it meanwhile
        with contextlib.suppress(OSError):
            os.rename(claimed, folder / "ready.json")
        return "the warm Hermes was replaced meanwhile"
    with contextlib.suppress(OSError):
        os.rename(claimed, taken)
    deadline = time.monotonic() + TAKE_ANSWER_S
    while time.monotonic() < deadline:
        handed = taken.exists()  # before serving: the standby renames the one into the other
        if (folder / f"serving-{record.id}.json").exists():
            return None
        if not handed and not claimed.exists():  # the standby refused it: the job starts cold at once
            return standby_refusal(folder, record.id)
        time.sleep(0.01)
    for name in (taken, claimed):
        with contextlib.suppress(OSError):
            os.rename(name, folder / f"abandoned-{record.id}.json")
            (folder / f"abandoned-{record.id}.json").unlink(missing_ok=True)
            return "the standby did not answer in time"
    return None if (folder / f"serving-{record.id}.json").exists() else standby_refusal(folder, record.id)


def standby_refusal(folder: Path, job_id: str) -> str:
    """Why the standby refused the job, as it wrote it (standby.wait_for_a_job) before it let the job go."""
    why = folder / f"why-{job_id}.txt"
    with contextlib.suppress(OSError, Refused):
        text = read_capped(why, 2000).decode("utf-8", "replace").strip()
        why.unlink(missing_ok=True)
        if text:
            return f"the warm Hermes could not take it: {shown(text, 400)}"
    return "the warm Hermes could not take it"


def start_standby(cfg: Config, store: JobStore, job_id: str) -> None:
    """A standby for the next job in this job's folder, detached, and with warm_start_any_folder one bound late
    beside it for a default job in any other folder; each dedupes itself (standby.main). Best effort: a job never
    waits for them or fails by them."""
    folder = standby_folder(store)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        log_path = folder / "standby.log"
        if log_path.exists() and log_path.stat().st_size > STANDBY_LOG_BYTES:
            with contextlib.suppress(OSError):  # Windows: a waiting standby holds it open; it goes next time
                log_path.unlink()
        with contextlib.suppress(FileExistsError):
            os.close(os.open(log_path, CREATE_FLAGS, 0o600))
        log = open_append(log_path)
    except OSError:
        return
    env = dict(os.environ, HERMES_BRIDGE_CONFIG=str(cfg.path))
    with log:
        for program in ("--standby", "--standby-any") if may_bind_late(cfg) else ("--standby",):
            for flags in supervisor_creation_flags(IS_WINDOWS):
                try:
                    standby = subprocess.Popen(supervisor_argv(job_id, program), stdin=subprocess.DEVNULL, stdout=log,
                                               stderr=log, cwd=str(SERVER_DIR), env=env, close_fds=True,
                                               **popen_kwargs(flags))
                    threading.Thread(target=standby.wait, name=f"reap standby {job_id}", daemon=True).start()
                    break
                except OSError:
                    continue


def offered_main(job_id: str) -> int:
    """The program of a job offered to a standby first (`--offered ID`): one the queue started, or one sent while
    the standby for its folder was still being readied. Taken, the job is the standby's, as at hermes_run; else
    this process becomes its supervisor (which also says what is wrong with a record that cannot be read)."""
    cfg = load_config()
    store = JobStore.of(cfg)
    with contextlib.suppress(OSError, Refused, DamagedRecord, LockTimeout):
        if offer_to_standby(cfg, store, validate_job_id(job_id)):
            return 0
    return supervise(job_id)


def offer_to_standby(cfg: Config, store: JobStore, job_id: str) -> bool:
    """Whether a standby took the job. One being readied for its folder is waited for (up to READIED_WAIT_S, or
    a cancel): it started before the job, so it is ready sooner than a cold start would be, and two Hermes
    starting at once would slow each other. Otherwise the next standby is asked for, as after a cold start."""
    record = store.read(job_id)
    words = [record.start.partition(": ")[2]] if record.dequeued_at and record.start else []  # the queue's wait
    before: dict[str, Any] = {"start": record.start, "standby_marker": None,
                              "worktree": dict(record.worktree) if record.worktree else None}
    began, limit = time.monotonic(), readied_wait_s(store)
    while not (standby := ready_standby(cfg, store, record)) and record.start == f"cold: {BEING_READIED}" and (
            time.monotonic() - began < limit and not store.cancel_path(job_id).exists()):
        time.sleep(0.1)
        record = store.read(job_id)
    if not standby and record.start == f"cold: {BEING_READIED}" and time.monotonic() - began >= limit:
        store.update(job_id, functools.partial(change, {"start": (
            f"cold: waited {time.monotonic() - began:.1f} s for the warm Hermes being readied for this folder, which "
            "was not ready (a job waits about as long as the last one took to start)")}))
    if standby:
        slot, ready = standby
        if time.monotonic() - began >= 0.1:
            words.append(f"waited {time.monotonic() - began:.1f} s for the warm Hermes being readied")
        warm = {"start": f"warm: {'; '.join(words)}" if words else "warm", "standby_marker": record.standby_marker,
                "worktree": record.worktree}
        if store.update(job_id, functools.partial(change, warm)):
            if (why := served_by_standby(cfg, store, slot, ready, record)) is None:
                return True
            before["start"] = f"cold: {why}"
        store.update(job_id, functools.partial(change, before))
    if warm_startable(cfg, record):
        start_standby(cfg, store, job_id)
    return False


def readied_wait_s(store: JobStore) -> float:
    """How long a job waits for the standby being readied for its place: about what a cold start takes here (the
    last standby's own start, prepared_s, and half again for a busier machine), so one that hangs while it is
    readied costs a job about one more start at most; READIED_WAIT_S while none was measured."""
    last = (read_json(standby_folder(store) / PREPARED_FILE) or {}).get("prepared_s")
    return min(READIED_WAIT_S, max(MIN_READIED_WAIT_S, 1.5 * cast(float, last))) if is_number(last) \
        else READIED_WAIT_S


def served_by_standby(cfg: Config, store: JobStore, slot: Path, ready: dict[str, Any], record: JobRecord
                      ) -> str | None:
    """Hand the job to the standby ready_standby chose (take_standby); taken (None), the standby is named the job's
    supervisor in its record, and the next standby is asked for. Else why the job starts cold."""
    if why := take_standby(slot, record):
        return why
    with contextlib.suppress(psutil.Error, OSError, LockTimeout, DamagedRecord, Refused):
        serving = ProcessId.of(psutil.Process(int(ready["pid"])))  # the job's supervisor from now on
        store.update(record.id, functools.partial(change, {"supervisor": serving}))
    start_standby(cfg, store, record.id)
    return None


def change(fields: dict[str, Any], record: JobRecord) -> None:
    for name, value in fields.items():
        setattr(record, name, value)
