"""Issue 39 with the fake Hermes: a warm `hermes acp` readied after an ACP job for the next in its folder, taken
by exactly one job, which its standby supervises as a cold one is; and every way a standby can fail leaves the
job to a cold start, no process behind and no second standby."""
import contextlib
import json
import socketserver
import sqlite3
import sys
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any, cast

import psutil
import pytest
from test_approvals import audit_lines
from test_worktrees import final

from claude_hermes_bridge.late_standby import LATE_PLACE, RECORDING_PROMPT
from claude_hermes_bridge.standby import AHEAD_RECORD, being_readied
from conftest import require_sandbox
from harness import Bridge, BridgeClient, live_standbys, make_fake_hermes, wait_until

OPEN_SHAPE = {"network": "open", "worktree": None}  # a default job's confinement_shape with the network open
pytestmark = pytest.mark.posix("the faults are shown on Linux; tests/test_windows.py takes a warm Hermes on Windows")


def acp_client(bridge: Bridge) -> BridgeClient:
    client = bridge.client()
    client.params.env = dict(bridge.env, FAKE_HERMES_ACP="1")
    return client


def ready(bridge: Bridge, timeout: float = 40) -> dict[str, Any]:
    """The standby's published description, once it is ready."""
    path = bridge.jobs / "standby" / "ready.json"
    return wait_until(lambda: json.loads(path.read_text()) if path.exists() else None, timeout, "a ready standby")


def sessions(bridge: Bridge) -> dict[str, int]:
    """The fake Hermes' session list: each session and how many messages it holds."""
    with closing(sqlite3.connect(f"file:{bridge.tmp / 'hermes-home' / 'state.db'}?mode=ro", uri=True)) as db:
        return {row[0]: row[1] for row in db.execute(
            "SELECT s.id, (SELECT COUNT(*) FROM messages m WHERE m.session_id = s.id) FROM sessions s")}


def warm_ups(bridge: Bridge) -> set[str]:
    """The sessions that hold no message: a waiting standby's throw-away."""
    return {name for name, count in sessions(bridge).items() if count == 0}


def hermes_of(standby: dict[str, Any]) -> int:
    """The pid of the standby's Hermes (its child running the fake's ACP side)."""
    children = psutil.Process(standby["pid"]).children(recursive=True)
    return next(child.pid for child in children if "acp" in " ".join(child.cmdline()))


def test_the_next_job_in_the_folder_takes_the_warm_hermes_and_runs_as_a_cold_one_does(bridge: Bridge) -> None:
    bridge.configure(hermes_driver="acp", warm_start=True)
    with acp_client(bridge) as client:
        first = final(client, task="first !write=one.txt:1", cwd=str(bridge.root))
        assert first.field("STATUS") == "ok", first.text
        assert first.field("START").startswith("cold (the task reached Hermes "), first.text
        assert "no warm Hermes is waiting" in first.field("START")
        standby = ready(bridge)
        warm_hermes = hermes_of(standby)
        [warm_up] = warm_ups(bridge)
        health = client.call("hermes_health").field("WARM_START")
        assert health.startswith(f"a warm Hermes waits for the next ACP job in {bridge.root} (readied in "), health
        second = final(client, task="second !write=two.txt:2", cwd=str(bridge.root))
        assert second.field("STATUS") == "ok", second.text
        assert second.field("START").startswith("warm (the task reached Hermes "), second.text
        assert (bridge.root / "two.txt").read_text() == "2"
        [run] = [r for r in bridge.runs() if r.get("task", "").startswith("second")]
        assert run["pid"] == warm_hermes and run["cwd"] == str(bridge.root)
        assert run["marker"] == bridge.record(second.field("JOB_ID")).marker == standby["marker"]
        assert "warm start: this Hermes was started and readied" in (bridge.jobs / f"{second.field('JOB_ID')}.log"
                                                                     ).read_text()
        assert wait_until(lambda: gone(warm_hermes) or None, 20, "the warm job's Hermes to exit with it")
        third_standby = ready(bridge)  # the next one, readied after the warm job
        assert third_standby["pid"] != standby["pid"]
        # the warm-up session, opened in the job's folder, was handed to the job: its own session/new skipped
        assert second.field("SESSION_ID") == warm_up and sessions(bridge)[warm_up] > 0, second.text
        assert ["sessions", "delete", warm_up, "--yes"] not in bridge.invocations()
        held = sessions(bridge)  # no session/new of the job's: only the third standby's warm-up is empty
        assert set(held) == {first.field("SESSION_ID"), warm_up} | warm_ups(bridge) and len(warm_ups(bridge)) == 1, held


