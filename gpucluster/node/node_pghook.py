"""Whether a user's script joined a torch.distributed process group (issue 46 item 2): the
`sitecustomize.py` a worker of a user's command finds first on its PYTHONPATH.

The launchers ship this file as `sitecustomize.py` into a folder of the run (local: a temporary
folder; ssh: the node folder; Kubernetes: the pods' program mount) named by GPUCLUSTER_PG_HOOK;
the announcer (node_announce.py) puts that folder first on the worker's PYTHONPATH (the torchrun
agent and --setup never see it). In the worker's Python it:

- says it is there, once per worker (the first Python of the worker's process tree; its children
  inherit GPUCLUSTER_PG_SAID and stay quiet): `pg_hook` with the worker's RANK;
- wraps `init_process_group` of `torch.distributed.distributed_c10d` when (if ever) that module
  is imported, through a one-shot `sys.meta_path` finder that wraps the real loader, so that
  `torch.distributed`'s `from .distributed_c10d import *` (and `init_device_mesh`, which calls it)
  get the wrapper; once the call returns it says `pg_join` (RANK, the group's rank, world size and
  backend);
- runs the `sitecustomize` it hides (Debian's, a user's), as Python would have, and leaves it as
  the module named `sitecustomize`.

It never imports torch, and a failure of its own is swallowed (never raised into the script). Its
records are metric lines on stderr (fd 2), read like any other. A Python started with -S, -I or -E,
or by a wrapper that replaces PYTHONPATH, never loads it: the rank says nothing, and whether it
joined is "not known" (never "no rank joined").

Standard library only: it runs in the user's Python, on any node.
"""

import os
import sys

TARGET = "torch.distributed.distributed_c10d"
PREFIX = "@gpucluster-metric "  # gpucluster.workloads.protocol.PREFIX (this file is standard library only)
SAID = "GPUCLUSTER_PG_SAID"
_WRAPPERS: list = []  # the wrappers made (a module executed twice is wrapped once)


def _say(kind, **fields):
    """One metric record on fd 2, written at once (never through the script's sys.stderr)."""
    try:
        rank = os.environ.get("RANK", "")
        rec = '{"kind": "%s"' % kind + (', "rank": %d' % int(rank) if rank.isdigit() else "")
        if fields:  # after init_process_group: torch has imported json long before
            import json

            rec += ", " + json.dumps(fields)[1:-1]
        os.write(2, (PREFIX + rec + "}\n").encode())
    except Exception:  # noqa: BLE001 - a closed stderr, anything: never the script's problem
        pass


def _joined(module):
    fields = {}
    for key, name in (("group_rank", "get_rank"), ("world_size", "get_world_size"), ("backend", "get_backend")):
        try:
            value = getattr(module, name)()
            fields[key] = value if isinstance(value, int) else str(value)
        except Exception:  # noqa: BLE001
            pass
    _say("pg_join", **fields)


def _wrap(module):
    original = getattr(module, "init_process_group", None)
    if original is None or any(original is w for w in _WRAPPERS):
        return
    import functools

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        result = original(*args, **kwargs)
        try:
            _joined(module)
        except Exception:  # noqa: BLE001
            pass
        return result

    _WRAPPERS.append(init_process_group)
    module.init_process_group = init_process_group


class _Loader:
    """The real loader of the c10d module, then the wrap."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)  # the module's own errors are the import's, as without the hook
        try:
            _wrap(module)
        except Exception:  # noqa: BLE001
            pass

    def __getattr__(self, name):  # get_resource_reader, is_package, ...: the real loader's
        if name == "loader":
            raise AttributeError(name)
        return getattr(self.loader, name)


class _Finder:
    """A `sys.meta_path` finder that answers for the c10d module only, once."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != TARGET:
            return None
        try:
            self.leave()
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                spec = find(fullname, path, target) if find is not None else None
                if spec is not None:
                    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                        spec.loader = _Loader(spec.loader)
                    return spec
        except Exception:  # noqa: BLE001 - the normal import goes on without the hook
            pass
        return None

    def leave(self):
        while self in sys.meta_path:
            sys.meta_path.remove(self)


def _chain(here):
    """The sitecustomize this one hides, run as Python would have run it, left as `sitecustomize`.
    Its own errors are raised as they would have been (site.py says them and goes on)."""
    try:
        from importlib.machinery import PathFinder

        rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
        spec = PathFinder.find_spec("sitecustomize", rest)
        if spec is None or spec.loader is None:
            return
        from importlib.util import module_from_spec  # only when there is one (Debian's, a user's)

        module = module_from_spec(spec)
    except Exception:  # noqa: BLE001
        return
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def install():
    try:
        if os.environ.get("GPUCLUSTER_PG_HOOK") is None:
            return
        if TARGET not in sys.modules:
            sys.meta_path.insert(0, _Finder())
        if os.environ.get(SAID) is None:
            os.environ[SAID] = "1"  # the processes it starts (DataLoader workers, a second script) stay quiet
            _say("pg_hook")
    except Exception:  # noqa: BLE001
        pass


if __name__ == "sitecustomize":  # as the worker's Python imports it (imported as a module of gpucluster: nothing)
    install()
    _chain(os.path.dirname(os.path.abspath(__file__)))
