"""Claims about the code's structure, checked: where SQL lives, how large a class or a module may grow,
that every `.md` file a comment or a document names is in the repository, that README.md's module
table gives every module a layer that its imports respect (docs/design/README.md), and that the wheel
and the pex ship every module."""
import ast
import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MAX_CLASS_LINES = 700
MAX_MODULE_LINES = 1200
# SQL as this code base writes it: upper-case keywords, a statement's opening words or its clauses.
SQL = re.compile(r"^\s*(SELECT\s|INSERT\s+INTO\s|UPDATE\s+\w+\s+SET\s|DELETE\s+FROM\s|CREATE\s+(TABLE|INDEX|UNIQUE)\s"
                 r"|ALTER\s+TABLE\s|DROP\s+(TABLE|INDEX)\s|PRAGMA\s|BEGIN\b|COMMIT\b|ROLLBACK\b)"
                 r"|\sFROM\s+\w+\s+(WHERE|ORDER|GROUP|LIMIT|JOIN)\s|\sON\s+CONFLICT\s|\sWHERE\s+\w+\s*(=|IN)\s")


def modules(root=REPO):
    """The top-level Python modules of the project, by name."""
    return {path.stem: path for path in sorted(root.glob("suzumio*.py"))}


def is_store(name):
    return name == "suzumio_store" or name.startswith("suzumio_store_")


def _docstring_nodes(tree):
    nodes = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                nodes.add(id(body[0].value))
    return nodes


def sql_outside_the_store(root=REPO):
    """(module, line, text) of every string literal that reads as SQL outside the store layer."""
    found = []
    for name, path in modules(root).items():
        if is_store(name):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = _docstring_nodes(tree)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                    and SQL.search(node.value)):
                found.append((name, node.lineno, node.value[:60]))
    return found


def oversized(root=REPO):
    """Classes over MAX_CLASS_LINES and modules over MAX_MODULE_LINES lines, with their sizes."""
    found = []
    for name, path in modules(root).items():
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) > MAX_MODULE_LINES:
            found.append((name, len(text.splitlines())))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES:
                found.append((f"{name}.{node.name}", node.end_lineno - node.lineno + 1))
    return found


def test_every_sql_statement_is_in_the_store_layer():
    assert sql_outside_the_store() == []


def test_the_detector_sees_sql_in_a_module_outside_the_store(tmp_path):
    (tmp_path / "suzumio_store_x.py").write_text('Q = "SELECT * FROM agents WHERE id = ?"\n')
    (tmp_path / "suzumio_rules.py").write_text(
        '"""SELECT in a docstring is prose."""\n'
        'def f(tx):\n    return tx.one("SELECT id FROM approvals WHERE project = ?")\n'
        'G = "UPDATE approvals SET used_at = ? WHERE id = ?"\n')
    assert sorted((name, line) for name, line, _ in sql_outside_the_store(tmp_path)) == [
        ("suzumio_rules", 3), ("suzumio_rules", 4)]


def test_no_class_or_module_outgrows_its_limit():
    assert oversized() == []


# ---------------------------------------------------------------- every `.md` reference resolves

MD_REFERENCE = re.compile(r"(?<![\w/.$-])([\w][\w./-]*\.md)\b")
# Names of files the runtime writes, which comments mention as files, not as documents.
RUNTIME_FILES = {"final-report.md"}
CODE_SUFFIXES = (".py", ".mjs", ".js", ".ts", ".tsx", ".jsx")
HASH_SUFFIXES = (".sh", ".yaml", ".yml", ".toml")
FENCE = re.compile(r"^\s*(```|~~~).*?^\s*\1", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK_TARGET = re.compile(r"\]\(([^)\s#]+\.md)(?:#[^)]*)?\)")


def tracked_files(root=REPO):
    import subprocess
    listed = subprocess.run(["git", "-C", str(root), "ls-files"], capture_output=True, text=True, check=True)
    return [name for name in listed.stdout.split() if not name.startswith(("webui_dist/", "node_modules/"))]


def python_prose(text):
    """(line, text) of every comment and docstring of a Python source."""
    import io
    import tokenize
    found = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(text).readline)
             if tok.type == tokenize.COMMENT]
    docstrings = _docstring_nodes(tree := ast.parse(text))
    found += [(node.lineno, node.value) for node in ast.walk(tree) if id(node) in docstrings]
    return found


