"""Evals (docs/evals.md): a suite's schema and how it is read and checked, each variant's team as a loaded
project config, and the statistics of a result — pass@k, pass^k, the Wilson interval, the one-sided Fisher
exact test — and the result document of an eval. Pure functions over suites and graded runs; the runner
(suzumio_eval_runner) and the graders (suzumio_eval_graders) sit above."""
import math
import os
import re
import statistics
import tempfile
import tomllib
from pathlib import Path

import suzumio_config
import suzumio_config_schema as schema
import suzumio_yaml
from suzumio_errors import ConfigError
from suzumio_records import PROJECT_STATUSES

MODES = ("live", "replay", "fork")
MATCHES = ("exact", "in-order", "any-order", "subset")
GRADER_KINDS = ("status", "report", "check", "trajectory", "budget", "judge")
DEFAULT_RUNS = 1
DEFAULT_CONCURRENCY = 2
DEFAULT_TIMEOUT_MS = 600000
SIGNIFICANCE = 0.05
Z95 = 1.959963984540054


class SuiteError(ConfigError):
    """A suite that does not fit the schema; `first` is one line naming the first bad field."""

    def __init__(self, message, first):
        super().__init__(message)
        self.first = first


# --------------------------------------------------------------------------------------- the schema

_TEXT = schema._Str(nonempty=True)
_INT_GT0 = schema._Num(integer=True, gt=0)
_NUMBER_GE0 = schema._Num(ge=0)


class _Team:
    """`team`: a project file (a path, relative to the suite) or the project file inline (a mapping)."""

    def check(self, value, path, issues):
        if isinstance(value, dict) or (isinstance(value, str) and value):
            return value
        issues.add(path, "Expected a project file path or a project mapping, received "
                   + schema._type_name(value))
        return schema._INVALID


class _Pattern(schema._Str):
    def check(self, value, path, issues):
        value = super().check(value, path, issues)
        if value is not schema._INVALID:
            try:
                re.compile(value)
            except re.error as error:
                issues.add(path, f"Invalid regular expression: {error}")
                return schema._INVALID
        return value


class _ToolEntry:
    """A trajectory's tool: a name or glob (`file.*`), or {tool, arguments} whose arguments are each a value
    compared exactly or {matches: REGEX}."""

    _OBJ = schema._Obj(("tool", _TEXT, schema._REQUIRED), ("arguments", schema._Record(schema._Any()), {}))

    def check(self, value, path, issues):
        if isinstance(value, str) and value:
            return value
        if isinstance(value, dict):
            return self._OBJ.check(value, path, issues)
        issues.add(path, "Expected a tool name or {tool, arguments}, received " + schema._type_name(value))
        return schema._INVALID


class _GraderObj(schema._Obj):
    """One grader: `kind` chooses its fields (docs/evals.md#graders)."""

    def rules(self, grader, path, issues):
        kind = grader["kind"]
        needs = {"status": ("equals",), "check": ("run",), "judge": ("preset", "rubric"),
                 "trajectory": ("agent",)}.get(kind, ())
        ok = True
        for key in needs:
            if key not in grader:
                issues.add(path + [key], f"Required for a {kind} grader")
                ok = False
        if kind == "report" and ("contains" in grader) == ("matches" in grader):
            issues.add(path, "a report grader needs contains or matches (one of them)")
            ok = False
        if kind == "trajectory" and ("tools" in grader) == ("messages" in grader):
            issues.add(path, "a trajectory grader needs tools or messages (one of them)")
            ok = False
        if kind == "budget" and not any(key in grader for key in BUDGET_LIMITS):
            issues.add(path, "a budget grader needs at least one of " + ", ".join(BUDGET_LIMITS))
            ok = False
        return ok


BUDGET_LIMITS = ("maxTokens", "maxCostUsd", "maxActivations", "maxWallMs")

