"""An option's one check: ranges (inclusive unless said), finite numbers, integer ceilings,
choices, and flags refused where they would be ignored."""

import pytest

from nmt_cli.config import SearchConfig, TrainConfig
from nmt_cli.options import INT_MAX, check_applies, knob_problem


def test_a_value_is_checked_against_its_range_and_kind():
    assert knob_problem(0.5, {"min": 0.0, "max": 1.0}) is None
    assert knob_problem(1.0, {"min": 0.0, "max": 1.0}) is None  # inclusive
    assert knob_problem(1.0, {"min": 0.0, "max": 1.0, "exclusive_max": True}) == "must be < 1.0"
    assert knob_problem(0.0, {"min": 0.0, "exclusive_min": True}) == "must be > 0.0"
    for value in (float("nan"), float("inf"), float("-inf")):
        assert knob_problem(value, {}) == "must be a finite number"
    assert knob_problem(INT_MAX, {}) is None and knob_problem(INT_MAX + 1, {}) == f"must be <= {INT_MAX}"
    assert knob_problem(2**40, {"max": 2**50}) is None  # an option may allow more
    assert knob_problem("x", {"choices": ("a", "b")}) == "expected one of a, b"
    assert knob_problem(None, {"choices": ("a",), "min": 1}) is None  # unset


def test_the_dataclasses_refuse_what_the_flags_refuse():
    for config, values in [(SearchConfig, {"lenpen": float("nan")}), (SearchConfig, {"max_len_a": float("inf")}),
                           (SearchConfig, {"beam": 10**30}), (SearchConfig, {"seed": 10**25, "sampling": True}),
                           (TrainConfig, {"lr": float("nan")}), (TrainConfig, {"max_time": float("inf")})]:
        with pytest.raises(ValueError, match="must be"):
            config(**values)
    assert SearchConfig(sampling=True, sampling_topp=1.0).sampling_topp == 1.0  # the whole distribution


def test_a_setting_given_where_it_does_not_apply_is_refused():
    check_applies(SearchConfig(sampling=True, seed=3), {"sampling", "seed"})
    with pytest.raises(ValueError, match="seed applies only with --sampling"):
        check_applies(SearchConfig(seed=3), {"seed"}, name=lambda f: f.name)
    check_applies(SearchConfig(seed=3), set())  # not given: a default is never refused
