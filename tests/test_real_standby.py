"""Issue 39 with the real Hermes 0.19.0 and 0.22.2 over ACP and a scripted model: the next job in a folder takes
the warm Hermes and its warm-up session, runs its tools in its own folder with its own temporary folder, is
answered and resumable; what Hermes' store keeps of a warm-up; and the faults (a standby killed while it
waits, one whose settings changed, one whose server left while it prepared) with the real Hermes 0.22.2, and one
whose Hermes is frozen with both."""
import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import psutil
import pytest
from test_real_hermes import assert_turn_ended, finish, write_hermes_home
from test_real_network import served
from test_standby import gone, hermes_of, ready, waiting_for

from claude_hermes_bridge.drivers import project_cache
from claude_hermes_bridge.late_standby import LATE_PLACE, RECORDING_PROMPT
from claude_hermes_bridge.standby import AHEAD_RECORD, being_readied
from conftest import require_component, require_sandbox
from harness import REAL_ACP_VERSIONS, REAL_HERMES_VERSIONS, Bridge, live_standbys, wait_gone, wait_until
from scripted_model import ScriptedModel

pytestmark = [pytest.mark.e2e,
              pytest.mark.posix("the real Hermes installs here are Linux ones; the Windows lane has its own")]


@pytest.fixture(params=REAL_ACP_VERSIONS, ids=lambda version: f"hermes-{version}")
def warm(bridge: Bridge, request: pytest.FixtureRequest) -> Any:
    exe = require_component(REAL_HERMES_VERSIONS[request.param], f"the real Hermes CLI {request.param}")
    home = bridge.tmp / "real-home"
    with ScriptedModel(bridge.tmp) as model:
        write_hermes_home(home, model.base_url)
        bridge.configure(hermes_exe=str(exe), hermes_home=str(home), kill_grace_s=5, hermes_driver="acp",
                         approvals="yolo", warm_start=True)
        with bridge.client() as client:
            yield bridge, model, client, home, request.param


def sessions(home: Path) -> dict[str, int]:
    """Hermes' own session list: each session and how many messages it holds."""
    with sqlite3.connect(f"file:{home / 'state.db'}?mode=ro", uri=True) as db:
        return {row[0]: row[1] for row in db.execute(
            "SELECT s.id, (SELECT COUNT(*) FROM messages m WHERE m.session_id = s.id) FROM sessions s")}


def test_the_next_job_takes_the_warm_hermes_and_runs_in_its_own_folder(warm: Any) -> None:
    bridge, model, client, home, version = warm
    first = finish(client, client.call("hermes_run", task="First.\nRUN: pwd", wait_s=45), timeout=180)
    assert_turn_ended(first)
    assert first.field("START").startswith("cold ("), first.text
    standby = ready(bridge, timeout=120)
    late = standby["folder"] == LATE_PLACE  # bound late: no warm-up session, which would need a folder
    waiting_for(bridge, bridge.root / "elsewhere", slots="standby-any", timeout=120)  # its recording's session gone
    before = sessions(home)
    warm_ups = {name for name, count in before.items() if count == 0}  # the standby's throw-away session: 0.22.2
    assert len(warm_ups) == (0 if version == "0.22.2" or late else 1), before  # writes none without messages
    second = finish(client, client.call("hermes_run", task="Second.\nRUN: pwd && echo \"tmp=$TMPDIR\"", wait_s=45),
                    timeout=180)
    assert_turn_ended(second)
    assert second.field("START").startswith("warm (the task reached Hermes "), second.text
    output = second.text.split("--- HERMES ANSWER ---")[1]
    job_id = second.field("JOB_ID")
    assert f"SCRIPTED DONE: {bridge.root}" in output or str(bridge.root) in output, second.text
    assert str(bridge.jobs / "tmp") in second.text  # its TMPDIR: the standby's private one, under the sandbox
    session = second.field("SESSION_ID")  # the warm-up session, handed to the job (0.22.2 writes its row later)
    assert session in sessions(home) and (session in warm_ups if version == "0.19.0" and not late
                                          else session not in before)
    # the warm session carries nothing of the first job's (Hermes' other calls, a title, may not be chats)
    chats = [request["messages"] for request in model.requests() if isinstance(request.get("messages"), list)]
    seconds = [messages for messages in chats if any("Second." in str(m.get("content")) for m in messages)]
    assert seconds and not any("First." in str(m.get("content")) for messages in seconds for m in messages)
    assert bridge.record(job_id).marker == standby["marker"]
    assert wait_until(lambda: gone(standby["pid"]) or None, 60, "the standby that served the job to exit")
    assert not (warm_ups - {session}) & set(sessions(home)), "a throw-away session is still in Hermes' list"

    waiting_for(bridge, bridge.root, timeout=120)  # readied after the warm job: a resumed job takes it too
    resumed = finish(client, client.call("hermes_resume", session_id=session, task="And now?", wait_s=45),
                     timeout=180)
    assert_turn_ended(resumed)
    assert resumed.field("SESSION_ID") == session, resumed.text
    assert resumed.field("START").startswith("warm"), resumed.text  # the session loaded on the warm Hermes
    throwaway = {name: count for name, count in sessions(home).items() if name not in before and name != session}
    assert set(throwaway.values()) <= {0}, throwaway  # warm-up sessions hold no message


