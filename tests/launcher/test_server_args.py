"""ServerArgs: command line, platform defaults, checks, hooks, and the versioned payload.

Building a ``ServerArgs`` resolves the platform (``__post_init__`` asks it for defaults), a
process-wide choice, so those tests run in ``fresh_process`` (``hooks.testing``): nothing selected
and no plugin loaded when each starts, everything restored when it ends. The payload codec is
tested on plain dataclasses, which touch no platform.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io

import msgspec
import pytest
from support import make_dist

import hooks
from bootstrap.payload import FORMAT, VERSION, PayloadError, decode_payload, encode_payload
from launchspec.server_args import ServerArgs, ServerArgsError


@pytest.fixture
def cpu_only(fresh_process, monkeypatch):
    """The platform these tests' ServerArgs resolve: the CPU one, without probing for
    accelerators (selection has tests of its own)."""
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    monkeypatch.setenv("SGLANG_DIFFUSION_PLATFORM_OVERRIDE", "cpu")


# ---------------------------------------------------------------------------------------------
# Command line and checks (ServerArgs resolves the platform).
# ---------------------------------------------------------------------------------------------
def test_durations_must_be_finite_numbers():
    """``--stop-grace-period inf`` (or nan) is a usage error, not a worker crashing on it later."""
    for field in ("stop_grace_period", "startup_timeout", "watchdog_timeout", "restart_backoff"):
        for value in (float("inf"), float("nan"), float("-inf")):
            found = _problems(**{field: value})
            assert found is not None, (field, value)
            flag = "--" + field.replace("_", "-")
            assert f"{flag} {value} is not a finite number" in found["text"], found


@pytest.mark.usefixtures("cpu_only")
def test_command_line_round_trip_help_and_bad_values():
    parser = ServerArgs.add_cli_args(argparse.ArgumentParser(prog="sglang-launch"))
    command_line = (
        "--model-path /models/tiny --port 8123 --tp-size 2 --dp-size 2 --startup-timeout 12.5 "
        "--trust-remote-code --log-level debug --runtime diffusion --api-key s3cret"
    )
    ns = parser.parse_args(command_line.split())
    parsed = ServerArgs.from_cli_args(ns)
    defaults = ServerArgs.from_cli_args(parser.parse_args([]))
    help_text = parser.format_help()
    flags = ["--" + f.name.replace("_", "-") for f in dataclasses.fields(ServerArgs)]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as bad_choice:
        parser.parse_args(["--log-level", "loud"])

    args = dataclasses.asdict(parsed)
    assert args["model_path"] == "/models/tiny" and args["port"] == 8123
    assert (args["tp_size"], args["dp_size"]) == (2, 2)
    assert args["startup_timeout"] == 12.5 and args["trust_remote_code"] is True
    assert (args["log_level"], args["runtime"], args["api_key"]) == ("debug", "diffusion", "s3cret")
    assert defaults == ServerArgs()
    assert [f for f in flags if f not in help_text] == []
    assert (
        bad_choice.value.code == 2 and "--log-level" in err.getvalue() and "loud" in err.getvalue()
    )
    assert "s3cret" not in repr(parsed)


def _problems(**fields) -> dict | None:
    """``ServerArgs(**fields).check_server_args()``'s complaint (text and problems), or None."""
    try:
        ServerArgs(**fields).check_server_args()
    except ServerArgsError as exc:
        return {"text": str(exc), "problems": exc.problems}
    return None


@pytest.mark.usefixtures("cpu_only")
def test_check_server_args_lists_every_problem_with_what_to_change():
    ServerArgs().check_server_args()  # the defaults are valid
    # (another engine's scheduler: the model is not checked against --tp-size 2)
    ServerArgs(
        nnodes=2,
        tp_size=2,
        dist_init_addr="10.0.0.1:5000",
        node_rank=1,
        scheduler_target="other_engine.run",
    ).check_server_args()
    ServerArgs(http_target="").check_server_args()  # no HTTP worker
    many = _problems(
        port=70000,
        tp_size=0,
        nnodes=2,
        node_rank=3,
        max_input_tokens=512,
        max_total_tokens=10,
        stop_grace_period=-1,
        scheduler_target="not a path",
        http_target="x y",
    )
    assert many is not None
    text = many["text"]
    assert text.startswith("invalid server arguments:")
    assert len(many["problems"]) >= 6  # all at once, not one per attempt
    for needle in (
        "--port 70000",
        "1..65535",
        "--tp-size 0 must be at least 1",
        "--node-rank 3 must be in 0..1",
        "--nnodes 2 needs --dist-init-addr HOST:PORT",
        "--max-total-tokens 10 is below --max-input-tokens",
        "--stop-grace-period -1",
        "--scheduler-target 'not a path'",
        "--http-target 'x y' is not a dotted path; use package.module.function (or '' for no HTTP worker)",
    ):
        assert needle in text, needle
    addr = _problems(dist_init_addr="nohost")
    assert addr is not None and "HOST:PORT" in addr["text"]
    types = _problems(port="8000", trust_remote_code="yes")
    assert types is not None
    assert "--port must be an int, got '8000' (str)" in types["text"]
    assert "--trust-remote-code must be a bool" in types["text"]
    # The embedded embedding model is a BERT encoder.
    encoder_problems = _problems(model_path="all-MiniLM-L6-v2", tp_size=2, dp_size=3)
    assert encoder_problems is not None
    encoder = encoder_problems["problems"]
    assert len(encoder) == 1 and "--tp-size 2 needs a causal LM" in encoder[0], encoder
    assert "BertModel encoder (its config.json says so)" in encoder[0], encoder
    assert encoder[0].endswith("serve it with --tp-size 1 and scale out with --dp-size 6"), encoder


