"""Issue 48, parts 1 and 2: what a sandboxed job reads stays home. Its tools cannot read the user's keys and
credentials (~/.ssh, ~/.aws, ~/.netrc, ...; Landlock grants reading everything else), and Hermes' environment
leaves out the user's credentials (cloud, git hosting, registries) but its model provider's key, unless
pass_credentials passes one. The fake Hermes' `!shell=SCRIPT` is the job's shell."""
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import psutil
import pytest
from test_worktrees import final

from claude_hermes_bridge.sandbox import read_grants, seatbelt_profile, step_argv, unreadable_paths
from conftest import require_sandbox, step_as
from harness import Bridge, wait_until

pytestmark = pytest.mark.posix("Landlock is Linux's; the fake Hermes is a shell script")

SECRETS = {".ssh/id_ed25519": "PRIVATE KEY", ".aws/credentials": "aws_secret_access_key = x", ".netrc": "password x",
           ".config/gh/hosts.yml": "oauth_token: x", ".docker/config.json": '{"auths": {}}',
           ".git-credentials": "https://u:token@host", ".kube/config": "token: x", ".pgpass": "*:*:*:u:pw",
           # issue 64: files no list named, each read by a job before reads in the home became an allow-list
           ".claude/.credentials.json": "{}", ".codex/auth.json": "{}", ".gemini/oauth_creds.json": "{}",
           ".config/Claude/claude_desktop_config.json": "{}", ".cursor/mcp.json": "{}",
           ".config/git/credentials": "https://u:p@host", ".yarnrc.yml": "npmAuthToken: x",
           ".config/pip/pip.conf": "[global]", ".m2/settings.xml": "<password/>", ".gradle/gradle.properties": "x=y",
           ".config/rclone/rclone.conf": "[r]", ".s3cfg": "[default]", ".config/containers/auth.json": "{}",
           ".config/github-copilot/hosts.json": "{}", "notes.txt": "private notes", ".config/tool.toml": "x"}
PUBLIC = {".gitconfig": "[user]\n\tname = u\n", ".config/git/config": "[core]\n", "shared/readme.txt": "asked for"}


def plant_secrets(home: Path) -> None:
    for name, text in {**SECRETS, **PUBLIC}.items():
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_text(text)


@pytest.mark.parametrize("driver", ["cli", "acp"])
def test_a_sandboxed_job_reads_of_the_home_only_what_is_allowed(bridge: Bridge, driver: str) -> None:
    """Issue 64: reads in the home are an allow-list (the toolchains' public files, sandbox_readable): every other
    file there is unreadable, known or not; the rest of the system stays readable."""
    require_sandbox()
    home = bridge.tmp / "home"
    plant_secrets(home)
    bridge.configure(sandbox_readable=[str(home / "shared")])
    script = bridge.tmp / "read.sh"
    checks = [*SECRETS, *PUBLIC]
    outsider = subprocess.Popen(["sleep", "120"], env={"OUTSIDER_TOKEN": "secret"})  # another program of the user's
    script.write_text("\n".join(f'if cat "{home}/{name}" > /dev/null 2>&1; then echo "READ {name}"; else echo '
                                f'"DENIED {name}"; fi >> tried.txt' for name in checks)
                      + f"\nif grep -a OUTSIDER /proc/{outsider.pid}/environ; then echo 'READ environ'; else echo "
                        "'DENIED environ'; fi >> tried.txt"
                      + "\nls " + str(home / ".ssh") + " > listing.txt\npython3 -c 'import json, sqlite3' && echo "
                        "'python works' >> tried.txt\ngit --version > /dev/null && echo 'git works' >> tried.txt\n"
                      + f"cat {home}/.aws/credentials > /dev/null || true\n")  # its refusal in the job's output
    from test_worktrees import client_of

    try:
        with client_of(bridge, driver) as client:
            job = final(client, task=f"!shell={script}", cwd=str(bridge.root))
    finally:
        outsider.kill()
        outsider.wait()
    assert job.field("STATUS") == "ok", job.text
    tried = (bridge.root / "tried.txt").read_text()
    assert "DENIED environ" in tried, tried  # run as root here, it holds by the capabilities the step drops
    for name in SECRETS:
        assert f"DENIED {name}" in tried, (name, tried)
    for name in PUBLIC:
        assert f"READ {name}" in tried, (name, tried)
    assert "python works" in tried and "git works" in tried, tried
    assert "reading: of your home only the toolchains' public files" in job.field("SANDBOX"), job.text
    assert "unreadable here, as ~/.aws, ~/.claude" in job.field("SANDBOX"), job.field("SANDBOX")
    assert job.field("SANDBOX_DENIED") == (  # the refusals in the job's output: cat's, and grep's of the environ
        "the sandbox refused reading 2 paths it keeps from every job (keys, credentials and other processes' /proc; "
        f"sandbox_unreadable adds more), as its tools reported them: /proc/{outsider.pid}/environ, "
        f"{home}/.aws/credentials"), job.text


