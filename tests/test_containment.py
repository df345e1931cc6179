"""Issue 47: a sandboxed job changes only what it owns. A worktree job cannot change or remove the repository's
history (its commits go to an object folder of its own; the repository's objects, refs and tags are not
granted), and a job without a worktree that plants a hook or a program-running setting in its repository has it
put back and said; files other programs run later are named. The fake Hermes' `!shell=SCRIPT` is the job's
shell; each attack is also run with the sandbox off, where it succeeds, so the test shows the sandbox is what
refuses it."""
import shlex
import subprocess
import zlib
from pathlib import Path
from typing import Any

import pytest
from test_worktrees import client_of, final, git, make_repo

from claude_hermes_bridge.drivers import project_cache
from claude_hermes_bridge.folder_changes import runs_later, who_runs
from claude_hermes_bridge.worktrees import hooks_path_folder
from conftest import require_sandbox, require_tool, step_as
from harness import Bridge

pytestmark = pytest.mark.posix("Landlock is Linux's; the fake Hermes is a shell script")

HISTORY_ATTACKS = ("branch", "delete-branch", "tag", "replace", "pack", "objects")


def history_attack_script(folder: Path) -> Path:
    """A script run in a worktree: the job's own commit, then each attack on the shared repository's history,
    each recorded in tried.txt as DONE or DENIED <name>. `objects` (deleting every object) comes last."""
    script = folder / "history-attack.sh"
    forged = zlib.compress(b"blob 7\0forged\n")
    script.write_text(f"""
try() {{ name=$1; shift; if ( "$@" ) >/dev/null 2>&1; then echo "DONE $name"; else echo "DENIED $name"; fi \
  >> tried.txt; }}
common=$(git rev-parse --git-common-dir)
blob=$(git rev-parse main:a.txt)
object="$common/objects/$(printf %s "$blob" | cut -c1-2)/$(printf %s "$blob" | cut -c3-)"
try commit sh -c 'echo mine > mine.txt && git add mine.txt && git -c user.name=j -c user.email=j@t commit -qm mine'
try branch git branch -f feature HEAD
try delete-branch git branch -D other
try tag git tag -d v1
try replace python3 -c 'import os, sys; os.chmod(sys.argv[1], 0o644); open(sys.argv[1], "wb").write(bytes.fromhex(\
"{forged.hex()}"))' "$object"
try pack sh -c "cp '$object' '$common/objects/pack/pack-{'0' * 40}.pack'"
try objects rm -rf "$common/objects"
""")
    return script


def history(repo: Path) -> dict[str, str]:
    """What a job must not change: the user's branches, tag and the content of main's file."""
    return {"feature": git(repo, "rev-parse", "feature"), "other": git(repo, "rev-parse", "other"),
            "v1": git(repo, "rev-parse", "v1"), "a.txt": git(repo, "cat-file", "-p", "main:a.txt")}


def assert_history_kept(bridge: Bridge, job: Any, repo: Path, before: dict[str, str]) -> None:
    """The job ended ok, made its own commit, and every attack on the history was refused."""
    assert job.field("STATUS") == "ok", job.text
    tried = (bridge.jobs / "worktrees" / job.field("JOB_ID") / "tried.txt").read_text()
    assert "DONE commit" in tried, tried
    for attack in HISTORY_ATTACKS:
        assert f"DENIED {attack}" in tried, (attack, tried)
    assert history(repo) == before


def repo_with_history(bridge: Bridge) -> Path:
    repo = make_repo(bridge.root / "repo")
    for branch in ("feature", "other"):
        git(repo, "branch", branch)
    git(repo, "tag", "v1")
    git(repo, "checkout", "-q", "feature")
    (repo / "f.txt").write_text("unpushed\n")
    git(repo, "add", "f.txt")
    git(repo, "commit", "-qm", "the user's unpushed work")
    git(repo, "checkout", "-q", "main")
    return repo


@pytest.mark.parametrize("driver", ["cli", "acp"])
def test_a_worktree_job_cannot_touch_the_history_and_its_own_commit_lands(bridge: Bridge, driver: str) -> None:
    require_sandbox()
    repo = repo_with_history(bridge)
    before = history(repo)
    script = history_attack_script(bridge.tmp)
    with client_of(bridge, driver) as client:
        job = final(client, task=f"!shell={script}", cwd=str(repo), isolation="worktree")
        assert_history_kept(bridge, job, repo, before)
        assert subprocess.run(["git", "-C", str(repo), "fsck", "--no-dangling"], capture_output=True).returncode == 0
        landed = client.call("hermes_land", job_id=job.field("JOB_ID"), action="merge")
    assert landed.field("STATUS") == "ok", landed.text
    assert (repo / "mine.txt").read_text() == "mine\n"
    assert "mine" in git(repo, "log", "--format=%s", "main").splitlines()  # the job's own commit, brought in whole
    assert subprocess.run(["git", "-C", str(repo), "fsck", "--no-dangling", "--strict"],
                          capture_output=True).returncode == 0
    assert history(repo) == before
    assert not (bridge.jobs / "worktree-objects" / job.field("JOB_ID")).exists()  # gone with the worktree


