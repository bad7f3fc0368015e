"""Issue 21's bar: a hostile tenant, from inside an ordinary GPU pod on a real node with the chart
installed, cannot lift its limits, reach the node daemon, or touch another tenant.

The tenant is one pod written for HAMi (``gpumem: 2000``, ``gpucores: 25``, converted by the
webhook): a container with the C attack programs (tests/shim/programs/tenant_attack.c and
shim_probe) and a container of the webhook's own image, for its Python, that talks to the webhook
replicas at their pod IPs (tests/e2e/programs/webhook_attack.py). A neighbour pod on the same GPU
re-allocates its whole claim once a second for the whole module, so any memory the tenant takes
past its claim shows up as the neighbour's failed round.

What each test tries, and what must hold afterwards, is in its docstring. Waits are bounded and
say what they saw; timings are reported (print), never asserted.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from demo.story import Placement, placement, wait_running
from simgpu.config import make_gpus
from tessera.kube import raw_json
from tessera.names import DEVICE_CLASS
from tessera.quantity import GiB, MiB
from tessera.shim.format import EXIT_BAD_LIMITS
from testbed import chart_bed as charts
from testbed.chart_bed import GPU_MEMORY, GPUS_PER_NODE, ChartBed, scrape
from testbed.cluster import LocalCluster
from testbed.dra_objects import share_claim_template
from testbed.driver_node import ensure_device_class
from testbed.images import TOOLS_PROGRAMS, ImageSpec, build_image, host_program
from testbed.names import unique_name
from testbed.node import NodeFactory, RealNode
from testbed.node_runtime import node_root
from testbed.pod_state import events, sections
from testbed.polling import poll_until
from testbed.product_images import load_manifest, product_images
from testbed.shim_harness import PROGRAM_BUILD, SIMGPU_BUILD, build_programs
from tests.conftest import made_namespace
from tests.e2e.test_driver_node import DONE, wait_done

# Measured under load or in shares of time: no other test may share the CPUs (tests/conftest.py).
pytestmark = [pytest.mark.e2e, pytest.mark.alone]

ATTACK_IMAGE = "tessera.local/tenant-attack:v1"
# What a root tenant's shell has besides the test bed's tools: file and mount tricks.
ATTACK_TOOLS = ("mv", "cp", "mkdir", "rm", "rmdir", "chmod", "mount", "umount", "unshare", "date")
ATTACK_SCRIPT = Path(__file__).with_name("programs") / "webhook_attack.py"
ATTACKER, ATTACKER_CORES = "tenant", 25
ATTACKER_MIB = 2000
NEIGHBOUR, NEIGHBOUR_MIB = "neighbour", 4096
HOLDER_MIB = 1024
CHUNK = 256 * MiB
OUT_OF_MEMORY = "2"
"""CUDA_ERROR_OUT_OF_MEMORY, as the test programs print it."""
# The tenant's own limits file: its GPU with 8 GiB and 100 cores.
FORGED_MEMORY, FORGED_CORES = 8 * GiB, 100
# Measured shares are an upper bound under load; a generous tolerance over the 25 % cap, far
# below the ~100 % an uncapped program gets.
SHARE_TOLERANCE = 1.5
# Where prepare mounts the driver's own libcuda in a container (docs/driver.md, driverSource own).
REAL_LIBCUDA = "/run/tessera/driver/libcuda.so.1"
# Far past the claim and past the exporter's tolerance of 512 MiB a process: it is stopped.
BYPASS_BYTES = 8 * GiB
KEEP_RUNNING = "exec sleep 36000"
WAIT = 180.0

# Series and alert of the exporter (tessera/exporter/collector.py, charts/tessera/files/alert-rules.yaml).
USED = "tessera_container_gpu_memory_used_bytes"
LIMIT = "tessera_container_gpu_memory_limit_bytes"
COMPUTE_LIMIT = "tessera_container_gpu_compute_limit_ratio"
UTILIZATION = "tessera_container_gpu_utilization_ratio"
PROCESSES = "tessera_container_gpu_processes"
DRIVER_MEMORY = "tessera_container_gpu_memory_driver_bytes"
EXCESS = "tessera_container_gpu_memory_excess_bytes"
# The neighbour's figures that nothing the tenant does may move (its memory, by the shim's count
# and the driver's, flickers with its own rounds, so it is compared once settled).
STEADY = (LIMIT, COMPUTE_LIMIT, UTILIZATION, PROCESSES, EXCESS)
HELD = (USED, DRIVER_MEMORY)


# -- the bed ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def attack_image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tools, the file and mount tools of ATTACK_TOOLS, shim_probe and tenant_attack: CUDA
    programs that load libcuda.so.1 as applications do."""
    programs = build_programs(PROGRAM_BUILD, SIMGPU_BUILD)
    files = {f"/bin/{name}": host_program(name) for name in (*TOOLS_PROGRAMS, *ATTACK_TOOLS)}
    for program in ("shim_probe", "tenant_attack", "shim_slots"):
        files[f"/bin/{program}"] = programs / program
    return build_image(
        ImageSpec(ATTACK_IMAGE, files, command=("/bin/sh",)), tmp_path_factory.mktemp("images")
    )


@pytest.fixture(scope="module")
def bed(
    cluster: LocalCluster,
    kube: client.ApiClient,
    node_factory: NodeFactory,
    attack_image: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ChartBed]:
    """The chart on one real node: the daemon, both webhook replicas and every tenant share it."""
    [node] = node_factory.start(1, extra_images=[*product_images().values(), attack_image])
    charts.prepare_nodes(cluster, kube, [node])
    # The cluster is the session's: an earlier module may have made the DeviceClass outside Helm,
    # which the chart could not then adopt (the same DeviceClass either way, made here), and nodes
    # of earlier modules may still carry the chart's node label. The tenant reaches the webhook
    # replicas at their pod IPs, and the test bed routes pod IPs only within a node: both replicas
    # run on the bed's node.
    ensure_device_class(kube)
    values = charts.chart_values()
    values["webhook"] = {**values["webhook"], "nodeSelector": {"kubernetes.io/hostname": node.name}}
    values["deviceClass"] = {"enabled": False}
    with charts.installed_release(
        cluster, kube, [node], tmp_path_factory.mktemp("helm"), values
    ) as installed:
        try:
            charts.wait_rolled_out(installed)
        except Exception as error:
            raise AssertionError(f"{error}\nevents:\n{events(kube, installed.namespace)}") from error
        yield installed


