"""The Tessera node daemon: publishes each GPU's memory and compute as DRA consumable capacity and
prepares the shares the scheduler allocates (kubelet plugin), so the shim can enforce them.

Layout, one job per module (tests/unit/layout/test_layout.py checks that every module is named here):

- the daemon's life: cli, config, daemon, health, registration, plugin;
- the node's GPUs: discovery, devices, device_health, slices, cordon;
- what a claim asks and how it is prepared: claims, allocation, share_config, container_driver,
  claim_files, cdi;
- what was prepared: state, state_lock, checkpoint, cleanup;
- what the claim says back: claim_status, latest_queue.
"""
