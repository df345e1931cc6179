"""[server] A worktree job's saved patch as pages the job view renders file by file: each file's kind (added,
modified, deleted, renamed, binary with its size), its hunks with both sides' line numbers, every text made
visible (controls, bidi and zero-width characters as escapes). Read by offset with fixed bounds, so a page
costs the same whatever the patch holds."""
import re
from typing import Any

from .config import Config
from .folder_changes import human_size
from .jobs import JobStore
from .render import ToolResult
from .safe_io import Refused, escape_hiding, open_regular, plural, shown
from .tools import observed_job

PAGE_BYTES = 256 * 1024  # of the patch read for one page
PAGE_LINES = 1500  # diff lines shown on one page (its first file is shown whatever its size)
HUNK_LINES = 400  # lines of one hunk shown; the rest is counted
LINE_CHARS = 1000  # characters of one line shown
SCAN_BYTES = 64 * 1024 * 1024  # read past a file too large for a page to find the next one, at most
FILE_START = b"diff --git "
HUNK_RE = re.compile(r"@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@(.*)")
LITERAL_RE = re.compile(rb"(literal|delta) (\d+)")
C_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


def visible(data: bytes, limit: int = LINE_CHARS) -> str:
    """A line of the patch as a person should see it: decoded, every invisible character as its escape, cut."""
    text = escape_hiding(data.decode("utf-8", "replace"), "\t")  # tabs stay; every other hiding character escaped
    return text if len(text) <= limit else f"{text[:limit]} [... {len(text) - limit:,} more characters]"


def git_path(token: str) -> str:
    """A path as git prints it in a patch header: C-quoted when it holds unusual bytes ("a/caf\\303\\251")."""
    if not (token.startswith('"') and token.endswith('"') and len(token) >= 2):
        return token
    raw, index, inner = bytearray(), 0, token[1:-1]
    while index < len(inner):
        char = inner[index]
        if char == "\\" and index + 1 < len(inner):
            following = inner[index + 1]
            if following in "01234567" and re.fullmatch(r"[0-7]{3}", inner[index + 1:index + 4]):
                raw.append(int(inner[index + 1:index + 4], 8))
                index += 4
                continue
            raw.append(C_ESCAPES.get(following, ord(following)))
            index += 2
            continue
        raw += char.encode("utf-8", "surrogateescape")
        index += 1
    return raw.decode("utf-8", "replace")


def header_paths(line: str) -> tuple[str, str]:
    """The two paths of `diff --git a/X b/Y` (used only where no ---/+++ or rename line names them)."""
    rest = line[len("diff --git "):]
    if rest.startswith('"'):
        end = rest.index('"', 1) if '"' in rest[1:] else len(rest)
        while end < len(rest) and rest[end - 1] == "\\":
            end = rest.index('"', end + 1) if '"' in rest[end + 1:] else len(rest)
        return git_path(rest[:end + 1])[2:], git_path(rest[end + 2:])[2:]
    half = (len(rest) - 1) // 2
    if rest[half] == " " and rest[2:half] == rest[half + 3:]:
        return rest[2:half], rest[half + 3:]
    old, _, new = rest.partition(" b/")
    return old[2:], new


def parse_file(section: bytes, cut: bool) -> dict[str, Any]:
    """One file's part of the patch; cut: the part ends before the file's diff does (too large for a page)."""
    lines = section.split(b"\n")
    entry, first_hunk = parse_header(lines)
    entry["cut"] = cut
    entry["hunks"], entry["added"], entry["removed"], entry["hidden_lines"], entry["shown_lines"] = [], 0, 0, 0, 0
    if not entry["binary"]:  # a binary file's rest is base85, nothing to show
        parse_hunks(lines[first_hunk:], entry)
    return entry


def parse_header(lines: list[bytes]) -> tuple[dict[str, Any], int]:
    """A file's kind, paths, mode and binary size from the lines before its first hunk; and where that is."""
    old_path, new_path = header_paths(lines[0].decode("utf-8", "replace"))
    entry: dict[str, Any] = {"kind": "modified", "binary": False, "size": None, "mode": None}
    index, binary_sizes = 1, []
    while index < len(lines) and not lines[index].startswith(b"@@"):
        line = lines[index]
        text = line.decode("utf-8", "replace")
        index += 1
        if line.startswith(b"new file mode"):
            entry["kind"] = "added"
        elif line.startswith(b"deleted file mode"):
            entry["kind"] = "deleted"
        elif line.startswith(b"rename from "):
            entry["kind"], old_path = "renamed", git_path(text[len("rename from "):])
        elif line.startswith(b"rename to "):
            new_path = git_path(text[len("rename to "):])
        elif line.startswith(b"new mode "):
            entry["mode"] = text[len("new mode "):]
        elif line.startswith((b"--- ", b"+++ ")) and (name := text[4:].removesuffix("\t")) != "/dev/null":
            # git ends the name with a TAB when it holds a space; a name's own TAB is quoted ("\t")
            old_path, new_path = (git_path(name)[2:], new_path) if text[0] == "-" else (old_path, git_path(name)[2:])
        elif line.startswith((b"GIT binary patch", b"Binary files ")):
            entry["binary"] = True
        elif entry["binary"] and (sized := LITERAL_RE.fullmatch(line)):
            binary_sizes.append((sized.group(1), int(sized.group(2))))
    if entry["binary"]:
        entry["size"] = binary_size(entry["kind"], binary_sizes)
    entry["path"] = visible((old_path if entry["kind"] == "deleted" else new_path).encode("utf-8", "replace"))
    entry["old_path"] = visible(old_path.encode("utf-8", "replace")) if entry["kind"] == "renamed" else None
    return entry, index


