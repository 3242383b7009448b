"""The live dashboard's HTTP answers: /api/state content, the SSE stream, the page, Grafana JSON."""

from __future__ import annotations

import ast
import asyncio
import json
import math
import re
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr_accel import (
    ContextPoisoned,
    FaultKind,
    InvalidArgument,
    OutOfMemory,
    System,
    Unrecoverable,
)
from atomr_accel.cli import main
from atomr_accel.patterns import DynamicBatchingServer, FairShareScheduler

prometheus_parser = pytest.importorskip("prometheus_client.parser")

ROOT = Path(__file__).resolve().parents[1]


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        return bytes(response.read())


def state_of(port: int) -> dict[str, Any]:
    answer: dict[str, Any] = json.loads(fetch(f"http://127.0.0.1:{port}/api/state"))
    return answer


def quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """An independent histogram_quantile: ``buckets`` = sorted (upper bound, cumulative)."""
    total = buckets[-1][1]
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank and count > prev_count:
            if math.isinf(bound):
                return prev_bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = bound, count
    raise AssertionError("no bucket holds the rank")


@pytest.mark.serial  # two reads of the same metrics compared: alone, nothing lands between
def test_state_lists_devices_and_library_figures_that_match_the_metrics() -> None:
    rng = np.random.default_rng(7)
    with System.open("dash") as system:
        first = system.spawn_device(mock=True, name="first")
        second = system.spawn_device(mock=True, name="second", isolation="process")
        port = system.serve_dashboard()
        expected: dict[str, int] = {}
        x, y = first.allocate_f64(64), first.allocate_f64(64)
        expected["memory"] = 2
        for _ in range(int(rng.integers(5, 12))):
            first.copy_from_numpy(x, rng.standard_normal(64))
            first.copy_from_numpy(y, rng.standard_normal(64))
            expected["memory"] += 2
            first.blas().axpy_f64(float(rng.standard_normal()), x, y)
            expected["blas"] = expected.get("blas", 0) + 1
        kept = second.allocate_f32(8)  # held: a dropped buffer's free lands at any time
        expected["memory"] += 1
        system.telemetry.refresh()  # type: ignore[union-attr]
        metrics = fetch(f"http://127.0.0.1:{port}/metrics").decode()
        state = state_of(port)

        assert state["system"] == "dash"
        rows = {row["name"]: row for row in state["devices"]}
        assert [row["name"] for row in state["devices"]] == ["first", "second"]
        for name, dev in (("first", first), ("second", second)):
            stats = dev.stats()
            row = rows[name]
            assert (row["backend"], row["status"], row["generation"], row["restarts"]) == \
                ("cpu", "ready", stats.generation, stats.restarts)
            assert row["host"] == {"isolation": stats.isolation, "pid": stats.host_pid}
            assert row["memory"]["allocated"] == stats.bytes_allocated
            assert row["memory"]["total"] == stats.memory_total
            assert row["memory"]["used"] == stats.memory_total - row["memory"]["free"]
        assert rows["second"]["host"]["isolation"] == "process"
        assert rows["first"]["memory"]["allocated"] == 2 * 64 * 8
        assert rows["second"]["memory"]["allocated"] == kept.nbytes == 8 * 4

        libraries = state["libraries"]
        memory_ops = sum(r["ops_total"] for r in libraries.values()) - libraries["blas"][
            "ops_total"]
        assert libraries["blas"]["ops_total"] == expected["blas"]
        assert memory_ops >= expected["memory"]  # + the memory_info reads made at spawn
        assert all(r["errors_total"] == 0 and r["in_flight"] == 0 for r in libraries.values())
        for library, figures in libraries.items():
            buckets = sorted(
                (float(s.labels["le"]), s.value)
                for family in prometheus_parser.text_string_to_metric_families(metrics)
                for s in family.samples
                if s.name == "atomr_op_latency_seconds_bucket"
                and s.labels["library"] == library)
            summed: dict[float, float] = {}
            for bound, count in buckets:  # sum the devices' histograms
                summed[bound] = summed.get(bound, 0.0) + count
            merged = sorted(summed.items())
            for q in (0.5, 0.95, 0.99):
                assert figures[f"p{round(q * 100)}_s"] == pytest.approx(quantile(q, merged))
            assert figures["p50_s"] <= figures["p95_s"] <= figures["p99_s"]


