import pytest

from ibtmpi import threads


@pytest.mark.parametrize("ranks,cores,node,expect", [
    (1, 2, 2, 2), (2, 2, 2, 1), (3, 2, 2, 1), (4, 16, 16, 4),
    (5, 16, 16, 3), (4, 1, 8, 1), (2, 4, 16, 4),
])
def test_default_threads(ranks, cores, node, expect):
    assert threads.default_threads(ranks, cores, node) == expect


def test_configure_limits_blas():
    assert threads.configure(1, ranks_on_node=1) == 1
    assert threads.current_blas_threads() == 1
    n = threads.configure("auto", ranks_on_node=1)
    assert n == threads.default_threads(1)
    with pytest.raises(ValueError):
        threads.configure(-1)
