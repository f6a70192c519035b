"""The supervisor process's own set-up, shared by the CLI and the embedded ``Launcher``.

In the order the spec's call-site table asks: this process's plugins are loaded and their hooks
applied *before* ``ServerArgs`` is looked up and built (so hooks on ``add_cli_args``,
``__post_init__`` and ``check_server_args`` take effect); then the arguments are checked and the
platform is resolved, once. Every failure here becomes a ``LaunchError`` whose root cause says
what to change, with the CLI exit code it maps to.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import hooks
from launchspec.causes import ExitCode, LaunchError, RootCause
from platforms.runtimes import RUNTIMES, runtime_spec

if TYPE_CHECKING:
    from launchspec.server_args import ServerArgs
    from platforms import Selection
    from platforms.vendor import PluginCode

_TRUE = ("1", "true", "yes", "on")  # how platforms reads a boolean variable as set


def peek_runtime(argv: list[str]) -> str:
    """``--runtime`` from a command line, before the full parser exists (default ``srt``)."""
    for i, arg in enumerate(argv):
        if arg == "--runtime" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--runtime="):
            return arg.partition("=")[2]
    return "srt"


def check_runtime(runtime: str) -> None:
    if runtime not in RUNTIMES:
        raise LaunchError(
            RootCause(
                summary=f"unknown runtime {runtime!r}",
                exit_code=ExitCode.USAGE,
                hint=f"pass --runtime {' or --runtime '.join(RUNTIMES)}",
            )
        )


def load_plugins(runtime: str, select: bool = True) -> None:
    """Register and apply this process's general plugins of ``runtime``'s hook group.

    The first step of every launch; it settles the CPU question first (``prefer_cpu_over_base``),
    because plugin loading may already resolve the platform. The platform is then selected, so
    that a selection error is reported as one (exit code 5) before ``ServerArgs``, whose
    ``__post_init__`` applies the platform's defaults, is built. ``select=False`` leaves the
    selection to the caller (the CLI selects after parsing, so ``--help`` probes no device and
    imports no torch).
    """
    check_runtime(runtime)
    install_aliases()
    prefer_cpu_over_base(runtime)
    try:
        hooks.runtime(runtime).apply_plugin_hooks()
    except Exception as exc:  # noqa: BLE001 - any plugin failure is reported the same way
        hint = None
        plugin = getattr(exc, "plugin", None)
        if isinstance(exc, hooks.PluginError) and plugin:
            hint = (
                f"fix or reinstall {exc.distribution}, or start without the plugin on the same "
                f"platform: {hooks.runtime(runtime).without(plugin)}"
            )
        raise _setup_error(
            "a required plugin failed to load in the launcher process", exc, hint=hint
        ) from exc
    if select:
        select_platform(runtime)


def install_aliases() -> bool:
    """Make SGLang's module paths and hook targets resolve to this project's in this process
    (``launchspec.compat``), before any plugin or platform callback imports them; True when they
    are in effect (not where the real ``sglang`` is installed)."""
    from hooks import compat
    from launchspec.compat import TABLE

    return compat.install(TABLE)


def build_args(
    make: Callable[[], ServerArgs], given: Mapping[str, object] | None = None
) -> ServerArgs:
    """``make()`` a ``ServerArgs`` from the fields ``given`` (the parsed command line, or the
    embedded launcher's keywords). Whatever a platform's or a plugin's code raises on the way
    (``apply_server_args_defaults``, a hook on ``__post_init__`` or ``from_cli_args``) is a set-up
    error (exit 5) naming the vendor's class or plugin, with its traceback, whatever its type,
    unless the launch has no model at all (no ``--model-path`` and no embedded default): then it
    is the usage error a launch without a vendor's code gives, since SGLang, whose
    ``--model-path`` is required, never runs platform code without one. Otherwise a complaint
    about a value is a usage error (exit 2), anything else a set-up error."""
    from platforms.vendor import plugin_code

    try:
        return make()
    except Exception as exc:  # noqa: BLE001 - reported with its traceback, never raised raw
        vendor = plugin_code(exc)
        no_model = _no_model(given) if vendor is not None else None
        if vendor is not None and no_model is not None:
            raise usage_error(
                no_model,
                hint=(
                    f"name a model as the error says; {vendor.describe()} raised "
                    f"{type(exc).__name__} ({exc}) only for want of one: SGLang, whose "
                    f"--model-path is required, never runs platform code without it"
                ),
            ) from exc
        if vendor is not None:
            raise _setup_error(
                f"the server arguments could not be built: {vendor.describe()} raised "
                f"{type(exc).__name__}",
                exc,
                hint=_vendor_hint(vendor),
            ) from exc
        if isinstance(exc, (TypeError, ValueError)):
            raise usage_error(exc) from exc
        raise _setup_error("the server arguments could not be built", exc) from exc


def _no_model(given: Mapping[str, object] | None) -> ValueError | None:
    """What ``check_server_args`` says of a launch that names no model and has no embedded
    default for its runtime's own worker (``launchspec.runtimes``' ``model_check``), else None."""
    if given is None or given.get("model_path") not in (None, ""):
        return None
    from launchspec.runtimes import serving_spec
    from launchspec.server_args import ServerArgsError

    try:
        spec = serving_spec(str(given.get("runtime") or "srt"))
    except ValueError:
        return None
    if given.get("scheduler_target") not in (None, spec.worker_target):
        return None  # another engine's worker checks its own model
    try:
        spec.model_check(None, None)
    except ValueError as exc:
        return ServerArgsError([str(exc)])
    return None


def _vendor_hint(vendor: PluginCode) -> str:
    """What to do about a vendor's code that raised: report it, or start without it."""
    ep = vendor.entry_point
    dist = vendor.distribution or "that package"
    report = f"report it to the maintainers of {dist} (the traceback shows where)"
    spec = next(
        (
            s
            for s in RUNTIMES.values()
            if ep is not None and ep.group in (s.platform_group, s.plugin_group)
        ),
        None,
    )
    if ep is None or spec is None:
        return f"this is a plugin's code, not a bad command line: {report}"
    if vendor.platform_class or ep.group == spec.platform_group:
        return (
            f"this is the platform's code, not a bad command line: {report}, or select another "
            f"platform with {spec.selector_env}"
        )
    return (
        f"this is plugin {ep.name!r}'s code, not a bad command line: {report}, or start without "
        f"it: {hooks.runtime(spec.name).without(ep.name)}"
    )


