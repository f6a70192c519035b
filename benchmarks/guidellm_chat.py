"""guidellm, a benchmark client users point at OpenAI-compatible servers, against this server.

Starts ``sglang-launch`` through the CLI on a tiny Llama built here (random weights, BERT's
tokenizer, a chat template given to it; or ``--model-path`` a model of your own, or
``--default-model`` for what a bare ``sglang-launch`` serves, the embedded chat model) and runs
``guidellm run`` at its defaults (its OpenAI HTTP backend, ``/v1/chat/completions`` streamed, its
quick start's synthetic data of 256 prompt and 128 output tokens) with a concurrent profile
bounded in requests and seconds. Prints guidellm's counts and figures and exits 1 unless every
request succeeded (none errored, none left incomplete). Loopback only.

guidellm is not in the test extra (it brings datasets, pandas, pyarrow and sanic); install it
beside the project first:

    .venv/bin/python -m pip install guidellm==0.8.1
    .venv/bin/python benchmarks/guidellm_chat.py [--requests 8] [--streams 4] [--seconds 60]
        [--model-path PATH | --default-model]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from support.serving import build_tiny_llama, give_chat_template, start_server  # noqa: E402

GUIDELLM = Path(sys.executable).parent / "guidellm"


def guidellm_command(url: str, tokenizer: str, args: argparse.Namespace, report: Path) -> list[str]:
    return [
        str(GUIDELLM),
        "run",
        "--backend",
        f"kind=openai_http,target={url}",
        "--profile",
        f"kind=concurrent,streams={args.streams}",
        "--constraint",
        f"kind=max_requests,count={args.requests}",
        "--constraint",
        f"kind=max_duration,seconds={args.seconds}",
        "--data",
        f"kind=synthetic_text,prompt_tokens={args.prompt_tokens},output_tokens={args.output_tokens}",
        "--tokenizer",
        f"kind=hf_auto,model={tokenizer}",
        "--output",
        f"kind=json,path={report}",
        "--disable-progress",
    ]


def summary(report: Path) -> tuple[dict, dict]:
    """guidellm's request counts and a few of its figures (means) from its JSON report."""
    benchmark = json.loads(report.read_text())["benchmarks"][0]
    metrics = benchmark["metrics"]
    counts = metrics["request_totals"]

    def mean(name: str) -> float:
        return float(metrics[name]["successful"]["mean"])

    figures = {
        "time to first token, ms": mean("time_to_first_token_ms"),
        "inter-token latency, ms": mean("inter_token_latency_ms"),
        "request latency, s": mean("request_latency"),
        "output tokens/s": mean("output_tokens_per_second"),
    }
    return counts, figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model-path", help="a causal LM with a chat template (default: a tiny one)"
    )
    parser.add_argument(
        "--default-model",
        action="store_true",
        help="serve what a bare sglang-launch serves (the embedded chat model, SmolLM2)",
    )
    parser.add_argument("--requests", type=int, default=8, help="requests in all")
    parser.add_argument("--streams", type=int, default=4, help="concurrent requests")
    parser.add_argument("--seconds", type=float, default=60, help="the longest the run may take")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--output-tokens", type=int, default=128)
    args = parser.parse_args()
    if not GUIDELLM.exists():
        print(
            f"guidellm is not installed beside this Python; run: {sys.executable} -m pip install "
            f"guidellm==0.8.1",
            file=sys.stderr,
        )
        return 2
    with tempfile.TemporaryDirectory(prefix="guidellm-") as folder:
        tmp = Path(folder)
        launch: list[str] = []
        if args.default_model:
            from launchspec.model_source import chat_model_dir

            model = chat_model_dir()  # its tokenizer, for guidellm's prompts
        elif args.model_path:
            model = Path(args.model_path)
            launch = ["--model-path", str(model)]
        else:
            from launchspec.model_source import embedding_model_dir

            model = give_chat_template(build_tiny_llama(tmp / "tiny-chat", embedding_model_dir()))
            launch = ["--model-path", str(model)]
        server = start_server(launch, tmp, "server", default_model=args.default_model)
        try:
            report = tmp / "report.json"
            run = subprocess.run(
                guidellm_command(server.url, str(model), args, report),
                cwd=tmp,
                capture_output=True,
                text=True,
                timeout=args.seconds + 600,
            )
            if run.returncode != 0 or not report.exists():
                print(run.stdout[-4000:] + run.stderr[-4000:], file=sys.stderr)
                print(f"guidellm failed (exit {run.returncode})", file=sys.stderr)
                return 1
            counts, figures = summary(report)
        finally:
            server.stop()
    print(
        f"guidellm {args.streams} streams, {args.requests} requests of {args.prompt_tokens} + "
        f"{args.output_tokens} tokens against /v1/chat/completions: "
        f"{counts['successful']} successful, {counts['errored']} errored, "
        f"{counts['incomplete']} incomplete"
    )
    for name, value in figures.items():
        print(f"  {name}: {value:.1f}")
    ok = counts["errored"] == 0 and counts["incomplete"] == 0 and counts["successful"] > 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
