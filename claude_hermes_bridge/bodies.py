"""[server] The async tool bodies: disk work off the event loop, no MCP; the job view's one-time tokens."""
import contextlib
import dataclasses
import functools
import time
import traceback
from typing import Any, Awaitable, Callable

from .config import Config, audit, first_words, load_config
from .hermes_acp import ACP_EXTRA_FIX
from .hermes_cli import running_probe
from .job_queue import start_queued
from .jobs import JobState, JobStore, ObservedJob, validate_job_id
from .launch import JobRequest, launch_job
from .render import ToolResult, elapsed_s, job_details, refused_result, status_result
from .safe_io import Refused, T, disk_error, machine_clock, shown
from .steer import note_undelivered, request_steer, steer_outcome
from .tools import (
    LaunchArguments,
    Noted,
    answer_approval,
    applied_answer,
    clamp_number,
    job_request,
    land_job,
    observed_job,
    request_cancel,
    resolve_resume,
)

# The tool bodies: plain async functions returning a ToolResult, callable without MCP. Everything that
# touches the disk runs in a worker thread with a deadline (off_loop), so a slow disk or a hostile file
# never holds the event loop, and one slow call never delays another.
DISK_DEADLINE_S = 20.0
PROGRESS_EVERY_S = 5.0
APPROVAL_RELAY_S = 5.0  # how long hermes_approve waits to see the supervisor take the answer
Progress = Callable[[float, float, str], Awaitable[None]]


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    import anyio

    with anyio.fail_after(DISK_DEADLINE_S):
        return await anyio.to_thread.run_sync(functools.partial(fn, *args), abandon_on_cancel=True)


# job id, the question, seconds to wait -> the decision and who took it (an ANSWERERS key), or None
AskUser = Callable[[str, dict[str, Any], float], Awaitable[tuple[str, str] | None]]
# The questions this server process has shown in a block, (job id, question id): a wait returns at once for a
# question its caller has not been told about, and waits on through one it has (for the answer, Hermes' own
# decision or the job's end), so a planner polling hermes_status while a person decides makes no tight loop.
TOLD_QUESTIONS: dict[tuple[str, str], None] = {}
TOLD_KEPT = 10_000


def told(observed_jobs: list[ObservedJob]) -> None:
    for observed in observed_jobs:
        for question in observed.pending_questions:
            TOLD_QUESTIONS[(observed.record.id, question["id"])] = None
    while len(TOLD_QUESTIONS) > TOLD_KEPT:
        del TOLD_QUESTIONS[next(iter(TOLD_QUESTIONS))]


def untold(observed: ObservedJob, questions: list[dict[str, Any]] | None = None) -> bool:
    return any((observed.record.id, question["id"]) not in TOLD_QUESTIONS
               for question in (observed.pending_questions if questions is None else questions))


async def wait_for_end(cfg: Config, job_id: str, wait_s: float, progress: Progress | None,
                       ask_user: AskUser | None = None, questions_end_wait: bool = True) -> ObservedJob:
    """Poll the record on disk until the job ends, Hermes asks a question the caller was not shown yet (unless
    questions_end_wait is off, as for a cancel, which waits for the end), or wait_s passes; sends progress
    while it waits. A question
    goes to the user at once when the host can ask them (ask_user, elicitation); their answer is relayed like
    hermes_approve's and the wait goes on."""
    import anyio

    deadline = time.monotonic() + wait_s
    next_progress = time.monotonic()  # the first notification at once, then every PROGRESS_EVERY_S
    asked: set[str] = set()  # put to the user (answered, or left to another channel)
    while True:
        observed = await off_loop(observed_job, cfg, job_id)
        now = time.monotonic()
        unasked = [q for q in observed.pending_questions if q["id"] not in asked]
        if unasked and ask_user is not None:
            question = unasked[0]
            asked.add(question["id"])
            answered = await ask_user(job_id, question, min(question["expires_clock"] - machine_clock(),
                                                            max(0.0, deadline - now)))
            if answered:
                with contextlib.suppress(Refused):  # answered meanwhile by someone else: theirs stands
                    await off_loop(answer_approval, cfg, job_id, question["id"], *answered)
                continue
        if not observed.running or now >= deadline or (questions_end_wait and untold(observed, unasked)):
            told([observed])
            return observed
        if progress is not None and now >= next_progress:
            next_progress = now + PROGRESS_EVERY_S
            try:
                details = await off_loop(job_details, cfg, observed)
                await progress(wait_s - (deadline - now), wait_s, details.progress_line(job_id))
            except Exception:  # progress is a courtesy; a closed stream must not fail the call
                pass
        await anyio.sleep(min(0.25, max(0.0, deadline - now)))


