"""Issue 48 with the real Hermes 0.19.0 and 0.22.2, over both drivers, `approvals: yolo`, the scripted
model on 127.0.0.1 as Hermes' configured endpoint (so reached through the job's proxy): under `network:
allow-list`, every way out but the proxy is refused by the system (another port with curl, Python and bash's
/dev/tcp, a UDP datagram, a name lookup, listening; the user's ~/.ssh and ~/.aws keys, another process's
environment, GITHUB_TOKEN in Hermes' environment) and the proxy refuses a host not listed and the metadata
address, each named in NETWORK, while a package installed from an allow-listed index and a clone over HTTP from
an allowed host work, and Hermes' model answers. Under `network: ask` the question reaches the user
(hermes_approve) and the answer decides."""
import socket
import subprocess
import threading
import time
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from test_real_hermes import assert_turn_ended, finish, write_hermes_home
from test_real_sandbox import tiny_wheel
from test_secrets import plant_secrets
from test_worktrees import make_repo

from conftest import require_component, require_sandbox
from harness import REAL_ACP_VERSIONS, REAL_HERMES_VERSIONS, Bridge, BridgeClient, Result, wait_until
from scripted_model import ScriptedModel

pytestmark = [pytest.mark.e2e, pytest.mark.posix("Landlock is Linux's")]

WAYS_OUT = ("curl", "python", "devtcp", "udp", "lookup", "listen", "inbound", "unlisted", "metadata", "ssh", "aws",
            "environ", "token")
WORK = ("pip", "clone")


class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


def served(folder: Path) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(folder)))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


def package_index_and_repository(folder: Path) -> None:
    """A PEP 503 index holding one wheel, and a repository git clones over dumb HTTP."""
    (folder / "simple" / "tiny").mkdir(parents=True)
    wheel = tiny_wheel(folder / "simple" / "tiny")
    (folder / "simple" / "tiny" / "index.html").write_text(f'<a href="{wheel.name}">{wheel.name}</a>\n')
    source = make_repo(folder / "source", {"README.md": "served over http\n"})
    subprocess.run(["git", "clone", "-q", "--bare", str(source), str(folder / "repo.git")], check=True)
    subprocess.run(["git", "update-server-info"], cwd=folder / "repo.git", check=True)


def ways_out_script(bridge: Bridge, index: int, other: int, outsider: int = 0) -> Path:
    """`sh net.sh NAME`: one way out (the network, the user's keys, another process's environment, a credential
    in Hermes' own) or one piece of work, its result appended to net.txt as DONE or DENIED. `inbound` listens
    without bind() and waits 10 s for a connection from outside (knock_when_listening)."""
    script = bridge.tmp / "net.sh"
    python = ("python3 -c 'import socket,sys; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
              f"s.sendto(b\"x\", (\"127.0.0.1\", {other}))'")
    script.write_text(f"""
try() {{ name=$1; shift; if ( "$@" ) >/dev/null 2>&1; then echo "DONE $name"; else echo "DENIED $name"; fi \
  >> net.txt; }}
case $1 in
  curl) try curl curl -sf --noproxy '*' -m 5 http://127.0.0.1:{other}/;;
  python) try python python3 -c 'import socket; socket.create_connection(("127.0.0.1", {other}), 5)';;
  devtcp) try devtcp bash -c 'exec 3<>/dev/tcp/127.0.0.1/{other}';;
  udp) try udp {python};;
  lookup) try lookup python3 -c 'import socket; socket.getaddrinfo("pypi.org", 443)';;
  listen) try listen python3 -c 'import socket; socket.create_server(("127.0.0.1", 0))';;
  inbound) try inbound python3 -c 'import socket; s=socket.socket(); s.listen(1); s.settimeout(10)
open("inbound.port", "w").write(str(s.getsockname()[1])); s.accept()';;
  unlisted) try unlisted curl -sf -m 5 http://127.0.0.1:{other}/;;
  metadata) try metadata curl -sf -m 5 http://169.254.169.254/latest/meta-data/;;
  pip) try pip sh -c 'python3 -m venv v && v/bin/pip install -q --index-url http://127.0.0.1:{index}/simple tiny \
    && v/bin/python -c "import tiny"';;
  clone) try clone git clone -q http://127.0.0.1:{index}/repo.git cloned;;
  ssh) try ssh cat {bridge.tmp}/home/.ssh/id_ed25519;;
  aws) try aws cat {bridge.tmp}/home/.aws/credentials;;
  environ) try environ grep -aq OUTSIDER_TOKEN /proc/{outsider}/environ;;
  token) try token sh -c 'test -n "$GITHUB_TOKEN"';;
esac
tail -n 1 net.txt
""")
    return script


def knock_when_listening(port_file: Path) -> list[str]:
    """What a connection from this machine's loopback to the port the job names in port_file met, once it
    appears (filled in by a thread: "refused", or "accepted" when the job's port was reachable)."""
    met: list[str] = []

    def knock() -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if port_file.exists() and port_file.read_text().strip().isdigit():
                try:
                    socket.create_connection(("127.0.0.1", int(port_file.read_text())), 5).close()
                    met.append("accepted")
                except OSError:
                    met.append("refused")
                return
            time.sleep(0.05)
    threading.Thread(target=knock, daemon=True).start()
    return met