def test_a_warm_started_job_is_held_by_the_sandbox_its_block_names(bridge: Bridge) -> None:
    """Issue 50 (standby.py:119): the standby's Hermes was started through the sandbox's step, so a warm job
    writes outside its folder no more than a cold one, as its SANDBOX line says."""
    require_sandbox()
    outside = bridge.tmp / "outside.txt"
    script = bridge.tmp / "escape.sh"
    script.write_text(f'echo escaped > "{outside}" 2>/dev/null; echo inside > inside.txt; echo "$TMPDIR" > tmp.txt\n')
    bridge.configure(hermes_driver="acp", warm_start=True)
    gone = psutil.Popen(["true"])
    gone.wait()
    killed_standbys = bridge.jobs / "tmp" / f"standby-{gone.pid}-{'c' * 12}"  # its process is gone: swept
    killed_standbys.mkdir(parents=True)
    with acp_client(bridge) as client:
        final(client, task="first !write=one.txt:1", cwd=str(bridge.root))
        ready(bridge)
        assert not killed_standbys.exists()
        job = final(client, task=f"warm !shell={script}", cwd=str(bridge.root))
    assert job.field("STATUS") == "ok" and job.field("START").startswith("warm"), job.text
    assert job.field("SANDBOX").startswith("writes limited to"), job.text
    assert str(outside) in job.field("SANDBOX_DENIED")
    assert (bridge.root / "inside.txt").read_text() == "inside\n"
    assert not outside.exists()
    used = (bridge.root / "tmp.txt").read_text().strip()  # the standby's private folder, named and removed
    assert used.startswith(str(bridge.jobs / "tmp" / "standby-")) and f"{used} (TMPDIR)" in job.field("SANDBOX")
    assert not Path(used).exists()


def test_cli_jobs_and_warm_start_off_start_cold_and_write_nothing(bridge: Bridge) -> None:
    bridge.configure(hermes_driver="cli")
    with acp_client(bridge) as client:
        cli = final(client, task="plain !write=a.txt:1", cwd=str(bridge.root))
    assert cli.field("START") == "cold (the CLI driver starts Hermes for each job)", cli.text
    bridge.configure(hermes_driver="acp", warm_start=False)
    with acp_client(bridge) as client:
        acp = final(client, task="acp !write=b.txt:1", cwd=str(bridge.root))
    assert acp.field("START").endswith("; warm_start is off)"), acp.text
    with acp_client(bridge) as client:
        assert client.call("hermes_health").field("WARM_START") == "off (setting warm_start: false)"
    time.sleep(1)
    assert not (bridge.jobs / "standby").exists()


def test_a_standby_killed_while_waiting_leaves_the_next_job_cold_and_is_replaced(bridge: Bridge) -> None:
    bridge.configure(hermes_driver="acp", warm_start=True)
    with acp_client(bridge) as client:
        final(client, task="first !write=one.txt:1", cwd=str(bridge.root))
        standby = ready(bridge)
        hermes = hermes_of(standby)
        psutil.Process(standby["pid"]).kill()
        wait_until(lambda: gone(standby["pid"]) or None, 10, "the killed standby to be gone")
        job = final(client, task="after the kill !write=two.txt:2", cwd=str(bridge.root))
        assert job.field("STATUS") == "ok" and job.field("START").endswith("the warm Hermes waiting had exited)"), \
            job.text
        replacement = ready(bridge)
        assert replacement["pid"] != standby["pid"]
    assert wait_until(lambda: gone(hermes) or None, 20, "the killed standby's Hermes to exit (its input closed)")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_the_key_sees_every_guarded_name_of_hermes_home_by_content(bridge: Bridge) -> None:
    """Issue 47: a same-size change with its time set back, in config.yaml, .env or a hook, is another key."""
    import os

    from claude_hermes_bridge.config import load_config
    from claude_hermes_bridge.standby import launch_key

    home = bridge.tmp / "hermes-home"
    (home / "hooks").mkdir(parents=True, exist_ok=True)
    for name, text in (("config.yaml", "model: aaaa\n"), (".env", "KEY=1\n"), ("hooks/h.py", "pass\n")):
        (home / name).write_text(text)
    cfg = load_config(bridge.config)
    before = launch_key(cfg, str(bridge.root), "/bin/true", OPEN_SHAPE)
    for name, text in (("config.yaml", "model: bbbb\n"), (".env", "KEY=2\n"), ("hooks/h.py", "evil\n")):
        status = os.stat(home / name)
        original = (home / name).read_text()
        (home / name).write_text(text)
        os.utime(home / name, ns=(status.st_atime_ns, status.st_mtime_ns))
        assert launch_key(cfg, str(bridge.root), "/bin/true", OPEN_SHAPE) != before, name
        (home / name).write_text(original)
        os.utime(home / name, ns=(status.st_atime_ns, status.st_mtime_ns))
    (home / "plugins").mkdir()
    assert launch_key(cfg, str(bridge.root), "/bin/true", OPEN_SHAPE) != before, "a plugins folder made"


def test_a_same_size_config_change_with_its_time_set_back_makes_the_next_job_cold(bridge: Bridge) -> None:
    import os

    bridge.configure(hermes_driver="acp", warm_start=True)
    config = bridge.tmp / "hermes-home" / "config.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("model: aaaa\n")
    with acp_client(bridge) as client:
        final(client, task="first !write=one.txt:1", cwd=str(bridge.root))
        standby = ready(bridge)
        status = os.stat(config)
        config.write_text("model: bbbb\n")
        os.utime(config, ns=(status.st_atime_ns, status.st_mtime_ns))
        job = final(client, task="after the edit !write=two.txt:2", cwd=str(bridge.root))
    assert job.field("STATUS") == "ok", job.text
    assert job.field("START").startswith("cold") and "other settings" in job.field("START"), job.text
    assert wait_until(lambda: gone(standby["pid"]) or None, 30, "the stale standby to retire")


