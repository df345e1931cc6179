"""[both] What a job changed in its folder: the files listed as it starts and as it ends (or while it runs),
compared. A worktree job's changes are git's to tell (worktrees.py)."""
import dataclasses
import math
import os
import stat
import threading
import time
from typing import Any

from .jobs import CHANGED_LINES

# Files that other programs run or load later, outside any sandbox: named in the block (RUNS_LATER) whenever a job
# changed them, never put back (a job asked to set up CI, a debugger or a hook must be able to; the planner and
# the person are told before they open the folder or run anything). The rule: a file by its name at any depth, a
# folder by its name at any depth (everything in it), a path by its start; and the folder the repository's
# core.hooksPath names (hooks_path_folder). Each entry says which program loads it.
RUNS_LATER_FILES = {
    "CLAUDE.md": "Claude Code, as instructions", "AGENTS.md": "Codex and other agents, as instructions",
    "GEMINI.md": "Gemini CLI, as instructions", ".cursorrules": "Cursor, as rules",
    ".windsurfrules": "Windsurf, as rules", ".clinerules": "Cline, as rules", ".aider.conf.yml": "aider, its settings",
    ".mcp.json": "MCP hosts, the servers they start", ".envrc": "direnv, run on entering the folder",
    ".bashrc": "bash, at every shell", ".zshrc": "zsh, at every shell", ".profile": "login shells",
    ".gitmodules": "git, the submodules' URLs it clones", ".pre-commit-config.yaml": "pre-commit, the hooks it runs",
    ".npmrc": "npm, its settings (scripts, registries)", ".yarnrc.yml": "yarn, its settings and plugins",
    "package.json": "npm and yarn, its scripts (install hooks too)", "Makefile": "make", "makefile": "make",
    "GNUmakefile": "make", "Justfile": "just", "justfile": "just", "Taskfile.yml": "task",
    "conftest.py": "pytest, imported at every run", "setup.py": "pip and setuptools, run at every install",
    "pyproject.toml": "pip, uv and build backends, its build hooks", "tox.ini": "tox", "noxfile.py": "nox",
    "sitecustomize.py": "Python, imported at every start", "build.rs": "cargo, run at every build",
    "Cargo.toml": "cargo, its build scripts", "build.gradle": "gradle", "build.gradle.kts": "gradle",
    "pom.xml": "maven, its plugins", "Dockerfile": "docker build", "docker-compose.yml": "docker compose",
    "compose.yaml": "docker compose", "Jenkinsfile": "Jenkins", ".gitlab-ci.yml": "GitLab CI",
}
RUNS_LATER_FOLDERS = {
    ".vscode": "VS Code, its tasks, launch configurations and settings", ".idea": "JetBrains IDEs, run configurations",
    ".claude": "Claude Code, its settings, hooks, commands and agents", ".cursor": "Cursor, its rules and MCP servers",
    ".codex": "Codex, its settings", ".gemini": "Gemini CLI, its settings", ".continue": "Continue, its settings",
    ".zed": "Zed, its tasks and settings", ".devcontainer": "dev containers, what they build and run",
    ".husky": "husky, the git hooks it installs", ".githooks": "git, where core.hooksPath commonly points",
    ".circleci": "CircleCI", ".buildkite": "Buildkite",
}
RUNS_LATER_PREFIXES = {".github/workflows/": "GitHub Actions",
                       ".github/copilot-instructions.md": "GitHub Copilot, as instructions"}


def who_runs(path: str) -> str:
    """Which program runs or loads a path runs_later found (a git hook when none of the table's entries names it)."""
    parts = path.split("/")
    if parts[-1] in RUNS_LATER_FILES:
        return RUNS_LATER_FILES[parts[-1]]
    for part in parts[:-1]:
        if part in RUNS_LATER_FOLDERS:
            return RUNS_LATER_FOLDERS[part]
    return next((who for prefix, who in RUNS_LATER_PREFIXES.items() if f"/{prefix}" in f"/{path}"),
                "git, as a hook (core.hooksPath)")


def runs_later(paths: list[str], hooks_folder: str | None = None) -> list[str]:
    """The paths (relative, / or the system's separator) that another program runs or loads later; hooks_folder:
    the folder core.hooksPath names, relative to the same place, whose every file git runs as a hook."""
    found = []
    for path in paths:
        posix = path.replace(os.sep, "/")
        parts = posix.split("/")
        if (parts[-1] in RUNS_LATER_FILES or any(part in RUNS_LATER_FOLDERS for part in parts[:-1])
                or any(f"/{prefix}" in f"/{posix}" for prefix in RUNS_LATER_PREFIXES)
                or (hooks_folder and posix.startswith(hooks_folder.rstrip("/") + "/"))):
            found.append(posix)
    return found


@dataclasses.dataclass
class FolderSnapshot:
    """The files under a job's folder (relative path -> size, mtime), or why they were not listed; identity
    is the folder's own device and inode, taken without following a symlink."""

    files: dict[str, tuple[int, int]]
    taken_ns: int
    note: str | None = None
    identity: tuple[int, int] | None = None


def lstat_folder(folder: str) -> tuple[int, int] | None:
    """The folder's device and inode, or None when it is no folder (a symlink is not followed)."""
    try:
        info = os.lstat(folder)
    except OSError:
        return None
    return (info.st_dev, info.st_ino) if stat.S_ISDIR(info.st_mode) else None


