"""The graders of an eval run (docs/evals.md#graders): each reads one ended project and answers a grade —
passed, a score and its evidence. status and report read the project's final status and report; budget
its usage; trajectory an agent's tool calls and messages; check runs a command in a sandbox over the
team's artifacts, report and repository; judge asks a model preset, through the controller's model proxy,
to grade the work against a rubric. Imported by suzumio_eval_runner."""
import collections
import fnmatch
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import suzumio_config
import suzumio_output
from suzumio_errors import SuzumioError

log = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 600
EVIDENCE_CHARS = 2000
JUDGE_AGENT = "eval-judge"
JUDGE_SYSTEM = (
    "You grade the work of a team of agents against a rubric. Read the rubric, the team's task and its final "
    "report, then answer with one JSON object and nothing else: {\"score\": a number from 0 to 1, "
    "\"reasons\": \"why, in a few sentences\"}.")


def grade(kind, passed, score=None, evidence=""):
    """One grader's verdict: passed, a score in [0, 1] and the evidence it rests on."""
    score = (1.0 if passed else 0.0) if score is None else score
    return {"kind": kind, "passed": bool(passed), "score": score, "evidence": str(evidence)[:EVIDENCE_CHARS]}


class RunView:
    """What the graders read of one ended run: its project store and config, the status it ended in,
    its usage and wall time, and the task it ran."""

    def __init__(self, store, config, task, final_status, wall_ms):
        self.store, self.config, self.task = store, config, task
        self.final_status = final_status
        self.wall_ms = wall_ms
        self._report = None

    @property
    def report(self):
        if self._report is None:
            self._report = suzumio_output.report(self.store)["report"] or ""
        return self._report

    def tool_calls(self, agent_id=None):
        rows = list(reversed(self.store.list_tool_calls(limit=1_000_000)))
        return [row for row in rows if agent_id is None or row["agent_id"] == agent_id]

    def messages(self, sender=None):
        rows = self.store.list_messages(limit=1_000_000, full_body=True)
        return [row for row in rows if sender is None or row["sender"] == sender]

    def usage(self):
        """{tokens, costUsd, activations, wallMs, agents: {id: {tokens, messages}}}."""
        costs = self.store.model_costs()
        sent = collections.Counter(message["sender"] for message in self.messages())
        agents = {agent_id: {"tokens": costs["agents"].get(agent_id, {}).get("tokens", 0),
                             "messages": sent.get(agent_id, 0)} for agent_id in self.store.agent_ids()}
        return {"tokens": costs["project"]["tokens"], "costUsd": costs["project"]["costUsd"],
                "activations": self.store.project_stats()["activationCount"], "wallMs": self.wall_ms,
                "agents": agents}


# ------------------------------------------------------------------------ status, report, budget

def grade_status(view, grader, **_):
    status = view.final_status
    return grade("status", status == grader["equals"], evidence=f"status {status} (expected {grader['equals']})")


def grade_report(view, grader, **_):
    text = view.report
    if "contains" in grader:
        found = grader["contains"] in text
        return grade("report", found, evidence=f"report {'contains' if found else 'lacks'} "
                     f"{grader['contains']!r}" + ("" if text else " (no report)"))
    match = re.search(grader["matches"], text, re.MULTILINE)
    return grade("report", match is not None,
                 evidence=f"matched {match.group(0)!r}" if match else f"no match for /{grader['matches']}/"
                 + ("" if text else " (no report)"))


BUDGET_FIELDS = (("maxTokens", "tokens"), ("maxCostUsd", "costUsd"), ("maxActivations", "activations"),
                 ("maxWallMs", "wallMs"))


def grade_budget(view, grader, **_):
    usage = view.usage()
    over, lines = [], []
    for limit, field in BUDGET_FIELDS:
        if limit not in grader:
            continue
        value = usage[field]
        lines.append(f"{field} {value} (at most {grader[limit]})")
        if value is None or value > grader[limit]:
            over.append(field)
    return grade("budget", not over, evidence="; ".join(lines) + (f"; over: {', '.join(over)}" if over else ""))


# ------------------------------------------------------------------------------------ trajectory

