"""Transfers: money from one account to another, in two ledger charges (transfers/service.py)."""
