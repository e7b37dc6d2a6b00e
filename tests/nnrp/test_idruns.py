"""IdRuns: a set of ids as disjoint runs, checked against a plain set."""

from __future__ import annotations

from hypothesis import given, strategies as st

from gateway.nnrp._idruns import IdRuns


@given(st.lists(st.integers(min_value=0, max_value=60), max_size=80))
def test_behaves_like_a_set(values: list[int]) -> None:
    runs, reference = IdRuns(), set()
    for value in values:
        runs.add(value)
        reference.add(value)
        assert all((probe in runs) == (probe in reference) for probe in range(-1, 62))
    # Runs are maximal: one per gap-separated group of the reference set.
    groups = sum(1 for v in reference if v - 1 not in reference)
    assert runs.runs == groups


def test_counting_ids_cost_one_run() -> None:
    runs = IdRuns()
    for value in range(1, 100_001):
        runs.add(value)
    assert runs.runs == 1
    assert 1 in runs and 100_000 in runs and 100_001 not in runs and 0 not in runs


def test_non_integers_are_never_members() -> None:
    runs = IdRuns()
    runs.add(1)
    assert "1" not in runs
