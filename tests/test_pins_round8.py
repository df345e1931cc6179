"""Issue 68 §1: one-line bugs the suite let pass (a mutation pass over the network, the sandbox, warm worktrees and
the standby), each pinned here by a test that fails with the bug written back in (tests/mutations.py lists them).
Plain functions, no MCP: the fast tier."""
import errno
import json
import os
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

import pytest
from test_worktrees import git, make_repo

from claude_hermes_bridge.drivers import hermes_launch
from claude_hermes_bridge.git_calls import GitFailed
from claude_hermes_bridge.jobs import JobStore
from claude_hermes_bridge.network import JobProxy, NetworkPolicy, host_rule, job_policy
from claude_hermes_bridge.sandbox import step_argv
from claude_hermes_bridge.taking import readied_mismatch
from claude_hermes_bridge.worktrees import (
    hand_over_worktree,
    ready_worktree,
    remove_readied_worktree,
    warm_worktree_refusal,
)
from conftest import require_sandbox
from harness import config_for


def test_a_malformed_network_allow_entry_leaves_the_whole_list_out_as_its_problem_says(tmp_path: Path) -> None:
    """config.py: the problem says network_allow is ignored; its valid entries must not stay allowed."""
    cfg = config_for(tmp_path, network_allow=["pypi.org", "not a host!"])
    assert cfg.network_allow == []
    assert any("network_allow is ignored until it is fixed" in problem for problem in cfg.problems), cfg.problems


def test_a_limited_jobs_hermes_gets_every_proxy_variable_and_no_no_proxy(tmp_path: Path, monkeypatch: Any) -> None:
    """drivers.py: the server's NO_PROXY kept would send the hosts it names around the job's proxy; network.py:
    curl reads http_proxy in lower case only."""
    monkeypatch.setenv("NO_PROXY", "internal.example,127.0.0.1")
    monkeypatch.setenv("no_proxy", "internal.example")
    cfg = config_for(tmp_path, hermes_home=str(tmp_path / "home"))
    proxy = JobProxy(job_policy("model-only", [], cfg.hermes_home_path))
    try:
        _, env = hermes_launch(cfg, ["/bin/true"], "marker", [], None, proxy=proxy)
    finally:
        proxy.close()
    assert "NO_PROXY" not in env and "no_proxy" not in env
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "all_proxy"):
        assert env[name] == f"http://127.0.0.1:{proxy.port}", name


