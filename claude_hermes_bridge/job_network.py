"""[supervisor] One job's network as its supervisor runs it: the policy from the settings, whether this machine
enforces it, the job's proxy (network.JobProxy), its questions under `network: ask` (asked on the channel
Hermes' own questions use: the record's questions, the answers file), its refusals audited and said."""
import dataclasses
import os
import queue
import threading
import time

from .config import Config, audit
from .jobs import ANSWERERS, NETWORK_QUESTION_PREFIX, QUESTIONS_KEPT, JobRecord, JobStore
from .network import ENFORCED_OWN_NETWORK, JobProxy, NetworkPolicy, enforcement, job_policy
from .safe_io import machine_clock, plural, shown

NETWORK_QUESTIONS_MAX = 10  # per job; past it every other host is refused unasked (a job must not flood the user)


def network_question(where: str) -> str:
    """A network question's words, the host first and whole (a name is at most 253 characters; escaped where
    shown), and what allowing it means."""
    return (f"connect to {where}, a host not on network_allow. Allowing it lets the job send that host anything it "
            "can read and run what it fetches from it, for the rest of this job")


@dataclasses.dataclass
class Ask:
    """A question from a proxy thread, waiting for the supervisor's poll to answer it."""

    where: str
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    decision: str = "deny"
    question_id: str = ""


class JobNetwork:
    """Started in the supervisor's plan (start), polled with the job (pump), closed at its end (close). Proxy
    threads never touch the record: their questions and refusals come through queues the poll empties."""

    def __init__(self, cfg: Config, store: JobStore, record: JobRecord):
        self.cfg, self.store, self.record = cfg, store, record
        self.policy: NetworkPolicy | None = None
        self.proxy: JobProxy | None = None
        self.enforced, self.how = False, ""
        self.asks: queue.Queue[Ask] = queue.Queue()
        self.waiting: dict[str, Ask] = {}
        self.refusals: queue.Queue[tuple[str, str]] = queue.Queue()
        self.asked = self.unasked = 0
        self.shown: tuple[int, bool] = (-1, False)  # the refusals and own network NETWORK says

    def start(self, sandboxed: bool, warm_proxy: JobProxy | None = None) -> str | None:
        """The proxy started (or, for a warm start, the one its Hermes was started behind, taken over) and
        record.network said; the reason to refuse the job when the sandbox is required and this machine cannot
        hold the job to its proxy."""
        mode = self.record.network_mode or self.cfg.network
        if mode == "open":
            self.record.network = "open (setting network: open): the job reaches any host"
            return None
        self.enforced, self.how = enforcement(sandboxed)
        if not self.enforced and self.cfg.sandbox == "required":
            return (f"network {mode} cannot be enforced here ({self.how}) and the sandbox is required; Hermes was "
                    "not started. Set network to open, or sandbox to auto to run with an advisory proxy")
        self.proxy = warm_proxy or JobProxy(job_policy(mode, self.cfg.network_allow, self.cfg.hermes_home_path))
        self.policy = self.proxy.policy
        self.proxy.hand_over(self._ask, lambda where, why: self.refusals.put((where, why)),
                             lambda: self.record.hermes.pid if self.record.hermes else None)
        self._say()
        return None

    def close(self) -> None:
        """At the job's end: the proxy closed, a question still waiting denied (nobody is asked any more)."""
        if self.proxy is None:
            return
        self.pump()
        self.proxy.close()
        for question_id, ask in list(self.waiting.items()):
            self._decide(ask, "deny", "nobody: the job ended while the question waited")
            self.record.questions = [q for q in self.record.questions if q["id"] != question_id]
        self.waiting.clear()

    def pump(self) -> bool:
        """Questions asked and answered, refusals audited, the NETWORK words brought up to date; whether the
        record changed."""
        if self.proxy is None:
            return False
        changed = self._new_questions() | self._answers()
        while not self.refusals.empty():
            where, why = self.refusals.get()
            audit(self.cfg, event="network", job_id=self.record.id, refused=where, why=why)
        if (self.proxy.refused_count, self.proxy.own_network) != self.shown:
            self._say()
            changed = True
        return changed

    def _say(self) -> None:
        proxy, policy = self.proxy, self.policy
        assert proxy is not None and policy is not None
        self.shown = (proxy.refused_count, proxy.own_network)
        how = ENFORCED_OWN_NETWORK if proxy.own_network else self.how
        enforced = how if self.enforced else f"not enforced: {how}"
        refused = (f"; {plural(proxy.refused_count, 'request')} refused: " + ", ".join(proxy.refusals[:8])
                   + (" ..." if len(proxy.refusals) > 8 else "")
                   + ". To allow a host, add it to network_allow (or set network: open)") if proxy.refused_count else ""
        unasked = (f"; {NETWORK_QUESTIONS_MAX} network questions asked, the most a job may ask: {self.unasked} more "
                   "hosts were refused unasked") if self.unasked else ""
        self.record.network = shown(f"{policy.words()} through the job's proxy ({enforced}){refused}{unasked}", 1500)

    def _ask(self, where: str) -> str:
        """In a proxy thread: the user's decision about where, or deny when no answer came in time."""
        ask = Ask(where)
        self.asks.put(ask)
        ask.done.wait(self.cfg.approval_timeout_s + 5)
        return ask.decision

    def _new_questions(self) -> bool:
        changed = False
        while not self.asks.empty():
            ask = self.asks.get()
            self.asked += 1
            ask.question_id = f"{NETWORK_QUESTION_PREFIX}{self.asked}-{os.urandom(3).hex()}"
            what = network_question(ask.where)
            if self.asked > NETWORK_QUESTIONS_MAX:
                self.unasked += 1
                self._decide(ask, "deny", f"the bridge: this job had asked {NETWORK_QUESTIONS_MAX} network questions "
                             "already, so any other host is refused unasked")
                self._say()
                continue
            if len(self.record.questions) >= QUESTIONS_KEPT:
                self._decide(ask, "deny", f"the bridge: {len(self.record.questions):,} questions were already waiting")
                continue
            now = time.time()
            timeout = self.cfg.approval_timeout_s
            self.record.questions.append({"id": ask.question_id, "what": what, "asked_at": now,
                                          "expires_at": now + timeout, "expires_clock": machine_clock() + timeout})
            self.waiting[ask.question_id] = ask
            changed = True
        return changed

    def _answers(self) -> bool:
        if not self.waiting:
            return False
        answers = self.store.answers_file(self.record.id)[0]
        changed = False
        for question in [q for q in self.record.questions if q["id"] in self.waiting]:
            given = answers.get(question["id"])
            if given is not None:
                self._decide(self.waiting.pop(question["id"]), given["decision"],
                             ANSWERERS.get(given["by"], ANSWERERS["planner"]))
            elif machine_clock() > question["expires_clock"]:
                self._decide(self.waiting.pop(question["id"]), "deny",
                             f"no answer within {self.cfg.approval_timeout_s:g} s")
            else:
                continue
            self.record.questions = [q for q in self.record.questions if q["id"] != question["id"]]
            changed = True
        return changed

    def _decide(self, ask: Ask, decision: str, by: str) -> None:
        what = f"connect to {ask.where}"
        self.record.add_decision({"id": ask.question_id, "what": what, "decision": decision, "by": by,
                                  "at": time.time()})
        audit(self.cfg, event="decision", job_id=self.record.id, approval_id=ask.question_id, decision=decision,
              by=by, what=what)
        ask.decision = decision
        ask.done.set()
