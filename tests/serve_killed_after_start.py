"""A test-only `suzumio serve` (tests/test_crash.py): the runner listener's app is wrapped so that the
process SIGKILLs itself once `/runner/tool-calls/start` has committed its rows and before its answer is
written, the window a real crash hits only by chance. Same arguments as suzumio.py; nothing else differs."""
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import suzumio
import suzumio_runner_support

KILLED_ROUTE = "/runner/tool-calls/start"


def killed_after_commit(app):
    """`app`, except that a 200 answer of KILLED_ROUTE never leaves: the route ran (its transaction
    committed) and the process dies before the response is written."""
    def application(environ, start_response):
        if environ.get("PATH_INFO") != KILLED_ROUTE:
            return app(environ, start_response)
        answer = []
        body = app(environ, lambda status, headers, exc_info=None: answer.append((status, headers, exc_info)))
        if answer and answer[0][0].startswith("200 "):
            print(f"serve_killed_after_start: SIGKILL after the committed {KILLED_ROUTE}", file=sys.stderr,
                  flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        start_response(*answer[0])
        return body

    return application


def main():
    make_runner_app = suzumio_runner_support.make_runner_app
    suzumio_runner_support.make_runner_app = lambda *args, **kwargs: killed_after_commit(
        make_runner_app(*args, **kwargs))
    return suzumio.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