@dataclass(frozen=True)
class Tenants:
    """The tenant and its neighbour, running on the bed's node, on one GPU."""

    bed: ChartBed
    namespace: str
    attacker: Placement
    neighbour: Placement
    neighbour_claim_uid: str

    @property
    def node(self) -> RealNode:
        [node] = self.bed.nodes
        return node

    @property
    def gpus(self) -> list[str]:
        """The node's GPU UUIDs in NVML's (and an unset CUDA_VISIBLE_DEVICES's) order."""
        return [g.uuid for g in make_gpus(GPUS_PER_NODE, self.node.name, memory_bytes=GPU_MEMORY)]

    def run(self, script: str, container: str = "gpu", timeout: float = 300) -> str:
        """Run a shell script in the tenant's container; its output, stderr included."""
        return self.bed.kubectl(
            "exec", "-n", self.namespace, ATTACKER, "-c", container, "--", "sh", "-c", script, timeout=timeout
        )

    def python(self, *args: str, timeout: float = 300) -> str:
        """Run the webhook attacks (webhook_attack.py) in the tenant's Python container."""
        python = f"{load_manifest().venv}/bin/python"
        return self.bed.kubectl(
            "exec",
            "-n",
            self.namespace,
            ATTACKER,
            "-c",
            "net",
            "--",
            python,
            f"/attack/{ATTACK_SCRIPT.name}",
            *args,
            timeout=timeout,
        )

    def neighbour_rounds(self) -> tuple[int, int]:
        """(rounds, failed rounds) the neighbour has counted: its last count line. The shim's own
        lines share the log (a round that waited for memory says so on stderr), so the count is
        the last line that carries one."""
        core = client.CoreV1Api(self.bed.kube)
        log = str(core.read_namespaced_pod_log(NEIGHBOUR, self.namespace, tail_lines=50))
        counts = [seen for line in log.splitlines() if "rounds" in (seen := words(line))]
        assert counts, f"no count line in the neighbour's log:\n{log}"
        return int(counts[-1]["rounds"]), int(counts[-1]["failed"])

    def neighbour_figures(self) -> dict[str, float]:
        """The neighbour's container series in one scrape of the node's exporter: name -> value."""
        return container_figures(scrape(self.node.address), self.namespace, NEIGHBOUR)

    def settled_neighbour_figures(self) -> dict[str, float]:
        """The neighbour's figures from a scrape taken while it held its whole claim."""

        def settled() -> dict[str, float] | None:
            figures = self.neighbour_figures()
            held = [figures[name] for name in HELD if name in figures]
            return figures if USED in figures and held == [NEIGHBOUR_MIB * MiB] * len(held) else None

        return poll_until(settled, 60, "a scrape showing the neighbour holding its whole claim", interval=0.5)


def hami_pod(
    name: str, node: str, script: str, mib: int, cores: int, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    """A pod as a HAMi user writes it: one container of the attack image asking gpumem/gpucores,
    kept to the bed's node (the session's cluster may still list nodes of earlier modules whose
    drivers are gone)."""
    return {
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "gpu",
                    "image": ATTACK_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", script],
                    "resources": {
                        "limits": {"nvidia.com/gpumem": str(mib), "nvidia.com/gpucores": str(cores)}
                    },
                }
            ],
        },
    }


@pytest.fixture(scope="module")
def tenants(bed: ChartBed) -> Iterator[Tenants]:
    """The tenant (2000 MiB, 25 %) and, pinned to its GPU by HAMi's annotation, the neighbour
    (4096 MiB) re-allocating its whole claim every second."""
    core = client.CoreV1Api(bed.kube)
    with made_namespace(bed.kube) as namespace:
        script = client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name="attack"), data={ATTACK_SCRIPT.name: ATTACK_SCRIPT.read_text()}
        )
        core.create_namespaced_config_map(namespace, script)
        webhook = charts.local_image("webhook")
        [node] = bed.nodes
        tenant = hami_pod(ATTACKER, node.name, KEEP_RUNNING, ATTACKER_MIB, ATTACKER_CORES)
        tenant["spec"]["containers"].append(
            {
                "name": "net",
                "image": f"{webhook['repository']}:{webhook['tag']}",
                "imagePullPolicy": "Never",
                "command": [f"{load_manifest().venv}/bin/python", "-c", "import signal; signal.pause()"],
                "volumeMounts": [{"name": "attack", "mountPath": "/attack"}],
            }
        )
        tenant["spec"]["volumes"] = [{"name": "attack", "configMap": {"name": "attack"}}]
        core.create_namespaced_pod(namespace, client.V1Pod.model_validate(tenant))
        attacker = placement(bed.kube, wait_running(bed.kube, namespace, ATTACKER))
        neighbour_script = f"exec tenant_attack neighbour {NEIGHBOUR_MIB * MiB} 1000 20"
        pinned = {"nvidia.com/use-gpuuuid": attacker.uuid}
        neighbour_pod = hami_pod(NEIGHBOUR, node.name, neighbour_script, NEIGHBOUR_MIB, 30, pinned)
        core.create_namespaced_pod(namespace, client.V1Pod.model_validate(neighbour_pod))
        neighbour = placement(bed.kube, wait_running(bed.kube, namespace, NEIGHBOUR))
        assert (neighbour.node, neighbour.uuid) == (attacker.node, attacker.uuid), (attacker, neighbour)
        claim = raw_json(
            client.ResourceV1Api(bed.kube).read_namespaced_resource_claim(
                neighbour.claim, namespace, _preload_content=False
            )
        )
        made = Tenants(bed, namespace, attacker, neighbour, claim["metadata"]["uid"])
        poll_until(lambda: made.neighbour_rounds()[0] >= 1, 60, "the neighbour's first round")
        yield made


def container_figures(text: str, namespace: str, pod: str) -> dict[str, float]:
    """A pod's ``tessera_container_*`` samples in exporter text: name -> value (one container)."""
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("tessera_container_")
        and s.labels.get("namespace") == namespace
        and s.labels.get("pod") == pod
    }


def daemon_restarts(bed: ChartBed) -> dict[str, int]:
    """Each container of the node's pods, the plugin's and the exporter's (by pod UID and name), and
    its restart count."""
    return {
        f"{pod['metadata']['uid']}/{status['name']}": status["restartCount"]
        for component in ("kubeletplugin", "exporter")
        for pod in bed.pods(component)
        for status in pod["status"].get("containerStatuses") or []
    }


