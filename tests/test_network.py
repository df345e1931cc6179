"""Issue 48 part 3: a job's network. The proxy decides each request by host and port (allow-list, ask,
model-only, Hermes' model always), refuses names that resolve inside the machine or its network, and says what
it refused; the sandbox's step holds a process to the proxy's port (Landlock) and to Unix and TCP sockets
(seccomp); the supervisor's JobNetwork asks the user on the approvals' channel. Everything on 127.0.0.1."""
import contextlib
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

import pytest

from claude_hermes_bridge.drivers import start_hermes
from claude_hermes_bridge.job_network import NETWORK_QUESTIONS_MAX, JobNetwork
from claude_hermes_bridge.jobs import JobRecord, JobState, JobStore
from claude_hermes_bridge.network import (
    JobProxy,
    NetworkPolicy,
    host_rule,
    is_internal,
    model_endpoint,
    rules_problem,
    support_line,
)
from claude_hermes_bridge.sandbox import landlock_abi, private_devices_refusal, step_argv
from conftest import require_sandbox
from harness import Bridge, config_for, wait_until


class Hello(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        port = cast(tuple[str, int], self.server.server_address)[1]
        body = f"hello from {port} {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@contextlib.contextmanager
def network_question(bridge: Bridge) -> Iterator[tuple[int, Path]]:
    """A bridge whose jobs ask before reaching a host not on network_allow, a plain HTTP server on 127.0.0.1 (its
    port), and a job script that fetches it with curl and writes the HTTP code to code.txt in the job's folder."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    script = bridge.tmp / "fetch.sh"
    script.write_text(f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{port}/ > {bridge.root}/code.txt\n")
    bridge.configure(network="ask", network_allow=[], approval_timeout_s=60)
    try:
        yield port, script
    finally:
        server.shutdown()


@pytest.fixture
def servers() -> Any:
    """Two plain HTTP servers on 127.0.0.1: one the job may reach, one it may not."""
    started = [ThreadingHTTPServer(("127.0.0.1", 0), Hello) for _ in range(2)]
    for server in started:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield [server.server_address[1] for server in started]
    for server in started:
        server.shutdown()


def fetch(proxy: JobProxy, url: str) -> tuple[int, str]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": f"http://127.0.0.1:{proxy.port}"}))
    try:
        with opener.open(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def tunnel(proxy: JobProxy, host: str, port: int) -> tuple[int, str]:
    """A CONNECT through the proxy (as https goes), then a plain request inside the tunnel."""
    connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    connection.set_tunnel(host, port)
    try:
        connection.request("GET", "/inside")
        response = connection.getresponse()
        return response.status, response.read().decode()
    except OSError as exc:
        return 403 if "403" in str(exc) else 0, str(exc)
    finally:
        connection.close()


def policy(mode: str, *entries: str, model: tuple[str, int] | None = None) -> NetworkPolicy:
    return NetworkPolicy(mode, tuple(host_rule(entry) for entry in entries), model)


def test_host_rules_read_names_subdomains_addresses_and_ports() -> None:
    assert host_rule("PyPI.org.").matches("pypi.org", 443) and host_rule("pypi.org").matches("pypi.org", 8080)
    assert not host_rule("pypi.org:443").matches("pypi.org", 80)
    wildcard = host_rule("*.pythonhosted.org")
    assert wildcard.matches("files.pythonhosted.org", 443) and not wildcard.matches("pythonhosted.org", 443)
    assert not wildcard.matches("evilpythonhosted.org", 443)
    assert host_rule("[::1]:8080").matches("::1", 8080) and host_rule("127.0.0.1").matches("127.0.0.1", 9)
    for wrong in ("http://pypi.org", "pypi.org:0", "pypi.org:x", "a b", "*", "*.", ""):
        assert rules_problem([wrong]), wrong
    assert rules_problem([7]) and rules_problem(["pypi.org", "*.a.b:1"]) is None


def test_internal_addresses_are_the_machine_its_network_and_the_metadata_service() -> None:
    import ipaddress

    for address in ("127.0.0.1", "10.1.2.3", "192.168.0.1", "172.16.0.1", "169.254.169.254", "::1", "fe80::1",
                    "fd00:ec2::254", "::ffff:127.0.0.1", "0.0.0.0", "100.64.0.1", "224.0.0.1"):
        assert is_internal(ipaddress.ip_address(address)), address
    assert not is_internal(ipaddress.ip_address("151.101.0.223"))


def test_hermes_model_endpoint_comes_from_its_config(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("model:\n  provider: custom\n  base_url: http://127.0.0.1:4321/v1\n")
    assert model_endpoint(tmp_path) == ("127.0.0.1", 4321)
    (tmp_path / "config.yaml").write_text("model:\n  base_url: https://API.example.com/v1\n")
    assert model_endpoint(tmp_path) == ("api.example.com", 443)
    (tmp_path / "config.yaml").write_text("model:\n  provider: openrouter\n")
    assert model_endpoint(tmp_path) == ("openrouter.ai", 443)
    for unknown in ("model: x\n", "model:\n  base_url: file:///etc\n", "[1, 2\n", "model:\n  provider: mine\n"):
        (tmp_path / "config.yaml").write_text(unknown)
        assert model_endpoint(tmp_path) is None, unknown


def test_the_proxy_lets_through_what_is_listed_and_refuses_the_rest_naming_it(servers: list[int]) -> None:
    allowed, other = servers
    proxy = JobProxy(policy("allow-list", f"127.0.0.1:{allowed}"))
    try:
        assert fetch(proxy, f"http://127.0.0.1:{allowed}/x?y=1") == (200, f"hello from {allowed} /x?y=1")
        assert tunnel(proxy, "127.0.0.1", allowed) == (200, f"hello from {allowed} /inside")
        status, body = fetch(proxy, f"http://127.0.0.1:{other}/")
        assert status == 403 and "not on network_allow" in body
        assert tunnel(proxy, "127.0.0.1", other)[0] == 403
        assert fetch(proxy, "http://169.254.169.254/latest/meta-data/")[0] == 403
        assert proxy.refused_count == 3 and proxy.allowed_count == 2
        assert proxy.refusals == [f"127.0.0.1:{other} (not on network_allow)",
                                  "169.254.169.254:80 (not on network_allow)"]
    finally:
        proxy.close()


def test_a_listed_name_that_resolves_inside_is_refused_but_hermes_model_is_not(
        servers: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    allowed, other = servers
    real = socket.getaddrinfo

    def resolve(host: str, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host.endswith(".example"):  # a public name a job's attacker points at the machine itself
            return real("127.0.0.1", port, *args, **kwargs)
        return real(host, port, *args, **kwargs)
    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    proxy = JobProxy(policy("allow-list", "*.example", "rebind.example", model=("model.example", other)))
    try:
        status, body = fetch(proxy, f"http://sub.example:{allowed}/")
        assert status == 403 and "resolves to 127.0.0.1, an address on this machine" in body
        assert fetch(proxy, f"http://rebind.example:{allowed}/")[0] == 403  # an exact name: still its address
        assert fetch(proxy, f"http://model.example:{other}/v1") == (200, f"hello from {other} /v1")
        assert fetch(proxy, f"http://model.example:{allowed}/")[0] == 403  # the model's host, another port
    finally:
        proxy.close()


def test_model_only_reaches_the_model_alone(servers: list[int]) -> None:
    model_port, other = servers
    proxy = JobProxy(policy("model-only", f"127.0.0.1:{other}", model=("127.0.0.1", model_port)))
    try:
        assert fetch(proxy, f"http://127.0.0.1:{model_port}/v1")[0] == 200
        status, body = fetch(proxy, f"http://127.0.0.1:{other}/")
        assert status == 403 and "not Hermes' model (network: model-only)" in body
    finally:
        proxy.close()


def test_ask_asks_once_per_host_and_holds_the_answer_for_the_job(servers: list[int]) -> None:
    first, second = servers
    asked: list[str] = []
    answers = {f"127.0.0.1:{first}": "allow_for_job", f"127.0.0.1:{second}": "deny"}

    def ask(where: str) -> str:
        asked.append(where)
        return answers[where]
    proxy = JobProxy(policy("ask"), ask)
    try:
        assert [fetch(proxy, f"http://127.0.0.1:{first}/")[0] for _ in range(2)] == [200, 200]
        assert [fetch(proxy, f"http://127.0.0.1:{second}/")[0] for _ in range(2)] == [403, 403]
        assert asked == [f"127.0.0.1:{first}", f"127.0.0.1:{second}"]
        assert "not on network_allow and not allowed when asked" in proxy.refusals[0]
        answers[f"127.0.0.1:{first}"] = "allow"
        once = JobProxy(policy("ask"), ask)
        try:
            assert [fetch(once, f"http://127.0.0.1:{first}/")[0] for _ in range(2)] == [200, 200]
            assert asked[2:] == [f"127.0.0.1:{first}"] * 2  # allowed once: asked again next time
        finally:
            once.close()
    finally:
        proxy.close()


@pytest.mark.posix("/proc tells a socket's process")
def test_under_ask_hermes_own_requests_are_refused_without_a_question_and_its_tools_are_asked(
        servers: list[int]) -> None:
    """What Hermes fetches by itself (its update check, model metadata) is not the user's question; the same host
    asked by a tool it runs (a child process) is."""
    import os

    asked: list[str] = []
    def ask(where: str) -> str:
        asked.append(where)
        return "allow"
    proxy = JobProxy(policy("ask"), ask, hermes_pid=os.getpid)
    try:
        status, body = fetch(proxy, f"http://127.0.0.1:{servers[0]}/")
        assert status == 403 and "Hermes' own request, not a tool's: not asked about" in body and asked == []
        tool = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-x",
                               f"http://127.0.0.1:{proxy.port}", f"http://127.0.0.1:{servers[0]}/"],
                              capture_output=True, text=True, timeout=30)
        assert tool.stdout == "200" and asked == [f"127.0.0.1:{servers[0]}"]
    finally:
        proxy.close()


def test_the_proxy_refuses_what_is_not_an_http_request_and_heads_past_its_bound(servers: list[int]) -> None:
    proxy = JobProxy(policy("allow-list", f"127.0.0.1:{servers[0]}"))
    try:
        for request in (b"hello\r\n\r\n", b"GET https://127.0.0.1/ HTTP/1.1\r\n\r\n",
                        b"GET /relative HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
                        b"CONNECT 127.0.0.1 HTTP/1.1\r\n\r\n", b"GET http://a b/ HTTP/1.1\r\n" + b"x" * 70000):
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as client:
                client.sendall(request)
                assert client.recv(100).split(b" ")[1] in (b"400", b"431"), request[:40]
    finally:
        proxy.close()


NETWORK_TRY = r"""
import ctypes, json, socket, sys
proxy, other = int(sys.argv[1]), int(sys.argv[2])
found = {}
def attempt(name, action):
    try:
        action()
        found[name] = "allowed"
    except OSError as exc:
        found[name] = exc.errno
attempt("proxy", lambda: socket.create_connection(("127.0.0.1", proxy), 5).close())
attempt("other port", lambda: socket.create_connection(("127.0.0.1", other), 5).close())
attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", other)))
attempt("udp6", lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM))
attempt("raw", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, 1))
attempt("packet", lambda: socket.socket(17, socket.SOCK_RAW, 0))
attempt("netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0))
attempt("sctp", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM, 132))
attempt("unix", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close())
attempt("tcp6", lambda: socket.socket(socket.AF_INET6, socket.SOCK_STREAM | socket.SOCK_CLOEXEC).close())
attempt("listen", lambda: socket.socket().bind(("127.0.0.1", 0)))
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
for name, number in (("io_uring", 425), ("x32 getpid", 0x40000000 | 39)):
    found[name] = "allowed" if libc.syscall(number, 8, None) >= 0 else ctypes.get_errno()
