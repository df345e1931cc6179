"""[server] The only module that imports mcp: the tasks extension, the two SDK lines, build_server, serve."""
import contextlib
import dataclasses
import importlib.util
import json
import os
import re
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, cast

from .bodies import (
    DISK_DEADLINE_S,
    AskUser,
    Listing,
    ToolBody,
    ViewTokens,
    approve_tool,
    cancel_tool,
    land_tool,
    off_loop,
    resume_tool,
    run_tool,
    run_tool_body,
    status_tool,
    steer_tool,
    view_answer_tool,
    view_job_tool,
    view_steer_tool,
)
from .config import Config, config_search, load_config
from .handshake import AnswerFilter, EarlyStart, PrefixedInput
from .health import health, server_instructions
from .job_queue import queue_words, start_queued
from .jobs import FINAL_STATES, JobState, JobStore, is_network_question
from .launch import hermes_at_start, recover_worktrees, sweep_containers
from .preflight import PACKAGE_DIR, VERSION, dependency_version
from .render import QUESTIONS_SHOWN, ToolResult, deadline_words, job_details, status_result
from .review import view_patch
from .safe_io import APP_ONLY_TOOL_NAMES, Refused, T, plural, shown
from .skills import SkillIndex, capabilities
from .tools import LaunchArguments, answer_approval, list_jobs, observed_job, read_path, request_cancel

if TYPE_CHECKING:
    from mcp.types import CallToolResult


# io.modelcontextprotocol/tasks (SEP-2663, protocol 2026-07-28, the 2.x SDK line only): a client that declares
# it on a request gets hermes_run and hermes_resume answered with a task whose id is the job id, and polls
# tasks/get itself (Claude Code moves such a call to the background and tells the model when it ends). The
# task is the job: its state is read from the record on every poll, so it lives as long as the record.
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
TASKS_PROTOCOL = "2026-07-28"
TASK_TOOLS = ("hermes_run", "hermes_resume")
TASK_POLL_MS = 2000
TASK_MESSAGE_CHARS = 150
TASK_FAILED_STATES = frozenset({JobState.ERROR, JobState.TIMEOUT, JobState.OVER_BUDGET, JobState.ORPHANED})
TERMINAL_TASKS_KEPT = 10000
APPROVAL_FORM = {"type": "object", "required": ["allow"],
                 "properties": {"allow": {"type": "boolean", "title": "Allow",
                                          "description": "Allow it (true) or deny it (false)"},
                                "for_this_job": {"type": "boolean", "title": "Allow for the rest of this job",
                                                 "description": "With Allow: the same exact command, asked again "
                                                                "in this job, is allowed too", "default": False}}}


def iso_time(seconds: float) -> str:
    import datetime

    moment = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


NETWORK_FORM = {"type": "object", "required": ["allow"],
                "properties": {"allow": {"type": "boolean", "title": "Allow",
                                         "description": "Let the job connect to this host (true) or refuse it "
                                                        "(false); the answer holds for the rest of the job"}}}


def approval_question(job_id: str, question: dict[str, Any]) -> str:
    """The question put to the user, by elicitation or as a task's input request, with its deadline: a
    dialog left open past it answers nothing."""
    who = "The job" if is_network_question(question) else "Hermes"
    return f"{who} (job {job_id}) asks to {question['what']}. Allow it? {deadline_words(question)}."


def approval_form(question: dict[str, Any]) -> dict[str, Any]:
    return NETWORK_FORM if is_network_question(question) else APPROVAL_FORM


def elicited_decision(response: Any) -> str | None:
    """allow or deny from an elicitation result; None when the user made no choice (Hermes' timeout decides)."""
    if not isinstance(response, dict):
        return None
    content = response.get("content")
    if response.get("action") == "accept" and isinstance(content, dict) and isinstance(content.get("allow"), bool):
        if not content["allow"]:
            return "deny"
        return "allow_for_job" if content.get("for_this_job") is True else "allow"
    return "deny" if response.get("action") == "decline" else None


@dataclasses.dataclass
class TaskCall:
    """One tools/call a client may take as a task: the tool body leaves its outcome here."""

    outcome: ToolResult | None = None


