import os, sys, tarfile
d = sys.argv[1]
if not os.path.isdir(d):
    sys.exit(3)
bad = 0
with tarfile.open(fileobj=sys.stdout.buffer, mode="w|", format=tarfile.PAX_FORMAT) as t:
    for root, dirs, files in os.walk(d):
        dirs.sort()
        for n in dirs + sorted(files):
            p = os.path.join(root, n)
            try:
                t.add(p, arcname=os.path.relpath(p, d), recursive=False)
            except OSError as e:
                bad += 1
                sys.stderr.write("%s: %s\n" % (p, e.strerror))
sys.stdout.flush()
sys.exit(2 if bad else 0)
