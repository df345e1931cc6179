"""[both] A job's network: the modes (the setting `network`), the hosts a job may reach, Hermes' model endpoint
read from its config.yaml, and [supervisor] the proxy a job with a limited network reaches everything through.
The operating system (sandbox.py: Landlock's TCP rules and a seccomp filter) lets such a job connect only to its
proxy's port; the proxy decides each host by name, then connects to the very address it checked."""
import contextlib
import dataclasses
import ipaddress
import os
import re
import select
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .safe_io import plural, read_capped, shown
from .sandbox import NETWORK_ABI, landlock_abi, private_devices_refusal
from .sandbox import mechanism as sandbox_mechanism

# The strictest first: a misspelt mode in config.json falls back to it (Config takes a choice's first word).
NETWORK_MODES = ("model-only", "allow-list", "ask", "open")
# The variables HTTP clients read a proxy from (curl reads http_proxy in lower case only; Node's own fetch from
# Node 24 when NODE_USE_ENV_PROXY is set), and those that would send a host around the proxy.
PROXY_VARIABLES = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "all_proxy")
NO_PROXY_VARIABLES = ("no_proxy", "NO_PROXY")
# What network_allow holds by default: the package registries everyday installs use (Python, Node, Rust, Go), so
# `pip install`, `npm install`, `cargo build` and `go mod download` work under network: ask without a question.
PACKAGE_REGISTRIES = ("pypi.org", "files.pythonhosted.org", "registry.npmjs.org", "registry.yarnpkg.com",
                      "crates.io", "index.crates.io", "static.crates.io", "proxy.golang.org", "sum.golang.org")
# Where Hermes' providers send a model's requests when config.yaml names no base_url.
PROVIDER_HOSTS = {"openrouter": "openrouter.ai", "anthropic": "api.anthropic.com", "openai": "api.openai.com",
                  "nous": "inference-api.nousresearch.com", "gemini": "generativelanguage.googleapis.com",
                  "deepseek": "api.deepseek.com", "xai": "api.x.ai"}
# The hosts Hermes' own process reaches at every start whatever its model (model metadata, a provider's catalogue;
# 0.19.0 sends CONNECT to openrouter.ai with a model on 127.0.0.1). Where the proxy cannot tell Hermes' process
# from its tools' (no /proc: Windows, macOS), a request to one of them is taken for Hermes' own and refused
# without a question: else every job there would open by asking the user about a host they never named.
HERMES_START_HOSTS = frozenset({*PROVIDER_HOSTS.values(), "models.dev"})
CAN_TELL_HERMES = sys.platform.startswith("linux")  # socket_owned_by reads Linux's /proc
HOST_RE = re.compile(r"(\*\.)?[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*")
METADATA_ADDRESSES = frozenset({ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254"),
                                ipaddress.ip_address("100.100.100.200")})
HEAD_MAX_BYTES = 64 << 10
HEAD_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 15.0
IDLE_TIMEOUT_S = 600.0
CONNECTIONS_MAX = 64
REFUSALS_KEPT = 20


@dataclasses.dataclass(frozen=True)
class HostRule:
    """One entry of network_allow: a host name ("pypi.org"), its subdomains ("*.pythonhosted.org", not the name
    itself) or an address ("127.0.0.1", "[::1]"), on any port or one (":8080")."""

    host: str
    port: int | None

    @property
    def exact(self) -> bool:
        return not self.host.startswith("*.")

    def matches(self, host: str, port: int) -> bool:
        if self.port is not None and self.port != port:
            return False
        return host == self.host if self.exact else host.endswith(self.host[1:])

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host + (f":{self.port}" if self.port is not None else "")


def split_host_port(text: str) -> tuple[str, int | None]:
    """("example.com", 443) from "example.com:443", ("::1", None) from "[::1]"; ValueError when it is neither."""
    text = text.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        ipaddress.IPv6Address(host)
        port_text = rest[1:] if rest.startswith(":") else ("" if not rest else "x")
    else:
        host, _, port_text = text.rpartition(":") if text.count(":") == 1 else (text, "", "")
    port = int(port_text) if port_text else None
    if port is not None and not 0 < port < 65536:
        raise ValueError(f"port {port} is not between 1 and 65535")
    host = host.lower().rstrip(".")
    if not (HOST_RE.fullmatch(host) or is_address(host)):
        raise ValueError(f"{host!r} is not a host name or an address")
    return host, port