class JobTasks:
    """The tasks extension over the job store, without MCP: the task a job is now, its input answered, its
    cancel. A task reported terminal (completed, failed, cancelled) is kept as reported, so it never changes
    after, whatever the record says later (an orphan cancelled afterwards stays completed)."""

    def __init__(self) -> None:
        import contextvars

        self.terminal: dict[str, dict[str, Any]] = {}
        self.call: contextvars.ContextVar[TaskCall | None] = contextvars.ContextVar("task_call", default=None)

    def as_task(self) -> bool:
        """Whether the tools/call being served will be answered with a task (so it must not wait)."""
        return self.call.get() is not None

    def keep(self, outcome: ToolResult) -> None:
        if (call := self.call.get()) is not None:
            call.outcome = outcome

    def task(self, cfg: Config, job_id: Any) -> dict[str, Any]:
        """tasks/get: the job's state as a task. Refused (an unknown or damaged job) becomes a protocol error."""
        if isinstance(job_id, str) and job_id in self.terminal:
            return self.terminal[job_id]
        observed = observed_job(cfg, job_id)
        record = observed.record
        task: dict[str, Any] = {
            "taskId": record.id, "createdAt": iso_time(record.created_at),
            "lastUpdatedAt": iso_time(record.ended_at or record.started_at or record.created_at),
            "ttlMs": int(max(cfg.retention_days * 86400, 60) * 1000), "pollIntervalMs": TASK_POLL_MS}
        if pending := observed.pending_questions[:QUESTIONS_SHOWN]:
            first = approval_question(record.id, pending[0])
            more = f" (and {len(observed.pending_questions) - 1} more)" if len(observed.pending_questions) > 1 else ""
            return {**task, "status": "input_required", "statusMessage": shown(first, TASK_MESSAGE_CHARS - 20) + more,
                    "inputRequests": {question["id"]: {"method": "elicitation/create", "params": {
                        "mode": "form", "message": shown(approval_question(record.id, question), 2700),
                        "requestedSchema": approval_form(question)}} for question in pending}}
        if observed.state is JobState.QUEUED:
            place = queue_words(JobStore.of(cfg), record, cfg).split(";")[0]
            return {**task, "status": "working", "statusMessage": f"queued: {place} (JOB_ID {record.id})"}
        if observed.running:
            details = job_details(cfg, observed)
            doing = details.current_tool if details.current_tool not in (None, "none yet") else details.activity
            message = f"Hermes: {doing}" if observed.state is JobState.RUNNING and doing else "Hermes is starting"
            job = f" (JOB_ID {record.id})"
            return {**task, "status": "working",
                    "statusMessage": shown(observed.condition or message, TASK_MESSAGE_CHARS - len(job)) + job}
        if observed.state is JobState.CANCELLED:
            task |= {"status": "cancelled", "statusMessage": shown(observed.reason or "cancelled", TASK_MESSAGE_CHARS)}
        else:
            final = status_result(observed, cfg)
            task |= {"status": "completed", "result": {"content": [{"type": "text", "text": final.text}],
                                                       "isError": observed.state in TASK_FAILED_STATES}}
        if len(self.terminal) >= TERMINAL_TASKS_KEPT:
            self.terminal.pop(next(iter(self.terminal)))
        self.terminal[record.id] = task
        return task

    def update(self, cfg: Config, job_id: Any, responses: Any) -> None:
        """tasks/update: each answer to a question of the job is relayed as hermes_approve relays it; one to
        a question answered already (or expired) is refused naming what decided it, after the others are
        relayed; keys that name no question of the job are ignored, as the extension says."""
        observed = observed_job(cfg, job_id)
        if not isinstance(responses, dict):
            return
        record = observed.record
        known = {q["id"] for q in record.questions} | {d["id"] for d in record.decisions} | set(
            JobStore.of(cfg).answers_file(record.id)[0])
        refusals = []
        for approval_id, response in responses.items():
            decision = elicited_decision(response)
            if approval_id not in known or decision is None:
                continue
            try:
                answer_approval(cfg, record.id, approval_id, decision, "user")
            except Refused as exc:
                refusals.append(str(exc))
        if refusals:
            raise Refused("; ".join(refusals))

    def cancel(self, cfg: Config, job_id: Any) -> None:
        """tasks/cancel: as hermes_cancel, without waiting; a task already terminal is left as it is."""
        observed = observed_job(cfg, job_id)
        if observed.record.id not in self.terminal and observed.state not in FINAL_STATES:
            request_cancel(cfg, observed.record.id)


