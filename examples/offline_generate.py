"""Offline image generation with ``launcher.DiffGenerator``, in the spec's script layout.

    .venv/bin/python examples/offline_generate.py --model-path PIPELINE_DIR [--prompt TEXT]
        [--n 2] [--size 512] [--steps 30] [--seed 0] [--out-dir images]

``PIPELINE_DIR`` is a diffusers pipeline directory (the folder with ``model_index.json`` that a
pipeline's ``save_pretrained`` writes). ``from launcher import DiffGenerator`` is a lazy name,
so binding it at module scope costs nothing: every ``spawn`` child re-runs this module's top
level before its platform is initialized, and finds no runtime module imported. Everything
else lives under the ``__main__`` guard. The workers stop when the ``with`` block ends.
"""

import argparse
from pathlib import Path

from launcher import DiffGenerator


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--prompt", default="a watercolor painting of a lighthouse")
    parser.add_argument("--n", type=int, default=1)
    parser.add_argument(
        "--size", type=int, default=None, help="width and height (default: the pipeline's)"
    )
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", default="images")
    opts = parser.parse_args()
    out = Path(opts.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with DiffGenerator.from_pretrained(model_path=opts.model_path) as generator:
        images = generator.generate(
            opts.prompt,
            n=opts.n,
            width=opts.size,
            height=opts.size,
            num_inference_steps=opts.steps,
            seed=opts.seed,
        )
        for i, image in enumerate(images):
            path = out / f"image-{i}.png"
            image.save(path)
            print(f"{path}: {image.width}x{image.height}")
    print("stopped; every worker is gone")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
