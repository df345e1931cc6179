"""Reading files and folders (hermes_read): pages of a file, a listing, and everything that must be refused or
bounded."""
import os
import time

import pytest

from claude_hermes_bridge.bodies import Listing
from claude_hermes_bridge.tools import read_path
from harness import (
    BOUND_STRETCH,
    in_playground,
    refused,
)


def test_read_pages_files_lists_folders_and_refuses_outside(bridge):
    (bridge.root / "notes.txt").write_text("0123456789" * 10)
    (bridge.root / "sub").mkdir()
    (bridge.root / "blob.bin").write_bytes(b"\x00\x01binary")
    specials = ["pipe", "out"] if os.name != "nt" else []  # a FIFO, and a symlink (privileged on Windows)
    if specials:
        os.mkfifo(bridge.root / "pipe")
        (bridge.root / "out").symlink_to("/etc")
    with bridge.client() as client:
        page = client.call("hermes_read", path=str(bridge.root / "notes.txt"), max_bytes=30, offset=10)
        assert page.field("RANGE") == "bytes 10-40 of 100"
        assert page.text.endswith("\n" + ("0123456789" * 3))
        assert "offset=40" in page.field("CUT")
        tail = client.call("hermes_read", path=str(bridge.root / "notes.txt"), offset=-15)
        assert tail.field("RANGE") == "bytes 85-100 of 100"
        whole = client.call("hermes_read", path=str(bridge.root / "notes.txt"))
        assert whole.field("CUT") == "no"
        listing = client.call("hermes_read", path=str(bridge.root))
        assert listing.field("ENTRIES") == str(3 + len(specials))
        assert [line.split()[-1] for line in listing.text.splitlines()[2:]] == sorted(
            ["notes.txt", "sub", "blob.bin", *specials])
        assert client.call("hermes_read", path=str(bridge.root / "blob.bin")).field("BINARY").startswith("yes")
        # the refusals (a FIFO, outside the roots, a symlink out, relative, devices) are the cases below
        job = client.call("hermes_run", task="log me", wait_s=20)
        log = client.call("hermes_read", path=job.field("FULL_LOG"))
        assert "FAKE DONE: log me" in log.text


@pytest.mark.posix("FIFOs and sockets")
@pytest.mark.parametrize(("path", "word"), [
    ("relative.txt", "relative"), ("<root>/../<root-name>b/secret.txt", "outside"), ("<root>/out/passwd", "outside"),
    ("<root>/loop", "cannot be resolved"), ("/etc/passwd", "outside"), ("<root>/\x00", "NUL"),
    ("<root>/fifo", "not a regular file"), ("<root>/sock", "not a regular file"),
], ids=["relative", "sibling-via-dot-dot", "symlink-out", "symlink-loop", "outside", "NUL", "fifo", "socket"])
def test_read_tricks_are_refused(playground, monkeypatch, path, word):
    bridge, _ = playground
    path = in_playground(bridge.root, path)
    refused(bridge.call_body(monkeypatch, "hermes_read",
                             Listing(read_path, (path, None, None))), word)


@pytest.mark.posix("FIFOs and sockets")
def test_sparse_files_crowded_folders_and_devices_are_bounded_or_refused(bridge):
    root = bridge.root
    with open(root / "sparse.bin", "wb") as handle:
        handle.truncate(10 * 2**30)
    crowd = root / "crowd"
    crowd.mkdir()
    for n in range(100_000):
        open(crowd / f"f{n:06d}", "w").close()
    with bridge.client() as client:
        sparse = client.call("hermes_read", path=str(root / "sparse.bin"), max_bytes=10**15)
        assert sparse.field("RANGE") == f"bytes 0-262144 of {10 * 2**30}"
        assert "clamped" in sparse.text and sparse.field("BINARY").startswith("yes")
        started = time.monotonic()
        listing = client.call("hermes_read", path=str(crowd))
        assert time.monotonic() - started < 10 * BOUND_STRETCH
        assert listing.field("ENTRIES") == "100000" and "99800 more entries not shown" in listing.text
        assert len(listing.text) < 20_000
        bridge.configure(read_anywhere=True)
        for device in ("/dev/zero", "/dev/null", "/dev/urandom"):
            refused(client.call("hermes_read", path=device), "not a regular file")
        assert "root:" in client.call("hermes_read", path="/etc/passwd").text


@pytest.mark.posix("the playground's traps are FIFOs, sockets and symlinks")
def test_characters_that_reorder_or_hide_text_are_shown_as_escapes_and_counted(playground):
    """Issue 27: a file that reads one way and runs another (a bidi override in code) shows where."""
    bridge, client = playground
    (bridge.root / "trojan.py").write_text('access = "user\u202e \u2066# admin\u2069 \u2066"\u200b\n')
    result = client.call("hermes_read", path=str(bridge.root / "trojan.py"))
    assert result.field("HIDDEN_CHARACTERS").startswith("5 characters")
    assert '"user\\u202e \\u2066# admin\\u2069 \\u2066"\\u200b' in result.text
    assert not any(char in result.text for char in "\u202e\u2066\u2069\u200b")