@pytest.fixture(params=[(version, driver) for version in REAL_ACP_VERSIONS for driver in ("cli", "acp")],
                ids=lambda param: f"hermes-{param[0]}-{param[1]}")
def limited(bridge: Bridge, request: pytest.FixtureRequest) -> Any:
    require_sandbox()
    version, driver = request.param
    exe = require_component(REAL_HERMES_VERSIONS[version], f"the real Hermes CLI {version}")
    home = bridge.tmp / "real-home"
    (home / "skills").mkdir(parents=True)
    package_index_and_repository(bridge.tmp / "served")
    index, other = served(bridge.tmp / "served"), served(bridge.tmp / "served")
    plant_secrets(bridge.tmp / "home")
    bridge.extra_env["GITHUB_TOKEN"] = "ghp_in_the_servers_environment"
    outsider = subprocess.Popen(["sleep", "600"], env={"OUTSIDER_TOKEN": "secret"})  # another program of the user's
    try:
        with ScriptedModel(bridge.tmp) as model:
            write_hermes_home(home, model.base_url)
            bridge.configure(hermes_exe=str(exe), hermes_home=str(home), kill_grace_s=5, hermes_driver=driver,
                             approvals="yolo", network="allow-list",
                             network_allow=[f"127.0.0.1:{index.server_address[1]}"])
            with bridge.client() as client:
                yield bridge, client, model, index.server_address[1], other.server_address[1], outsider.pid
    finally:
        outsider.kill()
        outsider.wait()
        index.shutdown()
        other.shutdown()


def test_every_way_out_but_the_proxy_is_refused_and_allowed_work_goes_through_it(
        limited: tuple[Bridge, BridgeClient, ScriptedModel, int, int, int]) -> None:
    bridge, client, model, index, other, outsider = limited
    script = ways_out_script(bridge, index, other, outsider)
    steps = "\n".join(f"RUN: sh {script} {name}" for name in (*WAYS_OUT, *WORK))
    knocked = knock_when_listening(bridge.root / "inbound.port")
    result = finish(client, client.call("hermes_run", task=f"Try each.\n{steps}", wait_s=45), timeout=300)
    assert_turn_ended(result)
    assert knocked == ["refused"], knocked  # the job's port exists in its own network only
    tried = (bridge.root / "net.txt").read_text()
    assert [line.split()[1] for line in tried.splitlines()] == [*WAYS_OUT, *WORK], tried
    for name in WAYS_OUT:
        assert f"DENIED {name}" in tried, (name, tried)
    assert "DONE pip" in tried and "DONE clone" in tried
    assert (bridge.root / "cloned" / "README.md").read_text() == "served over http\n"
    network, model_port = result.field("NETWORK"), model.server_address[1]
    assert network.startswith(f"allow-list (1 host of network_allow and Hermes' model 127.0.0.1:{model_port}) "
                              "through the job's proxy (a network of its own: only a loopback, where the proxy "
                              "listens"), network
    # Hermes' own lookups (models.dev, its update check) are refused too: nothing is allowed but what is listed
    assert f"127.0.0.1:{other} (not on network_allow)" in network
    assert "169.254.169.254:80 (not on network_allow)" in network
    assert len(model.requests()) > len(WAYS_OUT) + len(WORK)  # Hermes' model, reached through the proxy alone
    audit = (bridge.tmp / "logs" / "audit.log").read_text()
    assert f'"refused": "127.0.0.1:{other}"' in audit and '"refused": "169.254.169.254:80"' in audit


def test_under_ask_an_unlisted_host_is_the_users_question(
        limited: tuple[Bridge, BridgeClient, ScriptedModel, int, int, int]) -> None:
    bridge, client, _, index, other, _ = limited
    bridge.configure(network="ask", network_allow=[])
    script = ways_out_script(bridge, index, other)
    started = client.call("hermes_run", task=f"Fetch.\nRUN: sh {script} unlisted\nRUN: sh {script} clone", wait_s=1)
    job_id = started.field("JOB_ID")
    def asking() -> Result | None:
        result = client.call("hermes_status", job_id=job_id, wait_s=5)
        return result if result.text.startswith("STATUS: needs_approval") else None
    asked = wait_until(asking, 120, "the network question")
    assert f"The job asks to connect to 127.0.0.1:{other}, a host not on network_allow" in asked.text, asked.text
    denied = client.call("hermes_approve", job_id=job_id, approval_id=asked.field("APPROVAL_ID"), decision="deny")
    assert not denied.is_error, denied.text
    second = wait_until(asking, 120, "the second question")
    assert f"connect to 127.0.0.1:{index}, a host not on network_allow" in second.text, second.text
    client.call("hermes_approve", job_id=job_id, approval_id=second.field("APPROVAL_ID"), decision="allow_for_job")
    result = finish(client, client.call("hermes_status", job_id=job_id, wait_s=45), timeout=300)
    assert_turn_ended(result)
    assert (bridge.root / "net.txt").read_text() == "DENIED unlisted\nDONE clone\n"
    network = result.field("NETWORK")
    assert f"127.0.0.1:{other} (not on network_allow and not allowed when asked)" in network, network
    assert f"127.0.0.1:{index}" not in network  # what Hermes itself fetched (where it does) was refused, not asked
    assert result.text.splitlines()[2].startswith("DENIED: 1 request Hermes asked for was denied"), result.text
