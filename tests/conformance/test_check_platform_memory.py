"""check-platform's rows for the memory factories a launch calls (``get_mha_kv_pool_cls``,
``get_paged_allocator_cls``): pass when a launch would use the class, fail naming why when it
could not. Real platform plugins (``support.memory_plugins``); the built-in CPU platform's rows are
checked by ``test_check_platform``'s CPU test, on the same command."""

from __future__ import annotations

import pytest
from support.memory_plugins import memory_plugins
from test_check_platform import assert_stock_memory_rows, check_platform, row

pytestmark = pytest.mark.e2e


def test_memory_rows_pass_when_a_launch_uses_the_class_and_fail_when_it_cannot(site):
    memory_plugins(site)
    scenarios = [
        (["--json", "--runtime", "srt"], {"SGLANG_PLATFORM": key})
        for key in ("subpool", "stockpool", "badpool")
    ]
    (subpool, stock, bad), result = check_platform(scenarios, sites=[site])
    pool, paged = "subsystems.get_mha_kv_pool_cls", "subsystems.get_paged_allocator_cls"

    got = row(subpool["report"], pool)
    assert got["status"] == "pass" and ".MarkingPool: a launch uses it" in got["detail"], result
    assert row(subpool["report"], paged)["status"] == "missing", result

    assert_stock_memory_rows(stock["report"])

    got = row(bad["report"], pool)
    assert got["status"] == "fail", result
    assert "a launch would stop (exit 5)" in got["detail"]
    assert "get_mha_kv_pool_cls() returned builtins.dict, which is not a subclass" in got["detail"]
    got = row(bad["report"], paged)
    assert (
        got["status"] == "fail" and "NarrowAllocator, which is not a subclass of" in got["detail"]
    )
    assert "BaseTokenToKVPoolAllocator" in got["detail"], got