print(json.dumps(found))
"""


@pytest.mark.posix("Landlock is Linux's")
def test_the_step_holds_a_process_to_the_proxy_port_and_to_unix_and_tcp_sockets(tmp_path: Path) -> None:
    require_sandbox()
    assert landlock_abi()[0] >= 4
    script = tmp_path / "try.py"
    script.write_text(NETWORK_TRY)
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    ports = [str(listener.getsockname()[1]) for listener in listeners]
    try:
        argv = [sys.executable, str(script), *ports]
        limited = json.loads(subprocess.run(step_argv([str(tmp_path)], argv, None, int(ports[0])), check=True,
                                            capture_output=True, text=True, timeout=60).stdout)
        eacces, eperm = 13, 1
        assert limited == {"proxy": "allowed", "other port": eacces, "udp": eperm, "udp6": eperm, "raw": eperm,
                           "packet": eperm, "netlink": eperm, "sctp": eperm, "unix": "allowed", "tcp6": "allowed",
                           "listen": eacces, "io_uring": eperm, "x32 getpid": eperm}, limited
        open_network = json.loads(subprocess.run(step_argv([str(tmp_path)], argv), check=True, capture_output=True,
                                                 text=True, timeout=60).stdout)
        assert open_network["other port"] == open_network["listen"] == open_network["udp"] == "allowed"
        assert open_network["x32 getpid"] == 1  # another ABI's calls are refused with or without the network
    finally:
        for listener in listeners:
            listener.close()


INBOUND_TRY = r"""
import json, socket, sys
proxy, server = int(sys.argv[1]), int(sys.argv[2])
unbound = socket.socket()
unbound.listen(1)  # no bind(): the kernel gives it a free port on every address of the job's network
with socket.create_connection(("127.0.0.1", proxy), 5) as through:
    through.sendall(f"GET http://127.0.0.1:{server}/ HTTP/1.0\r\n\r\n".encode())
    answer = through.recv(200).decode()
