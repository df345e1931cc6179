"""Issue 38: with `sandbox` on (the default, Linux with Landlock), Hermes and everything it starts write only
in the job's folder, its private temporary folder and Hermes' home, and signal no process outside the job.
The fake Hermes' `!shell=SCRIPT` is the job's shell: each escape a hostile or mistaken job would try, and the
work it is there to do."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_supervisor import supervised
from test_worktrees import final

from claude_hermes_bridge.jobs import JobState
from claude_hermes_bridge.sandbox import Mechanism, seatbelt_profile, step_argv
from conftest import require_sandbox
from harness import Bridge

pytestmark = pytest.mark.posix("Landlock is Linux's; the fake Hermes is a shell script")


ESCAPES = ("redirect", "sibling", "home", "symlink", "hardlink", "move", "truncate", "gitconfig", "unit", "kill",
           "settings", "late")
# truncate: truncate(2) by path, held by Landlock's own truncate right (truncate(1) first opens the file to write);
# reparent: renames between folders, its own and TMPDIR (Landlock's refer right: without it, EXDEV breaks mv, pip, git)
REFUSED = ESCAPES[:-2]  # the sandbox refuses these; Hermes' settings are put back after; the late write is checked
WORK = ("work", "tmp", "reparent")


def escapes(bridge: Bridge, victim: int, hermes_home: Path) -> tuple[Path, dict[str, Path]]:
    """A script trying one escape (`sh escapes.sh NAME`) or each in turn (no argument), each result recorded in
    the folder's tried.txt as DONE or DENIED <name>; and the targets it aims at, which must stay as they are."""
    outside = bridge.tmp / "outside"
    sibling = bridge.tmp / "sibling-project"
    for folder in (outside, sibling):
        folder.mkdir()
    (sibling / "keep.txt").write_text("the user's\n")
    (outside / "linked.txt").write_text("the user's\n")
    (outside / "full.txt").write_text("the user's\n")
    home = bridge.tmp / "home"
    targets = {"redirect": outside / "redirect.txt", "sibling": sibling / "keep.txt", "home": home / ".bashrc",
               "symlink": outside / "via-symlink.txt", "hardlink": outside / "linked.txt",
               "move": outside / "moved.txt", "truncate": outside / "full.txt", "gitconfig": home / ".gitconfig",
               "unit": home / ".config" / "systemd" / "user" / "x.service",
               "late": outside / "late.txt"}
    script = bridge.tmp / "escapes.sh"
    script.write_text(f"""
try() {{ name=$1; shift; if ( "$@" ) >/dev/null 2>&1; then echo "DONE $name"; else echo "DENIED $name"; fi \
  >> tried.txt; }}
one() {{ case $1 in
  redirect) try redirect sh -c 'echo pwned > {targets["redirect"]}';;
  sibling) try sibling rm -rf {sibling};;
  home) try home python3 -c 'open("{targets["home"]}", "a").write("pwned")';;
  symlink) ln -s {outside} escape-link; try symlink sh -c 'echo pwned > escape-link/via-symlink.txt';;
  hardlink) try hardlink sh -c 'ln {targets["hardlink"]} hard.txt && echo pwned >> hard.txt';;
  move) try move sh -c 'echo mine > mine.txt && mv mine.txt {targets["move"]}';;
  truncate) try truncate python3 -c 'import os; os.truncate("{targets["truncate"]}", 0)';;
  gitconfig) try gitconfig env HOME={home} git config --global core.pager pwned;;
  unit) try unit sh -c 'mkdir -p {targets["unit"].parent} && echo pwned > {targets["unit"]}';;
  kill) try kill kill {victim};;
  settings) try settings sh -c 'echo "approvals: {{mode: off}}" >> {hermes_home}/config.yaml && \
    mkdir -p {hermes_home}/skills/x && echo pwned > {hermes_home}/skills/x/SKILL.md';;
  late) (setsid nohup sh -c 'sleep 1; echo pwned > {targets["late"]}' >/dev/null 2>&1 &)
    echo "DONE late" >> tried.txt;;
  work) try work sh -c 'echo done > work.txt';;
  tmp) try tmp sh -c 'echo scratch > "$TMPDIR/scratch.txt" && test -s "$TMPDIR/scratch.txt"';;
  reparent) try reparent python3 -c 'import os, tempfile; t = tempfile.gettempdir(); os.makedirs("a/b"); \
    open("a/f", "w").close(); os.rename("a/f", "a/b/f"); os.rename("a/b/f", t + "/f"); os.rename(t + "/f", "g")';;
esac; }}
if [ -n "$1" ]; then one "$1"; else for name in {' '.join(ESCAPES + WORK)}; do one $name; done; fi
""")
    return script, targets