def test_without_the_sandbox_the_same_job_reads_them(bridge: Bridge) -> None:
    home = bridge.tmp / "home"
    plant_secrets(home)
    script = bridge.tmp / "read.sh"
    script.write_text(f'cat "{home}/.ssh/id_ed25519" > stolen.txt\n')
    bridge.configure(sandbox="off")
    with bridge.client() as client:
        job = final(client, task=f"!shell={script}", cwd=str(bridge.root))
    assert job.field("STATUS") == "ok", job.text
    assert (bridge.root / "stolen.txt").read_text() == "PRIVATE KEY"


def test_a_key_inside_the_jobs_own_folder_is_said_to_be_readable(bridge: Bridge) -> None:
    """A job whose folder is the home itself can read what it holds: said, not hidden."""
    require_sandbox()
    home = bridge.tmp / "roots" / "a"  # the allowed root is the home here
    plant_secrets(home)
    client = bridge.client()
    client.params.env = dict(bridge.env, HOME=str(home))
    with client:
        job = final(client, task="!write=a.txt:1", cwd=str(home))
    assert job.field("STATUS") == "ok", job.text
    assert f"EXCEPT {home}, inside what the job may write: readable whole" in job.field("SANDBOX"), job.text


def test_read_grants_cover_all_but_the_unreadable_paths_and_follow_no_link_into_them(tmp_path: Path) -> None:
    home = tmp_path / "home"
    plant_secrets(home)
    (home / "keys").symlink_to(home / ".ssh")
    (tmp_path / "other").mkdir()
    (home / "elsewhere").symlink_to(tmp_path / "other")
    (home / "around").symlink_to(tmp_path)  # a link to a folder that holds the keys: not granted either
    readable = [str(home / name) for name in (".gitconfig", ".config/git/config", "shared")]
    unreadable = unreadable_paths(str(home), [str(tmp_path / "private")], readable)
    assert str(tmp_path / "private") in unreadable and str(home / ".config" / "git") not in unreadable
    grants = read_grants(unreadable)
    under_home = sorted(os.path.relpath(path, home) for path in grants if path.startswith(str(home) + "/"))
    assert under_home == [".config/git/config", ".gitconfig", "elsewhere", "shared"], under_home  # elsewhere: out
    assert "/usr" in grants and "/etc" in grants


def test_the_macos_profile_denies_reading_the_unreadable_paths(tmp_path: Path) -> None:
    profile = seatbelt_profile([str(tmp_path)], [str(tmp_path / ".ssh")])
    assert f'(deny file-read-data (subpath "{tmp_path / ".ssh"}"))' in profile


# Issue 64: variables a list of secrets missed, each handed to a job before the environment became an allow-list
UNLISTED_SECRETS = {name: f"leaked-secret-{number}" for number, name in enumerate((
    "API_KEY", "TOKEN", "SECRET_KEY", "GITHUB_PAT", "DATABASE_URL", "BW_SESSION", "OP_SESSION_my", "SSH_PRIVATE_KEY",
    "SENTRY_DSN", "SLACK_WEBHOOK_URL", "SMTP_PASS", "DOCKER_AUTH_CONFIG", "CI_JOB_JWT", "HERMES_GITHUB_TOKEN",
    "PIP_INDEX_URL", "PGPASSWORD", "MYSQL_PWD"))}


