"""Issue 38 with the real Hermes 0.19.0 and 0.22.2, over both drivers, under `approvals: yolo` (the worst case:
nothing asks before a command): every escape is a terminal call of its own, refused by the system while Hermes
goes on; and a normal job (files, a commit on its worktree branch, a package installed into a venv in its
folder, its session resumed, its spend read) works unchanged under the sandbox."""
import subprocess
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
from test_real_hermes import assert_turn_ended, finish, write_hermes_home
from test_sandbox import ESCAPES, REFUSED, WORK, contents, escapes
from test_worktrees import git, make_repo

from conftest import require_component, require_sandbox
from harness import REAL_ACP_VERSIONS, REAL_HERMES_VERSIONS, Bridge, BridgeClient
from scripted_model import ScriptedModel

pytestmark = [pytest.mark.e2e, pytest.mark.posix("Landlock is Linux's")]


@pytest.fixture(params=[(version, driver) for version in REAL_ACP_VERSIONS for driver in ("cli", "acp")],
                ids=lambda param: f"hermes-{param[0]}-{param[1]}")
def sandboxed(bridge: Bridge, request: pytest.FixtureRequest) -> Any:
    require_sandbox()
    version, driver = request.param
    exe = require_component(REAL_HERMES_VERSIONS[version], f"the real Hermes CLI {version}")
    home = bridge.tmp / "real-home"
    (home / "skills").mkdir(parents=True)  # as any earlier run of Hermes leaves it
    with ScriptedModel(bridge.tmp) as model:
        write_hermes_home(home, model.base_url)
        bridge.configure(hermes_exe=str(exe), hermes_home=str(home), kill_grace_s=5, hermes_driver=driver,
                         approvals="yolo")
        with bridge.client() as client:
            yield bridge, client, home


def test_each_escape_is_refused_by_the_system_and_the_job_goes_on_to_do_its_work(
        sandboxed: tuple[Bridge, BridgeClient, Path]) -> None:
    bridge, client, home = sandboxed
    victim = subprocess.Popen(["sleep", "120"])
    try:
        script, targets = escapes(bridge, victim.pid, home)
        before, settings_before = contents(targets), (home / "config.yaml").read_bytes()
        steps = "\n".join(f"RUN: sh {script} {name}" for name in (*ESCAPES, *WORK))
        result = finish(client, client.call("hermes_run", task=f"Try each.\n{steps}", wait_s=45), timeout=240)
        assert_turn_ended(result)
        time.sleep(1.5)  # the background process' write, had it been allowed
        log = (bridge.root / "tried.txt").read_text()
        assert [line.split()[1] for line in log.splitlines()] == [*ESCAPES, *WORK], log  # one call each, in order
        for name in REFUSED:
            assert f"DENIED {name}" in log, (name, log)
        assert all(f"DONE {name}" in log for name in WORK) and (bridge.root / "work.txt").read_text() == "done\n"
        assert contents(targets) == before and victim.poll() is None
        assert (home / "config.yaml").read_bytes() == settings_before and not (home / "skills" / "x").exists()
        settings = result.field("HERMES_SETTINGS")
        assert "the job changed config.yaml; put back (the job's version: " in settings, result.text
        assert "the job created skills/x; put back" in settings, result.text
        assert result.field("SANDBOX").startswith(f"writes limited to {bridge.root}, "), result.text
    finally:
        victim.kill()