def test_a_standby_of_other_settings_is_not_taken_and_retires(bridge: Bridge) -> None:
    bridge.configure(hermes_driver="acp", warm_start=True)
    with acp_client(bridge) as client:
        final(client, task="first !write=one.txt:1", cwd=str(bridge.root))
        standby = ready(bridge)
        hermes = hermes_of(standby)
        [warm_up] = warm_ups(bridge)
    bridge.configure(hermes_driver="acp", warm_start=True, max_output_chars=12345)
    with acp_client(bridge) as client:
        job = final(client, task="other settings !write=two.txt:2", cwd=str(bridge.root))
    assert job.field("START").endswith("was started with other settings (config, Hermes, its home or environment))")
    assert wait_until(lambda: gone(hermes) or None, 30, "the stale standby's Hermes to exit")
    assert ready(bridge)["pid"] != standby["pid"]
    # the retired standby's throw-away session, deleted through Hermes' own command once its Hermes exited
    assert wait_until(lambda: warm_up not in sessions(bridge) or None, 20, "the retired warm-up session to go")
    assert ["sessions", "delete", warm_up, "--yes"] in bridge.invocations()
    wanted = {"event": "standby", "warm_up_session": warm_up, "deleted": True}
    assert wait_until(lambda: wanted in [{key: line.get(key) for key in wanted} for line in audit_lines(bridge)]
                      or None, 20, "the deletion's audit line")  # written just after the deletion it describes


def test_a_standby_that_never_answers_the_take_leaves_the_job_to_a_cold_start(bridge: Bridge) -> None:
    """A standby stopped (or killed) while it is being taken: the server takes the job back after a few
    seconds and starts it cold; the standby, woken later, finds no job to serve."""
    bridge.configure(hermes_driver="acp", warm_start=True)
    with acp_client(bridge) as client:
        final(client, task="first !write=one.txt:1", cwd=str(bridge.root))
        standby = ready(bridge)
        process = psutil.Process(standby["pid"])
        process.suspend()
        try:
            job = final(client, task="while stopped !write=two.txt:2", cwd=str(bridge.root))
        finally:
            process.resume()
    assert job.field("STATUS") == "ok" and job.field("START").endswith("the standby did not answer in time)"), job.text
    folder = bridge.jobs / "standby"
    assert not list(folder.glob("taken-*")) and not list(folder.glob("serving-*"))
    assert wait_until(lambda: gone(process.pid) or None, 30, "the abandoned standby to exit")
    assert waiting_for(bridge, bridge.root)["pid"] != process.pid  # the job's own replacement, in another slot


def test_a_standby_whose_hermes_is_frozen_leaves_the_job_to_a_cold_start_and_says_why(bridge: Bridge) -> None:
    """Issue 65's hung fault: the standby answers, but its Hermes is frozen (stopped, or stuck). Taken, it would
    leave the job waiting for ever; it asks its Hermes first, and the job starts cold at once, saying why."""
    bridge.configure(hermes_driver="acp", warm_start=True)
    with acp_client(bridge) as client:
        final(client, task="first !write=one.txt:1", cwd=str(bridge.root))
        standby = ready(bridge)
        hermes = psutil.Process(hermes_of(standby))
        hermes.suspend()
        try:
            job = final(client, task="while frozen !write=two.txt:2", cwd=str(bridge.root))
        finally:
            with contextlib.suppress(psutil.Error):
                hermes.resume()
    assert job.field("STATUS") == "ok" and (bridge.root / "two.txt").read_text() == "2", job.text
    assert job.field("START").startswith("cold (") and job.field("START").endswith(
        "the warm Hermes could not take it: its Hermes is not answering (Hermes did not answer bridge/ping within "
        "1.5 s))"), job.text
    assert wait_until(lambda: gone(standby["pid"]) or None, 30, "the refusing standby to exit")
    assert wait_until(lambda: gone(hermes.pid) or None, 30, "its frozen Hermes to be stopped")


def test_two_servers_racing_for_one_standby_one_gets_it_the_other_starts_cold(bridge: Bridge) -> None:
    bridge.configure(hermes_driver="acp", warm_start=True)
    with acp_client(bridge) as client:
        final(client, task="first !write=one.txt:1", cwd=str(bridge.root))
    ready(bridge)
    results: dict[str, Any] = {}

    def run(name: str) -> None:
        with acp_client(bridge) as client:
            results[name] = final(client, task=f"racer {name} !write={name}.txt:{name}", cwd=str(bridge.root))
    racers = [threading.Thread(target=run, args=(name,)) for name in ("a", "b")]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(120)
    starts = sorted(result.field("START").split(" ")[0] for result in results.values())
    assert "warm" in starts, {name: result.text for name, result in results.items()}
    assert all(result.field("STATUS") == "ok" for result in results.values())
    # never one warm Hermes for two jobs: both warm only when the second came after the next standby was ready
    warm = [bridge.record(result.field("JOB_ID")).marker for result in results.values()
            if result.field("START").startswith("warm")]
    assert len(set(warm)) == len(warm), warm