def contents(targets: dict[str, Path]) -> dict[str, bytes | None]:
    return {name: path.read_bytes() if path.exists() else None for name, path in targets.items()}


@pytest.mark.parametrize("driver", ["cli", "acp"])
def test_every_escape_fails_inside_the_job_and_its_own_work_is_done(bridge: Bridge, driver: str) -> None:
    require_sandbox()
    victim = subprocess.Popen(["sleep", "60"])
    try:
        script, targets = escapes(bridge, victim.pid, bridge.tmp / "hermes-home")
        (bridge.tmp / "hermes-home" / "skills").mkdir(parents=True, exist_ok=True)
        (bridge.tmp / "hermes-home" / "config.yaml").write_text("model: x\n")
        before = contents(targets)
        bridge.configure(hermes_driver=driver)
        client = bridge.client()
        client.params.env = dict(bridge.env, FAKE_HERMES_ACP="1" if driver == "acp" else "0")
        with client:
            job = final(client, task=f"!shell={script}", cwd=str(bridge.root))
        time.sleep(1.5)  # the background process' write, had it been allowed
        assert job.field("STATUS") == "ok", job.text
        log = (bridge.root / "tried.txt").read_text()
        for name in REFUSED:
            assert f"DENIED {name}" in log, (name, log[-3000:])
        assert all(f"DONE {name}" in log for name in WORK), log[-3000:]
        # Hermes' home stays writable (its store, journal and locks sit beside config.yaml): put back at the end
        assert "DONE settings" in log and (bridge.tmp / "hermes-home" / "config.yaml").read_text() == "model: x\n"
        assert not (bridge.tmp / "hermes-home" / "skills" / "x").exists()
        job_version = bridge.jobs / f"{job.field('JOB_ID')}.hermes-home-changes" / "config.yaml"
        assert job.field("HERMES_SETTINGS") == (
            f"the job changed config.yaml; put back (the job's version: {job_version}) | the job created skills/x; "
            f"put back | the job created skills/x/SKILL.md; put back (the job's version: "
            f"{job_version.parent / 'skills' / 'x' / 'SKILL.md'})"), job.text
        assert job_version.read_text() == "model: x\napprovals: {mode: off}\n"
        assert contents(targets) == before
        assert victim.poll() is None, "the job killed a process of the user's"
        assert (bridge.root / "work.txt").read_text() == "done\n"
        sandbox = job.field("SANDBOX")
        assert sandbox.startswith(f"writes limited to {bridge.root}, {bridge.jobs / 'tmp' / job.field('JOB_ID')} "
                                  "(TMPDIR), Hermes' home "), sandbox
        assert "no signal to a process outside the job" in sandbox
        assert not (bridge.jobs / "tmp" / job.field("JOB_ID")).exists()  # the private folder goes with the job
    finally:
        victim.kill()