class McpEdge:
    """The one place that knows which MCP SDK line is installed: 2.x (MCPServer) or 1.x (FastMCP). The rest
    of the file uses what both lines share (tool decorators, ToolAnnotations and CallToolResult with camelCase
    keywords, Context.report_progress, stdio_server with explicit streams)."""

    def __init__(self) -> None:
        try:
            module = importlib.import_module("mcp.server.mcpserver")
            self.server_class: Any = module.MCPServer
            self.line = 2
        except ImportError:
            module = importlib.import_module("mcp.server.fastmcp")
            self.server_class = module.FastMCP
            self.line = 1
        self.context_class: Any = module.Context

    def new_server(self, instructions: str, tasks: JobTasks) -> Any:
        if self.line == 2:
            return self.server_class(name="hermes", instructions=instructions, version=VERSION,
                                     extensions=[self.tasks_extension(tasks)])
        server = self.server_class(name="hermes", instructions=instructions)
        server._mcp_server.version = VERSION  # serverInfo.version; 1.x has no public way to set it
        return server

    @staticmethod
    def tasks_extension(tasks: JobTasks) -> Any:
        """The tasks extension on the 2.x line's public Extension API: a tools/call interceptor that answers
        hermes_run and hermes_resume with a task when the request declares the extension on 2026-07-28 (a
        task is never returned on older protocol versions, where results are validated), and the three
        methods. A refusal stays an ordinary result; an unknown task id is a JSON-RPC error."""
        from mcp.server.extension import Extension, MethodBinding
        from mcp.shared.exceptions import MCPError
        from mcp.types import RequestParams
        from pydantic import ConfigDict

        class TaskParams(RequestParams):
            model_config = ConfigDict(extra="allow", populate_by_name=True)
            taskId: str

        class UpdateParams(TaskParams):
            inputResponses: dict[str, Any] = {}

        async def on_disk(fn: Callable[..., T], *args: Any) -> T:
            """A task method's disk work, bounded like a tool's; a refusal or a deadline is a protocol error."""
            try:
                return await off_loop(fn, await off_loop(load_config), *args)
            except Refused as exc:
                raise MCPError(code=-32602, message=str(exc)) from None
            except TimeoutError:
                raise MCPError(code=-32603, message=f"the disk did not answer within {DISK_DEADLINE_S:g} s") from None

        async def get(_ctx: Any, params: TaskParams) -> dict[str, Any]:
            return dict(await on_disk(tasks.task, params.taskId))

        async def update(_ctx: Any, params: UpdateParams) -> dict[str, Any]:
            await on_disk(tasks.update, params.taskId, params.inputResponses)
            return {}

        async def cancel(_ctx: Any, params: TaskParams) -> dict[str, Any]:
            await on_disk(tasks.cancel, params.taskId)
            return {}

        def declared(ctx: Any) -> bool:
            capabilities = ctx.session.client_capabilities
            return ctx.protocol_version == TASKS_PROTOCOL and TASKS_EXTENSION in (
                (capabilities.extensions if capabilities else None) or {})

        class Tasks(Extension):
            identifier = TASKS_EXTENSION

            def methods(self) -> list[MethodBinding]:
                versions = frozenset({TASKS_PROTOCOL})
                return [MethodBinding("tasks/get", TaskParams, get, versions),
                        MethodBinding("tasks/update", UpdateParams, update, versions),
                        MethodBinding("tasks/cancel", TaskParams, cancel, versions)]

            async def intercept_tool_call(self, params: Any, ctx: Any, call_next: Any) -> Any:
                if params.name not in TASK_TOOLS or not declared(ctx):
                    return await call_next(ctx)
                call = TaskCall()
                token = tasks.call.set(call)
                try:
                    result = await call_next(ctx)
                finally:
                    tasks.call.reset(token)
                if call.outcome is None or call.outcome.job_id is None or call.outcome.is_error:
                    return result
                return {"resultType": "task", **await on_disk(tasks.task, call.outcome.job_id)}
        return Tasks()

    def offer_app_only_tools_to_apps_hosts(self, server: Any) -> None:
        """tools/list without the app-only tools for a client that did not declare MCP Apps: its model would
        be offered tools it cannot use (Gemini CLI lists them whatever their visibility). A call still reaches
        them: what they do is guarded by the view's one-time token, not by the list."""
        low = self.lowlevel(server)
        if self.line == 2:
            entry = low.get_request_handler("tools/list")

            async def listed(ctx: Any, params: Any) -> Any:
                result = await entry.handler(ctx, params)
                if renders_apps(ctx.session.client_capabilities):
                    return result
                offered = [t for t in result.tools if t.name not in APP_ONLY_TOOL_NAMES]
                return result.model_copy(update={"tools": offered})
            low.add_request_handler("tools/list", entry.params_type, listed)
            return
        every_tool = server.list_tools

        async def listed_1x() -> list[Any]:
            tools = await every_tool()
            params = low.request_context.session.client_params
            return tools if renders_apps(params.capabilities if params else None) else [
                t for t in tools if t.name not in APP_ONLY_TOOL_NAMES]
        low.list_tools()(listed_1x)

    def lowlevel(self, server: Any) -> Any:
        """The low-level server, run on the client's private pipes (neither line runs a high-level server on
        streams it is given, so this reaches one private attribute, here only)."""
        return server._lowlevel_server if self.line == 2 else server._mcp_server


