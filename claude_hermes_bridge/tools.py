"""[server] Plain functions per tool: arguments and the launch request, resuming, one job and the list, reading."""
import contextlib
import dataclasses
import errno
import json
import math
import os
import re
import stat
import subprocess
import time
from pathlib import Path
from typing import Any, Generic, cast

import psutil

from .config import ISOLATIONS, Config, Executor, audit, confine_cwd, confine_read, executor_named
from .drivers import install_change_refusal, plan_launch, usable_hermes
from .executors import launch_refusal, readiness_refusal
from .git_calls import GitFailed, git
from .hermes_acp import choose_driver
from .hermes_cli import NAME_RE, HermesCli, hermes_version_on_disk, probe_cli
from .hermes_store import StoreUnavailable, same_folder, session_folder
from .jobs import (
    ANSWER_DECISIONS,
    ANSWERERS,
    FINAL_STATES,
    LATE_ANSWERS_KEPT,
    LATE_KEY,
    MAX_TASK_BYTES,
    SESSION_NAME_RE,
    JobRecord,
    JobState,
    JobStore,
    ObservedJob,
    observe,
    validate_job_id,
)
from .landing import land_work
from .launch import JobRequest
from .network import job_mode
from .processes import Ownership, carries_marker, still_running, stop_tree, tree_of
from .render import elapsed_s
from .safe_io import (
    IS_WINDOWS,
    NOFOLLOW,
    READ_FLAGS,
    DamagedRecord,
    LockTimeout,
    Refused,
    T,
    clock_words,
    count_hiding,
    disk_error,
    is_alive,
    machine_clock,
    plural,
    running_process,
    shown,
    unhidden,
    within_any,
    write_atomic,
)
from .worktrees import (
    ISOLATION_BASES,
    repository_of,
    worktree_of,
)


@dataclasses.dataclass(frozen=True)
class Noted(Generic[T]):
    """What a check found, with what to tell the caller about it (a clamp, a folder that moved): returned,
    never appended to a list the caller passed in."""

    value: T
    notes: tuple[str, ...] = ()


def clamp_number(name: str, value: float | None, default: float, low: float, high: float) -> Noted[float]:
    """A number argument brought into range, with a note when it was changed; NaN is refused."""
    if value is None:
        return Noted(default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise Refused(f"{name} must be a number, got {value!r}")
    clamped = min(max(value, low), high)
    return Noted(clamped, (f"{name}={value:g} was clamped to {clamped:g}",) if clamped != value else ())


def names_argument(name: str, value: list[str] | str | None) -> list[str]:
    """skills/toolsets: a list of names or one comma-separated string."""
    if value is None or value == "" or value == []:
        return []
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list):
        raise Refused(f"{name} must be a list of names or a comma-separated string")
    names = [item.strip() if isinstance(item, str) else item for item in items]
    bad = [repr(n)[:40] for n in names if not isinstance(n, str) or not NAME_RE.fullmatch(n)]
    if bad:
        raise Refused(f"{name} has names that are not valid: {', '.join(bad)}; use names like "
                      "'github-pr-workflow' (see hermes_capabilities)")
    return names


def check_task(task: Any) -> str:
    if not isinstance(task, str) or not task.strip():
        raise Refused("task is empty: describe the work, with absolute paths and a definition of done")
    if "\x00" in task:
        raise Refused("task contains a NUL byte, which cannot reach Hermes; remove it")
    try:
        size = len(task.encode("utf-8"))
    except UnicodeEncodeError:
        size = -1
    if size < 0 or "\ufffd" in task:
        raise Refused("task contains invalid Unicode (a lone surrogate, or U+FFFD where text was lost in "
                      "decoding); send plain UTF-8 text")
    if size > MAX_TASK_BYTES:
        raise Refused(f"task is {size} bytes, more than the {MAX_TASK_BYTES} the bridge accepts; write the "
                      "details to a file under cwd and tell Hermes to read it")
    return task


def check_launch(cfg: Config, exe: str, request: JobRequest) -> None:
    """The last launch check, once everything else is valid: the command line fits. The first launch with a
    new Hermes probes it here (off the event loop), so a task too long for its command line is refused before
    anything starts."""
    plan_launch(cfg, exe, request.record("<id>"), request.task, request.cwd, probe=probe_cli_safely)


def probe_cli_safely(cfg: Config, exe: str) -> HermesCli | None:
    """A probe that fails leaves the question to the supervisor, which reports it with the job."""
    try:
        return probe_cli(cfg, exe)
    except (OSError, subprocess.SubprocessError):
        return None


@dataclasses.dataclass
class LaunchArguments:
    """What a host sent to hermes_run or hermes_resume, as sent: job_request checks every field and makes the
    JobRequest, or refuses naming the field and the fix."""

    task: Any
    cwd: Any = None
    max_turns: Any = None
    timeout_s: Any = None
    skills: Any = None
    toolsets: Any = None
    max_tokens: Any = None
    max_cost_usd: Any = None
    isolation: Any = None
    isolation_base: Any = None
    network: Any = None
    executor: Any = None


