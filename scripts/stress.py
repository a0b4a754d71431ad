"""`make test-stress`: the crash, warm, SSE and end-to-end tests with the CPU saturated, run several
times. A helper starts one busy-loop process per core (what other jobs on a loaded CI host do to the
timing), runs pytest `--runs` times with them going, stops them, and prints each run's result and the
pass rate. Exit status 0 only when every run passed. Standard library only."""
import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TESTS = ["tests/test_crash.py", "tests/test_warm.py", "tests/test_sse.py", "tests/test_e2e.py",
         "tests/test_e2e_approvals.py", "tests/test_e2e_toolpacks.py", "tests/test_e2e_transport.py",
         "tests/test_e2e_replay.py", "tests/test_e2e_runaways.py"]
BUSY_LOOP = "while True: pass"


def start_load(count):
    """`count` busy-loop processes, as busy as the tests themselves."""
    return [subprocess.Popen([sys.executable, "-c", BUSY_LOOP], stdin=subprocess.DEVNULL) for _ in range(count)]


def stop_load(helpers):
    for helper in helpers:
        helper.kill()
    for helper in helpers:
        helper.wait(timeout=10)


def failure_report(output, limit=300):
    """The failures section of pytest's output (its tracebacks and summary), at most `limit` lines."""
    lines = output.splitlines()
    start = next((index for index, line in enumerate(lines) if "= FAILURES =" in line or "= ERRORS =" in line),
                 max(0, len(lines) - 40))
    shown = lines[start:]
    return "\n".join(shown if len(shown) <= limit else shown[:limit // 2] + ["..."] + shown[-limit // 2:])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=int(os.environ.get("STRESS_RUNS", "20")))
    parser.add_argument("--load", type=int, default=os.cpu_count() or 1, help="busy-loop processes")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    options = parser.parse_args(argv)
    if options.runs < 1 or options.load < 0:
        parser.error("--runs must be at least 1 and --load at least 0")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS, *options.pytest_args]
    # The Docker half of these tests is the timing that matters most: a missing engine fails the run
    # instead of skipping it (an empty SUZUMIO_REQUIRE_DOCKER in the environment allows the skip).
    env = {"SUZUMIO_REQUIRE_DOCKER": "1", **os.environ}
    passed = 0
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))  # the finally below stops the helpers
    helpers = start_load(options.load)
    try:
        for run in range(1, options.runs + 1):
            began = time.monotonic()
            result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False, env=env)
            summary = (result.stdout.strip().splitlines() or ["(no output)"])[-1]
            passed += result.returncode == 0
            print(f"run {run}/{options.runs}: exit {result.returncode} in {time.monotonic() - began:.0f} s: "
                  f"{summary}", flush=True)
            if result.returncode != 0:
                print(failure_report(result.stdout), flush=True)
    finally:
        stop_load(helpers)
    print(f"test-stress: {passed} of {options.runs} runs passed with {options.load} busy-loop helper(s)")
    return 0 if passed == options.runs else 1


if __name__ == "__main__":
    sys.exit(main())
