"""[both] Where a job's commands run besides this machine (config.Executor): a container a docker daemon makes for
the job, or another host over ssh. Hermes itself, its model calls, approvals and budgets stay here; its terminal
backend (docker or ssh, set in the job's managed policy, which wins over the user's own config) moves the commands.
The checks before a job starts (each refusal names its fix), the policy's terminal section, the job's containers
removed by the bridge's labels, and over ssh the job's work carried out and back with git."""
import contextlib
import hashlib
import os
import secrets
import shlex
import shutil
import stat
import subprocess
import threading
from pathlib import Path
from typing import Any, Callable

from .config import Executor
from .git_calls import GitFailed, git
from .safe_io import NOFOLLOW, shown

CHECK_TIMEOUT_S = 10.0  # a daemon or a host that does not answer within it refuses the job
REMOVE_TIMEOUT_S = 30.0
LABEL_JOB = "claude-hermes-bridge.job"  # on every container of a job, with the job's id
LABEL_JOBS = "claude-hermes-bridge.jobs"  # and the jobs folder's, so a sweep never touches another install's
SSH_STRICT = ("-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o", "ConnectTimeout=8",
              "-o", "IdentitiesOnly=yes")


def jobs_label(jobs_root: Path) -> str:
    return hashlib.sha256(os.path.realpath(jobs_root).encode()).hexdigest()[:16]


def run_tool(argv: list[str], env: dict[str, str] | None = None, timeout_s: float = CHECK_TIMEOUT_S
             ) -> tuple[int, str]:
    """A docker or ssh client run to its end within timeout_s: its exit code (124: it did not end) and its last
    line of output."""
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, env=env, timeout=timeout_s,
                              check=False)
    except subprocess.TimeoutExpired:
        return 124, f"no answer within {timeout_s:g} s"
    except OSError as exc:
        return 127, str(exc.strerror or exc)
    said = [line for line in (done.stderr + done.stdout).decode("utf-8", "replace").splitlines() if line.strip()]
    return done.returncode, (said[-1] if said else "")


def docker_environment(executor: Executor) -> dict[str, str]:
    """The environment docker's client (and Hermes' docker backend) runs with: the executor's daemon if it names one."""
    env = dict(os.environ)
    if executor.docker_host:
        env["DOCKER_HOST"] = executor.docker_host
    return env


def docker_socket(executor: Executor) -> str | None:
    """The daemon's socket this executor talks to, which the job's Hermes must reach (and nothing it runs)."""
    host = executor.docker_host or os.environ.get("DOCKER_HOST", "") or "unix:///var/run/docker.sock"
    return os.path.realpath(host[len("unix://"):]) if host.startswith("unix://") else None


def docker_command(*args: str) -> list[str]:
    return [shutil.which("docker") or "docker", *args]


def docker_refusal(executor: Executor) -> str | None:
    """Why a docker job cannot start now: no docker client, a daemon that does not answer, or an image the daemon
    lacks (never pulled silently)."""
    if shutil.which("docker") is None:
        return f"executor {executor.name} needs the docker client, which is not on PATH: install Docker"
    env = docker_environment(executor)
    code, said = run_tool(docker_command("version", "--format", "{{.Server.Version}}"), env)
    if code != 0:
        where = executor.docker_host or env.get("DOCKER_HOST") or "the default socket"
        return (f"executor {executor.name}: the docker daemon at {shown(where, 200)} does not answer "
                f"({shown(said, 200)}); start it, or fix docker_host")
    code, said = run_tool(docker_command("image", "inspect", "--format", "{{.Id}}", executor.image), env)
    if code != 0:
        return (f"executor {executor.name}: the image {executor.image} is not on the docker daemon, and the bridge "
                f"never pulls one: `docker pull {executor.image}` (or `docker import` of your own) gets it")
    return None


WORKSPACE = "/workspace"  # where Hermes' docker backend runs commands for a mounted folder, whatever its path


