"""Accelerator sampling: each vendor tool's output parsed, and a fake tool on PATH read end to end."""

from __future__ import annotations

import json
import os
import stat
import time

import pytest

from vkit.measure import accel, fingerprint

pytestmark = pytest.mark.e2e

NPU_910B = """\
+------------------------------------------------------------------------------------------------+
| npu-smi 23.0.rc3                 Version: 23.0.rc3                                             |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B3               | OK            | 96.1        36                0    / 0             |
| 0                         | 0000:C1:00.0  | 87          0    / 0          58213/ 65536         |
+===========================+===============+====================================================+
| 1     910B3               | OK            | 91.2        35                0    / 0             |
| 0                         | 0000:01:00.0  | 0           0    / 0          3393 / 65536         |
+===========================+===============+====================================================+
+---------------------------+---------------+----------------------------------------------------+
| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |
+===========================+===============+====================================================+
| 0       0                 | 412345        | python3                  | 54871                   |
+===========================+===============+====================================================+
"""

# A card without HBM (Atlas 300I): the on-card memory is the accelerator's memory.
NPU_310P = """\
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)                       |
+===========================+===============+====================================================+
| 8     310P3               | OK            | NA          48                0    / 0             |
| 0                         | 0000:82:00.0  | 12          9021 / 44280                           |
+===========================+===============+====================================================+
"""

ROCM = json.dumps({
    "card0": {"GPU use (%)": "93", "VRAM Total Memory (B)": "206141652992", "VRAM Total Used Memory (B)": "185527487488"},
    "card1": {"GPU use (%)": "0", "VRAM Total Memory (B)": "206141652992", "VRAM Total Used Memory (B)": "10993664"},
    "system": {"Driver version": "6.7.0"},
})

NVIDIA = "0, 98, 131072, 143771\n1, 0, 1, 143771\n"


def test_npu_smi_table_gives_aicore_and_hbm_per_chip():
    rows = accel.parse_npu(NPU_910B)
    assert [(r["npu"], r["chip"], r["name"], r["util_pct"], r["mem_used_mib"], r["mem_total_mib"]) for r in rows] == [
        (0, 0, "910B3", 87.0, 58213.0, 65536.0), (1, 0, "910B3", 0.0, 3393.0, 65536.0)]


def test_npu_smi_without_hbm_uses_card_memory():
    (r,) = accel.parse_npu(NPU_310P)
    assert (r["npu"], r["util_pct"], r["mem_used_mib"], r["mem_total_mib"]) == (8, 12.0, 9021.0, 44280.0)


def test_rocm_smi_json_in_mib_and_non_cards_ignored():
    rows = accel.parse_rocm(ROCM)
    assert [r["index"] for r in rows] == [0, 1]
    assert rows[0]["util_pct"] == 93.0
    assert rows[0]["mem_used_mib"] == pytest.approx(185527487488 / 2**20)
    assert rows[1]["mem_total_mib"] == pytest.approx(196592.0, abs=1)


def test_nvidia_csv():
    rows = accel.parse_nvidia(NVIDIA)
    assert [(r["index"], r["util_pct"], r["mem_used_mib"]) for r in rows] == [(0, 98.0, 131072.0), (1, 0.0, 1.0)]


def test_nvidia_csv_from_a_real_h200():
    # saved on an NVIDIA H200 (driver 580.159.04) by bench/gpu_steps.py: idle, 4 MiB of 143771 used
    here = os.path.join(os.path.dirname(__file__), "fixtures", "accel", "nvidia-h200")
    rows = accel.parse_nvidia(open(os.path.join(here, "nvidia-smi-query-accel.csv")).read())
    assert rows == [{"index": 0, "util_pct": 0.0, "mem_used_mib": 4.0, "mem_total_mib": 143771.0}]
    # a query naming a field this driver lacks prints a sentence, not rows: it gives none
    assert accel.parse_nvidia(open(os.path.join(here, "nvidia-smi-query-power.csv")).read()) == []


@pytest.mark.parametrize("parse", [accel.parse_npu, accel.parse_rocm, accel.parse_nvidia])
def test_unparsable_output_gives_no_rows_not_numbers(parse):
    assert parse("command not supported on this platform\n") == []
    assert parse("") == []