def test_without_the_sandbox_the_same_attacks_rewrite_the_history(bridge: Bridge) -> None:
    """Each attack is real: unconfined, the job changes the user's branches and tag and forges main's file."""
    repo = repo_with_history(bridge)
    before = history(repo)
    script = history_attack_script(bridge.tmp)
    script.write_text(script.read_text().replace("try objects", "# try objects"))  # keep the repository readable
    bridge.configure(sandbox="off")
    with bridge.client() as client:
        job = final(client, task=f"!shell={script}", cwd=str(repo), isolation="worktree")
    tried = (bridge.jobs / "worktrees" / job.field("JOB_ID") / "tried.txt").read_text()
    for attack in HISTORY_ATTACKS[:-1]:
        assert f"DONE {attack}" in tried, (attack, tried)
    after = subprocess.run(["git", "-C", str(repo), "cat-file", "-p", "main:a.txt"], capture_output=True)
    assert after.stdout != before["a.txt"].encode() + b"\n" or after.returncode != 0
    reported = job.field("REPOSITORY")  # named, where no sandbox refused them
    assert "moved refs/heads/feature" in reported and "deleted refs/heads/other, refs/tags/v1" in reported, job.text


def test_a_forged_object_in_the_jobs_own_folder_changes_nothing_it_lands(bridge: Bridge) -> None:
    """The job's own object folder is its to write: an object forged there under the name of one of the
    repository's is not what the landing takes (index-pack hashes what it brings in)."""
    require_sandbox()
    repo = make_repo(bridge.root / "repo")
    script = bridge.tmp / "forge.sh"
    script.write_text(f"""
blob=$(git rev-parse main:a.txt)
own="$GIT_OBJECT_DIRECTORY/$(printf %s "$blob" | cut -c1-2)"
mkdir -p "$own" && python3 -c 'import sys; open(sys.argv[1], "wb").write(bytes.fromhex("{zlib.compress(
        b"blob 7" + bytes(1) + b"forged" + bytes([10])).hex()}"))' "$own/$(printf %s "$blob" | cut -c3-)"
echo b > b.txt && git add b.txt && git -c user.name=j -c user.email=j@t commit -qm b
""")
    with bridge.client() as client:
        job = final(client, task=f"!shell={script}", cwd=str(repo), isolation="worktree")
        assert job.field("STATUS") == "ok", job.text
        landed = client.call("hermes_land", job_id=job.field("JOB_ID"), action="merge")
    assert landed.field("STATUS") == "ok", landed.text
    assert (repo / "a.txt").read_text() == "one\ntwo\nthree\n" and (repo / "b.txt").read_text() == "b\n"
    assert git(repo, "cat-file", "-p", "HEAD:a.txt") == "one\ntwo\nthree"
    assert subprocess.run(["git", "-C", str(repo), "fsck", "--strict"], capture_output=True).returncode == 0


PLANTS = {
    "hook": "printf '#!/bin/sh\\ntouch {mark}\\n' > .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit",
    "fsmonitor": "git config core.fsmonitor 'touch {mark}; false'",
    "alias": "git config alias.st '!touch {mark}'",
}