def volume_mounts(folder: str, also: list[str], mounts: list[str]) -> list[str]:
    """docker's -v specs: the job's folder at /workspace (Hermes 0.22 runs every command of a mounted folder
    there) and at its own path (so the task's absolute paths, a worktree's `.git` file and DIFF, review and landing
    all name the same files), what else the job writes (also), and the sandbox's mounts: ro: read-only, rw:
    writable, each at its path and, inside the folder, under /workspace too; hide: is left out (the container
    holds nothing of this machine but what is named here)."""
    specs = [f"{folder}:{WORKSPACE}", f"{folder}:{folder}", *(f"{path}:{path}" for path in also)]
    for mount in mounts:
        kind, _, path = mount.partition(":")
        if kind not in ("ro", "rw") or not os.path.exists(path):
            continue
        mode = ":ro" if kind == "ro" else ""
        specs.append(f"{path}:{path}{mode}")
        if path.startswith(folder + os.sep):
            specs.append(f"{path}:{WORKSPACE}{path[len(folder):]}{mode}")
    return list(dict.fromkeys(specs))


PROBE_NAME = ".claude-hermes-bridge-probe"


def probe_mount(executor: Executor, job_id: str, jobs_root: Path, folder: str, network: bool) -> str | None:
    """Whether the daemon's containers see the job's folder (a daemon on another machine, or one whose
    namespace lacks the path, would mount an empty folder and the job's writes would vanish), on the network the
    job's container gets: a probe file written here is read back through a throwaway container. None, or what
    went wrong in words."""
    probe = Path(folder) / f"{PROBE_NAME}-{secrets.token_hex(8)}"
    made = False
    try:  # made afresh, never through a name a job planted (a symbolic link would send the write elsewhere)
        descriptor = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o600)
        made = True
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(job_id)
        code, said = run_tool(docker_command("run", "--rm", *(() if network else ("--network", "none")),
                                             "--label", f"{LABEL_JOB}={job_id}",
                                             "--label", f"{LABEL_JOBS}={jobs_label(jobs_root)}", "-v",
                                             f"{folder}:{WORKSPACE}:ro", executor.image, "cat",
                                             f"{WORKSPACE}/{probe.name}"),
                              docker_environment(executor), REMOVE_TIMEOUT_S)
    except OSError as exc:
        return f"the probe file could not be written ({exc.strerror or exc})"
    finally:
        if made:
            probe.unlink(missing_ok=True)
    if code != 0 or said.strip() != job_id:
        return (f"a container of executor {executor.name} could not read the job's folder {shown(folder, 200)} "
                f"({shown(said, 200) or 'the probe file was not there'}): is the daemon on another machine, or "
                "without a default network for an open job?")
    return None


def path_refusal(paths: list[str]) -> str | None:
    """docker's -v cannot name a path holding ':' or ','."""
    bad = [path for path in paths if ":" in path or "," in path]
    return (f"the job's folder {shown(bad[0], 200)} holds ':' or ',', which a docker mount cannot name; move it or "
            "run the job locally") if bad else None


def container_network(executor: Executor, network_mode: str) -> bool:
    """Whether the container gets the daemon's network: only an open job on an executor that allows it. A limited
    job's container gets none (its proxy cannot be reached from inside and still hold its rules)."""
    return network_mode == "open" and executor.network == "job"


