"""[supervisor] A warm Hermes for the next job: one `hermes acp` started, initialized and warmed with a session
in the folder of the job that asked for it (the next job there is handed it; else it is a throw-away), waiting,
under a supervisor that becomes the next matching job's supervisor (`--standby ID`). One per slot of the jobs
folder (warm_start_folders slots: the folders used last each keep one; a job elsewhere takes over the slot
readied longest ago); the hand-over is a chain of renames in its slot's folder, each of which only one process
can win:

  ready.json (the standby, ready) --server--> claimed-<job>.json --server--> taken-<job>.json
  taken-<job>.json --standby--> serving-<job>.json     (the standby serves the job)
  taken-<job>.json --server---> abandoned-<job>.json   (no answer in TAKE_ANSWER_S: the server starts it cold)
  ready.json --standby--> retired-<pid>.json           (idle, stale, replaced: it exits)

so a job is served by exactly one supervisor, and a standby retires only while nobody has claimed it."""
import contextlib
import dataclasses
import hashlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, cast

import psutil

from .config import SETTINGS, Config, audit, load_config
from .drivers import (
    WarmStart,
    confinement_shape,
    hermes_launch,
    private_tmp_of,
    project_cache,
    sandbox_mounts,
    sandbox_writable,
    start_hermes,
    usable_hermes,
)
from .git_calls import GitFailed, git_text
from .hermes_acp import ACP_SESSION_RE, WarmHermes, approval_policy_dir
from .hermes_cli import confined_call, hermes_env
from .hermes_store import StoreUnavailable, read_store
from .home_guard import GUARDED_NAMES, walk
from .jobs import FINAL_STATES, JOB_ID_RE, JobRecord, JobState, JobStore
from .late_standby import (
    AHEAD_MODULES,
    LATE_PLACE,
    RECORDING_PROMPT,
    LateHermes,
    late_refusal,
    module_names,
    record_ahead,
    start_late,
)
from .network import JobProxy, enforcement, job_policy
from .preflight import PACKAGE_DIR, VERSION
from .processes import JOB_MARKER, Ownership, become_subreaper, held_in_job_object, started_process, stop_tree
from .safe_io import (
    IS_WINDOWS,
    DamagedRecord,
    LockTimeout,
    ProcessId,
    Refused,
    folder_identity,
    locked,
    open_append,
    read_capped,
    read_json,
    running_process,
    within_any,
    write_atomic,
)
from .sandbox import mechanism as sandbox_mechanism
from .supervisor import Supervisor
from .worktrees import (
    PLANNED_KEYS,
    STANDBY_NAME_RE,
    folder_below,
    hand_over_worktree,
    is_own_folder,
    object_environment,
    ready_worktree,
    remove_readied_worktree,
    standby_place,
    warm_worktree_refusal,
)

POLL_S = 0.1  # how soon a taken standby answers; 0.15 CPU-seconds a minute while it waits
TAKE_ANSWER_S = 3.0  # how long a server waits for the standby to answer a take before it starts the job cold
PREPARED_FILE = "prepared.json"  # in the first slot's folder: how long the last standby took to be ready
PING_S = 1.5  # how long a standby's Hermes has to answer when a job is handed to it (at once when it is not stuck)
LOCK_WAIT_S = 15.0  # how long a new standby waits for the one it replaces to retire
PAST_START_S = 30.0  # a standby is prepared once the job that asked for it is past its start (or after this)
WARM_UP_S = 90.0
STALE_CHECK_S = 5.0
LOOK_S = 1.0  # how often a waiting standby looks at its Hermes, its idle time and whether another is wanted
FORGET_MESSAGES_MAX = 8  # a recording's session holds its prompt and Hermes' answers
FORGET_S = 120.0  # how long Hermes' own `sessions delete` may take (a Hermes CLI start; slowest on Windows)
AHEAD_RECORD = "ahead-modules.json"  # in the late standby's slot: what it imports ahead (ahead_modules)
STANDBY_SETTINGS = ("warm_start", "standby_idle_s", "warm_start_folders")  # the standby's own: not Hermes' start


def standby_folder(store: JobStore) -> Path:
    """The first slot's folder, which also holds every standby's pid file and the standbys' log."""
    return store.root / "standby"