class Echo(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = json.dumps({name.lower(): value for name, value in self.headers.items()}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_the_proxy_forwards_neither_its_own_credentials_nor_hop_headers_to_a_plain_http_host() -> None:
    """network.py: Proxy-Authorization (the job's proxy credentials) and Connection went on to the remote host."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    proxy = JobProxy(NetworkPolicy("allow-list", (host_rule(f"127.0.0.1:{port}"),), None))
    try:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as connection:
            connection.sendall(f"GET http://127.0.0.1:{port}/x HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                               "Proxy-Authorization: Basic c2VjcmV0\r\nConnection: keep-alive, X-Private\r\n"
                               "X-Private: kept-hop\r\nUser-Agent: test\r\n\r\n".encode())
            answer = b""
            while chunk := connection.recv(65536):
                answer += chunk
    finally:
        proxy.close()
        server.shutdown()
    seen = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert seen["user-agent"] == "test" and "proxy-authorization" not in seen, seen
    assert seen.get("connection") == "close", seen
    assert proxy.allowed_count == 1


TIOCSTI_TRY = """import errno, fcntl, os, sys, termios
os.setsid()
fcntl.ioctl(0, termios.TIOCSCTTY, 0)
try:
    fcntl.ioctl(0, termios.TIOCSTI, b"x")
    print("typed")
except OSError as exc:
    print(errno.errorcode[exc.errno])
"""


def test_typing_into_the_jobs_own_controlling_terminal_is_refused_by_seccomp(tmp_path: Path) -> None:
    """sandbox.py: seccomp's TIOCSTI rule, the defence where no private /dev/pts can be made: a terminal the job
    holds as its controlling one (where the kernel itself would let it type) is refused all the same."""
    require_sandbox()
    script = tmp_path / "type.py"
    script.write_text(TIOCSTI_TRY)
    master, follower = os.openpty()
    try:
        outside = subprocess.run([sys.executable, str(script)], stdin=follower, capture_output=True, text=True,
                                 timeout=30)
        inside = subprocess.run(step_argv([str(tmp_path)], [sys.executable, str(script)]), stdin=follower,
                                capture_output=True, text=True, timeout=30)
    finally:
        os.close(master)
        os.close(follower)
    assert outside.stdout.strip() == "typed", outside  # the kernel lets a session type into its own terminal
    assert inside.stdout.strip() == errno.errorcode[errno.EPERM], inside


def test_a_worktree_of_the_users_uncommitted_files_never_takes_one_readied_at_head() -> None:
    """worktrees.py: without the refusal an isolation_base="working-tree" job took a worktree readied at HEAD,
    silently without the user's uncommitted files."""
    assert warm_worktree_refusal({"from": "working-tree", "submodules": "none"}) == (
        "a worktree of your uncommitted files is made from them when its job starts")
    assert warm_worktree_refusal({"from": "head", "submodules": "none"}) is None


def test_a_readied_worktree_that_changed_is_not_handed_to_a_job(tmp_path: Path) -> None:
    """worktrees.py: a readied worktree with an untracked file or an edit was handed over: the job's patch
    carried files it never made."""
    repo = make_repo(tmp_path / "repo")
    store = JobStore.of(config_for(tmp_path, allowed_roots=[str(tmp_path)]))
    store.ensure()
    planned = {"repo": str(repo), "base": git(repo, "rev-parse", "HEAD"), "head": git(repo, "rev-parse", "HEAD"),
               "base_branch": "main", "subdir": "", "from": "head", "submodules": "none"}
    for change in ("untracked.txt", "a.txt"):
        readied = ready_worktree(store, f"standby-1-{'ab' * 6}", planned)
        Path(readied["path"], change).write_text("not the job's\n")
        try:
            with pytest.raises(GitFailed, match="no longer as it was made"):
                hand_over_worktree(store, readied, "20990101-000000-1")
        finally:
            remove_readied_worktree(store, f"standby-1-{'ab' * 6}")


def test_a_ready_file_naming_a_worktree_outside_the_jobs_folder_is_not_taken(tmp_path: Path) -> None:
    """launch.py: a ready.json (a job can write the jobs folder) whose worktree lies outside the jobs folder was
    taken as the job's worktree."""
    store = JobStore.of(config_for(tmp_path, allowed_roots=[str(tmp_path)]))
    elsewhere = tmp_path / "elsewhere" / f"standby-1-{'ab' * 6}"
    elsewhere.mkdir(parents=True)
    ready = {"worktree": {"path": str(elsewhere), "admin": str(tmp_path / "admin"), "identity": None}}
    assert readied_mismatch(store, ready) == "the worktree the warm Hermes readied is not as it made it"


def test_a_queued_job_cancelled_between_the_queues_look_and_its_start_is_not_started(
        tmp_path: Path, monkeypatch: Any) -> None:
    """job_queue.py: the queue looks at its records, a cancel lands, then the start: the job stays cancelled and
    no supervisor is spawned for it."""
    from claude_hermes_bridge import job_queue
    from claude_hermes_bridge.jobs import JobState
    from claude_hermes_bridge.launch import JobRequest, queue_job

    cfg = config_for(tmp_path, allowed_roots=[str(tmp_path)], max_running_jobs=2)
    store = JobStore.of(cfg)
    store.ensure()
    queued = queue_job(store, JobRequest(kind="run", task="x", cwd=str(tmp_path), max_turns=None, timeout_s=60,
                                         skills=[], toolsets=[]))
    looked = job_queue.occupancy(store)
    assert [record.id for record in looked[1]] == [queued.id]
    cancelled = store.read(queued.id)
    cancelled.change_state(JobState.CANCELLED)
    store.write(cancelled)  # the cancel, after the look
    spawned: list[str] = []
    monkeypatch.setattr(job_queue, "occupancy", lambda _store: looked)
    monkeypatch.setattr(job_queue, "spawn_supervisor", lambda _cfg, _store, record, _log: spawned.append(record.id))
    assert job_queue.start_queued_locked(cfg, store) == [] and spawned == []
    assert store.read(queued.id).state is JobState.CANCELLED


def test_a_standby_whose_settings_changed_since_no_longer_fits(tmp_path: Path, monkeypatch: Any) -> None:
    """standby.py: still_fits computes the key again from the config and Hermes as they are now (every hand-over
    test replaced it, so its body never ran against a real change)."""
    from claude_hermes_bridge import standby
    from claude_hermes_bridge.drivers import confinement_shape
    from harness import make_fake_hermes

    hermes = make_fake_hermes(tmp_path / "hermes-venv")
    values = {"allowed_roots": [str(tmp_path)], "hermes_exe": str(hermes), "hermes_home": str(tmp_path / "home")}
    cfg = config_for(tmp_path, **values)
    monkeypatch.setenv("HERMES_BRIDGE_CONFIG", str(cfg.path))
    shape = confinement_shape("ask", None)
    key = standby.launch_key(cfg, str(tmp_path), str(hermes), shape)
    held = standby.Standby(key, str(tmp_path), shape, "standby:x", cast(Any, None), 0.1)  # its Hermes: not looked at
    assert standby.still_fits(cfg, held)
    config_for(tmp_path, **values, kill_grace_s=3)  # the user changes a setting while it waits
    assert not standby.still_fits(cfg, held)


def test_registrations_next_line_gives_the_headless_command_that_works_per_host() -> None:
    """Issue 67: codex exec and gemini -p call no hermes tool without --approve-tools; next: says so, or gives the
    command that works; Claude Code's says how its headless run waits for the server on a busy machine."""
    from register_with_claude import next_step

    assert 'Headless: codex exec "..." calls the hermes tools' in next_step("codex", approve_tools=True)
    assert "register again with --approve-tools" in next_step("gemini", approve_tools=False)
    assert "MCP_CONNECTION_NONBLOCKING=false claude -p" in next_step("claude-code", approve_tools=False)
    assert "Headless" not in next_step("claude-desktop", approve_tools=False)


def test_where_the_proxy_cannot_tell_hermes_from_its_tools_hermes_start_up_hosts_are_not_asked_about(
        monkeypatch: Any) -> None:
    """Found by the Windows lane under the new default (network: ask): Hermes 0.19.0 sends CONNECT to
    openrouter.ai at its start with a model on 127.0.0.1, and where no /proc tells its process from its tools'
    the job opened by asking the user about it. Such a host is refused unasked there, said as Hermes' own."""
    from claude_hermes_bridge import network

    monkeypatch.setattr(network, "CAN_TELL_HERMES", False)
    asked: list[str] = []

    def ask(where: str) -> str:
        asked.append(where)
        return "deny"
    proxy = JobProxy(NetworkPolicy("ask", (), ("127.0.0.1", 9)), ask=ask)
    try:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as connection:
            connection.sendall(b"CONNECT openrouter.ai:443 HTTP/1.1\r\nHost: openrouter.ai:443\r\n\r\n")
            answer = connection.recv(65536)
    finally:
        proxy.close()
    assert answer.startswith(b"HTTP/1.1 403") and asked == [], answer
    assert proxy.refusals == ["openrouter.ai:443 (not on network_allow; Hermes' own request, not a tool's: not "
                              "asked about)"], proxy.refusals


def test_a_standby_whose_settings_changed_by_the_time_a_job_takes_it_refuses_the_job(
        tmp_path: Path, monkeypatch: Any) -> None:
    """standby.py: the take checks again that the standby still fits (the periodic check may not have run since
    the settings changed): it refuses the job, which starts cold, rather than serve it with the old settings."""
    from test_standby_handover import Waiting

    from claude_hermes_bridge import standby

    with Waiting(tmp_path, monkeypatch) as waiting:
        monkeypatch.setattr(standby, "still_fits", lambda _cfg, _held: not any(waiting.folder.glob("taken-*")))
        (waiting.folder / "ready.json").rename(waiting.folder / "taken-20261206-120000-abcdef.json")
        assert waiting.ended() == [None]
        assert not (waiting.folder / "serving-20261206-120000-abcdef.json").exists()


def test_a_job_launched_while_a_slot_is_free_and_jobs_wait_goes_behind_them(tmp_path: Path, monkeypatch: Any) -> None:
    """launch.py: a free slot goes to the oldest queued job, not to the launch that found it free."""
    from claude_hermes_bridge import job_queue, launch
    from claude_hermes_bridge.jobs import JobState
    from claude_hermes_bridge.launch import JobRequest, queue_job

    cfg = config_for(tmp_path, allowed_roots=[str(tmp_path)], max_running_jobs=1)
    store = JobStore.of(cfg)
    store.ensure()
    waiting = queue_job(store, JobRequest(kind="run", task="first", cwd=str(tmp_path), max_turns=None, timeout_s=60,
                                          skills=[], toolsets=[]))
    spawned: list[str] = []

    def spawn(_cfg: Any, _store: Any, record: Any, _log: Any, _program: str = "--supervise") -> bool:
        spawned.append(record.id)
        return True

    def start_at_once(_cfg: Any, _store: Any, request: Any) -> None:
        spawned.append(request.task)

    monkeypatch.setattr(job_queue, "spawn_supervisor", spawn)
    monkeypatch.setattr(launch, "start_job", start_at_once)
    record, _ = launch.launch_job(cfg, JobRequest(kind="run", task="second", cwd=str(tmp_path), max_turns=None,
                                                  timeout_s=60, skills=[], toolsets=[]))
    assert spawned == [waiting.id]
    assert record.state is JobState.QUEUED and store.read(waiting.id).state is JobState.STARTING


def test_a_job_dequeued_after_a_long_wait_is_starting_not_orphaned_before_its_supervisor_reports() -> None:
    """jobs.py: the start grace counts from the dequeue, not from the launch (it waited past START_GRACE_S)."""
    from claude_hermes_bridge.config import START_GRACE_S
    from claude_hermes_bridge.jobs import JobRecord, JobState, observe
    from claude_hermes_bridge.safe_io import machine_clock

    now = machine_clock()
    record = JobRecord(id="20261206-120000-1", state=JobState.STARTING, created_clock=now - START_GRACE_S * 4,
                       dequeued_clock=now - 1)
    assert observe(record, Path("/nonexistent-jobs")).state is JobState.STARTING
    record.dequeued_clock = None
    assert observe(record, Path("/nonexistent-jobs")).state is JobState.ORPHANED  # a launch that long ago: gone


@pytest.mark.posix("the fake hermes is a shell script")
def test_a_server_start_starts_the_queue_when_no_supervisor_is_left_to(bridge: Any) -> None:
    """mcp_edge.py: jobs left queued when every supervisor ended (the machine restarted) start with the next
    server, before any tool is called."""
    from claude_hermes_bridge.jobs import JobState
    from claude_hermes_bridge.launch import JobRequest, queue_job
    from harness import wait_until

    bridge.configure(max_running_jobs=1)
    from claude_hermes_bridge.config import load_config

    store = JobStore.of(load_config(bridge.tmp / "config.json"))
    store.ensure()
    queued = queue_job(store, JobRequest(kind="run", task="left queued", cwd=str(bridge.root), max_turns=None,
                                         timeout_s=60, skills=[], toolsets=[]))
    with bridge.client():
        wait_until(lambda: store.read(queued.id).state is not JobState.QUEUED or None, 30, "the queue to start")
