"""A real HTTP server on 127.0.0.1 at an ephemeral port, served from a daemon thread: the shared base
of the test doubles that must be real servers (fake model, fake controller, recording proxy)."""
import threading
from http.server import ThreadingHTTPServer


class _Server(ThreadingHTTPServer):
    # A listen backlog of 128, as servers set it (socketserver's 5 drops the connections of a burst).
    request_queue_size = 128


class LocalHTTPServer:
    """Serves `handler` until close(); keyword attributes are set on the server for the handler."""

    def __init__(self, handler, name, **attributes):
        self.server = _Server(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        for key, value in attributes.items():
            setattr(self.server, key, value)
        self.thread = threading.Thread(target=self.server.serve_forever, name=name, daemon=True)
        self.thread.start()

    @property
    def port(self):
        return self.server.server_address[1]

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