def wait_for(cond, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "the sampler took no sample"
        time.sleep(0.01)


def fake_tool(tmp_path, monkeypatch, name: str, output: str, code: int = 0) -> None:
    d = tmp_path / "fakebin"
    d.mkdir(exist_ok=True)
    (d / (name + ".out")).write_text(output)
    p = d / name
    p.write_text(f"#!/bin/sh\ncat '{d / (name + '.out')}'\nexit {code}\n")
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    # Only the fake: hide any real vendor tool of this machine.
    monkeypatch.setenv("PATH", f"{d}{os.pathsep}/usr/bin{os.pathsep}/bin")


def test_sampler_reads_a_fake_npu_smi(tmp_path, monkeypatch):
    fake_tool(tmp_path, monkeypatch, "npu-smi", NPU_910B)
    s = accel.Sampler(interval=0.05)
    assert s.tool == "npu-smi"
    s.start()
    wait_for(lambda: s.samples)
    out = s.stop()
    assert out["available"] and out["devices"] == 2
    assert out["util_pct_max"] == 87.0 and out["mem_used_mib_max"] == 58213.0


def test_sampler_says_why_when_the_tool_output_does_not_parse(tmp_path, monkeypatch):
    fake_tool(tmp_path, monkeypatch, "rocm-smi", "ERROR: no device\n", code=0)
    s = accel.Sampler(interval=0.05)
    s.start()
    wait_for(lambda: s.failed)
    out = s.stop()
    assert out["available"] is False and out["tool"] == "rocm-smi" and "parsed" in out["why"]


def test_fingerprint_names_the_npu_model_and_count(tmp_path, monkeypatch):
    fake_tool(tmp_path, monkeypatch, "npu-smi", NPU_910B)
    a = fingerprint.accelerators()
    assert (a["kind"], a["model"], a["count"], a["memory_mib"]) == ("ascend", "910B3", 2, 65536)


H200 = os.path.join(os.path.dirname(__file__), "fixtures", "accel", "nvidia-h200")


def test_nvidia_csv_with_power_draw():
    rows = accel.parse_nvidia("0, 98, 131072, 143771, 612.34\n1, 0, 1, 143771, [N/A]\n")
    assert [(r["index"], r["util_pct"], r["power_w"]) for r in rows] == [(0, 98.0, 612.34), (1, 0.0, None)]
    for na in ("N/A", "[Not Supported]"):
        (r,) = accel.parse_nvidia(f"0, 5, 10, 20, {na}\n")
        assert r["power_w"] is None and r["mem_total_mib"] == 20.0
    assert "power.draw" in accel.NVIDIA_ARGV[1]


def test_npu_smi_power_is_the_npus():
    rows = accel.parse_npu(NPU_910B)
    assert [(r["npu"], r["power_w"]) for r in rows] == [(0, 96.1), (1, 91.2)]
    assert accel.device_power(rows) == [96.1, 91.2]
    (r,) = accel.parse_npu(NPU_310P)
    assert r["power_w"] is None


def test_npu_chips_of_one_npu_count_its_power_once():
    rows = [{"index": 0, "npu": 3, "power_w": 70.0}, {"index": 1, "npu": 3, "power_w": 70.0},
            {"index": 2, "npu": 4, "power_w": 65.0}]
    assert accel.device_power(rows) == [70.0, 65.0]


@pytest.mark.parametrize("key,value", [("Average Graphics Package Power (W)", "91.0"),
                                       ("Current Socket Graphics Package Power (W)", "140.0")])
def test_rocm_smi_package_power(key, value):
    doc = json.loads(ROCM)
    doc["card0"][key] = value
    rows = accel.parse_rocm(json.dumps(doc))
    assert rows[0]["power_w"] == float(value) and rows[1]["power_w"] is None
    assert "--showpower" in accel.ROCM_ARGV


def test_energy_counter_in_joules_from_a_fake_nvidia_smi(tmp_path, monkeypatch):
    fake_tool(tmp_path, monkeypatch, "nvidia-smi", "0, 123456789\n1, 1000\n")
    got, why = accel.read_energy_counter("nvidia-smi")
    assert why is None and got == pytest.approx({0: 123456.789, 1: 1.0})


def test_energy_counter_absent_on_the_h200_driver(tmp_path, monkeypatch):
    sentence = open(os.path.join(H200, "nvidia-smi-query-power.csv")).read()
    assert accel.parse_energy(sentence) == (None, "this driver has no total_energy_consumption field")
    fake_tool(tmp_path, monkeypatch, "nvidia-smi", sentence, code=2)
    got, why = accel.read_energy_counter("nvidia-smi")
    assert got is None and why == "this driver has no total_energy_consumption field"
    got, why = accel.read_energy_counter("npu-smi")
    assert got is None and "not an nvidia-smi" in why
    got, why = accel.parse_energy("garbage out\n")
    assert got is None and "did not parse" in why


def h200_trace() -> list[tuple[float, list[float | None]]]:
    """The saved 100-ms power trace of an H200 as (seconds from its first line, [W])."""
    out = []
    lines = open(os.path.join(H200, "nvidia-smi-lms100.csv")).read().splitlines()
    assert lines[0].startswith("timestamp, power.draw [W]")
    for line in lines[1:]:
        if not line.strip():
            continue
        ts, w = [p.strip() for p in line.split(",")][:2]
        hms = ts.split()[1]
        h, m, s = hms.split(":")
        out.append((int(h) * 3600 + int(m) * 60 + float(s), [float(w)]))
    t0 = out[0][0]
    return [(t - t0, p) for t, p in out]


def test_power_block_on_the_real_h200_trace():
    tr = h200_trace()
    b = accel.power_block(tr, 0.1, None, None, "this driver has no total_energy_consumption field")
    ts, ws = [t for t, _ in tr], [p[0] for _, p in tr]
    trapz = sum((ts[i + 1] - ts[i]) * (ws[i] + ws[i + 1]) / 2 for i in range(len(ts) - 1))
    assert b["available"] and b["samples"] == len(tr) == 309 and b["devices"] == 1
    assert b["sampled_j"] == pytest.approx(trapz, rel=1e-12)
    assert b["covered_s"] == pytest.approx(ts[-1] - ts[0])
    assert b["mean_w"] == pytest.approx(trapz / (ts[-1] - ts[0]))
    assert b["min_w"] == min(ws) and 77 <= b["min_w"] < 78
    assert b["max_w"] == max(ws) and 650 < b["max_w"] < 720
    assert b["min_w"] < b["mean_w"] < b["max_w"]
    assert b["counter_j"] is None and b["counter_why"] == "this driver has no total_energy_consumption field"


def test_power_block_reports_a_backwards_counter_as_read():
    tr = [(0.0, [100.0, 50.0]), (1.0, [110.0, 60.0]), (2.0, [100.0, 50.0])]
    b = accel.power_block(tr, 1.0, {0: 500.0, 1: 400.0}, {0: 300.0, 1: 450.0}, None, counter_s=2.1)
    assert b["counter_j"] == -150.0 and b["counter_why"] is None and b["counter_s"] == 2.1
    assert b["sampled_j"] == pytest.approx(320.0) and b["mean_w"] == pytest.approx(160.0)
    assert (b["min_w"], b["max_w"], b["devices"]) == (150.0, 170.0, 2)


def test_power_block_needs_two_powered_samples():
    b = accel.power_block([(0.0, [100.0]), (1.0, [None]), (2.0, [None])], 1.0, None, None, "x")
    assert b["available"] is False and "only 1 of 3" in b["why"]
    b = accel.power_block([(0.0, [None]), (1.0, [None])], 1.0, None, None, "x", tool="nvidia-smi")
    assert b["available"] is False and b["why"].startswith("nvidia-smi") and "[N/A]" in b["why"]
    assert accel.power_block([], 1.0, None, None, "x")["available"] is False


def test_sampler_with_a_fake_nvidia_smi_reads_power_and_the_counter(tmp_path, monkeypatch):
    d = tmp_path / "fakebin"
    d.mkdir()
    count = d / "count"
    count.write_text("0\n")
    p = d / "nvidia-smi"
    p.write_text("#!/bin/sh\n"
                 "case \"$*\" in\n"
                 f"  *total_energy_consumption*) n=$(cat '{count}'); echo $((n + 1)) > '{count}'; "
                 "echo \"0, $((n * 2500))\" ;;\n"
                 "  *) echo '0, 50, 1000, 143771, 250.5' ;;\n"
                 "esac\n")
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{d}{os.pathsep}/usr/bin{os.pathsep}/bin")
    s = accel.Sampler(interval=0.02)
    assert s.tool == "nvidia-smi" and s.interval == 0.02
    s.start()
    wait_for(lambda: len(s.samples) >= 2)
    out = s.stop()
    assert out["available"] and out["util_pct_max"] == 50.0
    pw = out["power"]
    assert pw["available"] and pw["devices"] == 1 and pw["samples"] >= 3 and pw["interval_s"] == 0.02
    assert pw["min_w"] == pw["max_w"] == 250.5 and pw["mean_w"] == pytest.approx(250.5)
    assert pw["sampled_j"] == pytest.approx(250.5 * pw["covered_s"])
    assert pw["counter_j"] == 2.5 and pw["counter_why"] is None
    assert pw["counter_s"] >= pw["covered_s"] > 0  # the counter is read before the first sample and after the last


def test_sampler_without_power_says_why(tmp_path, monkeypatch):
    fake_tool(tmp_path, monkeypatch, "nvidia-smi", NVIDIA)
    s = accel.Sampler(interval=0.02)
    s.start()
    wait_for(lambda: len(s.samples) >= 2)
    out = s.stop()
    assert out["available"] and out["power"]["available"] is False and "power" in out["power"]["why"]
    assert accel.Sampler().interval == 1.0
