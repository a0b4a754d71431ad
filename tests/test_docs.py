"""The user documentation stays true to the code: project files shown in README.md and docs/*.md load
through the real config pipeline, `suzumio …` command lines parse with the real CLI parser, the HTTP
routes named in the docs exist in the real app (and every route is documented), blocks that claim to
show a file match it, and the example toolpack under docs/examples runs end to end."""
import re
import shlex
import shutil
from pathlib import Path

import pytest
from api_fixtures import init_project, serving
from conftest import require, wait_until

import suzumio
import suzumio_cli_args
import suzumio_config
import suzumio_runtime

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
EXAMPLES = DOCS / "examples"
DOC_FILES = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]

# Variables the documented project files may name; anything else a placeholder names reads as unset.
DOC_ENV = {
    "USER": "docs-reader",
    "SUZUMIO_GATEWAY_BASE_URL": "http://127.0.0.1:9/v1",
    "SUZUMIO_GATEWAY_API_KEY": "docs-key",
}

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)[ \t]*(?P<lang>[\w+-]*)[ \t]*$")
MARKER = re.compile(r"^\s*<!--\s*(?P<text>.*?)\s*-->\s*$")
SHELL_LANGS = {"bash", "sh", "shell", "console"}
SHELL_OPERATORS = {"|", "||", "&&", ";", "&"}
CLI_PROGRAMS = ("suzumio", "suzumio.pex", "suzumio.py")
SERVE_STARTUP_LINE = "suzumio listening on "  # output of `serve`, quoted in prose, not a command


class Block:
    """One fenced code block: its language, dedented text, location and the HTML comment before it."""

    def __init__(self, path, line, lang, text, marker):
        self.path = path
        self.line = line
        self.lang = lang
        self.text = text
        self.marker = marker

    @property
    def where(self):
        return f"{self.path.relative_to(REPO)}:{self.line}"

    def is_project(self):
        return (self.lang in ("yaml", "yml") and re.search(r"^name:", self.text, re.MULTILINE) is not None
                and re.search(r"^agents:", self.text, re.MULTILINE) is not None)


def fenced_blocks(path):
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        marker = preceding_marker(lines, index)
        body = []
        index += 1
        while index < len(lines) and lines[index].strip() != fence:
            line = lines[index]
            body.append(line[len(indent):] if line.startswith(indent) else line.lstrip())
            index += 1
        blocks.append(Block(path, index - len(body), opening["lang"], "\n".join(body) + "\n", marker))
        index += 1
    return blocks


def preceding_marker(lines, fence_index):
    """The text of an HTML comment on the last non-blank line before a fence, else None."""
    for line in reversed(lines[:fence_index]):
        if line.strip():
            match = MARKER.match(line)
            return match["text"] if match else None
    return None


def prose(path):
    """The text of a document outside its fenced blocks."""
    kept, inside, fence = [], False, None
    for line in path.read_text(encoding="utf-8").splitlines():
        opening = FENCE.match(line)
        if not inside and opening:
            inside, fence = True, opening["fence"]
        elif inside and line.strip() == fence:
            inside = False
        elif not inside:
            kept.append(line)
    return "\n".join(kept)


ALL_BLOCKS = [block for path in DOC_FILES for block in fenced_blocks(path)]
PROJECT_BLOCKS = [b for b in ALL_BLOCKS if b.is_project() and b.marker != "not-a-project"]
FILE_BLOCKS = [b for b in ALL_BLOCKS if b.marker and b.marker.startswith("file:")]


def test_the_documentation_files_exist():
    assert {"README.md", "cli.md", "concepts.md", "configuration.md", "http-api.md", "operations.md",
            "toolpacks.md"} <= {path.name for path in DOC_FILES}


# ------------------------------------------------------------------------------- project files

def test_the_docs_show_project_files_that_are_checked():
    assert len(PROJECT_BLOCKS) >= 5
    assert {b.path.name for b in PROJECT_BLOCKS} >= {"README.md", "configuration.md", "toolpacks.md"}


@pytest.fixture(scope="module")
def examples_copy(tmp_path_factory):
    """docs/examples copied once, so documented projects can name its scripts and toolpacks."""
    target = tmp_path_factory.mktemp("docs") / "examples"
    shutil.copytree(EXAMPLES, target)
    return target


@pytest.mark.parametrize("block", PROJECT_BLOCKS, ids=[b.where for b in PROJECT_BLOCKS])
def test_documented_project_file_loads_through_the_config_pipeline(block, examples_copy, tmp_path):
    env = {**DOC_ENV, "HOME": str(tmp_path)}
    if block.marker and block.marker.startswith("file:"):
        path = REPO / block.marker[len("file:"):].strip()
    else:
        path = examples_copy / f"doc-{block.path.stem}-{block.line}.yaml"
        path.write_text(block.text, encoding="utf-8")
    config = suzumio_config.load_project(path, env=env)
    assert config.name and [agent.id for agent in config.agents]


