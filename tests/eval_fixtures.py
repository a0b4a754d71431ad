"""Evals fixtures: the real controller with its eval thread (checks in a scratch folder), a FakeModel whose
answers vary by run, and a team file. Imported by tests/test_e2e_evals.py and tests/test_webui_evals.py."""
import contextlib
import json
import threading

import yaml
from api_fixtures import serving
from e2e_fixtures import call, project_config
from fake_model import FakeModel, answer

import suzumio_eval_graders
import suzumio_model_proxy
from suzumio_eval_runner import EvalRunner
from suzumio_store_evals import EvalStore

JUDGE = {"provider": "fake", "model": "judge"}


class Answers:
    """The FakeModel's responder: the pm submits the report each run's outcome names (in run order: one
    eval runs one project at a time), a worker reports back, and the judge scores a report by whether it
    says hello."""

    def __init__(self, outcomes=()):
        self.outcomes = list(outcomes)
        self.lock = threading.Lock()

    def __call__(self, body):
        model = body.get("model")
        text = json.dumps(body.get("messages"))
        if model == "judge":
            good = "hello" in body["messages"][-1]["content"].split("# Final report", 1)[-1]
            verdict = {"score": 0.9 if good else 0.1, "reasons": "says hello" if good else "no hello"}
            return answer(content=json.dumps(verdict))
        if model == "worker-1":
            if '"role": "tool"' in text:
                return answer(tool_calls=[call("coordination.wait_for_signal", reason="Reported.", notifyPm=False)])
            return answer(tool_calls=[call("messages.send", recipient="pm", body="Worker says hello.")])
        if "Worker says hello" in text:  # the pm's second activation of a delegation
            return answer(tool_calls=[call("completion.submit", report="# Report\n\nhello from the team\n")])
        if "Delegate." in text:
            if '"role": "tool"' in text:
                return answer(tool_calls=[call("coordination.wait_for_signal", reason="Waiting.")])
            return answer(tool_calls=[call("messages.send", recipient="worker-1", body="Say hello to me.")])
        with self.lock:
            outcome = self.outcomes.pop(0) if self.outcomes else "hello"
        return answer(tool_calls=[call("completion.submit", report=f"# Report\n\n{outcome} world\n")])


def write_team(folder, model):
    """`team.yaml` in `folder`: pm and worker-1 on the local backend, each with its own FakeModel preset,
    and a `judge` preset."""
    team = project_config("local", None, model.base_url,
                          presets={"pm": {"provider": "fake", "model": "pm"},
                                   "worker": {"provider": "fake", "model": "worker-1"}, "judge": JUDGE})
    (folder / "team.yaml").write_text(yaml.safe_dump(team), encoding="utf-8")


@contextlib.contextmanager
def eval_service(tmp_path, outcomes=()):
    """The controller with its eval thread (checks in a scratch folder), a FakeModel and a team file."""
    answers = Answers(outcomes)
    model = FakeModel(responder=answers)
    root_path = tmp_path / "root"
    store = EvalStore(root_path)
    try:
        with serving(root_path, scheduler_interval=0.2, evals=store) as service:
            runner = EvalRunner(service.root, service.scheduler, suzumio_model_proxy.ModelProxy({}),
                                sandbox=suzumio_eval_graders.CheckSandbox(None), interval=0.1, store=store)
            runner.start()
            write_team(tmp_path, model)
            try:
                yield service, model, answers, runner
            finally:
                runner.stop()
    finally:
        store.close()
        model.close()