_GRADER = _GraderObj(
    ("kind", schema._Enum(*GRADER_KINDS), schema._REQUIRED),
    ("equals", schema._Enum(*PROJECT_STATUSES), schema._OMIT),
    ("contains", schema._Str(), schema._OMIT),
    ("matches", _Pattern(), schema._OMIT),
    ("run", _TEXT, schema._OMIT),
    ("image", _TEXT, schema._OMIT),
    ("tests", _TEXT, schema._OMIT),
    ("agent", _TEXT, schema._OMIT),
    ("tools", schema._List(_ToolEntry()), schema._OMIT),
    ("messages", schema._List(schema._Obj(("to", _TEXT, schema._REQUIRED),
                                          ("contains", schema._Str(), schema._OMIT),
                                          ("atLeast", schema._Num(integer=True, ge=0), schema._OMIT),
                                          ("atMost", schema._Num(integer=True, ge=0), schema._OMIT))),
     schema._OMIT),
    ("match", schema._Enum(*MATCHES), "in-order"),
    ("maxTokens", _NUMBER_GE0, schema._OMIT),
    ("maxCostUsd", _NUMBER_GE0, schema._OMIT),
    ("maxActivations", _NUMBER_GE0, schema._OMIT),
    ("maxWallMs", _NUMBER_GE0, schema._OMIT),
    ("preset", _TEXT, schema._OMIT),
    ("rubric", _TEXT, schema._OMIT),
    ("threshold", schema._Num(ge=0), 0.5),
)

_MESSAGE = schema._Obj(
    ("recipient", _TEXT, schema._REQUIRED),
    ("priority", schema._Enum("P0", "P1", "P2", "P3"), schema._OMIT),
    ("body", _TEXT, schema._REQUIRED),
)

# An input is a file put into an agent's artifacts folder before the run starts.
_INPUT = schema._Obj(
    ("agent", _TEXT, schema._REQUIRED),
    ("path", _TEXT, schema._REQUIRED),
    ("content", schema._Str(), schema._REQUIRED),
)

_TASK = schema._Obj(
    ("id", _TEXT, schema._REQUIRED),
    ("task", _TEXT, schema._REQUIRED),
    ("messages", schema._List(_MESSAGE), []),
    ("inputs", schema._List(_INPUT), []),
    ("repository", _TEXT, schema._OMIT),
    ("timeoutMs", _INT_GT0, DEFAULT_TIMEOUT_MS),
    ("graders", schema._List(_GRADER, nonempty=True), schema._REQUIRED),
)

_VARIANT = schema._Obj(
    ("name", _TEXT, schema._REQUIRED),
    ("patch", schema._Record(schema._Any()), {}),
)

_SUITE = schema._Obj(
    ("name", _TEXT, schema._REQUIRED),
    ("team", _Team(), schema._REQUIRED),
    ("runs", _INT_GT0, DEFAULT_RUNS),
    ("concurrency", _INT_GT0, DEFAULT_CONCURRENCY),
    ("baseline", _TEXT, schema._OMIT),
    ("variants", schema._List(_VARIANT, nonempty=True), [{"name": "default", "patch": {}}]),
    ("tasks", schema._List(_TASK, nonempty=True), schema._REQUIRED),
)


def validate_suite(tree):
    """The suite with defaults, every schema issue reported together (SuiteError), then the checks
    across fields: unique task ids and variant names, a baseline that names a variant."""
    issues = schema._Issues()
    suite = _SUITE.check(tree, [], issues)
    if not issues.items:
        for key, field in (("tasks", "id"), ("variants", "name")):
            seen = set()
            for index, item in enumerate(suite[key]):
                if item[field] in seen:
                    issues.add([key, index, field], f"Duplicate {field} {item[field]!r}")
                seen.add(item[field])
        names = [variant["name"] for variant in suite["variants"]]
        if "baseline" in suite and suite["baseline"] not in names:
            issues.add(["baseline"], f"Unknown variant {suite['baseline']!r} (variants: {', '.join(names)})")
    if issues.items:
        lines = [f"{schema._format_path(path)}: {message}" for path, message in issues.items]
        raise SuiteError("Invalid eval suite:\n" + "\n".join(f"  - {line}" for line in lines), lines[0])
    suite.setdefault("baseline", suite["variants"][0]["name"])
    return suite


