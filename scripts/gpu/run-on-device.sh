#!/usr/bin/env bash
# run-on-device.sh: run goep's GPU tests on a machine with an NVIDIA GPU and no Go.
#
#   scripts/gpu/run-on-device.sh [test-binary flags, e.g. -test.run 'GPUKernels|NCCL']
#
# Build on a machine with Go (no GPU needed):   make test-gpu
# That writes bin/gpu/gpu.test (package gpu's tests with -tags gpu, no MPI),
# bin/gpu/gpu-mpi.test (with -tags "gpu mpi"), bin/gpu/epgpu.test and
# epgpu-mpi.test (the ep conformance suite on the CUDA backend, ep/epgpu),
# bin/gpu/ep-bench (MPI) and ep-bench-1rank (no MPI), bin/gpu/moe-train (MPI)
# and moe-train-1rank (no MPI) with bin/gpu/lib/ (the HDF5 library moe-train
# writes its trace and checkpoints with, and its compression libraries), and a
# copy of this script.
# Carry bin/gpu/ to the GPU machine and run bin/gpu/run-on-device.sh there (or
# this script from a checkout that holds bin/gpu/).
#
# What the GPU machine needs:
#   gpu.test       only glibc >= 2.34 (it links nothing else: the CUDA driver,
#                  NVRTC and NCCL are opened with dlopen at run time), plus
#                  libcuda.so.1 (the driver), an NVRTC (libnvrtc.so.13/.12/.11.2:
#                  the CUDA toolkit's, or pip's nvidia-cuda-nvrtc) and NCCL
#                  (libnccl.so.2: pip's nvidia-nccl-cu13, say). Nothing to carry.
#   gpu-mpi.test   in addition Open MPI 4.1 (libmpi.so.40 and its libraries,
#                  and mpirun); optional: run only where mpirun exists.
#   epgpu*.test,   the same as gpu.test and gpu-mpi.test. ep-bench -device cuda
#   ep-bench*      runs after the tests: under mpirun where there is one, else
#                  ep-bench-1rank on one rank. GOEP_BENCH_ARGS replaces its
#                  configuration flags.
#   moe-train*     the main job: make run's training for GOEP_MOE_STEPS steps
#                  (default 300) on -device cuda, then on -device cpu (the
#                  reference, same machine), each under a limit of
#                  GOEP_MOE_TIMEOUT seconds (default 120); under mpirun where
#                  there is one, else moe-train-1rank. Where the machine lacks
#                  HDF5, bin/gpu/lib/ stands in (LD_LIBRARY_PATH); what HDF5
#                  links (libcurl, libcrypto, libz) must be there. GOEP_MOE_ARGS
#                  replaces the training flags.
# The MPI runs use GOEP_MPI_NP ranks (default 2): with one GPU, several ranks
# share it, which NCCL accepts from 2.30 on (NCCL_MULTI_RANK_GPU_ENABLE=1, set
# below); an older NCCL refuses with "Duplicate GPU detected", and the run
# fails saying so.
# The libraries are searched where the toolkit and pip put them; set
# GOEP_CUDA_LIB, GOEP_NVRTC_LIB, GOEP_NCCL_LIB (a path, or colon-separated
# candidates) to choose. An NVRTC newer than the driver makes PTX the driver
# cannot load (CUDA_ERROR_UNSUPPORTED_PTX_VERSION): point GOEP_NVRTC_LIB at one
# no newer than the driver's CUDA version, printed below.
#
# Exit status: 0 only if every run passed. A test never passes for want of a
# GPU: without one, or without a library, the gpu-tagged tests fail.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
bin=${GOEP_GPU_BIN:-}
if [ -z "$bin" ]; then
  for d in "$here" "$here/../../bin/gpu"; do
    if [ -x "$d/gpu.test" ]; then bin=$(cd "$d" && pwd); break; fi
  done
fi
if [ -z "$bin" ] || [ ! -x "$bin/gpu.test" ]; then
  echo "run-on-device.sh: no gpu.test next to this script or in bin/gpu: run 'make test-gpu' on a machine with Go, then carry bin/gpu/" >&2
  exit 2
fi

