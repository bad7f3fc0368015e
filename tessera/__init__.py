"""Tessera: fractional NVIDIA GPUs for Kubernetes.

This package holds the helpers every component shares; the components themselves live in their own
top-level folders (testbed/, simgpu/, shim/; the driver and webhook will follow the same pattern),
each linked in here so that it imports as tessera.<component>.
"""