def read_suite(path, env=None):
    """A suite file (YAML in the project's dialect: placeholders, `@import`, `extends`) validated, its
    `team` made an absolute path; raises SuiteError or ConfigError."""
    absolute = suzumio_yaml.lexical_abspath(os.fspath(path))
    tree = suzumio_yaml.apply_extends(suzumio_yaml.load_file(absolute, os.environ if env is None else env))
    suite = validate_suite(tree)
    if isinstance(suite["team"], str):
        suite["team"] = suzumio_yaml.lexical_abspath(suite["team"], os.path.dirname(absolute))
    return suite


def variant_config(suite, variant, env=None):
    """The loaded ProjectConfig of `variant`: the suite's team with the variant's patch merged in (maps
    merged key by key, anything else replaced); relative paths in a team file resolve beside it. Raises
    SuiteError naming `variants.<i>.patch` when the patched team is no valid project."""
    index = [v["name"] for v in suite["variants"]].index(variant["name"])
    team = suite["team"]
    try:
        if isinstance(team, str):
            tree = suzumio_yaml.apply_extends(suzumio_yaml.load_file(team, os.environ if env is None else env))
            folder = os.path.dirname(team)
        else:
            tree, folder = team, None
        merged = suzumio_yaml.apply_extends({"extends": [tree, variant["patch"]]})
        return load_tree(merged, folder, env)
    except ConfigError as error:
        field = "team" if not variant["patch"] else f"variants.{index}.patch"
        first = error.message.strip().splitlines()
        detail = first[1].strip(" -") if len(first) > 1 else first[0]
        raise SuiteError(f"{field}: {error.message}", f"{field}: {detail}") from None


def load_tree(tree, folder=None, env=None):
    """A project tree loaded through the project file pipeline: written as YAML beside the team file
    (so its relative paths mean what they meant there) or in a scratch folder, then removed."""
    text = suzumio_yaml.dump_yaml(tree)
    scratch = None
    if folder is None or not os.access(folder, os.W_OK):
        scratch = tempfile.TemporaryDirectory()
        folder = scratch.name
    handle, name = tempfile.mkstemp(prefix=".suzumio-eval-", suffix=".yaml", dir=folder)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        return suzumio_config.load_project(Path(name), env=env)
    finally:
        os.unlink(name)
        if scratch is not None:
            scratch.cleanup()


def variant_configs(suite, names=None, env=None):
    """{variant name: ProjectConfig} for the variants named (all when `names` is empty)."""
    chosen = [v for v in suite["variants"] if not names or v["name"] in names]
    unknown = sorted(set(names or ()) - {v["name"] for v in suite["variants"]})
    if unknown:
        raise SuiteError(f"variants: unknown variant {unknown[0]}", f"--variant: unknown variant {unknown[0]}")
    return {variant["name"]: variant_config(suite, variant, env) for variant in chosen}


# ------------------------------------------------------------------------------------ statistics

def pass_at_k(n, c, k):
    """The unbiased estimate that at least one of k runs drawn from n (c passed) passes."""
    if k > n or k < 1:
        raise ValueError("k must be between 1 and n")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_pow_k(n, c, k):
    """The unbiased estimate that all of k runs drawn from n (c passed) pass (pass^k)."""
    if k > n or k < 1:
        raise ValueError("k must be between 1 and n")
    return math.comb(c, k) / math.comb(n, k)


