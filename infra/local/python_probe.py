"""Run by the nodes' Python before a local run is recorded (infra/local/launch.py `check_python`):
it compiles each script named on its command line (exit 4, "LINE<TAB>MESSAGE" on stdout, for a
syntax error; nothing is written: no .pyc) and finds torch without importing it (exit 3 when it
cannot). Standard library only: it runs on whatever interpreter the user names."""

import importlib.util
import sys

for path in sys.argv[1:]:
    try:
        with open(path, "rb") as f:
            compile(f.read(), path, "exec")
    except SyntaxError as e:
        print(f"{e.lineno or 0}\t{e.msg}")
        sys.exit(4)
sys.exit(0 if importlib.util.find_spec("torch") else 3)
