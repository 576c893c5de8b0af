"""What an EC2 node of a gpucluster cluster runs at boot: the cloud-init user data.

`render_user_data(...)` writes, for every node of a cluster (one launch template): a fresh ed25519
host key per node, printed to the serial console (so the launcher pins host keys instead of trusting
on first use), a dead-man switch armed on every boot (power off, hence
terminate, at first boot + max lifetime: `DEADMAN_SCRIPT`, `DEADMAN_UNIT`), with option idleMinutes
an idle stop (`IDLE_SCRIPT`, `IDLE_UNIT`: power off after that long without a job), with option
`image=base` a step that installs torch at the PyTorch DLAMI's python path (`SETUP_TORCH_SCRIPT`),
and the readiness check that writes `READY_FILE` after counting the GPUs (`READY_SCRIPT`). Used by
the Pulumi component (`infra.aws.component`) and the dry run.
"""

from __future__ import annotations

from pathlib import Path

import functools
from gpucluster.states import JsonObject

import yaml

from gpucluster.infra.aws import catalog


def _program(name: str) -> str:
    """The text of a program that runs on a node (a file of this package, shipped by content)."""
    return (Path(__file__).parent / name).read_text()


STATE_DIR = "/var/lib/gpucluster"
READY_FILE = f"{STATE_DIR}/ready"  # JSON: {"ok": bool, "gpus": n, "expected_gpus": n, ...}
DEADLINE_FILE = f"{STATE_DIR}/deadline"  # epoch seconds at which the node powers itself off
READY_SCRIPT_PATH = "/usr/local/sbin/gpucluster-ready"
SETUP_TORCH_PATH = "/usr/local/sbin/gpucluster-setup-torch"

# image=base only: the Base DLAMI has no PyTorch. Install it into a venv at the PyTorch DLAMI's
# python_location, so the launcher uses one path whatever the image. Runs before the ready check.
SETUP_TORCH_SCRIPT = _program("node_setup_torch.sh")

DEADMAN_SCRIPT_PATH = "/usr/local/sbin/gpucluster-deadman"
DEADMAN_UNIT = "gpucluster-deadman.service"

# Dead-man switch, run by a systemd unit on EVERY boot (after D-Bus and logind, which `shutdown`
# needs): the deadline is fixed at first boot, so a reboot cannot extend the node's life.
# Powering off terminates the instance because instance_initiated_shutdown_behavior is
# "terminate". GPUCLUSTER_STATE_DIR is for tests.
DEADMAN_SCRIPT = _program("node_deadman.sh")

DEADMAN_UNIT_TEXT = f"""\
[Unit]
Description=gpucluster dead-man switch: power off at the deadline set at first boot
Wants=dbus.service
After=dbus.service systemd-logind.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart={DEADMAN_SCRIPT_PATH}

[Install]
WantedBy=multi-user.target
"""

# Idle stop (`up --idle-minutes N`, option idleMinutes): a watcher on every node powers it off after N
# minutes without a gpucluster job (node_idle.py: a process carrying GPUCLUSTER_RUN_ID, or a user's ssh
# session); powering off terminates the instance, as the dead-man switch does. Restarted if it stops.
IDLE_SCRIPT_PATH = "/usr/local/sbin/gpucluster-idle"
IDLE_UNIT = "gpucluster-idle.service"
IDLE_SCRIPT = _program("node_idle.py")
IDLE_UNIT_TEXT = f"""\
[Unit]
Description=gpucluster idle stop: power off after @MINUTES@ minutes without a gpucluster job
Wants=dbus.service
After=dbus.service systemd-logind.service

[Service]
ExecStart=/usr/bin/python3 {IDLE_SCRIPT_PATH} --minutes @MINUTES@ --ssh-sessions
Restart=always
RestartSec=10

[Install]
WantedBy=multi-user.target
"""

# Readiness check, run once by cloud-init's runcmd: waits for the driver, compares the GPU count
# with the instance type's, writes the result atomically. The launcher waits for READY_FILE.
READY_SCRIPT = _program("node_ready.sh")
# its own bound on the wait for the driver to list the GPUs: TRIES checks, PAUSE seconds apart (in
# catalog.py, whose `ready_within` counts that wait)
READY_TRIES, READY_PAUSE_S = catalog.READY_TRIES, catalog.READY_PAUSE_S


