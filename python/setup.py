"""goep.ep: the Python interface of goep (see docs/capi.md).

Install from a checkout, with no network beyond what is installed (Debian:
python3-numpy, python3-mpi4py, python3-setuptools, python3-wheel):

    python3 -m venv --system-site-packages .venv && .venv/bin/pip install ./python
    # or, into Debian's own python3:
    /usr/bin/python3 -m pip install --break-system-packages ./python

Building runs `go build -buildmode=c-shared ./capi` in the checkout (Go and
Open MPI's headers needed) and puts libgoep_ep.so inside the package; with
GOEP_EP_LIB set to a built library (an absolute path), that one is copied instead.
"""

import os
import shutil
import subprocess
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent  # the goep checkout
LIB = "libgoep_ep.so"


class BuildWithLibrary(build_py):
    """build_py, plus the C library the package loads."""

    def run(self):
        super().run()
        out = Path(self.build_lib).resolve() / "goep" / "ep" / LIB
        out.parent.mkdir(parents=True, exist_ok=True)
        prebuilt = os.environ.get("GOEP_EP_LIB")
        if prebuilt:
            shutil.copyfile(prebuilt, out)
            return
        if not (ROOT / "capi" / "goep_ep.h").is_file():
            raise SystemExit(f"goep.ep: build from a goep checkout (no capi/ in {ROOT}), or set GOEP_EP_LIB")
        go = os.environ.get("GO") or shutil.which("go") or "/usr/local/go/bin/go"
        subprocess.check_call([go, "build", "-tags", "mpi", "-buildmode=c-shared", "-o", str(out), "./capi"], cwd=ROOT)
        out.with_suffix(".h").unlink(missing_ok=True)  # cgo's export header: goep_ep.h is the API


class BinaryDistribution(Distribution):
    """The package holds a native library: its wheel is for this platform."""

    def has_ext_modules(self):
        return True


setup(
    name="goep",
    version="0.1.0",
    description="goep.ep: expert-parallel dispatch and combine over MPI, shaped like NCCL EP's nccl.ep",
    packages=["goep", "goep.core", "goep.ep"],
    package_data={"goep.ep": [LIB]},
    python_requires=">=3.9",
    install_requires=["numpy", "mpi4py"],
    cmdclass={"build_py": BuildWithLibrary},
    distclass=BinaryDistribution,
    zip_safe=False,
)