TRY_CLIENT_NAME = "claude-hermes-bridge --try"  # the client `server.py --try` declares: the user, at a terminal


def client_name(ctx: Any) -> str | None:
    """The name the client declared (initialize, or the request's envelope on 2026-07-28), on both SDK lines."""
    params = getattr(ctx.session, "client_params", None)
    info = getattr(params, "clientInfo", None) or getattr(params, "client_info", None)
    name = getattr(info, "name", None)
    return name if isinstance(name, str) else None


def user_asker(ctx: Any, tasks: JobTasks) -> AskUser | None:
    """Ask the user directly (elicitation) when the client can, while a call waits on the job."""
    from mcp.types import ClientCapabilities, ElicitationCapability
    from pydantic import BaseModel, Field

    if tasks.as_task():  # answered at once with a task; its questions go out as the task's input requests
        return None
    try:  # on 2026-07-28 a request has no back-channel for elicitation/create (can_send_request is 2.x's)
        can_elicit = getattr(ctx.session, "can_send_request", True) and ctx.session.check_client_capability(
            ClientCapabilities(elicitation=ElicitationCapability()))
    except Exception:  # noqa: BLE001  (no session on this request: nobody to ask)
        can_elicit = False
    if not can_elicit:
        return None

    class Answer(BaseModel):
        allow: bool = Field(description="Allow it (true) or deny it (false)")

    async def ask(job_id: str, question: dict[str, Any], wait_s: float) -> tuple[str, str] | None:
        import anyio

        if wait_s < 2:
            return None
        with anyio.move_on_after(wait_s):
            asked = time.monotonic()
            result = await ctx.elicit(approval_question(job_id, question), Answer)
            if result.action == "accept" and result.data is not None:
                return "allow" if result.data.allow else "deny", "user"
            if result.action == "decline":  # at once, no person can have read it: the host's own (codex exec)
                return "deny", "host" if time.monotonic() - asked < HOST_DECLINE_S else "user"
        return None
    return ask


HOST_DECLINE_S = 1.0  # a decline sooner than this after the question went out was not a person's


# The job view (MCP Apps, io.modelcontextprotocol/ui): one self-contained page (job_view.html, in this package)
# that hermes_run, hermes_resume and hermes_status link to, and two tools only the view may call (the host keeps
# them off the model's list). A host without apps ignores all of it and reads the text as before.
JOB_VIEW_URI = "ui://claude-hermes-bridge/job"
JOB_VIEW_MIME = "text/html;profile=mcp-app"
VIEW_LINK = {"ui": {"resourceUri": JOB_VIEW_URI}, "ui/resourceUri": JOB_VIEW_URI}  # the flat key: older hosts
VIEW_FACTS = "viewFacts"  # the _meta key of a result's facts, for the job view (hosts keep _meta from the model)
VIEW_PATCH = "viewPatch"  # the _meta key of a page of a worktree job's patch, for the job view
APP_ONLY = {"ui": {"resourceUri": JOB_VIEW_URI, "visibility": ["app"]}}


JOB_VIEW_FILE = PACKAGE_DIR / "job_view.html"
APPS_EXTENSION = "io.modelcontextprotocol/ui"


def renders_apps(capabilities: Any) -> bool:
    """The client declared MCP Apps: in `extensions` (the 2.x model's field, an extra key on 1.x's) or, from
    hosts that predate the extensions field, in `experimental`."""
    if capabilities is None:
        return False
    extensions = getattr(capabilities, "extensions", None) or (capabilities.model_extra or {}).get("extensions")
    return any(isinstance(declared, dict) and APPS_EXTENSION in declared
               for declared in (extensions, capabilities.experimental))


