"""A test-only `suzumio serve` (tests/test_crash.py): the store facade's `store.sendMessage` callback is
wrapped so that the process SIGKILLs itself once the send has committed and before its answer reaches
the toolpack, the window between a scheduler toolpack's send and its state save that a real crash hits
only by chance. Same arguments as suzumio.py; nothing else differs."""
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import suzumio
import suzumio_toolpacks


def main():
    send = suzumio_toolpacks.facade_send_message

    def send_then_die(store, config, data):
        message = send(store, config, data)
        print(f"serve_killed_after_scheduled_send: SIGKILL after the committed {message['id']}", file=sys.stderr,
              flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    suzumio_toolpacks.facade_send_message = send_then_die
    return suzumio.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
