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
