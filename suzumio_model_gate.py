"""The controller's governor of each provider (docs/operations.md#one-provider-shared-by-a-team): per
project and provider, how many model exchanges may run at once, start in a minute and spend tokens in a
minute (`providers.<id>.limits`), and the pause a 429 or 503 with `Retry-After` puts on the provider for
every agent. Calls over a limit wait here, in the controller, urgent first (an activation woken by a P0 or
P1 signal), then oldest first. No thread of its own: whoever ends an exchange, pauses or gives up a call
admits the next ones, and the head of a queue blocked by time is woken at that time by its waiter (the
model loop's timer, or the worker thread's timed wait). Imported by suzumio_model_proxy only."""
import collections
import itertools
import logging
import math
import threading
import time
from collections import namedtuple

log = logging.getLogger(__name__)

WINDOW_S = 60.0  # requestsPerMinute and tokensPerMinute count the last minute
CHARS_PER_TOKEN = 4  # a waiting call's prompt tokens are estimated from its request body
ANNOUNCED_EXTENSION_S = 1.0  # a pause moved later by at least this is announced again
URGENT_PRIORITIES = ("P0", "P1")

REASON_CONCURRENCY = "concurrency"
REASON_RPM = "rpm"
REASON_TPM = "tpm"
REASON_PAUSED = "paused"

Limits = namedtuple("Limits", "concurrency requests_per_minute tokens_per_minute", defaults=(None, None, None))
NO_LIMITS = Limits()


