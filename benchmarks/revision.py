"""Which code trained a long benchmark's saved models, and whether its results may be written.

A benchmark that saves models and resumes across sessions keeps them in a
directory named by `Code.key`: a digest of the git trees its models depend
on, so a run resumes across commits that change none of them and never
reuses a model other code trained (with uncommitted changes to them, a name
no other run shares). It writes results only when `check_writable` finds
the run began on committed code and neither the commit nor that code
changed while it ran.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time

from testkit import results as results_lib


class CodeChanged(RuntimeError):
    """The code the models depend on changed while the benchmark ran."""


@dataclasses.dataclass(frozen=True)
class Code:
    """What a benchmark's trained models depend on.

    Attributes:
      paths: Directories (each entry keyed on its own) and `files`.
      not_training: Entries of those directories that train nothing (test helpers).
      files: The entries of `paths` that are files.
    """

    paths: tuple[str, ...]
    not_training: tuple[str, ...] = ()
    files: tuple[str, ...] = ()

    def trees(self, cwd: str = results_lib.REPO_ROOT) -> dict[str, str | None]:
        """The git object id at HEAD of each entry of `paths` (a directory's entries one
        by one, less `not_training`); None where git cannot say."""
        trees: dict[str, str | None] = {}
        for path in self.paths:
            listing = results_lib._git(
                "ls-tree", "-z", "HEAD", path if path in self.files else path + "/", cwd=cwd
            )
            if listing.returncode != 0 or not listing.stdout:
                trees[path] = None
                continue
            for entry in filter(None, listing.stdout.split("\0")):
                meta, name = entry.split("\t", 1)
                if name not in self.not_training:
                    trees[name] = meta.split()[2]
        return trees

    def changes(self, cwd: str = results_lib.REPO_ROOT) -> list[str] | None:
        """Uncommitted changes under `paths` (less `not_training`); None where git cannot say."""
        return results_lib.uncommitted(
            *self.paths, *(f":(exclude){p}" for p in self.not_training), cwd=cwd
        )

    def key(self, trees: dict[str, str | None] | None = None, dirty: bool | None = None) -> str:
        """The directory name of this code's runs (`revision_key` of its trees)."""
        trees = self.trees() if trees is None else trees
        if dirty is None:
            changes = self.changes()
            dirty = changes is None or bool(changes)
        return revision_key(trees, dirty)


def revision_key(trees: dict[str, str | None], dirty: bool | None) -> str:
    """A digest of `trees`, so a run resumes across commits that change none of them;
    with changes to them not committed (`dirty` not False) or a tree git cannot name,
    a name no other run shares, so no model trained by other code is reused."""
    key = hashlib.sha256(json.dumps(trees, sort_keys=True).encode()).hexdigest()[:12]
    if dirty is not False or not trees or None in trees.values():
        key += "-dirty-" + hashlib.sha256(str(time.time_ns()).encode()).hexdigest()[:8]
    return key


def check_unchanged(started: dict, trees: dict, now: dict, now_trees: dict) -> None:
    """Refuses results when the commit, the work tree's state or the code the models
    depend on differ between the start (`started`, `trees`) and the end (`now`,
    `now_trees`): models trained under one key by different code, or results credited
    to another commit. Any edit under `benchmarks/` counts, even another benchmark's
    (the results file names its commit and changes, so they must hold throughout); an
    edit made and reverted within the run is not seen.

    Raises:
      CodeChanged: naming the start's commit and what to do.
    """
    if now != started or now_trees != trees:
        raise CodeChanged(
            f"the code changed while the benchmark ran (started at {started['commit']}); "
            "nothing is written: commit or revert, then run again (finished models resume "
            "only where their code is unchanged)"
        )


def check_writable(
    key: str, started: dict, trees: dict, code: Code, cwd: str = results_lib.REPO_ROOT
) -> None:
    """`check_unchanged` against the repository at `cwd` now, after refusing a run whose
    `key` says it began on uncommitted code.

    Raises:
      CodeChanged: naming why nothing is written.
    """
    if "-dirty-" in key:
        raise CodeChanged(
            "the code had uncommitted changes when the benchmark started; nothing is "
            "written: commit, then run again"
        )
    check_unchanged(started, trees, results_lib.commit(cwd), code.trees(cwd))
