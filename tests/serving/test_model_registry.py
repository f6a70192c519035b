"""Out-of-tree models: SGLang's ``ModelRegistry`` here, on real packages written to disk.

``register`` records a package and imports nothing (plugin callbacks run in the torch-free
launcher too); asking for a class imports every registered package once, in order, and takes
each module's ``EntryClass`` (a class or a list) by class name; a clash without ``overwrite`` is
an error naming the architecture, a module that fails to import is skipped unless ``strict``.
The runtime's contract checks refuse a class written for SGLang's model runner, and a class
that is not a ``PreTrainedModel``, with messages that say so.
"""

from __future__ import annotations

import sys
import textwrap

import pytest
from support import run_python

from launchspec.model_registry import _ModelRegistry


@pytest.fixture
def vendor(tmp_path, monkeypatch):
    """A folder on ``sys.path``: ``write(package, {module: source})`` makes a package there."""
    monkeypatch.syspath_prepend(str(tmp_path))
    created: list[str] = []

    def write(package: str, modules: dict[str, str]) -> str:
        root = tmp_path.joinpath(*package.split("."))
        root.mkdir(parents=True, exist_ok=True)
        parts = package.split(".")
        for i in range(1, len(parts) + 1):
            init = tmp_path.joinpath(*parts[:i], "__init__.py")
            if not init.exists():
                init.write_text("")
        for name, source in modules.items():
            (root / f"{name}.py").write_text(textwrap.dedent(source))
        created.append(parts[0])
        return package

    yield write
    for top in created:
        for name in [m for m in sys.modules if m == top or m.startswith(top + ".")]:
            del sys.modules[name]


def test_register_imports_nothing_until_a_class_is_asked_for(vendor):
    package = vendor(
        "vend_a.models",
        {
            "one": "class OneForCausalLM: pass\nEntryClass = OneForCausalLM\n",
            "two": "class TwoModel: pass\nclass TwoForCausalLM: pass\nEntryClass = [TwoModel, TwoForCausalLM]\n",
            "helpers": "X = 1\n",  # no EntryClass: not a model module
        },
    )
    registry = _ModelRegistry()
    registry.register(package)
    assert "vend_a.models.one" not in sys.modules and registry.packages() == [package]
    assert registry.find("TwoForCausalLM").__name__ == "TwoForCausalLM"
    assert sorted(registry.get_supported_archs()) == [
        "OneForCausalLM",
        "TwoForCausalLM",
        "TwoModel",
    ]
    cls, arch = registry.resolve_model_cls(["LlamaForCausalLM", "OneForCausalLM"])
    assert (cls.__name__, arch) == ("OneForCausalLM", "OneForCausalLM")
    assert registry.find("LlamaForCausalLM") is None  # transformers serves it
    with pytest.raises(ValueError, match="are not registered"):
        registry.resolve_model_cls("LlamaForCausalLM")


def test_a_second_class_for_an_architecture_needs_overwrite(vendor):
    first = vendor(
        "vend_b.first", {"m": "class SameForCausalLM: pass\nEntryClass = SameForCausalLM\n"}
    )
    second = vendor(
        "vend_b.second", {"m": "class SameForCausalLM: pass\nEntryClass = SameForCausalLM\n"}
    )
    registry = _ModelRegistry()
    registry.register(first)
    registry.register(second)
    with pytest.raises(ValueError, match="SameForCausalLM is already registered.*overwrite=True"):
        registry.load()
    registry = _ModelRegistry()
    registry.register(first)
    registry.register(second, overwrite=True)
    assert registry.find("SameForCausalLM").__module__ == "vend_b.second.m"


def test_a_module_that_fails_to_import_is_skipped_unless_strict(vendor, caplog):
    package = vendor(
        "vend_c.models",
        {
            "good": "class GoodForCausalLM: pass\nEntryClass = GoodForCausalLM\n",
            "sglang_only": "from sglang.srt.layers.linear import RowParallelLinear\n",
        },
    )
    registry = _ModelRegistry()
    registry.register(package)
    with caplog.at_level("WARNING", logger="sglang_launch.models"):
        assert registry.find("GoodForCausalLM") is not None
    assert "vend_c.models.sglang_only skipped" in caplog.text
    strict = _ModelRegistry()
    strict.register(package, strict=True)
    with pytest.raises(ImportError):
        strict.load()


def test_entry_class_must_hold_classes_and_names_are_one_per_package(vendor):
    bad = vendor("vend_d.bad", {"m": "EntryClass = 'NotAClass'\n"})
    registry = _ModelRegistry()
    registry.register(bad)
    with pytest.raises(ValueError, match="not a class"):
        registry.load()
    twice = vendor(
        "vend_d.twice",
        {
            "a": "class DupForCausalLM: pass\nEntryClass = DupForCausalLM\n",
            "b": "class DupForCausalLM: pass\nEntryClass = DupForCausalLM\n",
        },
    )
    registry = _ModelRegistry()
    registry.register(twice)
    with pytest.raises(ValueError, match="two model classes named DupForCausalLM"):
        registry.load()


def test_a_bad_package_name_is_refused_at_register():
    with pytest.raises(TypeError, match="package name"):
        _ModelRegistry().register("  ")


def test_sglangs_module_path_is_the_import_light_registry():
    """In a launcher-like process: SGLang's import path is this registry, registering imports
    neither the vendor's package nor torch."""
    result = run_python(
        """
        import json, sys
        from launcher.prepare import install_aliases
        assert install_aliases()
        from sglang.srt.models.registry import ModelRegistry
        import launchspec.model_registry as ours
        ModelRegistry.register("a_vendor_package_that_is_not_installed.models", overwrite=True)
        print("RESULT:" + json.dumps({
            "same": ModelRegistry is ours.ModelRegistry,
            "packages": ModelRegistry.packages(),
            "torch": "torch" in sys.modules,
        }))
        """
    )
    assert result.data == {
        "same": True,
        "packages": ["a_vendor_package_that_is_not_installed.models"],
        "torch": False,
    }, result