def standby_slots(store: JobStore, count: int, any_folder: bool = False) -> list[Path]:
    """The folders of the slots a standby may wait in (warm_start_folders of them), and with any_folder
    (warm_start_any_folder) the one of the standby bound late, which takes no folder's place."""
    return [standby_folder(store), *(store.root / f"standby-{number}" for number in range(1, count)),
            *([late_slot(store)] if any_folder else [])]


def late_slot(store: JobStore) -> Path:
    return store.root / "standby-any"


def slots_for(slots: list[Path], user_folder: str) -> list[Path]:
    """The slots a standby for a job in user_folder (a worktree job's: its repository's) may wait in, best first:
    the one last wanted for that folder (what waits there is for another commit, settings or network), then those
    no standby holds, then the others, the one readied longest ago first (one still being readied last: it is the
    newest)."""
    def readied_at(slot: Path) -> float:
        published = read_json(slot / "ready.json")
        at = published.get("ready_at") if isinstance(published, dict) else None
        return float(at) if isinstance(at, (int, float)) else float("inf")
    last = [slot for slot in slots if (read_json(slot / "wanted.json") or {}).get("user_folder") == user_folder][:1]
    free = [slot for slot in slots if slot not in last and not holds_standby(slot)]
    return last + free + sorted((slot for slot in slots if slot not in last + free), key=readied_at)


def wanted_key(slot: Path) -> Any:
    return (read_json(slot / "wanted.json") or {}).get("key")


def claim_slot(slots: list[Path], wanted: dict[str, Any]) -> tuple[Path, contextlib.ExitStack] | None:
    """A slot for a standby of wanted's key, with its lock held (closing the stack lets it go) and its key in the
    slot's holder.json: the best of slots_for that no standby of the same key holds, so that jobs started together
    in one folder leave one standby per slot for the next such jobs. None when every slot holds one of this key,
    or when the standby it replaces has not retired within LOCK_WAIT_S."""
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        open_slots = [slot for slot in slots_for(slots, wanted["user_folder"])
                      if not ((read_json(slot / "holder.json") or {}).get("key") == wanted["key"]
                              and holds_standby(slot))]
        if not open_slots:
            return None
        slot = open_slots[0]
        with contextlib.suppress(OSError):
            slot.mkdir(parents=True, exist_ok=True)
            if wanted_key(slot) != wanted["key"]:  # the standby waiting there retires for it
                write_atomic(slot / "wanted.json", json.dumps(wanted).encode())
        held = contextlib.ExitStack()
        try:
            held.enter_context(locked(slot / "standby.lock", 0))
            write_atomic(slot / "holder.json", json.dumps({"key": wanted["key"]}).encode())  # which key holds it
            return slot, held
        except (LockTimeout, OSError):
            held.close()
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.2)


KEY_FILE_BYTES = 1 << 20  # a guarded file of Hermes' home up to this size is in the key by its content
KEY_ENTRIES = 2000  # entries of each guarded folder of Hermes' home in the key


def stamp(path: Path | str) -> list[float]:
    try:
        status = os.stat(path)
    except OSError:
        return []
    return [status.st_mtime_ns, status.st_size, status.st_ino]


def home_stamp(home: Path) -> list[Any]:
    """Every guarded name of Hermes' home as the key sees it: the content of each small file (a same-size change
    with its time set back is seen), and of each entry of the folders that run code (hooks, cron, plugins);
    skills by name, size and time."""
    def content(path: str) -> str:
        try:
            return hashlib.sha256(read_capped(path, KEY_FILE_BYTES)).hexdigest()
        except (OSError, ValueError):
            return repr(stamp(path))
    found: list[Any] = []
    for name in GUARDED_NAMES:
        top = str(home / name)
        if os.path.isfile(top):
            found.append([name, content(top)])
            continue
        paths, _ = walk(top, KEY_ENTRIES)
        found.append([name, [[os.path.relpath(path, top), content(path) if name != "skills" and os.path.isfile(path)
                              else stamp(path)] for path in paths]])
    return found