def test_the_server_exiting_while_a_standby_prepares_loses_no_job_and_leaves_no_process(bridge: Bridge) -> None:
    """The standby is detached from the server that started it: it finishes preparing, is the only one, waits
    standby_idle_s for a job and then exits with its Hermes; the job that asked for it ends as it would."""
    bridge.configure(hermes_driver="acp", warm_start=True, standby_idle_s=5)
    client = acp_client(bridge)
    client.params.env = dict(client.params.env or {}, FAKE_ACP_INIT_DELAY="2")
    with client:
        job_id = client.call("hermes_run", task="first !write=one.txt:1", cwd=str(bridge.root), wait_s=0
                             ).field("JOB_ID")
        [preparing] = wait_until(lambda: live_standbys(bridge.jobs) or None, 20, "a standby to start preparing")
    assert not (bridge.jobs / "standby" / "ready.json").exists()  # the server left before it was ready
    with acp_client(bridge) as client:
        assert client.wait_final(job_id).field("STATUS") == "ok"
    assert (bridge.root / "one.txt").read_text() == "1"
    standby = ready(bridge)
    assert standby["pid"] == preparing.pid and live_standbys(bridge.jobs) == [preparing]
    hermes = hermes_of(standby)
    assert wait_until(lambda: (gone(preparing.pid) and gone(hermes)) or None, 30, "the idle standby and its Hermes "
                      "to exit")
    assert not (bridge.jobs / "standby" / "ready.json").exists() and not live_standbys(bridge.jobs)


def test_a_jobs_folder_that_refuses_the_standby_leaves_jobs_cold_and_starts_nothing(bridge: Bridge) -> None:
    """Where the standby's folder cannot be made (a full or read-only jobs folder; here a file in its place),
    jobs run cold as before and no standby process starts."""
    bridge.configure(hermes_driver="acp", warm_start=True)
    bridge.jobs.mkdir(parents=True, exist_ok=True)
    (bridge.jobs / "standby").write_text("not a folder")
    with acp_client(bridge) as client:
        for name in ("one", "two"):
            job = final(client, task=f"{name} !write={name}.txt:1", cwd=str(bridge.root))
            assert job.field("STATUS") == "ok" and job.field("START").startswith("cold ("), job.text
        assert client.call("hermes_health").field("WARM_START").startswith("on; no warm Hermes waits now")
        time.sleep(1)
        started = [" ".join(child.cmdline()) for child in psutil.Process(client.server_pid).children(recursive=True)]
    assert not [line for line in started if "--standby" in line], started
    assert (bridge.jobs / "standby").read_text() == "not a folder"


@pytest.mark.parametrize("mode", ["model-only", "allow-list"])
def test_a_network_limited_job_after_an_open_one_starts_cold_behind_its_proxy(bridge: Bridge, mode: str) -> None:
    """Issue 64 (a per-job network limit skipped on a warm start): a warm Hermes waits in the folder, readied
    after an open job; a job that narrows its network does not take it (its Hermes must start behind the job's
    own proxy), says so on START, and the server it may not reach sees no connection."""
    require_sandbox()
    connections: list[str] = []

    class Counted(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            connections.append("connected")
            self.request.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Counted)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    script = bridge.tmp / "fetch.sh"
    script.write_text(f"curl -s -m 5 -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{server.server_address[1]}/ "
                      f"> {bridge.root}/code.txt\n")
    bridge.configure(hermes_driver="acp", warm_start=True, network="open", approval_timeout_s=5)
    try:
        with acp_client(bridge) as client:
            assert final(client, task="first !write=one.txt:1", cwd=str(bridge.root)).field("STATUS") == "ok"
            waiting = ready(bridge)
            job = final(client, task=f"limited !shell={script}", cwd=str(bridge.root), network=mode)
    finally:
        server.shutdown()
    assert job.field("STATUS") == "ok", job.text
    assert job.field("START").startswith("cold (") and ("the warm Hermes waiting was started without a proxy "
                                                         f"(network open), and this job's network is {mode}") \
        in job.field("START"), job.field("START")
    assert connections == [], job.text
    assert (bridge.root / "code.txt").read_text() != "200"
    assert job.field("JOB_ID") not in " ".join(path.name for path in (bridge.jobs / "standby").iterdir())
    assert waiting["shape"]["network"] == "open"


def test_a_network_limited_job_after_another_of_its_mode_starts_warm_behind_the_proxy_it_takes_over(
        bridge: Bridge) -> None:
    """Issue 64/65: under a limited network the standby starts its Hermes behind a proxy of its own, which the
    job's network takes over (its questions and refusals become the job's): the warm job reaches no unlisted host,
    and its NETWORK line names the refusal."""
    require_sandbox()
    connections: list[str] = []

    class Counted(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            connections.append("connected")

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Counted)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    script = bridge.tmp / "fetch.sh"
    script.write_text(f"curl -s -m 5 -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{port}/ "
                      f"> {bridge.root}/code.txt\n")
    bridge.configure(hermes_driver="acp", warm_start=True, network="model-only")
    try:
        with acp_client(bridge) as client:
            assert final(client, task="first !write=one.txt:1", cwd=str(bridge.root)).field("STATUS") == "ok"
            waiting = ready(bridge)
            assert waiting["shape"]["network"] == "model-only"
            job = final(client, task=f"warm !shell={script}", cwd=str(bridge.root))
    finally:
        server.shutdown()
    assert job.field("STATUS") == "ok" and job.field("START").startswith("warm"), job.text
    assert connections == [] and (bridge.root / "code.txt").read_text() == "403", job.text
    assert f"1 request refused: 127.0.0.1:{port} (not Hermes' model (network: model-only))" in job.field("NETWORK")