def test_a_sandbox_writable_folder_that_does_not_exist_yet_stops_no_job(bridge: Bridge) -> None:
    """The one missing is left out of the rules (a rule needs a folder to hold), the others are kept."""
    require_sandbox()
    kept = bridge.tmp / "shared-build"
    kept.mkdir()
    bridge.configure(sandbox_writable=[*bridge.settings["sandbox_writable"], str(bridge.tmp / "not-made-yet"),
                                       str(kept)])
    script = bridge.tmp / "build.sh"
    script.write_text(f"echo built > {kept}/out.txt\n")
    with bridge.client() as client:
        job = final(client, task=f"!shell={script}", cwd=str(bridge.root))
    assert job.field("STATUS") == "ok", job.text
    assert (kept / "out.txt").read_text() == "built\n"
    assert str(kept) in job.field("SANDBOX") and "not-made-yet" not in job.field("SANDBOX")


def test_off_runs_unconfined_and_says_so_where_every_escape_succeeds(bridge: Bridge) -> None:
    """The same escapes without the sandbox all succeed: what the sandbox test sees refused is its doing."""
    victim = subprocess.Popen(["sleep", "60"])
    try:
        script, targets = escapes(bridge, victim.pid, bridge.tmp / "hermes-home")
        bridge.configure(sandbox="off")
        with bridge.client() as client:
            job = final(client, task=f"!shell={script}", cwd=str(bridge.root))
            health = client.call("hermes_health")
        log = (bridge.root / "tried.txt").read_text()
        assert [line.split()[1] for line in log.splitlines() if line.startswith("DONE")] == [*ESCAPES, *WORK], log
        assert victim.wait(timeout=10) is not None and targets["redirect"].read_text() == "pwned\n"
        assert job.field("SANDBOX") == "off (setting sandbox: off): the job writes wherever your account can"
        assert "HERMES_SETTINGS" not in job.text  # the home guard is the sandbox's
        assert health.field("SANDBOX").startswith("off (setting sandbox: off)")
    finally:
        victim.kill()


