
import json, os, signal, sys, time
mode, run_id, rank, pgid_file, grace = sys.argv[1:6]
owner = sys.argv[6].encode() if len(sys.argv) > 6 else b""
# the node supervisor's grace for this stop (reaper.py --grace-file), written before anything is signalled;
# 0: its own (a number the job may have left there is overwritten)
inner = sys.argv[7] if len(sys.argv) > 7 and sys.argv[7] else "0"
want = [b"GPUCLUSTER_RUN_ID=" + run_id.encode()] if run_id else []
if rank:
    want.append(b"GPUCLUSTER_NODE_RANK=" + rank.encode())
me = os.getpid()
def ours(env):
    # matched by run id AND owner: a process another home started (GPUCLUSTER_OWNER set to another
    # id) is never ours, even with the same run id; one without the mark (older runs) goes by run id
    if not owner:
        return True
    marks = [e for e in env if e.startswith(b"GPUCLUSTER_OWNER=")]
    return not marks or marks[0] == b"GPUCLUSTER_OWNER=" + owner
def matching():
    # the run's processes (by environment) and every descendant of those, whatever its
    # environment: a daemon that cleared it is adopted by the node's reaper (a subreaper)
    out, stat, kids = {}, {}, {}  # type: dict[int, None], dict[int, bytes], dict[int, list[int]]
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            with open("/proc/%s/stat" % d, "rb") as f:
                rest = f.read().rsplit(b")", 1)[1].split()
            stat[int(d)] = rest[0]
            kids.setdefault(int(rest[1]), []).append(int(d))
            with open("/proc/%s/environ" % d, "rb") as f:
                env = f.read().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if (want and all(w in env for w in want) or not want and any(e.startswith(b"GPUCLUSTER_RUN_ID=") for e in env)) \
                and ours(env):
            out[int(d)] = None
    todo = list(out)
    while todo:
        for k in kids.get(todo.pop(), ()):
            if k not in out and k != me:
                out[k] = None
                todo.append(k)
    found = {}
    for pid in out:
        if stat.get(pid) == b"Z":
            continue
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                found[pid] = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        except OSError:
            continue
    return found
if mode == "list":
    print(json.dumps(matching()))
    sys.exit(0)
if pgid_file:
    # Mark the run cancelled BEFORE looking for its processes: a node command that starts after
    # the scan sees the mark and exits instead of starting torchrun (see the start script).
    mark = os.path.join(os.path.dirname(pgid_file), ".gpucluster-owner")
    try:
        with open(mark, "rb") as f:
            marked = f.read().strip()
    except OSError:
        marked = b""
    if not (owner and marked and marked != owner):  # never in a folder another owner marked
        try:
            open(os.path.join(os.path.dirname(pgid_file), "cancelled"), "w").close()
        except OSError:
            pass
        try:
            with open(os.path.join(os.path.dirname(pgid_file), "stop-grace"), "w") as gf:
                gf.write("%g\n" % float(inner))
        except (OSError, ValueError):
            pass
own = os.getpgrp()
def groups():
    gs = set()
    for pid in matching():
        try:
            gs.add(os.getpgid(pid))
        except OSError:
            pass
    if pgid_file:
        try:
            with open(pgid_file) as f:
                g = int(f.read().split()[0])
            # only a group whose leader still carries this run's environment (pids get reused)
            with open("/proc/%d/environ" % g, "rb") as f:
                env = f.read().split(b"\0")
            if all(w in env for w in want) and ours(env):
                gs.add(g)
        except (OSError, ValueError, IndexError):
            pass
    gs.discard(own)
    return {g for g in gs if g > 1}
killed = set()
first = set(matching())  # listed before anything is signalled: orphans move once parents die
for sig, wait in ((signal.SIGTERM, float(grace)), (signal.SIGKILL, 2.0)):
    gs = groups()
    for g in gs:
        try:
            os.killpg(g, sig)
            killed.add(g)
        except OSError:
            pass
    for pid in set(matching()) | first:
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    end = time.time() + wait
    while time.time() < end and matching():
        time.sleep(0.05)
    if not matching():
        break
print(json.dumps({"groups": sorted(killed), "left": matching()}))
