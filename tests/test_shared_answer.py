"""SharedAnswer: concurrent askers share one computation that started after they asked, so
32 clients of the project list cost two computations, and none of them is served a stale answer."""
import threading

import pytest
from api_fixtures import init_project, project_yaml, serving
from conftest import wait_until

from suzumio_http import SharedAnswer

pytestmark = pytest.mark.timeout(60)


class Counting:
    """A computation that counts its runs and, while `gate` is clear, blocks in its first run."""

    def __init__(self, fail=False):
        self.runs = 0
        self.fail = fail
        self.started = threading.Event()
        self.gate = threading.Event()

    def __call__(self):
        self.runs += 1
        number = self.runs
        self.started.set()
        if number == 1:
            self.gate.wait(10)
        if self.fail:
            raise RuntimeError(f"run {number} failed")
        return number


def ask_in_threads(shared, count):
    answers, threads = [], []

    def ask():
        try:
            answers.append(shared.get())
        except RuntimeError as error:
            answers.append(str(error))

    for _ in range(count):
        threads.append(threading.Thread(target=ask, daemon=True))
        threads[-1].start()
    return answers, threads


def overlapping(shared, compute, count):
    """One asker, then `count` more while its computation runs (held at the gate): their answers."""
    first, first_threads = ask_in_threads(shared, 1)
    assert compute.started.wait(5)
    later, later_threads = ask_in_threads(shared, count)
    wait_until(lambda: len(shared._changed._waiters) == count, 5, message=f"{count} askers waiting")
    compute.gate.set()
    for thread in first_threads + later_threads:
        thread.join(5)
    return first, later


def test_askers_arriving_during_a_computation_share_the_next_one():
    compute = Counting()
    first, later = overlapping(SharedAnswer(compute), compute, 8)
    assert first == [1]
    # They asked after run 1 had started, so none takes its result: one of them runs it again for all.
    assert later == [2] * 8
    assert compute.runs == 2


def test_an_asker_alone_computes_every_time():
    compute = Counting()
    compute.gate.set()
    shared = SharedAnswer(compute)
    assert [shared.get() for _ in range(3)] == [1, 2, 3]


def test_a_failed_computation_is_the_error_of_every_asker_that_shared_it():
    compute = Counting(fail=True)
    shared = SharedAnswer(compute)
    first, later = overlapping(shared, compute, 4)
    assert first == ["run 1 failed"]
    assert later == ["run 2 failed"] * 4
    compute.fail = False
    assert shared.get() == 3  # an error is not kept: the next asker computes afresh


def test_the_project_list_sees_a_project_created_just_before_the_request(tmp_path):
    with serving(tmp_path / "root", threads=16) as service:
        assert service.get("/api/projects").json() == []
        init_project(service.root, tmp_path / "one", project_yaml("one", service.base_url))
        assert [p["id"] for p in service.get("/api/projects").json()] == ["one"]
