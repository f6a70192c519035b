"""Hook call overhead, side by side with pluggy (pytest's plugin library), in one run.

    .venv/bin/python benchmarks/hooks.py [--number N] [--repeat R]

Prints nanoseconds per call of: a bare function; the same function behind one BEFORE, one AFTER,
one AROUND and one REPLACE hook applied by ``hooks``; the replacement function called directly;
pluggy with one implementation, and with one wrapper plus one implementation. Then each hook's
ratio to pluggy's one-implementation call (target: at most 0.12) and REPLACE's ratio to calling
its replacement directly (target: at most 1.0, within timing noise). Every figure is the best of
``repeat`` timings of ``number`` calls, interleaved case by case in the same process. The hooks
do what a plugin typically does and no more: look at the arguments and leave them be, keep the
result, call the original. Exit status 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import sys
import timeit
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TARGET_RATIO = 0.12


def _module():
    """A real module with one target function per hook type, all the same function."""
    mod = types.ModuleType("hooks_bench_target")
    source = "def work(request, scale=1):\n    return request\n"
    for name in ("bare", "before", "after", "around", "replace"):
        exec(source.replace("work", name), mod.__dict__)  # noqa: S102 - our own source
    sys.modules[mod.__name__] = mod
    return mod


def _hooked(mod):
    from hooks._core import HookType, Registry

    registry = Registry("benchmark")

    def before(request, scale=1):
        return None

    def after(result, request, scale=1):
        return None

    def around(original_fn, request, scale=1):
        return original_fn(request, scale)

    def replacement(request, scale=1):
        return request

    registry.register("hooks_bench_target.before", before, HookType.BEFORE)
    registry.register("hooks_bench_target.after", after, HookType.AFTER)
    registry.register("hooks_bench_target.around", around, HookType.AROUND)
    registry.register("hooks_bench_target.replace", replacement, HookType.REPLACE)
    registry.apply_hooks()
    return replacement


def _pluggy():
    import pluggy

    spec = pluggy.HookspecMarker("bench")
    impl = pluggy.HookimplMarker("bench")

    class Spec:
        @spec
        def work(self, request):
            """the hook"""

    class Impl:
        @impl
        def work(self, request):
            return request

    class Wrapper:
        @impl(wrapper=True)
        def work(self, request):
            return (yield)

    one = pluggy.PluginManager("bench")
    one.add_hookspecs(Spec)
    one.register(Impl())
    two = pluggy.PluginManager("bench")
    two.add_hookspecs(Spec)
    two.register(Impl())
    two.register(Wrapper())
    return one.hook.work, two.hook.work


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--number", type=int, default=500_000, help="calls per timing")
    parser.add_argument("--repeat", type=int, default=7, help="timings per figure (best is kept)")
    args = parser.parse_args(argv)

    mod = _module()
    replacement = _hooked(mod)
    pluggy_one, pluggy_wrapped = _pluggy()
    arg = {"prompt": "hello"}
    cases = {
        "bare function": ("f(arg)", mod.bare),
        "BEFORE hook": ("f(arg)", mod.before),
        "AFTER hook": ("f(arg)", mod.after),
        "AROUND hook": ("f(arg)", mod.around),
        "REPLACE hook": ("f(arg)", mod.replace),
        "replacement called directly": ("f(arg)", replacement),
        "pluggy, 1 implementation": ("f(request=arg)", pluggy_one),
        "pluggy, 1 wrapper + 1 implementation": ("f(request=arg)", pluggy_wrapped),
    }
    timers = {
        label: timeit.Timer(stmt, globals={"f": func, "arg": arg})
        for label, (stmt, func) in cases.items()
    }
    ns = {label: float("inf") for label in cases}
    for _ in range(
        args.repeat
    ):  # interleaved, so a slow moment of the machine hits every case alike
        for label, timer in timers.items():
            ns[label] = min(ns[label], timer.timeit(args.number) / args.number * 1e9)

    print(f"Python {sys.version.split()[0]}, best of {args.repeat} x {args.number} calls")
    print()
    width = max(map(len, ns))
    for label, value in ns.items():
        print(f"  {label:<{width}}  {value:8.1f} ns/call")
    print()
    base = ns["pluggy, 1 implementation"]
    ok = True
    print(f"ratio to pluggy's one-implementation call (target <= {TARGET_RATIO}):")
    for label in ("BEFORE hook", "AFTER hook", "AROUND hook", "REPLACE hook"):
        ratio = ns[label] / base
        ok &= ratio <= TARGET_RATIO
        print(
            f"  {label:<{width}}  {ratio:6.3f}x  {'ok' if ratio <= TARGET_RATIO else 'OVER TARGET'}"
        )
    replace_ratio = ns["REPLACE hook"] / ns["replacement called directly"]
    print()
    print(
        f"REPLACE vs calling the replacement directly: {replace_ratio:.3f}x "
        f"({'same object' if mod.replace is replacement else 'wrapped'})"
    )
    print(
        f"pluggy wrapper+implementation vs one implementation: "
        f"{ns['pluggy, 1 wrapper + 1 implementation'] / base:.2f}x"
    )
    return 0 if ok and mod.replace is replacement else 1


if __name__ == "__main__":
    sys.exit(main())
