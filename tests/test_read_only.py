"""Issue 63: what must not change is read-only in the job's own mount namespace, not put back after. A sandboxed
job in its folder cannot write its repository's git folder (commondir, hooks, a submodule's git folder, another
worktree's, a commit), a worktree job commits on its own branch and nothing else, and the daemons' sockets are
hidden from the job's commands. A planted program proves it ran by writing MARK outside every writable folder."""
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from test_worktrees import final, git, make_repo

from claude_hermes_bridge.drivers import git_folder_mounts, install_mounts
from claude_hermes_bridge.git_calls import git as bridge_git
from claude_hermes_bridge.git_calls import git_text
from claude_hermes_bridge.health import health
from claude_hermes_bridge.hermes_cli import probe_cli, run_probe
from claude_hermes_bridge.safe_io import Refused
from claude_hermes_bridge.worktrees import admin_folder_change, repository_of, worktree_git
from conftest import require_sandbox
from harness import SERVER, Bridge, BridgeClient, config_for, make_fake_hermes

pytestmark = pytest.mark.posix("the fake Hermes' shell directive and a mount namespace are Linux's")


def planted_program(bridge: Bridge) -> tuple[Path, Path]:
    mark = bridge.tmp / "MARK"
    program = bridge.tmp / "planted.sh"
    program.write_text(f"#!/bin/sh\necho ran >> '{mark}'\n")
    program.chmod(0o755)
    return program, mark


def test_a_default_job_cannot_write_its_repositorys_git_folder_and_says_so(bridge: Bridge) -> None:
    require_sandbox()
    repo = make_repo(bridge.root / "repo")
    (repo / ".git" / "modules" / "sub").mkdir(parents=True)
    (repo / ".git" / "modules" / "sub" / "config").write_text("[core]\n\tbare = false\n")
    git(repo, "worktree", "add", "-q", str(bridge.root / "other"), "-b", "other")
    program, mark = planted_program(bridge)
    planted = bridge.tmp / "planted-common"
    script = bridge.tmp / "plant.sh"
    script.write_text(f"""
try() {{ if sh -c "$2" 2>/dev/null; then echo "$1 done" >> tried.txt; else echo "$1 refused" >> tried.txt; fi; }}
try commondir 'echo {planted} > .git/commondir'
try hook 'cp {program} .git/hooks/pre-commit'
try submodule 'printf "[core]\\n\\tfsmonitor = {program}\\n" >> .git/modules/sub/config'
try worktree 'echo {planted} > .git/worktrees/other/commondir'
try gitfile 'mv .git .git-moved'
try commit 'git -c core.hooksPath=/dev/null commit -q --allow-empty -m planted'
echo new > new.txt
""")
    bridge.configure(sandbox="auto")
    with bridge.client() as client:
        job = final(client, task=f"plant !shell={script}", cwd=str(repo))
    assert job.field("STATUS") == "ok", job.text
    tried = (repo / "tried.txt").read_text().split("\n")
    for attempt in ("commondir", "hook", "submodule", "worktree", "gitfile", "commit"):
        assert f"{attempt} refused" in tried, (attempt, tried)
    assert (repo / "new.txt").read_text() == "new\n"  # the job's own folder stays writable
    read_only = job.field("READ_ONLY")
    assert str(repo / ".git") in read_only and "a `git commit` in this job is refused" in read_only, read_only
    assert "REPOSITORY" not in job.text  # nothing to put back: nothing changed
    assert not (repo / ".git" / "commondir").exists() and (repo / ".git").is_dir()
    git(repo, "status")
    git(bridge.root / "other", "status")
    assert not mark.exists()


