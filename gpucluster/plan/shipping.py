"""What of a script's folder is shipped to the nodes (every backend: ssh/aws tar bundle, local
per-node copies, gcp ConfigMap), chosen in one place.

Git-tracked files are shipped whatever `.gitignore` says (git never applies it to a file it tracks;
asked with `git ls-files`); only `.gpuclusterignore` rules and the tool folders below leave one out.
Of the others, left out:
- tool folders (`SKIP_DIRS`: .git, virtualenvs, caches, node_modules) and `.pyc` files;
- what `.gitignore` files ignore, as git reads them: the one in each folder applies to the paths
  below that folder; those of the folders above the script's folder count too, up to the
  repository's top (the folder holding `.git`); a deeper file's rule wins, `!pattern` takes a path
  back, and nothing is taken back from a folder that is ignored as a whole;
- what `.gpuclusterignore` files ignore (the same syntax and places; read after the folder's
  .gitignore, so `!pattern` there ships a file git ignores, e.g. a small checkpoint to resume from).

Patterns are matched with the `pathspec` library's git-style matcher (GitIgnoreSpec). Links are
shipped as links, never followed. The whole shipment is measured before anything is sent: over
`limit`, the error names the largest files, so they can be added to .gpuclusterignore.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Protocol

from gpucluster.errors import UsageError

if TYPE_CHECKING:
    from pathspec import GitIgnoreSpec

MAX_SHIP_BYTES = 200 * 1024 * 1024
SKIP_DIRS = frozenset({".git", ".hg", ".svn", ".venv", "venv", "__pycache__", "node_modules", ".mypy_cache",
                       ".pytest_cache"})
IGNORE_FILES = (".gitignore", ".gpuclusterignore")
LARGEST_SHOWN = 5
LEFT_OUT_SHOWN = 3  # the left-out paths the plan names


@dataclass(frozen=True)
class Entry:
    rel: str  # posix path relative to the shipped folder
    size: int  # bytes (a link: 0)
    link: bool = False


@dataclass
class Shipment:
    root: Path
    entries: list[Entry] = field(default_factory=list)
    ignored: int = 0  # files and folders left out by .gitignore / .gpuclusterignore rules
    left_out: list[str] = field(default_factory=list)  # their paths (a folder ends with '/')

    @property
    def total(self) -> int:
        return sum(e.size for e in self.entries)

    @property
    def files(self) -> int:
        return len(self.entries)

    def summary(self) -> str:
        """"12 file(s), 3.4 MB (5 left out by .gitignore/.gpuclusterignore: data/, a.bin, b.pkl, ...)"."""
        if not self.ignored:
            return f"{self.files} file(s), {human(self.total)}"
        names = ", ".join(self.left_out[:LEFT_OUT_SHOWN]) + (", ..." if self.ignored > LEFT_OUT_SHOWN else "")
        return f"{self.files} file(s), {human(self.total)} ({self.ignored} left out by .gitignore/.gpuclusterignore: {names})"

    def named_left_out(self, args: Iterable[str]) -> list[str]:
        """The command's arguments that name a path left out (itself or a path under a folder left
        out), read as the job reads them, from the shipped folder: the job would not find them."""
        root = self.root.resolve()
        out = []
        for arg in args:
            value = arg.split("=", 1)[1] if arg.startswith("-") and "=" in arg else arg
            if not value or value.startswith("-") or "://" in value:
                continue
            try:
                rel = (root / value).resolve().relative_to(root).as_posix()
            except (ValueError, OSError):
                continue
            if any(rel == p.rstrip("/") or (p.endswith("/") and rel.startswith(p)) for p in self.left_out):
                out.append(value)
        return out

    def require(self, rel: str) -> None:
        """UsageError when the script itself (`rel`) is left out by an ignore rule."""
        if rel not in {e.rel for e in self.entries}:
            raise UsageError(f"{rel!r} in {str(self.root)!r} is left out by a .gitignore or .gpuclusterignore "
                             f"rule, so it would not reach the nodes; add the line !{rel} to "
                             f"{self.root / '.gpuclusterignore'}")

    def largest(self, n: int = LARGEST_SHOWN) -> list[Entry]:
        return sorted(self.entries, key=lambda e: (-e.size, e.rel))[:n]

    def check_limit(self, limit: int = MAX_SHIP_BYTES, what: str = "copy to every node") -> None:
        """UsageError (exit 2) when the shipment is over `limit`, naming its largest files."""
        if self.total <= limit:
            return
        big = ", ".join(f"{e.rel} ({human(e.size)})" for e in self.largest())
        raise UsageError(f"the script's folder {str(self.root)!r} holds {human(self.total)} to {what}, over the "
                         f"{human(limit)} limit; largest: {big}. Add what the job does not need to a "
                         ".gpuclusterignore file there (or .gitignore), put data in a --data folder or object "
                         "storage, or put the script in a folder of its own")


def human(n: float) -> str:
    """Bytes as people read them: 512 B, 3.4 KiB, 200.0 MiB, 1.2 GiB."""
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def shipment(root: Path, *, exclude: Iterable[Path] = (), skip_hidden: bool = False) -> Shipment:
    """What of `root` is shipped (see the module's docstring). `exclude`: folders never shipped, nor
    any folder holding one (e.g. the node folders, under GPUCLUSTER_HOME inside the script's
    folder); `skip_hidden`: leave out every name starting with '.' too (gcp: the ConfigMap holds 1 MiB)."""
    root = Path(root)
    out = Shipment(root=root)
    from gpucluster.home import home_dir

    never = {Path(p).resolve() for p in (*exclude, home_dir(create=False))}  # gpucluster's own state: never shipped
    rules = _outer_rules(root.resolve())
    _Walk(never, skip_hidden, out, _Tracked(tracked_files(root))).folder(root, "", rules)
    return out


def tracked_files(root: Path) -> set[str]:
    """The files under `root` that git tracks (paths relative to `root`); empty outside a
    repository or without git."""
    import subprocess

    try:
        got = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached"], capture_output=True, timeout=60,
                             env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"})
    except (OSError, subprocess.SubprocessError):
        return set()
    if got.returncode != 0:
        return set()
    return {p for p in got.stdout.decode("utf-8", "surrogateescape").split("\0") if p}


class _Tracked:
    """Tracked files and the folders holding them (a folder an ignore rule names is still entered for them)."""

    def __init__(self, files: set[str]):
        self.files = files
        self.dirs = {"/".join(f.split("/")[:i]) + "/" for f in files for i in range(1, f.count("/") + 1)}


class _Verdict(Protocol):
    """What a rule file says of a path (pathspec's CheckResult): include True, False, or None (no word)."""

    @property
    def include(self) -> bool | None: ...


class _RuleFile(Protocol):
    """A rule file's spec: pathspec's GitIgnoreSpec, or `_Outer` for one above the shipped folder."""

    def check_file(self, file: str, /) -> _Verdict: ...


Rules = list[tuple[str, _RuleFile, str]]  # (folder relative to root, "" for root or above; the spec; file name)


@dataclass
class _Walk:
    """One walk of a shipment's folders: what it never enters, what it leaves out, what it keeps."""

    never: set[Path]
    skip_hidden: bool
    out: Shipment
    tracked: _Tracked

    def folder(self, folder: Path, rel: str, rules: Rules, inside_ignored: bool = False) -> None:
        """`inside_ignored`: `folder` is ignored as a whole and entered only for its tracked files."""
        rules = rules + _rules_in(folder, rel)
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            return  # an unreadable folder: what it holds cannot be shipped (tar/copy would fail the same way)
        for name in names:
            self.name(folder / name, name, f"{rel}{name}", rules, inside_ignored)

    def _never(self, path: Path, name: str, is_dir: bool) -> bool:
        """A folder never shipped (SKIP_DIRS, gpucluster's own state) or a .pyc file."""
        if is_dir and (name in SKIP_DIRS or any(path.resolve() == n or path.resolve() in n.parents for n in self.never)):
            return True
        return not is_dir and name.endswith(".pyc")

    def name(self, path: Path, name: str, sub: str, rules: Rules, inside_ignored: bool) -> None:
        if self.skip_hidden and name.startswith("."):
            return
        try:
            st = path.lstat()
        except OSError:
            return
        link = path.is_symlink()
        is_dir = not link and path.is_dir()
        if self._never(path, name, is_dir):
            return
        key = sub + ("/" if is_dir else "")
        if self._placed(path, key, rules, is_dir, inside_ignored):
            return
        if link or path.is_file():
            self.out.entries.append(Entry(sub, 0 if link else st.st_size, link))

    def _placed(self, path: Path, key: str, rules: Rules, is_dir: bool, inside_ignored: bool) -> bool:
        """Left out, or a folder walked: True; a file to ship: False."""
        if key in self.tracked.files or key in self.tracked.dirs:  # git ignores no tracked file: only .gpuclusterignore may
            if _ignored([r for r in rules if r[2] == ".gpuclusterignore"], key):
                _left_out(self.out, key)
                return True
            if is_dir:
                self.folder(path, key, rules, inside_ignored or _ignored(rules, key))
                return True
            return False
        if inside_ignored or _ignored(rules, key):
            _left_out(self.out, key)
            return True
        if is_dir:
            self.folder(path, key, rules)
            return True
        return False


def _left_out(out: Shipment, rel: str) -> None:
    out.ignored += 1
    out.left_out.append(rel)


def _ignored(rules: Rules, rel: str) -> bool:
    """The last rule file with a word on `rel` decides (deeper files come later)."""
    decision = False
    for base, spec, _name in rules:
        if base and not rel.startswith(base):
            continue
        result = spec.check_file(rel[len(base):])
        if result.include is not None:
            decision = bool(result.include)
    return decision


def _spec(lines: list[str]) -> GitIgnoreSpec:
    import pathspec

    return pathspec.GitIgnoreSpec.from_lines(lines)


MAX_IGNORE_BYTES = 1 << 20  # a .gitignore is a few KB


def _read(path: Path) -> list[str] | None:
    """An ignore file's lines; None when there is none. One that is not a regular file (a FIFO
    would block, /dev/zero never ends) or is over MAX_IGNORE_BYTES: UsageError (exit 2)."""
    from gpucluster.userfile import read_bounded

    try:
        data = read_bounded(path, "ignore file", MAX_IGNORE_BYTES, hint="a file of git ignore patterns")
    except (FileNotFoundError, NotADirectoryError):
        return None
    return data.decode("utf-8", errors="replace").splitlines()


def _rules_in(folder: Path, rel: str) -> Rules:
    found: Rules = []
    for name in IGNORE_FILES:
        lines = _read(folder / name)
        if lines:
            found.append((rel, _spec(lines), name))
    return found


def _outer_rules(root: Path) -> Rules:
    """The ignore files of the folders above `root`, up to the repository's top (a folder holding
    .git), outermost first, each matching paths as seen from its own folder. None outside a
    repository. A rule that ignores `root` itself or a folder above it is not applied: the user runs a
    script from that folder on purpose, and what it holds is what the job needs."""
    top = next((f for f in (root, *root.parents) if (f / ".git").exists()), None)
    if top is None or top == root:
        return []
    chain = [f for f in root.parents if f == top or top in f.parents]  # innermost first
    rules: Rules = []
    for outer in reversed(chain):
        prefix = root.relative_to(outer).as_posix() + "/"
        for name in IGNORE_FILES:
            lines = _read(outer / name)
            if lines:
                rules.append(("", _Outer(_spec(lines), prefix), name))
    return rules


class _Outer:
    """A rule file above the shipped folder: paths are matched as seen from its own folder, less
    the rules that ignore the shipped folder or a folder above it."""

    def __init__(self, spec: GitIgnoreSpec, prefix: str):
        self.spec, self.prefix = spec, prefix
        parts = prefix.rstrip("/").split("/")
        found = (spec.check_file("/".join(parts[:i]) + "/") for i in range(1, len(parts) + 1))
        self.above = {r.index for r in found if r.include}

    def check_file(self, rel: str, /) -> _Verdict:
        result = self.spec.check_file(self.prefix + rel)
        if result.include and result.index in self.above:
            return _NO_WORD
        return result


class _NoWord:
    include = None


_NO_WORD = _NoWord()
