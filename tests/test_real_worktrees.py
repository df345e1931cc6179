"""Issue 30 against the real Hermes 0.19.0, 0.20.1 and 0.22.2 over the CLI, and 0.19.0 and 0.22.2 over ACP,
driven by the scripted model: a job that edits and commits in its worktree, a resume that goes on there, a
merge, a conflict refused, a discard. Hermes' terminal runs the git commands the model asks for, as a real
model would."""
from typing import Any

import pytest
from test_real_hermes import write_hermes_home
from test_repository_guard import common_files, poison_script
from test_worktrees import git, make_repo, state_of

from conftest import require_component
from harness import REAL_ACP_VERSIONS, REAL_HERMES_VERSIONS, BridgeClient, refused, wait_until
from scripted_model import ScriptedModel

pytestmark = [pytest.mark.e2e,
              pytest.mark.posix("the e2e install (tests/install_e2e.sh) is a bash script with POSIX venv paths")]

COMMIT = "git -c user.name=hermes -c user.email=hermes@test commit -qam"
WAYS = [(version, "cli") for version in sorted(REAL_HERMES_VERSIONS)] + [(version, "acp")
                                                                         for version in REAL_ACP_VERSIONS]


@pytest.fixture(params=WAYS, ids=lambda way: f"hermes-{way[0]}-{way[1]}")
def real_git(bridge, request):
    version, driver = request.param
    exe = require_component(REAL_HERMES_VERSIONS[version], f"the real Hermes CLI {version}")
    home = bridge.tmp / "real-home"
    with ScriptedModel(bridge.tmp) as model:
        write_hermes_home(home, model.base_url)
        bridge.configure(hermes_exe=str(exe), hermes_home=str(home), kill_grace_s=5, hermes_driver=driver)
        with bridge.client() as client:
            yield bridge, make_repo(bridge.root / "repo"), client


def final_of(client: BridgeClient, result: Any, timeout: float = 150) -> Any:
    job_id = result.field("JOB_ID")
    return wait_until(lambda: r if (r := client.call("hermes_status", job_id=job_id, wait_s=10)).field("STATUS")
                      != "running" else None, timeout, f"job {job_id} to end")


def test_hermes_edits_and_commits_in_its_worktree_a_resume_goes_on_there_and_a_merge_lands_it(real_git):
    bridge, repo, client = real_git
    before = state_of(repo)
    steps = ("Edit and commit.\nRUN: printf 'one\\ntwo\\nTHREE\\n' > a.txt && git add -A && "
             f"{COMMIT} 'three in capitals' && echo committed\nRUN: echo bee > b.txt && echo left")
    first = final_of(client, client.call("hermes_run", task=steps, cwd=str(repo), isolation="worktree", wait_s=45))
    assert first.field("STATUS") == "ok", first.text
    worktree = bridge.jobs / "worktrees" / first.field("JOB_ID")
    assert first.field("CWD") == str(worktree)
    assert git(worktree, "log", "-1", "--format=%s") == "three in capitals"
    assert first.field("DIFF").startswith("2 files changed, +2 -1"), first.field("DIFF")
    assert state_of(repo) == before and not (repo / "b.txt").exists()

    resumed = final_of(client, client.call("hermes_resume", session_id=first.field("SESSION_ID"), wait_s=45,
                                           task="More.\nRUN: echo sea > c.txt && echo more"))
    assert resumed.field("STATUS") == "ok", resumed.text
    assert resumed.field("CWD") == str(worktree), resumed.text
    assert (worktree / "c.txt").read_text() == "sea\n" and not (repo / "c.txt").exists()
    assert resumed.field("DIFF").startswith("3 files changed"), resumed.field("DIFF")

    merged = client.call("hermes_land", job_id=resumed.field("JOB_ID"), action="merge")
    assert merged.field("STATUS") == "ok" and "merged into main" in merged.field("LANDED"), merged.text
    assert (repo / "a.txt").read_text() == "one\ntwo\nTHREE\n"
    assert (repo / "b.txt").read_text() == "bee\n" and (repo / "c.txt").read_text() == "sea\n"
    assert git(repo, "status", "--porcelain") == "" and not worktree.exists()


