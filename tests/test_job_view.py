"""Issue 31: the job view, an MCP App. Its page and links as a host lists them (the official MCP client over
stdio), and the page itself in a real headless Chromium (Debian's, through Playwright) inside a test host
built from the MCP Apps SDK's own AppBridge (tests/view_host/host.js, bundled by esbuild at test time), whose
tool calls go through the MCP client to the bridge: the handshake, a running job and its question with the
whole command and its deadline, real clicks on Allow, Deny, Cancel, Merge and Discard, the buttons disabled
when the host cannot pass tool calls, the default CSP in force, and a screenshot kept in test-artifacts/."""
import functools
import http.server
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_real_hermes import write_hermes_home
from test_worktrees import git, make_repo

from claude_hermes_bridge.bodies import VIEW_TOKEN_S, ViewTokens
from claude_hermes_bridge.jobs import JobState
from claude_hermes_bridge.mcp_edge import JOB_VIEW_FILE, JOB_VIEW_URI
from conftest import require_component
from harness import (
    APP_ONLY_TOOLS,
    APPS_CAPABILITIES,
    E2E,
    REAL_HERMES_VERSIONS,
    REPO,
    Bridge,
    BridgeClient,
    listed_tools,
    refused,
    wait_until,
)
from scripted_model import ScriptedModel

pytestmark = [pytest.mark.e2e, pytest.mark.posix("the view host is installed by tests/install_e2e.sh, a bash script")]

CHROMIUM = Path(shutil.which("chromium") or "/usr/bin/chromium")
ESBUILD = E2E / "view-host" / "node_modules" / ".bin" / "esbuild"
ARTIFACTS = REPO / "test-artifacts"


