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

pytestmark = pytest.mark.posix("Landlock is Linux's")


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
        assert "DONE work" in log and "DONE tmp" in log and (bridge.root / "work.txt").read_text() == "done\n"
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
    assert "the repository's objects and the job's branch" in result.field("SANDBOX")
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