print(json.dumps({"listening": unbound.getsockname()[1], "answer": answer}), flush=True)
sys.stdin.read()
"""


@pytest.mark.posix("network namespaces are Linux's")
def test_under_a_limited_network_a_port_the_job_listens_on_is_reached_from_nowhere_and_its_proxy_is(
        tmp_path: Path, servers: list[int]) -> None:
    """listen() without bind() gets a port Landlock cannot refuse: only a network of the job's own, where the
    proxy's listener is the one way out, keeps the port from everything else on this machine and beyond."""
    require_sandbox()
    script = tmp_path / "inbound.py"
    script.write_text(INBOUND_TRY)
    proxy = JobProxy(policy("allow-list", f"127.0.0.1:{servers[0]}"))
    try:
        argv = step_argv([str(tmp_path)], [sys.executable, str(script), str(proxy.port), str(servers[0])], None,
                         proxy.port, own_network=proxy.namespace_channel())
        job = start_hermes(argv, str(tmp_path), {"PATH": os.environ["PATH"]}, subprocess.PIPE, subprocess.PIPE,
                           subprocess.PIPE)
        try:
            found = json.loads(cast(Any, job.stdout).readline() or "{}")
            assert found.get("answer", "").startswith("HTTP/1.0 200"), (found, cast(Any, job.stderr).read(4000))
            assert proxy.own_network
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", found["listening"]), 5).close()
        finally:
            job.kill()
            job.communicate()
        with pytest.raises(ConnectionRefusedError):  # the loopback's own listener handed over, not kept
            socket.create_connection(("127.0.0.1", proxy.port), 5).close()
    finally:
        proxy.close()


