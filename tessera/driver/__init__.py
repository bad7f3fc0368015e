"""The Tessera node daemon: publishes each GPU's memory and compute as DRA consumable capacity and
prepares the shares the scheduler allocates (kubelet plugin), so the shim can enforce them.

Layout: one job per module (config, discovery, devices, slices, allocation, claim_files, cdi,
checkpoint, state, plugin, registration, device_health, health, cleanup, daemon, cli).
"""
