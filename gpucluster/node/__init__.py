"""Programs that run on the nodes: the node supervisor (`reaper.py`), the health check
(`node_check.py`), the data stage (`node_stage.py`), the start-up announcement (`node_announce.py`)
and the working-folder listing (`workdir.py`). Standard library only: each is copied to a node as it
is (by file name, which is why the names keep their `node_` prefix) and run by the node's Python. They
import nothing of gpucluster (tests/test_layout.py checks the package order)."""