@pytest.mark.posix("network namespaces are Linux's")
@pytest.mark.parametrize("driver", ["cli", "acp"])
def test_a_limited_jobs_unbound_listener_is_reached_from_nowhere_and_its_block_says_why(
        bridge: Bridge, driver: str) -> None:
    """Through the server (the fake Hermes, each driver): a model-only job listens without bind() and waits for
    a connection; one from this machine's loopback finds nothing, and NETWORK says the job has a network of its
    own."""
    require_sandbox()
    port_file = bridge.root / "inbound.port"
    script = bridge.tmp / "inbound.sh"
    script.write_text(f"{sys.executable} -c 'import socket; s = socket.socket(); s.listen(1); s.settimeout(5)\n"
                      f"open(\"{port_file}\", \"w\").write(str(s.getsockname()[1])); s.accept()' "
                      f"&& echo accepted > {bridge.root}/inbound.txt || echo nobody > {bridge.root}/inbound.txt\n")
    bridge.configure(hermes_driver=driver, network="model-only")
    client = bridge.client()
    client.params.env = dict(bridge.env, FAKE_HERMES_ACP="1" if driver == "acp" else "0")
    with client:
        job_id = client.call("hermes_run", task=f"!shell={script}", cwd=str(bridge.root), wait_s=0).field("JOB_ID")
        port = wait_until(lambda: port_file.read_text() if port_file.exists() else None, 60, "the job's port")
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", int(port)), 5).close()
        result = client.wait_final(job_id, timeout=60)
    assert result.field("STATUS") == "ok", result.text
    assert (bridge.root / "inbound.txt").read_text() == "nobody\n"
    assert "through the job's proxy (a network of its own: only a loopback" in result.field("NETWORK"), result.text