def wilson_interval(c, n, z=Z95):
    """The Wilson score interval of c successes in n trials (95% by default); (0, 1) for n = 0."""
    if n == 0:
        return (0.0, 1.0)
    p = c / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    # At c = 0 (c = n) the bound is 0 (1) exactly; rounding would leave a trace of the other term.
    return (0.0 if c == 0 else max(0.0, centre - half), 1.0 if c == n else min(1.0, centre + half))


def fisher_one_sided(base_passed, base_runs, passed, runs):
    """The one-sided Fisher exact p-value that the second pass rate is lower than the first: the
    probability, with the margins fixed, of c or fewer passes in the second group."""
    total, successes = base_runs + runs, base_passed + passed
    denominator = math.comb(total, runs)
    return sum(math.comb(successes, x) * math.comb(total - successes, runs - x)
               for x in range(0, passed + 1)) / denominator


def _mean(values):
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def _sd(values):
    """The sample standard deviation (0 for one value, None for none)."""
    values = [v for v in values if v is not None]
    return None if not values else statistics.stdev(values) if len(values) > 1 else 0.0


USAGE_FIELDS = ("tokens", "costUsd", "activations", "wallMs")


def summarize(task, variant, runs):
    """One row of the result table from a task × variant's graded runs (dicts with passed, tokens,
    costUsd, activations, wallMs, agents, project, grades); runs still going count as not run."""
    graded = [run for run in runs if run["passed"] is not None]
    n, c = len(graded), sum(1 for run in graded if run["passed"])
    graders = []
    for index, grade in enumerate(graded[0]["grades"] if graded else []):
        verdicts = [run["grades"][index]["passed"] for run in graded if index < len(run["grades"])]
        graders.append({"kind": grade["kind"], "passed": sum(verdicts), "failed": len(verdicts) - sum(verdicts)})
    agents = {}
    for run in graded:
        for agent_id, usage in (run.get("agents") or {}).items():
            agents.setdefault(agent_id, {"tokens": [], "messages": []})
            agents[agent_id]["tokens"].append(usage.get("tokens", 0))
            agents[agent_id]["messages"].append(usage.get("messages", 0))
    return {
        "task": task, "variant": variant, "runs": n, "passed": c,
        "passRate": c / n if n else None,
        "passAtK": {str(k): pass_at_k(n, c, k) for k in range(1, n + 1)},
        "passPowK": {str(k): pass_pow_k(n, c, k) for k in range(1, n + 1)},
        "interval": list(wilson_interval(c, n)),
        "flaky": 0 < c < n,
        # the means per run, and their spread (sample standard deviations) under `sd`
        **{field: _mean([run[field] for run in graded]) for field in USAGE_FIELDS},
        "sd": {field: _sd([run[field] for run in graded]) for field in USAGE_FIELDS},
        "agents": {agent_id: {"tokens": statistics.fmean(values["tokens"]),
                              "messages": statistics.fmean(values["messages"])}
                   for agent_id, values in sorted(agents.items())},
        "projects": [run["project"] for run in runs],
        "divergences": [{"project": run["project"], "divergence": run["divergence"]}
                        for run in runs if run.get("divergence")],
        "graders": graders,
    }


def regressions(results, baseline_results):
    """Each task × variant whose pass rate fell against the same task × variant of the baseline,
    significant by the one-sided Fisher exact test at p < SIGNIFICANCE."""
    before = {(row["task"], row["variant"]): row for row in baseline_results}
    found = []
    for row in results:
        base = before.get((row["task"], row["variant"]))
        if base is None or not base["runs"] or not row["runs"]:
            continue
        if row["passRate"] < base["passRate"]:
            p = fisher_one_sided(base["passed"], base["runs"], row["passed"], row["runs"])
            if p < SIGNIFICANCE:
                found.append({"task": row["task"], "variant": row["variant"], "from": base["passRate"],
                              "to": row["passRate"], "p": p})
    return found


