"""gpucluster: GPU clusters for distributed PyTorch training, with honest costs.

The core package is cloud-agnostic and light: importing it never imports torch, boto3,
Pulumi or the Google/Kubernetes clients. Those live behind lazy imports in the backends.
"""

__version__ = "0.1.0"