def test_a_job_arriving_while_its_standby_is_still_starting_waits_for_it_and_says_so(bridge: Bridge) -> None:
    """Issue 65: a second job that came while the next warm Hermes was being readied started cold and was told
    "no warm Hermes is waiting", which is not what happened; then it started a second Hermes beside the one being
    readied. It now waits for that one (started before it, so ready sooner than a cold start), takes it and
    says how long it waited; one whose standby never comes starts cold after READIED_WAIT_S."""
    bridge.configure(hermes_driver="acp", warm_start=True)
    client = acp_client(bridge)
    client.params.env = dict(client.params.env or {}, FAKE_ACP_INIT_DELAY="4")
    with client:
        first = client.wait_final(client.call("hermes_run", task="first !write=one.txt:1", cwd=str(bridge.root),
                                              wait_s=0).field("JOB_ID"))
        assert first.field("STATUS") == "ok", first.text
        wait_until(lambda: live_standbys(bridge.jobs) or None, 20, "a standby to start preparing")
        assert not (bridge.jobs / "standby" / "ready.json").exists()
        second = final(client, task="second !write=two.txt:2", cwd=str(bridge.root))
    assert second.field("STATUS") == "ok", second.text
    start = second.field("START")
    assert start.startswith("warm (") and " s for the warm Hermes being readied" in start, second.text
    waited = float(start.split("; waited ")[1].split(" s ")[0])
    assert 0.1 <= waited <= 4.5, start  # at most the rest of its start, never a cold start's whole
    assert (bridge.root / "two.txt").read_text() == "2"
    record = bridge.record(second.field("JOB_ID"))
    [run] = [r for r in bridge.runs() if r.get("task", "").startswith("second")]
    assert run["marker"] == record.standby_marker  # on the standby's Hermes: no Hermes of its own was started


def test_a_job_waits_about_a_cold_start_for_a_standby_that_hangs_while_readied_then_starts_cold(
        bridge: Bridge) -> None:
    """Issue 65's fault: the standby being readied for a job's folder hangs (its Hermes never answers initialize).
    The job waits about what the last standby's start took here, not READIED_WAIT_S, and its START says so."""
    bridge.configure(hermes_driver="acp", warm_start=True)
    with acp_client(bridge) as client:
        assert final(client, task="before !write=one.txt:1", cwd=str(bridge.root)).field("STATUS") == "ok"
        standby = ready(bridge)
    prepared_s = json.loads((bridge.jobs / "standby" / "prepared.json").read_text())["prepared_s"]
    assert prepared_s == standby["prepared_s"] and prepared_s < 5
    psutil.Process(standby["pid"]).kill()
    wait_until(lambda: gone(standby["pid"]) or None, 10, "the killed standby to be gone")
    client = acp_client(bridge)
    client.params.env = dict(client.params.env or {}, FAKE_ACP_INIT_DELAY="60")  # every Hermes from now on hangs
    with client:
        wait_until(lambda: being_readied(bridge.jobs / "standby") == str(bridge.root) or None, 20,
                   "a standby readied at the server's start to have claimed its slot")
        job_id = client.call("hermes_run", task="while it hangs !write=two.txt:2", cwd=str(bridge.root),
                             wait_s=0).field("JOB_ID")
        start = wait_until(lambda: s if (s := bridge.record(job_id).start or "").startswith("cold: waited") else None,
                           20, "the job to stop waiting for the hung standby")
        client.call("hermes_cancel", job_id=job_id)
    waited = float(start.split("waited ")[1].split(" s ")[0])
    assert max(2.0, 1.5 * prepared_s) <= waited < max(2.0, 1.5 * prepared_s) + 2, start
    assert start.endswith(" s for the warm Hermes being readied for this folder, which was not ready (a job waits "
                          "about as long as the last one took to start)"), start


def test_a_servers_first_job_starts_warm_in_the_folder_of_the_last_one(bridge: Bridge) -> None:
    """Issue 65: a server's start readies a standby for the place of the newest job that could start warm, so
    the first job after a restart of the host is warm there too."""
    bridge.configure(hermes_driver="acp", warm_start=True)
    with acp_client(bridge) as client:
        assert final(client, task="before !write=one.txt:1", cwd=str(bridge.root)).field("STATUS") == "ok"
        standby = ready(bridge)
    psutil.Process(standby["pid"]).kill()  # as a reboot would: no standby survives into the next server
    wait_until(lambda: gone(standby["pid"]) or None, 10, "the killed standby to be gone")
    with acp_client(bridge) as client:
        readied = wait_until(lambda: (found := ready(bridge))["pid"] != standby["pid"] and found or None, 40,
                             "a standby readied at the server's start")
        assert readied["folder"] == str(bridge.root)
        first = final(client, task="first after the start !write=two.txt:2", cwd=str(bridge.root))
        assert first.field("STATUS") == "ok" and first.field("START").startswith("warm ("), first.text
        assert (bridge.root / "two.txt").read_text() == "2"


def test_a_server_starts_no_standby_with_warm_start_off_or_one_waiting(bridge: Bridge) -> None:
    bridge.configure(hermes_driver="acp", warm_start=True)
    with acp_client(bridge) as client:
        final(client, task="before !write=one.txt:1", cwd=str(bridge.root))
        standby = ready(bridge)
    with acp_client(bridge):  # one waits already: it is the one the next job takes
        time.sleep(1)
        assert [process.pid for process in live_standbys(bridge.jobs)] == [standby["pid"]]
    psutil.Process(standby["pid"]).kill()
    wait_until(lambda: gone(standby["pid"]) or None, 10, "the killed standby to be gone")
    bridge.configure(warm_start=False)
    with acp_client(bridge):
        time.sleep(1)
        assert not live_standbys(bridge.jobs)