@pytest.mark.usefixtures("cpu_only")
def test_cfg_parallel_makes_each_diffusion_replica_two_ranks_and_is_refused_elsewhere():
    from launcher.supervisor.plan import Endpoints, plan_children

    def problems(**fields) -> list[str]:
        complaint = _problems(**fields)
        return complaint["problems"] if complaint else []

    other = "other_engine.run"  # skips the model check: no pipeline on disk here
    args = ServerArgs(
        runtime="diffusion", enable_cfg_parallel=True, dp_size=2, scheduler_target=other
    )
    args.check_server_args()
    specs = plan_children(
        args,
        payload=b"",
        platform_key="cpu",
        runtime="diffusion",
        endpoints=Endpoints("", "ipc://s", "ipc://o", "ipc://q"),
    )
    assert [args.replica_ranks(), ServerArgs().replica_ranks()] == [2, 1]
    # Two replicas of two ranks: rank r is replica r // 2, its tp_rank r % 2.
    assert [[s.role, s.rank, s.tp_size, s.world_size] for s in specs] == [["http", 0, 2, 4]] + [
        ["scheduler", r, 2, 4] for r in range(4)
    ]
    assert problems(enable_cfg_parallel=True) == [
        "--enable-cfg-parallel splits the classifier-free guidance of --runtime diffusion; "
        "--runtime srt has none: drop the flag (--tp-size splits its models)"
    ]
    nodes = problems(
        runtime="diffusion",
        enable_cfg_parallel=True,
        nnodes=2,
        dist_init_addr="10.0.0.1:5000",
        scheduler_target=other,
    )
    assert nodes == [
        "--enable-cfg-parallel keeps both ranks of a replica on one node, not --nnodes 2; "
        "serve on one node (scale with --dp-size)"
    ]
    tp = problems(runtime="diffusion", tp_size=2, scheduler_target=other)
    assert len(tp) == 1 and "(or --enable-cfg-parallel for two ranks per replica)" in tp[0]


@pytest.mark.usefixtures("fresh_process")
def test_post_init_applies_the_selected_platforms_defaults_for_each_runtime(site):
    make_dist(
        site,
        "tidy-platform",
        {
            "sglang.srt.platforms": {"tidy": "tidy_platform:activate"},
            "sglang.multimodal_gen.platforms": {"tidy": "tidy_platform:activate_diffusion"},
        },
        {
            "tidy_platform/__init__.py": """
                import os

                def activate():
                    return "tidy_platform.srt.TidySRT"

                def activate_diffusion():
                    return "tidy_platform.diffusion.TidyDiffusion"
            """,
            "tidy_platform/srt.py": """
                from platforms import PlatformEnum, SRTPlatform

                class TidySRT(SRTPlatform):
                    _enum = PlatformEnum.OOT
                    device_name = "tidy"
                    device_type = "cpu"

                    def apply_server_args_defaults(self, server_args):
                        if server_args.attention_backend is None:
                            server_args.attention_backend = "tidy_attention"
                        if server_args.device is None:
                            server_args.device = "cpu"
            """,
            "tidy_platform/diffusion.py": """
                from platforms.diffusion import Platform, PlatformEnum

                class TidyDiffusion(Platform):
                    _enum = PlatformEnum.OOT
                    device_name = "tidy"
                    device_type = "cpu"

                    def apply_server_args_defaults(self, server_args):
                        server_args.attention_backend = "tidy_diffusion_attention"
            """,
        },
    )
    srt = ServerArgs()
    explicit = ServerArgs(attention_backend="mine")
    diffusion = ServerArgs(runtime="diffusion")
    assert [
        srt.attention_backend,
        srt.device,
        explicit.attention_backend,
        diffusion.attention_backend,
    ] == ["tidy_attention", "cpu", "mine", "tidy_diffusion_attention"]


