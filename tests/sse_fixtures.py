"""SseClient: a real HTTP/1.1 client of `GET /api/projects/<p>/stream` reading on its own thread,
with the service's API token. Imported by test_sse and test_providers."""
import contextlib
import http.client
import json
import socket
import threading
import time


class SseClient:
    """The stream of a served app read line by line: each event as {"id" (None for the ephemeral
    `activation.delta` frames), "event", "data", "lines", "at" (time.monotonic() of its arrival)}, each
    comment line, and every raw line."""

    def __init__(self, service, path, headers=None):
        port = service.port
        headers = {**service.auth_headers, "Host": f"127.0.0.1:{port}", **(headers or {})}
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.sock = self.connection.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.connection.request("GET", path, headers=headers)
        self.response = self.connection.getresponse()
        self.events = []
        self.comments = []
        self.raw = []
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        block = []
        try:
            while True:
                line = self.response.readline()
                if not line:
                    return
                text = line.decode("utf-8").rstrip("\r\n")
                with self._lock:
                    self.raw.append(text)
                    if text == "":
                        self._dispatch(block)
                        block = []
                    else:
                        block.append(text)
        except (OSError, ValueError, http.client.HTTPException):
            return

    def _dispatch(self, block):
        if not block:
            return
        if all(line.startswith(":") for line in block):
            self.comments.extend(block)
            return
        fields = dict(line.split(": ", 1) for line in block if not line.startswith(":"))
        self.events.append({"id": fields.get("id"), "event": fields["event"], "data": json.loads(fields["data"]),
                            "lines": block, "at": time.monotonic()})

    def snapshot(self):
        with self._lock:
            return list(self.events)

    def of(self, event_type):
        """The events of one type received so far."""
        return [event for event in self.snapshot() if event["event"] == event_type]

    def close(self):
        """Really drop the TCP connection (the reader thread still holds the socket file)."""
        with contextlib.suppress(OSError):  # the server may have closed it first
            self.sock.shutdown(socket.SHUT_RDWR)
        self.connection.close()