def test_rates_count_the_ops_answered_between_two_reads() -> None:
    with System.open("dash") as system:
        dev = system.spawn_device(mock=True)
        port = system.serve_dashboard()
        x, y = dev.allocate_f32(32), dev.allocate_f32(32)
        started = time.monotonic()
        state_of(port)
        n = 25
        for _ in range(n):
            dev.blas().axpy_f32(0.5, x, y)
        blas = state_of(port)["libraries"]["blas"]
        elapsed = time.monotonic() - started
        assert blas["ops_total"] == n
        assert blas["rate_per_s"] >= n / elapsed  # the server's two reads lie inside our interval
        assert blas["p50_s"] is not None


def test_a_poisoned_context_shows_as_events_and_a_new_generation() -> None:
    with System.open("dash") as system:
        dev = system.spawn_device(mock=True, name="victim")
        system.spawn_device(mock=True, name="bystander")
        port = system.serve_dashboard()
        before = {row["name"]: row for row in state_of(port)["devices"]}
        with pytest.raises(ContextPoisoned):
            dev.inject_fault(FaultKind.POISON)
        dev.allocate_f64(4)  # waits for the rebuild
        state = state_of(port)
        rows = {row["name"]: row for row in state["devices"]}
        assert rows["victim"]["generation"] == before["victim"]["generation"] + 1
        assert rows["victim"]["restarts"] == 1
        assert rows["bystander"]["generation"] == before["bystander"]["generation"]
        mine = [(e["kind"], e["actor"]) for e in state["events"] if e["device"] == "victim"]
        assert mine == [("context_ready", "/user/victim"),
                        ("context_down", "/user/victim/context"),
                        ("context_restarted", "/user/victim/context"),
                        ("context_ready", "/user/victim")]
        down = next(e for e in state["events"] if e["kind"] == "context_down")
        assert "ContextPoisoned" in down["detail"] and "RESTART" in down["detail"]
        assert [e["seq"] for e in state["events"]] == sorted(e["seq"] for e in state["events"])
        direct = system.telemetry.dashboard.state()  # type: ignore[union-attr]
        assert [(d["name"], d["generation"]) for d in direct["devices"]] == \
            [(d["name"], d["generation"]) for d in state["devices"]]
        assert direct["events"] == state["events"]


def test_a_device_past_its_restart_budget_shows_stopped() -> None:
    with System.open("dash") as system:
        dev = system.spawn_device(mock=True, name="fragile", max_restarts=0)
        port = system.serve_dashboard()
        with pytest.raises(ContextPoisoned):
            dev.inject_fault(FaultKind.POISON)
        with pytest.raises(Unrecoverable):
            dev.allocate_f64(4)
        deadline = time.monotonic() + 10
        while True:  # the device actor stops just after it answers
            state = state_of(port)
            if state["devices"][0]["status"] == "stopped" or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert state["devices"][0]["status"] == "stopped"
        assert "device_stopped" in [e["kind"] for e in state["events"]]


def test_a_collective_world_rebuilt_after_a_poisoned_member_shows_as_events() -> None:
    with System.open("dash") as system:
        port = system.serve_dashboard()
        devices = [system.spawn_device(i, mock=True, name=f"rank-{i}") for i in range(2)]
        world = system.nccl_world(devices, name="pair")
        bufs = [d.allocate_f32(4) for d in devices]
        world.all_reduce(bufs)
        with pytest.raises(ContextPoisoned):
            devices[1].inject_fault(FaultKind.POISON)
        bufs = [d.allocate_f32(4) for d in devices]
        world.all_reduce(bufs)  # served by the rebuilt world
        deadline = time.monotonic() + 10
        while True:
            kinds = [(e["kind"], e["actor"], e["detail"].split(":")[0])
                     for e in state_of(port)["events"] if e["kind"].startswith("world_")]
            if len(kinds) >= 3 or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert kinds == [("world_ready", "world pair", "epoch 1"),
                         ("world_aborted", "world pair", "epoch 1"),
                         ("world_ready", "world pair", "epoch 2")]