def hints(read_only: bool, destructive: bool, idempotent: bool, open_world: bool) -> Any:
    """A tool's annotations by the protocol's (camelCase) names, which both lines validate."""
    from mcp.types import ToolAnnotations

    return ToolAnnotations.model_validate({"readOnlyHint": read_only, "destructiveHint": destructive,
                                           "idempotentHint": idempotent, "openWorldHint": open_world})


class ToolRegistry:
    """What registering a tool needs: the server, the installed SDK line, the task table and the view's
    one-time tokens; `tool` registers, `respond` turns a body's outcome into the result a host reads."""

    def __init__(self, cfg: Config, edge: McpEdge) -> None:
        self.tasks = JobTasks()
        self.view_tokens = ViewTokens()
        self.edge = edge
        self.mcp = edge.new_server(server_instructions(cfg), self.tasks)
        self.read_only = hints(read_only=True, destructive=False, idempotent=True, open_world=False)
        self.launches = hints(read_only=False, destructive=False, idempotent=False, open_world=True)
        self.destructive = hints(read_only=False, destructive=True, idempotent=True, open_world=False)
        self.steers = hints(read_only=False, destructive=False, idempotent=False, open_world=False)

    def tool(self, annotations: Any, title: str, meta: dict[str, Any] | None = None
             ) -> Callable[[Callable[..., Any]], Any]:
        """Register a tool; its docstring, without the source's indentation, is the description. A `ctx`
        parameter gets the installed line's Context class, by which the SDK recognises it."""
        import inspect

        def register(fn: Callable[..., Any]) -> Any:
            if "ctx" in fn.__annotations__:
                fn.__annotations__["ctx"] = self.edge.context_class
            return self.mcp.tool(annotations=annotations, title=title, description=inspect.cleandoc(fn.__doc__ or ""),
                                 meta=meta)(fn)
        return register

    async def respond(self, tool_name: str, body: ToolBody | Listing,
                      task: Any = None) -> "CallToolResult":
        """The text as the model reads it, whole; a job's facts and a one-time token for the job view in _meta.
        Never structuredContent for the model's tools: a host that has it hands the model only that (Claude
        Code's print mode did, and the STATUS/SESSION_ID lines and the running and approval guidance were
        lost). The view's own tools carry the same in structuredContent too: Cursor strips _meta from what it
        hands the view, and the view falls back on them."""
        from mcp.types import CallToolResult

        outcome = await run_tool_body(tool_name, body, task)
        self.tasks.keep(outcome)
        result: dict[str, Any] = {"content": [{"type": "text", "text": outcome.text}], "isError": outcome.is_error}
        meta: dict[str, Any] = {}
        if outcome.facts is not None:
            token = self.view_tokens.issue(outcome.facts["job_id"], [q["id"] for q in outcome.facts["questions"]])
            meta.update({"viewToken": token, VIEW_FACTS: outcome.facts})
        if outcome.patch is not None:
            meta[VIEW_PATCH] = outcome.patch
        if meta:
            result["_meta"] = meta
            if tool_name in APP_ONLY_TOOL_NAMES:
                result["structuredContent"] = meta
        return CallToolResult.model_validate(result)


def build_server(cfg: Config, edge: McpEdge) -> Any:
    """The MCP server: the tools and the job view's page over the bodies. The only place tools meet MCP."""
    registry = ToolRegistry(cfg, edge)
    register_job_tools(registry)
    register_lookup_tools(registry, cfg)
    register_review(registry)
    edge.offer_app_only_tools_to_apps_hosts(registry.mcp)
    return registry.mcp