WHAT_A_TOOL_GETS = r"""{
env | cut -d= -f1 | grep -v '^_$' | sort | tr '\n' ' '; echo
echo "cwd=$(pwd) home=$HOME tmp_is_private=$(case "$TMPDIR" in "$JOBS"/tmp/*) echo yes;; *) echo no;; esac)"
grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status | tr -s ' \t' ' ' | tr '\n' ' '; echo
echo "network: $(awk -F: 'NR > 2 {gsub(/ /, "", $1); print $1}' /proc/self/net/dev | sort | tr '\n' ' ')"
echo "proxy: ${HTTPS_PROXY:+set}"
awk '$4 == "/" || $4 ~ /^\/dev/ {print $5, ($6 ~ /^ro/ ? "ro" : "rw")}' /proc/self/mountinfo | grep -v "$TMPDIR" | sort
echo x > "$OUTSIDE" 2>/dev/null && echo "outside: written" || echo "outside: refused"
cat "$SECRET" 2>/dev/null || echo "secret: unreadable"
} > "what-$KIND.txt"
"""


@pytest.mark.parametrize("network", ["open", "model-only"])
def test_a_warm_job_gets_what_the_same_job_started_cold_gets(bridge: Bridge, network: str) -> None:
    """Issue 65: what a job's tools get (the names in their environment, their folder and home, a private
    temporary folder, no_new_privs and seccomp, the network's interfaces and proxy, the mounts, a write outside
    and a read of the user's keys) is the same whether its Hermes was started for it or waited as a standby."""
    require_sandbox()
    outside, secret = bridge.tmp / "outside.txt", bridge.tmp / "home" / ".ssh" / "id_ed25519"
    secret.parent.mkdir(parents=True, exist_ok=True)
    secret.write_text("secret: READ\n")
    for kind in ("cold", "warm"):
        (bridge.tmp / f"{kind}.sh").write_text(f"KIND={kind} JOBS={bridge.jobs} OUTSIDE={outside} SECRET={secret}\n"
                                              f"{WHAT_A_TOOL_GETS}")
    bridge.configure(hermes_driver="acp", warm_start=True, network=network)
    with acp_client(bridge) as client:
        cold = final(client, task=f"cold !shell={bridge.tmp / 'cold.sh'}", cwd=str(bridge.root))
        ready(bridge)
        warm = final(client, task=f"warm !shell={bridge.tmp / 'warm.sh'}", cwd=str(bridge.root))
    assert cold.field("START").startswith("cold") and warm.field("START").startswith("warm"), warm.text
    got = {kind: (bridge.root / f"what-{kind}.txt").read_text() for kind in ("cold", "warm")}
    assert got["warm"] == got["cold"], got
    assert "outside: refused" in got["cold"] and "secret: unreadable" in got["cold"]
    assert "tmp_is_private=yes" in got["cold"] and "NoNewPrivs: 1" in got["cold"]
    assert ("network: lo \n" in got["cold"]) == (network != "open"), got["cold"]
    assert not outside.exists()


def waiting_for(bridge: Bridge, folder: Path, slots: str = "standby*", timeout: float = 40,
                late_too: bool = True) -> dict[str, Any]:
    """The published description of a standby of these slots readied for folder (or, late_too, one bound late:
    for any folder), once it is ready."""
    def found() -> dict[str, Any] | None:
        for path in bridge.jobs.glob(f"{slots}/ready.json"):
            with contextlib.suppress(OSError, ValueError):
                published = json.loads(path.read_text())
                if published.get("folder") in (str(folder), LATE_PLACE if late_too else str(folder)):
                    return cast(dict[str, Any], published)
        return None
    return wait_until(found, timeout, f"a standby ready for {folder}")


def test_jobs_taking_turns_in_two_folders_start_warm_in_each_and_one_slot_keeps_the_last_folder(
        bridge: Bridge) -> None:
    """Issue 65: a person hands over tasks in two projects in turn. With warm_start_folders 2 (the default) each
    folder keeps a warm Hermes of its own, so every job after the first in each starts warm; with 1, a job in the
    other folder takes the slot and the next job back starts cold, saying why."""
    first, second = bridge.root / "first", bridge.root / "second"
    first.mkdir()
    second.mkdir()
    bridge.configure(hermes_driver="acp", warm_start=True)
    with acp_client(bridge) as client:
        assert final(client, task="a !write=a.txt:1", cwd=str(first)).field("START").startswith("cold")
        waiting_for(bridge, first)
        other = final(client, task="b !write=b.txt:1", cwd=str(second))
        assert other.field("START").endswith("the warm Hermes waiting was readied for another folder)"), other.text
        waiting_for(bridge, second)
        health = client.call("hermes_health").field("WARM_START")
        assert f"next ACP job in {first} " in health and f"next ACP job in {second} " in health, health
        for turn in range(2):
            for folder in (first, second):
                job = final(client, task=f"turn {turn} !write=turn{turn}.txt:1", cwd=str(folder))
                assert job.field("STATUS") == "ok" and job.field("START").startswith("warm"), job.text
                assert (folder / f"turn{turn}.txt").read_text() == "1"
                waiting_for(bridge, folder)
    bridge.configure(hermes_driver="acp", warm_start=True, warm_start_folders=1)
    second_slot = bridge.jobs / "standby-1" / "ready.json"
    assert second_slot.exists()
    wait_until(lambda: not second_slot.exists() or None, 30, "the standby of the slot no longer kept to retire")
    with acp_client(bridge) as client:
        slot = bridge.jobs / "standby" / "ready.json"
        kept = json.loads(slot.read_text())["folder"]
        there, elsewhere = (first, second) if kept == str(first) else (second, first)
        assert final(client, task="kept !write=k.txt:1", cwd=str(there)).field("START").startswith("warm")
        waiting_for(bridge, there, slots="standby")  # the kept folder's next one, readied after the job took it
        moved = final(client, task="moved !write=m.txt:1", cwd=str(elsewhere))
        assert moved.field("START").endswith("readied for another folder)"), moved.text
        waiting_for(bridge, elsewhere, slots="standby")  # the one slot, taken over from the other folder
        back = final(client, task="back !write=back.txt:1", cwd=str(there))
        assert back.field("START").endswith("the warm Hermes waiting was readied for another folder)"), back.text


