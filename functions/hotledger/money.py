"""Money at the API edge: decimal strings with at most two fractional digits <-> integer minor units.

Floats never touch money. Amounts are capped well below 2**53 because Redis Lua numbers are doubles.
"""

import re

MAX_MINOR = 99_999_999_999_999  # 999,999,999,999.99: exact in a Lua double and in BIGINT
_AMOUNT = re.compile(r"(0|[1-9][0-9]{0,14})(?:\.([0-9]{1,2}))?")


class InvalidAmount(ValueError):
    """The text is not a plain decimal amount in range."""


def parse_minor(text: object, *, allow_zero: bool = False) -> int:
    """Parse "12.34" into 1234. Rejects signs, exponents, NaN/Infinity, >2 decimals, non-strings."""
    if not isinstance(text, str):
        raise InvalidAmount('amount must be a decimal string such as "12.34"')
    match = _AMOUNT.fullmatch(text)
    if match is None:
        raise InvalidAmount('amount must be a decimal string with at most 2 fractional digits, such as "12.34"')
    whole, frac = match.group(1), (match.group(2) or "").ljust(2, "0")
    minor = int(whole) * 100 + int(frac)
    if minor > MAX_MINOR:
        raise InvalidAmount("amount exceeds 999999999999.99")
    if minor == 0 and not allow_zero:
        raise InvalidAmount("amount must be greater than 0.00")
    return minor


def format_minor(minor: int) -> str:
    """1234 -> "12.34", -5 -> "-0.05"."""
    sign = "-" if minor < 0 else ""
    whole, frac = divmod(abs(int(minor)), 100)
    return f"{sign}{whole}.{frac:02d}"
