#!/usr/bin/env bash
# Makes a self-contained folder that runs hpctrain's GPU checks and benchmarks on a GPU node that
# has the NVIDIA driver, a CUDA 13 runtime (toolkit or PyTorch's nvidia-* wheels) and Python, and
# none of our Debian packages (MPI, HDF5, OpenBLAS, oneDNN, Kokkos, ...).
#
#   bench/gpu_bundle.sh DIR [BUILD]     BUILD: the build tree (default ./build)
#
# DIR/bin     pretrain_gpt, pretrain_moe and the gpu-labelled test binaries, each a small script
#             that runs the real one (DIR/libexec) through DIR/run: scripts call them as they are, and
#             their Python (PyTorch) keeps the node's own libraries
# DIR/lib     every shared library they link (ldd) except glibc's own and the large CUDA libraries
#             the node brings (libcuda, libcublas, libcublasLt, libnccl; and libcudnn, which the fused
#             attention opens at run time): Open MPI, HDF5, OpenBLAS,
#             oneDNN, Kokkos, libstdc++, the CUDA runtime the build used, ...
# DIR/lib/openmpi3, DIR/lib/pmix   Open MPI's and PMIx's plugins (opened at run time, not in ldd)
# DIR/run     `DIR/run CMD ARGS...` runs CMD with the library path set (the bundle's, then the
#             node's CUDA libraries found under /usr/local/cuda* and Python's site-packages/nvidia),
#             and Open MPI as a singleton that starts no daemon (one rank; mpirun is not carried).
# DIR.tar.xz  the folder packed (OpenBLAS and oneDNN alone are 76 MB unpacked); unpack it with
#             `python3 -c "import tarfile; tarfile.open('DIR.tar.xz').extractall('.')"` (no xz needed).
# The source tree's bench/ and tests/apps/ scripts run from the repository as usual, with BIN=DIR/bin.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:?usage: bench/gpu_bundle.sh DIR [BUILD]}
build=${2:-$root/build}
rm -rf "$dir"
mkdir -p "$dir/bin" "$dir/libexec" "$dir/lib/openmpi3" "$dir/lib/pmix"

# -march=native binaries run only on CPUs with the build machine's instruction sets: say so.
if grep -q '^HPCT_NATIVE:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
  echo "gpu_bundle: note: $build was built with -march=native ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs));" \
    "for a node of another CPU build with -DHPCT_NATIVE=OFF -DCMAKE_CXX_FLAGS=-march=x86-64-v3" >&2
fi
bins=()
for name in pretrain_gpt pretrain_moe test_kernels_cuda test_ops_backend_cuda test_transfers_cuda test_fusions_cuda test_linear_cuda test_head_cuda test_moe_gate_cuda test_gpt_cuda test_tensor_parallel_cuda test_nccl_queued; do
  exe=$(find "$build" -name "$name" -type f -perm -u+x | head -1)
  [[ -n "$exe" ]] || { echo "gpu_bundle: $name not found under $build (build with CUDA first)" >&2; exit 1; }
  cp "$exe" "$dir/libexec/"
  bins+=("$dir/libexec/$name")
  cat >"$dir/bin/$name" <<WRAP
#!/usr/bin/env bash
here=\$(cd "\$(dirname "\$0")/.." && pwd)
exec "\$here/run" "\$here/libexec/$name" "\$@"
WRAP
  chmod +x "$dir/bin/$name"
done
ompi_plugins=/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
pmix_plugins=/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix
cp "$ompi_plugins"/*.so "$dir/lib/openmpi3/"
if [[ -d "$pmix_plugins" ]]; then cp "$pmix_plugins"/*.so "$dir/lib/pmix/"; fi

# The node's own: glibc (its loader and libraries must match each other) and the CUDA libraries of
# the driver, the toolkit or PyTorch's wheels (hundreds of MB; libcudart is small and carried).
skip='^(ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libutil|libcuda|libcublas|libcublasLt|libnccl|linux-vdso)\.so'
for f in "${bins[@]}" "$dir"/lib/openmpi3/*.so "$dir"/lib/pmix/*.so; do
  ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}'
done | sort -u | while read -r lib; do
  base=$(basename "$lib")
  [[ "$base" =~ $skip ]] && continue
  [[ -e "$dir/lib/$base" ]] || cp -L "$lib" "$dir/lib/$base"
done

cat >"$dir/run" <<'RUN'
#!/usr/bin/env bash
# Runs a command with this bundle's libraries (see bench/gpu_bundle.sh).
here=$(cd "$(dirname "$0")" && pwd)
cuda=""
sp=$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null || true)
for lib in libcublas.so.13 libcublasLt.so.13 libnccl.so.2 libcudnn.so.9; do  # cuDNN: opened at run time
  found=$(find /usr/local/cuda*/lib64 /usr/local/cuda*/lib /usr/lib/x86_64-linux-gnu $(for s in $sp; do echo "$s/nvidia"; done) \
    -name "$lib" 2>/dev/null | head -1 || true)
  [[ -n "$found" ]] && cuda="$cuda:$(dirname "$found")"
done
export LD_LIBRARY_PATH="$here/lib$cuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMPI_MCA_mca_base_component_path="$here/lib/openmpi3"
export PMIX_MCA_mca_base_component_path="$here/lib/pmix"
export OMPI_MCA_ess_singleton_isolated=1   # one rank, no orted to start
export HWLOC_PLUGINS_PATH="$here/lib/no-hwloc-plugins"  # hwloc's optional plugins (X11, NVML, libxml2): none
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_mca_base_component_show_load_errors=0
exec "$@"
RUN
chmod +x "$dir/run"
du -sh "$dir" | awk '{print "gpu_bundle: " $1 " unpacked"}'
tar -C "$(dirname "$dir")" -cJf "$dir.tar.xz" "$(basename "$dir")"
du -h "$dir.tar.xz" | awk '{print "gpu_bundle: " $1 " packed: " $2}'
