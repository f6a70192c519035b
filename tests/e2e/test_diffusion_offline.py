"""``launcher.DiffGenerator`` from real scripts: the lazy name, the example in the spec's layout end
to end, errors as exceptions, and the child's warning for a script that imports runtime modules
at module scope."""

from __future__ import annotations

import subprocess
import sys

import pytest
from PIL import Image
from support import REPO, clean_env, descendants, run_python
from support.diffusion import SIZE

pytestmark = pytest.mark.e2e


def run_script(args: list[str], tmp_path, timeout: float = 300) -> tuple[int, str, str]:
    env = clean_env(PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    proc = subprocess.Popen(
        [sys.executable, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=str(tmp_path),
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            for child in descendants(proc.pid):
                child.kill()
            proc.kill()
            proc.wait()
    return proc.returncode, out, err


def test_the_lazy_name_imports_nothing_heavy():
    result = run_python("""
        import sys
        from launcher import DiffGenerator
        heavy = [m for m in ("torch", "diffusers", "PIL", "serving", "launcher.supervisor.supervisor")
                 if m in sys.modules]
        print("RESULT:" + __import__("json").dumps({"heavy": heavy, "name": DiffGenerator.__name__}))
    """)
    assert result.returncode == 0, result
    assert result.data == {"heavy": [], "name": "DiffGenerator"}, result


def test_offline_example_end_to_end(tiny_pipeline, tmp_path):
    code, out, err = run_script(
        [
            str(REPO / "examples" / "offline_generate.py"),
            "--model-path",
            str(tiny_pipeline),
            "--n",
            "2",
            "--size",
            str(SIZE),
            "--steps",
            "2",
            "--out-dir",
            "out",
        ],
        tmp_path,
    )
    assert code == 0, f"{out}\n{err}"
    assert "stopped; every worker is gone" in out
    for i in range(2):
        with Image.open(tmp_path / "out" / f"image-{i}.png") as img:
            assert img.size == (SIZE, SIZE)
    assert "runtime modules were already imported" not in err  # the layout keeps children clean


SCRIPT = """
import torch  # a runtime module at module scope: every child re-runs this line

from launcher import DiffGenerator

if __name__ == "__main__":
    with DiffGenerator.from_pretrained(model_path={path!r}) as gen:
        same = [gen.generate("a cat", width={size}, height={size}, num_inference_steps=2, seed=4)[0].tobytes()
                for _ in range(2)]
        print("same seed, same pixels:", same[0] == same[1])
        try:
            gen.generate("a cat", width=30, height={size}, num_inference_steps=2)
        except ValueError as exc:
            print("refused:", exc)
    print("closed")
"""


def test_generate_errors_and_the_early_import_warning(tiny_pipeline, tmp_path):
    script = tmp_path / "gen.py"
    script.write_text(SCRIPT.format(path=str(tiny_pipeline), size=SIZE))
    code, out, err = run_script([str(script)], tmp_path)
    assert code == 0, f"{out}\n{err}"
    assert "same seed, same pixels: True" in out
    assert "refused: width 30 must be a multiple of 8" in out
    assert "closed" in out
    assert "runtime modules were already imported" in err and "torch" in err