def budget(name: str, value: Any, default: float | None, ceiling: float | None, whole: bool) -> Noted[float | None]:
    """A budget argument: positive (a whole number for tokens), the config's default when not given, clamped to
    the config's ceiling with a note, as timeout_s is."""
    if value is None:
        value = default
    elif isinstance(value, bool) or not isinstance(value, (int, float)) or (whole and not isinstance(value, int)) \
            or not math.isfinite(value) or value <= 0:
        raise Refused(f"{name} must be a positive {'whole number' if whole else 'number'}, got {shown(value)}")
    if value is None or ceiling is None or value <= ceiling:
        return Noted(value)
    return Noted(ceiling, (f"{name}={value:g} was clamped to {ceiling:g} (the config's ceiling)",))


def job_request(cfg: Config, kind: str, arguments: LaunchArguments, session: str | None = None,
                cwd_note: str | None = None, resumed: dict[str, Any] | None = None) -> Noted[JobRequest]:
    """Validate everything about a launch before anything touches the disk or starts a process: the
    request, with what to tell about it (a clamped timeout). resumed: the worktree a resumed session runs in
    (its folder, in the jobs folder, is confined to that worktree instead of the roots)."""
    task = check_task(arguments.task)
    resolved_cwd = os.path.realpath(arguments.cwd) if resumed else confine_cwd(cfg, arguments.cwd)
    max_turns, timeout_s = arguments.max_turns, arguments.timeout_s
    if max_turns is not None and (isinstance(max_turns, bool) or not isinstance(max_turns, int)
                                  or not 1 <= max_turns <= 1000):
        raise Refused(f"max_turns must be a whole number from 1 to 1000, got {shown(max_turns)}")
    if timeout_s is not None and (not isinstance(timeout_s, (int, float)) or math.isnan(timeout_s)
                                  or timeout_s <= 0):
        raise Refused(f"timeout_s must be a positive number of seconds, got {shown(timeout_s)}")
    timeout = clamp_number("timeout_s", timeout_s, cfg.default_timeout_s, 1, cfg.max_timeout_s)
    tokens = budget("max_tokens", arguments.max_tokens, cfg.default_max_tokens, cfg.max_tokens_limit, whole=True)
    cost = budget("max_cost_usd", arguments.max_cost_usd, cfg.default_max_cost_usd, cfg.max_cost_usd_limit,
                  whole=False)
    try:
        network = job_mode(cfg.network, arguments.network)
    except ValueError as exc:
        raise Refused(str(exc)) from None
    exe = usable_hermes(cfg)
    if refusal := install_change_refusal(JobStore.of(cfg)):
        raise Refused(refusal)
    driver, _ = choose_driver(cfg, exe, session)
    skills, toolsets = names_argument("skills", arguments.skills), names_argument("toolsets", arguments.toolsets)
    if driver == "acp" and (skills or toolsets):
        given = " and ".join(name for name, value in (("skills", skills), ("toolsets", toolsets)) if value)
        raise Refused(f"{given} would do nothing here: this job drives Hermes over ACP, whose session takes neither "
                      "(Hermes gives an ACP session every toolset and loads skills as it needs them). Leave them "
                      "out, or set hermes_driver to \"cli\" in config.json for jobs that need them")
    inherited = resumed.get("executor") if resumed else (
        session_executor(JobStore.of(cfg), session) if session and arguments.executor is None else None)
    executor = executor_of(cfg, arguments.executor, inherited)
    resumed = {key: value for key, value in resumed.items() if key != "executor"} if resumed else None
    isolation = (Noted(resumed) if resumed else
                 isolation_of(cfg, arguments.isolation, arguments.isolation_base, resolved_cwd))
    if executor is not None and (refusal := (
            launch_refusal(executor, driver, hermes_version_on_disk(exe), isolation.value, resolved_cwd)
            or readiness_refusal(executor))):
        raise Refused(refusal)
    request = JobRequest(kind=kind, task=task, cwd=resolved_cwd, max_turns=max_turns or cfg.default_max_turns,
                         timeout_s=timeout.value, skills=skills, toolsets=toolsets, session_requested=session,
                         cwd_note=cwd_note, driver=driver, approval_mode=cfg.approval_mode,
                         max_tokens=int(tokens.value) if tokens.value is not None else None, max_cost_usd=cost.value,
                         worktree=isolation.value, network=network,
                         executor=executor.as_record() if executor else None)
    check_launch(cfg, exe, request)
    return Noted(request, timeout.notes + tokens.notes + cost.notes + isolation.notes)