@pytest.mark.usefixtures("cpu_only")
def test_server_args_hooks_add_options_change_defaults_and_relax_checks(site):
    make_dist(
        site,
        "args-tweaks",
        {"sglang.srt.plugins": {"tweaks": "args_tweaks:register"}},
        {
            "args_tweaks/__init__.py": """
                from hooks import HookRegistry, HookType

                def add_flag(result, *args, **kwargs):
                    parser = args[-1] if args else kwargs["parser"]
                    parser.add_argument("--tweak-level", type=int, default=1)

                def post_init(result, self):
                    if self.served_model_name is None:
                        self.served_model_name = "tweaked"

                def relaxed_check(original, self):
                    if self.port == 1:  # this plugin allows port 1 for its odd deployment
                        return None
                    return original(self)

                def register():
                    T = "launchspec.server_args.ServerArgs"
                    HookRegistry.register(T + ".add_cli_args", add_flag, HookType.AFTER)
                    HookRegistry.register(T + ".__post_init__", post_init, HookType.AFTER)
                    HookRegistry.register(T + ".check_server_args", relaxed_check, HookType.AROUND)
            """
        },
    )
    hooks.load_plugins()  # before ServerArgs is built, as the spec's call-site table says
    from launchspec.server_args import ServerArgs as HookedArgs  # the class as hooks left it

    parser = HookedArgs.add_cli_args(argparse.ArgumentParser())
    ns = parser.parse_args(["--tweak-level", "3", "--port", "1"])
    args = HookedArgs.from_cli_args(ns)
    args.check_server_args()
    assert [ns.tweak_level, args.served_model_name, args.port] == [3, "tweaked", 1]
    with pytest.raises(ServerArgsError):
        HookedArgs(port=0).check_server_args()  # still checked


# ---------------------------------------------------------------------------------------------
# The payload codec (plain dataclasses: no platform involved).
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Settings:
    name: str = "x"
    port: int = 1
    ratio: float = 0.5
    tags: list = dataclasses.field(default_factory=list)
    post_init_runs: int = 0

    def __post_init__(self):
        self.post_init_runs += 1


@dataclasses.dataclass
class SettingsV2(Settings):
    extra: str = "new"


@dataclasses.dataclass
class NeedsValue:
    required: str


def test_payload_round_trip_keeps_values_and_does_not_rerun_post_init():
    original = Settings(name="a", port=9, ratio=1.25, tags=["t"])
    assert original.post_init_runs == 1
    back = decode_payload(encode_payload(original), Settings)
    assert back == original and back.post_init_runs == 1
    # A class with more fields (e.g. a plugin's REPLACE in the child) fills them from defaults.
    wider = decode_payload(encode_payload(original), SettingsV2)
    assert isinstance(wider, SettingsV2) and wider.extra == "new" and wider.port == 9


def test_bad_payloads_are_clear_errors():
    good = encode_payload(Settings())
    with pytest.raises(PayloadError, match="corrupt.*unmodified bytes"):
        decode_payload(good[:-4], Settings)
    with pytest.raises(PayloadError, match="not a ServerArgs payload"):
        decode_payload(msgspec.msgpack.encode([1, 2, 3]), Settings)
    doc = msgspec.msgpack.decode(good)
    assert (doc["format"], doc["version"]) == (FORMAT, VERSION)
    doc["version"] = VERSION + 1
    with pytest.raises(PayloadError, match=f"version {VERSION + 1}.*same environment"):
        decode_payload(msgspec.msgpack.encode(doc), Settings)
    with pytest.raises(PayloadError, match="fields extra .*same plugins"):
        decode_payload(encode_payload(SettingsV2()), Settings)
    doc = msgspec.msgpack.decode(encode_payload(NeedsValue("v")))
    doc["fields"] = {}
    with pytest.raises(PayloadError, match="required field 'required'"):
        decode_payload(msgspec.msgpack.encode(doc), NeedsValue)
    with pytest.raises(TypeError, match=r"fields tags \(object\) cannot be sent"):
        encode_payload(Settings(tags=object()))


def test_decode_server_args_looks_the_class_up_when_called():
    # A REPLACE hook swaps the module attribute; decode must use what is there at call time.
    # (This rebinds the attribute the way HookRegistry does and restores it; no platform is touched
    # because decoding does not run __post_init__.)
    import launchspec.server_args as module

    original = module.ServerArgs

    @dataclasses.dataclass
    class Replaced(original):
        plugin_flag: bool = True

    payload = msgspec.msgpack.encode(
        {"format": FORMAT, "version": VERSION, "class": "x", "fields": {"port": 4321}}
    )
    module.ServerArgs = Replaced
    try:
        args = module.decode_server_args(payload)
    finally:
        module.ServerArgs = original
    assert type(args) is Replaced and args.port == 4321 and args.plugin_flag is True
