"""Provisioning: the Provider contract, the local/ssh providers, the Pulumi components.

Importing this package imports no cloud SDK; `aws`, `gcp`, `program` and `automation` import
Pulumi when they are imported themselves.
"""