def executor_of(cfg: Config, given: Any, inherited: str | None) -> Executor | None:
    """The executor a job runs on: the one the call names, else the one the resumed session's job ran on
    (inherited: its work and its files are there), else default_executor; None for this machine."""
    if given is not None and not isinstance(given, str):
        raise Refused(f'executor must be the name of one in config.json\'s executors, or "local", got '
                      f"{shown(given, 40)}")
    return executor_named(cfg, given if given is not None else inherited)


def isolation_of(cfg: Config, isolation: Any, base: Any, cwd: str) -> Noted[dict[str, Any] | None]:
    """isolation and isolation_base checked: None for a job in its folder; for a worktree job, its repository
    and base as they are now, with what the user should know (uncommitted work the worktree will not have)."""
    isolation = cfg.default_isolation if isolation is None else isolation
    if isolation not in ISOLATIONS:
        raise Refused(f'isolation must be "none" or "worktree", got {shown(isolation, 40)}')
    if base is not None and base not in ISOLATION_BASES:
        raise Refused(f'isolation_base must be "head" or "working-tree", got {shown(base, 40)}')
    if isolation == "none":
        if base is not None:
            raise Refused('isolation_base applies to isolation "worktree" only')
        return Noted(None)
    repo = repository_of(cwd)
    if not within_any(repo.top, cfg.roots):
        raise Refused(f"cwd {shown(cwd)} is in the repository {shown(repo.top)}, whose top is outside the allowed "
                      f"roots ({', '.join(cfg.roots)}): its worktree, and a merge of its work, would reach files "
                      "outside them. Allow the repository's folder, or use isolation \"none\"")
    notes = []
    if repo.uncommitted and base != "working-tree":
        notes.append(f"the repository has {plural(repo.uncommitted, 'path')} with uncommitted or untracked changes, "
                     "which the worktree (based on HEAD) does not have; isolation_base 'working-tree' carries them")
    notes.append("a worktree holds what git tracks: ignored files (.env, node_modules, build output) and nested "
                 "repositories are not in it" + ("; its submodules are initialised in it" if repo.submodules else ""))
    planned = {"repo": repo.top, "base": repo.head, "head": repo.head, "base_branch": repo.branch or "",
               "subdir": repo.subdir, "from": base or "head", "submodules": "present" if repo.submodules else "none"}
    return Noted(planned, tuple(notes))


def check_session_id(session_id: Any) -> str:
    if not isinstance(session_id, str) or not session_id.strip():
        raise Refused('session_id is empty: give a session id from a SESSION_ID line, or "latest"')
    if not SESSION_NAME_RE.fullmatch(session_id):
        raise Refused(f"session_id '{shown(session_id, 60)}' is not a session id: ids start with a letter or "
                      "digit and look like 20261130_104857_89284b")
    return session_id


def session_home(cfg: Config, store: JobStore, session_id: str) -> tuple[str, str | None]:
    """The folder a resume of this session runs in (Hermes restores it whatever we ask), and a note when
    it had to come from the bridge job that captured the session because the store could not answer."""
    try:
        folder = session_folder(cfg, session_id)
    except StoreUnavailable as exc:
        captured = next((record.cwd for record in store.captured_by(session_id)), None)
        if captured is None:
            raise Refused(f"cannot tell where session {session_id} would run: {exc}. Hermes resumes a session in "
                          "the folder recorded for it, so the bridge resumes only sessions whose folder it can "
                          "check. Start a fresh hermes_run instead") from None
        return captured, (f"Hermes' session store could not answer ({exc}); the folder is that of the bridge job "
                          "that captured this session")
    if within_any(os.path.realpath(folder), cfg.roots):
        return folder, None
    local = next((record.cwd for record in store.captured_by(session_id)  # recorded on an ssh executor's host
                  if (record.worktree or {}).get("remote") == folder), None)
    return (local, None) if local else (folder, None)


def session_executor(store: JobStore, session_id: str) -> str | None:
    """The executor the newest bridge job of this session ran on (None: this machine, or no such job)."""
    record = next(store.captured_by(session_id, scan_limit=500), None)
    return str(record.executor["name"]) if record and record.executor else None