def test_the_next_worktree_job_takes_the_readied_worktree_and_commits_in_its_own_place(warm: Any) -> None:
    """Issue 51: after a worktree job, the standby readies a worktree at HEAD with the real Hermes started in it;
    the next worktree job takes it, its tools run in the job's own worktree (moved there for it), and its commit
    lands."""
    from test_warm_worktrees import COMMIT
    from test_worktrees import git, make_repo

    bridge, _, client, _, _ = warm
    repo = make_repo(bridge.root / "repo")
    first = finish(client, client.call("hermes_run", task="First.\nRUN: pwd", cwd=str(repo), isolation="worktree",
                                       wait_s=45), timeout=180)
    assert_turn_ended(first)
    readied = Path(ready(bridge, timeout=120)["worktree"]["path"])
    second = finish(client, client.call("hermes_run", task=f"Second.\nRUN: {COMMIT}", cwd=str(repo),
                                        isolation="worktree", wait_s=45), timeout=180)
    assert_turn_ended(second)
    job_id = second.field("JOB_ID")
    assert second.field("START").startswith("warm (the task reached Hermes "), second.text
    own = bridge.jobs / "worktrees" / job_id
    assert (own / "where.txt").read_text().strip() == str(own) and not readied.exists()
    assert git(repo, "log", "-1", "--format=%s", f"hermes-bridge/{job_id}") == "mine"
    landed = client.call("hermes_land", job_id=job_id, action="merge")
    assert not landed.is_error and (repo / "mine.txt").read_text() == "mine\n", landed.text


def test_the_next_resume_in_a_worktree_takes_the_standby_readied_there_and_writes_its_worktree(warm: Any) -> None:
    """Issue 65: a resumed worktree job readies a standby in that worktree, confined as a resumed job's Hermes is;
    the next resume takes it and its tools write that worktree (the bug this replaces: a warm resume whose shell
    was refused its own worktree)."""
    from test_worktrees import make_repo

    bridge, _, client, _, _ = warm
    repo = make_repo(bridge.root / "repo")
    first = finish(client, client.call("hermes_run", task="First.\nRUN: pwd", cwd=str(repo), isolation="worktree",
                                       wait_s=45), timeout=180)
    assert_turn_ended(first)
    worktree, session = bridge.jobs / "worktrees" / first.field("JOB_ID"), first.field("SESSION_ID")
    second = finish(client, client.call("hermes_resume", session_id=session, task="Second.\nRUN: echo 2 > two.txt",
                                        wait_s=45), timeout=180)
    assert_turn_ended(second)
    place = f"{worktree} (the worktree of job {first.field('JOB_ID')}, folder "
    wait_until(lambda: any(str(published.get("folder", "")).startswith(place) for published in live_ready(bridge)),
               120, "a standby in the worktree")
    third = finish(client, client.call("hermes_resume", session_id=session, task="Third.\nRUN: pwd > where3.txt",
                                       wait_s=45), timeout=180)
    assert_turn_ended(third)
    assert third.field("START").startswith("warm (the task reached Hermes "), third.text
    assert (worktree / "where3.txt").read_text().strip() == str(worktree), third.text
    assert (worktree / "two.txt").read_text().strip() == "2" and not (repo / "where3.txt").exists()