def test_blueprint_panels_show_the_blueprints_stats() -> None:
    """Blueprints spawned in the system show as panels by themselves, whether they started
    before the dashboard (``batching``) or after (``fair``); a stopped one's panel goes."""
    with System.open("dash") as system:
        batching = DynamicBatchingServer.spawn(
            system, lambda items: [i * 2 for i in items], max_batch=4, max_wait=0.001)
        port = system.serve_dashboard()
        fair = FairShareScheduler.spawn(system, lambda item: item, weights={"a": 3.0, "b": 1.0},
                                        max_in_flight=2)
        dashboard = system.telemetry.dashboard  # type: ignore[union-attr]
        assert dashboard is not None
        dashboard.add_panel(batching, "batcher")  # a second panel of it, named

        async def load() -> None:
            await asyncio.gather(*(batching.submit(i, timeout=10) for i in range(9)))
            await asyncio.gather(*(fair.submit(t, i, cost=c, timeout=10)
                                   for i, (t, c) in enumerate([("a", 1.0), ("b", 2.5)] * 3)))

        asyncio.run(load())
        panels = {p["name"]: p for p in state_of(port)["panels"]}
        assert set(panels) == {batching.path, "batcher", fair.path}
        assert panels["batcher"] == {**panels[batching.path], "name": "batcher"}
        assert panels["batcher"]["kind"] == "BatchingStats"
        assert panels["batcher"]["stats"]["completed"] == 9
        assert panels["batcher"]["stats"]["queued"] == 0
        assert panels[fair.path]["kind"] == "FairShareStats"
        assert panels[fair.path]["stats"]["completed"] == {"a": 3, "b": 3}
        assert panels[fair.path]["stats"]["completed_cost"] == {"a": 3.0, "b": 7.5}
        batching.stop()
        deadline = time.monotonic() + 10
        while batching.is_alive and time.monotonic() < deadline:
            time.sleep(0.01)
        assert {p["name"] for p in state_of(port)["panels"]} == {fair.path}
        with pytest.raises(InvalidArgument):
            dashboard.add_panel(object())  # type: ignore[arg-type]


def test_device_sections_add_per_device_figures_to_each_row() -> None:
    with System.open("dash") as system:
        system.spawn_device(mock=True, name="a")
        system.spawn_device(mock=True, name="b")
        port = system.serve_dashboard()
        dashboard = system.telemetry.dashboard  # type: ignore[union-attr]
        assert dashboard is not None
        calls: dict[str, int] = {"a": 3}

        def counters(name: str, stats: Any) -> dict[str, int] | None:
            return None if name not in calls else {"calls": calls[name],
                                                   "generation": stats.generation}

        def broken(name: str, stats: Any) -> None:
            raise RuntimeError("no figures")

        dashboard.add_device_section("functions", counters)
        dashboard.add_device_section("broken", broken)
        rows = {row["name"]: row["sections"] for row in state_of(port)["devices"]}
        assert rows == {"a": {"functions": {"calls": 3, "generation": 1},
                              "broken": {"error": "RuntimeError: no figures"}},
                        "b": {"broken": {"error": "RuntimeError: no figures"}}}
        dashboard.remove_device_section("broken")
        calls["b"] = 5
        rows = {row["name"]: row["sections"] for row in state_of(port)["devices"]}
        assert rows == {"a": {"functions": {"calls": 3, "generation": 1}},
                        "b": {"functions": {"calls": 5, "generation": 1}}}
        with pytest.raises(InvalidArgument):
            dashboard.add_device_section("", counters)
        with pytest.raises(InvalidArgument):
            dashboard.add_device_section("x", None)  # type: ignore[arg-type]