def test_a_conflicting_job_is_refused_and_then_discarded(real_git):
    bridge, repo, client = real_git
    steps = f"Change a.\nRUN: echo hermes > a.txt && {COMMIT} 'hermes version' && echo done"
    job = final_of(client, client.call("hermes_run", task=steps, cwd=str(repo), isolation="worktree", wait_s=45))
    assert job.field("STATUS") == "ok", job.text
    (repo / "a.txt").write_text("the user's\n")
    git(repo, "commit", "-qam", "the user's version")
    before = state_of(repo)
    conflict = client.call("hermes_land", job_id=job.field("JOB_ID"), action="merge")
    assert refused(conflict) and "conflicts with the main tree in 1 path: a.txt" in conflict.text, conflict.text
    assert state_of(repo) == before
    discarded = client.call("hermes_land", job_id=job.field("JOB_ID"), action="discard")
    assert discarded.field("STATUS") == "ok", discarded.text
    assert not (bridge.jobs / "worktrees" / job.field("JOB_ID")).exists()
    assert git(repo, "branch", "--list", "hermes-bridge/*") == ""
    assert (repo / "a.txt").read_text() == "the user's\n"


def test_a_real_hermes_job_that_poisons_the_shared_repository_has_it_put_back_and_reported(bridge):
    """Issue 37: the same poisoning as tests/test_repository_guard.py, by the real Hermes 0.22.2 over ACP under
    `approvals: yolo`, its terminal running plain git as the scripted model asks."""
    exe = require_component(REAL_HERMES_VERSIONS["0.22.2"], "the real Hermes CLI 0.22.2")
    home = bridge.tmp / "real-home"
    repo = make_repo(bridge.root / "repo")
    script, mark = poison_script(bridge)
    before = common_files(repo)
    with ScriptedModel(bridge.tmp) as model:
        write_hermes_home(home, model.base_url)
        bridge.configure(hermes_exe=str(exe), hermes_home=str(home), kill_grace_s=5, hermes_driver="acp",
                         approvals="yolo", sandbox="off")  # the restore is what holds where no sandbox is
        with bridge.client() as client:
            steps = (f"Set the repository up.\nRUN: FAKE_JOB_SHELL=1 sh {script} && echo b > b.txt && "
                     f"FAKE_JOB_SHELL=1 {COMMIT.replace('-qam', '-qm')} work -q --all && echo planted")
            job = final_of(client, client.call("hermes_run", task=steps, cwd=str(repo), isolation="worktree",
                                               wait_s=45))
            assert job.field("STATUS") == "ok", job.text
            assert common_files(repo) == before
            landed = client.call("hermes_land", job_id=job.field("JOB_ID"), action="merge")
    reported = job.field("REPOSITORY")
    assert "the job changed .git/config (core.fsmonitor, core.hookspath, filter.pwn.*, include.path, " \
           "merge.pwn.*); restored" in reported, job.text
    assert "the job created .git/hooks/pre-commit; restored" in reported
    assert "refs/tags/planted-tag" in reported
    assert landed.field("STATUS") == "ok", landed.text
    git(repo, "commit", "--allow-empty", "-qm", "the user's next commit")
    assert not mark.exists(), "a program the job planted ran outside the job"


@pytest.mark.parametrize("way", [("0.19.0", "cli"), ("0.19.0", "acp"), ("0.22.2", "cli"), ("0.22.2", "acp")],
                         ids=lambda way: f"hermes-{way[0]}-{way[1]}")