@pytest.fixture(scope="module")
def host_url(tmp_path_factory) -> Iterator[str]:
    """The test host, bundled and served on 127.0.0.1 (a port of its own)."""
    esbuild = require_component(ESBUILD, "esbuild and the MCP Apps SDK in .e2e/view-host")
    folder = tmp_path_factory.mktemp("view-host")
    shutil.copy(REPO / "tests" / "view_host" / "host.html", folder)
    subprocess.run([str(esbuild), str(REPO / "tests" / "view_host" / "host.js"), "--bundle", "--format=iife",
                    "--log-level=error", f"--outfile={folder / 'host.bundle.js'}"], check=True, timeout=60,
                   env={**os.environ, "NODE_PATH": str(E2E / "view-host" / "node_modules")})
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *_: None  # type: ignore[attr-defined]
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/host.html"
    httpd.shutdown()


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """One Chromium for the module's tests on a worker: a launch costs a few CPU-seconds."""
    require_component(CHROMIUM, "Debian's chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture
def browser(chromium: Any) -> Iterator[Any]:
    """A browser context of the test's own (its storage, its pages), closed after it: no page of an earlier test
    polls its closed client."""
    context = chromium.new_context(viewport={"width": 800, "height": 700})
    yield context
    context.close()


def raw_call(client: BridgeClient, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool's whole result as a host gets it (text, _meta), as JSON."""
    result = client.portal.call(client.session.call_tool, tool, arguments)
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


class View:
    """The job view open in the test host, for one job's result."""

    def __init__(self, browser: Any, host_url: str, client: BridgeClient, result: dict[str, Any],
                 arguments: dict[str, Any], server_tools: bool = True, strip_meta: bool = False):
        """strip_meta: the host hands the view results without _meta, as Cursor does."""
        self.page = browser.new_page()
        self.console: list[str] = []
        self.page.on("console", lambda message: self.console.append(message.text))

        def host_call(name: str, args: dict[str, Any]) -> dict[str, Any]:
            called = raw_call(client, name, **args)
            return {k: v for k, v in called.items() if k != "_meta"} if strip_meta else called
        self.page.expose_function("hostCallTool", host_call)
        if strip_meta:
            result = {k: v for k, v in result.items() if k != "_meta"}
        self.page.goto(host_url)
        page_html = client.portal.call(client.session.read_resource, JOB_VIEW_URI).contents[0].text
        self.page.evaluate("([html, input, result, tools]) => window.openView(html, input, result, tools)",
                           [page_html, arguments, result, server_tools])
        self.page.wait_for_function("window.viewInitialized === true", timeout=15000)
        self.frame = self.page.frame_locator("#view")

    def text(self, selector: str) -> str:
        return self.frame.locator(selector).inner_text(timeout=15000)

    def wait_status(self, status: str, timeout: float = 30) -> None:
        self.frame.locator(f"#status.{status}").wait_for(timeout=timeout * 1000)

    def click(self, selector: str) -> None:
        self.frame.locator(selector).click(timeout=15000)

    def screenshot(self, name: str) -> None:
        ARTIFACTS.mkdir(exist_ok=True)
        self.page.screenshot(path=str(ARTIFACTS / f"{name}.png"))


def asking_bridge(bridge: Bridge) -> BridgeClient:
    bridge.configure(approvals="ask", approval_timeout_s=120, hermes_driver="acp")
    client = bridge.client()
    client.params.env = dict(bridge.env, FAKE_HERMES_ACP="1")
    return client


# ------------------------------------------------------------------ what a host lists (no browser)
@pytest.mark.sdk_lines
def test_the_page_and_the_links_are_what_an_apps_host_reads_and_app_only_tools_say_so(bridge):
    with bridge.client() as client:
        resources = client.portal.call(client.session.list_resources).resources
        page = client.portal.call(client.session.read_resource, JOB_VIEW_URI).contents[0]
        result = raw_call(client, "hermes_run", task="!sleep=0 hello", wait_s=20)
    meta = {tool["name"]: tool.get("_meta") or {} for tool in listed_tools(bridge, APPS_CAPABILITIES)}
    for name in ("hermes_run", "hermes_resume", "hermes_status"):
        assert meta[name]["ui"]["resourceUri"] == JOB_VIEW_URI and meta[name]["ui/resourceUri"] == (
            JOB_VIEW_URI)
    for name in ("hermes_view_job", "hermes_view_patch", "hermes_view_answer", "hermes_view_steer"):
        assert meta[name]["ui"]["visibility"] == ["app"]
    assert "visibility" not in meta["hermes_approve"].get("ui", {})
    listed = [r.model_dump(mode="json", by_alias=True) for r in resources]
    assert [(r["uri"], r["mimeType"]) for r in listed] == [(JOB_VIEW_URI, "text/html;profile=mcp-app")]
    read = page.model_dump(mode="json", by_alias=True)
    assert read["mimeType"] == "text/html;profile=mcp-app" and read["text"] == JOB_VIEW_FILE.read_text()
    assert "http://" not in page.text.replace("http://www.w3.org", "") and "https://" not in page.text
    facts = result["_meta"]["viewFacts"]
    assert result.get("structuredContent") is None  # a host that has it hands the model only that
    assert facts["job_id"] in result["content"][0]["text"] and facts["status"] == "ok"
    assert isinstance(result["_meta"]["viewToken"], str)


@pytest.mark.parametrize("declared", ["extensions", "experimental"])
@pytest.mark.sdk_lines
def test_app_only_tools_are_offered_only_to_a_client_that_declared_mcp_apps(bridge, declared):
    """Issue 49: Gemini CLI offered its model the view's tools, whatever their visibility."""
    apps = APPS_CAPABILITIES.replace('"extensions"', f'"{declared}"')
    assert {tool["name"] for tool in listed_tools(bridge, apps)} >= APP_ONLY_TOOLS
    for capabilities in ("{}", '{"extensions":{"io.modelcontextprotocol/tasks":{}}}', '{"elicitation":{}}'):
        names = {tool["name"] for tool in listed_tools(bridge, capabilities)}
        assert "hermes_run" in names and not names & APP_ONLY_TOOLS, capabilities
    with bridge.client() as client:  # declares no MCP Apps: not listed, and still reachable by the view's host
        assert not {t.name for t in client.portal.call(client.session.list_tools).tools} & APP_ONLY_TOOLS
        job_id = raw_call(client, "hermes_run", task="!sleep=0 hi", wait_s=20)["_meta"]["viewFacts"]["job_id"]
        assert raw_call(client, "hermes_view_job", job_id=job_id)["_meta"]["viewFacts"]["status"] == "ok"


@pytest.mark.sdk_lines
def test_an_answer_without_the_views_token_is_refused_and_the_question_still_waits(bridge):
    with asking_bridge(bridge) as client:
        job_id = client.call("hermes_run", task="!ask=touch+asked.txt", wait_s=0).field("JOB_ID")
        question = wait_until(lambda: r if (r := raw_call(client, "hermes_view_job", job_id=job_id))[
            "_meta"]["viewFacts"]["questions"] else None, 30, "the question")
        approval_id = question["_meta"]["viewFacts"]["questions"][0]["id"]
        forged = client.call("hermes_view_answer", job_id=job_id, approval_id=approval_id, decision="allow",
                             token="made-up")
        reused = question["_meta"]["viewToken"]
        first = client.call("hermes_view_answer", job_id=job_id, approval_id=approval_id, decision="deny",
                            token=reused)
        again = client.call("hermes_view_answer", job_id=job_id, approval_id=approval_id, decision="allow",
                            token=reused)
        final = client.wait_final(job_id)
    assert refused(forged) and "no valid one-time token" in forged.text
    assert not first.is_error
    assert refused(again) and "no valid one-time token" in again.text  # one time
    assert [(d["decision"], d["by"]) for d in bridge.record(job_id).decisions] == [("deny", "the user (job view)")]
    assert final.field("STATUS") == "ok" and not (bridge.root / "asked.txt").exists()


@pytest.mark.posix("the fake Hermes' shell directive")
def test_a_network_question_is_in_the_view_and_its_answer_there_lets_the_request_through(bridge):
    """Issue 48, network: ask: a tool's request to an unlisted host is a question among the view's facts, and
    the view's answer (with its token) decides it."""
    from test_network import network_question

    with network_question(bridge) as (port, script), bridge.client() as client:
        job_id = client.call("hermes_run", task=f"!shell={script}", wait_s=0).field("JOB_ID")
        shown = wait_until(lambda: r if (r := raw_call(client, "hermes_view_job", job_id=job_id))[
            "_meta"]["viewFacts"]["questions"] else None, 60, "the question")
        question = shown["_meta"]["viewFacts"]["questions"][0]
        answered = client.call("hermes_view_answer", job_id=job_id, approval_id=question["id"], decision="allow",
                               token=shown["_meta"]["viewToken"])
        final = client.wait_final(job_id)
    assert question["what"].startswith(f"connect to 127.0.0.1:{port}, a host not on network_allow. Allowing it lets "
                                       "the job send that host anything"), question
    assert question["network"] is True
    assert not answered.is_error, answered.text
    assert final.field("STATUS") == "ok" and (bridge.root / "code.txt").read_text() == "200"
    assert [(d["decision"], d["by"]) for d in bridge.record(job_id).decisions] == [("allow", "the user (job view)")]


@pytest.mark.sdk_lines
def test_a_views_token_answers_only_the_job_and_the_question_it_was_shown_with(bridge):
    """Issue 37: a token issued with job A's result must not answer job B's question as "the user"."""
    with asking_bridge(bridge) as client:
        jobs = [client.call("hermes_run", task=f"!ask=touch+{name}.txt", wait_s=0).field("JOB_ID") for name in "ab"]
        def asked(job_id: str) -> Any:
            result = raw_call(client, "hermes_view_job", job_id=job_id)
            return result if result["_meta"]["viewFacts"]["questions"] else None
        polls = [wait_until(functools.partial(asked, job_id), 30, "the question") for job_id in jobs]
        b_question = polls[1]["_meta"]["viewFacts"]["questions"][0]["id"]
        crossed = client.call("hermes_view_answer", job_id=jobs[1], approval_id=b_question, decision="allow",
                              token=polls[0]["_meta"]["viewToken"])
        answered = client.call("hermes_view_answer", job_id=jobs[1], approval_id=b_question, decision="deny",
                               token=polls[1]["_meta"]["viewToken"])
        client.call("hermes_cancel", job_id=jobs[0])
        client.wait_final(jobs[1])
    assert refused(crossed) and "for this job and question" in crossed.text, crossed.text
    assert not answered.is_error, answered.text
    assert [(d["decision"], d["by"]) for d in bridge.record(jobs[1]).decisions] == [("deny", "the user (job view)")]


def test_a_views_token_expires_and_is_good_only_for_the_questions_it_was_issued_with(monkeypatch):
    tokens = ViewTokens()
    clock = [1000.0]
    monkeypatch.setattr("claude_hermes_bridge.bodies.time.monotonic", lambda: clock[0])
    fresh, stale, other = (tokens.issue("20261203-000000-1", ["1-abcdef"]) for _ in range(3))
    assert not tokens.redeem(other, "20261203-000000-1", "2-abcdef")  # not shown with it (and now used up)
    assert tokens.redeem(fresh, "20261203-000000-1", "1-abcdef")
    clock[0] += VIEW_TOKEN_S + 1
    assert not tokens.redeem(stale, "20261203-000000-1", "1-abcdef")


# ------------------------------------------------------------------ in a real browser
@pytest.mark.parametrize("decision", ["allow", "deny"])
@pytest.mark.sdk_lines
def test_the_view_shows_the_question_and_a_click_reaches_hermes(bridge, browser, host_url, decision):
    with asking_bridge(bridge) as client:
        arguments = {"task": "!ask=touch+asked.txt", "wait_s": 0}
        started = raw_call(client, "hermes_run", **arguments)
        view = View(browser, host_url, client, started, arguments)
        view.frame.locator(".question").wait_for(timeout=30000)
        question = view.text(".question")
        view.wait_status("needs_approval")
        steer = view.frame.locator("#steer textarea")
        steer_while_asked = (steer.is_disabled(), steer.get_attribute("placeholder"))
        if decision == "allow":
            view.screenshot("job-view-question")
        view.click(f".question button[data-decision={decision}]")
        view.wait_status("ok")
        answered = view.text("#questions li")
        context = view.page.evaluate("window.modelContext")
    job_id = started["_meta"]["viewFacts"]["job_id"]
    assert "run `touch asked.txt` (dangerous)" in question and "Hermes denies this by itself at" in question
    assert steer_while_asked == (True, "Answer Hermes' question above first: it waits on it, and takes no steer "
                                       "meanwhile"), steer_while_asked  # issue 49: a steer would be refused
    assert answered.startswith(f"run `touch asked.txt` (dangerous): {decision} by the user (job view) at "), answered
    assert [(d["decision"], d["by"]) for d in bridge.record(job_id).decisions] == [(decision, "the user (job view)")]
    assert (bridge.root / "asked.txt").exists() == (decision == "allow")
    assert f"the user chose {decision}" in context[0]["content"][0]["text"]
    assert not [line for line in view.console if "Content Security Policy" in line], view.console


@pytest.mark.sdk_lines
def test_a_host_that_strips_meta_still_shows_the_job_and_the_persons_click_answers(bridge, browser, host_url):
    """Issue 49: Cursor hands the view a tool result without _meta, where the facts and the token were."""
    with asking_bridge(bridge) as client:
        arguments = {"task": "!ask=touch+asked.txt", "wait_s": 0}
        started = raw_call(client, "hermes_run", **arguments)
        view = View(browser, host_url, client, started, arguments, strip_meta=True)
        view.frame.locator(".question").wait_for(timeout=30000)
        assert "run `touch asked.txt` (dangerous)" in view.text(".question")
        view.click(".question button[data-decision=allow]")
        view.wait_status("ok")
        calls = view.page.evaluate("window.calls")
    job_id = started["_meta"]["viewFacts"]["job_id"]
    assert view.text("#job") == job_id and calls[0] == "hermes_view_job" and "hermes_view_answer" in calls
    assert [(d["decision"], d["by"]) for d in bridge.record(job_id).decisions] == [("allow", "the user (job view)")]
    assert (bridge.root / "asked.txt").exists()


def test_a_running_job_shows_its_current_tool_and_cancel_stops_it_and_the_polling(bridge, browser, host_url):
    with bridge.client() as client:
        arguments = {"task": "!tool-sleep=60", "wait_s": 0}
        started = raw_call(client, "hermes_run", **arguments)
        view = View(browser, host_url, client, started, arguments)
        view.frame.locator("dd", has_text="sleep 60").wait_for(timeout=30000)  # polled: the current tool
        view.click("#actions button")
        view.wait_status("cancelled")
        polls = view.page.evaluate("window.calls").count("hermes_view_job")
        view.page.wait_for_timeout(5000)  # two and a half poll periods
        polls_after = view.page.evaluate("window.calls").count("hermes_view_job")
    assert bridge.record(started["_meta"]["viewFacts"]["job_id"]).state is JobState.CANCELLED
    assert polls >= 1 and polls_after == polls  # it polled while the job ran, and stopped once it was final


def test_a_running_job_shows_its_changed_files_so_far_and_its_spend_against_its_budgets(bridge, browser, host_url):
    with bridge.client() as client:
        arguments = {"task": "!calls=3 !write=notes.txt:x !sleep=60", "wait_s": 0, "max_tokens": 100000,
                     "max_turns": 50}
        started = raw_call(client, "hermes_run", **arguments)
        view = View(browser, host_url, client, started, arguments)
        view.frame.locator("pre", has_text="+ notes.txt").wait_for(timeout=30000)
        changed = view.text("#facts")
        view.frame.locator(".budget[data-what=tokens]", has_text="3,300 of").wait_for(timeout=30000)
        budgets = view.text("#budgets")
        width = view.frame.locator(".budget[data-what=tokens] .bar > span").evaluate("bar => bar.style.width")
        view.screenshot("job-view-running")
        client.call("hermes_cancel", job_id=started["_meta"]["viewFacts"]["job_id"])
    assert "changed so far\n1 created, 0 modified, 0 deleted" in changed, changed
    assert "3,300 of 100,000 tokens (3 % of the budget)" in budgets and "3 of 50 turns (6 % of the budget)" in budgets
    assert width == "3%"


@pytest.mark.sdk_lines
def test_the_person_steers_a_running_job_from_the_view(bridge, browser, host_url):
    bridge.configure(hermes_driver="acp")
    client = bridge.client()
    client.params.env = dict(bridge.env, FAKE_HERMES_ACP="1")
    with client:
        arguments = {"task": "work !tool-sleep=6", "wait_s": 0}
        started = raw_call(client, "hermes_run", **arguments)
        job_id = started["_meta"]["viewFacts"]["job_id"]
        view = View(browser, host_url, client, started, arguments)
        view.frame.locator("dd", has_text="sleep 6").wait_for(timeout=30000)
        view.frame.locator("#steer textarea").fill("keep <b>the</b> API")
        view.click("#steer button[data-action=steer]")
        view.frame.locator("#steer li", has_text="taken by Hermes").wait_for(timeout=30000)
        listed = view.text("#steer li")
        bold = view.frame.locator("#steer b").count()
        left = view.frame.locator("#steer textarea").input_value()
        context = view.page.evaluate("window.modelContext")
        final = client.wait_final(job_id)
    assert '"keep <b>the</b> API" -> taken by Hermes' in listed and "by the user (job view)" in listed
    assert bold == 0 and left == ""
    assert [s["by"] for s in bridge.record(job_id).steers] == ["the user (job view)"]
    assert "steered=keep <b>the</b> API" in final.text
    assert "the user steered Hermes (now): keep <b>the</b> API" in context[0]["content"][0]["text"]


@pytest.mark.parametrize(("action", "strip_meta"), [("Merge", False), ("Discard", False), ("Merge", True)])
@pytest.mark.sdk_lines
def test_a_finished_worktree_job_is_merged_or_discarded_from_the_view(bridge, browser, host_url, action, strip_meta):
    repo = make_repo(bridge.root / "repo")
    with bridge.client() as client:
        arguments = {"task": "!write=b.txt:bee", "cwd": str(repo), "isolation": "worktree", "wait_s": 30}
        done = raw_call(client, "hermes_run", **arguments)
        view = View(browser, host_url, client, done, arguments, strip_meta=strip_meta)  # Cursor strips _meta
        view.frame.locator("details.file[data-path='b.txt']").wait_for(timeout=15000)
        assert view.text("#review h1") == "The change: 1 file, +1 \u22120"
        view.click(f"#actions button[data-action={action.lower()}]")
        # both ask first, naming what they change (issue 49: Merge too), and "No, go back" goes back
        confirm = view.text(".confirm")
        view.click(".confirm button[data-action=back]")
        view.click(f"#actions button[data-action={action.lower()}]")
        view.click(f".confirm button[data-action=confirm-{action.lower()}]")
        view.frame.locator("#landing strong").wait_for(timeout=30000)
        landing = view.text("#landing")
        context = view.page.evaluate("window.modelContext")
    assert (repo / "b.txt").exists() == (action == "Merge")
    assert bool(git(repo, "branch", "--list", "hermes-bridge/*")) == (action == "Merge")  # a merge keeps it
    job_id = done["_meta"]["viewFacts"]["job_id"]
    assert (f"Merge this job's work (branch hermes-bridge/{job_id}) into {repo}, on the branch checked out there?"
            in confirm if action == "Merge" else "Discard this job's work?" in confirm), confirm
    if action == "Merge":
        assert landing.startswith("Merged at ") and "merged into main (" in landing, landing
    else:
        assert landing.startswith("Discarded at ") and "were removed" in landing, landing
    assert f"pressed {action}" in context[0]["content"][0]["text"]


def script_job(bridge: Bridge, repo: Path, name: str, script: str) -> dict[str, Any]:
    """hermes_run arguments for a worktree job of repo whose Hermes runs script (sh) in its worktree."""
    path = bridge.tmp / f"{name}.sh"
    path.write_text(script)
    return {"task": f"!shell={path}", "cwd": str(repo), "isolation": "worktree", "wait_s": 30}


def test_the_view_shows_each_file_of_the_change_as_what_it_is_with_its_lines(bridge, browser, host_url):
    repo = make_repo(bridge.root / "repo", {"edit.txt": "one\ntwo\nthree\n", "gone.txt": "bye\n",
                                            "old-name.txt": "".join(f"line {n}\n" for n in range(20))})
    arguments = script_job(bridge, repo, "kinds", "printf 'one\\nTWO\\nthree\\nfour\\n' > edit.txt\nrm gone.txt\n"
                           "mv old-name.txt new-name.txt\nprintf 'fresh\\n' > added.txt\n"
                           "head -c 2100 /dev/zero > blob.bin\n")
    with bridge.client() as client:
        done = raw_call(client, "hermes_run", **arguments)
        view = View(browser, host_url, client, done, arguments)
        files = view.frame.locator("details.file")
        files.nth(4).wait_for(timeout=15000)
        kinds = {files.nth(n).get_attribute("data-path"): files.nth(n).get_attribute("data-kind") for n in range(5)}
        edit = view.frame.locator("details.file[data-path='edit.txt'] tr:not(.head)")
        rows = [[edit.nth(n).locator("td").nth(c).inner_text() for c in range(4)] for n in range(edit.count())]
        summaries = {path: view.text(f"details.file[data-path='{path}'] summary") for path in kinds}
        binary = view.text("details.file[data-path='blob.bin']")
        heading = view.text("#review h1")
        view.screenshot("job-view-review")
    assert kinds == {"added.txt": "added", "blob.bin": "added", "edit.txt": "modified", "gone.txt": "deleted",
                     "new-name.txt": "renamed"}
    assert rows == [["1", "1", "", "one"], ["2", "", "-", "two"], ["", "2", "+", "TWO"], ["3", "3", "", "three"],
                    ["", "4", "+", "four"]]
    assert "old-name.txt \u2192 new-name.txt" in summaries["new-name.txt"]
    assert "Binary file, 2.1 KB" in binary and "binary" in summaries["blob.bin"]
    assert "+2 \u22121" in summaries["edit.txt"]
    assert heading == "The change: 5 files, +3 \u22122"  # a renamed file is one file, as the patch shows it


def test_a_change_of_5000_lines_shows_its_first_page_and_pages_on(bridge, browser, host_url):
    repo = make_repo(bridge.root / "repo")
    arguments = script_job(bridge, repo, "big", "for n in 0 1 2 3 4 5 6 7 8 9; do seq 1 500 | sed \"s/^/$n: /\" "
                           "> part$n.txt; done\n")
    with bridge.client() as client:
        done = raw_call(client, "hermes_run", **arguments)
        view = View(browser, host_url, client, done, arguments)
        more = view.frame.locator("#review button[data-action=more-files]")
        more.wait_for(timeout=15000)
        first_page = (view.frame.locator("details.file").count(), view.frame.locator("tr.add").count(),
                      more.inner_text())
        merge = view.frame.locator("#actions button[data-action=merge]")
        merge_before = (merge.is_disabled(), merge.get_attribute("title"))  # issue 49: not before every file
        hidden = view.text("details.file[data-path='part0.txt'] tr.note")
        for shown in (8, 10):  # a hunk shows 400 lines: four files fill a page of 1,500
            more.click(timeout=15000)
            view.frame.locator("details.file").nth(shown - 1).wait_for(timeout=15000)
        view.frame.locator("#review h1").wait_for()
        left = more.count()
        merge_after = merge.is_disabled()
        paths = [view.frame.locator("details.file").nth(n).get_attribute("data-path") for n in range(10)]
        total = view.frame.locator("details.file").count()
        calls = view.page.evaluate("window.calls")
    assert first_page == (4, 1600, "Show more files (4 of 10 shown)"), first_page
    assert merge_before == (True, "Shown once every file of the change is shown above") and merge_after is False
    assert hidden.startswith("\u2026 100 more lines of this hunk not shown"), hidden
    assert total == 10 and left == 0 and paths == [f"part{n}.txt" for n in range(10)]
    assert calls.count("hermes_view_patch") == 3


def test_what_the_patch_holds_is_shown_as_text_and_runs_nothing(bridge, browser, host_url):
    repo = make_repo(bridge.root / "repo")
    hostile = ("<script>window.pwned = 1</script>\n<img src=x onerror=\"window.pwned = 2\">\n"
               "access = \u202e \u2066admin\u2069 \u2066// check\u200b\n")
    (bridge.tmp / "hostile.txt").write_text(hostile)
    arguments = script_job(bridge, repo, "hostile", f"cp {bridge.tmp / 'hostile.txt'} page.html\n")
    with bridge.client() as client:
        done = raw_call(client, "hermes_run", **arguments)
        view = View(browser, host_url, client, done, arguments)
        view.frame.locator("details.file[data-path='page.html']").wait_for(timeout=15000)
        code = view.frame.locator("details.file td.code")
        lines = [code.nth(n).inner_text() for n in range(code.count())]
        frame = next(f for f in view.page.frames if f != view.page.main_frame)
        dom = frame.evaluate("[window.pwned === undefined, document.querySelectorAll('img').length, "
                             "document.querySelectorAll('script').length]")
    assert lines == ["<script>window.pwned = 1</script>", '<img src=x onerror="window.pwned = 2">',
                     "access = \\u202e \\u2066admin\\u2069 \\u2066// check\\u200b"]
    assert dom == [True, 0, 1]  # no image made, and the view's own script the only one
    assert not [line for line in view.console if "Content Security Policy" in line], view.console


def test_a_merge_that_conflicts_shows_its_paths_and_changes_nothing(bridge, browser, host_url):
    repo = make_repo(bridge.root / "repo", {"a.txt": "one\n", "b.txt": "same\n"})
    with bridge.client() as client:
        arguments = {"task": "!write=a.txt:the-job", "cwd": str(repo), "isolation": "worktree", "wait_s": 30}
        done = raw_call(client, "hermes_run", **arguments)
        (repo / "a.txt").write_text("the user's\n")
        git(repo, "commit", "-qam", "the user's own change meanwhile")
        view = View(browser, host_url, client, done, arguments)
        view.frame.locator("details.file[data-path='a.txt']").wait_for(timeout=15000)
        view.click("#actions button[data-action=merge]")
        view.click(".confirm button[data-action=confirm-merge]")
        view.frame.locator("#landing.refused").wait_for(timeout=30000)
        landing = view.text("#landing")
        buttons = view.text("#actions")
        view.screenshot("job-view-conflict")
    assert landing.startswith("Merge did not happen.") and "conflicts with the main tree in 1 path: a.txt" in landing
    assert (repo / "a.txt").read_text() == "the user's\n" and "Merge" in buttons  # still there to try again


def test_without_tool_calls_from_the_host_the_buttons_are_disabled_and_the_view_says_so(bridge, browser,
                                                                                           host_url):
    with asking_bridge(bridge) as client:
        arguments = {"task": "!ask=touch+asked.txt", "wait_s": 0}
        job_id = client.call("hermes_run", **arguments).field("JOB_ID")
        asking = wait_until(lambda: r if (r := raw_call(client, "hermes_status", job_id=job_id, wait_s=5))[
            "_meta"]["viewFacts"]["questions"] else None, 30, "the question")
        view = View(browser, host_url, client, asking, arguments, server_tools=False)
        view.frame.locator(".question").wait_for(timeout=15000)
        buttons = view.frame.locator("button")
        disabled = [buttons.nth(n).is_disabled() for n in range(buttons.count())]
        hint = view.text("#hint")
        calls = view.page.evaluate("window.calls")
        client.call("hermes_cancel", job_id=job_id)
    assert len(disabled) == 5 and all(disabled)  # Allow, Allow for this job, Deny, Steer, Cancel
    assert "answer in the chat" in hint and calls == []


def test_the_default_csp_is_in_force_in_the_view(bridge, browser, host_url):
    with bridge.client() as client:
        arguments = {"task": "!sleep=0 done", "wait_s": 20}
        done = raw_call(client, "hermes_run", **arguments)
        view = View(browser, host_url, client, done, arguments)
        view.wait_status("ok")
        frame = next(f for f in view.page.frames if f != view.page.main_frame)
        blocked = frame.evaluate(f"fetch('{host_url}').then(() => 'fetched', () => 'blocked')")
    assert blocked == "blocked"
    assert any("Content Security Policy" in line and "connect-src" in line for line in view.console), view.console


def test_a_click_on_allow_reaches_the_real_hermes_over_acp(bridge, browser, host_url):
    """Once with the real Hermes 0.22.2: the view's Allow lets it run the command it asked about."""
    exe = require_component(REAL_HERMES_VERSIONS["0.22.2"], "the real Hermes CLI 0.22.2")
    (bridge.root / "build").mkdir()
    with ScriptedModel(bridge.tmp) as model:
        write_hermes_home(bridge.tmp / "real-home", model.base_url)
        bridge.configure(hermes_exe=str(exe), hermes_home=str(bridge.tmp / "real-home"), kill_grace_s=5,
                         approvals="ask", approval_timeout_s=60, hermes_driver="acp")
        with bridge.client() as client:
            arguments = {"task": "Clean up.\nRUN: rm -rf ./build && echo removed", "wait_s": 0}
            started = raw_call(client, "hermes_run", **arguments)
            view = View(browser, host_url, client, started, arguments)
            view.frame.locator(".question").wait_for(timeout=90000)
            assert "rm -rf ./build" in view.text(".question")
            view.click(".question button[data-decision=allow]")
            view.wait_status("ok", timeout=120)
    assert not (bridge.root / "build").exists()
    assert bridge.record(started["_meta"]["viewFacts"]["job_id"]).decisions[0]["by"] == "the user (job view)"


def test_the_view_shows_what_the_sandbox_refused_put_back_and_what_runs_later(bridge, browser, host_url):
    """Issue 47: the block's SANDBOX, SANDBOX_DENIED, READ_ONLY and RUNS_LATER as the view's rows (the job's write
    to .git is refused by its mount namespace: nothing to put back)."""
    from conftest import require_sandbox

    require_sandbox()
    repo = make_repo(bridge.root / "repo")
    script = bridge.tmp / "contained.sh"
    script.write_text(f"echo x > {bridge.tmp}/outside.txt\nprintf '#!/bin/sh\\n' > .git/hooks/pre-commit\n"
                      "echo 'export X=1' > .envrc\n")
    with bridge.client() as client:
        arguments = {"task": f"!shell={script}", "cwd": str(repo), "wait_s": 30}
        result = raw_call(client, "hermes_run", **arguments)
        view = View(browser, host_url, client, result, arguments)
        view.wait_status("ok")
        facts = view.text("#facts")
    assert "sandbox\nwrites limited to" in facts, facts
    assert f"refused by the sandbox\n{bridge.tmp}/outside.txt" in facts, facts
    assert f"read-only\n{repo / '.git'}" in facts and "a `git commit` in this job is refused" in facts, facts
    assert "runs later\nread before you open the folder or run anything there: .envrc (direnv, run on entering the " \
           "folder)" in facts, facts
