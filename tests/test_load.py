"""The controller stays up: descriptors bounded by design under many projects and clients,
back to their idle level after a team has run, and a loop that dies ends `serve` loudly (exit 1)
instead of leaving a deaf process. Each test runs `suzumio serve` as a real subprocess."""
import json

import pytest
from conftest import wait_until
from load_fixtures import REPO, Sampler, ServeProcess, browse, init_demo_teams, init_idle_projects, kick_off

import suzumio_store

# What one project may hold open at most: its -shm once, and the database and WAL descriptors of the
# writer and each pooled reader.
PER_PROJECT = 1 + 2 * (1 + suzumio_store.IDLE_READERS)


@pytest.fixture
def serve_root(tmp_path):
    servers = []

    def start(*args, **kwargs):
        server = ServeProcess(tmp_path / "root", tmp_path / f"serve-{len(servers)}.log", *args, **kwargs)
        servers.append(server)
        return server

    (tmp_path / "root").mkdir()
    yield start
    for server in servers:
        server.stop()


@pytest.mark.timeout(180)
def test_sixty_project_root_browsed_by_sixteen_clients_keeps_answering_with_bounded_descriptors(serve_root,
                                                                                              tmp_path):
    init_idle_projects(tmp_path / "root", 60)
    serve = serve_root().start()
    idle = serve.descriptors()
    sampler = Sampler(serve)

    statuses, _latencies = browse(serve, clients=16, requests_each=40, sampler=sampler)

    assert statuses == [200] * 640
    status, body = serve.request("GET", "/api/projects")
    assert status == 200 and len(json.loads(body)) == 60
    assert serve.healthy()
    # Bounded by the open-project cap and the worker threads, not by projects x threads (60 x 16 x 3
    # and more before): each of serve's 32 worker threads may hold one reader beyond the pools, and
    # each client one socket.
    bound = idle + suzumio_store.MAX_OPEN_PROJECTS * PER_PROJECT + 32 * 2 + 16
    assert sampler.peak_descriptors <= bound, (sampler.peak_descriptors, idle, bound)
    assert sampler.peak_descriptors < 60 * 16  # far below one connection per thread per project
    assert "select()" not in serve.log()


@pytest.mark.timeout(180)
def test_descriptors_return_to_idle_level_after_a_team_finishes(serve_root, tmp_path):
    serve = serve_root()
    init_demo_teams(tmp_path / "root", ["demo"], serve.port)
    serve.start()
    database = str(tmp_path / "root" / "demo" / suzumio_store.DB_FILE)
    # Idle level: the project read by a few clients at once, as a browsing control room does.
    browse(serve, clients=4, requests_each=10)
    idle = settled(lambda: descriptor_kinds(serve, database)["other"])

    kick_off(serve, "demo")

    def submitted():
        _status, body = serve.request("GET", "/api/projects/demo")
        return json.loads(body)["status"] == "submitted"

    wait_until(submitted, 120, interval=0.2, message="the demo team submits")
    _status, body = serve.request("GET", "/api/projects/demo")
    assert json.loads(body)["stats"]["activationCount"] >= 7  # the whole team ran (7 activations or more)
    # Everything but the project's database comes back to exactly its idle level. The database's count
    # is the store's design: each open connection holds one WAL descriptor, and a connection nobody
    # uses is closed unless the pool keeps it (the writer and IDLE_READERS readers). A leaked socket,
    # pipe or connection, even one per activation (the team ran seven or more), fails one of the two.
    # The database file itself is not counted: SQLite keeps the descriptor of a connection closed
    # while another held a lock, and reuses it for the next connection it opens.
    most = 1 + suzumio_store.IDLE_READERS
    kinds = {}

    def back_to_idle():
        kinds.update(descriptor_kinds(serve, database))
        return kinds["other"] <= idle and kinds["connections"] <= most

    wait_until(back_to_idle, 30, interval=0.2,
               message=lambda: f"descriptors back to {idle} besides the database and at most {most} "
                               f"connections (last seen: {kinds})")


def descriptor_kinds(serve, database):
    """serve's descriptors in three counts: the database's connections (their WAL descriptors), the
    database's other files, and everything else (sockets, pipes, logs, the root's other files)."""
    kinds = {"connections": 0, "database": 0, "other": 0}
    for target in serve.descriptor_targets():
        if target == database + "-wal":
            kinds["connections"] += 1
        elif target.startswith(database):
            kinds["database"] += 1
        else:
            kinds["other"] += 1
    return kinds


def settled(read):
    """read() once five readings 0.1 s apart agree (closed client sockets are gone)."""
    readings = []

    def stable():
        readings.append(read())
        return len(readings) >= 5 and len(set(readings[-5:])) == 1

    wait_until(stable, 15, interval=0.1, message="a settled descriptor count")
    return readings[-1]


# Each wrapper runs `suzumio serve` with one loop made to fail the way a real fault would.
FAULTS = {
    "http": ("import waitress.wasyncore\n"
             "def loop(*args, **kwargs):\n"
             "    raise ValueError('filedescriptor out of range in select()')\n"
             "waitress.wasyncore.loop = loop\n", "HTTP loop died"),
    "scheduler": ("import suzumio_scheduler\n"
                  "def pass_once(self, due, seen, full=False):\n"
                  "    raise OSError(24, 'Too many open files')\n"
                  "suzumio_scheduler.Scheduler.pass_once = pass_once\n", "scheduler thread died"),
    "reconciler": ("import suzumio_backend_reconcile\n"
                   "def reconcile(self, stores, now=None):\n"
                   "    raise RuntimeError('injected reconciler fault')\n"
                   "suzumio_backend_reconcile.Reconciler.reconcile = reconcile\n", "reconciler thread died"),
    "evals": ("import suzumio_eval_runner\n"
              "def tick(self, now=None):\n"
              "    raise RuntimeError('injected eval fault')\n"
              "suzumio_eval_runner.EvalRunner.tick = tick\n", "eval thread died"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("component", sorted(FAULTS))
def test_a_dead_loop_ends_serve_with_exit_code_1(serve_root, component):
    patch, logged = FAULTS[component]
    code = (f"import sys\nsys.path.insert(0, {str(REPO)!r})\n{patch}"
            "import suzumio\nsys.exit(suzumio.main(sys.argv[1:]))\n")
    serve = serve_root(python_code=code).start(wait_healthy=False)

    returncode = serve.process.wait(timeout=30)

    assert returncode == 1
    text = serve.log()
    assert logged in text
    assert f"Error: serve stopped because a loop died: {component} down:" in text
    assert "Traceback" in text  # logged with its traceback, not swallowed


@pytest.mark.timeout(60)
def test_serve_without_faults_keeps_running_and_exits_0_on_sigterm(serve_root):
    serve = serve_root().start()
    assert serve.process.poll() is None
    serve.stop()
    assert serve.process.returncode == 0


def test_serve_tunes_glibc_malloc():
    # glibc accepts the arena cap and the fixed mmap threshold (mallopt answers 1); the soak bench
    # measures what they and the periodic trim save.
    import platform

    import suzumio
    assert suzumio.tune_malloc() is (platform.libc_ver()[0] == "glibc")
