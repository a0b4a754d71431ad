"""Running evals (docs/evals.md): an eval is written to the root's evals database (by `suzumio eval` or
`POST /api/evals`), and the one eval thread of `serve` runs it — every task × variant × N as an ordinary
project (created as `init` + `start` + the kick-off messages do, or as a replay or a fork of a recorded
run), at most `concurrency` at once per eval, each graded once it ends — and writes the grades back.
The result document (`--json`, `GET /api/evals/:id`) is built here from the stored runs."""
import logging
import re
import threading

import suzumio_config
import suzumio_coordination as coordination
import suzumio_eval_graders as graders
import suzumio_evals as evals
import suzumio_replay
from suzumio_errors import BadRequest, NotFound, SuzumioError
from suzumio_http import run_tick
from suzumio_records import PROJECT_RUNNING, parse_ts, to_datetime
from suzumio_store_evals import RUN_GRADED, RUN_PENDING, RUN_RUNNING, EvalStore

log = logging.getLogger(__name__)

TICK_SECONDS = 0.5
NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


# ------------------------------------------------------------------------------- creating an eval

def project_name(task_id, variant, index):
    """The project a run runs as (`{eval}` is filled with the eval's id): runs of one eval group by name."""
    return "{eval}." + ".".join(NAME_UNSAFE.sub("-", part) for part in (task_id, variant, str(index + 1)))


def submit(store, suite, *, runs=None, variants=(), mode="live", source=None, at=None, baseline=None,
           fail_under=None, env=None, now=None):
    """Validate `suite` (already a validated suite or a raw tree), load each chosen variant's team and
    write the eval with its pending runs; returns the eval's id. Raises SuiteError for a bad suite and
    BadRequest for options that do not fit together."""
    if "baseline" not in suite or "concurrency" not in suite:
        suite = evals.validate_suite(suite)
    if mode not in evals.MODES:
        raise BadRequest(f"mode must be one of {', '.join(evals.MODES)}")
    if mode != "live" and not source:
        raise BadRequest(f"--mode {mode} needs --from EVAL_ID (the eval whose recorded runs it uses)")
    if mode == "fork" and not at:
        raise BadRequest("--mode fork needs --at SELECTOR (e.g. pm:1, after pm's first activation)")
    if runs is not None and (isinstance(runs, bool) or not isinstance(runs, int) or runs < 1):
        raise BadRequest("runs must be a whole number of at least 1")
    teams = {name: config.data for name, config in evals.variant_configs(suite, list(variants), env).items()}
    count = runs or suite["runs"]
    if source:
        store.get_eval(source)  # NotFound before anything is written
    if baseline:
        store.get_eval(baseline)
    places = [(task["id"], variant, index, project_name(task["id"], variant, index))
              for task in suite["tasks"] for variant in teams for index in range(count)]
    options = {"runs": count, "variants": list(teams), "from": source, "at": at, "baseline": baseline,
               "failUnder": fail_under, "teams": teams}
    return store.create_eval(suite["name"], mode, suite, options, places, now=now)


# --------------------------------------------------------------------------------- the document

def results_of(store, eval_id):
    """The result rows of an eval, one per task × variant in the suite's order."""
    record = store.get_eval(eval_id)
    runs = store.runs(eval_id)
    rows = []
    for task in record["suite"]["tasks"]:
        for variant in record["options"]["variants"]:
            mine = sorted((run for run in runs if run["task"] == task["id"] and run["variant"] == variant),
                          key=lambda run: run["index"])
            rows.append(evals.summarize(task["id"], variant, mine))
    return record, runs, rows


def document(store, eval_id):
    """The eval as `--json` prints it and `GET /api/evals/:id` answers it (docs/evals.md#results)."""
    record, runs, rows = results_of(store, eval_id)
    options = record["options"]
    found = []
    if options.get("baseline"):
        _, _, before = results_of(store, options["baseline"])
        found = evals.regressions(rows, before)
    graded = [run for run in runs if run["status"] == RUN_GRADED]
    under = None
    if options.get("failUnder") is not None:
        under = [row for row in rows if row["passRate"] is not None and row["passRate"] < options["failUnder"]]
    return {"id": eval_id, "suite": record["name"], "mode": record["mode"], "status": record["status"],
            "createdAt": record["createdAt"], "finishedAt": record["finishedAt"],
            "baseline": options.get("baseline"), "baselineVariant": record["suite"].get("baseline"),
            "failUnder": options.get("failUnder"),
            "progress": {"runs": len(runs), "done": len(graded), "passed": sum(1 for r in graded if r["passed"]),
                         "tokens": sum(r["tokens"] or 0 for r in graded),
                         "costUsd": round(sum(r["costUsd"] or 0 for r in graded), 10)},
            "results": rows, "regressions": found,
            "under": [{"task": row["task"], "variant": row["variant"], "passRate": row["passRate"]}
                      for row in under or []],
            "changes": evals.variant_changes(rows, record["suite"].get("baseline")),
            "runs": [{key: run[key] for key in ("task", "variant", "index", "project", "status", "passed",
                                                "grades", "tokens", "costUsd", "activations", "wallMs",
                                                "divergence", "error")} for run in runs]}


