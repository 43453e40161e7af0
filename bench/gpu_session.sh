#!/usr/bin/env bash
# One device lease's GPU checks, as one prepared script (run from the repository root on the lent
# machine, with the wheels its image lacks carried in .whl/): the GPU tests, then the benchmarks,
# each under its own time limit, most important first. Logs go to $OUT (the device tool brings
# them back). Usage: bash bench/gpu_session.sh [comma-separated sections: tests,gguf,graphs,blocks]
#
# The wheels, fetched here beforehand (the lent image has torch, triton, transformers, numba and
# pytest, not these; .whl/ is git-ignored through .git/info/exclude):
#   python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     gguf jsonschema jsonschema-specifications referencing rpds-py interegular lark outlines_core
set -u
OUT="${OUT:-/tmp/gpu_out}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 NUMBA_CACHE_DIR=/tmp/numba-cache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
SECTIONS="${1:-tests,blocks,gguf,graphs}"  # blocks: the grouped GEMV against the elementwise one, not yet timed
case ",$SECTIONS," in *,tests,*)
  # shellcheck disable=SC2086
  timeout "${TEST_LIMIT:-210}" python3 -m pytest -q -p no:cacheprovider -k "${TEST_FILTER:-gpu}" --durations=12 \
    ${TESTS:-tests/test_cuda_graph_runner.py tests/test_ggml_blocks_kernels.py::test_gpu_matmul_is_cuda_graph_capturable tests/test_ggml_blocks_kernels.py::test_gpu_gemv_variants_match_gguf tests/test_gguf_cuda.py} \
    2>&1 | tee "$OUT/tests.log" | tail -45 ;;
esac
case ",$SECTIONS," in *,gguf,*) timeout "${GGUF_LIMIT:-130}" python3 bench/gpu_bench.py --quick --only gguf 2>&1 | tee "$OUT/gguf.log" ;; esac
case ",$SECTIONS," in *,graphs,*) timeout "${GRAPHS_LIMIT:-70}" python3 bench/gpu_bench.py --quick --only graphs 2>&1 | tee "$OUT/graphs.log" ;; esac
case ",$SECTIONS," in *,blocks,*) timeout "${BLOCKS_LIMIT:-120}" python3 bench/ggml_blocks_bench.py --quick 2>&1 | tee "$OUT/blocks.log" ;; esac
