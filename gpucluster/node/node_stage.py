
import contextlib, functools, hashlib, json, os, shutil, signal, sys, tarfile, time
mode, cache = sys.argv[1], os.path.expanduser(sys.argv[2])
base = sys.argv[3] if len(sys.argv) > 3 else ""
os.makedirs(cache, mode=0o700, exist_ok=True)
def have(h, size=None):
    try:
        return size is None or os.path.getsize(os.path.join(cache, h)) == size
    except OSError:
        return False
if mode == "check":
    want = json.loads(sys.stdin.readline())
    print(json.dumps(sorted({h for h, size in want if not have(h, size)})))
    sys.exit(0)
def stop(signum, frame):
    raise SystemExit(128 + signum)
for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
    signal.signal(s, stop)
now = time.time()
for name in os.listdir(cache):  # unfinished files of staging runs killed long ago
    if name.startswith(".tmp-"):
        try:
            if now - os.path.getmtime(os.path.join(cache, name)) > 3600:
                os.unlink(os.path.join(cache, name))
        except OSError:
            pass
inp = sys.stdin.buffer
head = json.loads(inp.readline())
mounts = head["mounts"]
received = 0
with tarfile.open(fileobj=inp, mode="r|") if head["tar"] else contextlib.nullcontext(()) as tar:
    for member in tar:
        h = member.name
        src = tar.extractfile(member) if isinstance(tar, tarfile.TarFile) and member.isfile() else None
        if src is None or len(h) != 64 or not all(c in "0123456789abcdef" for c in h):
            sys.exit("unexpected tar member %r" % h)
        tmp = os.path.join(cache, ".tmp-%d-%s" % (os.getpid(), h))
        try:
            digest = hashlib.sha256()
            with open(tmp, "wb") as f:
                for block in iter(functools.partial(src.read, 1 << 20), b""):
                    digest.update(block)
                    f.write(block)
            if digest.hexdigest() != h:
                sys.exit("file with hash %s arrived damaged" % h)
            os.chmod(tmp, 0o444)
            os.replace(tmp, os.path.join(cache, h))
            received += 1
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
linked = copied = 0
for m in mounts:
    dest = os.path.join(base, m["dest"])
    if os.path.lexists(dest):
        shutil.rmtree(dest) if os.path.isdir(dest) and not os.path.islink(dest) else os.unlink(dest)
    os.makedirs(dest, exist_ok=True)
    for f in m["files"]:
        target = os.path.join(dest, f["path"])
        os.makedirs(os.path.dirname(target), exist_ok=True)
        cached = os.path.join(cache, f["sha256"])
        if not have(f["sha256"], f["size"]):
            sys.exit("%s is not in the cache" % f["path"])
        try:
            os.link(cached, target)
            linked += 1
        except OSError:
            shutil.copyfile(cached, target)
            os.chmod(target, 0o444)
            copied += 1
print(json.dumps({"received": received, "linked": linked, "copied": copied}))