@pytest.mark.parametrize("sandbox", ["auto", "off"])
def test_a_job_in_the_users_repository_has_its_hook_and_settings_put_back_and_said(bridge: Bridge,
                                                                                  sandbox: str) -> None:
    """Without a worktree the job works in the user's repository itself: what it plants in .git runs at the
    user's next git command, outside any sandbox. Sandboxed, the job's mount namespace holds .git read-only, so
    nothing is planted (READ_ONLY says so); without the sandbox it is put back, and said."""
    if sandbox == "auto":
        require_sandbox()
    repo = make_repo(bridge.root / "repo")
    mark = bridge.tmp / "planted-ran"
    (repo / ".git" / "hooks" / "post-checkout").write_text("#!/bin/sh\nexit 0\n")
    (repo / ".git" / "hooks" / "post-checkout").chmod(0o755)
    config_before = (repo / ".git" / "config").read_bytes()
    script = bridge.tmp / "plant.sh"
    script.write_text("\n".join(command.format(mark=mark) for command in PLANTS.values())
                      + "\nrm .git/hooks/post-checkout\necho work > work.txt\nmkdir -p .vscode .claude\n"
                        "echo '{}' > .vscode/tasks.json\necho '{}' > .claude/settings.json\n"
                        "echo 'export X=1' > .envrc\n")
    bridge.configure(sandbox=sandbox)
    with bridge.client() as client:
        job = final(client, task=f"!shell={script}", cwd=str(repo))
    assert job.field("STATUS") == "ok", job.text
    assert (repo / "work.txt").read_text() == "work\n"  # the job's own work stays
    assert not (repo / ".git" / "hooks" / "pre-commit").exists()
    assert (repo / ".git" / "hooks" / "post-checkout").read_text() == "#!/bin/sh\nexit 0\n"
    assert (repo / ".git" / "hooks" / "post-checkout").stat().st_mode & 0o111, "a restored hook lost its mode"
    assert (repo / ".git" / "config").read_bytes() == config_before
    if sandbox == "auto":
        assert "REPOSITORY:" not in job.text and "a `git commit` in this job is refused" in job.field("READ_ONLY")
    else:
        reported = job.field("REPOSITORY")
        assert "the job created .git/hooks/pre-commit; restored" in reported, job.text
        assert "the job removed .git/hooks/post-checkout; restored" in reported, job.text
        assert "the job changed .git/config (alias.st, core.fsmonitor); restored" in reported, job.text
        kept = bridge.jobs / f"{job.field('JOB_ID')}.repository-changes"
        assert f"touch {mark}" in (kept / "hooks" / "pre-commit").read_text()  # the job's version, kept aside
    runs_later = job.field("RUNS_LATER")
    for name in (".envrc", ".vscode/tasks.json", ".claude/settings.json"):
        assert name in runs_later, job.text
    git(repo, "add", "work.txt")
    git(repo, "commit", "-qm", "the user's next commit")
    git(repo, "status")
    subprocess.run(["git", "-C", str(repo), "st"], capture_output=True)
    assert not mark.exists(), "a program the job planted ran at the user's next git command"


def test_a_job_outside_any_repository_has_no_repository_line(bridge: Bridge) -> None:
    with bridge.client() as client:
        job = final(client, task="!write=a.txt:x", cwd=str(bridge.root))
    assert job.field("STATUS") == "ok", job.text
    assert "REPOSITORY:" not in job.text and "RUNS_LATER:" not in job.text


def test_the_landing_runs_no_program_of_a_global_config_the_job_wrote(bridge: Bridge) -> None:
    """With no sandbox a job can write ~/.gitconfig: a signature check the merge would refuse on, and a gpg
    program it would run. The landing's git overrides both."""
    repo = make_repo(bridge.root / "repo")
    mark = bridge.tmp / "gpg-ran"
    gpg = bridge.tmp / "fake-gpg"
    gpg.write_text(f"#!/bin/sh\ntouch {mark}\nexit 1\n")
    gpg.chmod(0o755)
    script = bridge.tmp / "global.sh"
    script.write_text(f"git config --global merge.verifySignatures true && git config --global gpg.program {gpg} "
                      f"&& git config --global log.showSignature true && echo b > b.txt\n")
    bridge.configure(sandbox="off")
    with bridge.client() as client:
        job = final(client, task=f"!shell={script}", cwd=str(repo), isolation="worktree")
        assert job.field("STATUS") == "ok", job.text
        assert "verifySignatures = true" in (bridge.tmp / "home" / ".gitconfig").read_text()
        landed = client.call("hermes_land", job_id=job.field("JOB_ID"), action="merge")
    assert landed.field("STATUS") == "ok", landed.text
    assert (repo / "b.txt").read_text() == "b\n" and not mark.exists()


DEVICE_ATTACKS = ("write terminal", "type terminal", "shm outlives")


def device_attack_script(folder: Path, terminal: str, shm_name: str) -> Path:
    """A script that writes and types into the test's terminal, leaves a file in /dev/shm, and opens a pty of its
    own as Hermes' pty mode and `script` do (its output in own-pty.txt); each attempt recorded in tried.txt."""
    script = folder / "devices.sh"
    script.write_text(f"""
try() {{ name=$1; shift; if ( "$@" ) >/dev/null 2>&1; then echo "DONE $name"; else echo "DENIED $name"; fi \
  >> tried.txt; }}
try "write terminal" sh -c 'printf pwned > {terminal}'
try "type terminal" python3 -c 'import fcntl, os, termios; fd = os.open("{terminal}", os.O_RDWR | os.O_NOCTTY)
for byte in b"typed": fcntl.ioctl(fd, termios.TIOCSTI, bytes([byte]))'
try "shm outlives" sh -c 'echo left > /dev/shm/{shm_name}'
python3 -c 'import os, pty, sys
pid, fd = pty.fork()
if pid == 0:
    os.execvp("echo", ["echo", "from-own-pty"])
out = b""
while True:
    try:
        chunk = os.read(fd, 1024)
    except OSError:
        break
    if not chunk:
        break
    out += chunk
os.waitpid(pid, 0)
open("own-pty.txt", "wb").write(out)'
""")
    return script


def written_to(master: int) -> bytes:
    import os

    os.set_blocking(master, False)
    try:
        return os.read(master, 1024)
    except BlockingIOError:
        return b""


