"""A fixture repository for the team-repository tests: a small git repository made with the real `git`,
with the files two workers change, a file two agents both change, and a check that fails when a file
named BROKEN exists. Imported by test_repository and test_e2e_repository."""
import subprocess

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