async def launch_and_wait(cfg: Config, launch: Noted[JobRequest], wait_s: float | None, progress: Progress | None,
                          ask_user: AskUser | None = None) -> ToolResult:
    request = launch.value
    wait = clamp_number("wait_s", wait_s, min(5.0, cfg.max_wait_s), 0, cfg.max_wait_s)
    record, duplicate = await off_loop(launch_job, cfg, request)
    notes = [*launch.notes, *wait.notes, *([duplicate] if duplicate else [])]
    if request.driver == "cli" and request.approval_mode == "ask":
        notes.append(CLI_CANNOT_ASK)
    observed = await wait_for_end(cfg, record.id, wait.value, progress, ask_user)
    return await off_loop(status_result, observed, cfg, notes)


CLI_CANNOT_ASK = ("approvals is ask, but this Hermes runs with the CLI driver (no ACP extra), which cannot forward "
                  "its questions: a command it deems dangerous is denied. " + ACP_EXTRA_FIX[0].upper()
                  + ACP_EXTRA_FIX[1:] + " to have them forwarded")


async def run_tool(cfg: Config, arguments: LaunchArguments, wait_s: Any, progress: Progress | None = None,
                   ask_user: AskUser | None = None) -> ToolResult:
    launch = await off_loop(job_request, cfg, "run", arguments)
    return await launch_and_wait(cfg, launch, wait_s, progress, ask_user)


async def resume_tool(cfg: Config, session_id: Any, arguments: LaunchArguments, wait_s: Any,
                      progress: Progress | None = None, ask_user: AskUser | None = None) -> ToolResult:
    """A resume runs where Hermes recorded the session: that folder is confined, and reported (the record
    keeps the note, so every later status says it)."""
    target = await off_loop(resolve_resume, cfg, session_id, arguments.cwd)
    session, folder, worktree = target.value
    launch = await off_loop(job_request, cfg, "resume", dataclasses.replace(arguments, cwd=folder), session,
                            "; ".join(target.notes) or None, worktree)
    return await launch_and_wait(cfg, launch, wait_s, progress, ask_user)


async def status_tool(cfg: Config, job_id: Any, wait_s: Any, progress: Progress | None = None,
                      ask_user: AskUser | None = None, job_ids: Any = None, until: Any = None) -> ToolResult:
    if job_ids is not None:
        return await status_of_many(cfg, job_ids, until, wait_s)
    observed = await off_loop(observed_job, cfg, job_id)
    if observed.state is JobState.QUEUED:  # a slot that freed while nobody looked (its supervisor was killed)
        await off_loop(start_queued, cfg, JobStore.of(cfg), QUEUE_LOOK_S)
    wait = clamp_number("wait_s", wait_s, min(30.0, cfg.max_wait_s), 0, cfg.max_wait_s)
    final = await wait_for_end(cfg, observed.record.id, wait.value, progress, ask_user)
    return await off_loop(status_result, final, cfg, list(wait.notes))


JOB_IDS_MAX = 50
QUEUE_LOOK_S = 2.0  # how long a status call waits for the launch lock to start a queued job


async def status_of_many(cfg: Config, job_ids: Any, until: Any, wait_s: Any) -> ToolResult:
    """hermes_status over several jobs (a planner that fanned out): wait up to wait_s until any (or all) of
    them has ended, then the final block of each that ended and one line for each still running."""
    import anyio

    if not isinstance(job_ids, list) or not job_ids or len(job_ids) > JOB_IDS_MAX:
        raise Refused(f"job_ids must be a list of 1 to {JOB_IDS_MAX} job ids, got {shown(job_ids, 100)}")
    if until not in (None, "any", "all"):
        raise Refused(f'until must be "any" or "all", got {shown(until, 40)}')
    ids = list(dict.fromkeys(validate_job_id(job_id) for job_id in job_ids))
    wait = clamp_number("wait_s", wait_s, min(30.0, cfg.max_wait_s), 0, cfg.max_wait_s)
    deadline = time.monotonic() + wait.value
    while True:
        observed_jobs = [await off_loop(observed_job, cfg, job_id) for job_id in ids]
        ended = [observed for observed in observed_jobs if not observed.running]
        enough = len(ended) == len(observed_jobs) if until == "all" else bool(ended)
        if enough or time.monotonic() >= deadline or any(untold(observed) for observed in observed_jobs):
            told(observed_jobs)
            break
        await anyio.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    lines = [f"JOBS: {len(ended)} of {len(observed_jobs)} ended" + (f" (waited for {until})" if until else ""),
             *(f"NOTE: {note}" for note in wait.notes)]
    lines += [f"- {observed.record.id}: {observed.shown_state}, {elapsed_s(observed.record, True)} s; "
              f'hermes_status(job_id="{observed.record.id}") shows it'
              for observed in observed_jobs if observed.running]
    for observed in ended:
        lines.append(f"\n=== {observed.record.id} ===\n{(await off_loop(status_result, observed, cfg)).text}")
    return ToolResult("\n".join(lines), "ok" if ended else "running")


