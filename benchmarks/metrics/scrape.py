"""Scrape latency and memory of the node daemon's metrics exporter: 8 simulated GPUs, 64 containers.

The exporter's real parts in one process, as the daemon runs them: NVML (pynvml over the simulated
driver, 8 GPUs), 64 prepared claim folders written with the shim's format code, one live process per
claim under the shim holding device memory in its claim's usage region (so every scrape reads 64
regions with a live slot each and reads each NVML-listed process's cgroup), the pod index
fed with 64 pods, and prometheus_client's HTTP server. The exporter runs in a process of its own and
the scrapes come from this one, as Prometheus's do: each is one HTTP GET of /metrics, timed from
the client, and the exporter's CPU time is read from /proc. Results go to
benchmarks/metrics/results/ (or --out DIR).

Run: ``.venv/bin/python benchmarks/metrics/scrape.py`` (builds the shim, the simulated driver and
the probe program if needed).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.run_info import RunInfo

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parents[2]
GPUS = 8
CONTAINERS = 64
GiB = 1 << 30


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def measure(work: Path) -> dict[str, object]:
    """Runs inside the re-executed process, whose environment points pynvml at the simulator."""
    from prometheus_client import CollectorRegistry

    from simgpu.config import library_dir
    from tessera.driver.discovery import Nvml
    from tessera.exporter.collector import GpuCollector, Sources
    from tessera.exporter.containers import ContainerIndex
    from tessera.exporter.metrics import DaemonMetrics
    from tessera.exporter.server import MetricsServer
    from tessera.shim.format import GpuLimit, create_region, write_limits
    from tessera.shim.install import install
    from testbed.shim_harness import PROGRAM_BUILD, Claim

    nvml = Nvml()
    gpus = nvml.gpus()
    assert len(gpus) == GPUS, gpus
    claims_dir = work / "claims"
    libs = library_dir()
    shim = install(work / "shim", libs / "libcuda.so.1", libs / "libnvidia-ml.so.1")
    pods = []
    holders = []
    for i in range(CONTAINERS):
        uid = f"uid-{i:03d}"
        folder = claims_dir / uid
        folder.mkdir(parents=True)
        gpu = gpus[i % GPUS]
        (folder / "claim.json").write_text(json.dumps({"namespace": "bench", "name": f"c{i}", "uid": uid}))
        write_limits(folder / "limits", [GpuLimit(gpu.uuid, 8 * GiB, 10)])
        create_region(folder / "usage")
        pods.append(
            {
                "metadata": {"namespace": "bench", "name": f"p{i}", "uid": f"pod-{i}"},
                "spec": {
                    "resourceClaims": [{"name": "gpu", "resourceClaimName": f"c{i}"}],
                    "containers": [{"name": "main", "resources": {"claims": [{"name": "gpu"}]}}],
                },
                "status": {"phase": "Running"},
            }
        )
        claim = Claim(shim.directory, folder / "limits", folder / "usage", dict(os.environ), PROGRAM_BUILD)
        env = {"PROBE_DEVICE": "0", "CUDA_VISIBLE_DEVICES": gpu.uuid}
        holders.append(claim.start("shim_probe", "alloc", "mem", str(256 << 20), "hold", env=env))
    for holder in holders:
        assert holder.stdout is not None
        for line in holder.stdout:
            if line.startswith("HOLD"):
                break
        else:
            raise RuntimeError(f"a holder exited: {holder.stderr.read() if holder.stderr else ''}")

    index = ContainerIndex(lambda **_: None, "bench-node")
    index.on_event("SYNCED", {"items": pods})
    before = rss_kib()
    registry = CollectorRegistry()
    metrics = DaemonMetrics("bench-node")
    registry.register(
        GpuCollector(
            Sources(
                node="bench-node",
                claims_dir=claims_dir,
                gpus=lambda: gpus,
                sample=nvml.sample,
                problems=dict,
                records=dict,
                containers=index.containers,
                container=index.container,
            ),
            metrics,
        )
    )
    server = MetricsServer("127.0.0.1", 0, registry)
    server.start()
    print(f"PORT {server.port}", flush=True)
    try:
        sys.stdin.read()  # the client closes it when its scrapes are done
    finally:
        server.stop()
        for holder in holders:
            if holder.stdin is not None:
                holder.stdin.close()
        for holder in holders:
            holder.wait(timeout=60)
        nvml.close()
    after = rss_kib()
    return {
        "gpus": GPUS,
        "containers": CONTAINERS,
        "live_processes": len(holders),
        "rss_before_exporter_mib": round(before / 1024, 1),
        "rss_after_scrapes_mib": round(after / 1024, 1),
        "exporter_rss_growth_mib": round((after - before) / 1024, 1),
    }


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process ``pid`` so far (fields 14 and 15 of its stat)."""
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    fields = stat[stat.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# What a Prometheus server asks for by default: OpenMetrics text if offered, gzip-compressed. The
# exporter answers in the text format (tessera/exporter/exposition.py says why), compressed.
SCRAPE_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0;q=0.6,application/openmetrics-text;"
    "version=0.0.1;q=0.5,text/plain;version=0.0.4;q=0.3,*/*;q=0.2",
    "Accept-Encoding": "gzip",
}