def terminal_section(executor: Executor, job_id: str, jobs_root: Path, cwd: str, volumes: list[str],
                     network_mode: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Hermes' `terminal:` for this job's managed policy. docker: a container for this job alone (never reused
    across processes or sessions, no image pulled by Hermes under another name), the folders at the same path,
    the job's network, run as this user, labelled for the bridge's sweep, with env inside (a worktree job's git
    objects). ssh: the host, the user, the key, and the remote worktree as its folder."""
    if executor.kind == "ssh":
        return {"backend": "ssh", "ssh_host": executor.host, "ssh_user": executor.user, "ssh_port": executor.port,
                "ssh_key": os.path.expanduser(executor.key), "cwd": cwd, "persistent_shell": True}
    return {"backend": "docker", "docker_image": executor.image, "cwd": cwd, "docker_volumes": volumes,
            "docker_mount_cwd_to_workspace": True, "container_persistent": False,
            "docker_persist_across_processes": False, "docker_orphan_reaper": False,
            "docker_network": container_network(executor, network_mode), "docker_run_as_host_user": True,
            "docker_forward_env": [], "docker_env": dict(env or {}),
            "docker_extra_args": ["--label", f"{LABEL_JOB}={job_id}",
                                  "--label", f"{LABEL_JOBS}={jobs_label(jobs_root)}"]}


def job_containers(executor: Executor, jobs_root: Path, job_id: str | None = None) -> list[tuple[str, str]]:
    """The containers the bridge's labels name (this jobs folder's; one job's if job_id): (id, job id) each."""
    label = f"{LABEL_JOB}={job_id}" if job_id else LABEL_JOB
    argv = docker_command("ps", "-a", "--no-trunc", "--filter", f"label={label}", "--filter",
                          f"label={LABEL_JOBS}={jobs_label(jobs_root)}", "--format",
                          "{{.ID}} {{.Label \"" + LABEL_JOB + "\"}}")
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, env=docker_environment(executor),
                              timeout=CHECK_TIMEOUT_S, check=False)
    except (subprocess.TimeoutExpired, OSError):
        return []
    found = []
    for line in done.stdout.decode("utf-8", "replace").splitlines():
        container, _, owner = line.strip().partition(" ")
        if container:
            found.append((container, owner))
    return found


def remove_containers(executor: Executor, containers: list[str]) -> str | None:
    """The containers removed (stopped first, their mounts with them): None, or what went wrong in words."""
    if not containers:
        return None
    code, said = run_tool(docker_command("rm", "-f", *containers), docker_environment(executor),
                          REMOVE_TIMEOUT_S)
    return None if code == 0 else f"docker rm of {len(containers)} container(s) failed: {shown(said, 200)}"


def remove_job_containers(executor: Executor, jobs_root: Path, job_id: str) -> str:
    """A job's containers removed when it ends (however it ended), in words for its record."""
    found = [container for container, _ in job_containers(executor, jobs_root, job_id)]
    if problem := remove_containers(executor, found):
        return f"the job's container could not be removed: {problem}"
    return f"the job's container {found[0][:12]} was removed" if found else "the job left no container"


def sweep_leftovers(executors: list[Executor], jobs_root: Path, still_runs: Callable[[str], bool]) -> list[str]:
    """Containers of this jobs folder whose job no longer runs (its supervisor was killed before it could remove
    them), removed; what was removed, in words."""
    said = []
    for executor in executors:
        if executor.kind != "docker":
            continue
        leftover = [(container, owner) for container, owner in job_containers(executor, jobs_root)
                    if not still_runs(owner)]
        if leftover and not remove_containers(executor, [container for container, _ in leftover]):
            said.append(f"removed {len(leftover)} container(s) left by ended jobs on executor {executor.name}: "
                        + ", ".join(sorted({owner for _, owner in leftover})))
    return said


# ssh: the host's key must already be known (never accepted silently), the key private to this account.

def known_hosts_file() -> str:
    """The account's known_hosts, named on every ssh call (ssh alone would look in the passwd entry's home)."""
    return os.path.expanduser("~/.ssh/known_hosts")


def ssh_target(executor: Executor) -> list[str]:
    return [*SSH_STRICT, "-o", f"UserKnownHostsFile={known_hosts_file()}", "-i", os.path.expanduser(executor.key),
            "-p", str(executor.port), f"{executor.user}@{executor.host}"]


def known_hosts_name(executor: Executor) -> str:
    return executor.host if executor.port == 22 else f"[{executor.host}]:{executor.port}"