def _argument_matches(expected, actual):
    """An expected argument: a value compared exactly, or {"matches": regex} searched in its text."""
    if isinstance(expected, dict) and set(expected) == {"matches"}:
        text = actual if isinstance(actual, str) else json.dumps(actual, sort_keys=True)
        return re.search(expected["matches"], text) is not None
    return expected == actual


def _tool_matches(expected, call):
    """A tool entry: a name or glob (`file.*`), or {tool, arguments} with arguments matched one by one."""
    if isinstance(expected, str):
        return fnmatch.fnmatchcase(call["tool"], expected)
    if not fnmatch.fnmatchcase(call["tool"], expected["tool"]):
        return False
    try:
        arguments = json.loads(call.get("input_json") or "{}")
    except ValueError:
        arguments = {}
    return all(key in arguments and _argument_matches(value, arguments[key])
               for key, value in (expected.get("arguments") or {}).items())


def _message_matches(expected, message):
    to = expected["to"]
    target = message.get("channel") if to.startswith("#") else message.get("recipient")
    return target == to and expected.get("contains", "") in message["body"]


def sequence_match(expected, actual, same, mode):
    """Whether `actual` fits `expected` under `mode` (docs/evals.md#graders): exact — the same items
    in the same order; in-order — the expected items appear in that order, others between them allowed;
    any-order — the same items in any order, nothing else; subset — each expected item appears, once each,
    in any order, others allowed."""
    if mode == "exact":
        return len(expected) == len(actual) and all(same(e, a) for e, a in zip(expected, actual, strict=True))
    if mode == "in-order":
        position = 0
        for item in actual:
            if position < len(expected) and same(expected[position], item):
                position += 1
        return position == len(expected)
    if mode == "any-order" and len(expected) != len(actual):
        return False
    remaining = list(actual)
    for item in expected:
        index = next((i for i, candidate in enumerate(remaining) if same(item, candidate)), None)
        if index is None:
            return False
        remaining.pop(index)
    return True


def grade_trajectory(view, grader, **_):
    agent = grader["agent"]
    counted = [entry for entry in grader.get("messages") or [] if "atLeast" in entry or "atMost" in entry]
    if "tools" in grader:
        expected, actual = grader["tools"], view.tool_calls(agent)
        same, shown = _tool_matches, [call["tool"] for call in actual]
    else:
        expected = [entry for entry in grader["messages"] if entry not in counted]
        actual = view.messages(agent)
        same, shown = _message_matches, [m.get("recipient") or m.get("channel") for m in actual]
    passed = sequence_match(expected, actual, same, grader["match"]) if expected or not counted else True
    lines = [f"{agent}: {', '.join(map(str, shown)) or 'nothing'} ({grader['match']})"]
    for entry in counted:
        count = sum(1 for message in actual if _message_matches(entry, message))
        within = count >= entry.get("atLeast", 0) and ("atMost" not in entry or count <= entry["atMost"])
        lines.append(f"{count} message(s) to {entry['to']}" + ("" if within else " (out of bounds)"))
        passed = passed and within
    return grade("trajectory", passed, evidence="; ".join(lines))


# ----------------------------------------------------------------------------------------- check

