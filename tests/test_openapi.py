"""The OpenAPI document of the user routes (suzumio_openapi) against the live app on Waitress at port 0:
Schemathesis generates requests from it (no answer may be a 500, every answer must conform to its
documented status, content type and schema), and every read route of a real project is checked too."""
import pytest
import schemathesis
from api_fixtures import init_project, project_yaml, serving
from hypothesis import HealthCheck, given, settings

import suzumio_openapi
import suzumio_resources
from suzumio_store_evals import EvalStore

TOKEN = "openapi-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# A bounded run: a handful of examples per operation keeps the file near half a minute on two cores.
MAX_EXAMPLES = 8
CHECKS = ("not_a_server_error", "status_code_conformance", "content_type_conformance",
          "response_schema_conformance")


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    root_path = tmp_path_factory.mktemp("openapi") / "root"
    evals = EvalStore(root_path)
    with serving(root_path, api_token=TOKEN, evals=evals) as service:
        init_project(service.root, root_path.parent / "demo", project_yaml("demo", service.base_url))
        yield service
    evals.close()


@pytest.fixture(scope="module")
def api_schema(service):
    schema = schemathesis.openapi.from_url(f"{service.base_url}/api/openapi.json", headers=AUTH)
    # The stream never ends on its own; its description is checked below instead.
    return schema.exclude(path_regex=r"/stream$")


OPERATIONS = sorted(f"{method.upper()} {path}" for path, item in suzumio_openapi.PATHS.items() for method in item
                    if not path.endswith("/stream"))


@pytest.mark.parametrize("label", OPERATIONS)
def test_generated_requests_get_documented_answers(api_schema, label):
    operation = api_schema.find_operation_by_label(label)
    checks = [getattr(schemathesis.checks, name) for name in CHECKS]

    @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(operation.as_strategy())
    def call(case):
        case.call_and_validate(headers=AUTH, checks=checks)

    call()


READ_PATHS = ["/health", "/api/version", "/api/openapi.json", "/api/projects", "/api/projects/demo",
              "/api/projects/demo/task", "/api/projects/demo/agents", "/api/projects/demo/agents/pm/history",
              "/api/projects/demo/messages", "/api/projects/demo/events", "/api/projects/demo/activations",
              "/api/projects/demo/tool-calls", "/api/projects/demo/tool-status", "/api/projects/demo/tool-ui",
              "/api/projects/demo/config/resolved", "/api/projects/demo/report", "/api/projects/demo/artifacts",
              "/api/projects/nope", "/api/projects/demo/messages/msg_0_00000000", "/api/projects/demo/effects"]


@pytest.mark.parametrize("path", READ_PATHS)
def test_answers_of_a_real_project_conform(api_schema, service, path):
    service.post("/api/projects/demo/messages", {"recipient": "pm", "body": "hello", "priority": "P3"},
                 headers=AUTH)
    answer = service.get(path, headers=AUTH)
    assert answer.status_code < 500
    operation = api_schema.find_operation_by_label(f"GET {template_of(path)}")
    operation.validate_response(answer)


def template_of(path):
    for template in suzumio_openapi.PATHS:
        parts, wanted = template.split("/"), path.split("/")
        if len(parts) == len(wanted) and all(p == w or p.startswith("{") for p, w in zip(parts, wanted, strict=True)):
            return template
    raise AssertionError(path)


def test_the_document_describes_every_user_route_and_not_the_runner_routes(service):
    document = service.get("/api/openapi.json", headers=AUTH).json()
    assert document["openapi"] == "3.1.0" and document["info"]["version"] == suzumio_resources.VERSION
    routes = {(route.method, route.rule) for route in service.server.app.routes}
    user = {(method, rule.replace(":path>", ">").replace("<", "{").replace(">", "}")
             .replace("toolpack_id", "toolpackId").replace("entry_id", "entryId"))
            for method, rule in routes if rule.startswith(("/api/", "/health"))}
    described = {(method.upper(), path) for path, item in document["paths"].items() for method in item}
    assert user == described
    assert not any(path.startswith(("/runner", "/activation", "/toolpacks")) for path in document["paths"])
    stream = document["paths"]["/api/projects/{project}/stream"]["get"]["responses"]["200"]["content"]
    assert list(stream) == ["text/event-stream"]
    assert document["components"]["securitySchemes"]["bearerToken"]["scheme"] == "bearer"
    error = document["components"]["schemas"]["Error"]
    assert error["required"] == ["error"] and error["properties"]["error"] == {"type": "string"}


def test_version_route_and_header(service):
    answer = service.get("/api/version", headers=AUTH)
    assert answer.json() == {"version": suzumio_resources.VERSION}
    assert answer.headers["Suzumio-Version"] == suzumio_resources.VERSION
    health = service.get("/health")
    assert health.json() == {"healthy": True}
    assert health.headers["Suzumio-Version"] == suzumio_resources.VERSION
    assert service.get("/api/nope", headers=AUTH).headers["Suzumio-Version"] == suzumio_resources.VERSION
