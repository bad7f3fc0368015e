"""Issue 22's bar for the admission check: two replicas against the real API server and Kueue, the
leader killed (SIGKILL, no release of its Lease) while Workloads wait because they do not fit.
Exactly one replica decides at a time: the standby decides nothing while the leader lives, takes
over once the lease has run out, and admits what fits once room is made; no Workload's check is set
Ready twice, and no more are admitted than fit.

Both replicas run under the chart's RBAC (testbed/queue_bed.py: the ClusterRole's rules and the
Lease Role), with a lease of 6 s instead of the product's 15 s (--leader-election-*): what is checked,
no decision by the standby before the lease has run out, does not depend on its length.
"""

from __future__ import annotations

import functools
import urllib.request

import pytest
from kubernetes import client

from tessera.kube import api_client
from testbed import queue_bed
from testbed.cluster import LocalCluster
from testbed.names import unique_name
from testbed.polling import poll_until
from testbed.process import ManagedProcess

pytestmark = pytest.mark.integration

CHECK = "gpu-fit"
LEASE_DURATION = 6.0
LEASE_TIMINGS = (
    f"--leader-election-lease-duration={LEASE_DURATION}",
    "--leader-election-renew-deadline=4",
    "--leader-election-retry-period=1",
)
QUOTA = {"nvidia.com/gpu": "1000", queue_bed.GPU_MEMORY: "100Ti", queue_bed.GPU_CORES: "100000"}


def leading(port: int) -> bool | None:
    """The replica's tessera_admission_check_leader gauge (None while it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("tessera_admission_check_leader "):
            return float(line.split()[1]) == 1.0
    return None


def decisions(process: ManagedProcess) -> list[str]:
    """The decision lines of a replica's log (controller.py logs each new decision once)."""
    return [line for line in process.log_path.read_text(errors="replace").splitlines() if "workload " in line]


@pytest.fixture(scope="module")
def two_replicas(kueue_cluster: LocalCluster) -> tuple[client.ApiClient, list[tuple[ManagedProcess, int]]]:
    api = api_client(kueue_cluster.admin_kubeconfig)
    first, first_port = queue_bed.ready_admission_check(kueue_cluster, *LEASE_TIMINGS)
    second, second_port = queue_bed.ready_admission_check(
        kueue_cluster, *LEASE_TIMINGS, name="tessera-admission-check-2"
    )
    queue_bed.create(api, queue_bed.kueue_object("ResourceFlavor", "default-flavor", {}))
    queue_bed.create(api, queue_bed.admission_check(CHECK))
    queue_bed.create(api, queue_bed.cluster_queue("gpu-cq", "default-flavor", QUOTA, checks=[CHECK]))
    return api, [(first, first_port), (second, second_port)]


def test_the_leader_killed_while_workloads_wait_the_standby_admits_what_fits_once(
    two_replicas: tuple[client.ApiClient, list[tuple[ManagedProcess, int]]],
) -> None:
    api, replicas = two_replicas
    for _, port in replicas:
        assert queue_bed.http_status(port, "/healthz") == 200  # a standby is healthy too

    def one_leader() -> list[bool | None] | None:
        roles = [leading(port) for _, port in replicas]
        return roles if roles.count(True) == 1 and roles.count(False) == 1 else None

    roles = poll_until(one_leader, 30, "one leader and one standby")
    (leader, _), (standby, standby_port) = replicas if roles[0] else replicas[::-1]

    team = unique_name("team")
    client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=team)))
    queue_bed.create(api, queue_bed.local_queue("gpus", team, "gpu-cq"))
    history = queue_bed.CheckHistory(api, team, CHECK)
    node = unique_name("gpu-node")
    uuids = queue_bed.gpu_node(api, node, [80])
    pinned = {"nvidia.com/use-gpuuuid": ",".join(uuids)}
    batch = client.BatchV1Api(api)

    def submit(name: str, gib: int) -> str:
        job = queue_bed.gpu_job(name, "gpus", 1, gib * 1024, annotations=pinned)
        batch.create_namespaced_job(team, client.V1Job.model_validate(job))
        return str(queue_bed.workload_of_job(api, team, name)["metadata"]["name"])

    def state(workload: str) -> str:
        return str(queue_bed.check_state(queue_bed.read_workload(api, team, workload), CHECK).get("state"))

    try:
        blocker = submit("blocker", 60)
        poll_until(lambda: state(blocker) == "Ready", 60, "the blocker Ready")
        # Three Workloads of 30Gi wait: 20Gi is free. Two fit once the blocker goes, not three.
        waiting = [submit(f"wait-{i}", 30) for i in range(3)]
        for workload in waiting:
            poll_until(functools.partial(queue_bed.fit_refusal, api, team, workload, CHECK), 60, "refused")
        assert decisions(standby) == [], "the standby decided while the leader lived"

        leader.kill()
        killed = len(decisions(leader))
        batch.delete_namespaced_job("blocker", team, propagation_policy="Background")
        poll_until(lambda: leading(standby_port), LEASE_DURATION + 30, "the standby leading")

        def admitted() -> list[str] | None:
            ready = [w for w in waiting if state(w) == "Ready"]
            return ready if len(ready) == 2 else None

        ready = poll_until(admitted, 60, "two of the waiting Workloads Ready")
        [left] = [w for w in waiting if w not in ready]
        assert queue_bed.fit_refusal(api, team, left, CHECK), "the third one must keep waiting"
        assert len(decisions(leader)) == killed
        for workload in ready:
            said = [line for line in decisions(standby) if f"workload {team}/{workload}: Ready" in line]
            assert len(said) == 1, said
            assert not [line for line in decisions(leader) if f"workload {team}/{workload}: Ready" in line]
        assert "became the leader" in standby.log_path.read_text()
    finally:
        history.stop()
    for workload in waiting:
        assert history.readies(workload) == (1 if workload in ready else 0), history.entries[workload]
    assert history.readies(blocker) == 1