@pytest.mark.parametrize("block", FILE_BLOCKS, ids=[b.where for b in FILE_BLOCKS])
def test_block_marked_as_a_file_shows_that_file_exactly(block):
    path = REPO / block.marker[len("file:"):].strip()
    assert path.is_file(), f"{block.where} names a missing file {path}"
    assert block.text == path.read_text(encoding="utf-8"), f"{block.where} differs from {path}"


# -------------------------------------------------------------------------------- command lines

def shell_commands(block):
    """Logical lines of a shell block (continuations joined), without prompts."""
    joined = block.text.replace("\\\n", " ")
    for line in joined.splitlines():
        line = line.strip()
        line = line.removeprefix("$ ")
        if line:
            yield line


def cli_argv(line):
    """The argument list a documented command line gives the Suzumio CLI, or None if it is another
    program. Leading VAR=value assignments and everything from the first shell operator are dropped."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return None
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        words = words[1:]
    if words and Path(words[0]).name.startswith("python") and len(words) > 1:
        words = words[1:]
    if not words or not Path(words[0]).name.endswith(CLI_PROGRAMS):
        return None
    argv = []
    for word in words[1:]:
        if word in SHELL_OPERATORS or word[:1] in "<>|" or word.startswith("2>"):
            break
        argv.append(word)
    return argv


def documented_command_lines():
    found = []
    for block in ALL_BLOCKS:
        if block.lang in SHELL_LANGS:
            for line in shell_commands(block):
                argv = cli_argv(line)
                if argv is not None:
                    found.append((block.where, block.marker, argv))
    for path in DOC_FILES:
        for span in re.findall(r"`(suzumio [^`]+)`", prose(path)):
            if span.startswith(SERVE_STARTUP_LINE):
                continue
            # usage notation ([--root dir], <project>, a|b, ...) is explained, not run, and a lone
            # command word (`suzumio start`) names a command rather than showing a command line
            argv = cli_argv(span)
            if len(argv) > (2 if argv[:1] == ["config"] else 1) and not re.search(r"[\[<|]|\.\.\.|…", span):
                found.append((str(path.relative_to(REPO)), None, argv))
    return found


def named_commands():
    """Every command named in the docs' prose as `suzumio <command>`."""
    text = {path: prose(path).replace(f"`{SERVE_STARTUP_LINE}", "") for path in DOC_FILES}
    return {(str(path.relative_to(REPO)), word)
            for path in DOC_FILES for word in re.findall(r"`suzumio ([a-z]+)", text[path])}


COMMAND_LINES = documented_command_lines()


def test_the_docs_show_every_cli_command():
    shown = {argv[0] for _, marker, argv in COMMAND_LINES if argv and marker != "usage-errors"}
    assert set(suzumio.COMMANDS) <= shown | {"help"}, set(suzumio.COMMANDS) - shown


@pytest.mark.parametrize("where,marker,argv", COMMAND_LINES,
                         ids=[f"{w}:{' '.join(a)[:60]}" for w, _, a in COMMAND_LINES])
def test_documented_command_line_parses_with_the_real_cli_parser(where, marker, argv):
    if marker == "usage-errors":
        with pytest.raises(suzumio_cli_args.UsageError):
            suzumio_cli_args.parse_args(argv)
    elif argv in (["--help"], ["-h"], ["help"]) or "--help" in argv or argv[:1] == ["help"]:
        with pytest.raises(suzumio_cli_args.HelpRequested):  # help prints a usage and exits 0
            suzumio_cli_args.parse_args(argv)
    elif argv == ["--version"]:
        assert suzumio_cli_args.parse_args(argv)[0] == "--version"
    else:
        command, _, _ = suzumio_cli_args.parse_args(argv)
        assert command in suzumio.COMMANDS


@pytest.mark.parametrize("where,word", sorted(named_commands()))
def test_command_named_in_the_docs_exists(where, word):
    assert word in suzumio.COMMANDS or word == "help"


def test_the_usage_text_in_cli_docs_is_the_real_one():
    assert suzumio_cli_args.USAGE.strip() in (DOCS / "cli.md").read_text(encoding="utf-8")


# ------------------------------------------------------------------------------------- routes

ROUTE = re.compile(r"\b(GET|POST)\s+`?(/[^\s`|,)…]*)")


def route_key(method, path):
    """(method, path) with every parameter segment (`:p`, `<p>`, `<asset:path>`) written as `{}`."""
    path = path.split("?")[0].rstrip(".")
    segments = ["{}" if re.fullmatch(r":\w+|<[^>]*>", s) else s for s in path.split("/")]
    return method, "/".join(segments)


def documented_routes(path):
    return {route_key(m, p) for m, p in ROUTE.findall(path.read_text(encoding="utf-8"))}