def resolve_resume(cfg: Config, session_id: Any, cwd: str | None
                   ) -> Noted[tuple[str, str, dict[str, Any] | None]]:
    """The session to resume and the folder it will really run in, confined, with what to tell about that
    folder; refused when it is outside today's roots. "latest" is the newest captured session whose folder
    is inside them."""
    confine_cwd(cfg, None)  # no roots configured: refused here, with the fix
    store = JobStore.of(cfg)
    if session_id == "latest":
        for candidate in store.captured_sessions():
            try:
                folder, note = session_home(cfg, store, candidate)
            except Refused:
                continue
            if within_any(os.path.realpath(folder), cfg.roots) and os.path.isdir(folder):
                session = candidate
                break
        else:
            raise Refused('session_id "latest": no session captured by this bridge is recorded in a folder inside '
                          "today's allowed roots; give a session id, or start a fresh hermes_run")
    else:
        session = check_session_id(session_id)
        folder, note = session_home(cfg, store, session)
    real = os.path.realpath(folder)
    worktree = resumed_worktree(cfg, store, real)
    if worktree is not None:
        notes = [note] if note else []
        return Noted((session, real, worktree), (*notes, f"the session is worktree job {worktree['job']}'s: this job "
                                                 f"runs in its worktree, on branch {worktree['branch']}"))
    if not within_any(real, cfg.roots):
        raise Refused(f"session {session} is recorded in {shown(folder)}, outside the allowed roots "
                      f"({', '.join(cfg.roots)}). Hermes always resumes a session in its recorded folder, so this "
                      "session cannot be resumed through the bridge; start a fresh hermes_run instead")
    if not os.path.isdir(real):
        raise Refused(f"session {session} is recorded in {shown(folder)}, which no longer exists; start a fresh "
                      "hermes_run instead")
    notes = [note] if note else []
    if cwd not in (None, "") and not (isinstance(cwd, str) and same_folder(os.path.expanduser(cwd), real)):
        notes.append(f"Hermes resumes a session in the folder recorded for it, so this job runs in {shown(real)}, "
                     f"not in the cwd asked for ({shown(cwd)})")
    return Noted((session, real, None), tuple(notes))


def resumed_worktree(cfg: Config, store: JobStore, folder: str) -> dict[str, Any] | None:
    """The worktree a session recorded in a worktree job's folder runs in again (remade from its branch when
    it was removed), or None for a folder outside the bridge's worktrees. Refused when its work was discarded,
    or its repository is no longer inside the allowed roots."""
    worktrees = os.path.realpath(store.root / "worktrees")
    if not within_any(folder, [worktrees]) or folder == worktrees:
        return None
    job_id = Path(os.path.relpath(folder, worktrees)).parts[0]
    try:
        owner = store.read(validate_job_id(job_id))
    except (Refused, DamagedRecord) as exc:
        raise Refused(f"the session is recorded in {shown(folder)}, the worktree of job {shown(job_id)}, whose "
                      f"record cannot be read ({exc}); start a fresh hermes_run") from None
    worktree = owner.worktree
    if not worktree or os.path.realpath(worktree["path"]) != os.path.join(worktrees, job_id):
        raise Refused(f"the session is recorded in {shown(folder)}, which job {job_id}'s record does not name as its "
                      "worktree; start a fresh hermes_run")
    if not within_any(worktree["repo"], cfg.roots):
        raise Refused(f"job {job_id}'s repository {shown(worktree['repo'])} is outside today's allowed roots; the "
                      "session cannot be resumed through the bridge")
    if not os.path.isdir(worktree["path"]) and git(worktree["repo"], "rev-parse", "--verify", "--quiet",
                                                   f"refs/heads/{worktree['branch']}", check=False).returncode:
        raise Refused(f"job {job_id}'s worktree and its branch {worktree['branch']} were discarded: the session's "
                      "work is gone from the repository (its patch may remain); start a fresh hermes_run")
    kept = {key: value for key, value in worktree.items() if key not in ("work", "remote", "remote_bare")}
    return kept | {"job": job_id} | ({"executor": owner.executor["name"]} if owner.executor else {})


JOBS_SCAN_LIMIT = 5000


def observed_job(cfg: Config, job_id: Any) -> ObservedJob:
    job_id = validate_job_id(job_id)
    try:
        store = JobStore.of(cfg)
        return observe(store.read(job_id), store.root)
    except DamagedRecord as exc:
        raise Refused(f"the record of job {job_id} is damaged ({exc}); its log may still be read with "
                      f"hermes_read(path=\"{JobStore.of(cfg).log_path(job_id)}\")") from None


APPROVAL_ID_RE = re.compile(r"(net-)?\d{1,7}-[0-9a-f]{6}")  # Hermes' questions, and the network's (job_network)


def answer_approval(cfg: Config, job_id: Any, approval_id: Any, decision: Any, by: str) -> ObservedJob:
    """Relay an answer to a question a job waits on: claimed exclusively under the record's lock (the
    question must be pending, unexpired and not answered by anyone yet: a second answer is refused naming
    the first), then written where the job's supervisor reads it (any server process may answer)."""
    if decision not in ANSWER_DECISIONS:
        raise Refused(f"decision must be \"allow\", \"allow_for_job\" or \"deny\", got {shown(decision, 40)}")
    if not isinstance(approval_id, str) or not APPROVAL_ID_RE.fullmatch(approval_id):
        raise Refused(f"approval_id {shown(approval_id, 40)} is not an approval id: take it from the APPROVAL_ID "
                      "line of hermes_status")
    job_id = validate_job_id(job_id)
    store = JobStore.of(cfg)
    try:
        with store.record_lock(job_id):
            observed = observed_job(cfg, job_id)
            claim_answer(store, observed, approval_id, decision, by)
    except LockTimeout:
        raise Refused(f"job {job_id}'s record is held by another process; answer again in a moment") from None
    except OSError as exc:
        raise Refused(f"the answer could not be written: the jobs folder refuses writes ({disk_error(exc)}); "
                      "the question still waits for an answer") from None
    audit(cfg, event="approval", job_id=job_id, approval_id=approval_id, decision=decision, by=by)
    return observed