def register_job_tools(registry: ToolRegistry) -> None:
    """The tools that start, wait on, answer for and stop a job."""
    from mcp.types import CallToolResult

    tool = registry.tool

    @tool(registry.launches, "Run a task with Hermes", VIEW_LINK)
    async def hermes_run(task: str, ctx: Any, cwd: str | None = None, max_turns: int | None = None,
                         timeout_s: float | None = None, wait_s: float | None = None,
                         skills: list[str] | str | None = None, toolsets: list[str] | str | None = None,
                         max_tokens: int | None = None, max_cost_usd: float | None = None,
                         isolation: str | None = None, isolation_base: str | None = None,
                         network: str | None = None, executor: str | None = None) -> CallToolResult:
        """Start a fresh Hermes job in cwd (an absolute folder inside the allowed roots). Returns the result
        if it ends within wait_s (default 5 s), else STATUS: running and a JOB_ID to pass to hermes_status.
        The task must be self-contained: absolute paths and a definition of done. max_tokens and
        max_cost_usd (Hermes' estimate) are budgets: past one the job is stopped and ends over_budget.
        isolation "worktree" runs the job in a git worktree of its own (cwd must be in a repository): its
        work lands only through hermes_land; isolation_base "working-tree" starts it from the user's
        uncommitted files too (default: HEAD). network narrows what the job may reach ("model-only",
        "allow-list", "ask"; never wider than the user's setting). executor names where its commands run, from
        the user's executors table (a docker container, another host over ssh; default: this machine)."""
        wait, ask = 0 if registry.tasks.as_task() else wait_s, user_asker(ctx, registry.tasks)
        arguments = LaunchArguments(task, cwd, max_turns, timeout_s, skills, toolsets, max_tokens, max_cost_usd,
                                    isolation, isolation_base, network, executor)
        return await registry.respond(
            "hermes_run", lambda cfg: run_tool(cfg, arguments, wait, ctx.report_progress, ask), task)

    @tool(registry.launches, "Continue a Hermes session", VIEW_LINK)
    async def hermes_resume(session_id: str, task: str, ctx: Any, cwd: str | None = None,
                            max_turns: int | None = None, timeout_s: float | None = None,
                            wait_s: float | None = None, max_tokens: int | None = None,
                            max_cost_usd: float | None = None, executor: str | None = None) -> CallToolResult:
        """Continue a Hermes session with a new task (session_id from a SESSION_ID line, or "latest" for the
        newest session a job of this bridge captured). Hermes resumes a session in the folder recorded for
        it, so the job runs there (it must be inside the allowed roots); cwd is only checked against it.
        executor: as for hermes_run (default: where the session's job ran). Same waiting rules as hermes_run."""
        wait, ask = 0 if registry.tasks.as_task() else wait_s, user_asker(ctx, registry.tasks)
        arguments = LaunchArguments(task, cwd, max_turns, timeout_s, max_tokens=max_tokens, max_cost_usd=max_cost_usd,
                                    executor=executor)
        return await registry.respond("hermes_resume",
                             lambda cfg: resume_tool(cfg, session_id, arguments, wait, ctx.report_progress, ask), task)

    @tool(registry.read_only, "Wait for a Hermes job", VIEW_LINK)
    async def hermes_status(ctx: Any, job_id: str | None = None, wait_s: float | None = None,
                            job_ids: list[str] | None = None, until: str | None = None) -> CallToolResult:
        """Wait up to wait_s (default 30) for a job to end, then return its final block, or STATUS: running
        again. It waits for you: do not call it in a tight loop. Reads only the disk. For several jobs give
        job_ids (a list) instead, and until "any" (default: return once one has ended) or "all"."""
        return await registry.respond("hermes_status", lambda cfg: status_tool(cfg, job_id, wait_s, ctx.report_progress,
                                                                      user_asker(ctx, registry.tasks), job_ids, until))

    @tool(registry.destructive, "Answer Hermes' question")
    async def hermes_approve(job_id: str, approval_id: str, decision: str, ctx: Any) -> CallToolResult:
        """Answer the question a job waits on (STATUS: needs_approval): decision "allow" lets Hermes run what
        its APPROVAL line says, "deny" blocks it, "allow_for_job" also allows the same exact command when this
        job asks again. Ask the user first: this lets an agent run a command it
        deems dangerous. An answer after Hermes stopped waiting is refused."""
        by = "terminal" if client_name(ctx) == TRY_CLIENT_NAME else "planner"
        return await registry.respond("hermes_approve", lambda cfg: approve_tool(cfg, job_id, approval_id, decision,
                                                                                  by))

    @tool(registry.steers, "Steer a running job")
    async def hermes_steer(job_id: str, guidance: str, when: str = "now") -> CallToolResult:
        """Correct a running job without stopping it (ACP jobs): when "now", Hermes reads the guidance after
        its current tool calls; "next_turn" runs it as a turn after this one. The reply
        says whether Hermes took it; every later block lists it (STEERED). A CLI job, an ended one, or one
        waiting on a question (answer it first) is refused, saying why."""
        return await registry.respond("hermes_steer", lambda cfg: steer_tool(cfg, job_id, guidance, when, "planner"))

    @tool(registry.destructive, "Cancel a Hermes job")
    async def hermes_cancel(job_id: str, ctx: Any) -> CallToolResult:
        """Stop a running job and its whole process tree; the job ends as cancelled. Work may be part-done."""
        return await registry.respond("hermes_cancel", lambda cfg: cancel_tool(cfg, job_id, ctx.report_progress))