def script_prose(text):
    """(line, text) of the comments of a JavaScript or TypeScript source."""
    found = [(text.count("\n", 0, m.start()) + 1, m.group(0)) for m in re.finditer(r"/\*.*?\*/", text, re.S)]
    found += [(number, line[line.index("//"):]) for number, line in enumerate(text.splitlines(), 1)
              if re.search(r"(^|\s)//", line)]
    return found


def markdown_prose(text):
    """(0, text) of a Markdown page outside code (fenced blocks and inline spans), and its link targets."""
    prose = INLINE_CODE.sub("", FENCE.sub("", text))
    return [(0, prose)] + [(0, f"{target} ") for target in LINK_TARGET.findall(text)]


def hash_prose(text):
    """(line, text) of the `#` comments of a shell script, Dockerfile, Makefile, YAML or TOML file."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        match = re.search(r"(^|\s)#(?!!)", line)
        if match:
            found.append((number, INLINE_CODE.sub("", line[match.end() - 1:])))
    return found


def is_hash_commented(name):
    """Files whose comments start with `#`: shell scripts (scripts/* without a suffix, .ci/*), Dockerfiles,
    Makefiles, YAML and TOML."""
    base = name.rsplit("/", 1)[-1]
    return (name.endswith(HASH_SUFFIXES) or base.startswith("Dockerfile") or base == "Makefile"
            or (name.startswith(("scripts/", ".ci/")) and "." not in base))


def prose_of(root, name):
    path = root / name
    if not path.is_file():
        return []
    if name.endswith(".md"):
        return markdown_prose(path.read_text(encoding="utf-8"))
    python_script = name.startswith("scripts/") and path.read_text(encoding="utf-8", errors="replace").startswith(
        "#!/usr/bin/env python")
    if name.endswith(".py") or python_script:
        return python_prose(path.read_text(encoding="utf-8"))
    if name.endswith(CODE_SUFFIXES):
        return script_prose(path.read_text(encoding="utf-8"))
    if is_hash_commented(name):
        return hash_prose(path.read_text(encoding="utf-8", errors="replace"))
    return []


def missing_md_references(root=REPO, names=None):
    """(file, line, reference) of every `.md` file named in a comment, docstring or document that is
    in the repository neither beside the file that names it nor under the repository root."""
    missing = []
    for name in names or tracked_files(root):
        for line, text in prose_of(root, name):
            for ref in MD_REFERENCE.findall(text):
                target = ref.split("#")[0]
                if target in RUNTIME_FILES or target.startswith(("http:", "https:")):
                    continue
                if not ((root / name).parent / target).is_file() and not (root / target).is_file():
                    missing.append((name, line, ref))
    return missing


def test_every_md_reference_names_a_file_in_the_repository():
    assert missing_md_references() == []


def test_the_reference_check_sees_a_dead_reference_in_code_and_docs(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "scripts").mkdir()
    (tmp_path / "docker").mkdir()
    (tmp_path / "docs" / "here.md").write_text("See [there](there.md) and here.md; `data.md` is code.\n")
    (tmp_path / "suzumio_x.py").write_text('"""Rules of docs/here.md."""\n# store.md §4.2 says so\nNAME = "not.md"\n')
    (tmp_path / "app.ts").write_text("// webui.md §2\nconst a = 'b.md';\n")
    (tmp_path / "host.mjs").write_text("/* runner.md §3 */\nexport const x = 1;\n")
    (tmp_path / "scripts" / "tool").write_text("#!/bin/sh\n# see spec.md §1\necho notes.md\n")
    (tmp_path / "docker" / "Dockerfile").write_text("# image.md §14\nFROM debian\n")
    (tmp_path / "Makefile").write_text("all:  # make.md\n\ttrue\n")
    (tmp_path / "demo.yaml").write_text("# script.md\nbody: 'write part-a.md'  # docs/here.md\n")
    (tmp_path / "pyproject.toml").write_text('readme = "README.md"\n# ARCH.md asks for it\n')
    names = ["docs/here.md", "suzumio_x.py", "app.ts", "host.mjs", "scripts/tool", "docker/Dockerfile", "Makefile",
             "demo.yaml", "pyproject.toml"]
    found = missing_md_references(tmp_path, names)
    assert sorted((name, ref) for name, _, ref in found) == [
        ("Makefile", "make.md"), ("app.ts", "webui.md"), ("demo.yaml", "script.md"),
        ("docker/Dockerfile", "image.md"), ("docs/here.md", "there.md"), ("docs/here.md", "there.md"),
        ("host.mjs", "runner.md"), ("pyproject.toml", "ARCH.md"), ("scripts/tool", "spec.md"),
        ("suzumio_x.py", "store.md")]


# ---------------------------------------------------------------- every `#anchor` of a reference resolves

LINK_ANCHOR = re.compile(r"\]\(([^)\s#]*)#([^)\s]+)\)")
CITED_ANCHOR = re.compile(r"(?<![\w/.$-])([\w][\w./-]*\.md)#([\w-]+)")
HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.*?)(?:\s+#+)?\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")


def heading_slugs(text):
    """The anchors GitHub gives a Markdown page: each heading's text lowercased, links reduced to their
    text, every character but letters, digits, `_`, `-` and spaces dropped, spaces made `-`; a repeated
    slug gets `-1`, `-2`, …; plus explicit `<a id=…>` anchors."""
    slugs, seen = set(HTML_ANCHOR.findall(text)), {}
    for line in FENCE.sub("", text).splitlines():
        heading = HEADING.match(line)
        if not heading:
            continue
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1))
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        slugs.add(slug if count == 0 else f"{slug}-{count}")
    return slugs


