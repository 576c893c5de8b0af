"""The `ssh` backend: a list of existing hosts (head first) reached with OpenSSH; nothing is
provisioned. The launcher is also the one EC2 nodes are reached with (`infra.aws`).

Contract: `gpucluster.infra.contract`. `TRAITS` here (plain values); `plugin.PLUGIN` holds its
parts. Modules: provider (`SshProvider`, host list checks), launch (`SshLauncher`: ships the job,
runs one torchrun agent per host), session (the connections), remote (programs run on the
nodes), ship (the bundle), cleanup (leftover processes)."""

from __future__ import annotations

from gpucluster.infra.contract import Traits

TRAITS = Traits(
    name="ssh",
    max_nodes=64,
    flags=("hosts", "identity", "known_hosts",  # aws: the cluster's own key and pinned host keys
           "remote_python", "data", "setup", "resume"),
    flags_refused_why="the ssh backend uses machines that already exist",
)