def estimate_tokens(payload):
    """A cheap estimate of the prompt tokens of a request body (bytes or text): a token per 4 characters."""
    return max(1, len(payload) // CHARS_PER_TOKEN)


class Ticket:
    """One call's place at its provider's gate. `admit()` is called (from any thread, at most once per
    enter) when its exchange may start; `wake(when)` asks its waiter to call Governor.pump at monotonic
    `when`, because the head of the queue waits for time to pass (a minute's window, a pause)."""

    __slots__ = ("admit", "estimate", "key", "order", "state", "urgent", "wake")

    def __init__(self, key, urgent, order, admit, wake):
        self.key = key
        self.urgent = urgent
        self.order = order  # arrival of the call (kept by its retries, so a retry keeps its place)
        self.estimate = 0
        self.admit = admit
        self.wake = wake
        self.state = "out"  # out, waiting, running

    def rank(self):
        return (0 if self.urgent else 1, self.order)


class ProviderGate:
    """One provider of one project: the exchanges running (with their estimated tokens), the starts and
    the spent tokens of the last minute, the queue in admission order and the pause."""

    def __init__(self, limits):
        self.limits = limits
        self.running = {}  # ticket -> its estimate, counted against tokensPerMinute until it ends
        self.starts = collections.deque()  # monotonic starts within the window
        self.spent = collections.deque()  # (monotonic end, tokens) within the window
        self.queue = []
        self.paused_until = -math.inf
        self.announced_until = -math.inf

    def blocked(self, ticket, now):
        """(reason, until) that keeps `ticket` from starting now, or None; `until` is inf when only an
        exchange ending frees it."""
        if now < self.paused_until:
            return REASON_PAUSED, self.paused_until
        limits = self.limits
        if limits.concurrency is not None and len(self.running) >= limits.concurrency:
            return REASON_CONCURRENCY, math.inf
        while self.starts and self.starts[0] <= now - WINDOW_S:
            self.starts.popleft()
        if limits.requests_per_minute is not None and len(self.starts) >= limits.requests_per_minute:
            return REASON_RPM, self.starts[0] + WINDOW_S
        while self.spent and self.spent[0][0] <= now - WINDOW_S:
            self.spent.popleft()
        if limits.tokens_per_minute is not None:
            counted = sum(tokens for _end, tokens in self.spent) + sum(self.running.values())
            # Alone, a call always starts: one larger than the limit must not wait for ever.
            if counted and counted + ticket.estimate > limits.tokens_per_minute:
                return REASON_TPM, self.spent[0][0] + WINDOW_S if self.spent else math.inf
        return None


class Governor:
    """Every provider gate of the runtime, keyed by (project, provider id); thread-safe."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self._lock = threading.Lock()
        self._gates = {}
        self._orders = itertools.count()

    def ticket(self, key, priority, admit, wake):
        """A new call's ticket; `priority` is the highest priority of the signals its activation got."""
        return Ticket(key, priority in URGENT_PRIORITIES, next(self._orders), admit, wake)

    def enter(self, ticket, limits, estimate):
        """Ask for a start: answers None when the exchange may start now (admit() is not called then),
        else (reason, position) as it starts waiting; admit() follows later."""
        with self._lock:
            gate = self._gates.get(ticket.key)
            if gate is None:
                gate = self._gates[ticket.key] = ProviderGate(limits)
            gate.limits = limits  # the config may have changed since
            ticket.estimate = estimate
            now = self.clock()
            ahead = gate.queue and gate.queue[0].rank() < ticket.rank()
            if not ahead and gate.blocked(ticket, now) is None:
                self._start(gate, ticket, now)
                return None
            position = next((i for i, other in enumerate(gate.queue) if ticket.rank() < other.rank()),
                            len(gate.queue))
            reason = gate.blocked(gate.queue[0] if ahead else ticket, now) or (REASON_CONCURRENCY, math.inf)
            ticket.state = "waiting"
            gate.queue.insert(position, ticket)
            woken = self._admissions(gate, now)
            if ticket.state == "running":  # the queue moved on as it came: no wait after all
                woken = [(callback, argument) for callback, argument in woken if callback is not ticket.admit]
        self._notify(woken)
        return None if ticket.state == "running" else (reason[0], position + 1)

    def leave(self, ticket, tokens=None):
        """The ticket's exchange ended (`tokens`: prompt and completion it spent, None for none counted),
        or its call gave up while waiting; admits who may start now."""
        with self._lock:
            gate = self._gates.get(ticket.key)
            if gate is None or ticket.state == "out":
                return
            now = self.clock()
            if ticket.state == "running":
                gate.running.pop(ticket, None)
                if tokens:
                    gate.spent.append((now, tokens))
            else:
                gate.queue.remove(ticket)
            ticket.state = "out"
            woken = self._admissions(gate, now)
        self._notify(woken)

    def pause(self, key, seconds):
        """Pause a provider for `seconds` from now (a 429 or 503 with Retry-After); a pause already longer
        stays. Answers True when this is a pause to announce: a new one, or one moved later by at least
        ANNOUNCED_EXTENSION_S."""
        with self._lock:
            gate = self._gates.get(key)
            if gate is None:
                gate = self._gates[key] = ProviderGate(NO_LIMITS)
            now = self.clock()
            until = now + seconds
            if until <= gate.paused_until:
                return False
            fresh = now >= gate.paused_until
            gate.paused_until = until
            announce = fresh or until - gate.announced_until >= ANNOUNCED_EXTENSION_S
            if announce:
                gate.announced_until = until
            return announce

    def paused_for(self, key):
        """Seconds the provider stays paused (0 when it is not)."""
        with self._lock:
            gate = self._gates.get(key)
            return max(0.0, gate.paused_until - self.clock()) if gate is not None else 0.0

    def pump(self, key):
        """Admit who may start now (a waiter's wake time came)."""
        with self._lock:
            gate = self._gates.get(key)
            woken = self._admissions(gate, self.clock()) if gate is not None else []
        self._notify(woken)

    def waiting(self, key):
        """How many calls wait at a provider's gate (for tests and the control room)."""
        with self._lock:
            gate = self._gates.get(key)
            return len(gate.queue) if gate is not None else 0

    def running(self, key):
        with self._lock:
            gate = self._gates.get(key)
            return len(gate.running) if gate is not None else 0

    # -- under the lock

    def _start(self, gate, ticket, now):
        ticket.state = "running"
        gate.running[ticket] = ticket.estimate
        gate.starts.append(now)

    def _admissions(self, gate, now):
        """Start queued tickets from the head while none is blocked; answers [(callback, argument)] to run
        once the lock is released: the admitted tickets' admit, and the blocked head's wake."""
        woken = []
        while gate.queue:
            head = gate.queue[0]
            blocked = gate.blocked(head, now)
            if blocked is not None:
                if blocked[1] != math.inf:
                    woken.append((head.wake, blocked[1]))
                break
            gate.queue.pop(0)
            self._start(gate, head, now)
            woken.append((head.admit, None))
        return woken

    @staticmethod
    def _notify(woken):
        for callback, argument in woken:
            if argument is None:
                callback()
            else:
                callback(argument)