@pytest.mark.parametrize("sandbox", ["auto", "off"])
def test_a_job_writes_no_terminal_of_the_users_its_shm_is_its_own_and_its_own_pty_works(bridge: Bridge,
                                                                                         sandbox: str) -> None:
    """A sandboxed job cannot write or type into a terminal the user has open (the test's pty), and what it
    leaves in /dev/shm is gone with it (its /dev/pts and /dev/shm are its own), while a pty the job opens itself
    works. Unconfined, the same script writes the terminal and leaves its file: the sandbox is what refuses."""
    import os
    import uuid

    require_sandbox()
    bridge.configure(sandbox=sandbox)
    shm_name = f"bridge-test-{uuid.uuid4().hex}"
    master, follower = os.openpty()
    try:
        script = device_attack_script(bridge.tmp, os.ttyname(follower), shm_name)
        with bridge.client() as client:
            job = final(client, task=f"!shell={script}", cwd=str(bridge.root))
        assert job.field("STATUS") == "ok", job.text
        tried = (bridge.root / "tried.txt").read_text()
        assert b"from-own-pty" in (bridge.root / "own-pty.txt").read_bytes()
        written = written_to(master)
        left = Path("/dev/shm", shm_name)
        if sandbox == "off":
            assert "DONE write terminal" in tried and b"pwned" in written and left.exists(), tried
        else:
            assert all(f"DENIED {attack}" in tried or attack == "shm outlives" for attack in DEVICE_ATTACKS), tried
            assert b"pwned" not in written and b"typed" not in written
            assert "DONE shm outlives" in tried and not left.exists(), tried  # it wrote there, and that is gone
    finally:
        os.close(master)
        os.close(follower)
        Path("/dev/shm", shm_name).unlink(missing_ok=True)


def test_two_sandboxed_jobs_do_not_share_dev_shm(bridge: Bridge) -> None:
    """What one job leaves in /dev/shm does not reach another running beside it (they meet in a folder both may
    write: the first writes its file, then waits until the second has looked)."""
    import uuid

    require_sandbox()
    name = f"bridge-test-{uuid.uuid4().hex}"
    first, second, meet = bridge.root / "first", bridge.root / "second", bridge.root / "meet"
    for folder in (first, second, meet):
        folder.mkdir()
    wait_for = "for _ in $(seq 300); do [ -e {0} ] && break; sleep 0.1; done"
    writer = bridge.tmp / "writer.sh"
    writer.write_text(f"echo mine > /dev/shm/{name} && touch {meet}/wrote\n{wait_for.format(meet / 'looked')}\n")
    reader = bridge.tmp / "reader.sh"
    reader.write_text(f"{wait_for.format(meet / 'wrote')}\nif [ -e /dev/shm/{name} ]; then echo seen; else echo "
                      f"unseen; fi > seen.txt\ntouch {meet}/looked\n")
    bridge.configure(sandbox_writable=[*bridge.settings["sandbox_writable"], str(meet)])
    with bridge.client() as client:
        started = client.call("hermes_run", task=f"!shell={writer}", cwd=str(first), wait_s=0)
        job = final(client, task=f"!shell={reader}", cwd=str(second))
        writing = client.wait_final(started.field("JOB_ID"))
    assert job.field("STATUS") == "ok" and writing.field("STATUS") == "ok", (job.text, writing.text)
    assert (meet / "wrote").exists() and (second / "seen.txt").read_text() == "unseen\n"
    assert not Path("/dev/shm", name).exists()


@pytest.mark.parametrize("user", ["this user", "nobody"])
def test_the_step_gives_root_and_a_user_a_dev_pts_and_dev_shm_of_their_own(user: str) -> None:
    """Root makes the job's mount namespace itself, a user in a user namespace of its own (CI runs as root; a
    user's way is run through setpriv): the terminal the test opens, which that user may write outside, is not
    there to write inside, a pty of its own works, and its /dev/shm file is gone when it ends."""
    import os
    import shutil
    import tempfile
    import uuid

    from claude_hermes_bridge.sandbox import devices, step_argv

    require_sandbox()
    if user == "nobody" and os.geteuid() != 0:
        pytest.skip("setpriv to another user needs root (CI runs as root)")
    as_user = [] if user == "this user" else [shutil.which("setpriv") or "setpriv", "--reuid=65534", "--regid=65534",
                                         "--clear-groups"]
    shm = Path("/dev/shm", f"bridge-test-{uuid.uuid4().hex}")
    folder = Path(tempfile.mkdtemp(prefix="bridge-test-"))  # beside /tmp: the test's own folder is root's alone
    folder.chmod(0o777)
    master, follower = os.openpty()
    try:
        if user == "nobody":
            os.fchown(follower, 65534, -1)
        script = folder / "devices.sh"
        script.write_text(f"printf pwned > {os.ttyname(follower)} && echo wrote\necho left > {shm}\n"
                          "script -qc 'echo own pty' /dev/null\n")  # util-linux's script: a pty of its own
        outside = subprocess.run([*as_user, "sh", str(script)], capture_output=True, timeout=60, cwd=folder)
        assert b"wrote" in outside.stdout and written_to(master) == b"pwned" and shm.exists(), outside
        shm.unlink()
        inside = subprocess.run(step_as(user, step_argv([*devices(), str(folder)], ["/bin/sh", str(script)]), folder),
                                capture_output=True, timeout=60, cwd=folder)
        assert inside.stdout == b"own pty\r\n" and b"shares your" not in inside.stderr, inside
        assert written_to(master) == b"" and not shm.exists()
    finally:
        os.close(master)
        os.close(follower)
        shm.unlink(missing_ok=True)
        shutil.rmtree(folder)