def launch_key(cfg: Config, folder: str, exe: str, shape: dict[str, Any]) -> str:
    """Everything a warm Hermes was started with that a job's own start would set: the settings, Hermes (its
    executable, every guarded name of its home as it is now), the folder, the job's confinement_shape, the
    environment Hermes inherits, the bridge's code. A job whose key differs starts cold; the standby compares it
    again when a job takes it."""
    home = cfg.hermes_home_path
    environment = {key: value for key, value in hermes_env(cfg).items()
                   if key not in (JOB_MARKER, "HERMES_BRIDGE_CONFIG")}  # the config: its settings are in cfg
    code = [stamp(path) for path in sorted(PACKAGE_DIR.glob("*.py"))]
    settings = {key: getattr(cfg, key) for key in SETTINGS if key not in STANDBY_SETTINGS}
    parts = [VERSION, settings, exe, stamp(exe), str(home), home_stamp(home), folder, shape,
             sorted(environment.items()), sandbox_mechanism().name, code]
    return hashlib.sha256(json.dumps(parts, default=str, sort_keys=True).encode()).hexdigest()


def is_alive_standby(ready: Any) -> bool:
    """Whether a published standby's process still runs (the same process: its start time too)."""
    if not isinstance(ready, dict):
        return False
    pid, create_time, ticks = ready.get("pid"), ready.get("create_time"), ready.get("ticks")
    return (isinstance(pid, int) and isinstance(create_time, (int, float)) and isinstance(ticks, (int, type(None)))
            and running_process(ProcessId(pid, float(create_time), ticks)) is not None)


@dataclasses.dataclass
class Standby:
    """A prepared Hermes, as the standby holds it until a job takes it."""

    key: str
    folder: str  # what it was readied for: worktrees.standby_place
    shape: dict[str, Any]  # the confinement_shape its Hermes was started with
    marker: str
    warm: WarmStart
    prepared_s: float
    worktree: dict[str, Any] | None = None  # the worktree it readied (ready_worktree), until a job takes it
    runs_in: tuple[str, tuple[int, int] | None] = ("", None)  # the folder its Hermes works in, and its identity
    late: LateHermes | None = None  # bound to its job's folder when taken (folder: LATE_PLACE)

    def folder_gone(self) -> bool:
        """Whether the folder its Hermes works in was removed or replaced (a resumed worktree landed or discarded,
        a project folder deleted): no job can take it any more."""
        return folder_identity(self.runs_in[0]) != self.runs_in[1]


def copy_stream(stream: Any) -> None:
    """Hermes' stderr onto this process's, whichever file that is now (the standby's log, then the job's)."""
    for chunk in iter(lambda: stream.read1(65536), b""):
        with contextlib.suppress(OSError):
            os.write(2, chunk)


def prepare(cfg: Config, store: JobStore, folder: str, exe: str, key: str, shape: dict[str, Any],
            planned: dict[str, Any] | None = None, resumed: tuple[dict[str, Any], str] | None = None) -> Standby:
    """Hermes started as a job's would be (the sandbox with a private temporary folder of its own, the managed
    policy, the environment), initialized, and warmed with a throw-away session in folder; given a worktree
    job's plan, in a worktree it readies for the next such job (folder: its place); given a resumed worktree
    job's worktree and folder, there, confined as a resumed job's Hermes is (folder: its place). OSError: not
    ready."""
    started = time.monotonic()
    marker = "standby:" + secrets.token_hex(16)
    owned = f"standby-{os.getpid()}-{secrets.token_hex(6)}"  # its folders, by the pid sweep_leftovers looks at
    if folder == LATE_PLACE:
        return prepare_late(cfg, store, exe, key, shape, marker, owned, started)
    place, worktree, readied = folder, None, None
    if planned:
        try:
            worktree = readied = ready_worktree(store, owned, planned)
        except GitFailed as exc:
            remove_readied_worktree(store, owned)
            raise OSError(f"its worktree could not be made: {exc}") from None
        folder = folder_below(worktree["path"], planned["subdir"])
    elif resumed:
        worktree, folder = resumed
    found = sandbox_mechanism() if cfg.sandbox != "off" else None
    private_tmp = private_tmp_of(store, owned) if found and found.name else None
    own = worktree["path"] if worktree else folder
    writable = sandbox_writable(cfg, own, private_tmp, worktree) if private_tmp else []
    mounts = sandbox_mounts(exe, folder, worktree, writable) if private_tmp else []
    git_environment = object_environment(worktree["objects"], worktree["repo"]) if worktree and "objects" in worktree \
        else None
    cache = project_cache(private_tmp, own, worktree) if private_tmp else None
    proxy, enforced = None, False
    if shape["network"] != "open":  # Hermes behind the proxy the job's network takes over (JobNetwork.start)
        proxy = JobProxy(job_policy(shape["network"], cfg.network_allow, cfg.hermes_home_path))
        enforced = enforcement(bool(writable))[0]
    argv, env = hermes_launch(cfg, [exe, "acp"], marker, writable, private_tmp, git_environment,
                              proxy, enforced, mounts=mounts, cache=cache)
    policy = approval_policy_dir(int(cfg.approval_timeout_s), store.policy_path(owned))
    proc = start_hermes(argv, folder, dict(env, HERMES_MANAGED_DIR=str(policy)), subprocess.PIPE, subprocess.PIPE,
                        subprocess.PIPE)
    windows_job = None
    if IS_WINDOWS:
        with contextlib.suppress(OSError):  # unheld, its tree is found through parent links (said when taken)
            windows_job = held_in_job_object(proc)
    threading.Thread(target=copy_stream, args=(proc.stderr,), name="hermes-stderr", daemon=True).start()
    warm = WarmStart(WarmHermes(proc), policy, private_tmp, windows_job, proxy, enforced)
    try:
        warm.hermes.warm_up(folder, WARM_UP_S)
    except OSError:
        dismiss(cfg, warm, marker, readied)
        raise
    return Standby(key, place, shape, marker, warm, round(time.monotonic() - started, 3), readied,
                   (folder, folder_identity(folder)))


