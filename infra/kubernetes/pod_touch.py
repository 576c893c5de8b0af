import os, sys
os.makedirs(os.path.dirname(sys.argv[1]), exist_ok=True)
open(sys.argv[1], 'a').close()
