"""deploytk.machine.host: what every timing records about the CPU it ran on."""

import re
from pathlib import Path

import pytest

from deploytk.machine import host


def test_host_records_the_cpu_generation_next_to_its_isa():
    """Two "AMD EPYC" hosts of this workplace differ twofold in dense GEMM speed (Zen 4 and Zen 5): a result file must
    say which one it ran on. The family and model are /proc/cpuinfo's, read here independently."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        pytest.skip("no /proc/cpuinfo on this system")
    text = cpuinfo.read_text()
    family, model = (re.search(rf"^{key}\s*:\s*(\d+)$", text, re.M) for key in ("cpu family", "model"))
    if family is None or model is None:
        pytest.skip("/proc/cpuinfo names no cpu family and model (not an x86 CPU)")
    info = host()
    assert (info["cpu_family"], info["cpu_model"]) == (int(family.group(1)), int(model.group(1)))
    assert info["cpus_usable"] >= 1 and all(isinstance(f, str) for f in info["isa"])