def prepare_late(cfg: Config, store: JobStore, exe: str, key: str, shape: dict[str, Any], marker: str, owned: str,
                 started: float) -> Standby:
    """prepare's standby for default jobs in any folder (late_standby): no warm-up session, which would need its
    folder; it is initialized once bound."""
    private_tmp = private_tmp_of(store, owned)
    proxy, enforced = None, False
    if shape["network"] != "open":
        proxy = JobProxy(job_policy(shape["network"], cfg.network_allow, cfg.hermes_home_path))
        enforced = enforcement(True)[0]
    policy = approval_policy_dir(int(cfg.approval_timeout_s), store.policy_path(owned))
    recorded = late_slot(store) / AHEAD_RECORD
    ahead = ahead_modules(cfg, recorded, key, exe, private_tmp, policy)
    try:
        late, said = start_late(cfg, exe, marker, private_tmp, proxy, enforced, policy, WARM_UP_S, ahead)
        if not ahead[1]:
            modules = [name for name in ahead[0] if name not in said.get("left_out", [])]
            write_atomic(recorded, json.dumps({"key": key, "modules": modules, "tested": True}).encode())
    except OSError:
        if ahead[1]:  # the next one finds out again which of them start a thread
            recorded.unlink(missing_ok=True)
        if proxy:
            proxy.close()
        shutil.rmtree(private_tmp, ignore_errors=True)
        shutil.rmtree(policy, ignore_errors=True)
        raise
    threading.Thread(target=copy_stream, args=(late.warm.proc.stderr,), name="hermes-stderr", daemon=True).start()
    sys.stderr.write(f"[bridge] late standby: {said.get('modules')} modules imported in {said.get('import_s')} s\n")
    warm = WarmStart(late.warm, policy, private_tmp, None, proxy, enforced)
    return Standby(key, LATE_PLACE, shape, marker, warm, round(time.monotonic() - started, 3), None,
                   (str(private_tmp), folder_identity(str(private_tmp))), late)


def ahead_modules(cfg: Config, recorded: Path, key: str, exe: str, private_tmp: Path, policy: Path
                  ) -> tuple[list[str], bool]:
    """What a late standby of this key imports ahead, and whether none of it is known to start a thread: as
    recorded (late_standby.record_ahead) once per key, in its slot; Hermes' ACP server, agent and tools when no
    Hermes could be recorded."""
    found = read_json(recorded)
    if isinstance(found, dict) and found.get("key") == key and (modules := module_names(found.get("modules"))):
        return modules, found.get("tested") is True
    started = time.monotonic()
    try:
        modules, session = record_ahead(cfg, exe, private_tmp, policy, WARM_UP_S)
    except OSError as exc:
        sys.stderr.write(f"[bridge] late standby: no Hermes recorded what it imports ({exc})\n")
        return list(AHEAD_MODULES), False
    sys.stderr.write(f"[bridge] late standby: a Hermes recorded {len(modules)} modules it imports in "
                     f"{time.monotonic() - started:.1f} s\n")
    forget_warm_up(cfg, session, RECORDING_PROMPT)
    with contextlib.suppress(OSError):
        write_atomic(recorded, json.dumps({"key": key, "modules": modules, "tested": False}).encode())
    return modules, False