def test_page_metrics_and_state_share_one_server() -> None:
    with System.open("dash") as system:
        telemetry = system.enable_telemetry(port=0)
        system.spawn_device(mock=True)
        assert system.serve_dashboard() == telemetry.port
        assert system.serve_dashboard() == telemetry.port  # again: the same
        with pytest.raises(InvalidArgument):
            system.serve_dashboard(port=1 if telemetry.port != 1 else 2)
        base = f"http://127.0.0.1:{telemetry.port}"
        page = fetch(base + "/").decode()
        assert "<table id=\"devices\">" in page and "dashboard.js" in page
        assert "http" not in page.split("<body>")[1]  # nothing fetched from elsewhere
        assert b"EventSource" in fetch(base + "/dashboard.js")
        assert fetch(base + "/dashboard.css").startswith(b"body")
        assert b"atomr_device_generation" in fetch(base + "/metrics")
        with pytest.raises(urllib.error.HTTPError) as info:
            fetch(base + "/nothing-here")
        assert info.value.code == 404
        info.value.close()


def test_events_stream_pushes_states_as_server_sent_events() -> None:
    with System.open("dash") as system:
        system.spawn_device(mock=True, name="d")
        port = system.serve_dashboard()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/events",
                                    timeout=10) as stream:
            assert stream.headers["Content-Type"] == "text/event-stream"
            states = []
            while len(states) < 2:
                line = stream.readline().decode()
                if line.startswith("data: "):
                    states.append(json.loads(line[len("data: "):]))
        assert [s["devices"][0]["name"] for s in states] == ["d", "d"]
        assert states[1]["time"] > states[0]["time"]


def test_dashboard_command_attaches_to_a_running_endpoint(
        capsys: pytest.CaptureFixture[str]) -> None:
    with System.open("dash") as system:
        system.spawn_device(mock=True, name="attached")
        port = system.serve_dashboard()
        assert main(["dashboard", "--url", f"http://127.0.0.1:{port}"]) == 0
        text = capsys.readouterr().out
        assert f"http://127.0.0.1:{port}/" in text and "attached" in text
    assert main(["dashboard", "--url", f"http://127.0.0.1:{port}"]) == 1
    assert "cannot reach" in capsys.readouterr().out


def grafana_metric_names() -> set[str]:
    board = json.loads((ROOT / "docs" / "grafana" / "atomr-accel.json").read_text())
    exprs = [t["expr"] for panel in board["panels"] for t in panel.get("targets", [])]
    assert exprs, "the Grafana dashboard has no queries"
    return {name for expr in exprs for name in re.findall(r"\batomr_[a-z_]+", expr)}


def test_grafana_dashboard_queries_only_metrics_we_export() -> None:
    with System.open("dash") as system:
        telemetry = system.enable_telemetry(interval=None)
        dev = system.spawn_device(mock=True, backend_options={"capacity": 1 << 12})
        buf = dev.allocate_f64(4)
        dev.free(buf)
        with pytest.raises(OutOfMemory):  # feeds the out-of-memory counter
            dev.allocate_f64(1 << 12)
        telemetry.refresh()
        exported = {s.name for family in
                    prometheus_parser.text_string_to_metric_families(telemetry.render())
                    for s in family.samples}
    # the NVML gauges exist once a GPU sample arrives: take their names from the source
    source = (ROOT / "src" / "atomr_accel" / "telemetry" / "_telemetry.py").read_text()
    gpu = {node.value for node in ast.walk(ast.parse(source))
           if isinstance(node, ast.Constant) and isinstance(node.value, str)
           and node.value.startswith("atomr_gpu_")}
    used = grafana_metric_names()
    assert used - exported - gpu == set()
    assert {"atomr_ops_total", "atomr_op_latency_seconds_bucket",
            "atomr_device_generation"} <= used


def test_the_functions_section_shows_residents_and_device_functions() -> None:
    with System.open("dash") as system:
        dev = system.spawn_device(mock=True, name="a")
        system.spawn_device(mock=True, name="b")
        port = system.serve_dashboard()
        scale = dev.resident(lambda: 3.0, name="scale")
        triple = dev.function(lambda s, x: s * x, name="triple")
        assert triple(scale, 2.0) == 6.0
        rows = {row["name"]: row["sections"] for row in state_of(port)["devices"]}
        assert rows["b"] == {}
        figures = rows["a"]["functions"]
        assert figures["resident scale"].startswith("built on generation 1 · 1 builds")
        assert figures["function triple"].startswith("1 calls · 0 failed · p50 ")