def listing(store):
    """Every kept eval, oldest first: id, suite, mode, status, runs and passes."""
    out = []
    for record in store.list_evals():
        runs = store.runs(record["id"])
        out.append({"id": record["id"], "suite": record["name"], "mode": record["mode"], "status": record["status"],
                    "createdAt": record["createdAt"], "runs": len(runs),
                    "passed": sum(1 for run in runs if run["passed"])})
    return out


# ------------------------------------------------------------------------------------ the runner

def resolve_selector(store, selector):
    """The activation a fork starts after: an activation id; `AGENT:N`, that agent's N-th activation
    (1 the first); or `N`, the project's N-th in start order."""
    order = store.activation_ids_in_order()
    if selector in order:
        return selector
    agent, _, number = selector.rpartition(":")
    if number.isdigit() and int(number) >= 1:
        mine = [a for a in order if not agent or store.activation(a)["agentId"] == agent]
        if int(number) <= len(mine):
            return mine[int(number) - 1]
    raise BadRequest(f"--at {selector}: no such activation in {store.project_id} "
                     "(an activation id, AGENT:N or N)")


class EvalRunner:
    """The eval thread of `serve`: each tick starts pending runs up to each eval's concurrency, grades
    the runs that ended, and marks an eval done when every run is graded. `tick(now)` is one iteration."""

    def __init__(self, root, scheduler, model_proxy, sandbox=None, interval=TICK_SECONDS, on_fatal=None,
                 store=None):
        self.root = root
        self.scheduler = scheduler
        self.model_proxy = model_proxy
        self.sandbox = sandbox
        self.interval = interval
        self.on_fatal = on_fatal
        self.store = store or EvalStore(root.path)
        self._stopping = threading.Event()
        self._thread = None

    # -- the thread

    def start(self):
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="suzumio-evals", daemon=True)
        self._thread.start()
        return self

    def _run(self):
        try:
            while not self._stopping.is_set():
                self.tick()
                self._stopping.wait(self.interval)
        except BaseException as error:  # the thread's one boundary: a dead eval thread must not go unnoticed
            log.critical("eval thread died", exc_info=True)
            if self.on_fatal is None:
                raise
            self.on_fatal("evals", error)

    def stop(self):
        """Stop and join the thread; the runs' projects keep going and the next serve grades them."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def close(self):
        self.stop()
        self.store.close()

    def check_sandbox(self):
        """The check graders' sandbox: a container when an engine answers, else a scratch folder."""
        if self.sandbox is None:
            self.sandbox = graders.CheckSandbox(docker_client())
        return self.sandbox

    # -- one iteration

    def tick(self, now=None):
        for record in self.store.running_evals():
            if self._stopping.is_set():
                return
            try:
                self.tick_eval(record, now)
            except SuzumioError as error:
                log.warning("eval %s: %s", record["id"], error)

    def tick_eval(self, record, now=None):
        runs = self.store.runs(record["id"])
        tasks = {task["id"]: task for task in record["suite"]["tasks"]}
        active = 0
        for run in runs:
            if run["status"] == RUN_RUNNING:
                try:
                    if self.grade_if_ended(record, run, tasks[run["task"]], now):
                        continue
                except (SuzumioError, OSError) as error:  # the run's project is damaged: it fails, saying why
                    log.warning("eval %s run %s could not be graded: %s", record["id"], run["project"], error)
                    self.store.grade_run(run["id"], False, [], {}, error=f"not graded: {error}", now=now)
                    continue
                active += 1
        for run in runs:
            if run["status"] != RUN_PENDING or active >= record["suite"]["concurrency"]:
                continue
            self.store.start_run(run["id"], now)
            try:
                self.start_run(record, run, tasks[run["task"]], now)
            except (SuzumioError, OSError) as error:  # the run could not start: graded failed with the reason
                log.warning("eval %s run %s did not start: %s", record["id"], run["project"], error)
                self.store.grade_run(run["id"], False, [], {}, error=str(error), now=now)
                continue
            active += 1
        if all(run["status"] == RUN_GRADED for run in self.store.runs(record["id"])):
            self.store.finish_eval(record["id"], now)
            log.info("eval %s done", record["id"])

    def start_run(self, record, run, task, now=None):
        """Create the run's project and start it: live from the variant's team and the task's kick-off
        messages and inputs; replay: the same run of the `from` eval replayed, with this variant's team,
        from its recorded answers and tools (stopping where a request matches no recording); fork: the
        `from` eval's run forked after the `at` activation with this variant's team."""
        options, mode = record["options"], record["mode"]
        name = run["project"]
        data = dict(options["teams"][run["variant"]], name=name, task=task["task"])
        if task.get("repository"):
            data["repository"] = {"source": task["repository"]}
        config = suzumio_config.ProjectConfig.from_data(data)
        if mode == "live":
            store = self.root.init_project(name, config.task, config.data, config.agents, config.render(),
                                           config.render(), now=now)
            for item in task.get("inputs", []):
                target = store.artifacts_dir(item["agent"]) / item["path"]
                if store.artifacts_dir(item["agent"]).resolve() not in target.resolve().parents:
                    raise BadRequest(f"input {item['agent']}/{item['path']} leaves the agent's folder")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(item["content"], encoding="utf-8")
            store.start(now=now)
            for message in task.get("messages", []):
                recipient = message["recipient"]
                channel = recipient if recipient.startswith("#") else None
                coordination.send_message(store, config, "user", message["body"],
                                          None if channel else recipient, channel, message.get("priority"), now=now)
        else:
            source = self.source_run(options["from"], run, record)
            if mode == "replay":
                # This variant's team as the suite has it now: a changed prompt diverges, and says so.
                suzumio_replay.create_replay(self.root, source["project"], name, tools="recorded",
                                             on_diverge="stop", config_text=config.render(), now=now)
            else:
                source_store = self.root.open_project(source["project"])
                at = resolve_selector(source_store, options["at"])
                suzumio_replay.create_fork(self.root, source["project"], name, at, config_text=config.render(),
                                           now=now)
        run_tick(self.scheduler.trigger, name)

    def source_run(self, source_id, run, record):
        """The recorded run a replay or fork starts from: the same task and index of the `from` eval, and
        the same variant (a replay) or that eval's baseline variant (a fork: every variant shares it)."""
        source = self.store.get_eval(source_id)
        variant = run["variant"] if record["mode"] == "replay" else source["suite"]["baseline"]
        if variant not in source["options"]["variants"]:
            variant = source["options"]["variants"][0]
        for candidate in self.store.runs(source_id):
            if (candidate["task"], candidate["variant"], candidate["index"]) == (run["task"], variant, run["index"]):
                return candidate
        raise NotFound(f"Eval {source_id} has no run {run['task']} {variant} {run['index'] + 1}")

    def grade_if_ended(self, record, run, task, now=None):
        """Grade the run when its project ended — a status other than running, the team quiet (nothing
        running, nothing waiting), or its time limit passed (then it is stopped) — and no activation
        still runs. Returns whether it was graded."""
        now = to_datetime(now)
        try:
            store = self.root.open_project(run["project"])
        except NotFound:
            return False
        status = store.project()["status"]
        started = parse_ts(run["startedAt"])
        late = (now - started).total_seconds() * 1000 >= task["timeoutMs"]
        if store.running_activations():
            if not late:
                return False
            self.scheduler.stop_project(store, self.scheduler.backends, now)
            return False
        quiet = not store.has_pending_signals(now) and store.earliest_delayed_signal(now) is None
        if status == PROJECT_RUNNING and not (quiet or late):
            return False
        if status == PROJECT_RUNNING:
            coordination.stop(store, now)
            status = "timeout" if late else status
        ended = [a for a in (store.activation(r["id"]) for r in store.list_activations(1_000_000))
                 if a.get("completedAt")]
        last = max((parse_ts(a["completedAt"]) for a in ended), default=now)
        wall_ms = int(max(0.0, (min(last, now) - started).total_seconds()) * 1000)
        config = suzumio_config.ProjectConfig.from_data(store.config())
        view = graders.RunView(store, config, task, status, wall_ms)
        origin = store.origin()
        divergence = origin["diverged"] if origin and origin["kind"] == suzumio_replay.KIND_REPLAY else None

        def record_judgement(index, preset, rubric, request, answer, usage, score, reasons):
            self.store.record_judgement(run["id"], index, preset, rubric, request, answer, usage, score, reasons)

        recorded = None
        if record["mode"] == "replay":
            recorded = self.store.judgements(self.source_run(record["options"]["from"], run, record)["id"])
        passed, grades = graders.grade_run(view, task["graders"], sandbox=self.check_sandbox(),
                                           model_proxy=self.model_proxy, record_judgement=record_judgement,
                                           recorded_judgements=recorded)
        self.store.grade_run(run["id"], passed, grades, view.usage(), divergence=divergence, now=now)
        log.info("eval %s run %s: %s", record["id"], run["project"], "passed" if passed else "failed")
        return True


def docker_client():
    """A Docker client when an engine answers, else None (checks then run in a scratch folder)."""
    import suzumio_docker

    try:
        client = suzumio_docker.docker_sdk().from_env()
        client.ping()
        return client
    except suzumio_docker.engine_errors():
        return None