def claim_answer(store: JobStore, observed: ObservedJob, approval_id: str, decision: str, by: str) -> None:
    """The claim itself, under the record's lock: refused (naming what decided the question, when and by whom)
    unless this question waits and nobody answered it; an answer to a question already decided is kept as a
    late answer, which the final block lists. A planted non-file at the answers' name is moved aside, so the
    question stays answerable."""
    record = observed.record
    decided = next((d for d in reversed(record.decisions) if d["id"] == approval_id), None)
    claims, late = store.answers_file(record.id)
    first = claims.get(approval_id)
    if decided or first:
        earlier = decided or {**cast(dict[str, Any], first), "by": ANSWERERS.get(cast(dict[str, Any], first)["by"],
                                                                                   "someone")}
        note_late_answer(store, observed, {"id": approval_id, "decision": decision, "by": ANSWERERS.get(by, by),
                                       "at": time.time()})
        raise Refused(f"approval {approval_id} of job {record.id} was decided already: {earlier['decision']} by "
                      f"{earlier['by']}{clock_words(earlier.get('at'))}; this answer ({decision}) was not relayed")
    if not observed.running:  # kept too: Hermes may have decided it by its own deadline without a word
        note_late_answer(store, observed, {"id": approval_id, "decision": decision, "by": ANSWERERS.get(by, by),
                                           "at": time.time()})
        raise Refused(f"job {record.id} has ended ({observed.shown_state}); there is no question to answer")
    question = next((q for q in record.questions if q["id"] == approval_id), None)
    if question is None:
        raise Refused(f"approval {approval_id} of job {record.id} is not waiting for an answer: no such question "
                      "was asked")
    if machine_clock() >= question["expires_clock"]:
        note_late_answer(store, observed, {"id": approval_id, "decision": decision, "by": ANSWERERS.get(by, by),
                                       "at": time.time()})
        raise Refused(f"approval {approval_id} came too late: Hermes stopped waiting "
                      f"{int(machine_clock() - question['expires_clock'])} s ago and denied it itself")
    path = store.answers_path(record.id)
    if os.path.lexists(path) and not stat.S_ISREG(os.lstat(path).st_mode):
        os.replace(path, path.with_name(f".{path.name}.not-an-answer-{os.urandom(4).hex()}"))
    claims[approval_id] = {"decision": decision, "by": by, "at": time.time()}
    write_atomic(path, json.dumps({**claims, LATE_KEY: late}).encode())


def note_late_answer(store: JobStore, observed: ObservedJob, answer: dict[str, Any]) -> None:
    """Keep an answer that came after its question was decided (under the record's lock): in the answers file
    while the job runs (its supervisor copies them into the record at the end), in the record once it ended."""
    record = observed.record
    if observed.running:
        claims, late = store.answers_file(record.id)
        with contextlib.suppress(OSError):
            write_atomic(store.answers_path(record.id), json.dumps(
                {**claims, LATE_KEY: [*late, answer][-LATE_ANSWERS_KEPT:]}).encode())
        return
    record.late_answers = [*record.late_answers, answer][-LATE_ANSWERS_KEPT:]
    with contextlib.suppress(OSError, DamagedRecord):
        write_atomic(store.record_path(record.id), record.encoded())  # an outcome's note: the outcome stays


def applied_answer(observed: ObservedJob, approval_id: str) -> str:
    """What became of a question once answered: the decision the job applied and who took it."""
    decided = next((d for d in reversed(observed.record.decisions) if d["id"] == approval_id), None)
    if decided:
        return f"approval {approval_id}: {decided['decision']} by {decided['by']}, applied"
    if any(q["id"] == approval_id for q in observed.pending_questions):
        return f"approval {approval_id}: relayed; the job's supervisor has not taken it yet"
    return f"approval {approval_id}: relayed; the job ended before it was applied"


def owned_supervisor(record: JobRecord) -> "psutil.Process | None":
    """The job's recorded supervisor, when it still runs: the same process (pid and start) carrying the job's
    exact marker. A cancel never takes a job for an orphan while this answers."""
    supervisor = running_process(record.supervisor)
    return supervisor if supervisor is not None and carries_marker(supervisor, record.marker) else None