def register_lookup_tools(registry: ToolRegistry, cfg: Config) -> None:
    """The tools that only read: the job list, files, Hermes' skills, the bridge's health."""
    from mcp.types import CallToolResult

    tool = registry.tool
    skill_index = SkillIndex()

    @tool(registry.read_only, "List Hermes jobs")
    async def hermes_jobs(limit: int | None = None, state: str | None = None) -> CallToolResult:
        """Jobs on disk, newest first (default limit 50): id, state, duration, cwd, first words of the task.
        state filters: running, ok, error, timeout, cancelled, over_budget, orphaned, damaged."""
        return await registry.respond("hermes_jobs", Listing(list_jobs, (limit, state)))

    @tool(registry.read_only, "Read a file or folder")
    async def hermes_read(path: str, max_bytes: int | None = None, offset: int | None = None) -> CallToolResult:
        """Read a file (a byte range: offset, negative = from the end, to page a job log; max_bytes, default
        20000) or list a folder, to verify Hermes' work without waking an agent. Confined to the allowed
        roots and the job files."""
        return await registry.respond("hermes_read", Listing(read_path, (path, max_bytes, offset)))

    @tool(registry.read_only, "Hermes skills")
    async def hermes_capabilities(query: str | None = None, category: str | None = None,
                                  limit: int | None = None) -> CallToolResult:
        """Hermes' installed skills, read from disk. No arguments: categories with counts. query: ranked
        matches over name, description and tags. category: the skills of one category."""
        return await registry.respond("hermes_capabilities",
                             Listing(capabilities, (skill_index, query, category, limit)))

    @tool(registry.read_only, "Bridge health")
    async def hermes_health() -> CallToolResult:
        """Is Hermes found, which options its command line declares, config problems, allowed roots, job
        counts. Instant: starts no process."""
        return await registry.respond("hermes_health", Listing(health, (cfg,)))


def register_review(registry: ToolRegistry) -> None:
    """What a person reviews a job with: hermes_land for a worktree job's work, and the job view (its page and
    its two app-only tools)."""
    from mcp.types import CallToolResult

    mcp, tool, respond, view_tokens = registry.mcp, registry.tool, registry.respond, registry.view_tokens
    destructive, read_only = registry.destructive, registry.read_only

    def job_view_page() -> str:
        return JOB_VIEW_FILE.read_text(encoding="utf-8")
    mcp.resource(JOB_VIEW_URI, name="job view", title="Hermes job", mime_type=JOB_VIEW_MIME,
                 description="A job's state, its question, Allow, Deny, Cancel, Merge, Discard")(job_view_page)

    @tool(destructive, "Land a worktree job's work")
    async def hermes_land(job_id: str, action: str) -> CallToolResult:
        """What becomes of a finished worktree job's work (its WORKTREE, DIFF and PATCH lines): "merge"
        applies it to the repository's main tree (refused on a conflict, naming the paths, with the tree left
        as it was), "discard" removes the worktree and its branch, "keep" leaves them for retention. Show the
        user the DIFF and ask first."""
        return await respond("hermes_land", lambda cfg: land_tool(cfg, job_id, action))

    @tool(read_only, "Job view: the job now", APP_ONLY)
    async def hermes_view_job(job_id: str) -> CallToolResult:
        """For the job view only (the host keeps it off the model's list): the job's block and its facts."""
        return await respond("hermes_view_job", lambda cfg: view_job_tool(cfg, job_id))

    @tool(read_only, "Job view: the change under review", APP_ONLY)
    async def hermes_view_patch(job_id: str, offset: int = 0) -> CallToolResult:
        """For the job view only: a page of a finished worktree job's patch, file by file, from offset (0, or a
        page's next_offset). The model reads the patch with hermes_read."""
        return await respond("hermes_view_patch", Listing(view_patch, (job_id, offset)))

    @tool(registry.steers, "Job view: the user's guidance", APP_ONLY)
    async def hermes_view_steer(job_id: str, guidance: str, when: str, token: str) -> CallToolResult:
        """For the job view only: the user's guidance for a running job, with the view's one-time token. The
        model steers with hermes_steer instead."""
        return await respond("hermes_view_steer",
                             lambda cfg: view_steer_tool(cfg, view_tokens, job_id, guidance, when, token))

    @tool(destructive, "Job view: the user's answer", APP_ONLY)
    async def hermes_view_answer(job_id: str, approval_id: str, decision: str, token: str) -> CallToolResult:
        """For the job view only: the user's answer to Hermes' question, with the view's one-time token.
        The model answers with hermes_approve instead."""
        return await respond(
            "hermes_view_answer", lambda cfg: view_answer_tool(cfg, view_tokens, job_id, approval_id, decision, token))