def test_jobs_started_together_in_one_folder_leave_a_warm_hermes_in_each_slot_for_the_next_ones(
        bridge: Bridge) -> None:
    """Issue 65: three jobs started together take the one warm Hermes there is; those started cold each ask for
    one more, so the next jobs started together find one in each slot (warm_start_folders, 2 by default) and two
    of them start warm at once."""
    bridge.configure(hermes_driver="acp", warm_start=True)
    with acp_client(bridge) as client:
        final(client, task="first !write=first.txt:1", cwd=str(bridge.root))
        waiting_for(bridge, bridge.root)

        def together(count: int, name: str) -> list[str]:
            started = [client.call("hermes_run", task=f"{name} {n} !sleep=1", cwd=str(bridge.root), wait_s=0
                                   ).field("JOB_ID") for n in range(count)]
            return [client.wait_final(job_id, timeout=60).field("START") for job_id in started]
        starts = together(3, "burst")
        assert [start.split(" ")[0] for start in starts].count("cold") >= 1, starts
        waiting_for(bridge, bridge.root, slots="standby")
        waiting_for(bridge, bridge.root, slots="standby-1")
        again = together(3, "again")  # the third may wait for one readied after the first two: warm as well
        assert sum(start.startswith("warm") and "being readied" not in start for start in again) >= 2, again


def test_a_queued_job_takes_the_warm_hermes_readied_while_it_waited(bridge: Bridge) -> None:
    """Issue 65: a job over max_running_jobs waits in the queue; when the slot frees, the job the queue starts is
    offered to the standby waiting for a job like it (`--offered ID`), as hermes_run offers a job, and starts
    warm, saying how long it waited; the standby is its supervisor from then on."""
    bridge.configure(hermes_driver="acp", warm_start=True, max_running_jobs=1)
    with acp_client(bridge) as client:
        client.call("hermes_run", task="first !sleep=4", cwd=str(bridge.root), wait_s=0)
        second = client.call("hermes_run", task="second !write=two.txt:2", cwd=str(bridge.root), wait_s=0)
        assert second.field("STATUS") == "queued", second.text
        waiting_for(bridge, bridge.root)
        done = client.wait_final(second.field("JOB_ID"))
    assert done.field("STATUS") == "ok", done.text
    assert done.field("START").startswith("warm (") and "it waited " in done.field("START"), done.text
    assert (bridge.root / "two.txt").read_text() == "2"
    record = bridge.record(second.field("JOB_ID"))
    [run] = [r for r in bridge.runs() if r.get("task", "").startswith("second")]
    assert run["marker"] == record.standby_marker  # a standby's Hermes, which that standby supervised:
    assert record.supervisor is not None and record.supervisor.create_time < record.created_at  # started before


def test_with_warm_start_any_folder_a_job_in_a_new_folder_takes_the_standby_bound_late(bridge: Bridge) -> None:
    """Issue 65 with the fake Hermes over ACP, as a Python console script like Hermes' own: with
    warm_start_any_folder a job leaves its folder's standby and one bound late beside it; a job in a folder no job
    ran in takes the late one warm, writes its own folder and cannot write the first one; the next job in the
    first folder takes that folder's own."""
    require_sandbox()
    exe = make_fake_hermes(bridge.tmp / "console-venv", console_script=True)
    bridge.configure(hermes_exe=str(exe), hermes_driver="acp", warm_start=True, warm_start_any_folder=True)
    first, new = bridge.root / "first", bridge.root / "new"
    for folder in (first, new):
        folder.mkdir()
    with acp_client(bridge) as client:
        assert final(client, task="first !write=one.txt:1", cwd=str(first)).field("STATUS") == "ok"
        standby = waiting_for(bridge, new)
        assert standby["folder"] == LATE_PLACE, standby
        own = waiting_for(bridge, first, late_too=False)
        intrusion = bridge.tmp / "intrude.sh"
        intrusion.write_text(f"echo x > {first}/intruded.txt || true\n")
        job = final(client, task=f"second !write=two.txt:2 !shell={intrusion}", cwd=str(new))
        again = final(client, task="third !write=three.txt:3", cwd=str(first))
    assert job.field("STATUS") == "ok", job.text
    assert job.field("START").startswith("warm (the task reached Hermes "), job.text
    assert (new / "two.txt").read_text() == "2"
    assert not (first / "intruded.txt").exists()
    assert "intruded.txt: Read-only file system" in Path(job.field("FULL_LOG")).read_text()  # the view holds it
    assert bridge.record(job.field("JOB_ID")).marker == standby["marker"]
    assert again.field("START").startswith("warm"), again.text
    assert bridge.record(again.field("JOB_ID")).marker == own["marker"] and (first / "three.txt").exists()
    recorded = json.loads((bridge.jobs / "standby-any" / AHEAD_RECORD).read_text())
    assert recorded["tested"] and "colorsys" in recorded["modules"], recorded  # what its first prompt imported
    late = waiting_for(bridge, bridge.root / "third", timeout=60)  # the next one bound late, readied after the job
    bridge.configure(max_output_chars=12345)  # other settings: it no longer fits
    (bridge.root / "third").mkdir()
    with acp_client(bridge) as client:
        stale = final(client, task="fourth !write=four.txt:4", cwd=str(bridge.root / "third"))
    assert stale.field("START").endswith("was started with other settings (config, Hermes, its home or "
                                         "environment))"), stale.text
    assert wait_until(lambda: gone(late["pid"]) or None, 30, "the stale late standby to retire")


