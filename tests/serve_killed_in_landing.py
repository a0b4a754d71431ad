"""A test-only `suzumio serve` (tests/test_repository_crash.py): the process SIGKILLs itself at one point
of the merge queue's landing, the windows a real crash hits only by chance. SUZUMIO_TEST_KILL_AT names
it: `before-move` (the candidate commit recorded, the integration branch not yet moved), `after-move`
(moved, the landing not yet recorded) or `after-record` (recorded, the scratch copy not yet removed).
Same arguments as suzumio.py; nothing else differs."""
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import suzumio
import suzumio_merge_queue
import suzumio_repository


def die(where):
    print(f"serve_killed_in_landing: SIGKILL {where}", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def main():
    when = os.environ["SUZUMIO_TEST_KILL_AT"]
    git, merged = suzumio_repository.git, suzumio_merge_queue._merged

    def git_then_die(*args, **options):
        # The queue's move of the integration branch is the one update-ref with a "merge <request>" reason.
        moving = args[:1] == ("update-ref",) and len(args) > 2 and str(args[2]).startswith("merge ")
        if moving and when == "before-move":
            die("before the integration branch moved")
        done = git(*args, **options)
        if moving and when == "after-move":
            die(f"after the integration branch moved (update-ref exited {done.returncode})")
        return done

    def merged_then_die(*args, **kwargs):
        merged(*args, **kwargs)
        die("after the landing was recorded")

    if when == "after-record":
        suzumio_merge_queue._merged = merged_then_die
    elif when in ("before-move", "after-move"):
        suzumio_repository.git = git_then_die
    else:
        raise SystemExit(f"SUZUMIO_TEST_KILL_AT: unknown point {when!r}")
    return suzumio.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
