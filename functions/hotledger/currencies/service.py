"""Accounts' currencies, and the one rule for an amount of an account: a request's amount (a Decimal of the right form,
api.schemas.Amount) becomes the account's minor units only here (`minor`), and an answer shows minor units with the
account's digits only through `format`/`of(...).format`.

Invariants: an account's currency is fixed at its creation (t_account.currency; accounts created before currencies
hold DEFAULT_CURRENCY, their NULL); so a process keeps what it read for good, and the Redis copy never goes stale."""

from __future__ import annotations

from decimal import Decimal

from hotledger import errors
from hotledger.currencies.store import CurrencyStore
from hotledger.money import Currency, InvalidAmount

_CACHE_MAX = 100_000  # accounts whose currency a process keeps (a dict entry each)


class Currencies:
    def __init__(self, store: CurrencyStore, default: str):
        self.store, self.default = store, Currency.of(default)
        self.known: dict[int, Currency] = {}

    def of(self, user_id: int) -> Currency:
        """The account's currency. Raises ACCOUNT_NOT_FOUND for an account the DB does not hold."""
        found = self.known.get(user_id)
        if found is not None:
            return found
        code = self.store.cached(user_id)
        if code is None:
            code = self.store.stored(user_id)
            if code is None:
                raise errors.AccountNotFound(f"account {user_id} does not exist")
            self.store.cache(user_id, code)
        currency = Currency.of(code) if code else self.default
        if len(self.known) >= _CACHE_MAX:
            self.known.clear()
        self.known[user_id] = currency
        return currency

    def minor(self, user_id: int, value: Decimal, field: str = "amount") -> int:
        """The amount in the account's minor units; 422 INVALID_AMOUNT with more fractional digits than its currency
        has."""
        return minor_in(self.of(user_id), value, field)

    def format(self, user_id: int, minor: int) -> str:
        return self.of(user_id).format(minor)

    def created(self, user_id: int, code: str) -> None:
        """A new account's currency (its row holds it already): kept here and in Redis."""
        self.known[user_id] = Currency.of(code)
        self.store.cache(user_id, code)


def minor_in(currency: Currency, value: Decimal, field: str = "amount") -> int:
    try:
        return currency.minor(value, field)
    except InvalidAmount as exc:
        raise errors.InvalidAmount(str(exc)) from exc
