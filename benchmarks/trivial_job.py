"""The trivial 2-node job of local_overhead.py: init the process group (gloo), one barrier, exit.
It leaves with os._exit(0) right after destroy_process_group, as the built-in workloads do (a torch
2.13 process can abort at interpreter exit; see README, Known limits), so neither side of the
comparison is failed by that."""
import os

import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
os._exit(0)
