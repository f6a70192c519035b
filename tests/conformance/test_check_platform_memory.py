"""check-platform's rows for the memory factories a launch calls (``get_mha_kv_pool_cls``,
``get_paged_allocator_cls``): pass when a launch would use the class, fail naming why when it
could not. Real platform plugins (``support.memory_plugins``) and the built-in CPU platform."""

from __future__ import annotations

import pytest
from support.memory_plugins import memory_plugins
from test_check_platform import check_platform, row

pytestmark = pytest.mark.e2e


def test_memory_rows_pass_when_a_launch_uses_the_class_and_fail_when_it_cannot(site):
    memory_plugins(site)
    scenarios = [
        (["--json", "--runtime", "srt"], {"SGLANG_PLATFORM": key})
        for key in ("subpool", "stockpool", "badpool")
    ]
    (subpool, stock, bad), result = check_platform(scenarios, sites=[site])
    (cpu,), cpu_result = check_platform([(["--json", "--runtime", "srt"], {})])
    assert cpu["report"]["platform"]["key"] == "builtin:cpu", cpu_result
    pool, paged = "subsystems.get_mha_kv_pool_cls", "subsystems.get_paged_allocator_cls"

    got = row(subpool["report"], pool)
    assert got["status"] == "pass" and ".MarkingPool: a launch uses it" in got["detail"], result
    assert row(subpool["report"], paged)["status"] == "missing", result

    for report in (stock["report"], cpu["report"]):
        got = row(report, pool)
        assert got["status"] == "pass", result
        assert got["detail"] == (
            "serving.srt.mem_cache.memory_pool.MHATokenToKVPool: a launch uses it; it constructs "
            "with SGLang's parameters"
        ), got
        got = row(report, paged)
        assert got["status"] == "pass" and "at --page-size > 1" in got["detail"], got

    got = row(bad["report"], pool)
    assert got["status"] == "fail", result
    assert "a launch would stop (exit 5)" in got["detail"]
    assert "get_mha_kv_pool_cls() returned builtins.dict, which is not a subclass" in got["detail"]
    got = row(bad["report"], paged)
    assert (
        got["status"] == "fail" and "NarrowAllocator, which is not a subclass of" in got["detail"]
    )
    assert "BaseTokenToKVPoolAllocator" in got["detail"], got