def test_a_job_does_not_wait_for_the_late_standby_while_it_is_being_readied(bridge: Bridge) -> None:
    """A late standby's first readying records what Hermes imports and then imports it all, which can take
    longer than a cold start: a job in a folder without a standby of its own starts cold at once meanwhile, and
    says why."""
    require_sandbox()
    exe = make_fake_hermes(bridge.tmp / "console-venv", console_script=True)
    bridge.configure(hermes_exe=str(exe), hermes_driver="acp", warm_start=True)  # the late standby: the default
    first, new = bridge.root / "first", bridge.root / "new"
    for folder in (first, new):
        folder.mkdir()
    client = acp_client(bridge)
    client.params.env = dict(client.params.env or {}, FAKE_ACP_RECORDING_DELAY="60")
    with client:
        assert final(client, task="first !write=one.txt:1", cwd=str(first)).field("STATUS") == "ok"
        waiting_for(bridge, first, late_too=False)
        assert being_readied(bridge.jobs / "standby-any") == LATE_PLACE
        job = final(client, task="second !write=two.txt:2", cwd=str(new))
    assert job.field("STATUS") == "ok" and (new / "two.txt").read_text() == "2", job.text
    assert job.field("START").endswith("the warm Hermes for any folder is still being readied (it was not ready "
                                       "when this job started))"), job.text


@pytest.mark.parametrize(("messages", "prompt", "deleted"), [
    ([], None, True),  # a warm-up session
    ([("user", RECORDING_PROMPT, None), ("assistant", "Your request was not processed.", None)], RECORDING_PROMPT,
     True),  # a recording's, as Hermes 0.22.2 keeps it
    ([("user", "what a person said", None)], RECORDING_PROMPT, False),
    ([("user", RECORDING_PROMPT, None), ("assistant", None, '[{"id": "call_1"}]')], RECORDING_PROMPT, False),
    ([("user", RECORDING_PROMPT, None)], None, False),
])
def test_a_throw_away_session_is_deleted_only_while_it_holds_nothing_but_the_bridges_own_prompt(
        bridge: Bridge, monkeypatch: pytest.MonkeyPatch, messages: list[tuple[str, str | None, str | None]],
        prompt: str | None, deleted: bool) -> None:
    """A standby's warm-up session and a late standby's recording session leave Hermes' session list through
    Hermes' own command; a session holding anything a person, a job or a tool call made stays."""
    from claude_hermes_bridge.config import load_config
    from claude_hermes_bridge.standby import forget_warm_up

    home = bridge.tmp / "hermes-home"
    home.mkdir(exist_ok=True)
    session = "0f4b2a1c-5d6e-4f70-8a9b-0c1d2e3f4a5b"
    monkeypatch.setenv("HERMES_HOME", str(home))
    from fake_hermes import session_store

    with closing(session_store()) as db, db:
        db.execute("INSERT INTO sessions (id, source, started_at) VALUES (?, 'acp', 0)", (session,))
        db.executemany("INSERT INTO messages (session_id, role, content, tool_calls, timestamp) VALUES (?, ?, ?, ?, 0)",
                       [(session, *message) for message in messages])
    for name, value in bridge.env.items():
        monkeypatch.setenv(name, value)
    forget_warm_up(load_config(), session, prompt)
    assert (session not in sessions(bridge)) is deleted


def test_a_standby_bound_late_is_started_only_for_a_hermes_that_is_a_python_console_script(bridge: Bridge) -> None:
    """The server starts the late standby's program only where it could bind: not for a Hermes that is a shell
    script (the fast tier's fake), nor with the setting or the sandbox off."""
    from claude_hermes_bridge.config import load_config
    from claude_hermes_bridge.late_standby import may_bind_late

    console = make_fake_hermes(bridge.tmp / "console-venv", console_script=True)
    shell = make_fake_hermes(bridge.tmp / "shell-venv")
    found = {}
    cases: dict[str, dict[str, Any]] = {
        "console": {"hermes_exe": str(console)}, "shell": {"hermes_exe": str(shell)},
        "off": {"hermes_exe": str(console), "warm_start_any_folder": False},
        "unsandboxed": {"hermes_exe": str(console), "sandbox": "off"}}
    for name, settings in cases.items():
        bridge.configure(**{"warm_start_any_folder": True, "sandbox": "auto", **settings})
        found[name] = may_bind_late(load_config(bridge.config))
    assert found == {"console": sys.platform.startswith("linux"), "shell": False, "off": False, "unsandboxed": False}
