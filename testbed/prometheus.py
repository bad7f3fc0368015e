"""A real Prometheus for the test bed: scrapes node exporters, loads the shipped alert rules, and
answers the query API, so metrics tests read what a user's Prometheus would read.

Built from the Go module proxy like the other programs (build-binaries.sh ``prometheus``), started
on loopback with its data in a temporary folder, and stopped with it. Scrape and rule evaluation
run every second, so tests wait in scrapes, not minutes; "within one scrape" is checked by scrape
count (``tessera_exporter_scrapes_total`` names each scrape), never by a stopwatch.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from testbed.binaries import binary, ensure_built
from testbed.process import ManagedProcess, free_port

SCRAPE_INTERVAL_S = 1
RULES_FILE = Path(__file__).resolve().parent.parent / "charts" / "tessera" / "files" / "alert-rules.yaml"
TEST_HOLD = "5s"
"""The ``for:`` every shipped rule is given when a test waits for an alert to fire: still five
evaluations pending before it fires, but not the minutes the shipped holds take. promtool's rule
tests (tests/integration/test_metrics_exporter.py) check the shipped holds themselves."""


def held_for(rules: Path, hold: str, folder: Path) -> Path:
    """A copy of the rules file ``rules`` in ``folder`` whose alerting rules each have ``for: hold``."""
    loaded = yaml.safe_load(rules.read_text())
    for group in loaded["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                rule["for"] = hold
    copy = folder / f"held-{rules.name}"
    copy.write_text(yaml.safe_dump(loaded, sort_keys=False))
    return copy


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run promtool (built on demand); the caller checks the exit status."""
    ensure_built("prometheus")
    return subprocess.run(
        [str(binary("promtool")), *args], input=stdin, capture_output=True, text=True, timeout=120
    )


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float
    timestamp: float


class Prometheus:
    """One Prometheus server scraping ``targets`` (host:port of node exporters)."""

    def __init__(
        self, targets: Sequence[str], rule_files: Sequence[Path] = (RULES_FILE,), hold: str | None = None
    ) -> None:
        """With ``hold``, every rule's ``for:`` is that instead (a copy of each file is loaded)."""
        ensure_built("prometheus")
        self.work_dir = Path(tempfile.mkdtemp(prefix="tprom-"))
        if hold is not None:
            rule_files = [held_for(path, hold, self.work_dir) for path in rule_files]
        self.port = free_port()
        config = {
            "global": {
                "scrape_interval": f"{SCRAPE_INTERVAL_S}s",
                "scrape_timeout": f"{SCRAPE_INTERVAL_S}s",
                "evaluation_interval": f"{SCRAPE_INTERVAL_S}s",
            },
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [
                {"job_name": "tessera-driver", "static_configs": [{"targets": list(targets)}]}
            ],
        }
        (self.work_dir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.process = ManagedProcess(
            "prometheus",
            [
                binary("prometheus"),
                f"--config.file={self.work_dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.work_dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            self.work_dir,
        )
        self.process.wait_until(self._ready, 60, "ready")

    def _ready(self) -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
            return bool(r.status == 200)

    def _get(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.loads(r.read())
        if body.get("status") != "success":
            raise RuntimeError(f"{url}: {body}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[Sample]:
        """An instant query (now, or at ``at`` seconds since the epoch): one sample per series."""
        params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
        data = self._get("/api/v1/query", **params)
        return [Sample(dict(r["metric"]), float(r["value"][1]), float(r["value"][0])) for r in data["result"]]

    def series_at_scrape(self, expr: str, node: str, scrape: int) -> list[Sample] | None:
        """``expr`` as it stood in the exporter's scrape number ``scrape`` on ``node`` (None until
        Prometheus has made that scrape). Both come from one scrape, so they share its timestamp."""
        marks = self.query(f'tessera_exporter_scrapes_total{{node="{node}"}} >= {scrape}')
        if not marks:
            return None
        history = self._get(
            "/api/v1/query",
            query=f'tessera_exporter_scrapes_total{{node="{node}"}}[5m]',
        )["result"]
        stamps = [float(t) for t, v in history[0]["values"] if float(v) >= scrape] if history else []
        if not stamps:
            return None
        first = min(stamps)
        # An instant query's result carries the query's time, not the sample's: ask timestamp()
        # too and keep the series whose sample is this scrape's (a vanished series has none).
        when = {_key(s.labels): s.value for s in self.query(f"timestamp({expr})", at=first)}
        return [s for s in self.query(expr, at=first) if abs(when.get(_key(s.labels), 0) - first) < 0.0005]

    def alerts(self) -> list[dict[str, Any]]:
        """Active alerts (pending and firing) as the API lists them."""
        return list(self._get("/api/v1/alerts")["alerts"])

    def rule_groups(self) -> list[dict[str, Any]]:
        return list(self._get("/api/v1/rules")["groups"])

    def targets_up(self) -> bool:
        return all(t["health"] == "up" for t in self._get("/api/v1/targets")["activeTargets"])

    def log_tail(self, lines: int = 40) -> str:
        return self.process.log_tail(lines)

    def stop(self) -> None:
        self.process.stop()
        shutil.rmtree(self.work_dir, ignore_errors=True)


def _key(labels: dict[str, str]) -> frozenset[tuple[str, str]]:
    return frozenset((k, v) for k, v in labels.items() if k != "__name__")