def sweep_leftovers(store: JobStore) -> None:
    """The private temporary folders, policies and readied worktrees of standbys killed before their cleanup (or
    of the jobs they served: a handed-over worktree's old object folder name, a link): those whose process is
    gone. A process alive under that pid keeps them (a reused pid only delays)."""
    for parent in (store.root / "tmp", store.root / "policies", store.root / "worktree-objects"):
        with contextlib.suppress(OSError):
            for name in os.listdir(parent):
                found = STANDBY_NAME_RE.fullmatch(name)
                if found and not psutil.pid_exists(int(found.group(1))):
                    if parent.name == "worktree-objects":
                        with contextlib.suppress(GitFailed, OSError):
                            remove_readied_worktree(store, name)
                    else:
                        shutil.rmtree(parent / name, ignore_errors=True)


def sweep_own_links(store: JobStore) -> None:
    """This process's handed-over object folder names (links the warm Hermes' git named), once its Hermes ended."""
    with contextlib.suppress(OSError):
        for name in os.listdir(store.root / "worktree-objects"):
            found = STANDBY_NAME_RE.fullmatch(name)
            if found and int(found.group(1)) == os.getpid() and os.path.islink(store.worktree_objects_path(name)):
                os.unlink(store.worktree_objects_path(name))


def dismiss(cfg: Config, warm: WarmStart, marker: str, worktree: dict[str, Any] | None = None) -> None:
    """A standby's Hermes and everything it made, gone (nothing of a job's is touched): given its readied
    worktree (not handed over), that worktree, its branch and object folder too."""
    proc = warm.hermes.proc
    with contextlib.suppress(psutil.Error):  # an exited Hermes' tree is still found by its marker
        stop_tree(Ownership(marker, frozenset({os.getpid()})), started_process(proc.pid), [], cfg.kill_grace_s,
                  warm.windows_job)
    with contextlib.suppress(OSError):
        proc.wait(5)
    shutil.rmtree(warm.policy_dir, ignore_errors=True)
    if warm.proxy:
        warm.proxy.close()
    if warm.private_tmp:
        shutil.rmtree(warm.private_tmp, ignore_errors=True)
    if worktree:
        with contextlib.suppress(GitFailed, OSError):
            remove_readied_worktree(JobStore.of(cfg), os.path.basename(worktree["path"]))
    forget_warm_up(cfg, warm.hermes.warm_session)


def forget_warm_up(cfg: Config, session_id: str | None, prompt: str | None = None) -> None:
    """The throw-away session out of Hermes' session list, once its Hermes has exited: through Hermes' own
    `hermes sessions delete` (the bridge never writes Hermes' store), and only while the store shows it holding
    no message but the bridge's own prompt (a recording's: late_standby.record_ahead) and Hermes' answers to it
    without a tool call, so nothing a person or a job said is ever deleted; audited. Best effort: it stays
    listed."""
    if not session_id or not ACP_SESSION_RE.fullmatch(session_id):
        return

    def held(db: Any) -> list[Any] | None:
        if db.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is None:
            return None
        return list(db.execute("SELECT role, content, tool_calls FROM messages WHERE session_id = ? LIMIT ?",
                               (session_id, FORGET_MESSAGES_MAX + 1)))
    try:
        messages = read_store(cfg, held)
        exe = usable_hermes(cfg)
    except (StoreUnavailable, Refused):
        return
    if messages is None or len(messages) > FORGET_MESSAGES_MAX or not all(
            prompt is not None and ((role == "user" and content == prompt) or (role == "assistant" and not calls))
            for role, content, calls in messages):
        return
    try:
        with confined_call(cfg, [exe, "sessions", "delete", session_id, "--yes"], (str(cfg.hermes_home_path),)
                           ) as (argv, env):
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=FORGET_S, env=env)
    except (OSError, subprocess.SubprocessError):
        return
    audit(cfg, event="standby", warm_up_session=session_id, deleted=done.returncode == 0)


def wait_past_starts(store: JobStore, job_id: str) -> None:
    """Preparing a Hermes costs a few CPU-seconds: not while the job that asked for it, or any other ACP job
    started in the last PAST_START_S, is starting (jobs started together would each start slower)."""
    deadline = time.monotonic() + PAST_START_S
    while time.monotonic() < deadline:
        if not any(is_starting(store, other, asked=other == job_id) for other in {job_id, *store.active_ids()}):
            return
        time.sleep(0.2)


