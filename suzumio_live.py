"""Ephemeral live events: the model deltas of running activations, kept in memory per project in a small
ring, never stored and never replayed by Last-Event-ID. The model proxy publishes; the SSE hub
(suzumio_sse) sends each client what arrived after it connected. Held by the store's Root."""

import collections
import json
import threading

LIVE_BUFFER = 256
DELTA_EVENT = "activation.delta"


def live_frame(data):
    """An SSE frame without an `id:` line, so that it never moves a client's Last-Event-ID."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return f"event: {data['type']}\ndata: {text}\n\n".encode()


class LiveEvents:
    """Per project: a sequence number and the last LIVE_BUFFER frames. Publishing bumps the project's
    version in `changes` (quietly: the scheduler does not wake for a delta) so waiting streams wake."""

    def __init__(self, changes, size=LIVE_BUFFER):
        self.changes = changes
        self.size = size
        self._lock = threading.Lock()
        self._frames = {}
        self._seq = {}

    def publish(self, project_id, data, after=0):
        """`after`: the rowid of the newest stored event committed before this delta (the store's
        event_watermark), so that the stream sends the delta after that event and before later ones."""
        with self._lock:
            seq = self._seq.get(project_id, 0) + 1
            self._seq[project_id] = seq
            ring = self._frames.setdefault(project_id, collections.deque(maxlen=self.size))
            ring.append((seq, after, live_frame(data)))
        with self.changes.quiet():
            self.changes.committed(project_id)

    def cursor(self, project_id):
        """The sequence number a new client starts after: it sees only what is published from now on."""
        with self._lock:
            return self._seq.get(project_id, 0)

    def after(self, project_id, cursor):
        """([(event rowid it follows, frame)] published after `cursor`, oldest first; the new cursor).
        Frames that left the ring are skipped."""
        with self._lock:
            ring = self._frames.get(project_id) or ()
            frames = [(after, frame) for seq, after, frame in ring if seq > cursor]
            return frames, self._seq.get(project_id, cursor)