# Longest a neighbour's round may take: its allocation waits up to the shim's 5 s for memory taken
# around it, then it holds 1 s; the rest is room for a loaded node to schedule it and log the line.
NEIGHBOUR_ROUND_SECONDS = 30.0


def neighbour_harm(tenants: Tenants, before: tuple[int, int], what: str) -> list[str]:
    """What went wrong for the neighbour during ``what`` (``before``: its rounds and failed rounds
    then): it must have kept running rounds, and every round must have got its whole claim. The
    round under way when ``what`` ended is waited for: one that waited for memory a stopped program
    held ends only once the driver has it back, and a loaded node logs it a little later still."""

    def next_round() -> tuple[int, int] | None:
        seen = tenants.neighbour_rounds()
        return seen if seen[0] > before[0] else None

    try:
        rounds, failed = poll_until(
            next_round, NEIGHBOUR_ROUND_SECONDS, f"the neighbour's round after {what}", 0.5
        )
    except TimeoutError:
        rounds, failed = tenants.neighbour_rounds()
    harm = [] if rounds > before[0] else [f"the neighbour ran no round during {what}"]
    if failed:
        harm.append(
            f"the neighbour could not allocate its whole {NEIGHBOUR_MIB} MiB in {failed - before[1]} of its "
            f"{rounds - before[0]} rounds during {what} ({before[1]} before)"
        )
    return harm


# -- limits ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """One way the tenant changes a CUDA program's environment, and the CUDA devices it then sees
    (ordinal -> GPU UUID)."""

    name: str
    prefix: str
    devices: dict[int, str]


def variants(tenants: Tenants) -> list[Variant]:
    gpus, own = tenants.gpus, tenants.attacker.uuid
    other = next(i for i, uuid in enumerate(gpus) if uuid != own)
    return [
        Variant("limits-unset", "env -u TESSERA_LIMITS_FILE", {0: own}),
        Variant("limits-empty", "env TESSERA_LIMITS_FILE=", {0: own}),
        Variant("limits-missing", "env TESSERA_LIMITS_FILE=/nonexistent", {0: own}),
        Variant("limits-own-file", "env TESSERA_LIMITS_FILE=/tmp/own-limits", {0: own}),
        Variant("region-unset", "env -u TESSERA_USAGE_REGION", {0: own}),
        Variant("preload-unset", "env -u LD_PRELOAD", {0: own}),
        Variant("visible-unset", "env -u CUDA_VISIBLE_DEVICES", dict(enumerate(gpus))),
        Variant("visible-other-gpu", f"env CUDA_VISIBLE_DEVICES={other}", {0: gpus[other]}),
    ]


def holding(name: str, command: str) -> str:
    """Script lines that start ``command`` (a shim_probe that holds what it allocated while its
    stdin stays open) in the background, keep its PID in /tmp/<name>.pid, and print its output,
    in a section of that name, once it holds (or after 30 s). Nothing it runs keeps the exec's
    own output open, so the exec ends with the script."""
    out = f"/tmp/{name}.out"
    return "\n".join(
        [
            f"sleep 36000 </dev/null 2>/dev/null | {command} > {out} 2>&1 &",
            f"echo $! > /tmp/{name}.pid",
            f"i=0; while ! grep -q HOLD {out} && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done",
            f"echo '== {name}'; cat {out}",
        ]
    )


def limits_script(tenants: Tenants, tried: list[Variant]) -> str:
    """Hold HOLDER_MIB in the claim as its programs normally run; then, under each variant, a
    greedy allocation and a compute duty on each device; then let go of the held memory."""
    lines = [
        f"tenant_attack limits /tmp/own-limits $CUDA_VISIBLE_DEVICES {FORGED_MEMORY} {FORGED_CORES}",
        holding("holder", f"shim_probe alloc mem {HOLDER_MIB * MiB} hold"),
    ]
    for variant in tried:
        for ordinal in variant.devices:
            lines += [
                f"echo '== grab {variant.name} {ordinal}'",
                f"{variant.prefix} tenant_attack grab {ordinal} {CHUNK} 2 2>&1; echo exit=$?",
                f"echo '== duty {variant.name} {ordinal}'",
                f"{variant.prefix} PROBE_DEVICE={ordinal} shim_probe duty 2000000 3 4 2>&1; echo exit=$?",
            ]
    lines += ["kill $(cat /tmp/holder.pid)", "echo '== end'"]
    return "\n".join(lines)


def test_nothing_in_the_container_lifts_its_limits(
    tenants: Tenants, capsys: pytest.CaptureFixture[str]
) -> None:
    """With TESSERA_LIMITS_FILE unset, empty, missing or pointing at a limits file the tenant wrote
    (8 GiB, 100 cores), with TESSERA_USAGE_REGION or LD_PRELOAD unset, with CUDA_VISIBLE_DEVICES
    unset or naming the node's other GPU, while the claim already holds 1024 MiB: no program gets
    memory past the claim's 2000 MiB (on a GPU the claim does not name, none at all), its kernels
    stay under the 25 % cap (with a generous tolerance), and the neighbour on the same GPU gets its
    whole claim in every round meanwhile."""
    tried = variants(tenants)
    before = tenants.neighbour_rounds()
    seen = sections(tenants.run(limits_script(tenants, tried)))
    assert seen.get("holder", {}).get("rc") == "0", (
        f"the claim's own process could not hold {HOLDER_MIB} MiB: {seen}"
    )
    assert "end" in seen, seen
    broken: list[str] = []
    report: list[str] = []
    for variant in tried:
        for ordinal, uuid in variant.devices.items():
            grab, duty = seen[f"grab {variant.name} {ordinal}"], seen[f"duty {variant.name} {ordinal}"]
            report.append(
                f"{variant.name} device {ordinal}: {int(grab.get('obtained', 0)) // MiB} MiB"
                f" (exit {grab.get('exit')}), {duty.get('share', '-')} % (exit {duty.get('exit')})"
            )
            allowed = (ATTACKER_MIB - HOLDER_MIB) * MiB if uuid == tenants.attacker.uuid else 0
            where = f"{variant.name} (`{variant.prefix}`) on CUDA device {ordinal} ({uuid})"
            if "obtained" not in grab and grab.get("exit") == "0":
                broken.append(f"{where}: the greedy allocator reported nothing: {grab}")
            elif int(grab.get("obtained", 0)) > allowed:
                broken.append(
                    f"{where}: allocated {int(grab['obtained']) // MiB} MiB beside the claim's "
                    f"{HOLDER_MIB} MiB; at most {allowed // MiB} MiB fit in the claim"
                )
            if "share" not in duty and duty.get("exit") == "0":
                broken.append(f"{where}: the duty program reported no share: {duty}")
            elif float(duty.get("share", 0)) > ATTACKER_CORES * SHARE_TOLERANCE:
                broken.append(
                    f"{where}: its kernels took {duty['share']} % of the GPU (cap {ATTACKER_CORES} %)"
                )
    broken += neighbour_harm(tenants, before, "the limit attacks")
    with capsys.disabled():
        print("\nwhat the tenant got past its 1024 MiB: " + "; ".join(report))
    assert not broken, "limits lifted from inside the container:\n" + "\n".join(broken)


# -- the claim's folder ----------------------------------------------------------------------------


def renaming_script(tenants: Tenants) -> str:
    """With rename(2) itself (mv would copy and delete where a rename fails): rename the claim's
    folder, and the shim's folder inside it; move its parent aside and fill a folder of the
    tenant's own in its place (a copy of the shim and of the driver libraries it loads, a usage
    region, and a limits file giving the tenant 8 GiB and the whole GPU), run the greedy allocator
    and the duty program there; move /etc aside (so the loader reads no /etc/ld.so.preload) and
    run the greedy allocator with the driver's folder on LD_LIBRARY_PATH; put everything back."""
    own = f"{FORGED_MEMORY} {FORGED_CORES}"
    driver = REAL_LIBCUDA.rsplit("/", 1)[0]
    return "\n".join(
        [
            "echo '== rename-claim'; tenant_attack rename /run/tessera /run/tessera.old",
            "echo '== rename-shim'; tenant_attack rename /run/tessera/shim /run/tessera/shim.old",
            "echo '== rename-parent'; tenant_attack rename /run /run.old",
            "if [ -d /run.old ]; then",
            "  mkdir -p /run/tessera",
            "  cp -r /run.old/tessera/shim /run.old/tessera/driver /run/tessera/",
            "  cp /run.old/tessera/usage /run/tessera/usage",
            f"  tenant_attack limits /run/tessera/limits $CUDA_VISIBLE_DEVICES {own}",
            "fi",
            "echo '== grab own-folder'",
            f"tenant_attack grab 0 {CHUNK} 2 2>&1; echo exit=$?",
            "echo '== duty own-folder'",
            "shim_probe duty 2000000 3 4 2>&1; echo exit=$?",
            "if [ -d /run.old ]; then rm -rf /run; tenant_attack rename /run.old /run; fi",
            "echo '== rename-etc'; tenant_attack rename /etc /etc.old",
            "echo '== grab etc-moved'",
            f"[ -d /etc.old ] && LD_LIBRARY_PATH={driver} tenant_attack grab 0 {CHUNK} {GREEDY_SECONDS} 2>&1;"
            " echo exit=$?",
            "[ -d /etc.old ] && tenant_attack rename /etc.old /etc",
            "echo '== end'; ls /run/tessera/limits /run/tessera/shim /etc/ld.so.preload",
        ]
    )