def is_starting(store: JobStore, job_id: str, asked: bool) -> bool:
    """Whether this job's Hermes has yet to be given its task (a CLI job's is given it at its start: only the
    job that asked for a standby is waited for then)."""
    try:
        record = store.read(job_id)
    except Exception:  # noqa: BLE001  (a record that cannot be read is past its start as far as this goes)
        return False
    return not (record.prompt_sent_at or record.state in FINAL_STATES or record.state is JobState.QUEUED) and (
        asked or (record.driver == "acp" and time.time() - record.created_at < PAST_START_S))


def wait_for_a_job(cfg: Config, store: JobStore, folder: Path, standby: Standby) -> str | None:
    """Publish the standby in its slot's folder, then wait: the id of the job that took it, or None once it
    retired (idle past standby_idle_s, its slot wanted for another folder or settings or no longer one of
    warm_start_folders, stale, its folder gone, or its Hermes gone)."""
    ready, wanted = folder / "ready.json", folder / "wanted.json"
    process = ProcessId.of(psutil.Process())
    readied = ({"worktree": {key: standby.worktree[key] for key in ("path", "admin", "identity", "base")}}
               if standby.worktree else {})
    write_atomic(ready, json.dumps({"key": standby.key, "folder": standby.folder, "shape": standby.shape,
                                    "marker": standby.marker,
                                    **dataclasses.asdict(process), "prepared_s": standby.prepared_s,
                                    "ready_at": time.time(), **readied}).encode())
    with contextlib.suppress(OSError):
        write_atomic(standby_folder(store) / PREPARED_FILE, json.dumps({"prepared_s": standby.prepared_s}).encode())
    idle_until = time.monotonic() + cfg.standby_idle_s
    next_look, next_check = time.monotonic(), time.monotonic() + STALE_CHECK_S
    retiring = False
    while True:
        names = os.listdir(folder)  # one read of the folder per poll: an idle standby costs next to no CPU
        for name in sorted(names):
            if name.startswith("taken-") and name.endswith(".json"):
                job_id = name[len("taken-"):-len(".json")]
                if why := refusal(cfg, store, standby, job_id):
                    let_go(folder, job_id, why)
                    return None
                with contextlib.suppress(OSError):
                    os.rename(folder / name, folder / f"serving-{job_id}.json")
                    return job_id
                if standby.late:  # bound to a job its server took back: no other job may have it
                    return None
        if not any(name == "ready.json" or name.startswith(("claimed-", "taken-")) for name in names) and not (
                ready.exists() or any(folder.glob("claimed-*.json")) or any(folder.glob("taken-*.json"))):
            return None  # taken back by a server that waited for an answer in vain (checked again in order)
        if not retiring and time.monotonic() >= next_look:
            next_look = time.monotonic() + LOOK_S
            stale = False
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + STALE_CHECK_S
                now = load_config()
                kept = standby_slots(store, now.warm_start_folders, now.warm_start_any_folder)
                stale = not still_fits(cfg, standby) or folder not in kept or standby.folder_gone()
            wanted_key = (read_json(wanted) or {}).get("key")
            if (stale or time.monotonic() >= idle_until or standby.warm.hermes.proc.poll() is not None
                    or (wanted_key and wanted_key != standby.key)):
                retiring = True
                try:
                    os.rename(ready, folder / f"retired-{process.pid}.json")
                except OSError:  # claimed meanwhile (its taken- file is on its way), or open (Windows): look again
                    retiring = not ready.exists()
                    continue
                (folder / f"retired-{process.pid}.json").unlink(missing_ok=True)
                return None
        time.sleep(POLL_S)


def let_go(folder: Path, job_id: str, why: str) -> None:
    """Give a job handed to this standby back to its server, with why (the job's START says it); a server that
    took the job back meanwhile reads nothing, so nothing is left."""
    why_path, refused = folder / f"why-{job_id}.txt", folder / f"refused-{job_id}.json"
    with contextlib.suppress(OSError):
        write_atomic(why_path, why.encode())
        try:
            os.rename(folder / f"taken-{job_id}.json", refused)
        except OSError:
            why_path.unlink(missing_ok=True)
            raise
        refused.unlink(missing_ok=True)