def snapshot_folder(folder: str, skip: list[str], max_entries: int, max_s: float) -> FolderSnapshot:
    """Every file under folder, walked iteratively without following symlinks (a link is listed, never
    entered), skipping folders named in skip; bounded by entries and seconds, past which it says so. The
    folder must be the same folder before and after the walk: a job that swapped it for a symlink would
    otherwise have files from elsewhere listed as its changes."""
    taken_ns = time.time_ns()
    identity = lstat_folder(folder)
    if identity is None:
        return FolderSnapshot({}, taken_ns, "not tracked (CWD is no longer a folder; replaced by a symlink?)")
    deadline = time.monotonic() + max_s
    files: dict[str, tuple[int, int]] = {}
    pending = [folder]
    entries = 0
    while pending:
        current = pending.pop()
        try:
            with os.scandir(current) as listing:
                for entry in listing:
                    entries += 1
                    if entries > max_entries:
                        return FolderSnapshot({}, taken_ns, f"not tracked (more than {max_entries} files under CWD)")
                    if entry.is_dir(follow_symlinks=False):
                        if entry.name not in skip:
                            pending.append(entry.path)
                        continue
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    files[os.path.relpath(entry.path, folder)] = (info.st_size, info.st_mtime_ns)
        except OSError:
            continue
        if time.monotonic() > deadline:
            return FolderSnapshot({}, taken_ns, f"not tracked (listing CWD took more than {max_s:g} s)")
    if lstat_folder(folder) != identity:
        return FolderSnapshot({}, taken_ns, "not tracked (CWD was replaced while it was being listed)")
    return FolderSnapshot(files, taken_ns, identity=identity)


def human_size(size: int) -> str:
    """1023 B, 1.2 KB, 3.4 MB."""
    if size < 1024:
        return f"{size} B"
    scaled = size / 1024
    for unit in ("KB", "MB"):
        if scaled < 1024:
            return f"{scaled:.1f} {unit}"
        scaled /= 1024
    return f"{scaled:.1f} GB"


def compare_snapshots(before: FolderSnapshot, after: FolderSnapshot, hooks_folder: str | None = None) -> dict[str, Any]:
    """What changed between two snapshots, ready for the record: counts and at most CHANGED_LINES lines (and
    what runs later: runs_later). A file changed while the first snapshot was being taken counts as created by the
    job."""
    if before.note or after.note:
        return {"note": before.note or after.note}
    if before.identity != after.identity:
        return {"note": "not tracked (CWD was replaced by another folder or a symlink during the job)"}
    old = {path: meta for path, meta in before.files.items() if meta[1] < before.taken_ns}
    created = sorted(path for path in after.files if path not in old)
    modified = sorted(path for path in after.files if path in old and after.files[path] != old[path])
    deleted = sorted(path for path in old if path not in after.files)
    lines = ([f"+ {path} ({human_size(after.files[path][0])})" for path in created]
             + [f"~ {path} ({human_size(after.files[path][0])})" for path in modified]
             + [f"- {path}" for path in deleted])
    return {"created": len(created), "modified": len(modified), "deleted": len(deleted),
            "lines": lines[:CHANGED_LINES], "more": max(0, len(lines) - CHANGED_LINES),
            "runs_later": runs_later(created + modified + deleted, hooks_folder)[:CHANGED_LINES]}


QUICK_LISTING_S = 0.5  # a folder listed faster than this as the job starts is listed again while it runs
LOOK_AGAIN_S = 5.0


class FolderWatch:
    """A job's folder listed as the job starts (in the background, so the launch is not delayed), again every
    LOOK_AGAIN_S while it runs where that first listing was quick (what the job view shows as changed so far),
    and at its end (CHANGED_FILES)."""

    def __init__(self, folder: str, skip: list[str], max_entries: int, max_s: float,
                 hooks_folder: str | None = None) -> None:
        self.folder, self.skip, self.max_entries, self.max_s = folder, skip, max_entries, max_s
        self.hooks_folder = hooks_folder  # core.hooksPath's folder, relative to folder
        self.before: FolderSnapshot | None = None
        self.first_listing_s = math.inf
        self.so_far: dict[str, Any] | None = None
        self.next_look = 0.0
        self.looking: threading.Thread | None = None
        self.first = threading.Thread(target=self.list_first, name="folder listing", daemon=True)
        self.first.start()

    def listing(self) -> FolderSnapshot:
        return snapshot_folder(self.folder, self.skip, self.max_entries, self.max_s)

    def list_first(self) -> None:
        started = time.monotonic()
        self.before = self.listing()
        self.first_listing_s = time.monotonic() - started

    def changes_so_far(self) -> dict[str, Any] | None:
        """The latest comparison made while the job runs (None before the first); starts the next when due."""
        now = time.monotonic()
        before = self.before
        if (before is not None and before.note is None and self.first_listing_s <= QUICK_LISTING_S
                and now >= self.next_look and (self.looking is None or not self.looking.is_alive())):
            self.next_look = now + LOOK_AGAIN_S
            self.looking = threading.Thread(target=self.look, args=(before,), name="folder changes", daemon=True)
            self.looking.start()
        return self.so_far

    def look(self, before: FolderSnapshot) -> None:
        self.so_far = compare_snapshots(before, self.listing(), self.hooks_folder)

    def changes(self) -> dict[str, Any]:
        """What the job changed, once it has ended."""
        self.first.join(self.max_s + 5)
        if self.before is None:
            return {"note": "not tracked (the start listing did not finish)"}
        return compare_snapshots(self.before, self.listing(), self.hooks_folder)
