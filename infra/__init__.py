"""Backends: the contract (`contract.py`), the registry (`registry.py`), the ONE Pulumi program
(`program.py`), the Pulumi driver the clouds share, and one package per backend (local/, ssh/,
aws/, gcp/).

Importing this package, the registry or a backend package imports no cloud SDK; the modules
that declare Pulumi resources or call a cloud import their SDK when they are imported themselves.
"""