class CheckSandbox:
    """Runs a check's command: in the runner image with no network when a Docker engine answers
    (artifacts at `/artifacts`, the report file at the root, the integration branch at `/workspace`, its working
    directory), else in a scratch folder holding the same layout as relative paths."""

    def __init__(self, docker_client=None, timeout_s=CHECK_TIMEOUT_S):
        self.docker = docker_client
        self.timeout_s = timeout_s

    def layout(self, view, folder, tests=None):
        """Fill `folder` with `artifacts/`, the report file and `workspace/` of the run (and a Harbor task's tests/
        and logs/verifier/)."""
        shutil.copytree(view.store.artifacts_root, folder / "artifacts", symlinks=True, dirs_exist_ok=True)
        if tests:
            shutil.copytree(tests, folder / "tests", symlinks=True)
            (folder / "logs" / "verifier").mkdir(parents=True)
        (folder / "report.md").write_text(view.report, encoding="utf-8")
        workspace = folder / "workspace"
        workspace.mkdir(exist_ok=True)
        if tests:  # mount points made by us, so the engine makes no root-owned folders here
            (workspace / "tests").mkdir()
            (workspace / "logs").mkdir()
        repository = view.store.dir / "repository.git"
        if repository.is_dir():
            subprocess.run(["git", "clone", "--quiet", str(repository), str(workspace)], check=False,
                           capture_output=True, timeout=self.timeout_s)
        return folder

    def run(self, view, command, image, tests=None):
        """(exit code, output, reward) of `command`; exit code None when it could not run at all; reward
        the number a Harbor test wrote to logs/verifier/reward.txt, or None."""
        with tempfile.TemporaryDirectory(prefix="suzumio-check-") as scratch:
            folder = self.layout(view, Path(scratch), tests)
            if self.docker is None:
                code, output = self._run_here(folder, command)
            else:
                code, output = self._run_in_container(folder, command, image, tests)
            reward_file = folder / "logs" / "verifier" / "reward.txt"
            try:
                reward = float(reward_file.read_text(encoding="utf-8").strip()) if reward_file.is_file() else None
            except ValueError:
                reward = 0.0
            return code, output, reward

    def _run_here(self, folder, command):
        try:
            done = subprocess.run(["bash", "-c", command], cwd=folder, capture_output=True, text=True,
                                  timeout=self.timeout_s, env={"PATH": os.environ.get("PATH", ""),
                                                               "HOME": str(folder), "LANG": "C.UTF-8"})
        except subprocess.TimeoutExpired:
            return None, f"timed out after {self.timeout_s}s"
        return done.returncode, (done.stdout + done.stderr)

    def _run_in_container(self, folder, command, image, tests=None):
        import suzumio_docker

        docker = suzumio_docker.docker_sdk()
        try:
            self.docker.images.get(image)
        except docker.errors.ImageNotFound:
            return None, f"image {image} is not on this machine"
        except suzumio_docker.engine_errors() as error:
            return None, f"Docker engine: {error}"
        volumes = {str(folder / "artifacts"): {"bind": "/artifacts", "mode": "ro"},
                   str(folder / "report.md"): {"bind": "/report.md", "mode": "ro"},
                   str(folder / "workspace"): {"bind": "/workspace", "mode": "rw"}}
        if tests:
            volumes[str(folder / "tests")] = {"bind": "/workspace/tests", "mode": "ro"}
            volumes[str(folder / "logs")] = {"bind": "/workspace/logs", "mode": "rw"}
        container = self.docker.containers.create(
            image, ["bash", "-c", command], working_dir="/workspace", network_mode="none", volumes=volumes,
            cap_drop=["ALL"], security_opt=["no-new-privileges"], user=f"{os.getuid()}:{os.getgid()}",
            labels={"suzumio.check": "1"})
        try:
            container.start()
            try:
                result = container.wait(timeout=self.timeout_s)
            except suzumio_docker.engine_errors():
                return None, f"timed out after {self.timeout_s}s"
            output = container.logs(stdout=True, stderr=True).decode("utf-8", "replace")
            return result.get("StatusCode"), output
        finally:
            container.remove(force=True)


def grade_check(view, grader, *, sandbox, **_):
    image = grader.get("image") or view.config.backend.image
    if grader.get("image") and sandbox.docker is None:
        return grade("check", False, evidence=f"needs the image {image}, and no Docker engine answers here")
    try:
        code, output, reward = sandbox.run(view, grader["run"], image, grader.get("tests"))
    except (OSError, subprocess.SubprocessError) as error:
        code, output, reward = None, str(error), None
    where = "a scratch folder (no Docker engine)" if sandbox.docker is None else image
    if code is None:
        return grade("check", False, evidence=f"could not run in {where}: {output}")
    passed = code == 0 and (reward is None or reward >= 1)
    shown = "" if reward is None else f", reward {reward:g}"
    return grade("check", passed, score=reward if reward is not None else None,
                 evidence=f"exit {code}{shown} in {where}\n{output[-(EVIDENCE_CHARS - 200):]}")


# ----------------------------------------------------------------------------------------- judge

def judge_config(config, preset_id):
    """The run's config with one more agent that selects the judge's preset (the proxy's check)."""
    data = config.data
    data["agents"][JUDGE_AGENT] = {"model": preset_id, "prompt": "", "tools": []}
    return suzumio_config.ProjectConfig.from_data(data)