# pip's NVIDIA wheels: when a variable is unset, offer the libraries that
# python's site-packages hold as extra candidates after the usual ones.
site_libs() {
  command -v python3 >/dev/null || return 0
  python3 - "$1" <<'PY' 2>/dev/null || true
import glob, os, site, sys
roots = set(site.getsitepackages() + [site.getusersitepackages()])
try:
    import nvidia
    roots.update(os.path.dirname(p) for p in nvidia.__path__)
except Exception:
    pass
found = []
for r in sorted(roots):
    found += sorted(glob.glob(os.path.join(r, "nvidia", "*", "lib", sys.argv[1])), reverse=True)
print(":".join(found))
PY
}
if [ -z "${GOEP_NVRTC_LIB:-}" ]; then
  extra=$(site_libs 'libnvrtc.so*')
  [ -n "$extra" ] && export GOEP_NVRTC_LIB="libnvrtc.so.13:libnvrtc.so.12:libnvrtc.so.11.2:libnvrtc.so:/usr/local/cuda/lib64/libnvrtc.so*:$extra"
fi
if [ -z "${GOEP_NCCL_LIB:-}" ]; then
  extra=$(site_libs 'libnccl.so*')
  [ -n "$extra" ] && export GOEP_NCCL_LIB="libnccl.so.2:$extra"
fi

# NCCL before 2.30 refuses two ranks on one GPU; 2.30 accepts them with this.
export NCCL_MULTI_RANK_GPU_ENABLE=${NCCL_MULTI_RANK_GPU_ENABLE:-1}
# A missing NVRTC fails the PTX tests instead of skipping them.
export GOEP_REQUIRE_TOOLS=1

echo "== machine"
uname -srm
ldd --version 2>/dev/null | head -1
nvidia-smi --query-gpu=index,name,compute_cap,driver_version,memory.total --format=csv 2>/dev/null || echo "nvidia-smi: not available"
echo "GOEP_CUDA_LIB=${GOEP_CUDA_LIB:-}"
echo "GOEP_NVRTC_LIB=${GOEP_NVRTC_LIB:-}"
echo "GOEP_NCCL_LIB=${GOEP_NCCL_LIB:-}"
echo "NCCL_MULTI_RANK_GPU_ENABLE=$NCCL_MULTI_RANK_GPU_ENABLE"
echo "== shared libraries of gpu.test"
ldd "$bin/gpu.test" || true

status=0
echo "== gpu.test (one process: device, memory, streams, events, kernels, PTX, NCCL one rank and two ranks on one GPU)"
(cd "$bin" && ./gpu.test -test.v -test.count=1 -test.timeout=20m "$@") || status=1

echo "== gpu-mpi.test under mpirun (NCCL bootstrap over MPI, 2 ranks)"
if [ ! -x "$bin/gpu-mpi.test" ]; then
  echo "not built: skipped"
elif ! command -v mpirun >/dev/null; then
  echo "no mpirun on this machine: skipped (needs Open MPI 4.1; gpu.test covered NCCL with two ranks in one process)"
elif ldd "$bin/gpu-mpi.test" | grep -q 'not found'; then
  echo "gpu-mpi.test lacks shared libraries here: skipped"
  ldd "$bin/gpu-mpi.test" | grep 'not found'
else
  args=(--oversubscribe -np 2)
  [ "$(id -u)" = 0 ] && args+=(--allow-run-as-root)
  for v in NCCL_MULTI_RANK_GPU_ENABLE GOEP_REQUIRE_TOOLS GOEP_CUDA_LIB GOEP_NVRTC_LIB GOEP_NCCL_LIB; do
    [ -n "${!v:-}" ] && args+=(-x "$v")
  done
  (cd "$bin" && mpirun "${args[@]}" ./gpu-mpi.test -test.count=1 -test.timeout=10m \
    -test.run 'NCCL|Bootstrap|Agree|LocalRank' "$@") || status=1
fi

have_mpi() { # $1: a binary built with the mpi tag
  [ -x "$1" ] && command -v mpirun >/dev/null && ! ldd "$1" | grep -q 'not found'
}
mpi_args=(--oversubscribe -np "${GOEP_MPI_NP:-2}")
[ "$(id -u)" = 0 ] && mpi_args+=(--allow-run-as-root)
for v in NCCL_MULTI_RANK_GPU_ENABLE GOEP_REQUIRE_TOOLS GOEP_CUDA_LIB GOEP_NVRTC_LIB GOEP_NCCL_LIB; do
  [ -n "${!v:-}" ] && mpi_args+=(-x "$v")
done

echo "== epgpu.test (the ep conformance suite on the CUDA backend, one rank; and on the emulated device)"
if [ -x "$bin/epgpu.test" ]; then
  (cd "$bin" && ./epgpu.test -test.v -test.count=1 -test.timeout=20m) || status=1