def attempt_function(log: str) -> str:
    """A shell function for a job's script: `attempt NAME COMMAND...` runs the command, its output appended to LOG,
    and records `DONE NAME` or `FAILED NAME` in tried.txt, so one script tries a tool both ways."""
    return (f'attempt() {{ name=$1; shift; if "$@" >> {log} 2>&1; then echo "DONE $name" >> tried.txt; '
            'else echo "FAILED $name" >> tried.txt; fi; }\n')


def tiny_wheel(folder: Path) -> Path:
    """A wheel of one module, made here: uv installs it offline."""
    import base64
    import hashlib
    import zipfile

    files = {"tinymod.py": b"VALUE = 1\n",
             "tinymod-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinymod\nVersion: 1.0\n",
             "tinymod-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                           b"Tag: py3-none-any\n"}
    record = "".join(f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
                     f"{len(data)}\n" for name, data in files.items()) + "tinymod-1.0.dist-info/RECORD,,\n"
    wheel = folder / "tinymod-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        archive.writestr("tinymod-1.0.dist-info/RECORD", record)
    return wheel


@pytest.mark.e2e
def test_npm_install_and_uv_work_in_a_sandboxed_job_through_the_bridges_cache(bridge: Bridge) -> None:
    """Issue 47: the caches npm and uv keep in the home are redirected to the bridge's own. Each install runs
    twice in the job: with the home's cache named again (the redirection undone), where the sandbox refuses it,
    then as the job gets it, where it works; the user's ~/.npm and ~/.cache are never written."""

    from harness import UV

    require_sandbox()
    uv = require_component_path(UV, "uv")
    npm = require_tool("npm")
    package = bridge.tmp / "pkg"
    package.mkdir()
    (package / "package.json").write_text('{"name": "tiny", "version": "1.0.0"}')
    (package / "index.js").write_text("module.exports = 1;\n")
    subprocess.run([npm, "pack", "-q"], cwd=package, check=True, capture_output=True)
    wheel = tiny_wheel(bridge.tmp)
    home = bridge.tmp / "home"
    script = bridge.tmp / "installs.sh"
    script.write_text(f"""
{attempt_function('installs.log')}
home_caches="npm_config_cache={home}/.npm UV_CACHE_DIR={home}/.cache/uv"
attempt npm-home env $home_caches {npm} install --no-audit --no-fund {package}/tiny-1.0.0.tgz
attempt uv-home env $home_caches sh -c '{uv} venv -q .venv && {uv} pip install -q --offline --python .venv/bin/python \
{wheel}'
rm -rf node_modules .venv package.json package-lock.json
attempt npm {npm} install --no-audit --no-fund {package}/tiny-1.0.0.tgz
attempt uv sh -c '{uv} venv -q .venv && {uv} pip install -q --offline --python .venv/bin/python {wheel}'
attempt import .venv/bin/python -c 'import tinymod'
""")
    with bridge.client() as client:
        job = final(client, task=f"!shell={script}", cwd=str(bridge.root))
    assert job.field("STATUS") == "ok", job.text
    tried = (bridge.root / "tried.txt").read_text()
    assert "FAILED npm-home" in tried and "FAILED uv-home" in tried, tried
    assert "DONE npm" in tried and "DONE uv" in tried and "DONE import" in tried, (
        tried, (bridge.root / "installs.log").read_text()[-2000:])
    assert (bridge.root / "node_modules" / "tiny" / "index.js").exists()
    assert not (home / ".npm").exists() and not (home / ".cache" / "uv").exists()  # the bridge keeps bytecode there
    cache = project_cache_of(bridge, bridge.root)
    assert f"the tool cache {cache} (this project's" in job.field("SANDBOX") and (cache / "uv").is_dir()
    installed = next((bridge.root / ".venv").rglob("tinymod*.py"))
    assert installed.stat().st_nlink == 1, "uv linked the package from the cache (UV_LINK_MODE=copy)"


def project_cache_of(bridge: Bridge, folder: Path) -> Path:
    """The bridge's tool cache for jobs in folder (drivers.project_cache)."""
    return project_cache(bridge.jobs / "tmp" / "any", str(folder), None)


def local_cargo_registry(folder: Path) -> Path:
    """A cargo registry on disk holding one crate (tinycrate 0.1.0), made here: cargo unpacks what it uses from
    it into CARGO_HOME, as it does from crates.io."""
    import hashlib
    import io
    import json
    import tarfile

    registry = folder / "registry"
    (registry / "index" / "ti" / "ny").mkdir(parents=True)
    crate = registry / "tinycrate-0.1.0.crate"
    files = {"Cargo.toml": b'[package]\nname = "tinycrate"\nversion = "0.1.0"\nedition = "2021"\n',
             "src/lib.rs": b"pub fn value() -> u32 { 41 + 1 }\n"}
    with tarfile.open(crate, "w:gz") as archive:
        for name, data in files.items():
            entry = tarfile.TarInfo(f"tinycrate-0.1.0/{name}")
            entry.size, entry.mode = len(data), 0o644
            archive.addfile(entry, io.BytesIO(data))
    (registry / "index" / "ti" / "ny" / "tinycrate").write_text(json.dumps(
        {"name": "tinycrate", "vers": "0.1.0", "deps": [], "cksum": hashlib.sha256(crate.read_bytes()).hexdigest(),
         "features": {}, "yanked": False}) + "\n")
    return registry


@pytest.mark.e2e
def test_cargo_builds_with_a_dependency_in_a_sandboxed_job_through_the_bridges_cache(bridge: Bridge) -> None:
    """Issue 47: cargo unpacks its dependencies into CARGO_HOME (~/.cargo by default), which the sandbox keeps
    read-only; the job's CARGO_HOME is the bridge's cache. Run with the home's CARGO_HOME named again it is
    refused; as the job gets it, the build runs and the user's ~/.cargo is not written."""

    require_sandbox()
    cargo = require_tool("cargo", Path.home() / ".cargo" / "bin" / "cargo")
    rustup_home = Path.home() / ".rustup"  # rustup's cargo finds its toolchain there; the job's HOME is the test's
    registry = local_cargo_registry(bridge.tmp)
    (bridge.root / "src").mkdir()
    (bridge.root / "src" / "main.rs").write_text('fn main() { println!("{}", tinycrate::value()); }\n')
    (bridge.root / "Cargo.toml").write_text('[package]\nname = "app"\nversion = "0.1.0"\nedition = "2021"\n'
                                            '[dependencies]\ntinycrate = "0.1"\n')
    (bridge.root / ".cargo").mkdir()
    (bridge.root / ".cargo" / "config.toml").write_text(
        f'[source.crates-io]\nreplace-with = "local"\n[source.local]\nlocal-registry = "{registry}"\n')
    home = bridge.tmp / "home"
    script = bridge.tmp / "cargo.sh"
    script.write_text(f"""
{f"export RUSTUP_HOME={rustup_home}" if rustup_home.is_dir() else ""}
{attempt_function('build.log')}
attempt cargo-home env CARGO_HOME={home}/.cargo {cargo} build -q --offline
attempt cargo {cargo} run -q --offline
""")
    with bridge.client() as client:
        job = final(client, task=f"!shell={script}", cwd=str(bridge.root))
    assert job.field("STATUS") == "ok", job.text
    tried, log = (bridge.root / "tried.txt").read_text(), (bridge.root / "build.log").read_text()
    assert "FAILED cargo-home" in tried and "Permission denied" in log, (tried, log[-2000:])
    assert "DONE cargo" in tried and log.rstrip().endswith("42"), (tried, log[-2000:])
    assert not (home / ".cargo").exists() and (project_cache_of(bridge, bridge.root) / "cargo" / "registry").is_dir()


def local_go_proxy(folder: Path) -> Path:
    """A Go module proxy on disk (GOPROXY=file://) serving one module, example.com/tinymod v1.0.0, made here: go
    downloads it into GOMODCACHE (~/go/pkg/mod by default) as it does from proxy.golang.org."""
    import zipfile

    versions = folder / "goproxy" / "example.com" / "tinymod" / "@v"
    versions.mkdir(parents=True)
    go_mod = "module example.com/tinymod\n\ngo 1.19\n"
    (versions / "list").write_text("v1.0.0\n")
    (versions / "v1.0.0.info").write_text('{"Version": "v1.0.0", "Time": "2026-01-01T00:00:00Z"}')
    (versions / "v1.0.0.mod").write_text(go_mod)
    with zipfile.ZipFile(versions / "v1.0.0.zip", "w") as archive:
        archive.writestr("example.com/tinymod@v1.0.0/go.mod", go_mod)
        archive.writestr("example.com/tinymod@v1.0.0/tiny.go",
                         "package tinymod\n\nfunc Value() int { return 41 + 1 }\n")
    return folder / "goproxy"


@pytest.mark.e2e
def test_go_builds_with_a_dependency_in_a_sandboxed_job_through_the_bridges_cache(bridge: Bridge) -> None:
    """Issue 47: go keeps downloaded modules in GOMODCACHE (~/go/pkg/mod) and builds in GOCACHE
    (~/.cache/go-build), both refused by the sandbox; the job's are the bridge's cache. Named back to the home it
    is refused; as the job gets them, the build downloads its dependency and runs, and ~/go is not written."""

    require_sandbox()
    go = require_tool("go")
    proxy = local_go_proxy(bridge.tmp)
    (bridge.root / "go.mod").write_text("module example.com/app\n\ngo 1.19\n\nrequire example.com/tinymod v1.0.0\n")
    (bridge.root / "main.go").write_text('package main\n\nimport (\n\t"fmt"\n\t"example.com/tinymod"\n)\n\n'
                                         "func main() { fmt.Println(tinymod.Value()) }\n")
    home = bridge.tmp / "home"
    script = bridge.tmp / "go.sh"
    script.write_text(f"""
export GOPROXY=file://{proxy} GOSUMDB=off GOFLAGS=-mod=mod GOTOOLCHAIN=local
{attempt_function('build.log')}
attempt go-home env GOMODCACHE={home}/go/pkg/mod GOCACHE={home}/.cache/go-build {go} build -o app-home .
attempt go {go} run .
""")
    with bridge.client() as client:
        job = final(client, task=f"!shell={script}", cwd=str(bridge.root))
    assert job.field("STATUS") == "ok", job.text
    tried, log = (bridge.root / "tried.txt").read_text(), (bridge.root / "build.log").read_text()
    assert "FAILED go-home" in tried and "permission denied" in log.lower(), (tried, log[-2000:])
    assert "DONE go" in tried and log.rstrip().endswith("42"), (tried, log[-2000:])
    assert not (home / "go").exists() and not (home / ".cache" / "go-build").exists()
    assert (project_cache_of(bridge, bridge.root) / "go" / "mod" / "example.com" / "tinymod@v1.0.0").is_dir()


def test_pre_commit_and_pytest_run_in_a_sandboxed_job_through_the_bridges_cache(bridge: Bridge) -> None:
    """Issue 47: pre-commit keeps its store (the hooks' environments and its database) in ~/.cache/pre-commit,
    which the sandbox refuses; the job's PRE_COMMIT_HOME is the bridge's cache. Named back to the home it fails;
    as the job gets it, the hooks run and the user's store is not written. pytest, run beside it, writes its cache
    in the folder and its tmp_path in the job's own TMPDIR."""
    import sys

    require_sandbox()
    pre_commit = Path(sys.executable).with_name("pre-commit")
    assert pre_commit.exists(), "pre-commit is not installed (requirements-dev.txt)"
    git(bridge.root, "init", "-q")
    (bridge.root / ".pre-commit-config.yaml").write_text(
        "repos:\n- repo: local\n  hooks:\n  - id: stamp\n    name: stamp\n    language: system\n"
        "    entry: sh -c 'echo hooked > hooked.txt'\n    pass_filenames: false\n    always_run: true\n")
    git(bridge.root, "add", ".pre-commit-config.yaml")
    (bridge.root / "test_tiny.py").write_text(
        "def test_tmp_path(tmp_path):\n    (tmp_path / 'x').write_text('1')\n    assert (tmp_path / 'x').exists()\n")
    home = bridge.tmp / "home"
    script = bridge.tmp / "pre-commit.sh"
    script.write_text(f"""
{attempt_function('hooks.log')}
attempt pre-commit-home env PRE_COMMIT_HOME={home}/.cache/pre-commit {shlex.quote(str(pre_commit))} run --all-files
attempt pre-commit {shlex.quote(str(pre_commit))} run --all-files
attempt pytest {shlex.quote(sys.executable)} -m pytest -q -p no:xdist test_tiny.py
""")
    with bridge.client() as client:
        job = final(client, task=f"!shell={script}", cwd=str(bridge.root))
    assert job.field("STATUS") == "ok", job.text
    tried, log = (bridge.root / "tried.txt").read_text(), (bridge.root / "hooks.log").read_text()
    assert "FAILED pre-commit-home" in tried and "Permission denied" in log, (tried, log[-2000:])
    assert "DONE pre-commit" in tried and (bridge.root / "hooked.txt").read_text() == "hooked\n", (tried, log)
    assert "DONE pytest" in tried and "1 passed" in log, (tried, log[-2000:])
    assert not (home / ".cache" / "pre-commit").exists()
    assert (project_cache_of(bridge, bridge.root) / "pre-commit" / "db.db").exists()


def require_component_path(path: Path, what: str) -> Path:
    from conftest import require_component

    return require_component(path, what)


@pytest.mark.parametrize("driver", ["cli", "acp"])
def test_the_writes_the_sandbox_refused_are_named_in_the_block(bridge: Bridge, driver: str) -> None:
    """SANDBOX_DENIED names what the job's tools reported refused outside its folders (a shell's redirect,
    Python's open), not what it wrote inside them; a job that met no refusal has no such line."""
    require_sandbox()
    outside = bridge.tmp / "outside"
    outside.mkdir()
    script = bridge.tmp / "refused.sh"
    script.write_text(f"""
echo x > {outside}/by-shell.txt
python3 -c 'open("{outside}/by-python.txt", "w")'
echo mine > mine.txt
exit 0
""")
    with client_of(bridge, driver) as client:
        job = final(client, task=f"!shell={script}", cwd=str(bridge.root))
        quiet = final(client, task="!write=a.txt:1", cwd=str(bridge.root))
    denied = job.field("SANDBOX_DENIED")
    assert f"{outside}/by-shell.txt" in denied and f"{outside}/by-python.txt" in denied, job.text
    assert "refused writes to 2 paths" in denied and "mine.txt" not in denied, job.text
    assert "SANDBOX_DENIED:" not in quiet.text


def test_refused_paths_are_read_from_the_tools_own_words() -> None:
    """The wording of real tools (npm 11, uv 0.13, sh, Python, git), each naming the refused path once; a path
    the job may write and a line without a refusal are not named."""
    from claude_hermes_bridge.sandbox import refused_paths

    texts = ["npm error code EACCES\nnpm error path /home/u/.npm\nnpm error errno EACCES: permission denied, mkdir "
             "'/home/u/.npm/_cacache'",
             '{"output": "error: Failed to initialize cache at `/home/u/.cache/uv`\\n  cause: failed to create '
             'directory `/home/u/.cache/uv`: Permission denied (os error 13)"}',
             "/work/job/run.sh: 2: cannot create /etc/motd: Permission denied",
             "PermissionError: [Errno 13] Permission denied: '/work/job/own.txt'",
             "error: could not lock config file /repo/.git/config: Permission denied",
             "all went well in /elsewhere/file"]
    assert refused_paths(texts, ["/work/job"], 20) == ["/home/u/.npm/_cacache", "/home/u/.cache/uv", "/etc/motd",
                                                       "/repo/.git/config"]
    assert refused_paths(texts, ["/work/job"], 2) == ["/home/u/.npm/_cacache", "/home/u/.cache/uv"]



def test_each_project_has_a_tool_cache_of_its_own(tmp_path: Path) -> None:
    """Issue 63: a package a job poisons in its cache reaches no other project's jobs: the cache is per project
    (a worktree job's is its repository's, as a job in the repository's folder has)."""
    private_tmp = tmp_path / "jobs" / "tmp" / "job"
    first, second = (project_cache(private_tmp, str(tmp_path / name), None) for name in ("a", "b"))
    assert first != second and first.parent == second.parent == tmp_path / "jobs" / "cache"
    worktree = {"repo": str(tmp_path / "a"), "path": str(tmp_path / "jobs" / "worktrees" / "job")}
    assert project_cache(private_tmp, worktree["path"], worktree) == first


def test_runs_later_names_by_rule_what_agents_tools_and_ci_load_and_the_hooks_path_folder(tmp_path: Path) -> None:
    """Issue 63: RUNS_LATER named none of 31 files that agents, editors, shells, package managers, test runners
    and CI load or run later; each is named now with the program that loads it, and so is what lies in the folder
    the repository's core.hooksPath names."""
    later = ["CLAUDE.md", "AGENTS.md", "GEMINI.md", ".cursorrules", ".windsurfrules", ".clinerules",
             ".github/copilot-instructions.md", ".continue/config.json", ".zed/tasks.json", ".aider.conf.yml",
             "package.json", "Makefile", "tests/conftest.py", "setup.py", "pyproject.toml", "tox.ini", "noxfile.py",
             ".husky/pre-commit", "Dockerfile", ".devcontainer/devcontainer.json", "sub/CLAUDE.md",
             ".github/workflows/ci.yml", "tools/hooks/pre-push"]
    plain = ["src/main.py", "README.md", "docs/index.md", "tests/test_x.py"]
    assert runs_later(later + plain, "tools/hooks") == later
    assert who_runs("sub/CLAUDE.md") == "Claude Code, as instructions"
    assert who_runs("tools/hooks/pre-push") == "git, as a hook (core.hooksPath)"
    repo = make_repo(tmp_path / "repo")
    git(repo, "config", "core.hooksPath", "tools/hooks")
    assert hooks_path_folder(str(repo), str(repo)) == "tools/hooks"
    assert hooks_path_folder(str(repo), str(repo / "tools")) == "hooks"
    git(repo, "config", "core.hooksPath", "/elsewhere")
    assert hooks_path_folder(str(repo), str(repo)) is None