def test_the_daemons_sockets_are_hidden_from_a_job_while_they_exist(bridge: Bridge) -> None:
    """A sandboxed `docker ps` is refused while the daemon's socket exists: here a socket at the user's runtime
    folder's docker.sock, listening, which the job's curl cannot reach (the test's own connect can)."""
    require_sandbox()
    runtime = bridge.tmp / "runtime"
    runtime.mkdir()
    daemon = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    daemon.bind(str(runtime / "docker.sock"))
    daemon.listen(8)
    script = bridge.tmp / "docker.sh"
    script.write_text(f"curl -s -m 3 --unix-socket {runtime}/docker.sock http://d/v1/containers/json "
                      "> /dev/null 2> err.txt; echo $? > code.txt\n")
    client = bridge.client()
    client.params.env = dict(bridge.env, XDG_RUNTIME_DIR=str(runtime))
    try:
        with client:
            job = final(client, task=f"docker !shell={script}", cwd=str(bridge.root))
        assert job.field("STATUS") == "ok", job.text
        assert (bridge.root / "code.txt").read_text().strip() == "7", (bridge.root / "err.txt").read_text()
        assert f"{runtime}/docker.sock" in job.field("READ_ONLY"), job.text
        assert stat.S_ISSOCK((runtime / "docker.sock").stat().st_mode)
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.connect(str(runtime / "docker.sock"))  # the user's own programs still reach it
        probe.close()
    finally:
        daemon.close()


def test_a_worktree_job_commits_on_its_branch_but_cannot_rewrite_its_admin_folders_commondir(bridge: Bridge) -> None:
    require_sandbox()
    repo = make_repo(bridge.root / "repo")
    script = bridge.tmp / "admin.sh"
    script.write_text("admin=$(git rev-parse --git-dir); common=$(git rev-parse --git-common-dir)\n"
                      "(echo /tmp > \"$admin/commondir\") 2>/dev/null && echo done > tried.txt "
                      "|| echo refused > tried.txt\n"
                      "(echo x > \"$common/config\") 2>/dev/null || echo config-refused >> tried.txt\n")
    with bridge.client() as client:
        job = final(client, task=f"!shell={script} !write=b.txt:bee !commit=work", cwd=str(repo),
                    isolation="worktree")
    assert job.field("STATUS") == "ok", job.text
    tried = (bridge.jobs / "worktrees" / job.field("JOB_ID") / "tried.txt").read_text()
    assert tried == "refused\nconfig-refused\n", tried
    assert git(repo, "log", "-1", "--format=%s", f"hermes-bridge/{job.field('JOB_ID')}") == "work"
    assert "(but the job's own branch, index and objects)" in job.field("READ_ONLY"), job.text


def test_the_mounts_name_the_git_folder_a_gitdir_file_names_and_hermes_inside_a_writable_folder(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    moved = tmp_path / "elsewhere.git"
    (repo / ".git").rename(moved)
    (repo / ".git").write_text(f"gitdir: {moved}\n")
    assert git_folder_mounts(str(repo), None) == [f"ro:{repo / '.git'}", f"ro:{moved}"]
    assert git_folder_mounts(str(tmp_path), None) == []
    home = tmp_path / "hermes-home"
    exe = home / "hermes-agent" / "venv" / "bin" / "hermes"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n")
    assert install_mounts(str(exe), [str(home)]) == [f"ro:{home / 'hermes-agent' / 'venv'}"]
    assert install_mounts(str(exe), [str(tmp_path / "repo")]) == []


def partial_clone_with_a_command_remote(tmp_path: Path, mark: Path) -> tuple[Path, str]:
    """A partial clone whose promisor remote's uploadpack is a program that leaves mark, and a blob it lacks."""
    source = make_repo(tmp_path / "source", {"big.txt": "the blob left out\n"})
    git(source, "config", "uploadpack.allowFilter", "true")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--filter=blob:none", "--no-checkout", f"file://{source}", str(clone)],
                   check=True)
    blob = git(source, "rev-parse", "HEAD:big.txt")
    program = tmp_path / "uploadpack.sh"
    program.write_text(f"#!/bin/sh\necho ran >> '{mark}'\nexec git-upload-pack \"$@\"\n")
    program.chmod(0o755)
    git(clone, "config", "remote.origin.uploadpack", str(program))
    return clone, blob


