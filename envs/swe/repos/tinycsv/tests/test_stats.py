import pytest

from tinycsv import mean, median, percentile, stdev


def test_mean_ignores_none():
    """Missing values are ignored."""
    assert mean([1, None, 2, 6]) == 3


def test_mean_empty():
    """The mean of nothing is an error."""
    with pytest.raises(ValueError):
        mean([None])


def test_median_odd():
    """The median of an odd count is the middle value."""
    assert median([5, 1, 3]) == 3


def test_median_even():
    """The median of an even count averages the middle values."""
    assert median([4, 1, 3, 2]) == 2.5


def test_percentile_bounds():
    """The 0th and 100th percentiles are the minimum and maximum."""
    assert (percentile([3, 1, 2], 0), percentile([3, 1, 2], 100)) == (1, 3)


def test_percentile_interpolates():
    """Percentiles between ranks are interpolated."""
    assert percentile([10, 20, 30, 40], 50) == 25


def test_percentile_out_of_range():
    """p must be between 0 and 100."""
    with pytest.raises(ValueError):
        percentile([1, 2], 101)


def test_stdev_sample():
    """The sample standard deviation divides by n - 1."""
    assert stdev([2, 4, 4, 4, 5, 5, 7, 9]) == pytest.approx(2.138, abs=1e-3)


def test_stdev_population():
    """The population standard deviation divides by n."""
    assert stdev([2, 4, 4, 4, 5, 5, 7, 9], sample=False) == 2


def test_stdev_needs_two_values():
    """A sample needs two values."""
    with pytest.raises(ValueError):
        stdev([1])
