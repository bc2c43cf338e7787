#!/usr/bin/env bash
# install-deps.sh: install what goep needs to build and test, only if missing.
#
#   scripts/install-deps.sh [--slurm] [--nvrtc] [--cluster] [--python] [--python-test] [--check]
#
# Base set: Open MPI (mpirun, headers, pkg-config "ompi"), HDF5 (headers,
# pkg-config "hdf5", h5dump/h5ls), pkg-config. --slurm adds Slurm and munge
# for the one-machine test cluster; --nvrtc adds NVIDIA's NVRTC library from
# Debian's non-free component (it compiles the CUDA kernels to PTX; no GPU
# needed); --cluster adds iproute2, util-linux and ping for the emulated cluster
# (scripts/cluster); --python adds what the Python interface needs with Debian's python3
# (/usr/bin/python3): numpy, mpi4py, venv and pip (make capi); --python-test adds pytest and
# PyTorch (CPU), which its tests use (make test-capi passes it torch tensors; a large download).
# --check only reports what is missing.
#
# On Debian/Ubuntu as root, missing packages are installed with apt-get. Elsewhere
# (a cluster login node, say) nothing is installed: the script prints what to
# load instead (module load ...) and fails if something is missing.
# Idempotent: with everything present it only checks, in well under a second.
set -euo pipefail

groups=(base)
check_only=0
for a in "$@"; do
  case "$a" in
    --slurm) groups+=(slurm) ;;
    --nvrtc) groups+=(nvrtc) ;;
    --cluster) groups+=(cluster) ;;
    --python) groups+=(python) ;;
    --python-test) groups+=(python_test) ;;
    --check) check_only=1 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "install-deps.sh: unknown option $a" >&2; exit 2 ;;
  esac
done

pkgs_base=(openmpi-bin libopenmpi-dev libhdf5-dev hdf5-tools pkg-config)
pkgs_slurm=(slurmctld slurmd slurm-client munge)
pkgs_nvrtc=(libnvrtc11.2)
pkgs_cluster=(iproute2 util-linux iputils-ping)
pkgs_python=(python3-numpy python3-mpi4py python3-venv python3-pip)
pkgs_python_test=(python3-pytest python3-torch)
# What each group provides, checked on any system (commands or pkg-config names).
need_base() { command -v mpirun >/dev/null && pkg-config --exists ompi && pkg-config --exists hdf5 && command -v h5dump >/dev/null; }
need_slurm() { command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null && command -v sbatch >/dev/null; }
need_cluster() { command -v ip >/dev/null && command -v tc >/dev/null && command -v nsenter >/dev/null && command -v unshare >/dev/null && command -v ping >/dev/null; }
# grep reads the whole list (no -q): ldconfig's 64 KiB and more would otherwise die of SIGPIPE when grep
# stops at its match, and pipefail would read that as a missing library.
need_nvrtc() { ldconfig -p 2>/dev/null | grep 'libnvrtc\.so\.11\.2' >/dev/null; }
# A venv's pip comes from ensurepip (python3-venv), python3 -m pip from python3-pip; the package
# builds with the standard library alone (python/pyproject.toml).
need_python() { /usr/bin/python3 -c 'import numpy, mpi4py, venv, ensurepip, pip' 2>/dev/null; }
# torch is found, not imported: importing it takes seconds, and this check runs before every test-capi.
need_python_test() { /usr/bin/python3 -c 'import pytest, importlib.util as u, sys; sys.exit(u.find_spec("torch") is None)' 2>/dev/null; }
advice_base="module load openmpi hdf5   (any MPI with pkg-config 'ompi' and HDF5 >= 1.10 with pkg-config 'hdf5')"
advice_slurm="Slurm is the site's: submit with the site's sbatch/srun"
advice_cluster="the emulated cluster needs root and iproute2 (ip, tc), util-linux (nsenter, unshare) and ping"
advice_python="module load python (numpy, mpi4py built against this MPI, venv, pip); set PYTHON=that python3"
advice_python_test="module load python (pytest, torch: the Python interface's tests); set PYTHON=that python3"
advice_nvrtc="module load cuda   (NVRTC from the CUDA toolkit; set GOEP_NVRTC_LIB to its libnvrtc.so)"

missing=()
for g in "${groups[@]}"; do
  if ! "need_$g"; then missing+=("$g"); fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

if [ "$check_only" = 1 ] || [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "install-deps.sh: missing: ${missing[*]}" >&2
  for g in "${missing[@]}"; do
    v="advice_$g"; echo "  $g: ${!v}" >&2
  done
  [ "$check_only" = 1 ] || echo "  (installing needs root and apt-get; on a cluster, load the modules above)" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
for g in "${missing[@]}"; do
  if [ "$g" = nvrtc ] && ! grep -rqs 'non-free' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    # NVRTC lives in Debian's non-free component.
    . /etc/os-release
    cat > /etc/apt/sources.list.d/goep-non-free.sources <<SRC
Types: deb
URIs: http://deb.debian.org/debian
Suites: ${VERSION_CODENAME} ${VERSION_CODENAME}-updates
Components: contrib non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  fi
done
list=()
for g in "${missing[@]}"; do
  v="pkgs_$g[@]"; list+=("${!v}")
done
echo "install-deps.sh: installing ${list[*]}" >&2
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${list[@]}" >/dev/null
for g in "${missing[@]}"; do
  "need_$g" || { echo "install-deps.sh: $g still missing after apt-get install" >&2; exit 1; }
done
