"""A fixture repository for the team-repository tests: a small git repository made with the real `git`,
with the files two workers change, a file two agents both change, and a check that fails when a file
named BROKEN exists; a project whose workers have working copies of it, and what a test reads of a git
folder (its branches, `git fsck`). Imported by the repository tests."""
import io
import subprocess

import yaml

import suzumio
import suzumio_store
from suzumio_config import ProjectConfig

CHECK = "test ! -e BROKEN && grep -q '^shared' shared.txt"


def git(folder, *args):
    done = subprocess.run(["git", "-c", "user.name=Fixture", "-c", "user.email=fixture@example.com", *args],
                          cwd=folder, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def make_fixture_repository(folder, bare=False):
    """A repository on `main` with two commits; returns its path (a bare copy's with `bare`)."""
    work = folder / "fixture-src"
    work.mkdir(parents=True)
    git(work, "init", "--quiet", "--initial-branch=main")
    (work / "README.md").write_text("# Fixture\n", encoding="utf-8")
    git(work, "add", "-A")
    git(work, "commit", "--quiet", "-m", "Initial commit")
    (work / "a.txt").write_text("a\n", encoding="utf-8")
    (work / "b.txt").write_text("b\n", encoding="utf-8")
    (work / "shared.txt").write_text("shared line one\nshared line two\n", encoding="utf-8")
    git(work, "add", "-A")
    git(work, "commit", "--quiet", "-m", "Add the files")
    if not bare:
        return work
    target = folder / "fixture.git"
    subprocess.run(["git", "clone", "--quiet", "--bare", str(work), str(target)], check=True, capture_output=True)
    return target


def log_subjects(git_dir, ref="main"):
    return git(git_dir, "log", "--format=%s", ref).splitlines()


# ---------------------------------------------------------------- a project with a repository

def repository_project_config(source, checks, name="code"):
    """A project file (as a mapping) whose workers w1 and w2 have working copies of `source`: the scripted
    provider, so a real serve can run it offline; pm, the coordinator, only waits. No nudges: nothing
    but the merge queue acts on its own."""
    wait = {"name": "coordination.wait_for_signal", "input": {"reason": "Waiting.", "notifyPm": False}}
    script = {"agents": {name: [{"steps": [{"tools": [wait]}]}] for name in ("pm", "w1", "w2")}}
    return {
        "name": name, "task": "Write code.",
        "scheduler": {"noEffectNudge": {"enabled": False}, "failedNudge": {"enabled": False},
                      "allQuietNudge": {"enabled": False}},
        "backend": {"kind": "local", "runner": {"model": "offline", "models": {
            "providers": {"replay": {"type": "scripted", "script": script}},
            "presets": {"offline": {"provider": "replay", "model": "code-team"}}}}},
        "agents": {"pm": {"tools": ["coordination.wait_for_signal"]},
                   "w1": {"tools": ["repo.*", "coordination.wait_for_signal"]},
                   "w2": {"tools": ["repo.*", "coordination.wait_for_signal"]}},
        "repository": {"source": str(source), "checks": list(checks), "agents": ["w*"]},
    }


def cli(*argv):
    """`suzumio ARGV…` through its entry point: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    code = suzumio.main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def init_repository_project(folder, source, checks, name="code"):
    """`suzumio init` of repository_project_config under `folder`/root: (store, config, root), the root open."""
    path = folder / "project.yaml"
    path.write_text(yaml.safe_dump(repository_project_config(source, checks, name)), encoding="utf-8")
    code, _, err = cli("init", str(path), "--root", str(folder / "root"))
    assert code == 0, err
    root = suzumio_store.Root(folder / "root")
    store = root.open_project(name)
    return store, ProjectConfig.from_data(store.config()), root


class NoWake:
    """The queue a `repo.merge` tells, for a test that lands (or lets a serve land) the request itself."""

    def wake(self, store):
        return None


def branch_heads(git_dir):
    """{ref: commit} of every branch, read by git itself."""
    lines = git(git_dir, "for-each-ref", "--format=%(refname) %(objectname)", "refs/heads").splitlines()
    return dict(line.split(" ") for line in lines)


def fsck(git_dir):
    """`git fsck --full --strict`: raises (with git's report) unless every object and ref is sound."""
    return git(git_dir, "fsck", "--full", "--strict", "--no-progress")