def parse_hunks(lines: list[bytes], entry: dict[str, Any]) -> None:
    """The hunks into entry: each line as [sign, base line number, job's line number, text], HUNK_LINES of a
    hunk at most (the rest counted in its "hidden")."""
    hunk: dict[str, Any] | None = None
    old_no = new_no = 0
    for line in lines:
        if line.startswith(b"@@"):
            found = HUNK_RE.match(line.decode("utf-8", "replace"))
            old_no, new_no = (int(found.group(1)), int(found.group(2))) if found else (0, 0)
            hunk = {"header": visible(line, 300), "lines": [], "hidden": 0}
            entry["hunks"].append(hunk)
            continue
        sign = line[:1]
        if hunk is None or sign not in (b"+", b"-", b" ", b"\\"):
            continue
        row: list[Any] = [sign.decode(), old_no if sign in b" -" else None, new_no if sign in b" +" else None,
                          visible(line[2:] if sign == b"\\" else line[1:])]
        entry["added"] += sign == b"+"
        entry["removed"] += sign == b"-"
        old_no += sign in (b" ", b"-")
        new_no += sign in (b" ", b"+")
        if len(hunk["lines"]) < HUNK_LINES:
            hunk["lines"].append(row)
            entry["shown_lines"] += 1
        else:
            hunk["hidden"] += 1
            entry["hidden_lines"] += 1


def binary_size(kind: str, sizes: list[tuple[bytes, int]]) -> str:
    """The size git's binary patch states: its forward part's literal is the new file whole (a deleted file's
    reverse part is the old one); a delta's number is the delta's, not the file's."""
    if kind == "deleted" and len(sizes) > 1 and sizes[1][0] == b"literal":
        return human_size(sizes[1][1])
    if sizes and sizes[0][0] == b"literal":
        return human_size(sizes[0][1])
    return "size not stated in the patch (a delta against the old version)"


def patch_page(path: str, offset: int) -> dict[str, Any]:
    """The files of the patch from offset (the start of a file's diff) until a page is full, and where the
    next page starts (None: the patch ends here)."""
    with open_regular(path) as handle:
        size = handle.seek(0, 2)
        if size == 0 and offset == 0:
            return {"files": [], "next_offset": None, "patch_bytes": 0, "offset": 0, "note": None}
        if not 0 <= offset < size:
            raise Refused(f"offset {offset} is outside the patch ({size} bytes); start at 0")
        handle.seek(offset)
        data = handle.read(PAGE_BYTES)
        if not data.startswith(FILE_START):
            raise Refused(f"offset {offset} is not where a file's diff starts in the patch; start at 0")
        starts = [0] + [found.start() + 1 for found in re.finditer(re.escape(b"\n" + FILE_START), data)]
        whole = offset + len(data) >= size
        files: list[dict[str, Any]] = []
        shown_lines, next_offset, note = 0, None, None
        for number, start in enumerate(starts):
            end = starts[number + 1] if number + 1 < len(starts) else len(data)
            complete = number + 1 < len(starts) or whole
            if files and (not complete or shown_lines >= PAGE_LINES):
                next_offset = offset + start
                break
            entry = parse_file(data[start:end], cut=not complete)
            files.append(entry)
            shown_lines += entry["shown_lines"]
            if not complete:
                next_offset, note = next_file_start(handle, offset + len(data), size), (
                    f"{entry['path']}'s diff is larger than a page of the view ({human_size(PAGE_BYTES)}): its "
                    "start is shown")
    return {"files": files, "next_offset": next_offset, "patch_bytes": size, "offset": offset, "note": note}


def next_file_start(handle: Any, position: int, size: int) -> int | None:
    """Where the next file's diff starts after position, looking at most SCAN_BYTES ahead."""
    handle.seek(position - len(FILE_START))
    carried = b""
    base = position - len(FILE_START)
    while base < min(size, position + SCAN_BYTES):
        chunk = handle.read(1 << 20)
        if not chunk:
            return None
        found = (carried + chunk).find(b"\n" + FILE_START)
        if found >= 0:
            return int(base - len(carried) + found + 1)
        carried = chunk[-len(FILE_START):]
        base += len(chunk)
    return None


def view_patch(cfg: Config, job_id: Any, offset: Any) -> ToolResult:
    """The job view's page of a worktree job's patch (app-only: the model reads the patch with hermes_read)."""
    record = observed_job(cfg, job_id).record
    if offset is None:
        offset = 0
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise Refused(f"offset must be a whole number, got {shown(offset, 40)}")
    store, job_id = JobStore.of(cfg), record.id
    if not record.diff:
        raise Refused(f"job {job_id} has no saved patch (not a worktree job, or it has not ended)")
    try:
        page = patch_page(str(store.patch_path(job_id)), offset)
    except FileNotFoundError:
        raise Refused(f"job {job_id}'s patch file is gone (removed with the job's retention?)") from None
    files = page["files"]
    more = f"; the next page starts at offset {page['next_offset']}" if page["next_offset"] is not None else ""
    text = (f"PATCH_PAGE: {plural(len(files), 'file')} of job {job_id}'s patch from offset {offset} "
            f"({human_size(page['patch_bytes'])} in all){more}")
    return ToolResult(text, "ok", job_id, patch=page)