def ssh_refusal(executor: Executor) -> str | None:
    """Why an ssh job cannot start now: a key that is missing or readable by others, a host key not in
    known_hosts (the bridge never accepts one), a host that refuses or does not answer."""
    key = os.path.expanduser(executor.key)
    try:
        info = os.stat(key)
    except OSError:
        return f"executor {executor.name}: the key {shown(key, 200)} does not exist; write its path in executors"
    if not stat.S_ISREG(info.st_mode) or info.st_mode & 0o077:
        return (f"executor {executor.name}: the key {shown(key, 200)} is readable by others (mode "
                f"{stat.S_IMODE(info.st_mode):o}); `chmod 600 {shlex.quote(key)}`")
    known = known_hosts_file()
    code, _ = run_tool(["ssh-keygen", "-F", known_hosts_name(executor), "-f", known])
    if code != 0:
        return (f"executor {executor.name}: the host key of {known_hosts_name(executor)} is not in {known}, and the "
                "bridge never accepts one silently; check its fingerprint, then `ssh-keyscan -p "
                f"{executor.port} {executor.host} >> ~/.ssh/known_hosts`")
    code, said = run_tool(["ssh", *ssh_target(executor), "true"])
    if code != 0:
        return (f"executor {executor.name}: ssh {executor.user}@{executor.host} port {executor.port} failed "
                f"({shown(said, 200)}); check the host, the user and that the key is authorized there")
    return None


def ssh_run(executor: Executor, command: str, timeout_s: float = 60.0) -> tuple[int, str]:
    """One command on the host, as its user (the command is a shell line: every part of it quoted by the caller)."""
    return run_tool(["ssh", *ssh_target(executor), command], timeout_s=timeout_s)


def remote_places(executor: Executor, top: str, job_id: str) -> tuple[str, str]:
    """The host's bare repository for a local repository (made once per repository), and a job's worktree of it,
    relative to the remote user's home unless remote_root is absolute."""
    root = executor.remote_root.rstrip("/")
    name = hashlib.sha256(os.path.realpath(top).encode()).hexdigest()[:16]
    return f"{root}/repos/{name}.git", f"{root}/worktrees/{job_id}"


def remote_url(executor: Executor, absolute: str) -> str:
    return f"ssh://{executor.user}@{executor.host}:{executor.port}{absolute}"


def ssh_git_environment(executor: Executor) -> dict[str, str]:
    """git's ssh for the bridge's own push and fetch: the executor's key and the strict host check (it outranks
    core.sshCommand, which a repository's config could set)."""
    return {"GIT_SSH_COMMAND": " ".join(shlex.quote(part) for part in ["ssh", *ssh_target(executor)[:-1]]),
            "GIT_SSH_VARIANT": "ssh"}


REMOTE_GIT = "git -c core.hooksPath=/dev/null -c core.fsmonitor=false"


def carry_out(executor: Executor, top: str, start: str, job_id: str, branch: str) -> tuple[str, str]:
    """The job's start commit pushed to the host's bare repository (made once per repository) on the job's
    branch, and a remote worktree of it made for the job: the bare repository's and the worktree's absolute
    paths (the worktree is Hermes' folder there)."""
    bare, worktree = remote_places(executor, top, job_id)
    code, home = ssh_run(executor, 'printf "%s\\n" "$HOME"')
    if code != 0 or not home.startswith("/"):
        raise GitFailed(f"the host {executor.host} did not say its home ({shown(home, 200)})")
    absolute_bare = bare if bare.startswith("/") else f"{home}/{bare}"
    absolute_tree = worktree if worktree.startswith("/") else f"{home}/{worktree}"
    code, said = ssh_run(executor, f"test -d {shlex.quote(absolute_bare)} || git init -q --bare "
                                   f"{shlex.quote(absolute_bare)}")
    if code != 0:
        raise GitFailed(f"the bare repository on {executor.host} could not be made: {shown(said, 200)}")
    git(top, "push", "-q", "--no-verify", remote_url(executor, absolute_bare), f"+{start}:refs/heads/{branch}",
        env=ssh_git_environment(executor), protocol="ssh")
    code, said = ssh_run(executor, f"{REMOTE_GIT} -C {shlex.quote(absolute_bare)} worktree add -q -f "
                                   f"{shlex.quote(absolute_tree)} {shlex.quote(branch)}")
    if code != 0:
        raise GitFailed(f"the job's worktree on {executor.host} could not be made: {shown(said, 200)}")
    return absolute_bare, absolute_tree


PROGRESS_FETCH_S = 20.0  # how often an ssh job's branch is fetched back while it runs


