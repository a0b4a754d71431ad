"""Byte relays between loopback TCP ports and Unix sockets, for test_sandbox only. They stand in for
the runner socket while the runner still reaches the controller (and the model) over TCP: a container
with network `none` gets the socket folder as a mount, and this file, delivered as its
suzumio_runner.py, listens on the container's own 127.0.0.1 for each `<port>.sock` it finds there, then
runs the real runner (mounted at REAL_RUNNER). The test side serves each socket with `serve_port`.
Standard library only: it runs inside the runner image."""
import glob
import os
import runpy
import socket
import sys
import threading

RELAY_DIR = "/mnt/relay"
REAL_RUNNER = "/mnt/real-runner/suzumio_runner.py"


def _pump(source, target, done):
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            target.sendall(data)
    except OSError:
        pass
    finally:
        try:
            target.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        done()


def splice(a, b):
    """Copy bytes both ways between two connected sockets; close both when both directions ended."""
    remaining = [2]
    lock = threading.Lock()

    def done():
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
        if last:
            a.close()
            b.close()

    for source, target in ((a, b), (b, a)):
        threading.Thread(target=_pump, args=(source, target, done), daemon=True).start()


def _accept_forever(listener, connect):
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return  # the listener was closed
        try:
            upstream = connect()
        except OSError:
            client.close()
            continue
        splice(client, upstream)


def serve_port(directory, port):
    """Serve `<directory>/<port>.sock`: each connection is relayed to 127.0.0.1:<port>. Returns the
    listening socket; closing it ends the relay."""
    path = os.path.join(directory, f"{port}.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o666)  # the container's unprivileged uid connects to it
    listener.listen(16)
    threading.Thread(target=_accept_forever, daemon=True, name=f"relay-{port}",
                     args=(listener, lambda: socket.create_connection(("127.0.0.1", port), timeout=30))).start()
    return listener


def _relay_socket_to_loopback(path):
    port = int(os.path.basename(path).split(".")[0])
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind(("127.0.0.1", port))
    except OSError:
        listener.close()  # the port answers already: this container has a network
        return

    def connect():
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        upstream.connect(path)
        return upstream

    listener.listen(16)
    threading.Thread(target=_accept_forever, args=(listener, connect), daemon=True).start()


def main():
    for path in sorted(glob.glob(os.path.join(RELAY_DIR, "*.sock"))):
        _relay_socket_to_loopback(path)
    sys.argv[0] = REAL_RUNNER
    runpy.run_path(REAL_RUNNER, run_name="__main__")


if __name__ == "__main__":
    main()
