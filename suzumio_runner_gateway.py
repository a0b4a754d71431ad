"""The node gateway of the `swarm` backend's sealed network (docs/operations.md, "Beyond one machine"):
one per node, on the node's own network, it listens on a Unix socket in a volume that the node's
activation tasks mount read-only, and copies each connection's bytes to the runner listener's
HOST:PORT. The tasks have no other route; TLS runs end to end between runner and controller, so the
gateway never sees a token or a request. Standard library only.

Usage: python3 suzumio_runner_gateway.py SOCKET HOST PORT"""

import os
import socket
import sys

from suzumio_runner_egress import Relay

MAX_CONNECTIONS = 1024  # open connections of all the node's tasks; one more is closed at once
CONNECT_TIMEOUT_S = 5.0


class Gateway:
    def __init__(self, path, host, port):
        self.path = path
        self.target = (host, int(port))
        self.relay = Relay()

    def listen(self):
        try:
            os.unlink(self.path)  # left by the previous task of this service
        except FileNotFoundError:
            pass
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)
        # Tasks run as any user; what they can reach here is the runner listener, which checks tokens.
        os.chmod(self.path, 0o666)
        listener.listen(128)
        self.relay.listen(listener, self.accepted)
        return self

    def accepted(self, client):
        if len(self.relay.pairs) >= MAX_CONNECTIONS:
            client.close()
            return
        try:
            # A blocking connect holds the loop for at most CONNECT_TIMEOUT_S, only when the
            # listener does not answer, when no task gets through anyway.
            upstream = socket.create_connection(self.target, timeout=CONNECT_TIMEOUT_S)
        except OSError as error:
            print(f"suzumio gateway: cannot reach {self.target[0]}:{self.target[1]}: {error}", file=sys.stderr,
                  flush=True)
            client.close()
            return
        upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.relay.add(client, upstream)

    def run(self):
        while True:
            self.relay.step(60.0)


def main(argv):
    if len(argv) != 3:
        print(__doc__.rsplit("\n", 1)[-1], file=sys.stderr)
        return 2
    gateway = Gateway(*argv).listen()
    print(f"suzumio gateway: {argv[0]} -> {argv[1]}:{argv[2]}", flush=True)
    gateway.run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
