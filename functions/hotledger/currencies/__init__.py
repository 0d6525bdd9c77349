"""Each account's currency (ISO 4217), fixed at its creation."""