def live_ready(bridge: Bridge) -> list[dict[str, Any]]:
    """What each slot's standby published, for those ready now."""
    found = []
    for path in bridge.jobs.glob("standby*/ready.json"):
        with contextlib.suppress(OSError, ValueError):
            found.append(json.loads(path.read_text()))
    return found


def configured_warm(bridge: Bridge, version: str) -> Any:
    """The bridge set for warm starts with the real Hermes of this version and a scripted model; no server yet."""
    exe = require_component(REAL_HERMES_VERSIONS[version], f"the real Hermes CLI {version}")
    with ScriptedModel(bridge.tmp) as model:
        write_hermes_home(bridge.tmp / "real-home", model.base_url)
        bridge.configure(hermes_exe=str(exe), hermes_home=str(bridge.tmp / "real-home"), kill_grace_s=5,
                         hermes_driver="acp", approvals="yolo", warm_start=True)
        yield bridge


@pytest.fixture
def warm_022(bridge: Bridge) -> Any:
    """The faults with the real Hermes 0.22.2 (each costs Hermes' start more than once: one version is enough to
    show the real process behaves as the fake's tests say)."""
    yield from configured_warm(bridge, "0.22.2")


@pytest.fixture(params=REAL_ACP_VERSIONS, ids=lambda version: f"hermes-{version}")
def warm_each(bridge: Bridge, request: pytest.FixtureRequest) -> Any:
    yield from configured_warm(bridge, request.param)


def test_a_standby_whose_hermes_is_frozen_lets_the_job_start_cold_at_once_and_says_why(warm: Any) -> None:
    """Issue 65's hung fault with the real Hermes: the standby asks its Hermes before it takes a job (a method
    Hermes' JSON-RPC layer does not know, answered at once); frozen, it answers nothing, and the job starts cold
    without waiting on it."""
    bridge, _, client, _, _ = warm
    assert_turn_ended(finish(client, client.call("hermes_run", task="First.\nRUN: pwd", wait_s=45), timeout=180))
    standby = ready(bridge, timeout=120)
    hermes = psutil.Process(hermes_of(standby))
    hermes.suspend()
    try:
        job = finish(client, client.call("hermes_run", task="While frozen.\nRUN: pwd", wait_s=45), timeout=180)
    finally:
        with contextlib.suppress(psutil.Error):
            hermes.resume()
    assert_turn_ended(job)
    assert job.field("START").endswith("the warm Hermes could not take it: its Hermes is not answering (Hermes did "
                                       "not answer bridge/ping within 1.5 s))"), job.text
    assert wait_until(lambda: gone(hermes.pid) or None, 60, "the frozen Hermes to be stopped")


