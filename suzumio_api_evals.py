"""The evals routes of the user API (docs/http-api.md#evals): `POST /api/evals` writes an eval that the
eval thread of `serve` runs, `GET /api/evals` lists the kept ones, `GET /api/evals/:id` answers the
result document and `GET /api/evals/:id/stream` its progress as Server-Sent Events. Mounted by
suzumio_api.make_app when the runtime has an evals store."""
import json
import os
import time

import bottle

import suzumio_eval_runner
from suzumio_errors import BadRequest, Unavailable
from suzumio_http import json_response, read_fields

OPTION_KEYS = ("variant", "mode", "from", "at", "baseline", "failUnder")
STREAM_SECONDS = 30.0  # a progress stream ends after this; the EventSource reconnects on its own
STREAM_POLL_SECONDS = 0.5


def submit_body(store, body, now=None):
    """An eval from a request body: `{"suite": {...}, options…}`, or the suite itself with the options
    beside its fields. The suite's `team` is an absolute path or the project file inline."""
    if isinstance(body.get("suite"), dict):
        suite, options = body["suite"], body
    else:
        suite = {key: value for key, value in body.items() if key not in OPTION_KEYS}
        options = body
    team = suite.get("team")
    if isinstance(team, str) and not os.path.isabs(team):
        raise BadRequest("team: must be an absolute path or the project file inline (a mapping)")
    # `variant` (a name or a list) chooses variants; beside `suite`, `variants` (names) does too. In a
    # body that is the suite itself, `variants` is the suite's own list.
    variants = options.get("variant") or (options.get("variants") if "suite" in body else None) or ()
    if isinstance(variants, str):
        variants = [variants]
    if not isinstance(variants, (list, tuple)) or not all(isinstance(v, str) for v in variants):
        raise BadRequest("variants must be a list of variant names")
    fail_under = options.get("failUnder")
    if fail_under is not None and (isinstance(fail_under, bool) or not isinstance(fail_under, (int, float))
                                   or not 0 <= fail_under <= 1):
        raise BadRequest("failUnder must be a rate between 0 and 1")
    runs = body.get("runs") if "suite" in body else None
    return suzumio_eval_runner.submit(store, suite, runs=runs, variants=variants,
                                      mode=options.get("mode") or "live", source=options.get("from"),
                                      at=options.get("at"), baseline=options.get("baseline"),
                                      fail_under=fail_under, now=now)


def progress_frame(document):
    data = {key: document[key] for key in ("id", "status", "progress", "regressions")}
    return f"event: {document['status']}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def mount_eval_routes(app, evals_store):
    """The evals routes over `evals_store` (a suzumio_store_evals.EvalStore); without one (an app not
    served by `serve`'s runtime) they answer 503."""

    def store():
        if evals_store is None:
            raise Unavailable("Evals run only in `suzumio serve` (this app has no eval thread)")
        return evals_store

    @app.post("/api/evals")
    def create_eval():
        body = read_fields()  # a body too large or not JSON is refused as on every route, eval thread or not
        eval_id = submit_body(store(), body)
        return json_response({"id": eval_id}, status=201)

    @app.get("/api/evals")
    def list_evals():
        return json_response(suzumio_eval_runner.listing(store()))

    @app.get("/api/evals/<eval_id>")
    def get_eval(eval_id):
        return json_response(suzumio_eval_runner.document(store(), eval_id))

    @app.get("/api/evals/<eval_id>/stream")
    def stream(eval_id):
        first = suzumio_eval_runner.document(store(), eval_id)  # NotFound before the stream begins

        def frames():
            # A short stream per connection: progress changes every few seconds at most, and the
            # EventSource reconnects, so a worker thread is never held for long.
            last, document = None, first
            deadline = time.monotonic() + STREAM_SECONDS
            while True:
                frame = progress_frame(document)
                if frame != last:
                    yield frame
                    last = frame
                if document["status"] == "done" or time.monotonic() >= deadline:
                    return
                time.sleep(STREAM_POLL_SECONDS)
                document = suzumio_eval_runner.document(store(), eval_id)

        bottle.response.content_type = "text/event-stream; charset=utf-8"
        bottle.response.set_header("Cache-Control", "no-cache")
        return frames()
