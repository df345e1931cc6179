"""[both] The bridge's own git: every call runs no program a repository's configuration or attributes name."""
import os
import shutil
import subprocess
from typing import Any

from .safe_io import shown

GIT_TIMEOUT_S = 60.0  # one git command; a worktree's checkout and its submodules get GIT_CHECKOUT_TIMEOUT_S
GIT_CHECKOUT_TIMEOUT_S = 600.0

# A worktree job's shell can write the repository's config (it shares .git/config with the main tree), so
# every setting through which git would run a program is overridden at command-line scope, which outranks
# every file and every include.path (docs/security.md lists each vector, tests/test_repository_guard.py
# plants each); the user's global config too (with no sandbox, a job can write ~/.gitconfig). Hooks, fsmonitor,
# pager, editor, credential and ssh helpers, gpg signing and verifying, background gc, and the
# transports that run a command (ext::, git:// through core.gitProxy) are fixed settings:
FIXED_OVERRIDES = (
    ("core.hooksPath", os.devnull), ("core.fsmonitor", "false"), ("core.pager", "cat"), ("core.editor", "false"),
    ("sequence.editor", "false"), ("credential.helper", ""), ("core.askPass", ""),
    ("core.sshCommand", "ssh -o BatchMode=yes"), ("protocol.ext.allow", "never"), ("protocol.git.allow", "never"),
    ("commit.gpgSign", "false"), ("tag.gpgSign", "false"), ("gc.auto", "0"), ("maintenance.auto", "false"),
    ("submodule.recurse", "false"), ("merge.verifySignatures", "false"), ("log.showSignature", "false"),
    ("gpg.program", "false"), ("gpg.ssh.program", "false"), ("gpg.x509.program", "false"),
)
# Filters, merge drivers and diff drivers are named by attributes (which a job can write too) and defined
# per name, so each name the config defines is overridden: an empty filter command is no filter; a merge
# driver `false` makes the path a conflict the landing names (it never takes either side silently); a diff
# driver's textconv and command are never consulted (--no-textconv --no-ext-diff on every diff) and `false`
# if they were.
DRIVER_OVERRIDES = {"filter": (("clean", ""), ("smudge", ""), ("process", ""), ("required", "false")),
                    "merge": (("driver", "false"),), "diff": (("textconv", "false"), ("command", "false"))}
# No transport: a partial clone's promisor remote makes git fetch a missing object on demand through the remote's
# transport, and with the local one `remote.<name>.uploadpack` is a shell command (a job that wrote a common
# folder of its own made the bridge's rev-parse run it). protocol.allow=never refuses every transport, lazy
# fetches included, on any git; a repository's config may allow a transport by name, which outranks it, so each
# is named too. GIT_NO_LAZY_FETCH (git 2.45+) says the same where git has it. Only a call that must reach a
# remote (a submodule's clone, at a worktree's making) passes transport=True.
NO_TRANSPORT = (("protocol.allow", "never"), *((f"protocol.{name}.allow", "never")
                                               for name in ("file", "http", "https", "ssh", "git", "ext")))
LOCATING_OPTIONS = ("--git-dir=", "--work-tree=")  # leading options the config read must repeat


class GitFailed(Exception):
    """A git command that failed, in words: the command and the last line git printed."""


def git_executable() -> str:
    exe = shutil.which("git")
    if exe is None:
        raise GitFailed("git is not installed or not on PATH")
    return exe


def clean_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment without any of the caller's GIT_* variables, with no prompt, and messages in English."""
    environment = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}
    environment.update(GIT_TERMINAL_PROMPT="0", LC_ALL="C", LANGUAGE="C", **(extra or {}))
    return environment


def pinned_common(locating: list[str]) -> dict[str, str]:
    """For a call pinned to a linked worktree's admin folder (--git-dir=<common>/worktrees/<name>), that folder's
    common folder as GIT_COMMON_DIR, which outranks the admin folder's commondir file (a job's worktree could
    rewrite it to name a common folder of its own)."""
    for option in locating:
        admin = option.removeprefix("--git-dir=")
        if option.startswith("--git-dir=") and os.path.basename(os.path.dirname(admin)) == "worktrees":
            return {"GIT_COMMON_DIR": os.path.dirname(os.path.dirname(admin))}
    return {}


