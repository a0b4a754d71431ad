"""Run every bench under bench/ in its own process, one after the other, and print one table of their
figures and ratios (each ratio measured side by side with its baseline in the same bench run).
Usage: .venv/bin/python bench/run_all.py [--skip-docker] [--quick]"""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from benchlib import JSON_PREFIX, format_value

HERE = Path(__file__).resolve().parent
BENCHES = (
    ("activation_overhead.py", [], ["--runs", "5"]),
    ("api_throughput.py", [], ["--messages", "800"]),
    ("scheduler_tick.py", [], ["--passes", "7"]),
    ("message_ingest.py", [], ["--messages", "500", "--rounds", "2"]),
    ("durable_commits.py", [], ["--messages", "300", "--reports", "60", "--rounds", "2"]),
    ("sse_fanout.py", [], ["--events", "60", "--burst", "2000"]),
    ("history_paging.py", [], ["--repeat", "15"]),
    ("egress_latency.py", [], ["--runs", "60"]),
    ("egress_credentials.py", [], ["--runs", "60"]),
    ("guard_overhead.py", [], ["--starts", "300", "--rounds", "2"]),
    ("runner_listener.py", [], ["--runs", "100"]),
    ("recorder_cost.py", [], ["--runs", "7"]),
    ("repository_cost.py", [], ["--files", "2000", "--merges", "4", "--repeat", "3"]),
    ("model_stream.py", [], ["--runs", "10", "--rounds", "1"]),
)


def run(script, extra):
    command = [sys.executable, str(HERE / script), "--json", *extra]
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    took = time.monotonic() - started
    for line in result.stdout.splitlines():
        if not line.startswith(JSON_PREFIX):
            print(f"  {line}", flush=True)
    rows = [json.loads(line[len(JSON_PREFIX):]) for line in result.stdout.splitlines() if line.startswith(JSON_PREFIX)]
    if not rows:
        sys.stderr.write(f"{script} printed no results (exit {result.returncode}):\n{result.stdout}{result.stderr}\n")
        return [{"bench": script[:-3], "measure": "FAILED (see above)", "value": 0.0, "unit": "s", "baseline": None,
                 "ratio": None, "target": None, "higherIsBetter": False, "verdict": "MISSED"}]
    print(f"# {script}: {took:.0f} s", flush=True)
    return rows[0]


def table(rows):
    header = f"| {'bench':20s} | {'measure':58s} | {'value':>12s} | {'baseline':>12s} | {'ratio':>7s} | target |"
    lines = [header, "|" + "|".join("-" * (len(cell)) for cell in header.split("|")[1:-1]) + "|"]
    for row in rows:
        ratio = f"{row['ratio']:.2f}x" if row["ratio"] is not None else ""
        baseline = format_value(row["baseline"], row["unit"]) if row["baseline"] is not None else ""
        target = ""
        if row["target"] is not None:
            target = f"{'>=' if row['higherIsBetter'] else '<='} {row['target']}x {row['verdict']}"
        lines.append(f"| {row['bench']:20s} | {row['measure']:58s} | {format_value(row['value'], row['unit']):>12s} "
                     f"| {baseline:>12s} | {ratio:>7s} | {target} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-docker", action="store_true")
    parser.add_argument("--quick", action="store_true",
                        help="smaller sample counts (a rough look, not for BENCHMARKS.md)")
    options = parser.parse_args(argv)
    rows = []
    for script, full, quick in BENCHES:
        extra = list(quick if options.quick else full)
        if script == "activation_overhead.py" and options.skip_docker:
            extra.append("--skip-docker")
        rows += run(script, extra)
    print(table(rows))
    return 1 if any(row["verdict"] == "MISSED" for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