def test_the_users_credentials_are_left_out_of_hermes_environment_and_named(bridge: Bridge) -> None:
    bridge.extra_env.update(GITHUB_TOKEN="ghp-secret", AWS_SECRET_ACCESS_KEY="aws-secret", NPM_TOKEN="npm-secret",
                            MY_SERVICE_PASSWORD="pw", OPENROUTER_API_KEY="model-key", DO_NOT_TRACK="1",
                            AWS_CA_BUNDLE="/etc/ssl/bundle.pem", MY_TOOL_SETTING="kept", **UNLISTED_SECRETS)
    bridge.configure(pass_credentials=["NPM_TOKEN"], pass_environment=["FAKE_*", "MY_TOOL_SETTING"])
    script = bridge.tmp / "env.sh"
    script.write_text("env > env.txt\n")
    with bridge.client() as client:
        job = final(client, task=f"!shell={script}", cwd=str(bridge.root))
        health = client.call("hermes_health").field("CREDENTIALS")
    assert job.field("STATUS") == "ok", job.text
    seen = (bridge.root / "env.txt").read_text()
    for secret in ("ghp-secret", "aws-secret", "=pw", *UNLISTED_SECRETS.values()):
        assert secret not in seen, secret
    assert "MY_TOOL_SETTING=kept" in seen  # pass_environment hands a name the allow-list does not hold
    assert "OPENROUTER_API_KEY=model-key" in seen and "NPM_TOKEN=npm-secret" in seen and "DO_NOT_TRACK=1" in seen
    assert "AWS_CA_BUNDLE=/etc/ssl/bundle.pem" in seen  # a setting, not a credential
    for name in ("AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN", "MY_SERVICE_PASSWORD", *UNLISTED_SECRETS):
        assert name in health, health
    assert "NPM_TOKEN" not in health and "OPENROUTER_API_KEY" not in health and "secret" not in health


@pytest.mark.parametrize("user", ["this user", "nobody"])
def test_another_processs_environment_is_unreadable_inside_the_sandbox_and_readable_outside(user: str) -> None:
    """Landlock scopes ptrace-class reads to the sandbox's own processes; root, whose CAP_SYS_ADMIN or CAP_PERFMON
    pass that scope, loses them at the step (CI runs as root, users do not: both are run)."""
    require_sandbox()
    if user == "nobody" and os.geteuid() != 0:
        pytest.skip("setpriv to another user needs root (CI runs as root)")
    as_user = [] if user == "this user" else [shutil.which("setpriv") or "setpriv", "--reuid=65534", "--regid=65534",
                                         "--clear-groups"]
    outsider = subprocess.Popen([*as_user, "sleep", "120"], env={"OUTSIDER_TOKEN": "secret"})
    try:  # read once it is sleep (before its exec, its environment is the parent's, and it may still be root)
        wait_until(lambda: psutil.Process(outsider.pid).name() == "sleep", 10, "the outsider to run")
        read = [shutil.which("cat") or "/bin/cat", f"/proc/{outsider.pid}/environ"]
        outside = subprocess.run([*as_user, *read], capture_output=True, timeout=30)
        readable = Path(tempfile.mkdtemp(prefix="bridge-test-"))  # beside /tmp: tmp_path is root's alone
        inside = subprocess.run(step_as(user, step_argv(["/dev/null"], read), readable), capture_output=True,
                                timeout=30)
        shutil.rmtree(readable)
    finally:
        outsider.kill()
        outsider.wait()
    assert b"OUTSIDER_TOKEN=secret" in outside.stdout, outside
    assert inside.returncode != 0 and b"OUTSIDER" not in inside.stdout, inside
    assert b"Permission denied" in inside.stderr, inside


def test_a_link_into_a_folder_the_user_cannot_enter_does_not_stop_a_job_as_that_user() -> None:
    """A granted folder (the system's temporary one, shared with every user) may hold a symbolic link into a folder
    this user cannot enter (another user's, or another job's private one): nothing it could read, so the step
    confines the job without it, as another user, rather than refusing to start."""
    require_sandbox()
    if os.geteuid() != 0:
        pytest.skip("setpriv to another user needs root (CI runs as root)")
    shared = Path(tempfile.mkdtemp(prefix="bridge-test-"))  # beside /tmp: tmp_path is root's alone
    try:
        shared.chmod(0o755)
        (shared / "private").mkdir(mode=0o700)
        (shared / "private" / "target").write_text("root's")
        (shared / "link").symlink_to(shared / "private" / "target")
        (shared / "kept.txt").write_text("readable")
        (shared / "kept.txt").chmod(0o644)
        read = [shutil.which("cat") or "/bin/cat", str(shared / "kept.txt")]
        inside = subprocess.run(step_as("nobody", step_argv(["/dev/null"], read, [str(shared / "secret")]),
                                        shared), capture_output=True, timeout=30)
    finally:
        shutil.rmtree(shared)
    assert inside.returncode == 0 and inside.stdout == b"readable", inside
