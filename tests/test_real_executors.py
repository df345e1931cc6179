"""Issue 66 against the real Hermes 0.22.2 over ACP, driven by the scripted model: jobs whose commands run in a
container of a real docker daemon (a Debian image built offline) or on another host over a real sshd
(tests/executors_rig.sh starts both; .ci/run runs it), with the same evidence back: the block, the branch, the
landing. Each command proves where it ran (the container has no /work; the remote user is not this one)."""
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from test_real_hermes import write_hermes_home
from test_worktrees import git, make_repo

from claude_hermes_bridge.executors import LABEL_JOB, LABEL_JOBS, PROGRESS_FETCH_S, jobs_label
from conftest import require_component, require_sandbox
from harness import REAL_HERMES_VERSIONS, BridgeClient, nothing_started, refused, wait_until
from scripted_model import ScriptedModel

pytestmark = [pytest.mark.e2e, pytest.mark.posix("docker and sshd run on the Linux lane")]

RIG = Path(__file__).resolve().parent.parent / ".e2e" / "executors"
IMAGE = "chb-e2e:bookworm"
COMMIT = "git -c user.name=hermes -c user.email=hermes@test commit -qam"


def docker_host() -> str:
    socket = require_component(RIG / "docker" / "docker.sock", "the executors' docker daemon (tests/executors_rig.sh)")
    return f"unix://{socket}"


def job_containers(host: str, jobs: Path, job_id: str) -> list[str]:
    """This jobs folder's job's containers: a job of another test's jobs folder on the shared daemon may have the
    same id (ids are made per jobs folder, by the second)."""
    done = subprocess.run(["docker", "ps", "-aq", "--filter", f"label={LABEL_JOB}={job_id}", "--filter",
                           f"label={LABEL_JOBS}={jobs_label(jobs)}"],
                          capture_output=True, text=True, env={**os.environ, "DOCKER_HOST": host}, check=True)
    return done.stdout.split()


def final_of(client: BridgeClient, result: Any, timeout: float = 180) -> Any:
    job_id = result.field("JOB_ID")
    assert job_id, result.text
    return wait_until(lambda: r if (r := client.call("hermes_status", job_id=job_id, wait_s=10)).field("STATUS")
                      != "running" else None, timeout, f"job {job_id} to end")


@pytest.fixture
def on_docker(bridge):
    exe = require_component(REAL_HERMES_VERSIONS["0.22.2"], "the real Hermes CLI 0.22.2")
    host = docker_host()
    home = bridge.tmp / "real-home"
    with ScriptedModel(bridge.tmp) as model:
        write_hermes_home(home, model.base_url)
        bridge.configure(hermes_exe=str(exe), hermes_home=str(home), kill_grace_s=5, hermes_driver="acp",
                         network="model-only",
                         executors={"box": {"kind": "docker", "image": IMAGE, "docker_host": host}})
        with bridge.client() as client:
            yield bridge, client, host


def test_a_docker_default_job_runs_in_its_container_and_its_file_lands_in_its_folder(on_docker):
    bridge, client, host = on_docker
    folder = bridge.root / "plain"
    folder.mkdir()
    steps = "Write.\nRUN: test ! -d /work && echo in-container > made.txt && echo done"
    job = final_of(client, client.call("hermes_run", task=steps, cwd=str(folder), executor="box", wait_s=30))
    assert job.field("STATUS") == "ok", job.text
    assert (folder / "made.txt").read_text() == "in-container\n"
    assert job.field("EXECUTOR").startswith(f"box (docker image {IMAGE}"), job.text
    assert "container network none" in job.field("EXECUTOR"), job.text
    assert job_containers(host, bridge.jobs, job.field("JOB_ID")) == []


def test_a_resumed_docker_job_runs_in_a_container_again_unless_told_otherwise(on_docker):
    bridge, client, host = on_docker
    folder = bridge.root / "again"
    folder.mkdir()
    first = final_of(client, client.call("hermes_run", task="One.\nRUN: echo one > one.txt", cwd=str(folder),
                                         executor="box", wait_s=30))
    assert first.field("STATUS") == "ok", first.text
    again = final_of(client, client.call("hermes_resume", session_id=first.field("SESSION_ID"), wait_s=30,
                                         task="Two.\nRUN: test ! -d /work && cat one.txt > two.txt"))
    assert again.field("STATUS") == "ok" and again.field("EXECUTOR").startswith("box (docker"), again.text
    assert (folder / "two.txt").read_text() == "one\n"
    local = final_of(client, client.call("hermes_resume", session_id=first.field("SESSION_ID"), wait_s=30,
                                         executor="local", task="Three.\nRUN: test -d /work && echo here > three.txt"))
    assert local.field("EXECUTOR") == "local (this machine)", local.text
    assert (folder / "three.txt").read_text() == "here\n"