def network_job(tmp_path: Path, **settings: Any) -> tuple[JobNetwork, JobStore, JobRecord]:
    tmp_path.mkdir(exist_ok=True)
    cfg = config_for(tmp_path, allowed_roots=[str(tmp_path)], hermes_home=str(tmp_path / "home"), **settings)
    store = JobStore.of(cfg)
    store.ensure()
    record = JobRecord(id="20261204-000000-1", state=JobState.RUNNING)
    return JobNetwork(cfg, store, record), store, record


def test_a_host_not_listed_becomes_the_users_question_and_the_answer_decides(
        tmp_path: Path, servers: list[int]) -> None:
    network, store, record = network_job(tmp_path, network="ask", approval_timeout_s=30, network_allow=[])
    assert network.start(sandboxed=False) is None and network.proxy and record.network
    proxy = network.proxy
    assert record.network.startswith("ask (0 hosts of network_allow and Hermes' model (its host not known")
    assert "not enforced: the job is not sandboxed" in record.network
    results: list[tuple[int, str]] = []
    request = threading.Thread(target=lambda: results.append(fetch(proxy, f"http://127.0.0.1:{servers[0]}/")))
    request.start()
    def asked() -> dict[str, Any] | None:
        network.pump()
        return record.questions[0] if record.questions else None
    question = wait_until(asked, 10, "the question")
    assert question["what"].startswith(f"connect to 127.0.0.1:{servers[0]}, a host not on network_allow")
    store.answers_path(record.id).write_text(json.dumps({question["id"]: {"decision": "allow", "by": "view"}}))
    wait_until(lambda: network.pump() or results, 10, "the answer applied")
    request.join(10)
    assert results == [(200, f"hello from {servers[0]} /")] and record.questions == []
    assert record.decisions[-1]["decision"] == "allow" and record.decisions[-1]["by"] == "the user (job view)"
    network.close()


