"""`make device-kit`: the wheels the GPU machine's image lacks, and deploytk's own wheel, in device-kit/.

The GPU machine the project is lent now and then (CONTRIBUTING.md, "The GPU check") runs CPython 3.12 on
manylinux x86_64 and has no network. This downloads the distributions pinned in scripts/device_kit.txt for that
interpreter (binary wheels only; the ones marked ``# sdist`` are built here with ``pip wheel`` and must come out
pure Python), builds deploytk's wheel from this working tree (deploytk, deploytk_plugins and deploytk_serving, templates included) and
prints the kit's size next to what the device tool carries with it (the working tree; 64 MiB in all).

    .venv/bin/python scripts/device_kit.py [--output device-kit]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PINS = ROOT / "scripts" / "device_kit.txt"
IMAGE_PACKAGES = ROOT / "scripts" / "device_image_packages.txt"
#: the GPU machine's interpreter: pip's --python-version / --implementation / --platform for the binary wheels
PYTHON_VERSION, IMPLEMENTATION = "3.12", "cp"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
#: the GPU machine's environment markers (PEP 508), for the requirements of what it runs
IMAGE_MARKERS = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "os_name": "posix",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "extra": "",
}
#: what the device tool carries in one call: the working tree (tracked and untracked-not-ignored files) + carried paths
TRAVEL_LIMIT_MIB = 64
#: the project's own files that its wheel is built from
PROJECT_FILES = ("deploytk", "plugins", "serving", "setup.py", "pyproject.toml", "README.md")


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path | None = None) -> list[tuple[str, str, bool]]:
    """(name, version, built from an sdist) per ``NAME==VERSION`` line of scripts/device_kit.txt; comments (#) and blank
    lines skipped."""
    path, pins = path or PINS, []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        spec, _, comment = line.partition("#")
        if not spec.strip():
            continue
        name, sep, version = (part.strip() for part in spec.partition("=="))
        if not (sep and name and version) or any(c in version for c in "<>=!~,; "):
            raise SystemExit(f"error: {path}:{number}: {line.strip()!r} is not NAME==VERSION")
        pins.append((name, version, comment.strip() == "sdist"))
    return pins


def read_image_packages(path: Path | None = None) -> set[str]:
    """The distributions the GPU machine's image already has (normalized names)."""
    path = path or IMAGE_PACKAGES
    return {normalize(line) for line in (raw.strip() for raw in path.read_text().splitlines()) if line and not line.startswith("#")}


def wheel_tags(filename: str) -> tuple[str, str, str, str]:
    """(normalized name, version, python tag, abi.platform tags) of a wheel file name."""
    parts = filename[: -len(".whl")].split("-")
    name, version, python, abi, platform = parts[0], parts[1], parts[-3], parts[-2], parts[-1]
    return normalize(name), version, python, f"{abi}-{platform}"


def pip(*args: str, what: str) -> None:
    """Run pip; on failure stop with its last lines and what was being done."""
    done = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-12:])
        raise SystemExit(f"error: {what} failed (pip exit {done.returncode}):\n{tail}")


def fetch(name: str, version: str, sdist: bool, into: Path) -> Path:
    """One pinned distribution as a wheel for the GPU machine, in ``into``."""
    before = set(into.glob("*.whl"))
    pin = f"{name}=={version}"
    common = ("--disable-pip-version-check", "--no-deps", "-q")
    if sdist:
        pip(
            "wheel",
            *common,
            "--no-build-isolation",
            "--no-binary",
            name,
            "-w",
            str(into),
            pin,
            what=f"building a wheel of {pin} from its sdist",
        )
    else:
        platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
        pip(
            "download",
            *common,
            "--only-binary=:all:",
            "--python-version",
            PYTHON_VERSION,
            "--implementation",
            IMPLEMENTATION,
            *platforms,
            "-d",
            str(into),
            pin,
            what=f"downloading {pin} for CPython {PYTHON_VERSION} manylinux x86_64 (network? the pin in {PINS.name}?)",
        )
    new = sorted(set(into.glob("*.whl")) - before)
    if len(new) != 1:
        raise SystemExit(f"error: pip gave {len(new)} new wheels for {pin}, not one: {', '.join(p.name for p in new)}")
    wheel = new[0]
    got, got_version, python, abi_platform = wheel_tags(wheel.name)
    if got != normalize(name) or got_version != version:
        raise SystemExit(f"error: asked for {pin}, got {wheel.name}")
    if sdist and not (python in ("py3", "py2.py3") and abi_platform == "none-any"):
        raise SystemExit(f"error: {wheel.name} built here is not pure Python; it cannot run on the GPU machine: find a wheel for it")
    return wheel