def variant_changes(results, baseline_variant):
    """Within one eval: each task's other variants against its baseline variant (rates and p)."""
    base = {row["task"]: row for row in results if row["variant"] == baseline_variant}
    changes = []
    for row in results:
        other = base.get(row["task"])
        if row["variant"] == baseline_variant or other is None or not other["runs"] or not row["runs"]:
            continue
        lower = fisher_one_sided(other["passed"], other["runs"], row["passed"], row["runs"])
        higher = fisher_one_sided(row["passed"], row["runs"], other["passed"], other["runs"])
        changes.append({"task": row["task"], "variant": row["variant"], "baseline": baseline_variant,
                        "from": other["passRate"], "to": row["passRate"],
                        "worse": lower < SIGNIFICANCE, "better": higher < SIGNIFICANCE})
    return changes


# -------------------------------------------------------------------------------- Harbor tasks

HARBOR_TEAM = "team.yaml"


def harbor_task_dirs(folder):
    """The Harbor task folders at `folder`: itself when it holds task.toml, else its children that do."""
    folder = Path(folder)
    if (folder / "task.toml").is_file():
        return [folder]
    return sorted(child for child in folder.iterdir() if (child / "task.toml").is_file()) if folder.is_dir() else []


def read_harbor(folder, team=None):
    """A suite from Harbor-layout tasks (`task.toml`, the instruction file, `environment/`, `tests/test.sh`): the
    instruction is the task and the coordinator's kick-off, tests/test.sh the check grader (a reward file
    it writes to logs/verifier/reward.txt decides when there is one). `team`: the project file (default
    <folder>/team.yaml). Returns (suite, notes): a note per environment this suite cannot honour."""
    folder = Path(os.path.abspath(folder))
    tasks, notes = [], []
    dirs = harbor_task_dirs(folder)
    if not dirs:
        raise SuiteError(f"--harbor {folder}: no task.toml", f"--harbor: no Harbor task (task.toml) in {folder}")
    team = os.path.abspath(team) if team else str(folder / HARBOR_TEAM)
    if not os.path.isfile(team):
        raise SuiteError(f"team: {team} not found", f"team: no project file at {team} (give --team FILE)")
    coordinator = first_agent(team)
    for task_dir in dirs:
        try:
            meta = tomllib.loads((task_dir / "task.toml").read_text(encoding="utf-8"))
            instruction = (task_dir / "instruction.md").read_text(encoding="utf-8").strip()
        except (OSError, tomllib.TOMLDecodeError) as error:
            raise SuiteError(f"{task_dir.name}: {error}", f"{task_dir.name}: {error}") from None
        if not (task_dir / "tests" / "test.sh").is_file():
            raise SuiteError(f"{task_dir.name}: no tests/test.sh", f"{task_dir.name}: no tests/test.sh")
        grader = {"kind": "check", "run": "bash tests/test.sh", "tests": str(task_dir / "tests")}
        image = (meta.get("environment") or {}).get("docker_image")
        if image:
            grader["image"] = image
        elif (task_dir / "environment" / "Dockerfile").is_file():
            notes.append(f"{task_dir.name}: its environment is built from environment/Dockerfile, which evals do "
                         "not build; the check runs in the runner image")
        timeout = (meta.get("agent") or {}).get("timeout_sec")
        task = {"id": task_dir.name, "task": instruction,
                "messages": [{"recipient": coordinator, "body": instruction}], "graders": [grader]}
        if isinstance(timeout, (int, float)) and timeout > 0:
            task["timeoutMs"] = int(timeout * 1000)
        tasks.append(task)
    suite = validate_suite({"name": folder.name, "team": team, "tasks": tasks})
    return suite, notes


def first_agent(team_path):
    """The first agent of a team file: the one a Harbor task's instruction goes to."""
    tree = suzumio_yaml.apply_extends(suzumio_yaml.load_file(team_path, os.environ))
    agents = tree.get("agents") if isinstance(tree, dict) else None
    if not isinstance(agents, dict) or not agents:
        raise SuiteError("team: no agents", f"team: {team_path} has no agents")
    return next(iter(agents))