def test_a_killed_a_stale_and_a_serverless_standby_lose_no_job_and_leave_no_process(warm_022: Bridge) -> None:
    bridge = warm_022
    bridge.configure(warm_start_any_folder=False)  # the folder's own standby alone (a stale late one: test_standby)
    with bridge.client() as client:
        assert_turn_ended(finish(client, client.call("hermes_run", task="First.\nRUN: pwd", wait_s=45), timeout=180))
        killed = ready(bridge, timeout=120)
        killed_hermes = hermes_of(killed)
        psutil.Process(killed["pid"]).kill()
        assert wait_gone([killed["pid"]]) == []  # a SIGKILL lands a little later: a launch before would wait on it
        after_kill = finish(client, client.call("hermes_run", task="After.\nRUN: pwd", wait_s=45), timeout=180)
        assert_turn_ended(after_kill)
        assert after_kill.field("START").endswith("the warm Hermes waiting had exited)"), after_kill.text
        assert wait_until(lambda: gone(killed_hermes) or None, 30, "the killed standby's Hermes to exit")
        stale = wait_until(lambda: r if (r := ready(bridge, timeout=120))["pid"] != killed["pid"] else None, 120,
                           "a standby to replace the killed one")  # the killed one's ready.json stays until then
        stale_hermes = hermes_of(stale)
    bridge.configure(max_output_chars=12345, standby_idle_s=5)  # other settings: the waiting one is stale
    with bridge.client() as client:
        job_id = client.call("hermes_run", task="Other settings.\nRUN: pwd", wait_s=0).field("JOB_ID")
        [preparing] = wait_until(lambda: [p for p in live_standbys(bridge.jobs) if p.pid != stale["pid"]] or None,
                                 60, "a standby for the new settings to start preparing")
    # the server is gone while that one prepares
    assert wait_until(lambda: gone(stale_hermes) or None, 60, "the stale standby's Hermes to exit")
    with bridge.client() as client:
        other = finish(client, client.call("hermes_status", job_id=job_id, wait_s=30), timeout=180)
    assert_turn_ended(other)
    assert other.field("START").endswith("was started with other settings (config, Hermes, its home or "
                                         "environment))"), other.text
    prepared = ready(bridge, timeout=120)
    assert prepared["pid"] == preparing.pid and live_standbys(bridge.jobs) == [preparing]
    prepared_hermes = hermes_of(prepared)
    assert wait_until(lambda: (gone(preparing.pid) and gone(prepared_hermes)) or None, 60,
                      "the idle standby and its Hermes to exit")
    assert not live_standbys(bridge.jobs)


def test_a_limited_job_never_takes_an_open_standby_and_a_warm_limited_one_stays_limited(warm_each: Bridge) -> None:
    """Issue 64 with the real Hermes 0.19.0 and 0.22.2: after an open job a warm Hermes waits without a proxy; a
    model-only job in the same folder starts cold, behind its own proxy, and cannot reach an unlisted server; the
    standby readied after it waits behind a proxy (and in a network) of its own, and the next model-only job takes
    it warm, still held."""
    require_sandbox()
    bridge = warm_each
    bridge.configure(network="open")
    other = served(bridge.tmp)
    probe = bridge.tmp / "probe.sh"
    probe.write_text(f"if curl -sf --noproxy '*' -m 5 http://127.0.0.1:{other.server_address[1]}/ >/dev/null 2>&1 "
                     f"|| curl -sf -m 5 http://127.0.0.1:{other.server_address[1]}/ >/dev/null 2>&1; then echo "
                     "REACHED >> reach.txt; else echo HELD >> reach.txt; fi\n")
    try:
        with bridge.client() as client:
            first = finish(client, client.call("hermes_run", task=f"Open.\nRUN: sh {probe}", wait_s=45), timeout=180)
            assert_turn_ended(first)
            assert ready(bridge, timeout=120)["shape"]["network"] == "open"
            limited = finish(client, client.call("hermes_run", task=f"Held.\nRUN: sh {probe}", network="model-only",
                                                 wait_s=45), timeout=180)
            assert_turn_ended(limited)
            assert limited.field("START").startswith("cold (") and "the warm Hermes waiting was started without a " \
                "proxy (network open), and this job's network is model-only" in limited.field("START"), limited.text
            assert ready(bridge, timeout=120)["shape"]["network"] == "model-only"
            warm = finish(client, client.call("hermes_run", task=f"Held warm.\nRUN: sh {probe}",
                                              network="model-only", wait_s=45), timeout=180)
            assert_turn_ended(warm)
            assert warm.field("START").startswith("warm"), warm.text
            assert warm.field("NETWORK").startswith("model-only"), warm.text
            assert "through the job's proxy (a network of its own" in warm.field("NETWORK"), warm.text
    finally:
        other.shutdown()
    assert (bridge.root / "reach.txt").read_text().split() == ["REACHED", "HELD", "HELD"]


