"""Tessera: fractional-GPU sharing for Kubernetes (dynamic MIG and MPS partitioning)."""

__version__ = "0.1.0"
