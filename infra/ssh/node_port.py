"""Run on the head node (standard library only, sent as `python -c` text): is the rendezvous port
free, and if not, which process holds it and which port nearby is free. Prints one JSON line:
{"port": P, "free": bool, "holder": "pid N (cmdline)" | null, "alternative": Q | null}.

A port is free when a listening socket can bind it on every address (SO_REUSEADDR set, as
torch's TCPStore sets it, so a port in TIME_WAIT counts as free). The holder is found as `ss -p`
finds it: the LISTEN socket's inode in /proc/net/tcp{,6}, then the process with that socket
among its open files (another user's processes are only visible to root)."""
import json
import os
import socket
import sys


def free(port):
    for family, addr in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((addr, port))
        except OSError:
            return False
        finally:
            s.close()
    return True


def holder(port):
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(parts[9])
        except (OSError, StopIteration, IndexError, ValueError):
            continue
    if not inodes:
        return None
    wanted = {"socket:[%s]" % i for i in inodes}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir("/proc/%s/fd" % pid)
            if any(os.readlink("/proc/%s/fd/%s" % (pid, fd)) in wanted for fd in fds):
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
                return "pid %s (%s)" % (pid, cmd[:120])
        except OSError:
            continue
    return "a process this user cannot see"


port = int(sys.argv[1])
out = {"port": port, "free": free(port), "holder": None, "alternative": None}
if not out["free"]:
    out["holder"] = holder(port)
    out["alternative"] = next((p for p in range(port + 1, min(port + 64, 65536)) if free(p)), None)
print(json.dumps(out))