def anchored_references(root, name):
    """(line, target file, anchor) of every Markdown link with an anchor, and of every cited page with one
    (`docs/operations.md#egress`)."""
    path = root / name
    if not path.is_file():
        return []
    if not name.endswith(".md"):
        return [(line, target, anchor) for line, text in prose_of(root, name)
                for target, anchor in CITED_ANCHOR.findall(text)]
    found = []
    for number, line in enumerate(FENCE.sub(lambda m: "\n" * m.group(0).count("\n"),
                                            path.read_text(encoding="utf-8")).splitlines(), 1):
        for target, anchor in LINK_ANCHOR.findall(line):
            if target == "" or target.endswith(".md"):
                found.append((number, target or path.name, anchor))
        found += [(number, target, anchor)
                  for target, anchor in CITED_ANCHOR.findall(INLINE_CODE.sub("", LINK_ANCHOR.sub("", line)))]
    return found


def dead_anchors(root=REPO, names=None):
    """(file, line, reference) of every `#anchor` that names no heading of the file it points into."""
    dead, slugs = [], {}
    for name in names or tracked_files(root):
        for line, target, anchor in anchored_references(root, name):
            for candidate in ((root / name).parent / target, root / target):
                if candidate.is_file():
                    break
            else:
                continue  # a missing file is the reference check's finding
            key = candidate.resolve()
            if key not in slugs:
                slugs[key] = heading_slugs(candidate.read_text(encoding="utf-8"))
            if anchor not in slugs[key]:
                dead.append((name, line, f"{target}#{anchor}"))
    return dead


def test_every_anchor_of_a_reference_names_a_heading():
    assert dead_anchors() == []


def test_the_anchor_check_sees_a_dead_anchor(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "ops.md").write_text(
        "# Operations\n\n## What survives what\n\n## Egress (`agents.<id>.egress`)\n\n"
        "## Egress (`agents.<id>.egress`)\n"
        "\n```\n# not a heading\n```\n\nSee [below](#what-survives-what) and [gone](#what-survives-which).\n")
    (tmp_path / "README.md").write_text(
        "[ok](docs/ops.md#egress-agentsidegress) [twice](docs/ops.md#egress-agentsidegress-1) "
        "[code](docs/ops.md#not-a-heading) [missing file](docs/none.md#x)\n")
    (tmp_path / "suzumio_x.py").write_text('"""As docs/ops.md#operations says; docs/ops.md#renamed is gone."""\n')
    found = dead_anchors(tmp_path, ["docs/ops.md", "README.md", "suzumio_x.py"])
    assert sorted((name, ref) for name, _, ref in found) == [
        ("README.md", "docs/ops.md#not-a-heading"), ("docs/ops.md", "ops.md#what-survives-which"),
        ("suzumio_x.py", "docs/ops.md#renamed")]