def test_jobs_taking_turns_in_two_folders_start_warm_in_each(warm_each: Bridge) -> None:
    """Issue 65 with the real Hermes 0.19.0 and 0.22.2: after one job in each of two folders, each folder keeps a
    warm Hermes of its own (warm_start_folders 2, the default); the next job in each starts warm, runs in its own
    folder and writes there, and cannot write the other."""
    require_sandbox()
    bridge = warm_each
    folders = [bridge.root / "first", bridge.root / "second"]
    for folder in folders:
        folder.mkdir()
    with bridge.client() as client:
        for folder in folders:
            assert_turn_ended(finish(client, client.call("hermes_run", task="Ready.\nRUN: pwd", cwd=str(folder),
                                                         wait_s=45), timeout=180))
        for folder in folders:
            waiting_for(bridge, folder, timeout=120)
        for folder, other in (folders, folders[::-1]):
            task = f"Warm.\nRUN: pwd > here.txt; echo x > {other}/{folder.name}-was-here.txt"
            job = finish(client, client.call("hermes_run", task=task, cwd=str(folder), wait_s=45), timeout=180)
            assert_turn_ended(job)
            assert job.field("START").startswith("warm"), job.text
            assert (folder / "here.txt").read_text().strip() == str(folder)
            assert not (other / f"{folder.name}-was-here.txt").exists()


def test_a_job_in_a_folder_no_job_ran_in_starts_warm_bound_late_and_writes_only_there(warm_each: Bridge) -> None:
    """Issue 65's headline with the real Hermes 0.19.0 and 0.22.2: after one job in one folder, a job in a folder
    no job ran in takes the standby bound late (readied for any folder): it starts warm, its shell runs in its own
    folder with the job's project cache, writes there, and cannot write a sibling folder of the same root."""
    require_sandbox()
    bridge = warm_each
    bridge.configure(warm_start_any_folder=True)
    first, new, sibling = (bridge.root / name for name in ("first", "new", "sibling"))
    for folder in (first, new, sibling):
        folder.mkdir()
    with bridge.client() as client:
        assert_turn_ended(finish(client, client.call("hermes_run", task="Ready.\nRUN: pwd", cwd=str(first),
                                                     wait_s=45), timeout=180))
        assert waiting_for(bridge, new, timeout=120)["folder"] == LATE_PLACE
        task = (f"Warm.\nRUN: pwd > here.txt; echo \"$UV_CACHE_DIR\" > cache.txt; "
                f"echo x > {sibling}/was-here.txt")
        job = finish(client, client.call("hermes_run", task=task, cwd=str(new), wait_s=45), timeout=180)
    assert_turn_ended(job)
    assert job.field("START").startswith("warm (the task reached Hermes "), job.text
    assert (new / "here.txt").read_text().strip() == str(new)
    project = project_cache(bridge.jobs / "tmp" / "any", str(new), None)
    assert (new / "cache.txt").read_text().strip() == str(project / "uv")
    assert not (sibling / "was-here.txt").exists()
    recorded = json.loads((bridge.jobs / "standby-any" / AHEAD_RECORD).read_text())  # what it imported ahead:
    assert recorded["tested"] and "agent.conversation_loop" in recorded["modules"], recorded  # by its first prompt
    with contextlib.closing(sqlite3.connect(f"file:{bridge.tmp / 'real-home' / 'state.db'}?mode=ro", uri=True)) as db:
        assert not db.execute("SELECT COUNT(*) FROM messages WHERE content = ?", (RECORDING_PROMPT,)).fetchone()[0]
    assert RECORDING_PROMPT not in (bridge.tmp / "requests.jsonl").read_text()  # the model never saw it


