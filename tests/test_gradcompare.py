"""The fuzzer's gradient comparison (tests/scenarios/gradcompare.py): it forgives the rounding of
ZeRO's pre-divided data-parallel average below the smallest normal float, and nothing else.
Pure torch, no ranks."""

import pytest
import torch

from tests.scenarios import gradcompare

F32 = torch.float32


def f32(*hex_values):
    return torch.tensor([float.fromhex(h) for h in hex_values], dtype=F32)


def two_rank_average(g):
    """ZeRO-3's average of identical gradients on 2 ranks: each rank pre-divides, the reduce sums."""
    return g / 2 + g / 2


def test_the_fuzzers_denormal_case_is_equal():
    # the head gradient of the fuzzer's case (issue 12), ZeRO-3 on 2 ranks vs the torch reference:
    # its first micro-batch gradient held 2**-149 (halves to 0) and -63 * 2**-149 (halves to -32 * 2**-149,
    # so -2**-143 after the sum)
    zero = f32("-0x1.b2c6p-131", "0x0p+0")
    reference = f32("-0x1.b2c5cp-131", "0x1p-149")
    assert not torch.equal(zero, reference)
    assert gradcompare.equal_up_to_subnormal(zero, reference)
    micro0 = f32("-0x1.f8p-144", "0x1p-149")
    assert torch.equal(two_rank_average(micro0), f32("-0x1p-143", "0x0p+0"))


def test_the_two_rank_average_of_any_float_is_equal():
    generator = torch.Generator().manual_seed(0)
    exponents = torch.randint(-149, 100, (20000, ), generator=generator).to(F32)
    g = (torch.rand(20000, generator=generator) + 0.5) * torch.exp2(exponents) * torch.sign(
        torch.randn(20000, generator=generator))
    averaged = two_rank_average(g)
    assert not torch.equal(averaged, g), "no subnormal rounding drawn: the test would prove nothing"
    assert gradcompare.equal_up_to_subnormal(averaged, g)
    # and every element it forgives is one the average rounded below the smallest normal
    rounded = averaged != g
    assert bool((g[rounded].abs() < 2 * torch.finfo(F32).tiny).all())


@pytest.mark.parametrize("exponent", [-102, -90, -60, -30, -1, 0, 1, 30, 100, 127])
def test_one_ulp_of_a_normal_float_is_a_mismatch(exponent):
    value = torch.exp2(torch.tensor([float(exponent)], dtype=F32))
    for other in (torch.nextafter(value, value * 2), torch.nextafter(value, torch.zeros_like(value))):
        assert not torch.equal(other, value)
        assert not gradcompare.equal_up_to_subnormal(other, value), f"{other.item()!r} vs {value.item()!r}"
        assert not gradcompare.equal_up_to_subnormal(-other, -value)


def test_real_mismatches_are_caught():
    tiny = torch.finfo(F32).tiny
    cases = [
        (f32("0x0p+0"), torch.tensor([0.38], dtype=F32)),  # a gradient ZeRO never reduced
        (torch.tensor([tiny], dtype=F32), f32("0x0p+0")),  # the smallest normal against zero
        (torch.tensor([1.0, 2.0], dtype=F32), torch.tensor([1.0, -2.0], dtype=F32)),  # one element
        (torch.tensor([float("nan")], dtype=F32), torch.tensor([float("nan")], dtype=F32)),
        (torch.tensor([float("inf")], dtype=F32), torch.tensor([float("-inf")], dtype=F32)),
    ]
    for grad, expected in cases:
        assert not gradcompare.equal_up_to_subnormal(grad, expected), f"{grad} vs {expected}"
    # equal tensors, infinities included, stay equal
    same = torch.tensor([float("inf"), 0.0, -1.5], dtype=F32)
    assert gradcompare.equal_up_to_subnormal(same, same.clone())


def test_shape_or_dtype_mismatch_is_an_error():
    with pytest.raises(ValueError, match="shape"):
        gradcompare.mismatched(torch.zeros(2), torch.zeros(3))
    with pytest.raises(ValueError, match="float64"):
        gradcompare.mismatched(torch.zeros(2), torch.zeros(2, dtype=torch.float64))