def test_renaming_the_claims_folder_or_filling_one_of_its_own_does_not_lift_the_limits(
    tenants: Tenants, capsys: pytest.CaptureFixture[str]
) -> None:
    """Renaming /run/tessera fails (the claim's folder is a mount point: EBUSY), and so does
    renaming the shim's folder in it (a read-only mount: EROFS). Where its parent
    can be moved aside and the path filled with a folder of the tenant's own - a copy of the shim,
    the tenant's own limits (8 GiB, 100 %) - every CUDA process stops with exit status 78, getting
    no memory past the claim and no kernel time past the cap. Where /etc can be moved aside, a
    greedy program then runs without the shim and the node stops it (SIGKILL) well before its 30 s.
    (On the test bed's overlayfs both renames fail with EXDEV: a folder of the image's lower layer
    cannot be renamed.) The neighbour gets its whole claim in every round meanwhile."""
    before = tenants.neighbour_rounds()
    seen = sections(tenants.run(renaming_script(tenants), timeout=300 + GREEDY_SECONDS))
    assert "end" in seen, seen
    broken: list[str] = []
    claim = seen["rename-claim"]
    assert "renamed" in claim, f"tenant_attack did not run: {seen}"
    if claim["renamed"] == "0":
        broken.append("the claim's folder /run/tessera was renamed")
    if seen["rename-shim"].get("renamed") != "1":
        broken.append(f"the shim's folder /run/tessera/shim was renamed: {seen['rename-shim']}")
    grab, duty = seen["grab own-folder"], seen["duty own-folder"]
    if int(grab.get("obtained", 0)) > ATTACKER_MIB * MiB:
        broken.append(f"with a folder of its own the tenant took {int(grab['obtained']) // MiB} MiB")
    if float(duty.get("share", 0)) > ATTACKER_CORES * SHARE_TOLERANCE:
        broken.append(f"with a folder of its own the tenant's kernels took {duty['share']} % of the GPU")
    if seen["rename-parent"].get("renamed") == "0":
        for what, run in (("greedy allocator", grab), ("duty program", duty)):
            if run.get("exit") != str(EXIT_BAD_LIMITS):
                broken.append(f"the {what} ran under a folder of the tenant's own (exit {run.get('exit')})")
    etc_moved = seen["grab etc-moved"]
    if seen["rename-etc"].get("renamed") == "0" and etc_moved.get("exit") != "137":
        broken.append(f"with /etc moved aside the greedy program was not stopped: {etc_moved}")
    broken += neighbour_harm(tenants, before, "the folder attacks")
    with capsys.disabled():
        print(
            f"\nrenaming /run/tessera: {claim}; its shim: {seen['rename-shim']}; /run: "
            f"{seen['rename-parent']}; own folder: grab exit "
            f"{grab.get('exit')}, duty exit {duty.get('exit')}; /etc: {seen['rename-etc']}, greedy "
            f"{etc_moved}"
        )
    assert not broken, "\n".join(broken)


# -- NVML in the process that holds memory ---------------------------------------------------------


