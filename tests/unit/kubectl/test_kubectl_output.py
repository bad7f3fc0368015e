"""What ``kubectl tessera`` prints: bars at a terminal, plain columns in a pipe, data with ``-o``,
and every value a pod's author, a slice's writer or a Workload's message controls escaped and
bounded in each of them."""

from __future__ import annotations

import json
import unicodedata
from typing import Any

import yaml

from tessera.kubectl import render, views
from tessera.kubectl.queue import held
from tessera.kubectl.text import DATA_LIMIT, TEXT_LIMIT, as_json, as_yaml, bar, clean, columns
from tessera.kubectl.why import as_data, judge
from tests.unit.kubectl.kubectl_samples import gpu_slice, snapshot, used, waiting

HOSTILE = "\x1b]0;owned\x07\x1b[2J<script>alert(1)</script>\u202e[b]bold[/b]\\x1b" + "A" * 10 * 1024
"""A terminal title change, a screen clear, markup, a right-to-left override, a forged escape and
10 KiB."""


def _visible(output: str) -> bool:
    """No control or invisible character but the line breaks."""
    return all(c == "\n" or unicodedata.category(c) not in ("Cc", "Cf", "Zl", "Zp") for c in output)


def _longest_line(output: str) -> int:
    return max(len(line) for line in output.splitlines())


def test_clean_escapes_what_a_terminal_would_act_on_and_cuts_what_is_long() -> None:
    assert clean("plain name") == "plain name"
    assert clean("a\x1b[31mb") == "a\\x1b[31mb"
    assert clean("rtl\u202eoverride") == "rtl\\u202eoverride"
    assert clean("back\\slash") == "back\\x5cslash", "a backslash in the value cannot pass for an escape"
    assert clean("x" * 200) == "x" * TEXT_LIMIT + f"…(+{200 - TEXT_LIMIT} chars)"


def test_bars_show_the_allocated_part_of_the_whole() -> None:
    assert bar(20, 80) == "[###---------]"
    assert bar(0, 80) == "[------------]"
    assert bar(90, 80) == "[############]"
    assert bar(1, 0) == "[------------]"


def test_columns_pad_each_column_to_its_widest_cell() -> None:
    assert columns(["name", "gpus"], [["a", 1], ["longer", 22]]) == "NAME     GPUS\na        1\nlonger   22"


def _gpus() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    found = snapshot(
        [gpu_slice("node-a", [80, 40], cordoned=[1])],
        [used("node-a", 0, "20Gi", "train-0", "30", pod="train")],
    )
    return views.gpu_rows(found), views.mig_rows(found)


def test_a_terminal_gets_each_gpu_with_bars_and_its_shares_beneath() -> None:
    gpus, migs = _gpus()
    shown = render.gpus_bars(gpus, migs)
    assert shown.splitlines() == [
        "node-a",
        "  gpu-node-a-0  GPU-node-a-0  NVIDIA H100 80GB HBM3",
        "    memory [###---------] 20Gi of 80Gi allocated",
        "    cores  [####--------] 30 of 100 allocated",
        "    share  team/train  claim train-0  20Gi  30 cores",
        "  gpu-node-a-1  GPU-node-a-1  NVIDIA H100 80GB HBM3",
        "    memory [------------] 0 of 40Gi allocated",
        "    cores  [------------] 0 of 100 allocated",
        "    taints gpu.tessera.dev/cordoned",
    ]


def test_a_pipe_gets_plain_columns_one_gpu_a_line_and_a_share_a_line() -> None:
    gpus, migs = _gpus()
    gpus[0]["memoryUsed"] = 3 * 1024**3
    lines = render.gpus_columns(gpus, migs).splitlines()
    assert lines[0].split() == [
        "NODE",
        "GPU",
        "UUID",
        "PRODUCT",
        "MEM",
        "ALLOC",
        "MEM",
        "TOTAL",
        "MEM",
        "USED",
        "CORES",
        "ALLOC",
        "BUSY",
        "TAINTS",
        "SHARES",
    ]
    assert lines[1].split()[:2] == ["node-a", "gpu-node-a-0"]
    assert "3Gi" in lines[1] and "30/100" in lines[1]
    assert "gpu.tessera.dev/cordoned" in lines[2]
    assert lines[5].split() == ["node-a", "gpu-node-a-0", "team", "train", "train-0", "20Gi", "30", "-", "-"]
    assert "#" not in "\n".join(lines)


