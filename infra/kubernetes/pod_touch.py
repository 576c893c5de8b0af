import os, sys
os.makedirs(os.path.dirname(sys.argv[1]), exist_ok=True)
with open(sys.argv[1], 'a') as f:
    f.write(' '.join(sys.argv[2:]))