def is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def host_rule(entry: str) -> HostRule:
    """A network_allow entry as a rule; ValueError naming what is wrong with it."""
    return HostRule(*split_host_port(entry))


def rules_problem(entries: list[Any]) -> str | None:
    """What is wrong with network_allow, or None (for Config's check)."""
    for entry in entries:
        if not isinstance(entry, str):
            return f"{entry!r} is not text"
        try:
            host_rule(entry)
        except ValueError as exc:
            return f"{entry!r}: {exc}"
    return None


def model_endpoint(hermes_home: Path) -> tuple[str, int] | None:
    """The host and port Hermes sends its model's requests to: config.yaml's model.base_url, else its provider's
    host; None when neither says (a file a job may have written is read capped, and nothing in it is trusted
    but as a host name)."""
    import yaml

    try:
        settings = yaml.safe_load(read_capped(hermes_home / "config.yaml", 1 << 20))
    except (OSError, ValueError, yaml.YAMLError):
        return None
    model = settings.get("model") if isinstance(settings, dict) else None
    if not isinstance(model, dict):
        return None
    url = model.get("base_url")
    if isinstance(url, str) and url.strip():
        try:
            parts = urlsplit(url.strip())
            host, port = (parts.hostname or "").lower().rstrip("."), parts.port
        except ValueError:
            return None
        if not host or parts.scheme not in ("http", "https"):
            return None
        return host, port or (443 if parts.scheme == "https" else 80)
    provider_host = PROVIDER_HOSTS.get(str(model.get("provider", "")).lower())
    return (provider_host, 443) if provider_host else None


def is_internal(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Loopback, private, link-local, multicast, reserved, unspecified or a cloud's metadata address: where a
    request from a job could reach the user's own services rather than the internet."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    return (address in METADATA_ADDRESSES or not address.is_global or address.is_multicast
            or address.is_reserved or address.is_unspecified)


@dataclasses.dataclass(frozen=True)
class NetworkPolicy:
    """What a job may reach: its mode, the user's rules and Hermes' model endpoint (always allowed, whatever it
    resolves to: a local model on 127.0.0.1 keeps working)."""

    mode: str
    rules: tuple[HostRule, ...]
    model: tuple[str, int] | None

    def is_model(self, host: str, port: int) -> bool:
        return self.model == (host, port)

    def listed(self, host: str, port: int) -> HostRule | None:
        if self.mode == "model-only":
            return None
        return next((rule for rule in self.rules if rule.matches(host, port)), None)

    def words(self) -> str:
        """The mode as a block says it: what the job may reach."""
        model = f"Hermes' model {self.model[0]}:{self.model[1]}" if self.model else (
            "Hermes' model (its host not known from config.yaml: add it to network_allow)")
        if self.mode == "model-only":
            return f"model-only ({model})"
        hosts = f"{plural(len(self.rules), 'host')} of network_allow and {model}"
        return f"{self.mode} ({hosts}{'; any other host is asked about' if self.mode == 'ask' else ''})"


def job_mode(setting: str, asked: object) -> str:
    """The network a job asked for (None: the setting's), which may narrow the setting but never widen it (the
    modes run strictest first); ValueError naming why."""
    if asked is None:
        return setting
    if asked not in NETWORK_MODES:
        raise ValueError(f"network must be one of {', '.join(NETWORK_MODES)}, got {shown(asked, 40)}")
    if NETWORK_MODES.index(str(asked)) > NETWORK_MODES.index(setting):
        raise ValueError(f"network {asked} would widen the setting network: {setting}; a job may only narrow it "
                         f"({', '.join(NETWORK_MODES[:NETWORK_MODES.index(setting) + 1])})")
    return str(asked)


def job_policy(mode: str, entries: list[str], hermes_home: Path) -> NetworkPolicy:
    rules = []
    for entry in entries:
        try:
            rules.append(host_rule(entry))
        except ValueError:
            continue  # refused by Config's check before any job starts
    return NetworkPolicy(mode, tuple(rules), model_endpoint(hermes_home))


def proxy_environment(port: int) -> dict[str, str]:
    url = f"http://127.0.0.1:{port}"
    return {**{name: url for name in PROXY_VARIABLES}, "NODE_USE_ENV_PROXY": "1"}


# "host:port" -> the user's decision (allow, allow_for_job or deny); blocks until answered or the question expired
Asker = Callable[[str], str]


