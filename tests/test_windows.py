"""Windows only: what a Linux runner cannot show (.github/workflows/ci.yml runs these on windows-latest).
Not run on the machines this project is developed on; README's Status says so."""
import os
import subprocess
import sys
import time

import psutil
import pytest

import server

pytestmark = pytest.mark.skipif(os.name != "nt", reason="Windows only: job objects, junctions, batch files")


def test_a_batch_file_hermes_is_refused_before_anything_starts(tmp_path):
    shim = tmp_path / "hermes.cmd"
    shim.write_text("@echo off\r\necho started > %~dp0started.txt\r\n")
    cfg = server.Config(path=tmp_path / "config.json", hermes_exe=str(shim), allowed_roots=[str(tmp_path)])
    request = server.JobRequest(kind="run", task='"&calc&"', cwd=str(tmp_path), max_turns=None, timeout_s=60,
                                skills=[], toolsets=[])
    with pytest.raises(server.Refused, match="cmd.exe"):
        server.check_launch(cfg, request)
    assert not (tmp_path / "started.txt").exists()


def test_a_root_reached_in_another_case_is_the_same_folder(tmp_path):
    (tmp_path / "Work").mkdir()
    cfg = server.Config(path=tmp_path / "config.json", allowed_roots=[str(tmp_path / "Work")])
    assert server.confine_cwd(cfg, str(tmp_path / "work"))


def test_a_junction_pointing_out_of_the_root_is_outside(tmp_path):
    (tmp_path / "root").mkdir()
    (tmp_path / "outside").mkdir()
    subprocess.run(["cmd", "/c", "mklink", "/J", str(tmp_path / "root" / "out"), str(tmp_path / "outside")],
                   check=True, capture_output=True)
    cfg = server.Config(path=tmp_path / "config.json", allowed_roots=[str(tmp_path / "root")])
    with pytest.raises(server.Refused, match="outside"):
        server.confine_cwd(cfg, str(tmp_path / "root" / "out"))


def test_the_job_object_stops_a_tree_whose_middle_process_exited():
    """Windows never re-parents: the grandchild of an exited child is found only through the job object."""
    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],"
            " creationflags=0x00000200); time.sleep(1)")
    sentinel = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    proc = subprocess.Popen([sys.executable, "-c", code], creationflags=server.hermes_creation_flags(True) or 0)
    job = server.WindowsJob()
    job.adopt(proc)
    proc.wait(30)
    time.sleep(0.5)
    job.terminate()
    time.sleep(1)
    survivors = [p for p in psutil.process_iter(["cmdline"]) if "time.sleep(120)" in " ".join(p.info["cmdline"] or [])
                 and p.pid != sentinel.pid]
    assert survivors == []
    assert sentinel.poll() is None, "an unrelated process was stopped"
    sentinel.kill()