def refusal(cfg: Config, store: JobStore, standby: Standby, job_id: str) -> str | None:
    """Why this standby cannot serve the job it was just handed, or None (its worktree is the job's then)."""
    if not still_fits(cfg, standby):
        return "the settings, Hermes or Hermes' home changed since it was readied"
    if why := standby.warm.hermes.unresponsive(PING_S):
        return f"its Hermes is not answering ({why})"
    if standby.late:
        try:
            standby.late.bind(cfg, store.read(job_id).cwd or "", cast(Path, standby.warm.private_tmp))
        except (OSError, Refused, DamagedRecord) as exc:
            standby.warm.hermes.proc.kill()
            return f"it could not be bound to this job's folder ({exc})"
    if not handed_over(cfg, store, standby, job_id):
        return "the worktree it readied could not be handed over"
    return None


def handed_over(cfg: Config, store: JobStore, standby: Standby, job_id: str) -> bool:
    """A readied worktree made the job's (hand_over_worktree); True too for a standby without one."""
    if not standby.worktree:
        return True
    try:
        hand_over_worktree(store, standby.worktree, job_id)
    except (GitFailed, OSError) as exc:
        audit(cfg, event="standby", job_id=job_id, problem=f"its worktree was not handed over: {exc}")
        return False
    standby.worktree = None  # the job's now
    return True


def holds_standby(slot: Path) -> bool:
    """Whether a standby holds the slot's lock (being readied, waiting, or about to retire)."""
    if not (slot / "standby.lock").exists():
        return False
    try:
        with locked(slot / "standby.lock", 0):
            return False
    except (LockTimeout, OSError):
        return True


def being_readied(slot: Path) -> str | None:
    """The place a standby holding the slot without having published itself yet is readied for (it is
    starting Hermes now), or None."""
    if (slot / "ready.json").exists() or not holds_standby(slot):
        return None
    place = (read_json(slot / "wanted.json") or {}).get("folder")
    return place if isinstance(place, str) else None


def any_standby_running(store: JobStore) -> bool:
    """Whether a standby process of this jobs folder runs now, in whatever step (its standby-<pid>.pid)."""
    with contextlib.suppress(OSError):
        return any(is_alive_standby(read_json(path)) for path in standby_folder(store).glob("standby-*.pid"))
    return False


def still_fits(cfg: Config, standby: Standby) -> bool:
    """Whether a job started now would start Hermes as this standby's was started (the key, computed again)."""
    try:
        return launch_key(load_config(), standby.folder, usable_hermes(cfg), standby.shape) == standby.key
    except Exception:  # noqa: BLE001  (a config or Hermes that cannot be read now: not the one it was started with)
        return False


def serve(cfg: Config, store: JobStore, slot: Path, job_id: str, standby: Standby, subreaper: bool) -> int:
    """Become the job's supervisor: the job's log is this process's output from now on (Hermes' stderr follows
    through copy_stream), and the Supervisor runs it as it runs a cold one, on the warm Hermes."""
    with open_append(store.log_path(job_id)) as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    sys.stderr.write(f"[bridge] warm start: this Hermes was started and readied {standby.prepared_s:g} s before the "
                     f"job, in {standby.folder}\n")
    warm: WarmStart | None = standby.warm
    if standby.late:
        try:
            standby.late.initialize(WARM_UP_S)
        except OSError as exc:  # the job runs cold under this supervisor, and says why
            dismiss(cfg, standby.warm, standby.marker)
            warm = None
            why = f"cold: the warm Hermes bound to this folder did not answer initialize ({exc})"
            store.update(job_id, lambda record: setattr(record, "start", why))
    try:
        supervisor = Supervisor(job_id, cfg, store, subreaper=subreaper, warm=warm)
        signal.signal(signal.SIGTERM, supervisor.on_sigterm)
        return supervisor.run()
    finally:
        if standby.warm.hermes.proc.poll() is None:  # a job refused before Hermes got its task
            dismiss(cfg, standby.warm, standby.marker)
        else:
            forget_warm_up(cfg, standby.warm.hermes.warm_session)
        shutil.rmtree(standby.warm.policy_dir, ignore_errors=True)
        (slot / f"serving-{job_id}.json").unlink(missing_ok=True)
        sweep_own_links(store)