async def approve_tool(cfg: Config, job_id: Any, approval_id: Any, decision: Any, by: str = "planner") -> ToolResult:
    """hermes_approve (by the planner) and the job view's answer (by the user): the answer to Hermes' question,
    relayed through the job's answer file; then the job's block once the supervisor has taken it (a few
    seconds at most)."""
    import anyio

    observed = await off_loop(answer_approval, cfg, job_id, approval_id, decision, by)
    deadline = time.monotonic() + APPROVAL_RELAY_S
    while observed.running and any(q["id"] == approval_id for q in observed.record.questions) and (
            time.monotonic() < deadline):
        await anyio.sleep(0.2)
        observed = await off_loop(observed_job, cfg, observed.record.id)
    return await off_loop(status_result, observed, cfg, [applied_answer(observed, approval_id)])


STEER_RELAY_S = 8.0  # how long hermes_steer waits to hear what Hermes made of the guidance


async def steer_tool(cfg: Config, job_id: Any, guidance: Any, when: Any, by: str) -> ToolResult:
    """hermes_steer (the planner) and the job view's Steer (the user): the guidance relayed to the job's
    supervisor, then the job's block once Hermes has answered it (a few seconds at most), or what is known by
    then; a steer that met the job's end is said as not delivered, never lost."""
    import anyio

    observed, steer = await off_loop(request_steer, cfg, job_id, guidance, when, by)
    deadline = time.monotonic() + STEER_RELAY_S
    settled, words = steer_outcome(observed, steer["id"])
    while not settled and time.monotonic() < deadline:
        await anyio.sleep(0.2)
        observed = await off_loop(observed_job, cfg, observed.record.id)
        settled, words = steer_outcome(observed, steer["id"])
    if not observed.running and not any(s["id"] == steer["id"] for s in observed.record.steers):
        await off_loop(note_undelivered, JobStore.of(cfg), observed.record.id, steer)
        observed = await off_loop(observed_job, cfg, observed.record.id)
    said = any(s["id"] == steer["id"] for s in observed.record.steers)  # the block's STEERED line says it already
    return await off_loop(status_result, observed, cfg, [] if said else [words])


async def view_steer_tool(cfg: Config, tokens: "ViewTokens", job_id: Any, guidance: Any, when: Any,
                          token: Any) -> ToolResult:
    """The user's guidance from the job view, with a one-time token a result gave the view."""
    if not tokens.redeem(token, job_id):
        raise Refused("this guidance carries no valid one-time token of the job view for this job; steer in the "
                      "job view, or ask the user and use hermes_steer")
    return await steer_tool(cfg, job_id, guidance, when, "view")


async def cancel_tool(cfg: Config, job_id: Any, progress: Progress | None = None) -> ToolResult:
    observed, note = await off_loop(request_cancel, cfg, job_id)
    if observed.running:
        observed = await wait_for_end(cfg, observed.record.id, min(cfg.kill_grace_s + 5, cfg.max_wait_s), progress,
                                  questions_end_wait=False)
    return await off_loop(status_result, observed, cfg, [note])


async def view_job_tool(cfg: Config, job_id: Any) -> ToolResult:
    """The job view's poll: the block and its facts now, without waiting."""
    return await off_loop(status_result, await off_loop(observed_job, cfg, job_id), cfg)


async def view_answer_tool(cfg: Config, tokens: "ViewTokens", job_id: Any, approval_id: Any, decision: Any,
                           token: Any) -> ToolResult:
    """The user's answer from the job view, which must carry a one-time token a result gave the view: a model
    that calls this tool without one is refused (hermes_approve is the planner's way, recorded as such)."""
    if not tokens.redeem(token, job_id, approval_id):
        raise Refused("this answer carries no valid one-time token of the job view for this job and question; "
                      "answer in the job view, or ask the user and use hermes_approve")
    return await approve_tool(cfg, job_id, approval_id, decision, "view")


async def land_tool(cfg: Config, job_id: Any, action: Any) -> ToolResult:
    observed, how = await off_loop(land_job, cfg, job_id, action)
    said = (observed.record.landed or {}).get("how") == how  # the block's LANDED line says it already
    return await off_loop(status_result, observed, cfg, [] if said else [f"{action}: {how}"])


@dataclasses.dataclass(frozen=True)
class Listing:
    """hermes_jobs, hermes_read, hermes_capabilities, hermes_health, hermes_view_patch: from the disk, nothing
    started. Its config, result and audit line are made in one worker-thread trip: a trip costs about 0.3 ms,
    which was most of a warm hermes_health call."""

    fn: Callable[..., str | ToolResult]
    args: tuple[Any, ...] = ()