class Refusal(Exception):
    """A request the proxy refuses: the status it answers with and why, in words."""

    def __init__(self, status: str, why: str):
        super().__init__(why)
        self.status, self.why = status, why


class JobProxy:
    """An HTTP proxy on 127.0.0.1 for one job (CONNECT for https, absolute URLs for http), run in threads of the
    job's supervisor. Each request is decided by its host name and port, the name resolved here and every
    address checked, then the connection made to the address checked (no second lookup for a job to race);
    what was refused is kept for the job's blocks (refusals) and passed to on_refusal."""

    def __init__(self, policy: NetworkPolicy, ask: Asker | None = None,
                 on_refusal: Callable[[str, str], None] | None = None,
                 hermes_pid: Callable[[], int | None] = lambda: None):
        self.policy, self.ask, self.on_refusal, self.hermes_pid = policy, ask, on_refusal, hermes_pid
        self.decided_for_job: dict[str, bool] = {}
        self.ask_lock = threading.Lock()
        self.refusals: list[str] = []
        self.refused_count = self.allowed_count = 0
        self.lock = threading.Lock()
        self.slots = threading.BoundedSemaphore(CONNECTIONS_MAX)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port: int = self.listener.getsockname()[1]
        self.closed = False
        self.own_network = False  # it listens inside the job's own network namespace (namespace_channel)
        threading.Thread(target=self._accept, args=(self.listener,), name="job-proxy", daemon=True).start()

    def close(self) -> None:
        with self.lock:
            self.closed = True
        stop_listening(self.listener)

    def namespace_channel(self) -> int:
        """A descriptor for the sandbox's step (sandbox.hand_listener), which sends on it the socket listening
        on this proxy's port inside the job's own network namespace; the proxy then accepts there instead of on
        this machine's loopback. Nothing sent (no namespace could be made): it goes on here."""
        ours, theirs = socket.socketpair()
        threading.Thread(target=self._take_listener, args=(ours,), name="job-proxy-namespace", daemon=True).start()
        return theirs.detach()

    def _take_listener(self, channel: socket.socket) -> None:
        with channel:
            try:
                _, descriptors, _, _ = socket.recv_fds(channel, 64, 1)
            except OSError:
                return
        if not descriptors:
            return
        try:
            inside = socket.socket(fileno=descriptors[0])
        except OSError:  # not a socket: nothing to accept on
            os.close(descriptors[0])
            return
        if inside.family != socket.AF_INET or not inside.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            inside.close()
            return
        with self.lock:
            if self.closed:
                inside.close()
                return
            outside, self.listener, self.own_network = self.listener, inside, True
        stop_listening(outside)
        threading.Thread(target=self._accept, args=(inside,), name="job-proxy", daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while not self.closed:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            if not self.slots.acquire(blocking=False):
                with contextlib.suppress(OSError):
                    client.sendall(b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n\r\n")
                client.close()
                continue
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            client.settimeout(HEAD_TIMEOUT_S)
            head, rest = read_head(client)
            method, target, version, headers = parse_head(head)
            if method == "CONNECT":
                host, port = split_host_port(target)
                if port is None:
                    raise Refusal("400 Bad Request", f"CONNECT {shown(target, 100)} names no port")
                upstream = self._open(host, port, client)
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                first = rest
            else:
                parts = urlsplit(target)
                if parts.scheme != "http" or not parts.hostname:
                    raise Refusal("400 Bad Request", "only absolute http:// URLs and CONNECT are proxied")
                host, port = split_host_port(parts.netloc.rpartition("@")[2])
                upstream = self._open(host, port or 80, client)
                path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
                kept = [line for line in headers if not line.lower().startswith((b"proxy-", b"connection:"))]
                first = b"\r\n".join([f"{method} {path} {version}".encode(), *kept, b"Connection: close", b"", b""])
                first += rest
            with upstream:
                if first:
                    upstream.sendall(first)
                relay(client, upstream)
        except Refusal as refusal:
            with contextlib.suppress(OSError):
                body = f"refused by claude-hermes-bridge: {refusal.why}\n".encode()
                client.sendall(f"HTTP/1.1 {refusal.status}\r\nContent-Type: text/plain\r\nContent-Length: "
                               f"{len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        except (OSError, ValueError):
            pass
        finally:
            client.close()
            self.slots.release()

    def _open(self, host: str, port: int, client: socket.socket) -> socket.socket:
        """The connection to host:port if the policy allows it, else Refusal (recorded)."""
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        is_model = self.policy.is_model(host, port)
        rule = None if is_model else self.policy.listed(host, port)
        if not is_model and rule is None:
            # Hermes' own process fetches by itself at every start (its update check on PyPI, model metadata from
            # models.dev and openrouter.ai, its catalog on GitHub): under ask only the tools it runs are asked
            # about, or every job would open with questions nobody asked for; in every mode the refusal says whose
            hermes_own = self.from_hermes(client) or (host in HERMES_START_HOSTS and not CAN_TELL_HERMES)
            asking = self.policy.mode == "ask" and not hermes_own
            if asking and self._asked(where):
                rule = HostRule(host, port)
            else:
                why = ("not Hermes' model (network: model-only)" if self.policy.mode == "model-only"
                       else "not on network_allow" + (" and not allowed when asked" if asking else ""))
                if hermes_own:
                    why += "; Hermes' own request, not a tool's" + (": not asked about" if self.policy.mode == "ask"
                                                                    else "")
                raise self._refuse(where, why)
        try:
            found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise self._refuse(where, f"its name does not resolve ({exc.strerror or exc})") from None
        addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in found]
        local_allowed = is_model or (rule is not None and rule.exact and (is_address(host) or host == "localhost"))
        if not local_allowed and (inside := next((a for a in addresses if is_internal(a)), None)):
            raise self._refuse(where, f"it resolves to {inside}, an address on this machine or its network")
        last: OSError | None = None
        for family, kind, proto, _, address in found:
            upstream = socket.socket(family, kind, proto)
            upstream.settimeout(CONNECT_TIMEOUT_S)
            try:
                upstream.connect(address)
            except OSError as exc:
                upstream.close()
                last = exc
                continue
            with self.lock:
                self.allowed_count += 1
            return upstream
        raise Refusal("502 Bad Gateway", f"{where} could not be reached ({last})")

    def from_hermes(self, client: socket.socket) -> bool:
        """Whether the request comes from Hermes' own process rather than a tool it runs (Linux: the client's
        socket among Hermes' descriptors; elsewhere, or when it cannot be told, False)."""
        pid = self.hermes_pid()
        return pid is not None and socket_owned_by(client.getpeername()[1], pid)

    def hand_over(self, ask: Asker, on_refusal: Callable[[str, str], None],
                  hermes_pid: Callable[[], int | None]) -> None:
        """The proxy made a job's: its questions, refusals and Hermes from now on are the job's; what was decided
        or refused before (a warm Hermes' own start-up requests, asked of nobody) is forgotten."""
        with self.ask_lock, self.lock:
            self.ask, self.on_refusal, self.hermes_pid = ask, on_refusal, hermes_pid
            self.decided_for_job.clear()
            self.refusals.clear()
            self.refused_count = 0

    def _asked(self, where: str) -> bool:
        """Whether the user allows this request: asked one question at a time, so requests to one host wait for
        one answer; allow_for_job holds for the job's later requests there, deny (or no answer) too."""
        with self.ask_lock:
            if where in self.decided_for_job:
                return self.decided_for_job[where]
            decision = self.ask(where) if self.ask is not None else "deny"
            if decision != "allow":
                self.decided_for_job[where] = decision == "allow_for_job"
            return decision in ("allow", "allow_for_job")

    def _refuse(self, where: str, why: str) -> Refusal:
        with self.lock:
            self.refused_count += 1
            entry = f"{where} ({why})"
            if entry not in self.refusals and len(self.refusals) < REFUSALS_KEPT:
                self.refusals.append(entry)
        if self.on_refusal:
            self.on_refusal(where, why)
        return Refusal("403 Forbidden", f"{where}: {why}")


def stop_listening(listener: socket.socket) -> None:
    """The listener closed, its accept() woken."""
    with contextlib.suppress(OSError):
        listener.shutdown(socket.SHUT_RDWR)
    listener.close()


def socket_owned_by(local_port: int, pid: int) -> bool:
    """Whether process pid holds the TCP socket bound to 127.0.0.1:local_port (its inode in the TCP table of
    pid's network, which is its own under a limited network, among the process's descriptors). False wherever
    /proc cannot tell."""
    wanted = f"0100007F:{local_port:04X}"
    try:
        with open(f"/proc/{pid}/net/tcp") as table:
            inodes = {fields[9] for fields in (line.split() for line in table.readlines()[1:])
                      if len(fields) > 9 and fields[1] == wanted}
        if not inodes:
            return False
        for descriptor in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{descriptor}")[len("socket:["):-1] in inodes:
                    return True
    except OSError:
        return False
    return False


def read_head(client: socket.socket) -> tuple[bytes, bytes]:
    """The request's head (up to the blank line) and what came after it in the same reads."""
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > HEAD_MAX_BYTES:
            raise Refusal("431 Request Header Fields Too Large", "a request head past 64 KiB")
        chunk = client.recv(8192)
        if not chunk:
            raise OSError("the client closed before its request")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def parse_head(head: bytes) -> tuple[str, str, str, list[bytes]]:
    lines = head.split(b"\r\n")
    parts = lines[0].decode("latin-1").split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise Refusal("400 Bad Request", "not an HTTP request")
    return parts[0].upper(), parts[1], parts[2], lines[1:]


def relay(one: socket.socket, other: socket.socket) -> None:
    """Bytes both ways until either side closes or nothing moves for IDLE_TIMEOUT_S."""
    one.setblocking(False)
    other.setblocking(False)
    peers = {one: other, other: one}
    open_ends = {one, other}
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while open_ends and time.monotonic() < deadline:
        readable, _, _ = select.select(list(open_ends), [], [], 1.0)
        for source in readable:
            try:
                data = source.recv(65536)
            except BlockingIOError:
                continue
            if not data:
                open_ends.discard(source)
                with contextlib.suppress(OSError):
                    peers[source].shutdown(socket.SHUT_WR)
                continue
            peers[source].setblocking(True)
            peers[source].sendall(data)
            peers[source].setblocking(False)
            deadline = time.monotonic() + IDLE_TIMEOUT_S


# listen() is not refused: seccomp cannot tell a TCP socket's from a Unix socket's, and Hermes' own code tool
# listens on a Unix socket (0.22.2, tools/code_kernel.py); a listen() on a TCP socket never bound gets a free port,
# which only a network namespace of the job's own keeps from the world (JobProxy.own_network).
ENFORCED_LINUX = ("Landlock: TCP connections to the proxy's port only, no port bound by the job (a listen() without "
                  "a bind still gets a free port); seccomp: no UDP, raw or other sockets, no io_uring")
ENFORCED_OWN_NETWORK = ("a network of its own: only a loopback, where the proxy listens, so nothing outside reaches "
                        "a port it listens on; Landlock: TCP connections to the proxy's port only, no port bound by "
                        "the job; seccomp: no UDP, raw or other sockets, no io_uring")


def enforcement(sandboxed: bool, platform: str = sys.platform) -> tuple[bool, str]:
    """Whether the operating system holds a sandboxed job to its proxy here, and how (or why not), in words."""
    if not sandboxed:
        return False, "the job is not sandboxed, so only tools that honour HTTPS_PROXY use the proxy"
    if platform == "darwin":
        return True, "Seatbelt: the network only to the proxy's port"
    if platform == "win32":
        return False, "Windows has no mechanism the bridge applies"
    abi = landlock_abi()[0]
    if abi < NETWORK_ABI:
        return False, f"Landlock ABI {abi} here has no network rules (ABI {NETWORK_ABI}, Linux 6.7)"
    return True, ENFORCED_LINUX


def support_line(mode: str, sandbox_mode: str, allowed: list[str] | None = None) -> str:
    """What a job's network is on this machine under these settings (and, given network_allow, the hosts it
    may reach without a question), for hermes_health and --check."""
    if mode == "open":
        return "open (setting network: open): a job reaches any host; ask, allow-list or model-only limit it"
    listed = "" if mode == "model-only" or allowed is None else (
        f"; allowed without a question: Hermes' model and {', '.join(allowed)}" if allowed else
        "; allowed without a question: Hermes' model alone (network_allow is empty)")
    found = sandbox_mechanism()
    enforced, how = enforcement(sandbox_mode != "off" and bool(found.name))
    if enforced:
        if how == ENFORCED_LINUX and not private_devices_refusal():
            how = ENFORCED_OWN_NETWORK
        return f"{mode}, enforced here ({how}){listed}"
    refused = "every job is refused (sandbox: required)" if sandbox_mode == "required" else "not enforced"
    return f"{mode}: {refused} ({how}){listed}"