def prefer_cpu_over_base(runtime: str) -> None:
    """Serve on the CPU platform where SRT selection would end at the bare base platform, which
    cannot run a model (``platforms.use_serving_fallback``); every other branch of the spec's
    chart is unchanged."""
    importlib.import_module(runtime_spec(runtime).platform_module).use_serving_fallback()


def server_args_class() -> type[ServerArgs]:
    """The ``ServerArgs`` class as it is after hooks (a REPLACE hook may have swapped it)."""
    cls: type[ServerArgs] = importlib.import_module("launchspec.server_args").ServerArgs
    return cls


def check_args(args: ServerArgs) -> None:
    """Run ``check_server_args`` (a hook target); a complaint becomes a usage ``LaunchError``."""
    try:
        args.check_server_args()
    except (ValueError, TypeError) as exc:
        raise usage_error(exc) from exc


def finish(args: ServerArgs) -> tuple[Selection, bytes]:
    """Check ``args`` (and that the HTTP port is free), resolve the platform once, encode the
    payload: ``(selection, payload)``. The API key is resolved first (``launcher.supervisor.secrets``)."""
    from launcher.supervisor.secrets import ApiKeyError, resolve_api_key

    try:
        resolve_api_key(args)
    except ApiKeyError as exc:
        raise usage_error(exc) from exc
    check_args(args)
    check_port(args)
    selection = select_platform(args.runtime)
    check_quantization(args)
    try:
        payload = importlib.import_module("launchspec.server_args").encode_server_args(args)
    except (TypeError, ValueError) as exc:
        raise usage_error(exc) from exc
    return selection, payload


def check_quantization(args: ServerArgs) -> None:
    """A weight scheme the flags name that the runtime or the selected platform refuses is a
    usage error (exit 2) before any worker starts, naming what is supported
    (``launchspec.quantization.resolve``, which every scheduler runs again)."""
    quantization = getattr(args, "quantization", None)
    torchao_config = getattr(args, "torchao_config", None)
    if args.runtime != "srt" or not (quantization or torchao_config):
        return
    import platforms
    from launchspec.model_source import resolve_model
    from launchspec.quantization import QuantizationError, resolve

    try:
        gguf_file = resolve_model(args.model_path, args.served_model_name).gguf is not None
    except ValueError:
        gguf_file = False  # check_server_args has said what is wrong with the path
    try:
        resolve(platforms.current_platform, quantization, torchao_config, gguf_file=gguf_file)
    except QuantizationError as exc:
        raise usage_error(exc) from exc


