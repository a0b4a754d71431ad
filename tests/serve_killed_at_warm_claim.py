"""A test-only `suzumio serve` (tests/test_crash.py): the process SIGKILLs itself at the first claim of a
prepared local runner, before the runner gets its input (SUZUMIO_TEST_KILL_AT=before) or after it got
it and before its pid is recorded (=after): the windows a real crash hits only by chance. Same
arguments as suzumio.py; nothing else differs."""
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import suzumio
import suzumio_warm


def main():
    when = os.environ["SUZUMIO_TEST_KILL_AT"]
    deliver = suzumio_warm.deliver

    def deliver_then_die(slot, payload):
        if when == "after":
            deliver(slot, payload)
        print(f"serve_killed_at_warm_claim: SIGKILL {when} delivering slot {slot.id}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    suzumio_warm.deliver = deliver_then_die
    return suzumio.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