def test_a_real_hermes_worktree_job_cannot_touch_the_history_and_its_commit_lands(bridge, way):
    """Issue 47 with the real Hermes, sandboxed, `approvals: yolo`: its terminal runs the attacks of
    tests/test_containment.py on the shared repository (each refused) and commits its own work (landed whole)."""
    from test_containment import assert_history_kept, history, history_attack_script, repo_with_history

    from conftest import require_sandbox

    require_sandbox()
    version, driver = way
    exe = require_component(REAL_HERMES_VERSIONS[version], f"the real Hermes CLI {version}")
    home = bridge.tmp / "real-home"
    repo = repo_with_history(bridge)
    before = history(repo)
    script = history_attack_script(bridge.tmp)
    with ScriptedModel(bridge.tmp) as model:
        write_hermes_home(home, model.base_url)
        bridge.configure(hermes_exe=str(exe), hermes_home=str(home), kill_grace_s=5, hermes_driver=driver,
                         approvals="yolo")
        with bridge.client() as client:
            job = final_of(client, client.call("hermes_run", task=f"Work.\nRUN: sh {script} && echo tried",
                                               cwd=str(repo), isolation="worktree", wait_s=45))
            assert_history_kept(bridge, job, repo, before)
            landed = client.call("hermes_land", job_id=job.field("JOB_ID"), action="merge")
    assert landed.field("STATUS") == "ok", landed.text
    assert (repo / "mine.txt").read_text() == "mine\n" and history(repo) == before
    assert "mine" in git(repo, "log", "--format=%s", "main").splitlines()


LAZY_FETCH_ATTACK = """set -e
evil="$TMPDIR/evil"; mkdir -p "$evil"
(unset GIT_DIR GIT_COMMON_DIR GIT_INDEX_FILE GIT_OBJECT_DIRECTORY GIT_ALTERNATE_OBJECT_DIRECTORIES
git init -q "$evil/src"; echo blob > "$evil/src/big.txt"
git -C "$evil/src" add big.txt; git -C "$evil/src" -c user.name=a -c user.email=a@b commit -qm big
git -C "$evil/src" config uploadpack.allowFilter true
git clone -q --filter=blob:none --no-checkout "file://$evil/src" "$evil/clone"
printf '#!/bin/sh\\necho ran >> %s\\nexec git-upload-pack "$@"\\n' "$MARK" > "$evil/up.sh"; chmod +x "$evil/up.sh"
git -C "$evil/clone" config remote.origin.uploadpack "$evil/up.sh")
admin=$(git rev-parse --git-dir)
(echo "$evil/clone/.git" > "$admin/commondir") 2>/dev/null && echo planted >> tried.txt || echo refused >> tried.txt
echo mine > mine.txt; git add mine.txt tried.txt; git -c user.name=h -c user.email=h@t commit -qm mine
"""


@pytest.mark.parametrize("version", REAL_ACP_VERSIONS)
def test_a_real_hermes_worktree_job_cannot_make_the_bridges_git_fetch_through_its_remote(bridge, version):
    """Issue 63 with the real Hermes over ACP, sandboxed, `approvals: yolo`: the job makes a partial clone whose
    promisor remote's uploadpack is its program and names it in its worktree's commondir, as an attacker would;
    the admin folder's commondir is read-only in its mount namespace, the bridge's git refuses every transport,
    and the program never runs outside the job when the bridge saves the work, which lands whole."""
    from conftest import require_sandbox

    require_sandbox()
    exe = require_component(REAL_HERMES_VERSIONS[version], f"the real Hermes CLI {version}")
    home, mark = bridge.tmp / "real-home", bridge.tmp / "MARK"
    repo = make_repo(bridge.root / "repo")
    script = bridge.tmp / "lazy.sh"
    script.write_text(LAZY_FETCH_ATTACK.replace("$MARK", str(mark)))
    with ScriptedModel(bridge.tmp) as model:
        write_hermes_home(home, model.base_url)
        bridge.configure(hermes_exe=str(exe), hermes_home=str(home), kill_grace_s=5, hermes_driver="acp",
                         approvals="yolo")
        with bridge.client() as client:
            job = final_of(client, client.call("hermes_run", task=f"Work.\nRUN: sh {script} && echo tried",
                                               cwd=str(repo), isolation="worktree", wait_s=45))
            assert job.field("STATUS") == "ok", job.text
            branch = f"hermes-bridge/{job.field('JOB_ID')}"
            assert git(repo, "show", f"{branch}:tried.txt") == "refused", job.text
            landed = client.call("hermes_land", job_id=job.field("JOB_ID"), action="merge")
    assert landed.field("STATUS") == "ok", landed.text
    assert (repo / "mine.txt").read_text() == "mine\n"
    git(repo, "status")
    assert not mark.exists(), "the job's program ran outside the job"