def driver_names(exe: str, folder: str, locating: list[str]) -> dict[str, set[str]]:
    """The filter, merge and diff driver names the repository's config defines (every scope, includes
    followed): reading config runs nothing."""
    done = subprocess.run([exe, "--no-pager", "-C", folder, *locating, "config", "--includes", "--name-only", "-z",
                           "--get-regexp", r"^(filter|merge|diff)\..*\."], stdin=subprocess.DEVNULL,
                          capture_output=True, env=clean_environment(pinned_common(locating)), timeout=GIT_TIMEOUT_S,
                          check=False)
    if done.returncode not in (0, 1):  # 1: none defined
        said = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise GitFailed(f"git could not read the repository's config: {shown(said[-1] if said else '', 300)}")
    names: dict[str, set[str]] = {kind: set() for kind in DRIVER_OVERRIDES}
    for name in done.stdout.decode("utf-8", "surrogateescape").split("\0"):
        section, _, rest = name.partition(".")
        subsection = rest.rpartition(".")[0]
        if section in names and subsection:
            names[section].add(subsection)
    return names


def override_environment(names: dict[str, set[str]], transport: bool = False,
                         protocol: str | None = None) -> dict[str, str]:
    """FIXED_OVERRIDES (and NO_TRANSPORT unless transport, with protocol alone allowed if given) and each defined
    driver's DRIVER_OVERRIDES as GIT_CONFIG_COUNT/KEY/VALUE (git 2.31+): a key travels apart from its value, so no
    driver name can be misread as a value; of two values for one key, git takes the later."""
    pairs = [*FIXED_OVERRIDES, *(() if transport else NO_TRANSPORT)]
    if protocol:
        pairs.append((f"protocol.{protocol}.allow", "always"))
    for kind, settings in DRIVER_OVERRIDES.items():
        pairs += [(f"{kind}.{name}.{key}", value) for name in sorted(names.get(kind, ())) for key, value in settings]
    environment = {"GIT_CONFIG_COUNT": str(len(pairs)), **({} if transport else {"GIT_NO_LAZY_FETCH": "1"})}
    for index, (key, value) in enumerate(pairs):
        environment[f"GIT_CONFIG_KEY_{index}"] = key
        environment[f"GIT_CONFIG_VALUE_{index}"] = value
    return environment


def git(folder: str, *args: str, env: dict[str, str] | None = None, timeout_s: float = GIT_TIMEOUT_S,
        stdout: Any = None, check: bool = True, given: Any = None, transport: bool = False,
        protocol: str | None = None) -> subprocess.CompletedProcess[bytes]:
    """git in folder with every program-running setting overridden (see FIXED_OVERRIDES), no transport unless
    asked for (NO_TRANSPORT; protocol: that one alone, for the bridge's own push and fetch to an ssh executor),
    none of the caller's git environment, and no prompt. Leading --git-dir=/--work-tree=
    options in args pin the repository (and a worktree's common folder: pinned_common). stdout: a file to stream
    into (a patch can be large); given: its input (bytes, or a file to stream from)."""
    exe = git_executable()
    locating = [arg for arg in args[:2] if arg.startswith(LOCATING_OPTIONS)]
    try:
        overrides = override_environment(driver_names(exe, folder, locating), transport, protocol)
        environment = clean_environment({**overrides, **pinned_common(locating), **(env or {})})
        streamed = given is not None and not isinstance(given, bytes)
        done = subprocess.run([exe, "--no-pager", "-C", folder, *args], input=None if streamed else given,
                              stdin=given if streamed else None if given is not None else subprocess.DEVNULL,
                              stdout=stdout or subprocess.PIPE, stderr=subprocess.PIPE, env=environment,
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise GitFailed(f"git {args[len(locating)]} took more than {timeout_s:g} s") from None
    except OSError as exc:
        raise GitFailed(f"git could not run: {exc.strerror or exc}") from None
    if check and done.returncode != 0:
        said = [line for line in done.stderr.decode("utf-8", "replace").splitlines() if line.strip()]
        last = said[-1] if said else f"exit {done.returncode}"
        command = " ".join(args[len(locating):len(locating) + 2])
        raise GitFailed(f"git {command} failed: {shown(last, 300)}")
    return done


def git_text(folder: str, *args: str, env: dict[str, str] | None = None) -> str:
    return git(folder, *args, env=env).stdout.decode("utf-8", "replace").strip()