def test_a_docker_worktree_job_commits_in_its_container_and_the_merge_lands_it(on_docker):
    bridge, client, host = on_docker
    repo = make_repo(bridge.root / "repo")
    steps = (f"Edit and commit.\nRUN: test ! -d /work && echo boxed > boxed.txt && git add -A && {COMMIT} 'boxed' "
             "&& echo committed")
    job = final_of(client, client.call("hermes_run", task=steps, cwd=str(repo), isolation="worktree",
                                       executor="box", wait_s=30))
    assert job.field("STATUS") == "ok", job.text
    assert job.field("DIFF").startswith("1 file changed"), job.text
    merged = client.call("hermes_land", job_id=job.field("JOB_ID"), action="merge")
    assert merged.field("STATUS") == "ok", merged.text
    assert (repo / "boxed.txt").read_text() == "boxed\n"
    assert "boxed" in git(repo, "log", "--format=%s").splitlines()  # the commit made in the container


def waiting_in_its_container(bridge: Any, client: BridgeClient, host: str, name: str) -> tuple[Any, str]:
    """A docker job in a folder of its own, sleeping in its container (which exists by then): its first block and id.
    A container seen before Hermes is recorded is the mount probe's, run before Hermes starts, with the job's
    labels; once Hermes is recorded, that probe has been removed (`docker run --rm` returns after)."""
    folder = bridge.root / name
    folder.mkdir()
    started = client.call("hermes_run", task="Wait.\nRUN: sleep 300", cwd=str(folder), executor="box", wait_s=1)
    job_id = started.field("JOB_ID")
    bridge.wait_record(job_id, "hermes", 60)
    wait_until(lambda: job_containers(host, bridge.jobs, job_id) or None, 60, "the job's container")
    return started, job_id


def test_a_cancelled_docker_job_leaves_no_container(on_docker):
    bridge, client, host = on_docker
    started, job_id = waiting_in_its_container(bridge, client, host, "slow")
    client.call("hermes_cancel", job_id=job_id)
    began = time.monotonic()
    wait_until(lambda: job_containers(host, bridge.jobs, job_id) == [] or None, 20, "the container to go")
    assert time.monotonic() - began < 20
    final = final_of(client, started)
    assert final.field("STATUS") == "cancelled", final.text


def test_a_container_left_by_a_killed_supervisor_is_removed_at_the_next_server_start(on_docker):
    bridge, client, host = on_docker
    _, job_id = waiting_in_its_container(bridge, client, host, "killed")
    record = bridge.record(job_id)
    for pid in (record.supervisor.pid, record.hermes.pid):  # the supervisor first, so nothing removes it
        os.kill(pid, signal.SIGKILL)
    time.sleep(1)
    assert job_containers(host, bridge.jobs, job_id), "the container outlives its killed Hermes"
    with bridge.client() as again:
        wait_until(lambda: job_containers(host, bridge.jobs, job_id) == [] or None, 30, "the next server to remove it")
        assert again.call("hermes_status", job_id=job_id).field("STATUS") == "orphaned"
    audit = (bridge.tmp / "logs" / "audit.log").read_text()
    assert f"removed 1 container(s) left by ended jobs on executor box: {job_id}" in audit


def test_check_says_whether_each_executor_is_ready(on_docker):
    bridge, client, host = on_docker
    bridge.configure(executors={"box": {"kind": "docker", "image": IMAGE, "docker_host": host},
                                "gone": {"kind": "docker", "image": "chb-e2e:missing", "docker_host": host}})
    done = subprocess.run([sys.executable, str(Path(__file__).resolve().parent.parent / "server.py"), "--check"],
                          env=bridge.env, capture_output=True, text=True, timeout=300)
    assert f"EXECUTOR box: ready: box (docker image {IMAGE}" in done.stdout, done.stdout
    assert "EXECUTOR gone: NO: executor gone: the image chb-e2e:missing is not on the docker daemon" in done.stdout


def test_docker_refusals_name_the_problem_and_start_nothing(on_docker):
    bridge, client, host = on_docker
    folder = bridge.root / "p"
    folder.mkdir()
    unknown = client.call("hermes_run", task="x", cwd=str(folder), executor="nowhere")
    assert refused(unknown, "executor 'nowhere' is not in the executors table", "known: local, box")
    bridge.configure(executors={"box": {"kind": "docker", "image": "chb-e2e:missing", "docker_host": host},
                                "dead": {"kind": "docker", "image": IMAGE,
                                         "docker_host": f"unix://{bridge.tmp}/no.sock"}})
    missing = client.call("hermes_run", task="x", cwd=str(folder), executor="box")
    assert refused(missing, "the image chb-e2e:missing is not on the docker daemon", "docker pull chb-e2e:missing")
    dead = client.call("hermes_run", task="x", cwd=str(folder), executor="dead")
    assert refused(dead, "does not answer", "start it, or fix docker_host")
    bridge.configure(executors={"box": {"kind": "podman", "image": IMAGE}})
    malformed = client.call("hermes_run", task="x", cwd=str(folder), executor="box")
    assert refused(malformed, "executor 'box' is not in the executors table")
    nothing_started(bridge)