def cancel_queued(store: JobStore, job_id: str) -> ObservedJob | None:
    """A queued job ended cancelled under its record's lock; None when a slot freed meanwhile and it is
    starting (then its supervisor takes the cancel)."""
    def cancel(record: JobRecord) -> None:
        if record.state is JobState.QUEUED:
            record.change_state(JobState.CANCELLED, "cancelled while queued; Hermes was never started")
    record = store.update(job_id, cancel)
    if record is None or record.state is not JobState.CANCELLED:
        return None
    store.clear_active(job_id)
    return observe(record, store.root)


def cancel_orphan(store: JobStore, cfg: Config, observed: ObservedJob) -> str:
    """Stop what is left of a job whose supervisor died (or froze), and write the outcome it could not. The
    pids come from the record, so only processes that prove to be this job's are signalled: its Hermes, when
    it still runs and carries the job's exact marker, anchors the rest, and the tools the supervisor recorded
    (same pid and start, the exact marker) are the job's even with Hermes gone. `cancelled` is written only
    once the supervisor and Hermes are proven gone."""
    record = observed.record
    job_id = record.id
    supervisor = owned_supervisor(record)
    if supervisor is not None and observed.frozen:
        with contextlib.suppress(psutil.Error):
            supervisor.kill()
        still_running([supervisor], 3)
    elif supervisor is not None:
        write_atomic(store.cancel_path(job_id), b"cancel")
        return "its supervisor is alive after all; cancel requested, the supervisor stops the whole process tree"
    hermes = running_process(record.hermes)
    anchors = frozenset({hermes.pid}) if hermes and carries_marker(hermes, record.marker) else frozenset()
    owner = Ownership(record.marker, anchors, tuple(record.tree))
    unproven = [proc.pid for proc in tree_of(hermes, record.tree) if is_alive(proc) and not owner.owns(proc)]
    report = stop_tree(owner, hermes if anchors else None, record.tree, cfg.kill_grace_s)
    if owned_supervisor(record) is not None or (anchors and running_process(record.hermes) is not None):
        return (f"the job's supervisor or Hermes could not be stopped ({report.describe()}); its outcome was not "
                "written. Stop them by hand")
    was = "had frozen and was ended" if supervisor is not None else "had died"
    reason = f"cancelled after its supervisor {was}; {report.describe()}"
    if unproven:
        reason += (f"; pids {unproven[:20]} named by the record do not carry this job's marker and were not "
                   "signalled")
    record.change_state(JobState.CANCELLED, reason, record.exit_code)
    if not store.write(record):
        return "the supervisor wrote the job's outcome first; it stands"
    store.clear_active(job_id)
    audit(cfg, event="job", job_id=job_id, state=JobState.CANCELLED.value, reason=reason)
    return reason


def request_cancel(cfg: Config, job_id: Any) -> tuple[ObservedJob, str]:
    """Ask a job's supervisor to stop it, or stop an orphan directly; returns the view and a note."""
    observed = observed_job(cfg, job_id)
    store = JobStore.of(cfg)
    if observed.state in FINAL_STATES:
        return observed, f"the job had already ended as {observed.state.value}; nothing to cancel"
    try:
        if observed.state is JobState.QUEUED and (ended := cancel_queued(store, observed.record.id)):
            return ended, "cancelled while queued; Hermes was never started"
        if observed.state is JobState.ORPHANED or observed.frozen:
            note = cancel_orphan(store, cfg, observed)
            return observe(store.read(observed.record.id), store.root), note
        write_atomic(store.cancel_path(observed.record.id), str(time.time()).encode())
    except (OSError, LockTimeout) as exc:
        raise Refused(f"the cancel could not be written: the jobs folder refuses writes ({disk_error(exc)}). The job "
                      "goes on; free space on its disk or make it writable, then cancel again") from None
    return observed, "cancel requested; the supervisor stops the whole process tree"


LAND_ACTIONS = ("merge", "discard", "keep")


