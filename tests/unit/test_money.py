from decimal import Decimal

import pytest

from hotledger.money import Currency, InvalidAmount, format_minor, parse_amount, parse_minor


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


@pytest.mark.parametrize(
    "code,text,minor,shown",
    [
        ("JPY", "1234", 1234, "1234"),
        ("USD", "12.3", 1230, "12.30"),
        ("USD", "12.34", 1234, "12.34"),
        ("KWD", "1.234", 1234, "1.234"),
        ("KWD", "0.5", 500, "0.500"),
        ("KWD", "1", 1000, "1.000"),
    ],
)
def test_a_currency_takes_its_minor_unit_digits(code, text, minor, shown):
    currency = Currency.of(code)
    assert currency.minor(parse_amount(text)) == minor
    assert currency.format(minor) == shown


@pytest.mark.parametrize("code,text", [("JPY", "1.5"), ("JPY", "1.0"), ("USD", "1.234"), ("USD", "0.001")])
def test_more_digits_than_the_currency_has_is_refused(code, text):
    with pytest.raises(InvalidAmount, match=f"{code} amounts have at most"):
        Currency.of(code).minor(parse_amount(text))


def test_the_largest_amount_of_a_three_digit_currency_is_capped_in_minor_units():
    with pytest.raises(InvalidAmount, match="exceeds"):
        Currency.of("KWD").minor(Decimal("999999999999.999"))
    assert Currency.of("JPY").minor(Decimal("999999999999")) == 999_999_999_999


def test_an_unknown_currency_is_refused():
    with pytest.raises(InvalidAmount):
        Currency.of("XYZ")
