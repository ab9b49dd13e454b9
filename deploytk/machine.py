"""The machine a number was measured on, described in one place for every report (profile, validate, eval, the benchmarks).

py-cpuinfo reads the CPU's name and instruction-set features the same way on Linux, macOS and Windows (and
without parsing /proc/cpuinfo by hand); it is asked once per process.
"""

from __future__ import annotations

import functools
import os
import platform

#: the instruction-set features that decide CPU inference speed (VNNI: int8; BF16/AMX: bf16; AVX512-FP16: fp16)
ISA_FEATURES = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_int8", "asimd", "sve")


@functools.cache
def host() -> dict:
    """CPU name, architecture, logical CPUs (all, and usable by this process), the ISA features of ISA_FEATURES present,
    and the CPU's family and model numbers: a cloud "AMD EPYC" can be a Zen 4 (family 25) or a Zen 5 (family 26), whose
    512-bit datapaths make the same dense GEMMs about twice as fast, so a timing without them is not comparable."""
    try:
        import cpuinfo

        info = cpuinfo.get_cpu_info()
    except Exception:  # noqa: BLE001 (a description must not fail a measurement)
        info = {}
    flags = set(info.get("flags", []))
    return {
        "cpu": info.get("brand_raw") or platform.processor() or platform.machine(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "isa": [f for f in ISA_FEATURES if f in flags],
        "cpu_family": info.get("family"),
        "cpu_model": info.get("model"),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
