"""Tessera's Kubernetes API: the typed custom resources every component reads and writes."""
