"""Money at the API edge: decimal strings <-> integer minor units of the account's currency. The one place for the rule.

A request's amount is parsed twice, both here: its form first (parse_amount: a plain decimal string with at most
MAX_DECIMALS fractional digits, exact, as a Decimal: the schema's Amount), then against the currency of the account it
acts on (Currency.minor: at most the currency's minor-unit digits, ISO 4217: JPY 0, USD 2, KWD 3), which gives the
integer minor units everything behind the API stores. Answers format minor units with the account's digits
(Currency.format).

Floats never touch money. Amounts are capped well below 2**53 because Redis Lua numbers are doubles.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal

MAX_MINOR = 99_999_999_999_999  # 999,999,999,999.99 in cents: exact in a Lua double and in BIGINT
MAX_DECIMALS = 3  # the most minor-unit digits of a supported currency
_AMOUNT = re.compile(r"(0|[1-9][0-9]{0,11})(?:\.([0-9]{1,3}))?")  # at most 12 whole digits

# ISO 4217 minor units of the currencies an account may hold
MINOR_UNITS: dict[str, int] = {
    "AED": 2,
    "AUD": 2,
    "BHD": 3,
    "BRL": 2,
    "CAD": 2,
    "CHF": 2,
    "CLP": 0,
    "CNY": 2,
    "CZK": 2,
    "DKK": 2,
    "EUR": 2,
    "GBP": 2,
    "HKD": 2,
    "HUF": 2,
    "IDR": 2,
    "ILS": 2,
    "INR": 2,
    "IQD": 3,
    "ISK": 0,
    "JOD": 3,
    "JPY": 0,
    "KRW": 0,
    "KWD": 3,
    "LYD": 3,
    "MXN": 2,
    "NOK": 2,
    "NZD": 2,
    "OMR": 3,
    "PHP": 2,
    "PLN": 2,
    "SAR": 2,
    "SEK": 2,
    "SGD": 2,
    "THB": 2,
    "TND": 3,
    "TRY": 2,
    "TWD": 2,
    "UGX": 0,
    "USD": 2,
    "VND": 0,
    "XAF": 0,
    "XOF": 0,
    "ZAR": 2,
}


class InvalidAmount(ValueError):
    """The text is not a plain decimal amount in range (or not one the account's currency can hold)."""


def parse_amount(text: object, *, allow_zero: bool = False) -> Decimal:
    """The form of an amount: "12.34" -> Decimal('12.34') (exact, its fractional digits kept). Rejects signs,
    exponents, NaN/Infinity, more than MAX_DECIMALS decimals, non-strings; which currency may hold it is decided once
    the account is known (Currency.minor)."""
    if not isinstance(text, str):
        raise InvalidAmount('amount must be a decimal string such as "12.34"')
    match = _AMOUNT.fullmatch(text)
    if match is None:
        raise InvalidAmount(
            f"amount must be a decimal string of at most 12 whole and {MAX_DECIMALS} fractional digits (as many as"
            ' the currency has), such as "12.34"'
        )
    value = Decimal(text)
    if value == 0 and not allow_zero:
        raise InvalidAmount("amount must be greater than 0")
    return value


def fractional_digits(value: Decimal) -> int:
    exponent = value.as_tuple().exponent
    return -exponent if isinstance(exponent, int) and exponent < 0 else 0


@dataclass(frozen=True)
class Currency:
    code: str  # ISO 4217
    decimals: int  # its minor unit: JPY 0, USD 2, KWD 3

    @classmethod
    def of(cls, code: str) -> Currency:
        if code not in MINOR_UNITS:
            raise InvalidAmount(f"currency {code!r} is not supported")
        return cls(code, MINOR_UNITS[code])

    def minor(self, value: Decimal, field: str = "amount") -> int:
        """A parsed amount in this currency's minor units: 12.34 USD -> 1234, 500 JPY -> 500, 1.234 KWD -> 1234.
        More fractional digits than the currency has ("1.5" JPY, "1.234" USD) is refused, trailing zeros too."""
        digits = fractional_digits(value)
        if digits > self.decimals:
            raise InvalidAmount(
                f"{field}: {self.code} amounts have at most {self.decimals} fractional digits"
                f" ({self.example()}); {value} has {digits}"
            )
        minor = int(value.scaleb(self.decimals))
        if minor > MAX_MINOR:
            raise InvalidAmount(f"{field} exceeds {self.format(MAX_MINOR)} {self.code}")
        return minor

    def format(self, minor: int) -> str:
        """1234 -> "12.34" (USD), "1234" (JPY), "1.234" (KWD); -5 -> "-0.05" (USD)."""
        return format_minor(minor, self.decimals)

    def example(self) -> str:
        return f'such as "{self.format(1234)}"'


def parse_minor(text: object, *, allow_zero: bool = False, decimals: int = 2) -> int:
    """Parse "12.34" into 1234 (minor units of a currency with `decimals` digits, 2 by default)."""
    return Currency("", decimals).minor(parse_amount(text, allow_zero=allow_zero))


def format_minor(minor: int, decimals: int = 2) -> str:
    """1234 -> "12.34", -5 -> "-0.05"; with decimals=0 "1234", with 3 "1.234"."""
    sign = "-" if minor < 0 else ""
    if decimals == 0:
        return f"{sign}{abs(int(minor))}"
    whole, frac = divmod(abs(int(minor)), 10**decimals)
    return f"{sign}{whole}.{frac:0{decimals}d}"
