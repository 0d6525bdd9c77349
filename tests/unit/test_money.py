import pytest

from hotledger.money import InvalidAmount, format_minor, parse_minor


@pytest.mark.parametrize(
    "text,minor", [("0.01", 1), ("12.34", 1234), ("12.3", 1230), ("7", 700), ("999999999999.99", 99_999_999_999_999)]
)
def test_parses_decimal_strings_to_minor_units(text, minor):
    assert parse_minor(text) == minor


@pytest.mark.parametrize(
    "bad",
    [
        "-1.00",
        "0",
        "0.00",
        "1.234",
        "1e3",
        "1E3",
        "NaN",
        "Infinity",
        "-Infinity",
        "1" + "0" * 30,
        "abc",
        "",
        " 1.00",
        "1.00 ",
        "+1.00",
        "01.00",
        "1.",
        ".5",
        "1,00",
        "0x10",
        "1;DROP TABLE t_order",
        12.34,
        1234,
        None,
        True,
    ],
)
def test_rejects_everything_that_is_not_a_plain_positive_amount(bad):
    with pytest.raises(InvalidAmount):
        parse_minor(bad)


def test_zero_allowed_where_asked():
    assert parse_minor("0.00", allow_zero=True) == 0


@pytest.mark.parametrize("minor,text", [(0, "0.00"), (5, "0.05"), (1234, "12.34"), (-5, "-0.05"), (-1234, "-12.34")])
def test_formats_minor_units(minor, text):
    assert format_minor(minor) == text
