"""SYNC charges of different accounts do not lock each other out through their Idempotency-Keys (issue 22).

A SYNC charge with a key read the key's t_idempotency row with FOR UPDATE before taking the account's row lock:
for a key not there yet, that locking read locks the gap around it, so a SYNC charge of another account whose key
falls in the same gap (neighbouring keys: the same key text on the next account id) waited on the first one's
commit to insert its answer, and both inserting into each other's gap deadlocked. Through the API handler: one SYNC
charge is held inside its transaction (just before its entry is written) while another account's charge runs; the
second must not wait on any lock of the first's."""

import threading

from hotledger.ledger import store


def test_a_sync_charge_does_not_wait_on_another_accounts_neighbouring_key(api, monkeypatch):
    first = api.account(balance="10.00", deduct_type="SYNC")
    second = api.account(balance="10.00", deduct_type="SYNC")
    assert second == first + 1  # (first, key) and (second, key) are neighbours in t_idempotency's primary key
    inside, release = threading.Event(), threading.Event()
    insert_entry = store.LedgerTx.insert_sync_entry

    def held_inside(self, kind, entry_id, user_id, *rest):
        if user_id == first:  # the first charge stops inside its transaction, every lock it takes taken
            inside.set()
            release.wait(60)
        return insert_entry(self, kind, entry_id, user_id, *rest)

    monkeypatch.setattr(store.LedgerTx, "insert_sync_entry", held_inside)
    answers = {}

    def charge(user_id: int) -> None:
        answers[user_id] = api(
            "POST", f"/accounts/{user_id}/deduct", {"amount": "1.00"}, {"Idempotency-Key": "neighbour"}
        )

    first_charge = threading.Thread(target=charge, args=(first,))
    first_charge.start()
    try:
        assert inside.wait(60), "the first charge never reached its transaction"
        # the second charge, whole, while the first holds every lock it took: were it to wait on one of them, it
        # would give up after InnoDB's lock wait timeout (1205: SERVICE_UNAVAILABLE) or deadlock with the first
        charge(second)
        assert answers[second][0] == 200, answers[second]
    finally:
        release.set()
        first_charge.join(60)
    for user_id in (first, second):
        status, body = answers[user_id]
        assert status == 200 and body["mode"] == "SYNC", body
        assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "9.00"


def test_a_sync_key_still_answers_its_first_charge_once(api):
    """The key read without a lock of its own still replays: under the account's row lock nothing else writes it."""
    user_id = api.account(balance="10.00", deduct_type="SYNC")
    headers = {"Idempotency-Key": "once"}
    first = api("POST", f"/accounts/{user_id}/deduct", {"amount": "2.00"}, headers)
    assert first[0] == 200 and first[1]["mode"] == "SYNC"
    assert api("POST", f"/accounts/{user_id}/deduct", {"amount": "2.00"}, headers) == first
    assert api("GET", f"/accounts/{user_id}")[1]["balance"] == "8.00"
