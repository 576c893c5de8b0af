#!/usr/bin/python3
"""gpucluster idle stop, run on every node of a kept cluster by a systemd unit (`up --idle-minutes N`).

It needs nothing from the machine that made the cluster: every POLL seconds it looks for a gpucluster
job on this node (a process whose environment carries GPUCLUSTER_RUN_ID, which every launcher gives
each process of a job, --setup included; and, with --ssh-sessions, an open ssh session of a user,
e.g. `gpucluster exec` connecting or `gpucluster ssh`); after MINUTES without one it powers the node
off (`shutdown -P now`), which terminates the instance (instance_initiated_shutdown_behavior =
terminate), as the dead-man switch does. The time of the last job is kept in STATE/idle.json
(written atomically), so a restart of the unit or a reboot does not start the count again.
Standard library only (the system python3). GPUCLUSTER_STATE_DIR and GPUCLUSTER_IDLE_SCALE (seconds
per minute, 60) are for tests.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

MARK = b"GPUCLUSTER_RUN_ID="
# A logged-in user's session process, by its title: "sshd: USER@pts/0" / "sshd: USER@notty" (OpenSSH
# before 9.8), "sshd-session: USER@pts/0" (OpenSSH 9.8 and later run each session as sshd-session,
# release notes of 9.8, 2024-07-01); never the listener ("sshd: /usr/sbin/sshd -D [listener] ...") nor
# a session still authenticating ("sshd-session: USER [priv]", "sshd-auth: ..."), which carry no "@".
SESSION_TITLE = re.compile(rb"^sshd(?:-session)?: [^ @\[]+@\S+")


def job_running(proc="/proc", me=None, ssh_sessions=False):
    """Whether a process of a gpucluster job runs here (or, with ssh_sessions, a user's ssh session)."""
    me = os.getpid() if me is None else me
    for pid in os.listdir(proc):
        if not pid.isdigit() or int(pid) == me:
            continue
        try:
            with open(os.path.join(proc, pid, "environ"), "rb") as fh:
                if MARK in fh.read():
                    return True
            if ssh_sessions:
                with open(os.path.join(proc, pid, "cmdline"), "rb") as fh:
                    cmd = fh.read().split(b"\0")[0]
                if SESSION_TITLE.match(cmd):
                    return True
        except OSError:  # gone meanwhile, or not readable: not a job of ours
            continue
    return False


def read_last(path, now):
    try:
        with open(path) as fh:
            return min(float(json.load(fh)["last_job"]), now)
    except (OSError, ValueError, KeyError, TypeError):
        return now  # armed now: the count starts at boot (or when the unit first starts)


def write_state(path, state):
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(state, fh)
    os.replace(tmp, path)


def main(argv=None):
    p = argparse.ArgumentParser(description="Power this node off after MINUTES without a gpucluster job.")
    p.add_argument("--minutes", type=float, required=True)
    p.add_argument("--poll", type=float, default=30.0, help="seconds between looks")
    p.add_argument("--ssh-sessions", action="store_true", help="an open ssh session of a user counts as a job")
    args = p.parse_args(argv)
    scale = float(os.environ.get("GPUCLUSTER_IDLE_SCALE") or 60)
    state_dir = os.environ.get("GPUCLUSTER_STATE_DIR") or "/var/lib/gpucluster"
    os.makedirs(state_dir, exist_ok=True)
    path = os.path.join(state_dir, "idle.json")
    last = read_last(path, time.time())
    while True:
        now = time.time()
        if job_running(ssh_sessions=args.ssh_sessions):
            last = now
        deadline = last + args.minutes * scale
        write_state(path, {"minutes": args.minutes, "last_job": last, "deadline": deadline, "checked": now})
        if now >= deadline:
            why = "gpucluster idle stop: no job for %g minutes" % args.minutes
            sys.stdout.write(why + "\n")
            sys.stdout.flush()
            return subprocess.call(["shutdown", "-P", "now", why])
        time.sleep(max(0.05, min(args.poll, deadline - now)))


if __name__ == "__main__":
    sys.exit(main())
