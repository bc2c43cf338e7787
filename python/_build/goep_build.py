"""The build backend of the goep Python package (PEP 517), standard library only.

pip runs it from python/pyproject.toml (backend-path), so that

    /usr/bin/python3 -m venv --system-site-packages .venv && .venv/bin/pip install ./python

needs nothing that is not installed already: no setuptools or wheel to download into pip's
isolated build environment (``requires = []``). The wheel holds the package's Python files and
the C library it loads through ctypes, built here by ``go build -buildmode=c-shared ./capi`` in
the checkout (Go and Open MPI's headers needed), with the flags ``make capi`` uses. With
GOEP_EP_LIB set to a built library (an absolute path) that one is put in the wheel instead.

``pip install -e ./python`` (an editable install) puts a .pth file naming python/ in the
environment: the package is then imported from the checkout and loads the checkout's
bin/capi/libgoep_ep.so (``make capi``).
"""

import base64
import hashlib
import io
import os
import re
import shutil
import subprocess
import sysconfig
import tarfile
import tempfile
import zipfile
from pathlib import Path

NAME = "goep"
SUMMARY = "goep.ep: expert-parallel dispatch and combine over MPI, shaped like NCCL EP's nccl.ep"
REQUIRES_PYTHON = ">=3.9"
REQUIRES = ["numpy", "mpi4py"]
LIB = "libgoep_ep.so"
# The go build of make capi's shared library (Makefile, target capi).
GO_BUILD = ["build", "-tags", "mpi", "-buildmode=c-shared", "-ldflags=-extldflags=-Wl,-soname," + LIB]

SRC = Path(__file__).resolve().parents[1]  # python/: the package's source tree
ROOT = SRC.parent  # the goep checkout, whose capi/ the library is built from
# Entries get this time, so that the same sources give the same wheel (zip cannot go before 1980).
EPOCH = (1980, 1, 1, 0, 0, 0)


def _version():
    """The library's version from capi/goep_ep.h, or from PKG-INFO in an unpacked sdist."""
    header = ROOT / "capi" / "goep_ep.h"
    if header.is_file():
        text = header.read_text()
        parts = [re.search(rf"#define GOEP_EP_{p} (\d+)", text) for p in ("MAJOR", "MINOR", "PATCH")]
        if all(parts):
            return ".".join(m.group(1) for m in parts)
    pkg_info = SRC / "PKG-INFO"
    if pkg_info.is_file():
        m = re.search(r"^Version: (\S+)$", pkg_info.read_text(), re.M)
        if m:
            return m.group(1)
    raise RuntimeError(f"goep_build: no version: neither {header} nor {pkg_info} names one")


def _metadata(version):
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {NAME}",
        f"Version: {version}",
        f"Summary: {SUMMARY}",
        f"Requires-Python: {REQUIRES_PYTHON}",
    ]
    lines += [f"Requires-Dist: {r}" for r in REQUIRES]
    return "\n".join(lines) + "\n"


def _tag():
    # The library is native code for this platform, loaded by ctypes: no CPython ABI is involved.
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"py3-none-{platform}"


def _wheel_file(tag, purelib):
    return (
        "Wheel-Version: 1.0\n"
        "Generator: goep_build\n"
        f"Root-Is-Purelib: {'true' if purelib else 'false'}\n"
        f"Tag: {tag}\n"
    )


def _dist_info(version):
    return f"{NAME}-{version}.dist-info"