def progress_ref(job_id: str) -> str:
    return f"refs/hermes-bridge-remote/{job_id}"


def fetch_progress(executor: Executor, worktree: dict[str, Any], local_git: list[str], objects: dict[str, str],
                   job_id: str) -> str:
    """The job's branch as the host has it now, fetched into the job's own objects (git hashes every object)
    under progress_ref: its commit. GitFailed when the host does not answer."""
    path = worktree["path"]
    git(path, *local_git, "fetch", "-q", "--no-tags", "--no-write-fetch-head",
        remote_url(executor, worktree["remote_bare"]), f"+refs/heads/{worktree['branch']}:{progress_ref(job_id)}",
        env={**objects, **ssh_git_environment(executor)}, protocol="ssh")
    return git(path, *local_git, "rev-parse", "--verify", f"{progress_ref(job_id)}^{{commit}}",
               env=objects).stdout.decode().strip()


def keep_fetching(executor: Executor, worktree: dict[str, Any], local_git: list[str], objects: dict[str, str],
                  job_id: str, stop: threading.Event) -> None:
    """While the job runs: its branch fetched back every PROGRESS_FETCH_S, so a host lost mid-job leaves what it
    had committed by then (a host that does not answer is tried again at the next turn)."""
    while not stop.wait(PROGRESS_FETCH_S):
        with contextlib.suppress(GitFailed):
            fetch_progress(executor, worktree, local_git, objects, job_id)


def fetched_so_far(worktree: dict[str, Any], local_git: list[str], objects: dict[str, str], job_id: str) -> str | None:
    """The commit last fetched back while the job ran, if any."""
    done = git(worktree["path"], *local_git, "rev-parse", "--verify", "--quiet", f"{progress_ref(job_id)}^{{commit}}",
               env=objects, check=False)
    return done.stdout.decode().strip() or None if done.returncode == 0 else None


def carry_back(executor: Executor, worktree: dict[str, Any], local_git: list[str], objects: dict[str, str],
               job_id: str) -> str:
    """What the job did on the host brought back into its local worktree: what it left uncommitted committed
    there, its branch fetched (fetch_progress) and the local worktree moved to it. Returns the commit; GitFailed
    when the host cannot be reached (keep_what_came then keeps what was fetched while the job ran)."""
    message = shlex.quote(f"claude-hermes-bridge: what job {job_id} left uncommitted on {executor.host}")
    code, said = ssh_run(executor, f"cd {shlex.quote(worktree['remote'])} && {REMOTE_GIT} add -A && ({REMOTE_GIT} "
                                   f"diff --cached --quiet || {REMOTE_GIT} -c user.name=claude-hermes-bridge -c "
                                   f"user.email=bridge@localhost commit -q --no-verify -m {message})")
    if code != 0:
        raise GitFailed(f"the host {executor.host} could not be reached to bring the work back: {shown(said, 200)}")
    fetched = fetch_progress(executor, worktree, local_git, objects, job_id)
    keep_what_came(worktree, local_git, objects, job_id, fetched)
    return fetched


def keep_what_came(worktree: dict[str, Any], local_git: list[str], objects: dict[str, str], job_id: str,
                   commit: str) -> None:
    """The local worktree moved to a commit that came back from the host; the progress ref dropped."""
    git(worktree["path"], *local_git, "reset", "-q", "--hard", commit, env=objects)
    git(worktree["path"], *local_git, "update-ref", "-d", progress_ref(job_id), env=objects)


def remove_remote_worktree(executor: Executor, worktree: dict[str, Any]) -> None:
    with contextlib.suppress(Exception):
        bare = worktree["remote_bare"]
        ssh_run(executor, f"{REMOTE_GIT} -C {shlex.quote(bare)} worktree remove -f {shlex.quote(worktree['remote'])}; "
                          f"{REMOTE_GIT} -C {shlex.quote(bare)} branch -q -D {shlex.quote(worktree['branch'])}")


DOCKER_VERIFIED_FROM = (0, 22)  # Hermes 0.19.0 ran a docker job's commands in the host path, outside the mount