LONE_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def replace_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        return "".join("\ufffd" if "\ud800" <= ch <= "\udfff" else ch for ch in value)
    if isinstance(value, list):
        return [replace_surrogates(item) for item in value]
    if isinstance(value, dict):
        return {replace_surrogates(k): replace_surrogates(v) for k, v in value.items()}
    return value


class ProtocolLines:
    """The client's input, line by line, with lone UTF-16 surrogates replaced by U+FFFD.

    The SDK cannot parse a request holding a lone surrogate and then never answers it, so the host would
    wait for its timeout; replaced, the request is answered (and a task holding U+FFFD is refused)."""

    def __init__(self, stream: Any):
        self.stream = stream

    def readline(self) -> str:
        line: str = self.stream.readline()
        if not LONE_SURROGATE_ESCAPE.search(line):
            return line
        try:
            message = json.loads(line)
        except ValueError:
            return line
        return json.dumps(replace_surrogates(message), ensure_ascii=False) + "\n"


def release_freed_memory() -> None:
    """Give back to the system what Python has freed by now: the syntax tree of this script, freed once the
    script returned (serve_after_the_script; importing the SDK takes far longer than that), about 10 MB that
    glibc keeps unless asked to trim. Measured: 80.4 MB with neither, 79.3 with the thread alone, 68.7 with
    both, 65.5 for a minimal server. Only glibc has malloc_trim: elsewhere this does nothing (on Windows
    ctypes.CDLL(None) raises TypeError, which once killed the server at start)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):  # musl has no malloc_trim
        ctypes.CDLL(None).malloc_trim(0)


async def serve(protocol_fds: tuple[int, int], early: EarlyStart) -> None:
    """Serve MCP over the client's pipes kept by the stdio guard, reading first what was read before the SDK
    (handshake)."""
    from io import BufferedReader, TextIOWrapper

    import anyio
    from mcp.server.stdio import stdio_server

    cfg = load_config()
    config = (f"config {cfg.path}" if cfg.file_stamp is not None
              else f"no config file (looked in: {config_search()})")
    sys.stderr.write(f"claude-hermes-bridge {VERSION}: python {sys.version.split()[0]} ({sys.executable}), "
                     f"mcp {dependency_version('mcp') or 'not installed'}, {config} "
                     f"({plural(len(cfg.problems), 'problem')})"
                     f"{'; initialize answered before the SDK was imported' if early.answered is not None else ''}\n")
    sys.stderr.flush()
    edge = McpEdge()
    server = build_server(cfg, edge)
    threading.Thread(target=recover_worktrees, args=(cfg,), name="recover worktrees", daemon=True).start()
    threading.Thread(target=start_queued, args=(cfg, JobStore.of(cfg)), name="the queue", daemon=True).start()
    threading.Thread(target=sweep_containers, args=(cfg,), name="leftover containers", daemon=True).start()
    threading.Thread(target=hermes_at_start, args=(cfg,), name="Hermes at start", daemon=True).start()
    release_freed_memory()
    lines = ProtocolLines(TextIOWrapper(BufferedReader(PrefixedInput(protocol_fds[0], early.read)), encoding="utf-8",
                                        errors="replace"))
    stdin = anyio.wrap_file(cast(Any, lines))
    stdout = anyio.wrap_file(cast(Any, AnswerFilter(TextIOWrapper(os.fdopen(protocol_fds[1], "wb"), encoding="utf-8"),
                                                    early)))
    lowlevel = edge.lowlevel(server)
    async with stdio_server(stdin=stdin, stdout=stdout) as (read_stream, write_stream):
        await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())


def serve_after_the_script(protocol_fds: tuple[int, int], early: EarlyStart) -> None:
    """Serve from a thread and let the script return: CPython keeps a script's whole syntax tree until the
    script ends (about 12 MB for this file), and a server's script would never end. The interpreter waits
    for the thread before it exits; Ctrl-C in a terminal ends the process at once (jobs live on in their
    supervisors)."""
    import anyio

    signal.signal(signal.SIGINT, signal.SIG_DFL)
    threading.Thread(target=anyio.run, args=(serve, protocol_fds, early), name="mcp-server").start()
