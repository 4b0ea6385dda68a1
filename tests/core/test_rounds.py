"""The one grammar of rounds (``landscape.core.rounds.Rounds``): what it parses, what it refuses in one line, and
what it selects, checked against a selection written out here from the grammar's words."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from landscape.core.errors import LandscapeError
from landscape.core.rounds import ALL, GRAMMAR, LAST, LISTED, Rounds, RoundsUnavailable


@pytest.mark.parametrize("value, kind, count, listed", [
    ("last", LAST, 1, ()),
    ("last 5", LAST, 5, ()),
    ("  last \t 12 ", LAST, 12, ()),  # spaces as a claim file may hold them
    ("all", ALL, 1, ()),
    (" all", ALL, 1, ()),
    ("3", LISTED, 1, (3,)),
    ("0", LISTED, 1, (0,)),
    ("10,20", LISTED, 1, (10, 20)),
    ("20, 10,", LISTED, 1, (20, 10)),  # the order listed; an empty item (a trailing comma) ignored
    ("2,,2,3", LISTED, 1, (2, 3)),  # twice listed: taken once
    (7, LISTED, 1, (7,)),  # TOML: rounds = 7
    ([4, 0, 4], LISTED, 1, (4, 0)),  # TOML: rounds = [4, 0, 4]
    ((1, 2), LISTED, 1, (1, 2)),  # a list the schema froze
])
def test_each_form_of_the_grammar_parses(value, kind, count, listed):
    rounds = Rounds.parse(value)
    assert (rounds.kind, rounds.count, rounds.listed) == (kind, count, listed)


@pytest.mark.parametrize("value", ["first", "last 0", "last -1", "last2", "lastt", "", " ", ",", "-1", "1,-2",
                                   "+3", "3_0", "1.5", "[1, 2]", "1 2", "LAST", "\u0663", "all,3", -1, True, 2.5,
                                   [], [1, -1], [True], ["1"], None, {"rounds": 1}])
def test_anything_else_is_one_line_naming_the_option_and_the_grammar(value):
    with pytest.raises(LandscapeError) as refused:
        Rounds.parse(value, "--checkpoints")
    message = str(refused.value)
    assert message == f"--checkpoints must be {GRAMMAR} (got {value!r})"
    assert "\n" not in message


def test_a_long_or_multi_line_value_is_shown_in_one_line():
    with pytest.raises(LandscapeError) as refused:
        Rounds.parse("x\n" * 1000, "rounds")
    assert "\n" not in str(refused.value) and len(str(refused.value)) < 300


def test_the_text_is_the_grammar_and_written_is_as_given():
    assert [str(Rounds.parse(v)) for v in ("last", "last  3", "all", "7", [2, 1], "5, 6")] == [
        "last", "last 3", "all", "7", "2,1", "5,6"]
    assert [Rounds.parse(v).written for v in ("last  5", 3, [3], "3")] == ["'last 5'", "3", "[3]", "'3'"]
    assert Rounds(ALL).written == "'all'" and Rounds(LISTED, listed=(1, 2)).written == "[1, 2]"


def test_a_rounds_is_parsed_once_and_compares_by_what_it_picks():
    rounds = Rounds.parse("last 2")
    assert Rounds.parse(rounds) is rounds
    assert Rounds.parse(3) == Rounds.parse([3]) == Rounds.parse("3")  # written differently, the same rounds
    assert len({Rounds.parse(3), Rounds.parse("3"), Rounds(LAST), Rounds.parse("last")}) == 2
    with pytest.raises(AttributeError):
        rounds.count = 3  # type: ignore[misc]


@pytest.mark.parametrize("kind, count, listed", [
    (LAST, 0, ()), (LAST, 1, (2,)), (ALL, 2, ()), (LISTED, 1, ()), (LISTED, 1, (1, 1)), (LISTED, 1, (-1,)),
    ("first", 1, ()),
])
def test_a_rounds_built_directly_is_checked_too(kind, count, listed):
    with pytest.raises(LandscapeError, match="not a choice of rounds"):
        Rounds(kind, count, listed)


# -- selection, against the grammar's words written out --------------------------------------------------------

def expected(rounds: Rounds, available: list[int]) -> list[int] | None:
    """What the grammar says is picked of ``available`` (None: refused): the last N of the rounds there are in
    ascending order, every one of them, or the listed rounds in the order listed, each once."""
    have = sorted(set(available))
    if rounds.kind == LISTED:
        seen: list[int] = []
        for r in rounds.listed:
            if r not in have:
                return None
            if r not in seen:
                seen.append(r)
        return seen
    n = rounds.count if rounds.kind == LAST else len(have)
    if not have or len(have) < n:
        return None
    return have[len(have) - n:]


specs = st.one_of(
    st.just("last"), st.just("all"), st.integers(1, 12).map(lambda n: f"last {n}"),
    st.integers(0, 30), st.lists(st.integers(0, 30), min_size=1, max_size=6))
availables = st.lists(st.integers(0, 30), max_size=12)


@given(specs, availables)
def test_select_picks_what_the_grammar_says_or_refuses_naming_what_lacks(spec, available):
    rounds = Rounds.parse(spec)
    want = expected(rounds, available)
    assert rounds.covered_by(available) == (want is not None)
    if want is not None:
        assert rounds.select(available) == want
        assert rounds.among(available) == want
        return
    with pytest.raises(RoundsUnavailable) as refused:
        rounds.select(available)
    e = refused.value
    assert e.available == tuple(sorted(set(available)))
    assert e.lacking == tuple(r for r in rounds.listed if r not in set(available))
    assert "\n" not in str(e) and ("round" in str(e))
    if not e.lacking:
        assert e.asked == (rounds.count if rounds.kind == LAST else 1)
    # among leaves out what is not there and never adds anything
    assert set(rounds.among(available)) <= set(available)


@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=8), st.data())
def test_a_comma_list_with_any_spacing_is_the_list(values, data):
    gaps = [data.draw(st.sampled_from(["", " ", "  ", "\t"])) for _ in range(2 * len(values))]
    text = ",".join(f"{gaps[2 * i]}{v}{gaps[2 * i + 1]}" for i, v in enumerate(values))
    if data.draw(st.booleans()):
        text += ","
    assert Rounds.parse(text) == Rounds.parse(values) == Rounds.parse(tuple(values))
    assert Rounds.parse(text).listed == tuple(dict.fromkeys(values))


@given(specs)
def test_the_text_parses_back_to_the_same_rounds(spec):
    rounds = Rounds.parse(spec)
    assert Rounds.parse(str(rounds)) == rounds


@given(st.text(max_size=20))
def test_any_text_parses_or_is_refused_in_one_line(text):
    try:
        rounds = Rounds.parse(text, "rounds")
    except LandscapeError as e:
        assert str(e).startswith("rounds must be ") and "\n" not in str(e)
    else:
        assert Rounds.parse(str(rounds)) == rounds