def scrape(exporter: subprocess.Popen[str], rounds: int) -> dict[str, object]:
    """Time ``rounds`` scrapes of the exporter (after ten of warm-up) and check the last answer."""
    assert exporter.stdout is not None
    port = int(exporter.stdout.readline().split()[1])
    url = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=SCRAPE_HEADERS)
    for _ in range(10):  # warm-up: imports, first region mappings
        urllib.request.urlopen(url, timeout=10).read()
    times = []
    body = b""
    cpu_started = cpu_seconds(exporter.pid)
    for _ in range(rounds):
        started = time.perf_counter()
        with urllib.request.urlopen(url, timeout=10) as response:
            body = response.read()
        times.append(time.perf_counter() - started)
    exporter_cpu = cpu_seconds(exporter.pid) - cpu_started
    text = gzip.decompress(body).decode()
    used_lines = [
        line for line in text.splitlines() if line.startswith("tessera_container_gpu_memory_used_bytes{")
    ]
    assert len(used_lines) == CONTAINERS, len(used_lines)
    assert all(float(line.rsplit(" ", 1)[1]) == 256 << 20 for line in used_lines), used_lines[:3]
    ms = sorted(t * 1000 for t in times)
    return {
        "rounds": rounds,
        "scrape_p50_ms": round(statistics.median(ms), 2),
        "scrape_p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 2),
        "scrape_max_ms": round(ms[-1], 2),
        "exporter_cpu_mean_ms": round(exporter_cpu * 1000 / rounds, 2),
        "scrape_bytes": len(body),
        "scrape_bytes_uncompressed": len(text),
        "series_lines": sum(1 for line in text.splitlines() if line and not line.startswith("#")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=500, help="scrapes to time")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--inner", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        print(json.dumps(measure(args.inner)))
        return

    from simgpu.config import GiB as SIM_GiB
    from simgpu.config import NodeSpec, make_gpus, process_env, write_config
    from testbed.shim_harness import PROGRAM_BUILD, SIMGPU_BUILD, build_programs, build_shim, build_simgpu

    build_shim()
    build_simgpu()
    build_programs(PROGRAM_BUILD, SIMGPU_BUILD)
    info = RunInfo.start(["tessera"])
    with tempfile.TemporaryDirectory(prefix="tmetrics-") as tmp:
        work = Path(tmp)
        spec = NodeSpec(state_file=work / "state", gpus=make_gpus(GPUS, "bench", memory_bytes=80 * SIM_GiB))
        env = process_env(write_config(spec, work / "simgpu.conf"))
        exporter = subprocess.Popen(
            [sys.executable, __file__, f"--inner={work}"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            client = scrape(exporter, args.rounds)
        finally:
            out, err = exporter.communicate(timeout=120)  # closes stdin: the exporter stops
        if exporter.returncode != 0:
            raise SystemExit(out + err)
    figures = {**json.loads(out.strip().splitlines()[-1]), **client}
    info.finish()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scrape.json").write_text(
        json.dumps({"run": info.as_json(), "figures": figures}, indent=1) + "\n"
    )
    f = figures
    lines = [
        "# Metrics exporter: scrape latency and memory",
        "",
        *info.markdown(),
        f"- Set-up: {f['gpus']} simulated 80 GiB GPUs through pynvml, {f['containers']} prepared claims (one",
        "  container each, 8 per GPU) with one live shim process each holding 256 MiB, the pod index fed",
        "  with their pods; prometheus_client's HTTP server, in a process of its own; each scrape one",
        "  GET of /metrics from another process asking, as Prometheus does by default, for OpenMetrics",
        "  text with gzip (client-side time).",
        "",
        "| figure | target | measured |",
        "|---|---|---|",
        f"| scrape, p50 ({f['rounds']} scrapes) | | {f['scrape_p50_ms']} ms |",
        f"| scrape, p99 | ≤ 50 ms | {f['scrape_p99_ms']} ms |",
        f"| scrape, max | | {f['scrape_max_ms']} ms |",
        f"| exporter's CPU time per scrape, mean ({f['rounds']} scrapes, from /proc) | "
        f"| {f['exporter_cpu_mean_ms']} ms |",
        f"| response size, gzip / uncompressed / sample lines | "
        f"| {f['scrape_bytes']} / {f['scrape_bytes_uncompressed']} bytes / {f['series_lines']} |",
        f"| process RSS before the exporter started (NVML, imports) | | {f['rss_before_exporter_mib']} MiB |",
        f"| RSS after all scrapes | | {f['rss_after_scrapes_mib']} MiB |",
        f"| exporter's growth (server, collector, {f['rounds']} scrapes) | "
        f"| {f['exporter_rss_growth_mib']} MiB |",
        "",
        "How to read it: each scrape opens, sweeps and reads 64 usage regions and 64 limits files,",
        "asks NVML five figures and the per-process samples of each of the 8 GPUs, reads /proc for the",
        "sampled processes, renders about 420 sample lines and compresses them. The wall-clock figures",
        "include waiting for a CPU: on a shared 2-core machine (see the load average) that wait, not the",
        "exporter's work, sets the tail. The CPU-time row is the exporter's work itself.",
        "",
    ]
    (args.out / "scrape.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