def test_reading_nvml_memory_info_in_the_holding_process_keeps_its_memory_counted(tenants: Tenants) -> None:
    """A process of the tenant holding 1024 MiB of its 2000 MiB claim reads NVML's memory info (v1
    and v2) three times, 0.15 s apart - which once made its own CUDA charge disappear - and then
    asks for the whole claim: every reading says 1024 MiB used, the whole claim is refused
    (CUDA_ERROR_OUT_OF_MEMORY) and the 976 MiB left still fit. A second process of the claim,
    started after the readings, is refused the whole claim too. The neighbour gets its whole claim
    in every round meanwhile."""
    before = tenants.neighbour_rounds()
    held, limit = HOLDER_MIB * MiB, ATTACKER_MIB * MiB
    script = "\n".join(
        [
            "echo '== holder'",
            f"printf 'cuda\\nalloc {held}\\nnvml 3 150\\nalloc {limit}\\nalloc {limit - held}\\n"
            "pause\\n' > /tmp/holder.in",
            "(cat /tmp/holder.in; sleep 30) </dev/null 2>/dev/null | shim_slots > /tmp/holder.out 2>&1 &",
            "echo $! > /tmp/holder.pid",
            "i=0; while ! grep -q paused /tmp/holder.out && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done",
            "cat /tmp/holder.out",
            "echo '== other'",
            f"printf 'cuda\\nalloc {limit}\\n' | shim_slots 2>&1",
            "kill $(cat /tmp/holder.pid) 2>/dev/null; echo '== end'",
        ]
    )
    out = tenants.run(script)
    holder = [words(line) for line in out.split("== holder", 1)[1].split("== other", 1)[0].splitlines()]
    replies = [w for w in holder if w]
    readings = next((w for w in replies if "used" in w), None)
    assert readings is not None, f"the holder made no NVML reading:\n{out}"
    used = [int(v) for v in readings["used"].split(",") + readings["used_v2"].split(",")]
    allocations = [w["rc"] for w in replies if "rc" in w]
    assert used == [held] * 6, f"NVML readings in the holding process: {used}\n{out}"
    assert allocations == ["0", "0", OUT_OF_MEMORY, "0"], f"cuda, hold, whole claim, the rest: {out}"
    other = [
        w["rc"] for w in map(words, out.split("== other", 1)[1].split("== end")[0].splitlines()) if "rc" in w
    ]
    assert other == ["0", OUT_OF_MEMORY], f"a second process of the claim asking the whole claim: {out}"
    harm = neighbour_harm(tenants, before, "the NVML readings")
    assert not harm, "\n".join(harm)


# -- around the shim -------------------------------------------------------------------------------


def test_memory_taken_around_the_shim_is_stopped_within_the_bound_with_an_event_on_the_pod(
    tenants: Tenants,
) -> None:
    """A process that opens the driver's libcuda by its real path (no shim hook applies: the
    documented limit of enforcement in user space) and holds 8 GiB under a 2000 MiB claim: with the
    chart's defaults (exporter.bypass: stop, 512 MiB a process, 2 s) the exporter SIGKILLs it, and
    the tenant's pod gets a Warning Event saying which process took how much past what, for how
    long. The container itself runs on. (tests/integration/test_metrics_exporter.py shows the same
    memory as excess and the alert firing, with the exporter reporting only.)"""
    out = tenants.run(
        holding("bypass", f"TEST_LIBCUDA={REAL_LIBCUDA} shim_probe alloc mem {BYPASS_BYTES} hold")
    )
    assert "HOLD" in out, f"the process around the shim could not take {BYPASS_BYTES} bytes:\n{out}"
    # The container's init never reaps it: a killed process stays a zombie, which holds no memory.
    probe = (
        "p=$(cat /tmp/bypass.pid); "
        "if [ ! -e /proc/$p ] || grep -q 'State:.*Z' /proc/$p/status; then echo gone; else echo alive; fi"
    )

    def gone() -> bool | None:
        return "gone" in tenants.run(probe) or None

    try:
        poll_until(gone, 30, "the process around the shim stopped")
    finally:
        tenants.run("kill $(cat /tmp/bypass.pid) 2>/dev/null; true")
    core = client.CoreV1Api(tenants.bed.kube)

    def stopped() -> list[client.CoreV1Event] | None:
        selector = f"involvedObject.name={ATTACKER},reason=GpuMemoryBypassStopped"
        return list(core.list_namespaced_event(tenants.namespace, field_selector=selector).items) or None

    (event,) = poll_until(stopped, 30, "the Event GpuMemoryBypassStopped on the tenant's pod")
    assert event.type == "Warning" and event.message is not None
    assert "(shim_probe) of container gpu held 8192 MiB on GPU " in event.message, event.message
    assert event.message.endswith(": stopped (SIGKILL)."), event.message
    assert "alive" in tenants.run("echo alive"), "the tenant's container did not run on"


GREEDY_SECONDS = 30
"""How long the greedy allocator would hold everything it got if nothing stopped it."""
UNCONFINED = "unconfined"


def greedy(prefix: str, device: int) -> str:
    """Script lines: the greedy allocator on CUDA device ``device`` under ``prefix``, with its exit
    status and how many seconds it ran."""
    return "\n".join(
        [
            "started=$(date +%s)",
            f"{prefix} tenant_attack grab {device} {CHUNK} {GREEDY_SECONDS} 2>&1; echo exit=$?",
            "echo ran=$(( $(date +%s) - started ))",
        ]
    )