def test_jobs_started_together_leave_a_warm_hermes_in_each_slot_and_the_next_pair_starts_warm(
        warm_each: Bridge) -> None:
    """Issue 65 with the real Hermes 0.19.0 and 0.22.2: two jobs started together in one folder take its one
    warm Hermes and start one cold; each asks for one more, so a standby waits in each slot, and the next two
    started together both start warm, each in its own session, each writing the folder."""
    require_sandbox()
    bridge = warm_each
    with bridge.client() as client:
        assert_turn_ended(finish(client, client.call("hermes_run", task="Ready.\nRUN: pwd", wait_s=45), timeout=180))
        waiting_for(bridge, bridge.root, timeout=120)

        def together(name: str) -> list[Any]:
            started = [client.call("hermes_run", task=f"{name} {n}.\nRUN: echo {n} > {name}-{n}.txt", wait_s=0)
                       for n in range(2)]
            return [client.wait_final(job.field("JOB_ID"), timeout=180) for job in started]
        first = together("burst")
        assert sorted(job.field("START").split(" ")[0] for job in first) == ["cold", "warm"], [j.text for j in first]
        for slots in ("standby", "standby-1"):
            waiting_for(bridge, bridge.root, slots=slots, timeout=120)
        again = together("again")
        for job in again:
            assert_turn_ended(job)
            assert job.field("START").startswith("warm"), job.text
        assert len({job.field("SESSION_ID") for job in again}) == 2
        assert [(bridge.root / f"again-{n}.txt").read_text().strip() for n in range(2)] == ["0", "1"]


def test_a_queued_job_takes_the_warm_hermes_readied_while_it_waited(warm_each: Bridge) -> None:
    """Issue 65 with the real Hermes 0.19.0 and 0.22.2: with max_running_jobs 1, a job sent while another runs
    waits in the queue; the standby readied after the running job's start takes it when the slot frees, and it
    runs in its own folder, writing there."""
    require_sandbox()
    bridge = warm_each
    bridge.configure(max_running_jobs=1)
    with bridge.client() as client:
        first = client.call("hermes_run", task="Busy.\nRUN: sleep 12", wait_s=0)
        queued = client.call("hermes_run", task="Queued.\nRUN: pwd > queued.txt", wait_s=0)
        assert queued.field("STATUS") == "queued", queued.text
        waiting_for(bridge, bridge.root, timeout=120)
        assert_turn_ended(client.wait_final(first.field("JOB_ID"), timeout=180))
        done = client.wait_final(queued.field("JOB_ID"), timeout=180)
    assert_turn_ended(done)
    assert done.field("START").startswith("warm (") and "it waited " in done.field("START"), done.text
    assert (bridge.root / "queued.txt").read_text().strip() == str(bridge.root)


def test_a_job_sent_while_its_standby_is_readied_waits_for_it_and_starts_warm(warm_each: Bridge) -> None:
    """Issue 65 with the real Hermes 0.19.0 and 0.22.2: a job sent while the standby for its folder is still
    starting Hermes waits for it rather than starting a second Hermes beside it, and says how long it waited."""
    require_sandbox()
    bridge = warm_each
    with bridge.client() as client:
        first = client.call("hermes_run", task="First.\nRUN: pwd", wait_s=0)
        wait_until(lambda: being_readied(bridge.jobs / "standby") in (str(bridge.root), LATE_PLACE) or None, 120,
                   "the standby to be starting its Hermes")
        second = client.call("hermes_run", task="Second.\nRUN: pwd > second.txt", wait_s=0)
        assert_turn_ended(client.wait_final(first.field("JOB_ID"), timeout=180))
        done = client.wait_final(second.field("JOB_ID"), timeout=180)
    assert_turn_ended(done)
    start = done.field("START")
    assert start.startswith("warm (") and " s for the warm Hermes being readied" in start, done.text
    assert (bridge.root / "second.txt").read_text().strip() == str(bridge.root)
