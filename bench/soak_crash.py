"""Crash soak (`make soak`): many controller-kill trials of tests/crash_fixtures.py. Each trial runs the
crash team (pm, two workers and a scribe on the `local` backend with the scripted provider) under a real
`suzumio serve`, SIGKILLs serve 1..N times at seeded random moments while user notes are being posted,
restarts it on the same root and port, and checks the settled project: no acknowledged message lost, no
signal delivered twice, no activation left running without a runner, the project submitted.
Usage: .venv/bin/python bench/soak_crash.py [--trials 20] [--first-seed 1] [--max-kills 3] [--keep DIR]
       [--docker]   (the same team on docker-chat with the runner image)
Exits 1 when any trial failed or never settled; every trial's line and a summary are printed."""
import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))

import pytest  # wait_until reports a timeout through pytest.fail
from crash_fixtures import ChaosTrial
from provisioning_fixtures import RUNNER_IMAGE


def run_one(base, seed, options):
    """(TrialResult or None, failure text or None) for one seed; a trial that never settles is a failure."""
    try:
        result = ChaosTrial(base, seed, **options).run()
    except pytest.fail.Exception as error:
        return None, f"seed {seed}: FAILED: {error}"
    return result, None if result.ok else result.line()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--max-kills", type=int, default=3, help="kills per trial: 1..this many")
    parser.add_argument("--window", type=float, nargs=2, default=(0.0, 3.5), metavar=("MIN", "MAX"),
                        help="seconds from a (re)start to the next kill")
    parser.add_argument("--down", type=float, nargs=2, default=(0.0, 1.0), metavar=("MIN", "MAX"),
                        help="seconds serve stays down after a kill")
    parser.add_argument("--docker", action="store_true", help="run the team on docker-chat")
    parser.add_argument("--image", default=RUNNER_IMAGE, help="runner image for --docker")
    parser.add_argument("--keep", help="keep the trial roots in this directory (default: a temporary one)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args()

    options = {"max_kills": args.max_kills, "window_s": tuple(args.window), "down_s": tuple(args.down)}
    if args.docker:
        options.update(kind="docker-chat", image=args.image)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="suzumio-soak-") as scratch:
        base = Path(args.keep or scratch)
        results, failures = [], []
        for seed in range(args.first_seed, args.first_seed + args.trials):
            result, failure = run_one(base, seed, options)
            if result is not None:
                results.append(result)
                print(result.line(), flush=True)
            if failure is not None:
                failures.append(failure)
                if result is None:
                    print(failure, flush=True)
    summary = {
        "backend": options.get("kind", "local"),
        "trials": args.trials,
        "failed": len(failures),
        "kills": sum(len(r.kills) for r in results),
        "acknowledgedMessages": sum(r.acked for r in results),
        "activations": sum(r.activations for r in results),
        "runnersAliveAfterAKill": sum(r.outlived for r in results),
        "failedActivations": sum(sum(r.failures.values()) for r in results),
        "seconds": round(time.monotonic() - started, 1),
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"crash soak ({summary['backend']}): {summary['trials']} trials, {summary['failed']} failed, "
              f"{summary['kills']} kills, {summary['acknowledgedMessages']} acknowledged messages, "
              f"{summary['activations']} activations ({summary['failedActivations']} failed, "
              f"{summary['runnersAliveAfterAKill']} runners alive right after a kill) in {summary['seconds']} s")
    for failure in failures:
        print(failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
