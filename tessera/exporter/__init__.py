"""The metrics exporter: per-container and per-GPU series on :31995, read from the claims' usage
regions, the driver's claim state and NVML. Its own process and container (tessera-exporter).
"""
