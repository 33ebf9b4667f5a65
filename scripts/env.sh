# Sourced by the launch scripts: one rank per core, no threads inside a rank, and OpenBLAS's
# AVX-512 kernels on AVX-512 CPUs that OpenBLAS 0.3.21 does not recognise (it would use AVX2).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
if [[ -z "${OPENBLAS_CORETYPE:-}" ]] && grep -q -m1 '^flags.* avx512f' /proc/cpuinfo 2>/dev/null; then
  export OPENBLAS_CORETYPE=SkylakeX
fi
