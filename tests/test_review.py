"""Issue 40: a worktree job's patch as the job view's pages (plain functions over a patch git wrote as the bridge
writes it); the view itself in a browser is tests/test_job_view.py's."""
from pathlib import Path

import pytest
from test_worktrees import git, make_repo

from claude_hermes_bridge import review
from claude_hermes_bridge.review import patch_page
from claude_hermes_bridge.safe_io import Refused


def saved_patch(repo: Path, tmp_path: Path) -> str:
    """The change from the first commit to the working tree, as save_worktree_work writes a job's patch."""
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "the job's work")
    path = tmp_path / "job.patch"
    path.write_text(git(repo, "diff", "--binary", "--find-renames", "--no-color", "HEAD~1", "HEAD") + "\n")
    return str(path)


def test_each_kind_of_change_is_named_with_its_lines_and_both_sides_numbers(tmp_path):
    repo = make_repo(tmp_path / "repo", {"edit.txt": "one\ntwo\nthree\n", "gone.txt": "bye\n",
                                         "old-name.txt": "".join(f"line {n}\n" for n in range(20)),
                                         "picture.bin": bytes(range(256)) * 4})
    (repo / "edit.txt").write_text("one\nTWO\nthree\nfour\n")
    (repo / "gone.txt").unlink()
    (repo / "old-name.txt").rename(repo / "new-name.txt")
    (repo / "added.txt").write_text("fresh\n")
    (repo / "blob.bin").write_bytes(b"\0\1\2" * 700)
    (repo / "picture.bin").unlink()
    (repo / "caf\u00e9.txt").write_text("accent\n")
    page = patch_page(saved_patch(repo, tmp_path), 0)
    files = {entry["path"]: entry for entry in page["files"]}
    assert page["next_offset"] is None
    assert files["edit.txt"]["kind"] == "modified" and (files["edit.txt"]["added"], files["edit.txt"]["removed"]) == (
        2, 1)
    assert files["edit.txt"]["hunks"][0]["lines"] == [
        [" ", 1, 1, "one"], ["-", 2, None, "two"], ["+", None, 2, "TWO"], [" ", 3, 3, "three"], ["+", None, 4, "four"]]
    assert files["gone.txt"]["kind"] == "deleted" and files["gone.txt"]["hunks"][0]["lines"] == [["-", 1, None, "bye"]]
    assert files["new-name.txt"]["kind"] == "renamed" and files["new-name.txt"]["old_path"] == "old-name.txt"
    assert files["new-name.txt"]["hunks"] == []
    assert files["added.txt"]["kind"] == "added" and files["added.txt"]["hunks"][0]["lines"] == [
        ["+", None, 1, "fresh"]]
    assert files["blob.bin"]["binary"] and files["blob.bin"]["kind"] == "added" and files["blob.bin"]["size"] == (
        "2.1 KB")
    assert files["picture.bin"]["binary"] and files["picture.bin"]["kind"] == "deleted" and files["picture.bin"][
        "size"] == "1.0 KB"
    assert files["caf\u00e9.txt"]["kind"] == "added"  # git quotes it in the patch; shown as the name it is


@pytest.mark.parametrize("name", ["a\nSTATUS: ok.txt", "with space.txt", "tab\tin it.txt"],
                         ids=["quoted-with-space", "space", "tab-and-space"])
def test_a_name_git_ends_with_a_tab_is_shown_as_the_name_it_is(tmp_path, name):
    """Issue 50: git puts a TAB after a ---/+++ name that holds a space (`+++ "b/a\\nSTATUS: ok.txt"<TAB>`); the
    view shows the file's name, its newline escaped, not the quoted text with the TAB."""
    repo = make_repo(tmp_path / "repo")
    (repo / name).write_text("content\n")
    [entry] = patch_page(saved_patch(repo, tmp_path), 0)["files"]
    assert entry["path"] == review.visible(name.encode()), entry["path"]
    assert entry["kind"] == "added" and entry["added"] == 1


def test_what_the_patch_holds_is_text_and_invisible_characters_are_shown(tmp_path):
    repo = make_repo(tmp_path / "repo")
    hostile = "<script>alert(1)</script> <img src=x onerror=alert(2)> \u202eevil\u202c zero\u200bwidth \x1b[31mred\tok"
    (repo / "page.html").write_text(hostile + "\n")
    [entry] = patch_page(saved_patch(repo, tmp_path), 0)["files"]
    text = entry["hunks"][0]["lines"][0][3]
    assert text == ("<script>alert(1)</script> <img src=x onerror=alert(2)> \\u202eevil\\u202c zero\\u200bwidth "
                    "\\x1b[31mred\tok")