@pytest.fixture(scope="module")
def app_routes(tmp_path_factory):
    runtime = suzumio_runtime.build_runtime(suzumio_runtime.RuntimeOptions(
        root=tmp_path_factory.mktemp("routes") / "root", listeners=suzumio_runtime.Listeners(api_token=None)))
    try:
        yield {route_key(route.method, route.rule) for app in (runtime.app, runtime.runner_app) for route in app.routes}
    finally:
        runtime.close()


def test_every_route_in_the_docs_exists_in_the_app(app_routes):
    documented = set().union(*(documented_routes(p) for p in DOC_FILES))
    assert len(documented_routes(DOCS / "http-api.md")) >= 30
    assert documented - app_routes == set()


def test_every_route_of_the_app_is_documented_in_the_http_api_page(app_routes):
    assert app_routes - documented_routes(DOCS / "http-api.md") == set()


# ------------------------------------------------------------------------------ make targets

def test_make_targets_named_in_the_docs_exist():
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([\w.-]+):", makefile, re.MULTILINE))
    named = {t for path in DOC_FILES for t in re.findall(r"`make ([a-z][\w-]*)", prose(path))}
    named |= {line.split()[1] for block in ALL_BLOCKS if block.lang in SHELL_LANGS
              for line in shell_commands(block) if re.match(r"make [a-z]", line)}
    assert {"demo", "test"} <= named
    assert named - targets == set()


# ------------------------------------------------------------------------- example toolpack

def test_the_example_toolpack_validates_with_its_project():
    config = suzumio_config.load_project(EXAMPLES / "notes-project.yaml", env={})
    assert [agent.id for agent in config.agents] == ["pm", "writer"]
    entry = config.data["tools"]["toolpacks"][1]
    assert entry == {"path": str(EXAMPLES / "notes-toolpack"), "id": "notes"}
    assert config.warnings  # the local backend always warns


@pytest.fixture
def node():
    if shutil.which("node") is None:
        require("node")("Node.js is not installed")


@pytest.mark.timeout(120)
def test_the_example_toolpack_runs_end_to_end(tmp_path, node):
    project_dir = tmp_path / "examples"
    shutil.copytree(EXAMPLES, project_dir)
    text = (EXAMPLES / "notes-project.yaml").read_text(encoding="utf-8")
    with serving(tmp_path / "root", scheduler_interval=0.2) as service:
        store = init_project(service.root, project_dir, text)
        assert service.post("/api/projects/notes-demo/start").status_code == 200
        sent = service.post("/api/projects/notes-demo/messages",
                            {"recipient": "writer", "body": "Take notes on the release candidate."})
        assert sent.status_code == 200, sent.text
        wait_until(lambda: store.project()["status"] == "submitted", 60, message="notes-demo submitted")

        calls = {c["tool"]: c for c in service.get("/api/projects/notes-demo/tool-calls").json()}
        assert {"notes.word_count", "notes.add", "completion.submit"} <= set(calls), calls
        assert calls["notes.word_count"]["status"] == "completed"
        assert calls["notes.word_count"]["output"] == "6 words"
        assert calls["notes.add"]["output"] == "Saved note_1 (1 in the notebook)."
        assert calls["completion.submit"]["agent_id"] == "pm"

        events = service.get("/api/projects/notes-demo/events?limit=500").json()
        flagged = [e for e in events if e["type"] == "signal.created" and '"kind":"notes.flagged"' in e["data_json"]]
        assert len(flagged) == 1 and '"targetAgent":"pm"' in flagged[0]["data_json"]
        assert "writer flagged one note" in service.get("/api/projects/notes-demo/report").text

        listed = service.post("/api/projects/notes-demo/tool-ui/notes/notes.list")
        assert listed.json()["output"] == "note_1 [writer] (flagged) The release candidate passes every test."
        cleared = service.post("/api/projects/notes-demo/tool-ui/notes/notes.clear")
        assert cleared.json()["output"] == "Removed 1 notes."
        assert service.post("/api/projects/notes-demo/tool-ui/notes/notes.list").json()["output"] == "No notes yet."


# -------------------------------------------------------------------------------------- links

def heading_anchors(path):
    """GitHub's anchors for the headings of a Markdown file."""
    anchors = set()
    for line in prose(path).splitlines():
        heading = re.match(r"^#{1,6}\s+(.*)$", line)
        if heading:
            text = heading[1].strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
    return anchors


def relative_links():
    for path in DOC_FILES:
        for target in re.findall(r"\]\(([^)\s]+)\)", prose(path)):
            if not re.match(r"^[a-z]+:", target):
                yield path, target


@pytest.mark.parametrize("path,target", list(relative_links()),
                         ids=[f"{p.name}->{t}" for p, t in relative_links()])
def test_relative_link_points_at_an_existing_file_and_heading(path, target):
    file_part, _, anchor = target.partition("#")
    linked = (path.parent / file_part).resolve() if file_part else path
    assert linked.exists(), f"{path.name} links to a missing {file_part}"
    if anchor:
        assert anchor in heading_anchors(linked), f"{path.name} links to a missing heading #{anchor}"