def tiny_wheel(folder: Path) -> Path:
    """A package to install offline: one module, its metadata, a RECORD without hashes."""
    wheel = folder / "tiny-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("tiny.py", "WORDS = 'tiny works'\n")
        archive.writestr("tiny-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: tiny\nVersion: 1.0\n")
        archive.writestr("tiny-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                      "Tag: py3-none-any\n")
        archive.writestr("tiny-1.0.dist-info/RECORD", "tiny.py,,\ntiny-1.0.dist-info/METADATA,,\n"
                                                      "tiny-1.0.dist-info/WHEEL,,\ntiny-1.0.dist-info/RECORD,,\n")
    return wheel


def test_a_normal_worktree_job_commits_installs_into_its_venv_and_is_resumed_under_the_sandbox(
        sandboxed: tuple[Bridge, BridgeClient, Path]) -> None:
    bridge, client, _ = sandboxed
    repo = make_repo(bridge.root / "repo", {"README.md": "hello\n"})
    wheel = tiny_wheel(bridge.tmp)
    task = ("Work.\nRUN: echo new > new.txt && git add new.txt && git -c user.name=job -c user.email=job@example.com "
            "commit -qm 'the job' && echo committed\n"
            f"RUN: python3 -m venv v && v/bin/pip install -q --no-index {wheel} && v/bin/python -c "
            "'import tiny; print(tiny.WORDS)'")
    result = finish(client, client.call("hermes_run", task=task, cwd=str(repo), isolation="worktree", wait_s=45),
                    timeout=240)
    assert_turn_ended(result)
    assert result.field("SANDBOX").startswith("writes limited to "), result.text
    assert "the job's own git objects and branch" in result.field("SANDBOX")
    answer = result.text.split("--- HERMES ANSWER ---")[1].split("--- HERMES OUTPUT ---")[0]
    assert answer.count("SCRIPTED DONE: ") == 1 and "tiny works" in answer, result.text  # the last call's output
    branch = f"hermes-bridge/{result.field('JOB_ID')}"
    assert git(repo, "log", "-1", "--format=%s", branch) == "the job" and "REPOSITORY" not in result.text
    assert result.field("SPEND").split(";")[0].endswith(("API call", "API calls")), result.text
    session = result.field("SESSION_ID")
    resumed = finish(client, client.call("hermes_resume", session_id=session, task="What did you do?", wait_s=45),
                     timeout=240)
    assert_turn_ended(resumed)
    assert resumed.field("SESSION_ID") == session and resumed.field("SANDBOX").startswith("writes limited to ")


def test_what_a_job_plants_to_run_later_is_put_back_or_named_and_it_writes_no_terminal(
        sandboxed: tuple[Bridge, BridgeClient, Path]) -> None:
    """Issue 47 with the real Hermes: a job in the user's own repository plants a hook, core.fsmonitor and an
    alias, writes .claude/settings.json, .mcp.json, .envrc and .vscode/tasks.json, writes and types into a
    terminal the test has open, leaves a file in /dev/shm, and writes 6,000 skills before a hook and a cron job
    into Hermes' home. The git folder is read-only (its writes refused), Hermes' home put back, the project's files
    named, the terminal out
    of reach, the /dev/shm file gone with the job; its own work stays."""
    import os
    import uuid

    from test_containment import PLANTS, written_to

    bridge, client, home = sandboxed
    repo = make_repo(bridge.root / "repo")
    mark = bridge.tmp / "planted-ran"
    config_before = (repo / ".git" / "config").read_bytes()
    master, follower = os.openpty()
    shm = Path("/dev/shm", f"bridge-test-{uuid.uuid4().hex}")
    try:
        script = bridge.tmp / "plant.sh"
        script.write_text("\n".join(command.format(mark=mark) for command in PLANTS.values()) + f"""
mkdir -p .vscode .claude && echo '{{}}' > .vscode/tasks.json && echo '{{}}' > .claude/settings.json
echo '{{}}' > .mcp.json && echo 'export X=1' > .envrc && echo work > work.txt
printf pwned > {os.ttyname(follower)}; echo left > /dev/shm/{shm.name}
python3 -c 'import fcntl, os, termios; fd = os.open("{os.ttyname(follower)}", os.O_RDWR | os.O_NOCTTY)
fcntl.ioctl(fd, termios.TIOCSTI, b"x")' || echo typing-refused > typed.txt
python3 -c 'import pathlib; s = pathlib.Path("{home}/skills/many"); s.mkdir(parents=True)
[(s / f"{{n}}.md").write_text("x") for n in range(6000)]'
mkdir -p {home}/hooks/evil {home}/cron && echo pwned > {home}/hooks/evil/handler.py && echo '[]' > {home}/cron/jobs.json
""")
        job = finish(client, client.call("hermes_run", task=f"Plant.\nRUN: sh {script}; echo planted",
                                         cwd=str(repo), wait_s=45))
        written = written_to(master)
    finally:
        os.close(master)
        os.close(follower)
        shm.unlink(missing_ok=True)
    assert b"pwned" not in written and not shm.exists(), "the job wrote the test's terminal or left /dev/shm files"
    assert job.field("STATUS") == "ok", job.text
    assert (repo / "work.txt").read_text() == "work\n" and (repo / "typed.txt").read_text() == "typing-refused\n"
    assert (repo / ".git" / "config").read_bytes() == config_before
    assert not (repo / ".git" / "hooks" / "pre-commit").exists()
    assert "REPOSITORY:" not in job.text and "a `git commit` in this job is refused" in job.field("READ_ONLY")
    for name in (".envrc", ".mcp.json", ".vscode/tasks.json", ".claude/settings.json"):
        assert name in job.field("RUNS_LATER"), job.text
    assert not (home / "hooks" / "evil").exists() and not (home / "cron" / "jobs.json").exists(), job.text
    assert not (home / "skills" / "many").exists()
    git(repo, "add", "work.txt")
    git(repo, "commit", "-qm", "the user's next commit")
    subprocess.run(["git", "-C", str(repo), "st"], capture_output=True)
    assert not mark.exists(), "a program the job planted ran at the user's next git command"