def test_mig_instances_are_listed_with_their_profile_parent_and_holder() -> None:
    devices = gpu_slice("node-m", [80])
    devices["spec"]["devices"].append(
        {
            "name": "mig-1",
            "attributes": {
                "type": {"string": "mig"},
                "profile": {"string": "1g.10gb"},
                "uuid": {"string": "MIG-1"},
                "parentUUID": {"string": "GPU-node-m-0"},
            },
            "capacity": {"memory": {"value": "10Gi"}},
        }
    )
    claim = used("node-m", 0, "10Gi", "mig-claim", pod="inference")
    claim["status"]["allocation"]["devices"]["results"][0]["device"] = "mig-1"
    rows = views.mig_rows(snapshot([devices], [claim]))
    assert rows == [
        {
            "node": "node-m",
            "device": "mig-1",
            "uuid": "MIG-1",
            "profile": "1g.10gb",
            "parent": "GPU-node-m-0",
            "memory": 10 * 1024**3,
            "claim": "team/mig-claim",
            "pod": "inference",
        }
    ]
    assert "1g.10gb" in render.gpus_columns([], rows)


def test_hostile_names_products_and_annotations_are_escaped_and_bounded_in_every_view() -> None:
    hostile_slice = gpu_slice("node-h", [80], product=HOSTILE)
    claim = used("node-h", 0, "20Gi", "c", pod=HOSTILE)
    found = snapshot([hostile_slice], [claim])
    gpus, migs = views.gpu_rows(found), views.mig_rows(found)
    # The type annotation as long as the webhook lets it be, converted by the webhook's code.
    template, pod = waiting(
        "victim",
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1024"},
        {"nvidia.com/use-gputype": HOSTILE[:1500]},
    )
    verdict = as_data(judge(pod, snapshot([gpu_slice("node-a", [80])], [], [template])))
    assert verdict["reasons"][0].startswith("no GPU's product contains '\x1b]0;owned")
    workload = {
        "metadata": {"namespace": "team", "name": HOSTILE},
        "status": {"admissionChecks": [{"name": "gpu-fit", "state": "Pending", "message": HOSTILE}]},
    }
    queue = held([workload], {"gpu-fit"})
    texts = {
        "gpus bars": render.gpus_bars(gpus, migs),
        "gpus columns": render.gpus_columns(gpus, migs),
        "pods": render.pods_columns(views.share_rows(found, None)),
        "why": render.why_text(HOSTILE, verdict),
        "queue": render.queue_columns(queue),
    }
    assert "contains '\\x1b]0;owned\\x07\\x1b[2j<script>" in texts["why"], "the value is shown, escaped"
    for name, text in texts.items():
        assert _visible(text), name
        assert "\x1b" not in text and "\u202e" not in text, name
        assert _longest_line(text) < 4096, name
        assert "A" * 3000 not in text, name
    for data in ({"gpus": gpus}, verdict, {"workloads": queue}):
        for text in (as_json(data), as_yaml(data)):
            assert _visible(text) and "\x1b" not in text
        assert _all_strings_within(json.loads(as_json(data)), DATA_LIMIT + 32)
        assert _all_strings_within(yaml.safe_load(as_yaml(data)), DATA_LIMIT + 32)


def _all_strings_within(data: Any, limit: int) -> bool:
    if isinstance(data, str):
        return len(data) <= limit
    if isinstance(data, dict):
        return all(_all_strings_within(k, limit) and _all_strings_within(v, limit) for k, v in data.items())
    if isinstance(data, list):
        return all(_all_strings_within(v, limit) for v in data)
    return True


def test_machine_output_keeps_values_as_data() -> None:
    gpus, _ = _gpus()
    data = json.loads(as_json({"gpus": gpus}))
    assert data["gpus"][0]["shares"] == [
        {"namespace": "team", "pod": "train", "claim": "train-0", "memory": 20 * 1024**3, "cores": 30}
    ]
    assert yaml.safe_load(as_yaml({"gpus": gpus})) == data


def test_the_queue_view_lists_workloads_our_check_holds_in_kueues_order() -> None:
    def workload(name: str, priority: int, state: str) -> dict[str, Any]:
        return {
            "metadata": {"namespace": "team", "name": name, "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"priority": priority},
            "status": {"admissionChecks": [{"name": "gpu-fit", "state": state, "message": f"{name} says"}]},
        }

    rows = held(
        [workload("low", 1, "Pending"), workload("ready", 9, "Ready"), workload("high", 5, "Pending")],
        {"gpu-fit"},
    )
    assert [(r["workload"], r["message"]) for r in rows] == [("high", "high says"), ("low", "low says")]
    assert render.queue_columns(rows).splitlines()[1].split() == ["team", "high", "Pending", "high", "says"]