def test_an_explicit_deny_refuses_the_request_and_past_ten_questions_hosts_are_refused_unasked(
        tmp_path: Path, servers: list[int]) -> None:
    """Issue 64: one job put 182 network questions to the user; at most NETWORK_QUESTIONS_MAX are asked, the rest
    refused unasked and said once. Issue 68: a question answered deny fails the request it holds."""
    network, store, record = network_job(tmp_path, network="ask", approval_timeout_s=60)
    network.start(sandboxed=False)
    proxy = cast(JobProxy, network.proxy)
    results: dict[str, tuple[int, str]] = {}
    threading.Thread(target=lambda: results.update(first=fetch(proxy, f"http://127.0.0.1:{servers[0]}/"))).start()
    def asked() -> dict[str, Any] | None:
        network.pump()
        return record.questions[0] if record.questions else None
    question = wait_until(asked, 10, "the question")
    store.answers_path(record.id).write_text(json.dumps({question["id"]: {"decision": "deny", "by": "planner"}}))
    wait_until(lambda: network.pump() or "first" in results, 10, "the denial applied")
    wait_until(lambda: "first" in results, 10, "the request's answer")
    assert results["first"][0] == 403 and record.decisions[-1]["decision"] == "deny"
    hosts = [f"host-{number}.example:443" for number in range(NETWORK_QUESTIONS_MAX + 4)]
    decisions: dict[str, str] = {}
    for host in hosts:
        threading.Thread(target=lambda host=host: decisions.update({host: network._ask(host)}), daemon=True).start()
    wait_until(lambda: (network.pump(), len(decisions) >= 5)[1], 20, "the questions past the bound refused")
    assert len(record.questions) == NETWORK_QUESTIONS_MAX - 1  # one was asked about the first host
    assert len(decisions) == 5 and set(decisions.values()) == {"deny"}
    assert (f"{NETWORK_QUESTIONS_MAX} network questions asked, the most a job may ask: 5 more hosts were refused "
            "unasked") in (record.network or ""), record.network
    network.close()


def test_an_unanswered_network_question_is_denied_at_its_timeout_and_at_the_jobs_end(
        tmp_path: Path, servers: list[int]) -> None:
    network, _, record = network_job(tmp_path, network="ask", approval_timeout_s=5)
    network.start(sandboxed=False)
    proxy = cast(JobProxy, network.proxy)
    results: list[tuple[int, str]] = []
    threading.Thread(target=lambda: results.append(fetch(proxy, f"http://127.0.0.1:{servers[0]}/"))).start()
    wait_until(lambda: network.pump() and record.questions, 10, "the question")
    started = time.monotonic()
    wait_until(lambda: network.pump() and results, 20, "the timeout")
    assert results[0][0] == 403 and time.monotonic() - started >= 3
    assert record.decisions[-1]["by"] == "no answer within 5 s" and record.questions == []
    assert "1 request refused: 127.0.0.1:" in (record.network or "")
    results.clear()
    threading.Thread(target=lambda: results.append(fetch(proxy, f"http://127.0.0.1:{servers[1]}/"))).start()
    wait_until(lambda: network.pump() and record.questions, 10, "the second question")
    network.close()
    wait_until(lambda: results, 10, "the refusal at the end")
    assert record.decisions[-1]["by"] == "nobody: the job ended while the question waited" and not record.questions


def test_a_limited_network_the_machine_cannot_enforce_refuses_a_job_that_requires_the_sandbox(tmp_path: Path) -> None:
    network, _, record = network_job(tmp_path, network="model-only", sandbox="required")
    refused = network.start(sandboxed=False)
    assert refused and refused.startswith("network model-only cannot be enforced here (the job is not sandboxed")
    assert network.proxy is None and record.network is None
    open_job, _, open_record = network_job(tmp_path / "open", network="open")
    assert open_job.start(sandboxed=True) is None and open_job.proxy is None
    assert open_record.network == "open (setting network: open): the job reaches any host"


def test_health_says_what_this_machine_enforces() -> None:
    assert support_line("open", "auto").startswith("open (setting network: open)")
    enforced = support_line("allow-list", "auto")
    own = "a network of its own" if not private_devices_refusal() else "Landlock: TCP"
    assert enforced.startswith(f"allow-list, enforced here ({own}") if landlock_abi()[0] >= 4 else (
        "not enforced" in enforced)
    assert support_line("model-only", "off") == ("model-only: not enforced (the job is not sandboxed, so only tools "
                                                 "that honour HTTPS_PROXY use the proxy)")