def land_job(cfg: Config, job_id: Any, action: Any) -> tuple[ObservedJob, str]:
    """hermes_land: what becomes of a finished worktree job's work. merge applies it to the repository's main
    tree (a merge of its work when that tree is clean and on the base's branch, else its patch applied
    three-way to the working tree), refusing on a conflict with the tree left as it was; discard drops the
    worktree and its branch; keep leaves both to retention. The same action again answers what was done;
    another after merge or discard is refused. Returns the job and what was done."""
    if action not in LAND_ACTIONS:
        raise Refused(f'action must be "merge", "discard" or "keep", got {shown(action, 40)}')
    observed = observed_job(cfg, job_id)
    record, store = observed.record, JobStore.of(cfg)
    worktree = record.worktree
    if worktree and (worktree_of(store, record) is None or not within_any(os.path.realpath(worktree["repo"]),
                                                                          cfg.roots)):
        raise Refused(f"job {record.id}'s record names a worktree or repository the bridge did not make for it, or "
                      "one outside the allowed roots (was the record changed?); nothing was done")
    if not worktree:
        raise Refused(f"job {record.id} ran in its folder (isolation \"none\"): its changes are already there, "
                      "there is nothing to land")
    if observed.running or (observed.state is JobState.ORPHANED and running_process(record.hermes) is not None):
        raise Refused(f"job {record.id} is still running: wait for it (hermes_status) or cancel it (hermes_cancel), "
                      "then land it")
    if record.landed:
        if record.landed["action"] == action:
            return observed, f"already done{clock_words(record.landed.get('at'))}: {record.landed['how']}"
        if record.landed["action"] != "keep":
            raise Refused(f"job {record.id}'s work was already {record.landed['action']}d"
                          f"{clock_words(record.landed.get('at'))} ({record.landed['how']}); nothing was changed")
    try:
        how = land_work(cfg, store, record, action)
    except GitFailed as exc:
        raise Refused(f"git refused: {exc}; the main tree was left as it was") from None
    except LockTimeout:
        raise Refused("another job or landing is changing this repository; try again in a moment") from None
    landed = {"action": action, "how": how, "at": time.time()}

    def note(stored: JobRecord) -> None:
        stored.landed = landed
        stored.worktree = worktree
        stored.repository = record.repository
        stored.diff = stored.diff or record.diff
        stored.changes = stored.changes or record.changes
    updated = store.update(record.id, note, final_too=True)
    audit(cfg, event="land", job_id=record.id, action=action, how=how)
    return observe(updated or store.read(record.id), store.root), how


def list_jobs(cfg: Config, limit: int | None, state: str | None) -> str:
    """The newest jobs (bounded by limit and a scan cap), with a total count; damaged records included."""
    store = JobStore.of(cfg)
    clamped = clamp_number("limit", limit, 50, 1, 1000)
    shown_limit = int(clamped.value)
    ids = store.list_ids()
    rows: list[str] = []
    scanned = 0
    for job_id, observed, damage in store.observed_jobs(reversed(ids)):
        if len(rows) >= shown_limit or scanned >= JOBS_SCAN_LIMIT:
            break
        scanned += 1
        if observed is None:
            if state in (None, "", "damaged"):
                rows.append(f"{job_id}  damaged            -  record {damage}")
            continue
        if state not in (None, "") and observed.shown_state != state:
            continue
        record = observed.record
        usage = record.usage
        tokens = (f"  tokens {usage.get('tokens_in', 0):,}/{usage.get('tokens_out', 0):,}"
                  if usage and not observed.running else "")
        spent = record.spend or {}
        tokens += f"  cost ${float(spent.get('cost_usd', 0)):.4f}" if spent.get("priced") else ""
        rows.append(f"{job_id}  {observed.shown_state:17} {elapsed_s(record, observed.running):>5}s  "
                    f"{shown(record.cwd)}  \"{shown(record.task_preview, 60)}\"{tokens}")
    header = [f"JOBS: {len(ids)} on disk; showing {len(rows)}, newest first"
              + (f", state={shown(state, 40)}" if state else "")]
    if scanned >= JOBS_SCAN_LIMIT and len(rows) < shown_limit:
        header.append(f"NOTE: scanned the newest {JOBS_SCAN_LIMIT} records only")
    header += [f"NOTE: {note}" for note in clamped.notes]
    if not ids:
        header.append("No jobs yet. Start one with hermes_run.")
    return "\n".join(header + rows)


READ_DEFAULT_BYTES = 20000
READ_MAX_BYTES = 262144
DIR_LIMIT = 200


