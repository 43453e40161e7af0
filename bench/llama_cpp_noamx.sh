#!/usr/bin/env bash
# Builds llama-cpp-python (the version pyproject.toml pins) without llama.cpp's AMX path, into
# DIR (default /tmp/llama_cpp_noamx), and prints the directory to put first on PYTHONPATH:
#
#     PYTHONPATH=$(bash bench/llama_cpp_noamx.sh | tail -1) .venv/bin/python bench/gguf_bench.py --random-1b Q4_0,Q8_0
#
# Why: on Sapphire Rapids-class CPUs (AMX) the default build's AMX matrix product segfaults on
# quantized weights (llama.cpp issue 20824), so bench/gguf_bench.py runs such a build with its extra
# buffer types off, which also turns off weight repacking, its fast Q4_0 / Q4_K path: a slower
# anchor. This build keeps repacking and the AVX-512 / VNNI kernels. About 10 minutes on 2 cores.
set -euo pipefail
dir=${1:-/tmp/llama_cpp_noamx}
root=$(cd "$(dirname "$0")/.." && pwd)
pip=$root/.venv/bin/pip
version=$(grep -o 'llama-cpp-python==[0-9.]*' "$root/pyproject.toml" | head -1)
flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX_VNNI=ON
       -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON
       -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
mkdir -p "$dir/wheel"
CMAKE_ARGS="${flags[*]}" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    "$pip" wheel --no-deps --no-binary :all: --no-cache-dir "$version" -w "$dir/wheel" >&2
"$pip" install --no-deps --upgrade --target "$dir/site" "$dir"/wheel/llama_cpp_python-*.whl >&2
PYTHONPATH="$dir/site" "$root/.venv/bin/python" -c "import llama_cpp; print(llama_cpp.llama_print_system_info().decode())" >&2
echo "$dir/site"