def test_required_refuses_a_job_where_no_sandbox_is_and_auto_runs_it_saying_why(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("claude_hermes_bridge.job_planning.sandbox_mechanism",
                        lambda: Mechanism("", "no Landlock in this kernel", False))
    (tmp_path / "required").mkdir()
    (tmp_path / "auto").mkdir()
    required, starter = supervised(tmp_path / "required", "print('ran')")
    required.cfg.sandbox = "required"
    required.run()
    record = required.store.read(required.job_id)
    assert record.state is JobState.ERROR and not starter.calls
    assert record.reason == ("sandbox is required, and this machine cannot give one (no Landlock in this kernel); "
                             "Hermes was not started. Set sandbox to auto or off to run unconfined")
    auto, starter = supervised(tmp_path / "auto", "print('ran')")
    auto.cfg.sandbox = "auto"
    auto.run()
    record = auto.store.read(auto.job_id)
    assert record.state is JobState.OK and starter.calls
    assert record.sandbox == ("not available here (no Landlock in this kernel): the job writes wherever your "
                              "account can")


def test_health_says_what_the_sandbox_does_here(bridge: Bridge) -> None:
    require_sandbox()
    with bridge.client() as client:
        health = client.call("hermes_health")
    assert health.field("SANDBOX").startswith("on (Landlock ABI "), health.text
    assert "it cannot signal processes outside it" in health.field("SANDBOX")
    assert "its /dev/pts and /dev/shm are its own" in health.field("SANDBOX"), health.text


def test_the_step_confines_then_becomes_the_program_and_starts_nothing_it_cannot_confine(tmp_path: Path) -> None:
    require_sandbox()
    done = subprocess.run(step_argv([str(tmp_path / "missing")], ["/bin/sh", "-c", "echo started"]),
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 126 and "started" not in done.stdout
    assert "the sandbox could not be applied" in done.stderr and "Hermes was not started" in done.stderr
    outside = tmp_path.parent / f"outside-{os.getpid()}"
    started = subprocess.run(step_argv([str(tmp_path)], ["/bin/sh", "-c", f"echo ok > {tmp_path}/in; "
                                                          f"echo no > {outside} || :; echo $$"]),
                             capture_output=True, text=True, timeout=30)
    assert started.returncode == 0 and (tmp_path / "in").read_text() == "ok\n" and not outside.exists()


def test_the_supervisor_starts_hermes_through_the_step_with_a_private_tmp_and_no_session_sockets(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require_sandbox()
    monkeypatch.setenv("SSH_AUTH_SOCK", str(tmp_path / "agent.sock"))
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", "unix:path=/run/user/1/bus")
    supervisor, starter = supervised(tmp_path, "print('ran')")
    supervisor.cfg.sandbox = "auto"
    supervisor.run()
    [call] = starter.calls
    record = supervisor.store.read(supervisor.job_id)
    private = supervisor.store.root / "tmp" / supervisor.job_id
    hermes_argv = call["argv"][call["argv"].index("--") + 1:]
    assert call["argv"][:4] == [sys.executable, "-I", "-S", "-B"] and hermes_argv[0] == str(tmp_path / "hermes")
    boot = call["argv"].index("-c") + 2  # the boot code, then the package's folder, then the writable paths
    assert call["argv"][boot + 1:boot + 4] == [str(tmp_path / "root"), str(private), str(tmp_path / "home")]
    assert call["env"]["TMPDIR"] == call["env"]["TEMP"] == call["env"]["TMP"] == str(private)
    assert "SSH_AUTH_SOCK" not in call["env"] and "DBUS_SESSION_BUS_ADDRESS" not in call["env"]
    assert record.state is JobState.OK and record.sandbox and record.sandbox.startswith("writes limited to ")
    assert not private.exists()


def test_what_a_job_changed_of_hermes_settings_is_put_back_and_its_version_kept(tmp_path: Path) -> None:
    """The home guard on its own: config.yaml edited, .env removed, a cron job and a plugin planted; what Hermes
    makes at its first run in a home (hooks, here) is kept and said."""
    home = tmp_path / "home"
    (home / "skills" / "mine").mkdir(parents=True)
    (home / "cron").mkdir()
    (home / "plugins").mkdir()
    (home / "config.yaml").write_text("approvals: {mode: manual}\n")
    (home / ".env").write_text("KEY=1\n")
    (home / "skills" / "mine" / "SKILL.md").write_text("mine\n")
    program = (f"import os, pathlib; h = pathlib.Path({str(home)!r}); "
               "(h / 'config.yaml').write_text('approvals: {mode: off}\\n'); os.unlink(h / '.env'); "
               "(h / 'cron' / 'jobs.json').write_text('[]'); (h / 'plugins' / 'p.py').write_text('import os'); "
               "(h / 'hooks').mkdir(); (h / 'hooks' / 'x').write_text(''); "
               "(h / 'state.db').write_text('sessions')")
    supervisor, _ = supervised(tmp_path, program)
    supervisor.cfg.sandbox = "auto"
    supervisor.run()
    record = supervisor.store.read(supervisor.job_id)
    kept = supervisor.store.root / f"{supervisor.job_id}.hermes-home-changes"
    assert record.hermes_home == ["hooks made (Hermes' first run in this home); kept, but for what the job put in "
                                  "hooks",
                                  "the job removed .env; put back",
                                  f"the job changed config.yaml; put back (the job's version: {kept / 'config.yaml'})",
                                  "the job created cron/jobs.json; put back (the job's version: "
                                  f"{kept / 'cron' / 'jobs.json'})",
                                  f"the job created hooks/x; put back (the job's version: {kept / 'hooks' / 'x'})",
                                  "the job created plugins/p.py; put back (the job's version: "
                                  f"{kept / 'plugins' / 'p.py'})"]
    assert (home / "config.yaml").read_text() == "approvals: {mode: manual}\n"
    assert (home / ".env").read_text() == "KEY=1\n"
    assert not (home / "cron" / "jobs.json").exists() and not (home / "hooks" / "x").exists()
    assert not (home / "plugins" / "p.py").exists()
    assert (home / "hooks").is_dir()  # the folder Hermes makes on its first run stays
    assert (home / "state.db").read_text() == "sessions"  # Hermes' own: kept
    assert (kept / "config.yaml").read_text() == "approvals: {mode: off}\n"
    assert (home / "skills" / "mine" / "SKILL.md").read_text() == "mine\n"
    supervisor.store.remove(supervisor.job_id)
    assert not kept.exists() and not supervisor.store.home_snapshot_path(supervisor.job_id).exists()


def test_the_macos_profile_allows_writes_only_beneath_the_same_list_and_quotes_every_path(tmp_path: Path) -> None:
    """Seatbelt cannot run here: its profile text is what is checked (README says so)."""
    folder = tmp_path / 'a "quoted" \\ folder'
    folder.mkdir()
    profile = seatbelt_profile([str(folder), "/dev/null"])
    escaped = str(folder.resolve()).replace("\\", "\\\\").replace('"', '\\"')
    assert profile.splitlines() == [
        "(version 1)", "(allow default)", "(deny file-write*)",
        f'(allow file-write* (subpath "{escaped}") (literal "/dev/null"))', "(deny signal (target others))"]
    monkeypatch = pytest.MonkeyPatch()
    with monkeypatch.context() as patched:
        patched.setattr("sys.platform", "darwin")
        assert step_argv([str(folder)], ["hermes", "acp"]) == ["/usr/bin/sandbox-exec", "-p",
                                                                seatbelt_profile([str(folder)]), "hermes", "acp"]


def test_no_number_of_skills_hides_a_planted_hook_or_cron_job(tmp_path: Path) -> None:
    """Issue 47: 6,000 files under skills/, then a hook and a cron job: both found and put back."""
    home = tmp_path / "home"
    for name in ("skills", "hooks", "cron"):
        (home / name).mkdir(parents=True)
    (home / "config.yaml").write_text("model: x\n")
    program = (f"import pathlib; h = pathlib.Path({str(home)!r}); s = h / 'skills' / 'many'; s.mkdir(); "
               "[(s / f'{n}.md').write_text('x') for n in range(6000)]; "
               "(h / 'hooks' / 'evil').mkdir(); (h / 'hooks' / 'evil' / 'handler.py').write_text('pwned'); "
               "(h / 'cron' / 'jobs.json').write_text('[{\"run\": \"pwned\"}]')")
    supervisor, _ = supervised(tmp_path, program)
    supervisor.cfg.sandbox = "auto"
    supervisor.run()
    notes = supervisor.store.read(supervisor.job_id).hermes_home
    assert not (home / "hooks" / "evil").exists() and not (home / "cron" / "jobs.json").exists(), notes
    assert not (home / "skills" / "many").exists()
    assert any("created hooks/evil/handler.py" in note for note in notes) or any(
        note.startswith("and ") for note in notes), notes


def test_a_walk_cut_at_the_end_replaces_the_folder_by_what_it_held(tmp_path: Path, monkeypatch) -> None:
    """Fail safe: past the bound of the end's walk, the folder is replaced whole by what was recorded."""
    import claude_hermes_bridge.home_guard as home_guard

    monkeypatch.setattr(home_guard, "ENTRIES_AT_THE_END", 50)
    home = tmp_path / "home"
    (home / "hooks").mkdir(parents=True)
    (home / "hooks" / "mine.py").write_text("the user's")
    (home / "config.yaml").write_text("model: x\n")
    program = (f"import pathlib; h = pathlib.Path({str(home)!r}) / 'hooks'; "
               "[(h / f'{n}.py').write_text('pwned') for n in range(80)]")
    supervisor, _ = supervised(tmp_path, program)
    supervisor.cfg.sandbox = "auto"
    supervisor.run()
    notes = supervisor.store.read(supervisor.job_id).hermes_home
    assert sorted(path.name for path in (home / "hooks").iterdir()) == ["mine.py"], notes
    assert (home / "hooks" / "mine.py").read_text() == "the user's"
    assert "the job left more than 50 entries under hooks: it was replaced by what it held before the job" in notes
