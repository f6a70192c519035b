"""GGUF files through ``--model-path FILE.gguf``: a tiny Llama written at test time with the
``gguf`` package's writer (Q8_0 weights, a byte-level BPE tokenizer, a chat template), converted
once into the model cache and served from it after; and every file a server must refuse, each
an exit 2 before any worker starts, naming the problem and the fix.

Each test points the model cache at a folder of its own (``SGLANG_LAUNCH_CACHE_DIR``), so what
it asserts about converting or not converting depends on nothing else; the tests that only read a
converted copy share one, made by two launches preparing the file at once (what those two did is
recorded when they did it, and asserted by their own test).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import psutil
import pytest
from support import free_port, wait_for
from support.gguf import build_tiny_gguf, train_tokenizer, write_gguf
from support.serving import Server, cli_command, post, server_env, start_server
from support.supervisor import Run, short_runtime_dir

from launchspec.gguf_cache import CACHE_ENV, open_gguf, prepare


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Path]:
    """``(tiny-llama.Q8_0.gguf, the same model as a Hugging Face directory)``."""
    return build_tiny_gguf(tmp_path_factory.mktemp("gguf"))


class _Messages(logging.Handler):
    """A log handler that keeps each record's message."""

    def __init__(self, level: int) -> None:
        super().__init__(level)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def two_launches(tmp_path_factory, tiny) -> dict:
    """Two launches preparing ``tiny`` at once in a new model cache, as what they did:
    ``cache``, ``errors``, the ``converted`` log messages, whether the file is ``prepared``
    after, and the cache's ``models`` listing then. The cache is ``shared_cache`` after."""
    cache = tmp_path_factory.mktemp("gguf-cache")
    handler = _Messages(logging.INFO)
    messages = handler.messages
    logger = logging.getLogger("sglang_launch.gguf")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    errors: list[BaseException] = []
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(CACHE_ENV, str(cache))
            gguf = open_gguf(tiny[0])

            def launch() -> None:
                try:
                    prepare(gguf)
                except BaseException as exc:  # noqa: BLE001 - reported by the test's assertion
                    errors.append(exc)

            launches = [threading.Thread(target=launch) for _ in range(2)]
            for t in launches:
                t.start()
            for t in launches:
                t.join(timeout=300)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return {
        "cache": cache,
        "errors": errors,
        "converted": [m for m in messages if "converted in" in m],
        "messages": messages,
        "prepared": gguf.prepared,
        "directory": gguf.directory.name,
        "listing": sorted(p.name for p in (cache / "models").iterdir()),
    }


@pytest.fixture(scope="module")
def shared_cache(two_launches) -> Path:
    """A model cache in which ``tiny`` is converted already (by ``two_launches``)."""
    return two_launches["cache"]


GREEDY = {
    "text": "a cat sits on",
    "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True},
}