@pytest.fixture
def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def ssh_rig() -> tuple[str, int, Path]:
    key = require_component(RIG / "sshd" / "id_ed25519", "the executors' sshd (tests/executors_rig.sh)")
    return (RIG / "sshd" / "user").read_text().strip(), int((RIG / "sshd" / "port").read_text()), key


def trust_host(home: Path, port: int) -> None:
    """The test's own known_hosts (the server's HOME is the test's), with the rig's host key, as a user would add
    it after checking its fingerprint."""
    public = (RIG / "sshd" / "host_ed25519.pub").read_text().split()
    (home / ".ssh").mkdir(parents=True, exist_ok=True)
    (home / ".ssh" / "known_hosts").write_text(f"[127.0.0.1]:{port} {public[0]} {public[1]}\n")


@pytest.fixture
def on_ssh(bridge):
    exe = require_component(REAL_HERMES_VERSIONS["0.22.2"], "the real Hermes CLI 0.22.2")
    user, port, key = ssh_rig()
    own_key = bridge.tmp / "id_lab"
    own_key.write_bytes(key.read_bytes())
    own_key.chmod(0o600)
    home = bridge.tmp / "real-home"
    with ScriptedModel(bridge.tmp) as model:
        write_hermes_home(home, model.base_url)
        bridge.configure(hermes_exe=str(exe), hermes_home=str(home), kill_grace_s=5, hermes_driver="acp",
                         network="model-only", executors={"lab": {
                             "kind": "ssh", "host": "127.0.0.1", "port": port, "user": user, "key": str(own_key),
                             "remote_root": f".hermes-bridge-{bridge.tmp.name}"}})
        with bridge.client() as client:
            yield bridge, client, user, port, own_key


def test_an_ssh_worktree_job_runs_on_the_host_and_its_commit_comes_back_and_merges(on_ssh):
    bridge, client, user, port, _ = on_ssh
    trust_host(bridge.tmp / "home", port)
    repo = make_repo(bridge.root / "repo")
    steps = (f"Work there.\nRUN: test \"$(id -un)\" = {user} && echo remote > remote.txt && git add -A && "
             f"{COMMIT} 'made on the host' && echo left > left.txt && echo committed")
    job = final_of(client, client.call("hermes_run", task=steps, cwd=str(repo), isolation="worktree",
                                       executor="lab", wait_s=30))
    assert job.field("STATUS") == "ok", job.text
    assert job.field("EXECUTOR").startswith(f"lab (ssh {user}@127.0.0.1 port {port})"), job.text
    assert "came back from 127.0.0.1" in job.field("EXECUTOR"), job.text
    assert job.field("DIFF").startswith("2 files changed"), job.text
    merged = client.call("hermes_land", job_id=job.field("JOB_ID"), action="merge")
    assert merged.field("STATUS") == "ok", merged.text
    assert (repo / "remote.txt").read_text() == "remote\n" and (repo / "left.txt").read_text() == "left\n"
    assert "made on the host" in git(repo, "log", "--format=%s").splitlines()


def test_an_ssh_job_resumed_goes_on_on_the_host_from_its_branch(on_ssh):
    bridge, client, user, port, _ = on_ssh
    trust_host(bridge.tmp / "home", port)
    repo = make_repo(bridge.root / "repo")
    first = final_of(client, client.call("hermes_run", task="One.\nRUN: echo one > one.txt && echo done", cwd=str(repo),
                                         isolation="worktree", executor="lab", wait_s=30))
    assert first.field("STATUS") == "ok", first.text
    resumed = final_of(client, client.call("hermes_resume", session_id=first.field("SESSION_ID"), wait_s=30,
                                           task=f"Two.\nRUN: test \"$(id -un)\" = {user} && cat one.txt > two.txt"))
    assert resumed.field("STATUS") == "ok", resumed.text
    assert resumed.field("EXECUTOR").startswith("lab (ssh"), resumed.text
    assert resumed.field("CWD") == first.field("CWD"), resumed.text
    assert resumed.field("DIFF").startswith("2 files changed"), resumed.text
    worktree = Path(resumed.field("CWD"))
    assert (worktree / "two.txt").read_text() == "one\n"