def unconfined_pod(tenants: Tenants, script: str) -> str:
    """A pod that names a ResourceClaimTemplate of its own (2000 MiB, 25 %) instead of HAMi's
    resources - so the webhook never reviews it - and runs under the Unconfined seccomp profile, on
    the bed's node; its name once it runs."""
    kube = tenants.bed.kube
    name = unique_name("unconfined")
    template = share_claim_template(name, DEVICE_CLASS, {"memory": f"{ATTACKER_MIB}Mi", "cores": "25"})
    client.ResourceV1Api(kube).create_namespaced_resource_claim_template(tenants.namespace, template)
    pod = {
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": tenants.node.name},
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "securityContext": {"seccompProfile": {"type": "Unconfined"}},
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": name}],
            "containers": [
                {
                    "name": "gpu",
                    "image": ATTACK_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", f"{script}\necho '{DONE}'; {KEEP_RUNNING}"],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }
    client.CoreV1Api(kube).create_namespaced_pod(tenants.namespace, client.V1Pod.model_validate(pod))
    return name


def bypass_events(tenants: Tenants, pod: str, program: str = "tenant_attack") -> list[str]:
    """The messages of the GpuMemoryBypassStopped Events on ``pod`` that name ``program``."""
    selector = f"involvedObject.name={pod},reason=GpuMemoryBypassStopped"
    listed = client.CoreV1Api(tenants.bed.kube).list_namespaced_event(
        tenants.namespace, field_selector=selector
    )
    return [e.message for e in listed.items if e.message and f"({program})" in e.message]


@pytest.mark.parametrize("way", ["real-library", UNCONFINED])
def test_a_greedy_program_around_the_shim_is_stopped_and_the_neighbour_never_loses_a_round(
    tenants: Tenants, way: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A program that takes every byte the GPU will give it, for 30 s, without the shim: opening
    the driver's libcuda by its path; or, in a pod admitted around the webhook under the Unconfined
    seccomp profile, after `unshare -Urm` and a mount over the preload, on the neighbour's GPU
    (with CUDA_VISIBLE_DEVICES unset: whichever GPU its own claim got). Each time the node's
    exporter stops it (SIGKILL) well before its 30 s, with an Event on its pod naming it; and the
    neighbour on that GPU, re-allocating its whole claim every second, never loses a round: its
    allocation waits while the greedy program holds the memory, and gets it once it is stopped."""
    before = tenants.neighbour_rounds()
    neighbour_ordinal = tenants.gpus.index(tenants.neighbour.uuid)
    driver = REAL_LIBCUDA.rsplit("/", 1)[0]
    if way == "real-library":
        pod, out = ATTACKER, tenants.run(greedy(f"TEST_LIBCUDA={REAL_LIBCUDA}", 0))
    else:
        inside = ": > /tmp/empty && mount --bind /tmp/empty /etc/ld.so.preload && echo covered=1; " + greedy(
            f"env -u CUDA_VISIBLE_DEVICES LD_LIBRARY_PATH={driver}", neighbour_ordinal
        ).replace("\n", "; ")
        pod = unconfined_pod(tenants, f"unshare -Urm sh -c '{inside}' 2>&1")
        try:
            out = wait_done(tenants.bed.kube, tenants.namespace, pod, timeout=GREEDY_SECONDS + 180)
        finally:
            client.CoreV1Api(tenants.bed.kube).delete_namespaced_pod(
                pod, tenants.namespace, grace_period_seconds=0
            )
        assert "covered=1" in out, f"the tenant could not mount over its preload:\n{out}"
    seen = {k: v for line in out.splitlines() for k, v in words(line).items()}
    assert seen.get("exit") == "137", f"the greedy program was not stopped (SIGKILL):\n{out}"
    assert int(seen["ran"]) < GREEDY_SECONDS, out
    events = poll_until(lambda: bypass_events(tenants, pod) or None, 30, f"the bypass Event on pod {pod}")
    harm = neighbour_harm(tenants, before, f"the greedy program ({way})")
    with capsys.disabled():
        print(f"\ngreedy program {way}: stopped after {seen['ran']} s; {events[-1]}")
    assert not harm, "\n".join(harm)


def alive(tenants: Tenants, name: str) -> bool:
    """Whether the process ``holding`` started as ``name`` still runs (the container's init never
    reaps a killed process: a zombie holds no memory and counts as gone)."""
    probe = (
        f"p=$(cat /tmp/{name}.pid); "
        "if [ ! -e /proc/$p ] || grep -q 'State:.*Z' /proc/$p/status; then echo gone; else echo alive; fi"
    )
    return "alive" in tenants.run(probe).split()


def test_zeroed_counters_let_a_second_process_in_and_the_first_is_stopped(tenants: Tenants) -> None:
    """The tenant holds 1024 MiB of its 2000 MiB claim, zeroes every charge in its usage region
    and starts a second process, which the shim - reading an empty claim - lets take the whole
    2000 MiB. The node sees the first process's memory charged to no one: it is stopped, with an
    Event on the pod, and the second, whose memory the region charges, keeps running. The claim's
    processes then hold no more than the claim."""
    before = tenants.neighbour_rounds()
    out = tenants.run(
        "\n".join(
            [
                holding("first", f"shim_probe alloc mem {HOLDER_MIB * MiB} hold"),
                "echo '== zero'; tenant_attack region zero /run/tessera/usage",
                holding("second", f"shim_probe alloc mem {ATTACKER_MIB * MiB} hold"),
            ]
        )
    )
    seen = sections(out)
    assert seen["first"].get("rc") == "0" and seen["zero"].get("region") == "zero", out
    assert seen["second"].get("rc") == "0", (
        f"the second process was refused what the zeroed claim showed:\n{out}"
    )
    try:
        poll_until(lambda: not alive(tenants, "first") or None, 30, "the first process stopped")
        assert alive(tenants, "second"), "the process the region charges was stopped too"
        stopped = bypass_events(tenants, ATTACKER, "shim_probe")
        assert any(f"held {HOLDER_MIB} MiB on GPU" in m and "charges it (0 MiB)" in m for m in stopped), (
            stopped
        )
    finally:
        tenants.run("kill $(cat /tmp/first.pid) $(cat /tmp/second.pid) 2>/dev/null; true")
    harm = neighbour_harm(tenants, before, "the zeroed counters")
    assert not harm, "\n".join(harm)


# -- the usage region ------------------------------------------------------------------------------


@dataclass
class Scrapes:
    """Every scrape made while the tenant worked: the neighbour's figures, or why it failed."""

    figures: list[dict[str, float]]
    failures: list[str]


@contextlib.contextmanager
def scraping_every_second(tenants: Tenants, limit: int = 600) -> Iterator[Scrapes]:
    """Scrape the node's exporter (at the node's address) once a second, at most ``limit`` times,
    until the block ends."""
    done = threading.Event()
    seen = Scrapes([], [])

    def loop() -> None:
        for _ in range(limit):
            try:
                seen.figures.append(tenants.neighbour_figures())
            except Exception as error:
                seen.failures.append(f"{type(error).__name__}: {error}")
            if done.wait(1.0):
                return

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        done.set()
        thread.join(30)


def test_tampering_with_the_usage_region_harms_neither_the_daemon_nor_the_neighbour(tenants: Tenants) -> None:
    """While the exporter is scraped every second, the tenant points a CUDA process's usage region
    at the neighbour's region (a symlink the daemon, not the container, would resolve), then
    scribbles over its own region, grows it and truncates it to nothing. Every scrape is answered;
    the node daemon's containers never restart; the neighbour's figures never move and it gets its
    whole claim in every round; and afterwards a new pod on the node is prepared and runs with its
    limit."""
    bed, node = tenants.bed, tenants.node
    restarts = daemon_restarts(bed)
    steady = tenants.settled_neighbour_figures()
    before = tenants.neighbour_rounds()
    neighbours_region = f"{node_root()}/{node.name}/tessera/claims/{tenants.neighbour_claim_uid}/usage"
    script = "\n".join(
        [
            'cp() { cat "$1" > "$2"; }',
            "cp /run/tessera/usage /tmp/usage.bak",
            "echo '== pointed'",
            f"tenant_attack link {neighbours_region} /tmp/elsewhere",
            f"cp /tmp/usage.bak {neighbours_region}",
            "TESSERA_USAGE_REGION=/tmp/elsewhere shim_probe duty 2000000 6 4 2>&1; echo exit=$?",
            *(
                f"echo '== {how}'; tenant_attack region {how} /run/tessera/usage 2>&1; sleep 4"
                for how in ("scribble", "grow", "truncate")
            ),
            "echo '== restored'; cp /tmp/usage.bak /run/tessera/usage; echo exit=$?",
        ]
    )
    with scraping_every_second(tenants) as scrapes:
        seen = sections(tenants.run(script))
    for how in ("scribble", "grow", "truncate"):
        assert seen[how].get("region") == how, f"the tenant could not {how} its region: {seen}"
    broken = neighbour_harm(tenants, before, "the region attacks")
    if scrapes.failures:
        total = len(scrapes.failures) + len(scrapes.figures)
        broken.append(f"{len(scrapes.failures)} of {total} scrapes failed: {scrapes.failures[:5]}")
    moved = [
        f for f in scrapes.figures if {k: f.get(k) for k in STEADY} != {k: steady.get(k) for k in STEADY}
    ]
    if moved:
        broken.append(f"the neighbour's figures moved from {steady}: {moved[:5]}")
    if daemon_restarts(bed) != restarts:
        broken.append(f"the node daemon restarted: {restarts} -> {daemon_restarts(bed)}")
    try:
        if (after := tenants.settled_neighbour_figures()) != steady:
            broken.append(f"the neighbour's figures changed from {steady} to {after}")
    except TimeoutError as error:
        broken.append(f"{error}: the neighbour's figures are now {tenants.neighbour_figures()}")

    core = client.CoreV1Api(bed.kube)
    fresh = unique_name("after")
    script = f"echo '== info'; shim_probe info; echo '{DONE}'; {KEEP_RUNNING}"
    core.create_namespaced_pod(
        tenants.namespace, client.V1Pod.model_validate(hami_pod(fresh, tenants.node.name, script, 1000, 10))
    )
    try:
        seen_total = sections(wait_done(bed.kube, tenants.namespace, fresh, timeout=120))["info"].get("total")
        if seen_total != str(1000 * MiB):
            broken.append(f"a new pod on the node saw {seen_total} bytes, not its 1000 MiB")
    except AssertionError as error:
        broken.append(f"a new pod on the node was not prepared and run: {error}")
    core.delete_namespaced_pod(fresh, tenants.namespace, grace_period_seconds=0)
    assert not broken, "\n".join(broken)


# -- the webhook -----------------------------------------------------------------------------------


def webhook_endpoints(bed: ChartBed) -> list[tuple[str, int]]:
    """Each webhook replica's pod IP and HTTPS port."""
    found = []
    for pod in bed.pods("webhook"):
        [container] = pod["spec"]["containers"]
        [port] = [p["containerPort"] for p in container["ports"] if p["name"] == "https"]
        found.append((pod["status"]["podIP"], port))
    return found


def webhook_readiness(bed: ChartBed) -> dict[str, tuple[bool, int]]:
    """Each webhook replica: (Ready, restart count)."""
    return {
        pod["metadata"]["name"]: (
            any(
                c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or []
            ),
            sum(s["restartCount"] for s in pod["status"].get("containerStatuses") or []),
        )
        for pod in bed.pods("webhook")
    }


def templates_everywhere(kube: client.ApiClient) -> set[tuple[str, str]]:
    listed = raw_json(
        client.ResourceV1Api(kube).list_resource_claim_template_for_all_namespaces(_preload_content=False)
    )
    return {(t["metadata"]["namespace"], t["metadata"]["name"]) for t in listed["items"]}


def refused(outcome: str) -> bool:
    """An answer an unauthenticated caller may get: 401/403, or no answer at all (the TLS handshake
    wants a client certificate)."""
    return outcome in ("http-401", "http-403") or outcome.startswith("refused-")


def test_a_forged_admission_review_from_a_pod_is_refused_and_creates_nothing(
    tenants: Tenants, kube: client.ApiClient
) -> None:
    """From inside the tenant's pod, straight to each replica's pod IP, with no certificate and no
    token: reviews of a pod asking 80000 MiB in another tenant's namespace and in kube-system are
    refused, and no ResourceClaimTemplate appears in any namespace."""
    with made_namespace(kube) as victim:
        before = templates_everywhere(kube)
        for host, port in webhook_endpoints(tenants.bed):
            out = tenants.python("forged", host, str(port), victim, "kube-system")
            answers = {
                line["namespace"]: line["outcome"]
                for line in map(words, out.splitlines())
                if "namespace" in line
            }
            assert set(answers) == {victim, "kube-system"}, out
            assert all(refused(o) for o in answers.values()), (
                f"{host}:{port} accepted a forged review:\n{out}"
            )
        created = templates_everywhere(kube) - before
        resource = client.ResourceV1Api(kube)
        for namespace, name in created:  # the session's cluster is shared: leave kube-system clean
            resource.delete_namespaced_resource_claim_template(name, namespace)
        assert not created, f"forged reviews created templates: {sorted(created)}"


def words(line: str) -> dict[str, str]:
    return dict(w.split("=", 1) for w in line.split() if "=" in w and not line.startswith("#"))


def test_a_template_planted_under_the_webhooks_name_is_not_used(tenants: Tenants) -> None:
    """The tenant asks (by a server-side dry-run) which template name a 1500 MiB / 20 % pod would
    get, plants a template of that name asking the whole GPU's cores and 8 GiB, then creates the
    pod: it is refused with a sentence naming the template, or admitted with a template that is
    not the planted one."""
    kube, namespace = tenants.bed.kube, tenants.namespace
    core, resource = client.CoreV1Api(kube), client.ResourceV1Api(kube)
    pod = hami_pod(unique_name("planted"), tenants.node.name, KEEP_RUNNING, 1500, 20)
    dry = raw_json(
        core.create_namespaced_pod(
            namespace, client.V1Pod.model_validate(pod), dry_run="All", _preload_content=False
        )
    )
    [entry] = dry["spec"]["resourceClaims"]
    name = entry["resourceClaimTemplateName"]
    forged = {"memory": f"{FORGED_MEMORY}", "cores": str(FORGED_CORES)}
    resource.create_namespaced_resource_claim_template(
        namespace, share_claim_template(name, DEVICE_CLASS, forged)
    )
    try:
        made = raw_json(
            core.create_namespaced_pod(namespace, client.V1Pod.model_validate(pod), _preload_content=False)
        )
    except client.ApiException as error:
        assert error.status is not None and 400 <= error.status < 500, (error.status, error.body)
        assert name in str(error.body), f"the refusal does not name the planted template {name}: {error.body}"
        return
    core.delete_namespaced_pod(pod["metadata"]["name"], namespace, grace_period_seconds=0)
    used = [c.get("resourceClaimTemplateName") for c in made["spec"]["resourceClaims"]]
    assert name not in used, f"the pod was admitted with the planted template {name}"


def admitting(
    tenants: Tenants, done: threading.Event, seen: list[tuple[bool, str, float]], limit: int = 600
) -> None:
    """Until ``done``: every half second, a GPU pod (1000 MiB) created as a server-side dry-run,
    which the API server sends to the webhook; each outcome and its seconds appended to ``seen``."""
    core = client.CoreV1Api(tenants.bed.kube)
    pod = client.V1Pod.model_validate(hami_pod("admitted", tenants.node.name, KEEP_RUNNING, 1000, 10))
    for _ in range(limit):
        started = time.monotonic()
        try:
            core.create_namespaced_pod(tenants.namespace, pod, dry_run="All", _preload_content=False)
            seen.append((True, "admitted", time.monotonic() - started))
        except client.ApiException as error:
            seen.append((False, f"{error.status}: {error.body}", time.monotonic() - started))
        if done.wait(0.5):
            return


@contextlib.contextmanager
def real_pods_admitted(tenants: Tenants) -> Iterator[list[tuple[bool, str, float]]]:
    done = threading.Event()
    seen: list[tuple[bool, str, float]] = []
    thread = threading.Thread(target=admitting, args=(tenants, done, seen), daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        done.set()
        thread.join(60)


def hostile_quantity(tenants: Tenants, value: str) -> tuple[int, str, float]:
    """A GPU pod asking ``gpumem: value`` (server-side dry-run): the API server's status, its
    message, and the seconds the answer took."""
    core = client.CoreV1Api(tenants.bed.kube)
    body = hami_pod("hostile", tenants.node.name, KEEP_RUNNING, 1, 10)
    body["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = value
    started = time.monotonic()
    try:
        core.create_namespaced_pod(tenants.namespace, client.V1Pod.model_validate(body), dry_run="All")
        return 201, "admitted", time.monotonic() - started
    except client.ApiException as error:
        return int(error.status or 0), str(error.body)[:300], time.monotonic() - started


def test_hostile_input_gets_a_4xx_while_real_pods_keep_being_admitted(
    tenants: Tenants, capsys: pytest.CaptureFixture[str]
) -> None:
    """gpumem 1e1000000, 1e5000 and Infinity (through the API server), a 10 MiB review and 200
    connections that send their headers a byte a second (from the tenant's pod, at each replica's
    pod IP) each get a 4xx or are refused, while GPU pods keep being admitted and both replicas stay
    Ready without a restart. What each answer took is reported, not asserted."""
    bed = tenants.bed
    readiness = webhook_readiness(bed)
    assert len(readiness) == 2 and all(ready for ready, _ in readiness.values()), readiness
    report: list[str] = []
    broken: list[str] = []
    with real_pods_admitted(tenants) as admissions:
        for value in ("1e1000000", "1e5000", "Infinity"):
            status, message, seconds = hostile_quantity(tenants, value)
            report.append(f"gpumem {value}: {status} in {seconds * 1000:.0f} ms")
            if not 400 <= status < 500:
                broken.append(f"gpumem {value}: {status} {message}")
        for host, port in webhook_endpoints(bed):
            [answer] = [
                words(line)
                for line in tenants.python("body", host, str(port), "10").splitlines()
                if "bytes=" in line
            ]
            report.append(f"10 MiB review to {host}:{port}: {answer['outcome']} in {answer['ms']} ms")
            if not (answer["outcome"].startswith("http-4") or answer["outcome"].startswith("refused-")):
                broken.append(f"10 MiB review to {host}:{port}: {answer}")
            out = tenants.python("slow", host, str(port), "200", "20", timeout=200)
            outcomes = {w["outcome"]: int(w["count"]) for w in map(words, out.splitlines()) if "outcome" in w}
            report.append(f"200 slow connections to {host}:{port}: {outcomes}")
            bad = {
                o: n for o, n in outcomes.items() if not (o.startswith("http-4") or o.startswith("refused-"))
            }
            if bad or sum(outcomes.values()) != 200:
                broken.append(f"slow connections to {host}:{port}: {outcomes}")
            readiness_now = webhook_readiness(bed)
            if readiness_now != readiness:
                broken.append(f"webhook replicas changed during the attacks: {readiness} -> {readiness_now}")
    with capsys.disabled():
        print("\nwebhook under attack: " + "; ".join(report))
        if admissions:
            admitted = sum(ok for ok, _, _ in admissions)
            slowest = max(seconds for _, _, seconds in admissions)
            print(f"real pods admitted meanwhile: {admitted} of {len(admissions)}, slowest {slowest:.3f} s")
    refusals = [what for ok, what, _ in admissions if not ok]
    assert admissions and not refusals, f"real pods were refused during the attacks: {refusals[:5]}"
    assert not broken, "\n".join(broken)
    assert webhook_readiness(bed) == readiness