def test_the_bridges_git_never_fetches_lazily_through_a_remote_a_job_wrote(tmp_path: Path) -> None:
    """DESIGN 21: any git call that needs a missing object of a partial clone runs its promisor remote's
    transport; the bridge's own git refuses every transport, so the remote's command never runs."""
    mark = tmp_path / "MARK"
    clone, blob = partial_clone_with_a_command_remote(tmp_path, mark)
    assert bridge_git(str(clone), "cat-file", "-t", blob, check=False).returncode != 0
    assert not mark.exists()
    subprocess.run(["git", "-C", str(clone), "cat-file", "-t", blob], capture_output=True, check=False)
    assert mark.exists(), "the test's remote would run under a plain git"
    assert bridge_git(str(clone), "submodule", "status", transport=True).returncode == 0  # a call that may reach out


def test_a_worktree_whose_admin_folder_names_another_common_folder_is_not_saved_and_a_planted_commondir_refused(
        tmp_path: Path) -> None:
    mark = tmp_path / "MARK"
    repo = make_repo(tmp_path / "repo")
    worktree = {"repo": str(repo), "path": str(tmp_path / "wt"), "branch": "hermes-bridge/x", "base":
                git(repo, "rev-parse", "HEAD")}
    git(repo, "worktree", "add", "-q", "-b", worktree["branch"], worktree["path"], worktree["base"])
    worktree["admin"] = str(repo / ".git" / "worktrees" / "wt")
    assert admin_folder_change(worktree) is None
    clone, _ = partial_clone_with_a_command_remote(tmp_path, mark)
    (Path(worktree["admin"]) / "commondir").write_text(f"{clone / '.git'}\n")
    assert "the worktree's commondir file names" in str(admin_folder_change(worktree))
    assert git_text(worktree["path"], *worktree_git(worktree), "rev-parse", "--git-common-dir") == str(repo / ".git")
    (repo / ".git" / "commondir").write_text(f"{clone / '.git'}\n")
    with pytest.raises(Refused, match=r"has a \.git/commondir file"):
        repository_of(str(repo))
    assert not mark.exists()


def test_health_says_when_hermes_is_installed_inside_its_own_home(tmp_path: Path) -> None:
    home = tmp_path / "hermes-home"
    exe = home / "hermes-agent" / "venv" / "bin" / "hermes"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\necho 'Hermes Agent v0.22.2'\n")
    exe.chmod(0o755)
    inside = health(config_for(tmp_path, hermes_exe=str(exe), hermes_home=str(home)))
    assert "HERMES_INSTALL: inside Hermes' home, which every sandboxed job may write" in inside, inside
    elsewhere = health(config_for(tmp_path, hermes_exe=str(exe), hermes_home=str(tmp_path / "other-home")))
    assert "HERMES_INSTALL" not in elsewhere


@pytest.mark.parametrize("sandbox", ["auto", "off"])
def test_the_bridges_own_calls_of_hermes_run_inside_the_sandbox(tmp_path: Path, sandbox: str) -> None:
    """Issue 63: Hermes installed in its own home, which jobs write, where no mount namespace holds it read-only:
    a job's line in the `hermes` executable runs at the bridge's next probe (`chat --help`, `acp --check`,
    `--version`, `sessions delete`) inside the sandbox, writing nothing outside a fresh temporary folder, with
    no way to gain privileges. The sandbox off: as it is (said by hermes_health's SANDBOX line)."""
    require_sandbox()
    home, mark = tmp_path / "hermes-home", tmp_path / "MARK"
    exe = home / "hermes-agent" / "venv" / "bin" / "hermes"
    exe.parent.mkdir(parents=True)
    exe.write_text(f"#!/bin/sh\ngrep NoNewPrivs /proc/self/status\necho planted > '{mark}' || echo refused\n"
                   "echo --query\n")
    exe.chmod(0o755)
    cfg = config_for(tmp_path, hermes_exe=str(exe), hermes_home=str(home), sandbox=sandbox)
    said = run_probe(cfg, str(exe), "chat", "--help").stdout.decode()
    if sandbox == "off":
        assert mark.exists() and "NoNewPrivs:\t0" in said, said
        return
    assert not mark.exists() and "refused" in said and "NoNewPrivs:\t1" in said, said
    assert probe_cli(cfg, str(exe)).flags == frozenset({"--query"})  # what it declares is still read