# ---------------------------------------------------------------- no history in comments

HISTORY = re.compile(r"\b[Ii]ssues? #?\d+\b|\bas before\b")


def history_in_comments(root=REPO):
    return [(name, line, match.group(0)) for name in tracked_files(root) if not name.endswith(".md")
            for line, text in prose_of(root, name) for match in HISTORY.finditer(text)]


def test_no_issue_numbers_or_history_in_comments():
    assert history_in_comments() == []


# ---------------------------------------------------------------- layers

TABLE_ROW = re.compile(r"^\|\s*(?P<paths>[^|]+?)\s*\|\s*(?P<layer>[^|]+?)\s*\|")


def module_layers(readme):
    """{module: layer} of README.md's module table, and the layers in table order (bottom first)."""
    section = readme[readme.index("## Where things are"):]
    section = section[:section.index("\n## ", 1)] if "\n## " in section[1:] else section
    layers, order = {}, []
    for line in section.splitlines():
        row = TABLE_ROW.match(line)
        if not row or row["layer"] in ("Layer", "---", "—"):
            continue
        for name in re.findall(r"`(suzumio\w*)\.py`", row["paths"]):
            layers[name] = row["layer"]
        if row["layer"] not in order:
            order.append(row["layer"])
    return layers, order


def imports_of(path, known):
    """The project modules a module imports, at any depth of its code (function-level ones too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        found.update(name.split(".")[0] for name in names if name.split(".")[0] in known)
    found.discard(path.stem)
    return found


def layer_problems(root=REPO):
    """Modules missing from the table, upward imports, and import cycles, as lines."""
    layers, order = module_layers((root / "README.md").read_text(encoding="utf-8"))
    found = modules(root)
    graph = {name: imports_of(path, found) for name, path in found.items()}
    problems = [f"{name}: not in README.md's module table" for name in sorted(set(found) - set(layers))]
    problems += [f"{name}: in README.md's module table but not a module" for name in sorted(set(layers) - set(found))]
    for name, deps in sorted(graph.items()):
        for dep in sorted(deps):
            if name in layers and dep in layers and order.index(layers[dep]) > order.index(layers[name]):
                problems.append(f"{name} ({layers[name]}) imports {dep} ({layers[dep]}), a higher layer")
    problems += [f"import cycle: {' -> '.join(cycle)}" for cycle in import_cycles(graph)]
    return problems


def import_cycles(graph):
    """One cycle per strongly connected group of modules that import each other (Tarjan)."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in sorted(graph.get(node, ())):
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                cycles.append(sorted(group) + [sorted(group)[0]])

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_every_module_has_a_layer_and_imports_only_downwards_without_cycles():
    assert layer_problems() == []


def test_the_layer_check_sees_a_missing_module_an_upward_import_and_a_cycle(tmp_path):
    (tmp_path / "README.md").write_text(
        "## Where things are\n\n| Path | Layer | What |\n|---|---|---|\n"
        "| `suzumio_low.py` | base | x |\n| `suzumio_high.py`, `suzumio_peer.py` | top | y |\n")
    (tmp_path / "suzumio_low.py").write_text("def f():\n    import suzumio_high\n")
    (tmp_path / "suzumio_high.py").write_text("import suzumio_low\nimport suzumio_peer\n")
    (tmp_path / "suzumio_peer.py").write_text("from suzumio_high import x\n")
    (tmp_path / "suzumio_new.py").write_text("")
    assert layer_problems(tmp_path) == [
        "suzumio_new: not in README.md's module table",
        "suzumio_low (base) imports suzumio_high (top), a higher layer",
        "import cycle: suzumio_high -> suzumio_low -> suzumio_peer -> suzumio_high",
    ]


def unpackaged(root=REPO):
    """Top-level modules that pyproject.toml's `py-modules` (what the wheel and the pex ship) leaves out."""
    with (root / "pyproject.toml").open("rb") as handle:
        listed = set(tomllib.load(handle)["tool"]["setuptools"]["py-modules"])
    return sorted(set(modules(root)) - listed)


def test_every_module_is_packaged():
    assert unpackaged() == []


