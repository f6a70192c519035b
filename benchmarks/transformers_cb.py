"""transformers' own continuous batching against this project's engine, in-process, side by side.

Each side runs in a fresh child process (torch threads and ``OMP_WAIT_POLICY`` as a dp=1
scheduler has them), on the same model, greedy, and reports:

- setup: from an idle loaded model to the answer of a first 4-token request (transformers:
  ``init_continuous_batching()``, ``start()`` and that request; this engine: a new batch and
  that request), and the process's resident memory after it;
- per token: a 300-token request alone, its wall time over 300;
- a 2-token request sent 0.3 s after a 300-token one: when each returned, counted from when it
  was sent (the lead's first try of transformers 5.24's manager reported 12.5 s and 14.6 s);
- throughput: 16 requests of 128 tokens sent at once, output tokens per second.

The transformers side runs twice: with its default ``ContinuousBatchingConfig`` and with a
small one (``max_batch_tokens=256``, ``num_blocks=64``), which shows where its setup time goes.
The sides alternate for ``--rounds`` rounds; the script prints the medians.

    .venv/bin/python benchmarks/transformers_cb.py [--model-path PATH] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from support.serving import server_env  # noqa: E402

PROMPT = "once upon a time"
LONG, SHORT, DELAY = 300, 2, 0.3
TOGETHER, EACH = 16, 128
SIDES = ("engine", "transformers", "transformers (small cache)")


def rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def run_engine(model_path: str) -> dict:
    """This project's ``GenerationBatch``, driven as its scheduler drives it."""
    import torch

    from launchspec.model_source import resolve_model
    from platforms import current_platform
    from serving.srt.model_runner import ModelRunner
    from serving.srt.sampling import Sequence
    from serving.wire import SamplingParams

    runner = ModelRunner(resolve_model(model_path), platform=current_platform)

    def seq(rid: str, n: int) -> Sequence:
        params = SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True)
        return Sequence(rid, runner.encode_prompt(PROMPT, n), params, seed=0)

    out: dict = {}
    started = time.perf_counter()
    runner.run_to_end([seq("first", 4)])
    out["setup_s"], out["rss_mib"] = time.perf_counter() - started, rss_mib()
    started = time.perf_counter()
    runner.run_to_end([seq("alone", LONG)])
    out["per_token_ms"] = (time.perf_counter() - started) / LONG * 1000
    batch = runner.new_batch()
    long, short = seq("long", LONG), seq("short", SHORT)
    done: dict[str, float] = {}
    sent = {"long": time.perf_counter()}
    batch.join([long])
    with torch.inference_mode():
        while len(batch) or "short" not in sent:
            if "short" not in sent and time.perf_counter() - sent["long"] >= DELAY:
                sent["short"] = time.perf_counter()
                batch.join([short])
            for s in runner.generate(batch):
                if s.finished:
                    done[s.rid] = time.perf_counter() - sent[s.rid]
    out["short_s"], out["long_s"] = done["short"], done["long"]
    started = time.perf_counter()
    runner.run_to_end([seq(f"many-{i}", EACH) for i in range(TOGETHER)])
    out["tokens_per_s"] = TOGETHER * EACH / (time.perf_counter() - started)
    return out


def run_transformers(model_path: str, small: bool) -> dict:
    """transformers' ``ContinuousBatchingManager`` on the same model (the attention the
    manager picks for it), default or small ``ContinuousBatchingConfig``."""
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        ContinuousBatchingConfig,
        GenerationConfig,
    )

    tok = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, attn_implementation="sdpa").eval()
    ids = tok(PROMPT)["input_ids"]
    gen = GenerationConfig(max_new_tokens=LONG, do_sample=False, eos_token_id=-1)
    config = (
        ContinuousBatchingConfig(max_batch_tokens=256, num_blocks=64)
        if small
        else ContinuousBatchingConfig()
    )
    out: dict = {}
    started = time.perf_counter()
    manager = model.init_continuous_batching(
        generation_config=gen, continuous_batching_config=config
    )
    manager.start()
    try:

        def answer(rid: str, n: int) -> float:
            sent = time.perf_counter()
            manager.add_request(ids, request_id=rid, max_new_tokens=n)
            manager.get_result(rid, timeout=600)
            return time.perf_counter() - sent

        answer("first", 4)
        out["setup_s"], out["rss_mib"] = time.perf_counter() - started, rss_mib()
        out["attention"] = model.config._attn_implementation
        out["per_token_ms"] = answer("alone", LONG) / LONG * 1000
        sent = {"long": time.perf_counter()}
        manager.add_request(ids, request_id="long", max_new_tokens=LONG)
        time.sleep(DELAY)
        sent["short"] = time.perf_counter()
        manager.add_request(ids, request_id="short", max_new_tokens=SHORT)
        done: dict[str, float] = {}
        while len(done) < 2:
            result = manager.get_result(timeout=600)
            if result is not None and result.is_finished():
                done[result.request_id] = time.perf_counter() - sent[result.request_id]
        out["short_s"], out["long_s"] = done["short"], done["long"]
        started = time.perf_counter()
        rids = [f"many-{i}" for i in range(TOGETHER)]
        for rid in rids:
            manager.add_request(ids, request_id=rid, max_new_tokens=EACH)
        for rid in rids:
            manager.get_result(rid, timeout=600)
        out["tokens_per_s"] = TOGETHER * EACH / (time.perf_counter() - started)
    finally:
        manager.stop(block=True)
    return out


def child(side: str, model_path: str) -> None:
    from platforms import current_platform
    from serving.threads import share_cpu_threads

    if current_platform.is_cpu():
        share_cpu_threads(ranks_on_node=1)  # what a dp=1 scheduler does
    if side == "engine":
        result = run_engine(model_path)
    else:
        result = run_transformers(model_path, small="small" in side)
    print("RESULT " + json.dumps(result), flush=True)


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-path", help="a causal LM directory (default: a tiny Llama)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    model = args.model_path
    if model is None:
        from support.serving import build_tiny_llama

        from launchspec.model_source import embedding_model_dir

        tmp = Path(tempfile.mkdtemp(prefix="bench-tcb-"))
        model = str(build_tiny_llama(tmp / "tiny-llama-4", embedding_model_dir(), layers=4))
    env = {**server_env(), "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    results: dict[str, list[dict]] = {side: [] for side in SIDES}
    for _ in range(args.rounds):
        for side in SIDES:
            done = subprocess.run(
                [sys.executable, __file__, "--child", side, model],
                env=env,
                cwd=str(REPO),
                capture_output=True,
                text=True,
                timeout=1200,
            )
            lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
            if done.returncode or not lines:
                raise RuntimeError(f"{side} failed ({done.returncode}):\n{done.stderr[-3000:]}")
            results[side].append(json.loads(lines[-1][len("RESULT ") :]))
    print(f"model: {model}; {args.rounds} rounds, medians (each side in a fresh process)")
    for side, rounds in results.items():

        def med(key: str, rounds: list[dict] = rounds) -> float:
            return statistics.median(r[key] for r in rounds)

        attention = f"  attention {rounds[0]['attention']}" if "attention" in rounds[0] else ""
        print(
            f"  {side:<27} setup {med('setup_s'):7.2f} s  RSS {med('rss_mib'):7.0f} MiB  "
            f"{med('per_token_ms'):6.2f} ms/token alone   {SHORT} tokens sent {DELAY} s after "
            f"{LONG}: {med('short_s'):6.2f} s, the {LONG}: {med('long_s'):6.2f} s   "
            f"{TOGETHER} x {EACH} tokens at once: {med('tokens_per_s'):7.1f} tokens/s{attention}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
