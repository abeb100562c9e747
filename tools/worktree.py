"""Another commit checked out beside the working tree, for the tools that
run both and compare (tools/regression_z.py, benchmarks/bench_vs_commit.py):
``git worktree add --detach`` into a directory of the caller's, removed
again at the end (forced; where git cannot remove it, the directory is
deleted and the repository's worktree list pruned).

  with Checkout(repo, "102acfd", os.path.join(tmp, "old-tree")) as old:
      run(old.path)            # old.commit: the full hash

(or ``old = Checkout(...).add()`` ... ``old.remove()`` where a with-block
does not fit the caller's own try/finally).
"""
import shutil
import subprocess


class WorktreeError(RuntimeError):
    """The commit is not in the repository, or git cannot check it out."""


def _git(repo, *args):
    r = subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True)
    if r.returncode:
        raise WorktreeError(f"git {' '.join(args)}: {(r.stderr or r.stdout).strip()}")
    return r.stdout.strip()


def resolve(repo, commit):
    """The full hash of `commit` (a hash, a tag, a branch, HEAD~3)."""
    return _git(repo, "rev-parse", "--verify", f"{commit}^{{commit}}")


class Checkout:
    def __init__(self, repo, commit, path):
        self.repo, self.path = repo, path
        self.commit = resolve(repo, commit)
        self.added = False

    def add(self):
        _git(self.repo, "worktree", "add", "--detach", self.path, self.commit)
        self.added = True
        return self

    __enter__ = add

    def remove(self):
        if not self.added:
            return
        self.added = False
        r = subprocess.run(["git", "-C", self.repo, "worktree", "remove", "--force",
                            self.path], capture_output=True, text=True)
        if r.returncode:
            shutil.rmtree(self.path, ignore_errors=True)
            subprocess.run(["git", "-C", self.repo, "worktree", "prune"], capture_output=True)

    def __exit__(self, *exc):
        self.remove()
        return False