# the same block cloud-init's keys_to_console writes, to the serial console (console=ttyS0 on EC2)
PRINT_HOST_KEY = ("{ echo '-----BEGIN SSH HOST KEY KEYS-----'; cat /etc/ssh/ssh_host_ed25519_key.pub; "
                  "echo '-----END SSH HOST KEY KEYS-----'; } > /dev/console")


def _fill(template: str, **values: object) -> str:
    for key, value in values.items():
        template = template.replace(f"@{key.upper()}@", str(value))
    return template


def render_user_data(
    *,
    cluster: str,
    expected_gpus: int,
    max_lifetime_minutes: int,
    setup_torch: bool = False,
    idle_minutes: int | None = None,
) -> str:
    """The cloud-config every node of the cluster boots with (one launch template: no per-node
    part, no secret). Each node makes its own ed25519 host key and cloud-init prints it on the serial
    console between `-----BEGIN SSH HOST KEY KEYS-----` markers (its keys_to_console module), where
    the launcher reads and pins it (`infra.aws.hostkeys`)."""
    keys = {
        # Replace the image's host keys (a snapshot's keys are shared by every copy) with one new
        # ed25519 key per node, and print it to the console (cloud-init cc_keys_to_console).
        "ssh_deletekeys": True,
        "ssh_genkeytypes": ["ed25519"],
        "ssh": {"emit_keys_to_console": True},
        "ssh_key_console_blacklist": [],
        "runcmd": [
            # the key block on the console at once, not only at the end of cloud-init's final stage
            # (keys_to_console runs after runcmd, i.e. after the ready check's GPU wait)
            ["sh", "-c", PRINT_HOST_KEY],
            ["systemctl", "enable", "--now", "--no-block", DEADMAN_UNIT],
            *([["systemctl", "enable", "--now", "--no-block", IDLE_UNIT]] if idle_minutes else []),
            *([[SETUP_TORCH_PATH]] if setup_torch else []),
            [READY_SCRIPT_PATH],
        ],
    }
    return (
        "#cloud-config\n"
        + _dump(keys)
        + _node_independent_config(cluster, int(expected_gpus), int(max_lifetime_minutes), bool(setup_torch),
                                   int(idle_minutes or 0))
    )


@functools.lru_cache(maxsize=32)
def _node_independent_config(cluster: str, expected_gpus: int, max_lifetime_minutes: int,
                             setup_torch: bool = False, idle_minutes: int = 0) -> str:
    """The part of the cloud-config every node shares (rendered once per cluster)."""
    setup = [{
        "path": SETUP_TORCH_PATH,
        "permissions": "0755",
        "owner": "root:root",
        "content": _fill(SETUP_TORCH_SCRIPT, python=catalog.NODE_PYTHON),
    }] if setup_torch else []
    if idle_minutes:
        setup += [{"path": IDLE_SCRIPT_PATH, "permissions": "0755", "owner": "root:root", "content": IDLE_SCRIPT},
                  {"path": f"/etc/systemd/system/{IDLE_UNIT}", "permissions": "0644", "owner": "root:root",
                   "content": _fill(IDLE_UNIT_TEXT, minutes=idle_minutes)}]
    return _dump(
        {
            "write_files": [
                {
                    "path": DEADMAN_SCRIPT_PATH,
                    "permissions": "0755",
                    "owner": "root:root",
                    "content": _fill(DEADMAN_SCRIPT, lifetime=max_lifetime_minutes),
                },
                {
                    "path": f"/etc/systemd/system/{DEADMAN_UNIT}",
                    "permissions": "0644",
                    "owner": "root:root",
                    "content": DEADMAN_UNIT_TEXT,
                },
                {
                    "path": READY_SCRIPT_PATH,
                    "permissions": "0755",
                    "owner": "root:root",
                    "content": _fill(READY_SCRIPT, expected=expected_gpus, cluster=cluster,
                                     python=catalog.NODE_PYTHON, tries=READY_TRIES, pause=READY_PAUSE_S),
                },
                *setup,
            ],
        }
    )


def _dump(doc: JsonObject) -> str:
    return yaml.dump(doc, Dumper=_CloudConfigDumper, sort_keys=False, width=1 << 16)


class _CloudConfigDumper(yaml.SafeDumper):
    """Safe YAML with multi-line strings as literal blocks, so the console shows readable scripts."""


def _str_representer(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_CloudConfigDumper.add_representer(str, _str_representer)
