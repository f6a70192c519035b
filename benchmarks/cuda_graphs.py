"""Decode throughput with the platform's graph runner on and off, in-process, on the machine's
SRT platform (a device script: on a CUDA machine, this project's ``CudaGraphRunner``).

For each side (``off``: ``--disable-cuda-graph``, eager decode; ``on``: the runner
``current_platform.get_graph_runner_cls()`` returns, captured at start-up; ``compile``: the
compiled step of ``--enable-torch-compile`` with the graph runner off) the script loads the
model once with ``ModelRunner``, picks the decode runner as a launch does
(``serving.srt.model_executor.decode_runner``), then for each batch size runs ``--tokens``
greedy tokens per sequence and prints output tokens/s (decode steps only: the prefill step is
left out of the clock) and the start-up time of the runner (capture or compile). Also whether
each side's greedy tokens equal the ``off`` side's.

    python benchmarks/cuda_graphs.py [--model-path DIR] [--dtype bfloat16]
        [--batch-sizes 1,8,32] [--tokens 64] [--sides off,on,compile]

Default model: the embedded chat model (SmolLM2-135M-Instruct, its GGUF file converted into the
model cache). Figures go to benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO)]
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def run_side(side: str, model_path: str | None, dtype: str, sizes: list[int], tokens: int) -> dict:
    from launchspec.model_source import chat_model_dir, resolve_model
    from platforms import current_platform
    from serving.srt.model_executor.decode_runner import DecodeOptions, choose_decode_runner
    from serving.srt.model_runner import ModelRunner
    from serving.srt.sampling import Sequence
    from serving.wire import SamplingParams

    path = model_path or str(chat_model_dir())
    runner = ModelRunner(
        resolve_model(path), platform=current_platform, dtype=dtype, max_batch_size=max(sizes)
    )
    runner.warm_up()
    options = DecodeOptions(
        enable_torch_compile=side == "compile",
        torch_compile_max_bs=max(sizes),
        disable_cuda_graph=side != "on",
        cuda_graph_max_bs=max(sizes),
    )
    started = time.monotonic()
    graph = choose_decode_runner(runner, options)
    setup = time.monotonic() - started
    params = SamplingParams(max_new_tokens=tokens, temperature=0.0, ignore_eos=True)
    rates, outputs = {}, {}
    for size in sizes:
        prompt = runner.encode_prompt("The history of the printing press", tokens)
        seqs = [Sequence(f"{side}-{size}-{i}", prompt, params, seed=0) for i in range(size)]
        batch = runner.new_batch()
        with batch.held():
            batch.join(seqs)
            batch.step()  # the prefill, and each sequence's first token
            current_platform.synchronize()
            clock = time.monotonic()
            while len(batch):
                batch.step()
            current_platform.synchronize()
        elapsed = time.monotonic() - clock
        rates[size] = size * (tokens - 1) / elapsed
        outputs[size] = seqs[0].output_ids
    return {
        "runner": type(graph).__name__ if graph is not None else "eager",
        "setup_s": setup,
        "rates": rates,
        "outputs": outputs,
        "device": str(runner.device),
        "dtype": str(runner.dtype),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-path", default=None, help="a model directory (default: embedded)")
    parser.add_argument("--dtype", default="auto", help="the model's dtype (default: auto)")
    parser.add_argument("--batch-sizes", default="1,8,32", help="comma-separated batch sizes")
    parser.add_argument("--tokens", type=int, default=64, help="output tokens per sequence")
    parser.add_argument("--sides", default="off,on,compile", help="off, on, compile, in order")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.batch_sizes.split(",") if s.strip()]
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    unknown = sorted(set(sides) - {"off", "on", "compile"})
    if unknown or not sizes or min(sizes) < 1 or args.tokens < 2:
        parser.error("--sides takes off, on, compile; batch sizes >= 1; --tokens >= 2")
    results = {
        side: run_side(side, args.model_path, args.dtype, sizes, args.tokens) for side in sides
    }
    first = next(iter(results.values()))
    print(f"device {first['device']}, dtype {first['dtype']}, {args.tokens} tokens per sequence")
    print(
        f"{'side':<8} {'runner':<20} {'set-up':>8} "
        + " ".join(f"{'bs ' + str(s):>10}" for s in sizes)
    )
    for side, r in results.items():
        same = all(r["outputs"][s] == first["outputs"][s] for s in sizes)
        cells = " ".join(f"{r['rates'][s]:>10.1f}" for s in sizes)
        print(
            f"{side:<8} {r['runner']:<20} {r['setup_s']:>7.1f}s {cells}  tok/s"
            + ("" if same else "  (greedy tokens differ from the first side's)")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