class _Wheel:
    """A wheel being written: each entry is hashed for RECORD as it is added."""

    def __init__(self, path):
        self.zip = zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED)
        self.record = []

    def add(self, name, data, mode=0o644):
        info = zipfile.ZipInfo(name, EPOCH)
        info.external_attr = (0o100000 | mode) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        self.zip.writestr(info, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        self.record.append(f"{name},sha256={digest},{len(data)}")

    def close(self, dist_info):
        record = f"{dist_info}/RECORD"
        self.record.append(f"{record},,")
        info = zipfile.ZipInfo(record, EPOCH)
        info.external_attr = (0o100644) << 16
        self.zip.writestr(info, "\n".join(self.record) + "\n")
        self.zip.close()


def _package_files():
    """The package's Python files, as (name in the wheel, path)."""
    files = []
    for path in sorted((SRC / NAME).rglob("*.py")):
        files.append((path.relative_to(SRC).as_posix(), path))
    return files


def _build_library(out):
    """The C library at out: GOEP_EP_LIB's copied, or go build's."""
    prebuilt = os.environ.get("GOEP_EP_LIB")
    if prebuilt:
        shutil.copyfile(prebuilt, out)
        return
    if not (ROOT / "capi" / "goep_ep.h").is_file():
        raise RuntimeError(f"goep_build: build from a goep checkout (no capi/ in {ROOT}), or set GOEP_EP_LIB")
    go = os.environ.get("GO") or shutil.which("go") or "/usr/local/go/bin/go"
    if not Path(go).is_file():
        raise RuntimeError(f"goep_build: no Go at {go}: put go on PATH, set GO to it, or set GOEP_EP_LIB")
    subprocess.check_call([go, *GO_BUILD, "-o", str(out), "./capi"], cwd=ROOT)


def _write_dist_info(wheel, version, tag, purelib):
    dist_info = _dist_info(version)
    wheel.add(f"{dist_info}/METADATA", _metadata(version).encode())
    wheel.add(f"{dist_info}/WHEEL", _wheel_file(tag, purelib).encode())
    wheel.add(f"{dist_info}/top_level.txt", f"{NAME}\n".encode())
    return dist_info


# PEP 517 hooks.


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    version = _version()
    dist_info = Path(metadata_directory) / _dist_info(version)
    dist_info.mkdir(parents=True, exist_ok=True)
    (dist_info / "METADATA").write_text(_metadata(version))
    (dist_info / "WHEEL").write_text(_wheel_file(_tag(), purelib=False))
    (dist_info / "top_level.txt").write_text(f"{NAME}\n")
    return dist_info.name


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    version, tag = _version(), _tag()
    name = f"{NAME}-{version}-{tag}.whl"
    with tempfile.TemporaryDirectory(prefix="goep-build-") as tmp:
        lib = Path(tmp) / LIB
        _build_library(lib)
        wheel = _Wheel(Path(wheel_directory) / name)
        for arcname, path in _package_files():
            wheel.add(arcname, path.read_bytes())
        wheel.add(f"{NAME}/ep/{LIB}", lib.read_bytes(), mode=0o755)
        wheel.close(_write_dist_info(wheel, version, tag, purelib=False))
    return name


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    version, tag = _version(), _tag()
    name = f"{NAME}-{version}-{tag}.whl"
    wheel = _Wheel(Path(wheel_directory) / name)
    wheel.add(f"__editable__.{NAME}.pth", f"{SRC}\n".encode())
    wheel.close(_write_dist_info(wheel, version, tag, purelib=False))
    return name


def build_sdist(sdist_directory, config_settings=None):
    """The Python sources with PKG-INFO. A wheel built from it needs GOEP_EP_LIB: the library's
    Go sources are the checkout's, outside python/."""
    version = _version()
    base = f"{NAME}-{version}"
    name = f"{base}.tar.gz"
    members = [(p.relative_to(SRC).as_posix(), p) for p in [SRC / "pyproject.toml", SRC / "_build" / "goep_build.py"]]
    members += _package_files()
    with tarfile.open(Path(sdist_directory) / name, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for arcname, path in members:
            tar.add(path, f"{base}/{arcname}", recursive=False)
        pkg_info = _metadata(version).encode()
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        info.size, info.mode = len(pkg_info), 0o644
        tar.addfile(info, io.BytesIO(pkg_info))
    return name