def judge_request(view, grader):
    artifacts = sorted(str(p.relative_to(view.store.artifacts_root))
                       for p in view.store.artifacts_root.rglob("*") if p.is_file())
    user = (f"# Rubric\n\n{grader['rubric']}\n\n# Task\n\n{view.task['task']}\n\n# Final status\n\n"
            f"{view.final_status}\n\n# Artifacts\n\n" + ("\n".join(artifacts) or "(none)")
            + f"\n\n# Final report\n\n{view.report or '(no report)'}\n")
    return {"messages": [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]}


def parse_verdict(text):
    """(score, reasons) of a judge's answer: the first JSON object in its text; ValueError otherwise."""
    match = re.search(r"\{.*\}", text or "", re.DOTALL)
    if match is None:
        raise ValueError("the judge answered no JSON object")
    verdict = json.loads(match.group(0))
    score = verdict.get("score")
    if isinstance(score, bool) or not isinstance(score, (int, float)):
        raise ValueError("the judge's answer has no numeric score")
    return max(0.0, min(1.0, float(score))), str(verdict.get("reasons", ""))


def grade_judge(view, grader, *, model_proxy, record, recorded=None, **_):
    """Ask the judge's preset through the model proxy; the request, answer, verdict and reasons are kept
    (`record(request, answer, usage, score, reasons)`). A replay's judge (`recorded` given) makes no model
    call: it reuses the verdict recorded for the same request, and without one the grade fails saying so."""
    request = judge_request(view, grader)
    kept = recorded(request) if recorded is not None else None
    if recorded is not None and kept is None:
        return grade("judge", False, 0.0, "no recorded verdict for this request (the report or artifacts "
                     "changed); a replay makes no model call")
    if kept is not None:
        score, reasons = kept["score"], kept["reasons"]
        record(request, kept["answer"], {}, score, reasons)
        if score is None:
            return grade("judge", False, 0.0, f"no verdict (recorded): {reasons}")
        return grade("judge", score >= grader["threshold"], score,
                     f"score {score:.2f} (threshold {grader['threshold']}, recorded verdict): {reasons}")
    answer_text, usage = None, {}
    try:
        config = judge_config(view.config, grader["preset"])
        preset = config.model_attempts(JUDGE_AGENT)[0]
        answer = model_proxy.forward(config, JUDGE_AGENT, preset.provider, preset.id, request)
        answer_text, usage = answer.body, answer.usage or {}
        if not 200 <= answer.status < 300:
            raise ValueError(f"the judge's model answered HTTP {answer.status}")
        content = json.loads(answer.body)["choices"][0]["message"].get("content") or ""
        score, reasons = parse_verdict(content)
    except (SuzumioError, ValueError, KeyError, IndexError, TypeError) as error:
        record(request, answer_text, usage, None, str(error))
        return grade("judge", False, 0.0, f"no verdict: {error}")
    record(request, answer_text, usage, score, reasons)
    passed = score >= grader["threshold"]
    return grade("judge", passed, score, f"score {score:.2f} (threshold {grader['threshold']}): {reasons}")


GRADERS = {"status": grade_status, "report": grade_report, "budget": grade_budget, "trajectory": grade_trajectory,
           "check": grade_check, "judge": grade_judge}


def grade_run(view, graders, *, sandbox, model_proxy, record_judgement, recorded_judgements=None):
    """Every grader's grade over one ended run, in the suite's order; the run passes when all pass.
    `recorded_judgements`: a replayed run's source judgements (its judges then ask no model)."""
    grades = []
    for index, grader in enumerate(graders):
        def record(request, answer, usage, score, reasons, index=index, grader=grader):
            record_judgement(index, grader["preset"], grader["rubric"], request, answer, usage, score, reasons)

        def recorded(request, index=index):
            return next((j for j in recorded_judgements if j["graderIndex"] == index and j["request"] == request),
                        None)

        grades.append(GRADERS[grader["kind"]](view, grader, sandbox=sandbox, model_proxy=model_proxy,
                                              record=record, recorded=None if recorded_judgements is None
                                              else recorded))
    return all(g["passed"] for g in grades), grades