def check_port(args: ServerArgs) -> None:
    """Fail with a usage error (exit 2) when this node would run the HTTP worker and
    ``--host``:``--port`` cannot be bound now: taken by another process, not an address of this
    machine, or a privileged port. The address is bound the way the HTTP server binds it
    (``SO_REUSEADDR``) and released at once, so this is a probe: the worker binds it again."""
    import errno
    import socket

    if args.node_rank != 0 or not args.http_target:
        return
    host, port = args.host, args.port
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        raise _port_error(
            f"--host {host!r} cannot be resolved ({exc})",
            "pass --host an address of this machine, such as 127.0.0.1 or 0.0.0.0",
        ) from exc
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                holder = _port_holder(port)
                raise _port_error(
                    f"--port {port} is already in use on {host}{holder}",
                    f"pass --port N with a free port, or stop the process that holds {port}",
                ) from exc
            if exc.errno == errno.EACCES:
                raise _port_error(
                    f"--port {port} on {host} needs privileges this process lacks ({exc.strerror})",
                    "pass --port N with a port above 1023",
                ) from exc
            if exc.errno == errno.EADDRNOTAVAIL:
                raise _port_error(
                    f"--host {host!r} is not an address of this machine",
                    "pass --host an address of this machine, such as 127.0.0.1 or 0.0.0.0",
                ) from exc
            raise _port_error(
                f"--host {host!r} --port {port} cannot be bound ({exc})",
                "pass --host and --port an address and a free port of this machine",
            ) from exc


def _port_holder(port: int) -> str:
    """`` (held by pid N: NAME)`` when this user may see who listens on ``port``, else ``""``."""
    try:
        import psutil

        for conn in psutil.net_connections(kind="tcp"):
            if (
                conn.status == psutil.CONN_LISTEN
                and conn.laddr
                and conn.laddr.port == port
                and conn.pid
            ):
                return f" (held by pid {conn.pid}: {psutil.Process(conn.pid).name()})"
    except Exception:  # noqa: BLE001 - naming the holder is a courtesy, never a new failure
        pass
    return ""


def _port_error(problem: str, fix: str) -> LaunchError:
    return LaunchError(
        RootCause(
            summary="the HTTP port cannot be used",
            exit_code=ExitCode.USAGE,
            message=problem,
            hint=fix,
        )
    )


def usage_error(exc: BaseException, hint: str | None = None) -> LaunchError:
    """An invalid command line or server arguments (exit code 2): ``exc``'s message, and
    ``hint`` when the fix needs more than the message says."""
    return LaunchError(
        RootCause(
            summary="invalid server arguments",
            exit_code=ExitCode.USAGE,
            error_type=type(exc).__name__,
            message=str(exc),
            hint=hint,
        )
    )


def select_platform(runtime: str) -> Selection:
    """Resolve ``runtime``'s platform once, construct it (so a plugin class that is not ``OOT``,
    names no device or cannot be built fails here, before any worker starts), and return its
    ``Selection``."""
    module = importlib.import_module(runtime_spec(runtime).platform_module)
    plugins = hooks.runtime(runtime)  # the one path, shared with ``sglang-launch plugins``
    try:
        selection: Selection = plugins.selection()
        plugins.construct_platform()
        return selection
    except Exception as exc:  # noqa: BLE001 - selection errors already name their fix
        plain = isinstance(exc, module.PlatformSelectionError) and exc.__cause__ is None
        raise _setup_error("no platform could be selected", exc, plain=plain) from exc


def is_cpu_fallback(selection: Selection) -> bool:
    """True when no plugin was selected and detection fell back to the CPU platform, which
    nothing asked for (SRT's ``SGLANG_USE_CPU_ENGINE=1`` chooses the CPU: no fallback then)."""
    if not (
        selection.entry_point is None
        and selection.key == "builtin:cpu"
        and selection.reason.startswith("fallback")
    ):
        return False
    cpu = runtime_spec(selection.runtime).builtin(selection.name)
    flag = cpu.env_flag if cpu is not None else None
    return not (flag and os.environ.get(flag, "").strip().lower() in _TRUE)


def _setup_error(
    summary: str, exc: BaseException, plain: bool = False, hint: str | None = None
) -> LaunchError:
    """A set-up failure (exit code 5). ``plain``: the message is the whole story (a selection
    error that already names what was found and what to set), so no traceback and no hint."""
    import traceback

    return LaunchError(
        RootCause(
            summary=summary,
            exit_code=ExitCode.SETUP_FAILED,
            error_type=type(exc).__name__,
            message=str(exc),
            traceback=None if plain else "".join(traceback.format_exception(exc)),
            hint=None
            if plain
            else hint
            or (
                "fix or uninstall the plugin named above, or select another with SGLANG_PLATFORM / SGLANG_PLUGINS"
            ),
        )
    )