def check_pins_fit(wheels: list[Path], pins: list[tuple[str, str, bool]]) -> None:
    """Each kit wheel's requirements on other kit distributions hold for the pinned versions (one version each installs)."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement

    environment = {**default_environment(), **IMAGE_MARKERS}
    pinned = {normalize(name): version for name, version, _ in pins}
    unmet = []
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1]
            lines = zf.read(meta).decode().splitlines()
        for line in lines:
            if not line.startswith("Requires-Dist:"):
                continue
            req = Requirement(line.removeprefix("Requires-Dist:").strip())
            if req.marker is not None and not req.marker.evaluate(environment):
                continue
            have = pinned.get(normalize(req.name))
            if have is not None and not req.specifier.contains(have, prereleases=True):
                unmet.append(f"{wheel.name} needs {req}, {PINS.name} pins {req.name}=={have}")
    if unmet:
        raise SystemExit("error: the pins do not fit together:\n  " + "\n  ".join(unmet))


def build_project_wheel(into: Path) -> Path:
    """deploytk's wheel from a copy of the working tree (no build/ or egg-info written into the checkout), checked."""
    with tempfile.TemporaryDirectory(prefix="deploytk-wheel-") as tmp:
        source = Path(tmp) / "src"
        source.mkdir()
        for name in PROJECT_FILES:
            path = ROOT / name
            if path.is_dir():
                shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy2(path, source / name)
        pip(
            "wheel",
            "--disable-pip-version-check",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            tmp,
            str(source),
            what="building deploytk's wheel",
        )
        (built,) = Path(tmp).glob("deploytk-*.whl")
        wheel = into / built.name
        shutil.move(built, wheel)
    with zipfile.ZipFile(wheel) as zf:
        inside = set(zf.namelist())
    wanted = {
        f"deploytk/{p.relative_to(ROOT / 'deploytk').as_posix()}" for p in (ROOT / "deploytk").rglob("*.py") if "__pycache__" not in p.parts
    }
    wanted |= {f"deploytk_plugins/{p.relative_to(ROOT / 'plugins').as_posix()}" for p in (ROOT / "plugins").rglob("*.py")}
    wanted |= {f"deploytk/templates/{p.name}" for p in (ROOT / "deploytk" / "templates").glob("*.md")}
    missing = sorted(wanted - inside)
    if missing or not any(p.startswith("deploytk_plugins/") for p in inside):
        raise SystemExit(f"error: {wheel.name} lacks {len(missing)} of the tree's files: {', '.join(missing[:8])}")
    return wheel


def travelling_tree_bytes() -> int | None:
    """Bytes of what the device tool sends besides carried paths: tracked and untracked-not-ignored files (None without git)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    paths = (ROOT / p for p in listed.decode().split("\0") if p)
    return sum(p.stat().st_size for p in paths if p.is_file() and not p.is_symlink())


def main(argv=None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=ROOT / "device-kit", help="the kit folder (replaced)")
    args = parser.parse_args(argv)
    pins = read_pins()
    image = read_image_packages()
    carried = sorted(name for name, _, _ in pins if normalize(name) in image)
    if carried:
        raise SystemExit(f"error: {PINS.name} lists packages the image already has ({', '.join(carried)}): two versions stop the install")
    output = args.output.resolve()
    staging = output.with_name(output.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    wheels = []
    try:
        for name, version, sdist in pins:
            wheels.append(fetch(name, version, sdist, staging))
            print(f"  {wheels[-1].name:78s} {wheels[-1].stat().st_size / 2**20:6.2f} MiB{'  (built here from its sdist)' if sdist else ''}")
        check_pins_fit(wheels, pins)
        wheel = build_project_wheel(staging)
        print(f"  {wheel.name:78s} {wheel.stat().st_size / 2**20:6.2f} MiB  (this tree)")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)  # an earlier complete kit stays as it was
        raise
    shutil.rmtree(output, ignore_errors=True)
    staging.rename(output)
    kit = sum(p.stat().st_size for p in output.iterdir()) / 2**20
    tree = travelling_tree_bytes()
    print(f"{output.name}/: {len(pins) + 1} wheels, {kit:.1f} MiB", end="")
    if tree is None:
        print()
        return output
    total = kit + tree / 2**20
    print(f"; with the working tree that travels ({tree / 2**20:.1f} MiB): {total:.1f} MiB of the device tool's {TRAVEL_LIMIT_MIB} MiB")
    if total > TRAVEL_LIMIT_MIB:
        raise SystemExit(
            f"error: the kit and the working tree are {total:.1f} MiB, over the {TRAVEL_LIMIT_MIB} MiB the device tool carries"
        )
    return output


if __name__ == "__main__":
    main()
