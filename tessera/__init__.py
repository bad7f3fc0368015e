"""Tessera: fractional NVIDIA GPUs for Kubernetes.

This package holds the helpers every component shares; the components themselves live in their own
top-level folders (driver/, webhook/, shim/, testbed/) and are imported as tessera.<component>.
"""