def read_path(cfg: Config, path: Any, max_bytes: int | None, offset: int | None) -> str:
    """A file's byte range or a directory listing, confined, bounded, never hanging on special files.
    What is read is the very thing that was checked: the opened file's device and inode must match the
    confined path, and the path must still resolve to itself, or the read is refused."""
    resolved = confine_read(cfg, path)
    clamped = clamp_number("max_bytes", max_bytes, READ_DEFAULT_BYTES, 1, READ_MAX_BYTES)
    limit = int(clamped.value)
    if offset is not None and (isinstance(offset, bool) or not isinstance(offset, int)):
        raise Refused(f"offset must be a whole number of bytes (negative counts from the end), got {shown(offset)}")
    try:
        checked = os.stat(resolved)
    except OSError as exc:
        raise Refused(f"cannot stat {shown(resolved)}: {exc.strerror or exc}") from None
    is_dir = stat.S_ISDIR(checked.st_mode)
    if not is_dir and not stat.S_ISREG(checked.st_mode):
        raise Refused(f"{shown(resolved)} is not a regular file or folder (a FIFO, device or socket could hang "
                      "or never end), so it is not read")
    if is_dir and IS_WINDOWS:
        return list_folder_by_path(resolved, checked)
    try:
        fd = open_confined(resolved, is_dir)
    except OSError as exc:
        raise Refused(f"cannot open {shown(resolved)} as the file that was checked: {exc.strerror or exc} (a "
                      "symlink swapped in?)") from None
    try:
        opened = os.fstat(fd)
        if (opened.st_dev, opened.st_ino) != (checked.st_dev, checked.st_ino):
            raise Refused(f"{shown(resolved)} changed while it was being opened; try again")
        if is_dir:
            return list_directory(resolved, fd)
        with os.fdopen(os.dup(fd), "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            wanted = offset or 0
            start = min(size, max(0, size + wanted) if wanted < 0 else wanted)
            handle.seek(start)
            data = handle.read(limit)
    finally:
        os.close(fd)
    end = start + len(data)
    header = [f"PATH: {shown(resolved, 1000)}", f"SIZE: {size} bytes", f"RANGE: bytes {start}-{end} of {size}"]
    header += [f"NOTE: {note}" for note in clamped.notes]
    if end < size or start > 0:
        more = f' next: hermes_read(path="{shown(resolved, 1000)}", offset={end})' if end < size else ""
        header.append(f"CUT: yes, {size - len(data)} bytes not shown;{more}")
    else:
        header.append("CUT: no")
    if b"\x00" in data:
        return "\n".join(header + ["BINARY: yes, the content is not text and is not shown"])
    text = data.decode("utf-8", "replace")
    hiding = count_hiding(text, "\n\t\r")
    if hiding:  # a file can read one way and run another (bidi overrides in code): show where
        header.append(f"HIDDEN_CHARACTERS: {hiding} characters that reorder or hide text are shown as escapes "
                      "(\\u202e, \\u200b, ...)")
        text = unhidden(text)
    return "\n".join(header + ["---", text])


def open_confined(resolved: str, directory: bool) -> int:
    """Open a resolved (symlink-free) path so that no symlink is followed on the way: component by component
    with O_NOFOLLOW where the platform allows (POSIX), so a folder swapped for a symlink out after the check
    fails the open instead of leading outside. Elsewhere the path is opened directly and must still
    resolve to itself afterwards."""
    directory_flag = getattr(os, "O_DIRECTORY", 0)
    last_flags = READ_FLAGS | NOFOLLOW | (directory_flag if directory else 0)
    if not (NOFOLLOW and os.open in os.supports_dir_fd):
        fd = os.open(resolved, last_flags)
        if os.path.realpath(resolved) != resolved:
            os.close(fd)
            raise OSError(errno.ELOOP, "the path no longer resolves to itself")
        return fd
    parts = Path(resolved).parts
    fd = os.open(parts[0], os.O_RDONLY | directory_flag)
    if len(parts) == 1:
        return fd
    try:
        for part in parts[1:-1]:
            inner = os.open(part, os.O_RDONLY | directory_flag | NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = inner
        return os.open(parts[-1], last_flags, dir_fd=fd)
    finally:
        os.close(fd)


def list_folder_by_path(resolved: str, checked: os.stat_result) -> str:
    """Windows cannot open a folder as a file descriptor (os.open answers "permission denied"; found on the
    Windows lane): the folder is listed by its path, and the listing is given only if the path still resolves
    to itself and is still the folder that was checked."""
    listing = list_directory(resolved, None)
    try:
        now = os.stat(resolved)
    except OSError as exc:
        raise Refused(f"cannot stat {shown(resolved)}: {exc.strerror or exc}") from None
    if os.path.realpath(resolved) != resolved or (now.st_dev, now.st_ino) != (checked.st_dev, checked.st_ino):
        raise Refused(f"{shown(resolved)} changed while it was being listed; try again")
    return listing


def list_directory(resolved: str, fd: int | None) -> str:
    """Sorted entries with type, size, modified time; only the shown entries are stat'ed. Listed through
    the opened folder where the platform allows, and every name escaped: a folder named 'x\nSTATUS: ok'
    cannot forge a line."""
    try:
        with os.scandir(fd if fd is not None and os.scandir in os.supports_fd else resolved) as entries:
            found = sorted((e.name, e) for e in entries)
    except OSError as exc:
        raise Refused(f"cannot list {shown(resolved)}: {exc.strerror or exc}") from None
    lines = [f"DIRECTORY: {shown(resolved, 1000)}", f"ENTRIES: {len(found)}"]
    for name, entry in found[:DIR_LIMIT]:
        try:
            info = entry.stat(follow_symlinks=False)
            kind = "link" if entry.is_symlink() else "dir" if entry.is_dir(follow_symlinks=False) else "file"
            modified = time.strftime("%Y-%m-%d %H:%M", time.localtime(info.st_mtime))
            lines.append(f"{kind:4}  {info.st_size:>12}  {modified}  {shown(name)}")
        except OSError:
            lines.append(f"?     {'':>12}  {'':16}  {shown(name)}")
    if len(found) > DIR_LIMIT:
        lines.append(f"... {len(found) - DIR_LIMIT} more entries not shown")
    return "\n".join(lines)