ToolBody = Callable[[Config], Awaitable[ToolResult]]


def failure_result(tool: str, exc: Exception) -> ToolResult:
    """A refusal, a deadline, a disk that refuses or a bug as the result the model reads, never a crash."""
    if isinstance(exc, Refused):
        return refused_result(str(exc))
    if isinstance(exc, TimeoutError) and (probe := running_probe()):
        return ToolResult(f"STATUS: error\nREASON: {tool} gave up after {DISK_DEADLINE_S:g} s waiting for Hermes to "
                          f"answer `{probe}` (its first start after an install or an upgrade can be this slow). "
                          "The question goes on and its answer is kept: call it again in a minute.", "error",
                          reason="hermes probe deadline")
    if isinstance(exc, TimeoutError):
        return ToolResult(f"STATUS: error\nREASON: {tool} gave up after {DISK_DEADLINE_S:g} s waiting for the disk "
                          "(a slow disk, or a file that never ends?). The server keeps running; hermes_health may "
                          "show why.", "error", reason="disk deadline")
    if isinstance(exc, OSError):  # a disk that refuses (full, read-only) where no step said so itself
        reason = f"{tool} could not use the disk: {disk_error(exc)}"
        return ToolResult(f"STATUS: error\nREASON: {reason}. Free space or make the folder writable, then try "
                          "again; hermes_health shows the jobs folder's state.", "error", reason=reason)
    traceback.print_exception(exc)
    reason = f"internal error in {tool}: {type(exc).__name__}: {shown(str(exc))}"
    return ToolResult(f"STATUS: error\nREASON: {reason}. The server keeps running; hermes_health may show why.",
                      "error", reason=reason)


def audit_call(cfg: Config, tool: str, outcome: ToolResult, task: Any = None) -> None:
    audit(cfg, event="tool", tool=tool, job_id=outcome.job_id, cwd=outcome.cwd, outcome=outcome.status,
          reason=outcome.reason, task=first_words(task) if task is not None else None)


def listed(tool: str, listing: Listing) -> ToolResult:
    cfg: Config | None = None
    try:
        cfg = load_config()
        result = listing.fn(cfg, *listing.args)
        outcome = result if isinstance(result, ToolResult) else ToolResult(result)
    except Exception as exc:  # noqa: BLE001 - every failure becomes the model's answer
        outcome = failure_result(tool, exc)
    if cfg is not None:
        audit_call(cfg, tool, outcome)
    return outcome


async def run_tool_body(tool: str, body: ToolBody | Listing, task: Any = None) -> ToolResult:
    """Run a tool body with a fresh config; a refusal, a deadline or a bug becomes an error result, never a
    crash. Every call leaves one audit line, from the result's fields."""
    if isinstance(body, Listing):
        try:
            return await off_loop(listed, tool, body)
        except TimeoutError as exc:
            return failure_result(tool, exc)
    cfg: Config | None = None
    try:
        cfg = await off_loop(load_config)
        outcome = await body(cfg)
    except Exception as exc:  # noqa: BLE001 - every failure becomes the model's answer
        outcome = failure_result(tool, exc)
    if cfg is not None:
        with contextlib.suppress(TimeoutError):
            await off_loop(audit_call, cfg, tool, outcome, task)
    return outcome


VIEW_TOKEN_S = 3600.0


class ViewTokens:
    """One-time tokens a result carries in its _meta for the job view, which echoes one back with the user's
    answer: the best a server can do to tell the view's click from the model calling the same tool (both are
    tools/call on one connection; keeping app-only tools from the model is the host's part)."""

    def __init__(self) -> None:
        self.issued: dict[str, tuple[float, str, frozenset[str]]] = {}

    def issue(self, job_id: str, question_ids: list[str]) -> str:
        """A token for the view of job_id, good for an answer to one of the questions it was shown with."""
        import secrets

        now = time.monotonic()
        self.issued = {token: given for token, given in self.issued.items() if given[0] > now}
        token = secrets.token_urlsafe(18)
        self.issued[token] = (now + VIEW_TOKEN_S, job_id, frozenset(question_ids))
        return token

    def redeem(self, token: Any, job_id: Any, approval_id: Any = None) -> bool:
        """Whether token was issued, is unexpired, and was given with this job and (for an answer) this question
        (used up either way, so a token tried against another job is gone)."""
        given = self.issued.pop(token, None) if isinstance(token, str) else None
        return (given is not None and given[0] > time.monotonic() and given[1] == job_id
                and (approval_id is None or approval_id in given[2]))