def test_a_job_may_narrow_the_network_setting_never_widen_it() -> None:
    from claude_hermes_bridge.network import job_mode

    assert job_mode("open", None) == "open" and job_mode("open", "model-only") == "model-only"
    assert job_mode("ask", "allow-list") == "allow-list" and job_mode("allow-list", "allow-list") == "allow-list"
    for setting, asked in (("allow-list", "open"), ("model-only", "ask"), ("allow-list", "ask")):
        with pytest.raises(ValueError, match=f"network {asked} would widen the setting network: {setting}"):
            job_mode(setting, asked)
    with pytest.raises(ValueError, match="network must be one of"):
        job_mode("open", "none")


@pytest.mark.posix("the fake Hermes' shell directive")
def test_a_job_started_with_a_narrower_network_reaches_only_hermes_model(bridge: Any, servers: list[int]) -> None:
    """Through the real stdio transport: the call's network is the job's, its tools' requests go through the
    job's proxy and are refused there (named in NETWORK), and a wider one than the setting is refused."""
    script = bridge.tmp / "fetch.sh"
    script.write_text(f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{servers[0]}/ "
                      f"> {bridge.root}/code.txt\n")
    bridge.configure(network="allow-list", network_allow=[f"127.0.0.1:{servers[1]}"])
    with bridge.client() as client:
        refused = client.call("hermes_run", task="x", network="open")
        assert refused.is_error and "network open would widen the setting network: allow-list" in refused.text
        result = client.call("hermes_run", task=f"fetch !shell={script}", network="model-only", wait_s=30)
        assert result.field("STATUS") == "ok", result.text
    assert (bridge.root / "code.txt").read_text() == "403"
    network = result.field("NETWORK")
    assert network.startswith("model-only (Hermes' model (its host not known from config.yaml"), network
    assert f"1 request refused: 127.0.0.1:{servers[0]} (not Hermes' model (network: model-only))" in network


def test_the_default_network_is_ask_with_the_package_registries_allowed_and_check_says_so(tmp_path: Path) -> None:
    """Issue 64: the network is asked by default (the registries everyday installs use, and Hermes' model,
    allowed from the start), and --check / hermes_health show the mode and the list."""
    from claude_hermes_bridge.network import PACKAGE_REGISTRIES

    cfg = config_for(tmp_path)
    assert cfg.network == "ask" and cfg.network_allow == list(PACKAGE_REGISTRIES)
    assert {"pypi.org", "registry.npmjs.org", "crates.io", "proxy.golang.org"} <= set(cfg.network_allow)
    line = support_line(cfg.network, "auto", cfg.network_allow)
    assert line.startswith("ask") and "allowed without a question: Hermes' model and pypi.org, " in line, line
    assert "Hermes' model alone (network_allow is empty)" in support_line("ask", "auto", [])


@pytest.mark.posix("/proc tells a socket's process")
def test_hermes_own_refused_requests_are_labelled_under_every_limited_mode(servers: list[int]) -> None:
    """Issue 67: under allow-list and model-only the NETWORK line listed Hermes' own start-up fetches among the
    refusals unlabelled, as if the job's tools had tried them; under ask they were labelled."""
    import os

    for mode in ("allow-list", "model-only"):
        proxy = JobProxy(policy(mode), lambda _where: "deny", hermes_pid=os.getpid)
        try:
            status, body = fetch(proxy, f"http://127.0.0.1:{servers[0]}/")
            assert status == 403 and "; Hermes' own request, not a tool's" in body, (mode, body)
            assert "not asked about" not in body
            assert proxy.refusals[-1].endswith("Hermes' own request, not a tool's)"), proxy.refusals
        finally:
            proxy.close()
