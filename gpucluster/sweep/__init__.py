"""Scaling sweeps: the same job at several cluster sizes (`runner`) and why one scaled badly
(`diagnose`)."""