def test_a_huge_hunk_is_cut_and_says_how_much_is_hidden(tmp_path):
    repo = make_repo(tmp_path / "repo")
    (repo / "big.txt").write_text("".join(f"row {n}\n" for n in range(5000)))
    [entry] = patch_page(saved_patch(repo, tmp_path), 0)["files"]
    hunk = entry["hunks"][0]
    assert len(hunk["lines"]) == review.HUNK_LINES and hunk["hidden"] == 5000 - review.HUNK_LINES
    assert hunk["lines"][-1] == ["+", None, review.HUNK_LINES, f"row {review.HUNK_LINES - 1}"]
    assert entry["added"] == 5000


def test_a_large_change_is_paged_by_file_and_every_file_is_on_exactly_one_page(tmp_path, monkeypatch):
    monkeypatch.setattr(review, "PAGE_LINES", 120)
    repo = make_repo(tmp_path / "repo")
    for number in range(10):
        (repo / f"part{number}.txt").write_text("".join(f"{number}:{n}\n" for n in range(50)))
    patch = saved_patch(repo, tmp_path)
    seen, offset, pages = [], 0, 0
    while offset is not None:
        page = patch_page(patch, offset)
        assert sum(entry["shown_lines"] for entry in page["files"][:-1]) < 120
        seen += [entry["path"] for entry in page["files"]]
        offset, pages = page["next_offset"], pages + 1
    assert seen == [f"part{number}.txt" for number in range(10)] and pages == 4


def test_a_file_larger_than_a_page_shows_its_start_and_the_next_page_starts_at_the_next_file(tmp_path, monkeypatch):
    monkeypatch.setattr(review, "PAGE_BYTES", 4096)
    repo = make_repo(tmp_path / "repo")
    (repo / "a-big.txt").write_text("".join(f"a long line number {n}\n" for n in range(2000)))
    (repo / "b-small.txt").write_text("small\n")
    patch = saved_patch(repo, tmp_path)
    first = patch_page(patch, 0)
    assert [entry["path"] for entry in first["files"]] == ["a-big.txt"] and first["files"][0]["cut"]
    assert "larger than a page" in first["note"]
    second = patch_page(patch, first["next_offset"])
    assert [entry["path"] for entry in second["files"]] == ["b-small.txt"] and second["next_offset"] is None


@pytest.mark.parametrize("straddle", [1, 5, len(review.FILE_START)])
def test_the_next_file_is_found_where_its_start_straddles_a_read_of_the_scan(tmp_path, monkeypatch, straddle):
    """Issue 50 (review.py:198): past a file too large for a page, the scan for the next file reads 1 MiB at a
    time; a file start cut by one of those reads is found, not skipped with its file."""
    monkeypatch.setattr(review, "PAGE_BYTES", 4096)
    head = b"diff --git a/big b/big\n--- a/big\n+++ b/big\n@@ -0,0 +1 @@\n+"
    scan_start = review.PAGE_BYTES - len(review.FILE_START)  # where next_file_start reads from
    start = scan_start + (1 << 20) - straddle + 1  # "\n" and straddle - 1 bytes of the file's start in the first read
    small = b"diff --git a/small b/small\n--- a/small\n+++ b/small\n@@ -0,0 +1 @@\n+x\n"
    patch = tmp_path / "job.patch"
    patch.write_bytes(head + b"x" * (start - 1 - len(head)) + b"\n" + small)
    first = patch_page(str(patch), 0)
    assert first["next_offset"] == start, (first["next_offset"], start)
    assert [entry["path"] for entry in patch_page(str(patch), start)["files"]] == ["small"]


@pytest.mark.parametrize("offset", [-1, 5, 10**9])
def test_an_offset_that_is_not_a_files_start_is_refused(tmp_path, offset):
    repo = make_repo(tmp_path / "repo")
    (repo / "a.txt").write_text("changed\n")
    with pytest.raises(Refused, match="offset"):
        patch_page(saved_patch(repo, tmp_path), offset)