def test_a_gguf_file_is_converted_on_the_first_start_and_served_from_the_cache_after(
    tiny, tmp_path
):
    """Then a reload to another GGUF file: refused while that file is unconverted (converting on
    the running launcher's loop would stall it), served once it is converted."""
    file, _ = tiny
    cache = tmp_path / "cache"
    env = server_env(**{CACHE_ENV: str(cache), "XDG_RUNTIME_DIR": short_runtime_dir()})
    first = start_server(["--model-path", str(file)], tmp_path, "first", env=env)
    try:
        log = first.log
        assert "converting it into a model directory, which only the first start does" in log
        assert "dequantising 21 tensors to float32: done in" in log
        info = httpx.get(first.url + "/get_model_info", timeout=30).json()
        weights = info["weights"]
        assert weights["format"] == "gguf" and weights["gguf_file"] == str(file.resolve())
        converted = Path(weights["cache_dir"])
        assert converted.parent == cache / "models" and converted.name.startswith("gguf-")
        assert len(weights["sha256"]) == 64 and weights["converted_at"]
        assert info["model_path"] == str(converted)
        assert (info["served_model_name"], info["kind"]) == ("tiny-llama.Q8_0", "generation")
        assert info["chat_template"] == "model"  # the template the file carries
        answer = post(first.url + "/generate", GREEDY)
        assert answer.status_code == 200, answer.text
        assert answer.json()["meta_info"]["completion_tokens"] == 6
        chat = post(
            first.url + "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        )
        assert chat.status_code == 200, chat.text
    finally:
        first.stop()
    second = start_server(["--model-path", str(file)], tmp_path, "second", env=env)
    try:
        log = second.log
        assert f"serving its converted copy in {converted}" in log, log
        assert "dequantising" not in log and "converting it into" not in log, log
        again = post(second.url + "/generate", GREEDY)
        assert again.json()["text"] == answer.json()["text"]  # the same weights, greedy
        info = httpx.get(second.url + "/get_model_info", timeout=30).json()
        assert info["weights"]["cache_dir"] == str(converted)
        other, _ = build_tiny_gguf(tmp_path / "other", quantisation="F32", name="other")

        def reload() -> subprocess.CompletedProcess:
            return subprocess.run(
                [*cli_command(), "reload", "--model-path", str(other)]
                + ["--pid", str(second.proc.pid)],
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )

        early = reload()
        assert early.returncode == 2, early.stderr + early.stdout
        assert "is not converted yet, and a reload does not convert one while the server runs" in (
            early.stderr
        )
        assert f"convert it first (python -m launchspec.gguf_cache {other})" in early.stderr
        convert = subprocess.run(
            [sys.executable, "-m", "launchspec.gguf_cache", str(other)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert convert.returncode == 0, convert.stderr
        done = reload()
        assert done.returncode == 0, done.stderr + done.stdout
        info = httpx.get(second.url + "/get_model_info", timeout=30).json()
        assert info["weights"]["gguf_file"] == str(other.resolve()), info
        assert post(second.url + "/generate", GREEDY).status_code == 200
    finally:
        second.stop()


def test_the_converted_directory_holds_the_files_weights_and_tokenizer(tiny, shared_cache):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    file, original = tiny
    [converted] = (shared_cache / "models").glob("gguf-*")
    made = AutoModelForCausalLM.from_pretrained(converted).state_dict()
    source = AutoModelForCausalLM.from_pretrained(original).state_dict()
    assert made.keys() == source.keys()
    # Q8_0 keeps each block of 32 weights to 1/127 of its largest: the weights come back close.
    worst = max(float((made[k] - source[k]).abs().max()) for k in source)
    assert worst < 1e-3, worst
    assert all(made[k].dtype == torch.float32 for k in made)
    tokenizer = AutoTokenizer.from_pretrained(converted)
    trained = train_tokenizer()
    for text in ("a cat sits on the mat", "Zebras? 42 unknown words, ünïcode"):
        assert tokenizer(text)["input_ids"] == trained.encode(text).ids


def test_model_info_names_the_file_this_launch_was_given_not_the_first_converter(
    tiny, shared_cache, tmp_path, monkeypatch
):
    """The cache is keyed by the file's content and shared: another checkout's copy of the same
    file, converted first, is what the conversion recorded; /get_model_info names this launch's
    file (the HTTP child as it is built for a launch, over real HTTP)."""
    import asyncio

    from support.fake_scheduler import serve_app

    from launchspec.gguf_cache import read_origin
    from launchspec.server_args import ServerArgs
    from serving.http.server import served_model

    file, _ = tiny
    mine = tmp_path / "my-checkout" / file.name
    mine.parent.mkdir()
    mine.write_bytes(file.read_bytes())
    monkeypatch.setenv(CACHE_ENV, str(shared_cache))
    model = served_model(ServerArgs(model_path=str(mine)), str(mine), None)
    origin = read_origin(model.path) or {}
    assert origin["gguf_file"] == str(file.resolve())  # the first checkout converted it

    async def info() -> httpx.Response:
        async with serve_app(
            tmp_path, loopback=True, model_path=str(model.path), gguf_file=str(model.gguf_file)
        ) as s:
            return await s.http.get("/get_model_info")

    weights = asyncio.run(info()).json()["weights"]
    assert weights["format"] == "gguf" and weights["gguf_file"] == str(mine.resolve())
    assert weights["cache_dir"] == str(model.path) and weights["sha256"] == origin["sha256"]


def test_two_launches_of_one_file_convert_it_once(two_launches):
    """Two launches that prepare one file at once (the module's shared cache is what they made):
    one converts, the other waits for it and finds it converted."""
    assert not two_launches["errors"], two_launches["errors"]
    assert len(two_launches["converted"]) == 1, two_launches["messages"]
    assert two_launches["prepared"]
    name = two_launches["directory"]
    assert two_launches["listing"] == [f".{name}.lock", name]


def test_a_launch_stopped_while_converting_leaves_no_half_cache(tiny, tmp_path):
    file, _ = tiny
    cache = tmp_path / "cache"
    env = server_env(**{CACHE_ENV: str(cache)})
    srv = Server(["--model-path", str(file)], tmp_path / "stopped.log", env=env)
    try:
        wait_for(lambda: "checking that transformers can load it ..." in srv.log, 120, "converting")
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.wait_exit(60) == 0, srv.log
        assert "stopped before start-up" in srv.log, srv.log
    finally:
        srv.stop()
    models = cache / "models"
    assert [p.name for p in models.iterdir() if not p.name.endswith(".lock")] == [], srv.log
    assert not open_gguf_in(cache, file).prepared


def open_gguf_in(cache: Path, file: Path):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CACHE_ENV, str(cache))
        return open_gguf(file)


# -- refusals: exit 2 before any worker starts, the problem and the fix named --------------------
def refused(args: list[str], cache: Path) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [*cli_command(), *args, "--port", str(free_port())],
        env=server_env(**{CACHE_ENV: str(cache)}),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert "invalid server arguments" in done.stderr, done.stderr
    assert "starting" not in done.stderr and "spawned" not in done.stderr, done.stderr
    assert not list(cache.glob("models/gguf-*")) and not list(cache.glob("models/.partial-*"))
    return done


def test_a_quantisation_transformers_cannot_dequantise_is_refused(tmp_path):
    # Q8_K is llama.cpp's intermediate type, which no dequantiser reads.
    bad = write_gguf(
        tmp_path / "odd.Q8_K.gguf",
        "llama",
        {"token_embd.weight": [[0.0] * 256] * 4, "output_norm.weight": [1.0] * 8},
        raw_types={"token_embd.weight": "Q8_K"},
    )
    err = refused(["--model-path", str(bad)], tmp_path / "cache").stderr
    assert "stores 1 tensors as Q8_K, a quantisation transformers" in err, err
    assert "cannot dequantise; quantise the model again with a type it reads" in err, err


def test_an_architecture_transformers_cannot_map_is_refused(tmp_path):
    bert = write_gguf(tmp_path / "bert.gguf", "bert", {"token_embd.weight": [[0.5] * 8] * 4})
    err = refused(["--model-path", str(bert)], tmp_path / "cache").stderr
    assert "holds a 'bert' model, an architecture transformers" in err, err
    assert "cannot map to a model class" in err and "pass the model's Hugging Face directory" in err
    assert "llama" in err  # what it can read instead


def test_a_file_named_gguf_that_is_not_one_is_refused(tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_text("<html>a download that went wrong</html>")
    err = refused(["--model-path", str(fake)], tmp_path / "cache").stderr
    assert "is named like a GGUF file but is not one (it starts with b'<htm'" in err, err
    assert "pass a GGUF file as llama.cpp writes it, or a Hugging Face model directory" in err


def test_a_missing_tokenizer_path_and_a_gguf_load_format_on_a_directory_are_refused(
    tiny, shared_cache, tmp_path
):
    file, directory = tiny
    missing = tmp_path / "no-such-tokenizer"
    done = subprocess.run(
        [*cli_command(), "--model-path", str(file), "--tokenizer-path", str(missing)]
        + ["--port", str(free_port())],
        env=server_env(**{CACHE_ENV: str(shared_cache)}),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert f"--tokenizer-path '{missing}' does not exist; pass the folder that holds" in done.stderr
    assert "or leave it out to use the model's own" in done.stderr
    err = refused(
        ["--model-path", str(directory), "--load-format", "gguf"], tmp_path / "cache"
    ).stderr
    assert "--load-format gguf needs --model-path a GGUF file" in err, err
    assert "drop --load-format gguf, or pass the .gguf file" in err


def test_a_model_cache_that_cannot_be_written_is_refused_with_the_fix(tiny, tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the cache would go")
    err = refused(["--model-path", str(tiny[0])], blocker / "cache").stderr
    assert f"the model cache {blocker / 'cache' / 'models'} cannot be written" in err, err
    assert f"point {CACHE_ENV} (or XDG_CACHE_HOME) at a writable directory" in err, err


# The launcher SIGKILLed while the converter runs: at the first sight of the converter's process
# (still starting the interpreter, or not even executed yet: the rare race, tried most), once its
# orphan protection is armed (its parent watch thread runs), and while it converts.
CONVERTER_MOMENTS = ("first sight",) * 5 + ("armed", "converting")
GONE_WITHIN = 5.0  # seconds: the converter ends at once, or as soon as its interpreter has started


def test_nothing_outlives_a_launcher_sigkilled_while_the_converter_runs(tiny, tmp_path):
    file, _ = tiny
    for i, moment in enumerate(CONVERTER_MOMENTS):
        env = server_env(**{CACHE_ENV: str(tmp_path / f"cache-{i}")})
        with Run(["--model-path", str(file), "--port", str(free_port())], env=env) as run:
            launcher = psutil.Process(run.pid)
            converter = wait_for(launcher.children, 60, "the converter", interval=0.001)[0]
            if moment == "armed":
                armed = lambda c=converter: c.num_threads() > 1  # noqa: E731 - its watch thread
                wait_for(armed, 60, "the converter armed", 0.005)
            elif moment == "converting":
                wait_for(lambda: "reading the GGUF header" in run.stderr, 60, "converting", 0.01)
            os.kill(run.pid, signal.SIGKILL)
            run.wait(10)
            try:
                wait_for(lambda: not run.leftovers(), GONE_WITHIN, "the launch's processes gone")
            except AssertionError as exc:
                left = [p.pid for p in run.leftovers()]
                raise AssertionError(
                    f"{exc} (SIGKILL at the converter's {moment}): {left}"
                ) from None