else
  echo "not built: run make test-gpu"; status=1
fi

echo "== epgpu-mpi.test under mpirun (the conformance suite on ${GOEP_MPI_NP:-2} ranks: NCCL transfers, a stalled rank, the watchdog)"
if have_mpi "$bin/epgpu-mpi.test"; then
  (cd "$bin" && mpirun "${mpi_args[@]}" ./epgpu-mpi.test -test.count=1 -test.timeout=20m) || status=1
else
  echo "no mpirun, or epgpu-mpi.test lacks shared libraries here: skipped (epgpu.test covered one rank)"
fi

echo "== ep-bench -device cuda (results checked against the CPU engine; cuMemcpyDtoD of the same bytes as reference)"
bench_args=(${GOEP_BENCH_ARGS:--mode ll,ht -tokens 128 -hidden 7168 -topk 8 -experts 64 -dtype bf16 -iters 20})
if have_mpi "$bin/ep-bench"; then
  mpirun "${mpi_args[@]}" "$bin/ep-bench" -device cuda "${bench_args[@]}" || status=1
elif [ -x "$bin/ep-bench-1rank" ]; then
  "$bin/ep-bench-1rank" -device cuda "${bench_args[@]}" || status=1
else
  echo "not built: run make test-gpu"; status=1
fi

# with_libs BINARY: "" if BINARY finds its shared libraries here, else the LD_LIBRARY_PATH (bin/gpu/lib)
# with which it does; fails, naming them, if even that leaves some missing.
with_libs() {
  ldd "$1" 2>/dev/null | grep -q 'not found' || { echo ""; return 0; }
  if LD_LIBRARY_PATH="$bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$1" | grep -q 'not found'; then
    echo "$(basename "$1") lacks shared libraries, even with $bin/lib:" >&2
    LD_LIBRARY_PATH="$bin/lib" ldd "$1" | grep 'not found' >&2
    return 1
  fi
  echo "$bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

moe_steps=${GOEP_MOE_STEPS:-300}
echo "== moe-train -device cuda, then -device cpu (the main job, $moe_steps steps each: make run's model; NCCL's unique ID made on rank 0 and handed over MPI)"
moe_args=(${GOEP_MOE_ARGS:--mode ll -dtype f32 -steps $moe_steps -ckpt-every 0 -progress-every 100})
moe_out=$(mktemp -d "${TMPDIR:-/tmp}/goep-moe-train.XXXXXX")
moe_bin="" moe_launch=()
if have_mpi "$bin/moe-train" || { [ -x "$bin/moe-train" ] && command -v mpirun >/dev/null && libs=$(with_libs "$bin/moe-train") && [ -n "$libs" ]; }; then
  moe_bin=$bin/moe-train moe_launch=(mpirun "${mpi_args[@]}")
elif [ -x "$bin/moe-train-1rank" ]; then
  moe_bin=$bin/moe-train-1rank
else
  echo "not built: run make test-gpu"; status=1
fi
if [ -n "$moe_bin" ]; then
  if libs=$(with_libs "$moe_bin"); then
    if [ -n "$libs" ]; then
      echo "($(basename "$moe_bin") takes HDF5 from $bin/lib)"
      export LD_LIBRARY_PATH=$libs
      [ ${#moe_launch[@]} = 0 ] || moe_launch+=(-x LD_LIBRARY_PATH)
    fi
    for dev in cuda cpu; do
      echo "-- moe-train -device $dev"
      timeout -k 10 "${GOEP_MOE_TIMEOUT:-120}" "${moe_launch[@]}" "$moe_bin" -device "$dev" "${moe_args[@]}" \
        -trace "$moe_out/$dev/trace.h5" -ckpt-dir "$moe_out/$dev" || { echo "moe-train -device $dev failed (exit $?; 124: over the limit)"; status=1; }
    done
    if command -v h5dump >/dev/null && [ -s "$moe_out/cuda/trace.h5" ]; then
      echo "-- the device the trace records (h5dump)"
      h5dump -a /backend -a /device -a /device_driver -a /device_libraries -a /comm_id "$moe_out/cuda/trace.h5" | grep '(0)'
    fi
  else
    status=1
  fi
fi
rm -rf "$moe_out"

if [ "$status" = 0 ]; then echo "== run-on-device.sh: PASS"; else echo "== run-on-device.sh: FAIL"; fi
exit "$status"