def test_the_packaging_check_sees_a_module_left_out(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.setuptools]\npy-modules = ["suzumio"]\n')
    (tmp_path / "suzumio.py").write_text("")
    (tmp_path / "suzumio_new.py").write_text("")
    assert unpackaged(tmp_path) == ["suzumio_new"]


# ---------------------------------------------------------------- one seam for the backends

# The contract (suzumio_backend_contract) and the modules that implement it: the only places that may
# branch on a backend kind or read a runner's recorded name. The facade, suzumio_backend, asks them too.
BACKEND_FILES = {"suzumio_backend_contract", "suzumio_backend_local", "suzumio_backend_docker", "suzumio_backend_swarm"}
# The config layer sits below the backends and describes each kind's settings (render's warnings, a
# swarm network, the kinds a repository works with): it may compare backend.kind with the contract's
# constants, never with a literal.
CONFIG_FILES = {"suzumio_config", "suzumio_config_schema", "suzumio_config_swarm", "suzumio_config_repository"}
KIND_VALUE = r"""(?:KIND_(?:LOCAL|DOCKER|SWARM)\b|["'](?:local|docker-chat|swarm)["'])"""
KIND_LITERAL = r"""["'](?:local|docker-chat|swarm)["']"""
KIND_BRANCH = re.compile(
    rf"\bkind[\"'\]]*\s*(?:==|!=)\s*{KIND_VALUE}|{KIND_VALUE}\s*(?:==|!=)\s*[\w.\[\]\"']*kind\b"
    rf"|\bkind\s+(?:not\s+)?in\s+\(?[^\n:]*{KIND_VALUE}|\bbackend\.kind\s*(?:==|!=|in\b|not\s+in\b)|CONTAINER_KINDS")
LITERAL_BRANCH = re.compile(
    rf"\bkind[\"'\]]*\s*(?:==|!=)\s*{KIND_LITERAL}|{KIND_LITERAL}\s*(?:==|!=)\s*[\w.\[\]\"']*kind\b")
NAME_PARSING = re.compile(r"""startswith\(\s*(?:["'](?:suzumio[_-]|local-|swarm:)|LOCAL_PREFIX|SWARM_PREFIX"""
                          r"""|CONTAINER_PREFIX)|\blocal_pid\(|\bswarm_service\(|containerName"\]\.(?:split|partition)""")


def backend_dispatch_outside_the_backends(root=REPO):
    """(module, line, text) of every branch on a backend kind and every reading of a runner's recorded
    name outside the backend files; in the config layer, of a kind compared with a literal."""
    found = []
    for name, path in modules(root).items():
        if name in BACKEND_FILES:
            continue
        patterns = [LITERAL_BRANCH] if name in CONFIG_FILES else [KIND_BRANCH, NAME_PARSING]
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#", 1)[0]
            if any(pattern.search(code) for pattern in patterns):
                found.append((name, number, line.strip()))
    return found


def test_only_the_backends_branch_on_a_backend_kind_or_read_a_runners_name():
    assert backend_dispatch_outside_the_backends() == []


def test_the_backend_dispatch_check_sees_kind_branches_and_name_parsing(tmp_path):
    (tmp_path / "suzumio_backend_local.py").write_text('if kind == "local":\n    pass\n')
    (tmp_path / "suzumio_config.py").write_text('a = kind == KIND_SWARM\nb = config.backend.kind != "local"\n')
    (tmp_path / "suzumio_caller.py").write_text(
        'if config.backend.kind == KIND_DOCKER:\n    pass\n'
        'docker_used = store.config()["backend"]["kind"] == "docker-chat"\n'
        'if kind in (KIND_LOCAL, KIND_SWARM):\n    pass\n'
        'if name.startswith("swarm:"):\n    pass\n'
        'pid = local_pid(name)\n'
        'if pack.kind == "mcp" or kind == "text":\n    pass\n'
        'label = "builtin" if builtin else "local"\n')
    assert [(name, line) for name, line, _ in backend_dispatch_outside_the_backends(tmp_path)] == [
        ("suzumio_caller", 1), ("suzumio_caller", 3), ("suzumio_caller", 4), ("suzumio_caller", 6),
        ("suzumio_caller", 8), ("suzumio_config", 2)]