def main(job_id: str, any_folder: bool = False) -> int:
    """The standby's program, `--standby ID` (ID: the job whose folder it is prepared for), or `--standby-any ID`
    (one bound late, for a default job in any folder: warm_start_any_folder): no MCP. While it lives,
    standby-<pid>.pid in the standby folder names it (hermes_health, and tests that must stop it)."""
    cfg = load_config()
    store = JobStore.of(cfg)
    folder = standby_folder(store)
    alive = folder / f"standby-{os.getpid()}.pid"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(alive, json.dumps(dataclasses.asdict(ProcessId.of(psutil.Process()))).encode())
    except OSError:
        return 0  # the jobs folder refuses writes: no standby
    try:
        return standby_main(cfg, store, job_id, any_folder)
    finally:
        alive.unlink(missing_ok=True)


def resumed_worktree(store: JobStore, record: JobRecord) -> dict[str, Any] | None:
    """A resumed worktree job's worktree, for a standby readied for the next resume there: as the job's record
    names it, when it is still the folder the bridge made for its first job (in the jobs folder, its identity
    the same), with the object folder derived from that job as the job's own planning derives it (own_objects)."""
    worktree = record.worktree
    if not worktree or not isinstance(worktree.get("job"), str) or not JOB_ID_RE.fullmatch(worktree["job"]):
        return None
    path = worktree.get("path")
    if path != str(store.worktree_path(worktree["job"])) or not is_own_folder(worktree):
        return None
    return dict(worktree, objects=str(store.worktree_objects_path(worktree["job"])))


def worktree_plan(planned: dict[str, Any]) -> dict[str, Any] | None:
    """What the next worktree job on this job's repository would be planned with (its base: HEAD now), or None
    when such a job cannot start warm (warm_worktree_refusal) or the repository has no HEAD."""
    if warm_worktree_refusal(planned):
        return None
    plan = {key: planned[key] for key in PLANNED_KEYS if key in planned}
    try:
        plan["base"] = plan["head"] = git_text(plan["repo"], "rev-parse", "--verify", "HEAD^{commit}")
    except GitFailed:
        return None
    return plan


def standby_main(cfg: Config, store: JobStore, job_id: str, any_folder: bool = False) -> int:
    subreaper = become_subreaper()
    try:
        record = store.read(job_id)
        exe = usable_hermes(cfg)
    except (Refused, Exception):  # noqa: BLE001  (nothing to prepare for)
        return 0
    resumed = resumed_worktree(store, record)
    planned = worktree_plan(record.worktree) if record.worktree and not resumed else None
    if (record.worktree and not (planned or resumed)) or record.executor:  # on an executor: a Hermes of its own
        return 0
    where = folder_below(planned["repo"], planned["subdir"]) if planned else record.cwd or ""
    inside = [resumed["path"]] if resumed else cfg.roots
    if not os.path.isdir(where) or not within_any(os.path.realpath(where), inside):
        return 0
    sweep_leftovers(store)
    wait_past_starts(store, job_id)
    if any_folder and (planned or resumed or late_refusal(cfg, exe)):
        return 0  # the folder's own standby is readied beside it (taking.start_standby)
    cwd = LATE_PLACE if any_folder else standby_place(planned or resumed, where)
    shape = confinement_shape(record.network_mode or cfg.network, planned or resumed)
    key = launch_key(cfg, cwd, exe, shape)
    slots = [late_slot(store)] if any_folder else standby_slots(store, cfg.warm_start_folders)
    for slot in slots:
        published = read_json(slot / "ready.json")
        if is_alive_standby(published) and published.get("key") == key:
            return 0  # one is ready for this already
    claimed = claim_slot(slots, {"key": key, "folder": cwd, "user_folder": cwd if any_folder else where})
    if claimed is None:
        return 0
    folder, held = claimed
    with held:
        if wanted_key(folder) != key:
            return 0  # a later job asked for another
        (folder / "ready.json").unlink(missing_ok=True)  # a dead standby's: the lock says nobody holds it
        try:
            standby = prepare(cfg, store, cwd, exe, key, shape, planned, (resumed, where) if resumed else None)
        except OSError as exc:
            audit(cfg, event="standby", problem=f"not prepared: {exc}")
            return 0
        try:
            taken = wait_for_a_job(cfg, store, folder, standby)
        except OSError as exc:  # the jobs folder refuses writes: no standby
            audit(cfg, event="standby", problem=f"not published: {exc}")
            taken = None
        if taken is None:
            dismiss(cfg, standby.warm, standby.marker, standby.worktree)
            return 0
    return serve(cfg, store, folder, taken, standby, subreaper)