def test_a_host_lost_mid_job_ends_it_in_error_naming_the_host_and_keeps_what_came_back_so_far(on_ssh, free_port):
    bridge, client, user, port, key = on_ssh
    own = subprocess.Popen(["/usr/sbin/sshd", "-D", "-f", str(RIG / "sshd" / "sshd_config"), "-o", f"Port={free_port}",
                            "-o", f"PidFile={bridge.tmp}/sshd.pid", "-E", str(bridge.tmp / "sshd.log")])
    try:
        trust_host(bridge.tmp / "home", free_port)
        bridge.configure(executors={"lab": {"kind": "ssh", "host": "127.0.0.1", "port": free_port, "user": user,
                                            "key": str(key), "remote_root": f".hermes-bridge-{bridge.tmp.name}"}})
        repo = make_repo(bridge.root / "repo")
        started = client.call("hermes_run", task=f"Slow.\nRUN: echo early > early.txt && git add -A && {COMMIT} "
                              "early && sleep 40 && echo late > late.txt", cwd=str(repo), isolation="worktree",
                              executor="lab", wait_s=1)
        job_id = started.field("JOB_ID")
        wait_until(lambda: (bridge.record(job_id).worktree or {}).get("remote") and bridge.record(job_id).hermes,
                   60, "the job to start on the host")
        time.sleep(PROGRESS_FETCH_S + 8)  # its early commit fetched back while it runs
    finally:  # the host goes away: its listener and every connection it had (its own descendants alone)
        for process in [*psutil.Process(own.pid).children(recursive=True), psutil.Process(own.pid)]:
            with contextlib.suppress(psutil.Error):
                process.kill()
        own.wait()
    final = final_of(client, started)
    assert final.field("STATUS") == "error", final.text
    assert "the host 127.0.0.1 was lost before the job's work came back" in final.field("REASON"), final.text
    assert "the work did not all come back from 127.0.0.1" in final.field("EXECUTOR"), final.text
    assert "the branch keeps what came back while it ran" in final.field("REASON"), final.text
    assert final.field("DIFF").startswith("1 file changed"), final.text
    assert (Path(final.field("CWD")) / "early.txt").read_text() == "early\n"


def test_ssh_refusals_name_the_problem_and_start_nothing(on_ssh):
    bridge, client, user, port, key = on_ssh
    repo = make_repo(bridge.root / "repo")
    unknown_host = client.call("hermes_run", task="x", cwd=str(repo), isolation="worktree", executor="lab")
    assert refused(unknown_host, f"the host key of [127.0.0.1]:{port} is not in", "never accepts one silently",
                   "ssh-keyscan")
    trust_host(bridge.tmp / "home", port)
    in_place = client.call("hermes_run", task="x", cwd=str(repo), executor="lab")
    assert refused(in_place, 'give isolation="worktree"')
    key.chmod(0o644)
    loose = client.call("hermes_run", task="x", cwd=str(repo), isolation="worktree", executor="lab")
    assert refused(loose, "is readable by others", "chmod 600")
    key.chmod(0o600)
    bridge.configure(executors={"lab": {"kind": "ssh", "host": "127.0.0.1", "port": port, "user": "nobody-here",
                                        "key": str(key)}})
    refusing = client.call("hermes_run", task="x", cwd=str(repo), isolation="worktree", executor="lab")
    assert refused(refusing, "failed", "authorized there")
    bridge.configure(executors={"lab": {"kind": "ssh", "host": "127.0.0.1", "port": port, "user": user,
                                        "key": str(bridge.tmp / "missing")}})
    missing = client.call("hermes_run", task="x", cwd=str(repo), isolation="worktree", executor="lab")
    assert refused(missing, "does not exist")
    nothing_started(bridge)


def test_a_local_job_cannot_reach_the_real_docker_daemon_that_docker_host_names(bridge):
    """Issue 63 against a real daemon: the server's DOCKER_HOST names it; a sandboxed job on this machine runs
    `docker version` and is refused (its socket hidden under /dev/null in the job's mount namespace), while the
    user's own docker reaches it."""
    require_sandbox()
    host = docker_host()
    script = bridge.tmp / "docker.sh"
    script.write_text(f"DOCKER_HOST={host} docker version --format '{{{{.Server.Version}}}}' > out.txt 2>&1; "
                      "echo $? > code.txt\n")
    bridge.extra_env["DOCKER_HOST"] = host
    with bridge.client() as client:
        job = final_of(client, client.call("hermes_run", task=f"docker !shell={script}", cwd=str(bridge.root),
                                           wait_s=30))
    assert job.field("STATUS") == "ok", job.text
    assert (bridge.root / "code.txt").read_text().strip() != "0", (bridge.root / "out.txt").read_text()
    assert "Cannot connect to the Docker daemon" in (bridge.root / "out.txt").read_text()
    assert host[len("unix://"):] in job.field("READ_ONLY"), job.text
    mine = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True,
                          env={**os.environ, "DOCKER_HOST": host}, check=False)
    assert mine.returncode == 0 and mine.stdout.strip(), mine.stderr
