"""`suzumio eval` and `suzumio evals` (docs/evals.md#running-an-eval): the suite (or a Harbor folder) is read and
checked here, the eval written to the root's evals database, and the root's running `serve` runs it; this
command follows its progress, then prints the table (or `--json`), writes `--junit` and answers the exit
code: 0 ran and nothing regressed, 1 a regression or a rate under --fail-under, 2 a bad suite."""
import os
import time
from xml.etree import ElementTree

import suzumio_eval_runner
import suzumio_evals
from suzumio_errors import ConfigError, SuzumioError
from suzumio_store_evals import EVAL_DONE, EvalStore

POLL_SECONDS = 0.5
EXIT_REGRESSION = 1
EXIT_BAD_SUITE = 2


def cmd_eval(rest, options, out, err, root_path, serving, print_json):
    """Run one eval to its end on the root's serve (`serving()`: whether one listens there now)."""
    try:
        if options.harbor is not None:
            suite, notes = suzumio_evals.read_harbor(options.harbor, team=getattr(options, "team", None))
            for line in notes + missing_images(suite):
                print(f"Warning: {line}", file=err)
        else:
            suite = suzumio_evals.read_suite(rest[0])
        runs = parse_runs(options.runs)
        fail_under = parse_rate(options.fail_under)
    except suzumio_evals.SuiteError as error:
        print(f"Error: {error.first}", file=err)
        return EXIT_BAD_SUITE
    except ConfigError as error:
        print(f"Error: {error.message.splitlines()[0]}", file=err)
        return EXIT_BAD_SUITE
    if not serving():
        raise SuzumioError(f"No serve is running for the root {root_path}; start `suzumio serve --root "
                           f"{root_path}` (evals run there)")
    store = EvalStore(root_path)
    try:
        try:
            eval_id = suzumio_eval_runner.submit(
                store, suite, runs=runs, variants=options.variant or (), mode=options.mode or "live",
                source=getattr(options, "from"), at=options.at, baseline=options.baseline, fail_under=fail_under)
        except suzumio_evals.SuiteError as error:
            print(f"Error: {error.first}", file=err)
            return EXIT_BAD_SUITE
        print(f"Eval {eval_id}: {suite['name']}", file=err, flush=True)
        document = follow(store, eval_id, err, serving)
    finally:
        store.close()
    if options.junit:
        write_junit(document, options.junit)
    if options.json:
        print_json(public(document), out)
    else:
        out.write(table(document))
    return exit_code(document)


def cmd_evals(rest, options, out, err, root_path, print_json):
    store = EvalStore(root_path)
    try:
        rows = suzumio_eval_runner.listing(store)
    finally:
        store.close()
    if options.json:
        print_json(rows, out)
        return 0
    for row in rows:
        print(f"{row['id']}  {row['suite']}  {row['mode']}  {row['status']}  {row['passed']}/{row['runs']} passed",
              file=out)
    return 0


def missing_images(suite):
    """A line per task whose check needs an image this machine does not have (its check then fails)."""
    images = {grader["image"]: task["id"] for task in suite["tasks"] for grader in task["graders"] if "image" in grader}
    if not images:
        return []
    client = suzumio_eval_runner.docker_client()
    lines = []
    for image, task in images.items():
        if client is None or not image_present(client, image):
            lines.append(f"{task}: needs the image {image}, which this machine does not have; its check will fail")
    return lines


def image_present(client, image):
    import suzumio_docker

    try:
        client.images.get(image)
        return True
    except suzumio_docker.engine_errors():
        return False


def parse_runs(text):
    if text is None:
        return None
    if not text.isdigit() or int(text) < 1:
        raise suzumio_evals.SuiteError("--runs", f"--runs: expected a whole number of at least 1, not {text}")
    return int(text)


def parse_rate(text):
    if text is None:
        return None
    try:
        rate = float(text)
    except ValueError:
        rate = -1.0
    if not 0 <= rate <= 1:
        raise suzumio_evals.SuiteError("--fail-under", f"--fail-under: expected a rate from 0 to 1, not {text}")
    return rate