WITHOUT_NAMESPACES = Path(__file__).resolve().parent / "without_namespaces.py"


def test_without_a_mount_namespace_a_job_that_changes_hermes_install_is_said_and_no_job_starts_from_it(
        bridge: Bridge) -> None:
    """Issue 63, the fallback forced (unshare refused for the server and all it starts): Hermes installed in its
    own home, which the job may write and nothing holds read-only, is changed by the job; the block says so,
    the next hermes_run is refused naming the job, and a reinstalled Hermes starts jobs again."""
    require_sandbox()
    home = bridge.tmp / "hermes-home"
    exe = make_fake_hermes(home / "hermes-agent" / "venv")
    bridge.configure(hermes_exe=str(exe), hermes_home=str(home))
    script = bridge.tmp / "plant.sh"
    script.write_text(f"echo '# planted by the job' >> '{exe}'\n")
    served = [sys.executable, str(WITHOUT_NAMESPACES), sys.executable, str(SERVER)]
    with BridgeClient(bridge.env, command=served) as client:
        job = final(client, task=f"!shell={script}", cwd=str(bridge.root))
        assert job.field("STATUS") == "ok", job.text
        assert job.field("READ_ONLY").startswith("nothing: no mount namespace can be made here"), job.text
        assert "planted by the job" in exe.read_text()
        assert f"Hermes' install {exe.parent.parent} was CHANGED by this job" in job.field("HERMES_SETTINGS"), job.text
        refused = client.call("hermes_run", task="next", cwd=str(bridge.root), wait_s=0)
        assert refused.field("STATUS") == "refused", refused.text
        assert f"was changed by job {job.field('JOB_ID')}" in refused.text and "Reinstall Hermes" in refused.text
        exe.write_text(exe.read_text().replace("# planted by the job\n", ""))  # as a reinstall would
        again = final(client, task="after the reinstall", cwd=str(bridge.root))
        assert again.field("STATUS") == "ok", again.text
        assert "was CHANGED by this job" not in again.text


def test_without_a_mount_namespace_the_guard_puts_back_what_a_default_job_planted_in_git(bridge: Bridge) -> None:
    """Issue 63, the fallback forced: a default job writes `.git` (nothing holds it read-only), planting a hook
    behind 600 fillers, a `commondir` and a submodule's fsmonitor; the guard puts each back and says so, and the
    user's own git then runs none of them."""
    require_sandbox()
    repo = make_repo(bridge.root / "repo")
    (repo / ".git" / "modules" / "sub").mkdir(parents=True)
    (repo / ".git" / "modules" / "sub" / "config").write_text("[core]\n\tbare = false\n")
    mark = bridge.tmp / "MARK"
    script = bridge.tmp / "plant.sh"
    hook = ".git/hooks/pre-commit"
    script.write_text(f"for n in $(seq 600); do : > .git/hooks/aaa-$n; done\n"
                      f"printf '#!/bin/sh\\necho hook >> {mark}\\n' > {hook}; chmod +x {hook}\n"
                      "echo /tmp > .git/commondir\n"
                      f"printf '[core]\\n\\tfsmonitor = echo fsmonitor >> {mark}\\n' > .git/modules/sub/config\n")
    served = [sys.executable, str(WITHOUT_NAMESPACES), sys.executable, str(SERVER)]
    with BridgeClient(bridge.env, command=served) as client:
        job = final(client, task=f"!shell={script}", cwd=str(repo))
    assert job.field("STATUS") == "ok", job.text
    assert job.field("READ_ONLY").startswith("nothing: no mount namespace can be made here"), job.text
    said = job.field("REPOSITORY")
    assert ".git/hooks held more than 500 entries" in said and ".git/commondir" in said, job.text
    assert not (repo / ".git" / "commondir").exists() and not (repo / ".git" / "hooks" / "pre-commit").exists()
    assert "fsmonitor" not in (repo / ".git" / "modules" / "sub" / "config").read_text()
    git(repo, "status")
    git(repo, "commit", "--allow-empty", "-qm", "the user's next commit")
    assert not mark.exists(), "a program the job planted ran outside the job"