def launch_refusal(executor: Executor, driver: str, hermes_version: str | None, worktree: dict[str, Any] | None,
                   folder: str) -> str | None:
    """Why this job cannot run on this executor, before any process: the CLI driver (a one-shot CLI with
    container_persistent off does not mount the folder: its edits vanish), a Hermes too old for docker, an
    in-place job on another host (the user's folder is not there), a folder docker cannot mount."""
    if driver != "acp":
        return (f"executor {executor.name} needs the ACP driver (`hermes acp`): through the CLI, Hermes' "
                f"{executor.kind} backend does not keep the job's folder; install Hermes' acp extra or set "
                'hermes_driver to "acp"')
    if executor.kind == "ssh" and not worktree:
        return (f"executor {executor.name} runs commands on {executor.host}, where your folder is not: give "
                'isolation="worktree" (the bridge carries the work there and back with git), or run it locally')
    if executor.kind == "docker":
        numbers = tuple(int(part) for part in (hermes_version or "").split(".")[:2] if part.isdigit())
        if len(numbers) == 2 and numbers < DOCKER_VERIFIED_FROM:
            return (f"executor {executor.name}: Hermes {hermes_version}'s docker backend runs commands in the host's "
                    "path inside the container, outside the mounted folder, so a job's writes would vanish; upgrade "
                    "Hermes to 0.22 or newer, or run the job locally")
        return path_refusal([folder, *([worktree["repo"]] if worktree else [])])
    return None


def readiness_refusal(executor: Executor) -> str | None:
    """The daemon, the image, the key and the host checked now (bounded by CHECK_TIMEOUT_S per step)."""
    return docker_refusal(executor) if executor.kind == "docker" else ssh_refusal(executor)


def ssh_wrappers(executor: Executor, policy: Path) -> str:
    """What Hermes' own ssh needs in the job's policy folder (which a job cannot write), and the folder of
    `ssh` and `scp` put first on Hermes' PATH: the key copied (a sandboxed Hermes cannot read your ~/.ssh), the
    host's known keys alone, and each client made strict, since Hermes passes StrictHostKeyChecking=accept-new
    and ssh takes the first value given for an option."""
    folder = policy / "ssh"
    folder.mkdir(mode=0o700, exist_ok=True)
    key = folder / "key"
    key.write_bytes(Path(os.path.expanduser(executor.key)).read_bytes())
    key.chmod(0o600)
    known = subprocess.run(["ssh-keygen", "-F", known_hosts_name(executor), "-f", known_hosts_file()],
                           capture_output=True, timeout=CHECK_TIMEOUT_S, check=False, stdin=subprocess.DEVNULL).stdout
    (folder / "known_hosts").write_bytes(known)
    strict = f"-o StrictHostKeyChecking=yes -o UserKnownHostsFile={shlex.quote(str(folder / 'known_hosts'))}"
    for client in ("ssh", "scp"):
        real = shutil.which(client) or f"/usr/bin/{client}"
        wrapper = folder / client
        wrapper.write_text(f'#!/bin/sh\nexec {shlex.quote(real)} {strict} "$@"\n', encoding="utf-8")
        wrapper.chmod(0o700)
    return str(folder)


def short_tmp(job_id: str, jobs_root: Path) -> Path:
    """A short name for the job's private temporary folder, for an ssh job's Hermes: it puts its ssh control
    socket there, and a socket's path must fit in 108 bytes. A symbolic link in the system's temporary folder,
    named from the job; made only if the name is free (never one somebody else made)."""
    import tempfile

    name = hashlib.sha256(f"{jobs_label(jobs_root)}/{job_id}".encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"chb-{name}"


def link_short_tmp(private_tmp: Path, job_id: str, jobs_root: Path) -> Path:
    link = short_tmp(job_id, jobs_root)
    os.symlink(private_tmp, link)
    return link


def unlink_short_tmp(private_tmp: Path, job_id: str, jobs_root: Path) -> None:
    link = short_tmp(job_id, jobs_root)
    with contextlib.suppress(OSError):
        if os.readlink(link) == str(private_tmp):
            link.unlink()