def follow(store, eval_id, err, serving):
    """Wait for the eval to end, writing a progress line to `err` whenever it changes; a serve that
    stops meanwhile ends the wait (the eval goes on when serve runs again)."""
    last = None
    while True:
        document = suzumio_eval_runner.document(store, eval_id)
        progress = document["progress"]
        cost = f", ${progress['costUsd']:.4f}" if progress["costUsd"] else ""
        line = (f"{progress['done']}/{progress['runs']} runs done, {progress['passed']} passing, "
                f"{progress['tokens']} tokens{cost}")
        if line != last:
            print(line, file=err, flush=True)
            last = line
        if document["status"] == EVAL_DONE:
            return document
        if not serving():
            raise SuzumioError(f"serve stopped; eval {eval_id} goes on when it runs again (suzumio evals)")
        time.sleep(POLL_SECONDS)


def public(document):
    """The --json document (docs/evals.md#results)."""
    return {key: document[key] for key in ("id", "suite", "mode", "status", "baseline", "results", "regressions",
                                           "under", "changes")}


def exit_code(document):
    return EXIT_REGRESSION if document["regressions"] or document["under"] else 0


def _number(value, digits=0):
    return "-" if value is None else f"{value:.{digits}f}"


def table(document):
    """The result table per task and variant, per-agent lines, then regressions."""
    rows = [("task", "variant", "pass", "rate", "pass@k", "pass^k", "95% interval", "tokens", "cost $",
             "activations", "wall s", "flaky")]
    agents = []
    for row in document["results"]:
        k = str(row["runs"]) if row["runs"] else None
        rows.append((row["task"], row["variant"], f"{row['passed']}/{row['runs']}", _number(row["passRate"], 2),
                     f"{_number(row['passAtK'].get(k), 2)} (k={k})" if k else "-",
                     _number(row["passPowK"].get(k), 2) if k else "-",
                     f"{row['interval'][0]:.2f}-{row['interval'][1]:.2f}",
                     f"{_number(row['tokens'])} ±{_number(row['sd']['tokens'])}",
                     _number(row["costUsd"], 4), _number(row["activations"], 1),
                     _number(None if row["wallMs"] is None else row["wallMs"] / 1000, 1),
                     "flaky" if row["flaky"] else ""))
        for agent_id, usage in row["agents"].items():
            agents.append(f"  {row['task']} {row['variant']} {agent_id}: {usage['tokens']:.0f} tokens, "
                          f"{usage['messages']:.1f} messages per run")
        for item in row["divergences"]:
            agents.append(f"  {row['task']} {row['variant']} {item['project']}: diverged at request "
                          f"{item['divergence'].get('requestIndex')} of {item['divergence'].get('activationId')}")
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines += agents
    for change in document["regressions"]:
        lines.append(f"REGRESSION {change['task']} {change['variant']}: {change['from']:.2f} -> {change['to']:.2f} "
                     f"(p={change['p']:.3f})")
    for change in document["changes"]:
        if change["worse"] or change["better"]:
            lines.append(f"{'WORSE' if change['worse'] else 'BETTER'} {change['task']} {change['variant']} than "
                         f"{change['baseline']}: {change['from']:.2f} -> {change['to']:.2f}")
    for item in document["under"]:
        lines.append(f"UNDER {item['task']} {item['variant']}: {item['passRate']:.2f} < {document['failUnder']}")
    lines.append(f"Eval {document['id']} ({document['mode']}): open any run with its project name in the control room")
    return "\n".join(lines) + "\n"


def write_junit(document, path):
    """JUnit XML: a test suite per task × variant, a test case per run, a failure naming the graders
    that failed with their evidence."""
    suites = ElementTree.Element("testsuites", name=document["suite"])
    for row in document["results"]:
        runs = [run for run in document["runs"] if (run["task"], run["variant"]) == (row["task"], row["variant"])]
        suite = ElementTree.SubElement(suites, "testsuite", name=f"{row['task']}.{row['variant']}",
                                       tests=str(len(runs)), failures=str(row["runs"] - row["passed"]))
        for run in runs:
            case = ElementTree.SubElement(suite, "testcase", classname=f"{row['task']}.{row['variant']}",
                                          name=f"run {run['index'] + 1} ({run['project']})",
                                          time=f"{(run['wallMs'] or 0) / 1000:.3f}")
            if not run["passed"]:
                failed = [g for g in run["grades"] if not g["passed"]]
                failure = ElementTree.SubElement(case, "failure", message=", ".join(g["kind"] for g in failed)
                                                 or (run["error"] or "failed"))
                failure.text = "\n".join(f"{g['kind']}: {g['evidence']}" for g in failed) or run["error"] or ""
    ElementTree.ElementTree(suites).write(os.fspath(path), encoding="utf-8", xml_declaration=True)
