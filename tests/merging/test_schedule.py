import pytest

from deploytk.errors import DeploytkError
from deploytk.merging.schedule import cap_schedule, parse_r


def test_constant_r():
    assert parse_r(12, 16) == [16] * 12


def test_list_gives_one_r_per_block():
    assert parse_r(5, [8, 4, 0, 2, 1]) == [8, 4, 0, 2, 1]


@pytest.mark.parametrize("given", [2, 7])
def test_a_list_of_another_length_than_the_blocks_is_refused_naming_both_counts(given):
    with pytest.raises(DeploytkError) as err:
        parse_r(5, [4] * given, "deit_tiny")
    assert f"`merge.r` lists {given} values, one per block, but deit_tiny has 5 blocks" in str(err.value)


def test_inflection_schedule_matches_hand_computation():
    # (r=16, inflection=-1): min = int(16*2) = 32, max = 2*16-32 = 0, step = -32/11
    expected = [int(32 - 32 / 11 * i) for i in range(12)]
    assert parse_r(12, (16, -1.0)) == expected
    assert expected[0] == 32 and expected[-1] == 0
    assert parse_r(12, (16, 0.0)) == [16] * 12


def test_cap_follows_tome_rule():
    # DeiT-S: 197 tokens, class token protected; the last layer has 21 tokens -> cap (21-1)//2 = 10
    s = cap_schedule([16] * 12, 197, 1)
    assert s.tokens == [197 - 16 * i for i in range(12)]
    assert s.effective_r == [16] * 11 + [10]
    assert s.tokens_out == 11
    assert s.capped


def test_r_zero_and_negative_mean_no_merge():
    s = cap_schedule([0, -3, 5], 20, 1)
    assert s.effective_r == [0, 0, 5]
    assert s.tokens == [20, 20, 20]
