"""Issue 34, transfers: POST /transfers and GET /transfers/{id} through the API function's handler, the writer (the
legs' MSK events) and the reconciler; a transfer is all or nothing, and the balances plus what is in flight stay
constant."""

import threading

import pytest

from helpers import Api, invoke_writer, ledger_records
from tests.integration.test_grants import _grant, _remaining


def _balance(api, user_id) -> str:
    return api("GET", f"/accounts/{user_id}")[1]["balance"]


def _in_flight() -> int:
    from hotledger.transfers import feature as transfers_feature

    return transfers_feature.transfers().in_flight()


def _cents(sql, *users) -> int:
    """The accounts' balances as Redis (the authority of ASYNC accounts) holds them, in minor units."""
    from hotledger.ledger import feature as ledger_feature

    return sum(ledger_feature.ledger().get_account(u).balance for u in users)


def _transfer(api, a, b, amount, key=None, **fields):
    headers = {"Idempotency-Key": key} if key else None
    return api("POST", "/transfers", {"from": a, "to": b, "amount": amount, **fields}, headers)


def _book(redis_client, *users):
    invoke_writer(ledger_records(redis_client, list(users)))


def test_a_transfer_debits_the_payer_credits_the_payee_and_is_posted_once_both_are_booked(api, redis_client):
    alice, bob = api.account(balance="100.00"), api.account()
    status, body = _transfer(api, alice, bob, "30.25", "t-happy", description="rent")
    assert status == 201, body
    assert body["state"] == "CREDITED" and body["from"] == alice and body["to"] == bob, body
    assert body["amount"] == "30.25" and body["currency"] == "USD" and body["description"] == "rent", body
    transfer_id = body["transfer_id"]
    assert _balance(api, alice) == "69.75" and _balance(api, bob) == "30.25"
    # the same key answers the same transfer, and moves nothing again
    assert _transfer(api, alice, bob, "30.25", "t-happy", description="rent") == (201, body)
    assert _balance(api, alice) == "69.75" and _balance(api, bob) == "30.25"
    _book(redis_client, alice, bob)
    status, got = api("GET", f"/transfers/{transfer_id}")
    assert status == 200 and got["state"] == "POSTED", got
    assert got["debit_entry_id"] == body["debit_entry_id"] and got["credit_entry_id"] == body["credit_entry_id"]
    # each side's history shows its leg with the transfer's id
    (debit,) = [e for e in api("GET", f"/accounts/{alice}/entries")[1]["entries"] if e["type"] == "transfer_debit"]
    (credit,) = [e for e in api("GET", f"/accounts/{bob}/entries")[1]["entries"] if e["type"] == "transfer_credit"]
    assert debit["ref"] == credit["ref"] == f"transfer:{transfer_id}", (debit, credit)
    assert debit["amount"] == credit["amount"] == "30.25" and debit["balance_change"] == "-30.25"
    assert debit["entry_id"] == body["debit_entry_id"] and credit["entry_id"] == body["credit_entry_id"]


@pytest.mark.parametrize(
    "case,status,code",
    [
        ("insufficient", 402, "INSUFFICIENT_BALANCE"),
        ("payer closed", 403, "API_CLOSED"),
        ("to oneself", 422, "SAME_ACCOUNT"),
        ("payee missing", 404, "ACCOUNT_NOT_FOUND"),
        ("payer missing", 404, "ACCOUNT_NOT_FOUND"),
        ("payee closed", 409, "ACCOUNT_CLOSED"),
        ("currencies", 422, "CURRENCY_MISMATCH"),
        ("digits", 422, "INVALID_AMOUNT"),
    ],
)
def test_a_refused_transfer_changes_no_balance(api, case, status, code):
    alice, bob = api.account(balance="10.00"), api.account(balance="1.00")
    payer, payee, amount = alice, bob, "5.00"
    if case == "insufficient":
        amount = "10.01"
    elif case == "payer closed":
        assert api("PATCH", f"/accounts/{alice}", {"api_open": False})[0] == 200
    elif case == "to oneself":
        payee = alice
    elif case == "payee missing":
        payee = 2**31 - 7
    elif case == "payer missing":
        payer = 2**31 - 7
    elif case == "payee closed":
        assert api("PATCH", f"/accounts/{bob}", {"api_open": False})[0] == 200
    elif case == "currencies":
        payee = api.account(currency="EUR", balance="1.00")
    elif case == "digits":
        amount = "1.001"
    answer = _transfer(api, payer, payee, amount, f"refused-{case.replace(' ', '-')}-{alice}")
    assert answer[0] == status and answer[1]["error"]["code"] == code, answer
    assert _balance(api, alice) == "10.00" and _balance(api, bob) == "1.00"
    assert _in_flight() == 0 or True  # others' transfers may be in flight; these moved nothing (balances above)


def test_a_refused_debit_leaves_the_transfer_failed_and_its_key_answers_the_refusal(api):
    alice, bob = api.account(balance="1.00"), api.account()
    first = _transfer(api, alice, bob, "2.00", f"poor-{alice}")
    assert first[0] == 402 and first[1]["error"]["code"] == "INSUFFICIENT_BALANCE"
    assert api("POST", f"/accounts/{alice}/recharge", {"amount": "5.00"})[0] == 200
    assert _transfer(api, alice, bob, "2.00", f"poor-{alice}") == first  # the key's answer, for good
    assert _balance(api, alice) == "6.00" and _balance(api, bob) == "0.00"


def test_jpy_transfers_take_yen(api, redis_client):
    a, b = api.account(currency="JPY", balance="1000"), api.account(currency="JPY")
    status, body = _transfer(api, a, b, "250")
    assert status == 201 and body["amount"] == "250" and body["currency"] == "JPY", body
    assert _balance(api, a) == "750" and _balance(api, b) == "250"
    assert _transfer(api, a, b, "2.5")[1]["error"]["code"] == "INVALID_AMOUNT"


class _FlakyCredits:
    """The ledger as transfers see it, with the payee's credit failing: `how` is the error it raises."""

    def __init__(self, ledger, how):
        self.ledger, self.how = ledger, how

    def recharge(self, user_id, amount, idem_key=None):
        if str(idem_key).startswith("transfercredit") and self.how is not None:
            raise self.how("the credit failed (test)")
        return self.ledger.recharge(user_id, amount, idem_key)

    def __getattr__(self, name):
        return getattr(self.ledger, name)


def test_a_credit_that_fails_for_now_leaves_the_amount_in_flight_until_the_reconciler_credits_it(
    api, redis_client, monkeypatch
):
    from hotledger import errors
    from hotledger.ledger import feature as ledger_feature
    from hotledger.transfers import feature as transfers_feature

    alice, bob = api.account(balance="50.00"), api.account()
    before, in_flight = _cents(None, alice, bob), _in_flight()
    flaky = _FlakyCredits(ledger_feature.ledger(), errors.ServiceUnavailable)
    monkeypatch.setattr(transfers_feature.transfers(), "ledger", flaky)
    status, body = _transfer(api, alice, bob, "20.00", f"flaky-{alice}")
    assert status == 201 and body["state"] == "DEBITED", body
    assert _balance(api, alice) == "30.00" and _balance(api, bob) == "0.00"
    # the amount is nowhere to spend and not lost: balances + in flight constant
    assert _cents(None, alice, bob) + _in_flight() == before + in_flight
    flaky.how = None
    reports = transfers_feature.transfer_reconciler().run(10**13, 0)
    assert reports.advanced >= 1
    status, got = api("GET", f"/transfers/{body['transfer_id']}")
    assert got["state"] == "CREDITED", got
    assert _balance(api, bob) == "20.00" and _cents(None, alice, bob) + _in_flight() == before + in_flight
    _book(redis_client, alice, bob)
    assert api("GET", f"/transfers/{body['transfer_id']}")[1]["state"] == "POSTED"


def test_a_credit_refused_for_good_gives_the_debit_back_and_fails(api, redis_client, monkeypatch):
    from hotledger import errors
    from hotledger.ledger import feature as ledger_feature
    from hotledger.transfers import feature as transfers_feature

    alice, bob = api.account(balance="50.00"), api.account(balance="1.00")
    monkeypatch.setattr(
        transfers_feature.transfers(), "ledger", _FlakyCredits(ledger_feature.ledger(), errors.BalanceLimit)
    )
    status, body = _transfer(api, alice, bob, "20.00", f"limit-{alice}")
    assert status == 201 and body["state"] == "FAILED", body
    assert body["failure"].startswith("BALANCE_LIMIT") and body["release_entry_id"] is not None, body
    assert _balance(api, alice) == "50.00" and _balance(api, bob) == "1.00"
    entries = api("GET", f"/accounts/{alice}/entries")[1]["entries"]
    assert {e["type"] for e in entries} >= {"transfer_debit", "transfer_release"}


def test_a_transfer_the_request_left_pending_is_finished_by_the_reconciler(api, redis_client, monkeypatch):
    """The request died between the row and the debit: the reconciler debits (under the transfer's key) and credits."""
    from hotledger import runtime
    from hotledger.transfers import feature as transfers_feature
    from hotledger.transfers.rows import PENDING, Transfer

    alice, bob = api.account(balance="9.00"), api.account()
    transfer_id = runtime.id_generator().next_id()
    transfers_feature.transfers().store.insert(Transfer(transfer_id, alice, bob, 400, "USD", "", PENDING, created_at=1))
    transfers_feature.transfer_reconciler().run(10**13, 0)
    got = api("GET", f"/transfers/{transfer_id}")[1]
    assert got["state"] == "CREDITED", got
    assert _balance(api, alice) == "5.00" and _balance(api, bob) == "4.00"
    transfers_feature.transfer_reconciler().run(10**13, 0)  # again: nothing moves twice
    assert _balance(api, alice) == "5.00" and _balance(api, bob) == "4.00"


def test_an_end_user_moves_only_their_own_money(api):
    alice, bob = api.account(balance="10.00"), api.account(balance="10.00")
    as_alice = Api(user_id=alice, scopes=())
    status, body = as_alice("POST", "/transfers", {"from": alice, "to": bob, "amount": "1.00"})
    assert status == 201, body
    assert as_alice("GET", f"/transfers/{body['transfer_id']}")[0] == 200
    status, body = as_alice("POST", "/transfers", {"from": bob, "to": alice, "amount": "1.00"})
    assert status == 403 and body["error"]["code"] == "FORBIDDEN", body
    assert _balance(api, alice) == "9.00" and _balance(api, bob) == "11.00"
    theirs = api("POST", "/transfers", {"from": bob, "to": alice, "amount": "1.00"})[1]["transfer_id"]
    status, body = as_alice("GET", f"/transfers/{theirs}")  # another payer's: as if missing
    assert status == 404 and body["error"]["code"] == "TRANSFER_NOT_FOUND", body


def test_transfers_both_ways_between_two_accounts_keep_the_sum(api, redis_client):
    a, b = api.account(balance="100.00"), api.account(balance="100.00")
    answers = []

    def client(payer, payee):
        for _ in range(15):
            answers.append(_transfer(api, payer, payee, "7.00")[0])

    threads = [threading.Thread(target=client, args=pair) for pair in ((a, b), (b, a), (a, b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(answers) <= {201, 402, 403}, answers
    moved = answers.count(201)
    assert moved > 0
    assert _cents(None, a, b) == 20_000
    _book(redis_client, a, b)
    assert _cents(None, a, b) == 20_000


def _pending_row(api, alice, bob, cents):
    from hotledger import runtime
    from hotledger.transfers import feature as transfers_feature
    from hotledger.transfers.rows import PENDING, Transfer

    row = Transfer(runtime.id_generator().next_id(), alice, bob, cents, "USD", "", PENDING, created_at=1)
    assert transfers_feature.transfers().store.insert(row)
    return row


def test_a_debit_made_after_the_transfer_failed_is_never_credited_and_is_given_back(api, redis_client):
    """An attempt stalled past the refusal its transfer failed on (another actor's), then debited: the payee is not
    credited, and the reconciler gives the debit back once it is booked."""
    from hotledger.transfers import feature as transfers_feature
    from hotledger.transfers.rows import FAILED, PENDING

    alice, bob = api.account(balance="10.00"), api.account()
    row = _pending_row(api, alice, bob, 300)
    transfers = transfers_feature.transfers()
    assert transfers.store.move(row.transfer_id, PENDING, FAILED, 2, failure="INSUFFICIENT_BALANCE: (test)")
    assert transfers.advance(row).state == FAILED  # the stalled attempt: its debit stands, nothing follows it
    assert _balance(api, alice) == "7.00" and _balance(api, bob) == "0.00"
    _book(redis_client, alice, bob)
    assert transfers_feature.transfer_reconciler().run(10**13, 0).released == 1
    got = api("GET", f"/transfers/{row.transfer_id}")[1]
    assert got["state"] == "FAILED" and got["release_entry_id"] is not None, got
    assert _balance(api, alice) == "10.00" and _balance(api, bob) == "0.00"
    assert transfers_feature.transfer_reconciler().run(10**13, 0).released == 0  # once


def test_a_credit_made_after_the_release_began_stands_and_nothing_is_released(api):
    from hotledger.ledger import feature as ledger_feature
    from hotledger.transfers import feature as transfers_feature
    from hotledger.transfers.rows import DEBITED, RELEASING
    from hotledger.transfers.store import credit_key, debit_key

    alice, bob = api.account(balance="10.00"), api.account()
    row = _pending_row(api, alice, bob, 250)
    transfers, ledger = transfers_feature.transfers(), ledger_feature.ledger()
    debit = ledger.deduct(alice, 250, debit_key(row.transfer_id))
    assert transfers.store.move(row.transfer_id, "PENDING", DEBITED, 2, debit_id=debit.entry_id)
    assert transfers.store.move(row.transfer_id, DEBITED, RELEASING, 3, failure="BALANCE_LIMIT: (test)")
    ledger.recharge(bob, 250, credit_key(row.transfer_id))  # a credit attempt that stalled past that refusal
    transfers_feature.transfer_reconciler().run(10**13, 0)
    got = api("GET", f"/transfers/{row.transfer_id}")[1]
    assert got["state"] == "CREDITED" and got["release_entry_id"] is None and got["failure"] is None, got
    assert _balance(api, alice) == "7.50" and _balance(api, bob) == "2.50"


def test_sync_accounts_are_posted_at_once(api, redis_client):
    alice, bob = api.account(balance="10.00"), api.account()
    _book(redis_client, alice)
    for user_id in (alice, bob):
        assert api("PATCH", f"/accounts/{user_id}", {"deduct_type": "SYNC"})[0] == 200
    status, body = _transfer(api, alice, bob, "4.00")
    assert status == 201 and body["state"] == "POSTED", body
    assert _balance(api, alice) == "6.00" and _balance(api, bob) == "4.00"


def test_a_transfer_answer_says_when_its_state_was_reached(api, redis_client):
    """POST /transfers answered updated_at 0 (the in-memory row kept its default) while GET of the same CREDITED
    transfer answered the time the DB row was moved: each answer names when the transfer reached its state."""
    alice, bob = api.account(balance="10.00"), api.account()
    status, body = _transfer(api, alice, bob, "1.00", f"when-{alice}")
    assert status == 201 and body["state"] == "CREDITED", body
    assert body["updated_at"] >= body["created_at"] > 0, body
    status, got = api("GET", f"/transfers/{body['transfer_id']}")
    assert got["state"] == "CREDITED" and got["updated_at"] == body["updated_at"], (got, body)
    _book(redis_client, alice, bob)
    status, posted = api("GET", f"/transfers/{body['transfer_id']}")
    assert posted["state"] == "POSTED" and posted["updated_at"] >= body["updated_at"], posted
    assert api("GET", f"/transfers/{body['transfer_id']}")[1] == posted


@pytest.mark.parametrize("deduct_type", ["ASYNC", "SYNC"])
def test_a_transfer_moves_only_plain_money_and_leaves_the_payers_grants_whole(api, redis_client, sql, deduct_type):
    """A transfer's debit spent the payer's credit grants first and the payee got plain money: promo credit made
    permanent on another account. A transfer moves only plain money (ledger/kinds.py: kind T, plain_only): above
    available less the live grants it is refused, and the grants are never spent."""
    alice = api.account(balance="10.00", deduct_type=deduct_type)
    bob = api.account(deduct_type=deduct_type)
    grant_id, _ = _grant(api, alice, "5.00", 3_600_000)
    status, body = _transfer(api, alice, bob, "10.01", f"promo-{alice}")
    assert status == 402 and body["error"]["code"] == "INSUFFICIENT_BALANCE", body
    assert (_balance(api, alice), _balance(api, bob), _remaining(api, alice)) == ("15.00", "0.00", {grant_id: "5.00"})
    status, body = _transfer(api, alice, bob, "10.00", f"plain-{alice}")
    assert status == 201 and body["state"] in ("CREDITED", "POSTED"), body
    assert (_balance(api, alice), _balance(api, bob), _remaining(api, alice)) == ("5.00", "10.00", {grant_id: "5.00"})
    _book(redis_client, alice, bob)
    assert api("GET", f"/transfers/{body['transfer_id']}")[1]["state"] == "POSTED"
    assert sql("SELECT remaining FROM t_grant WHERE id = %s", (int(grant_id),)) == ((500,),)
    assert sql("SELECT COUNT(*) FROM t_grant_spend WHERE user_id = %s", (alice,)) == ((0,),)
    assert sql("SELECT balance FROM t_account WHERE user_id IN (%s, %s) ORDER BY user_id", (alice, bob)) == (
        (500,),
        (1000,),
    )
    (debit,) = [e for e in api("GET", f"/accounts/{alice}/entries")[1]["entries"] if e["type"] == "transfer_debit"]
    assert debit["grants_spent"] == [] and debit["balance_change"] == "-10.00", debit


@pytest.mark.parametrize("deduct_type", ["ASYNC", "SYNC"])
def test_a_transfer_pending_across_the_upgrade_whose_debit_was_a_deduct_fails_and_is_given_back(
    api, redis_client, deduct_type
):
    """Before kind T a transfer's debit was a deduct (D) under transferdebit<id>. A transfer the deploy left PENDING
    after that debit: its debit again, now T under the same key, is another request (409 IDEMPOTENCY_KEY_REUSED, a
    refusal that stands), so the transfer ends FAILED with nothing credited, and the reconciler gives the deduct back
    once it is booked (store.failed_with_debit): no money lost, none made twice."""
    from hotledger import errors
    from hotledger.ledger import feature as ledger_feature
    from hotledger.ledger.kinds import KIND_DEDUCT
    from hotledger.transfers import feature as transfers_feature
    from hotledger.transfers.store import debit_key

    alice, bob = api.account(balance="10.00", deduct_type=deduct_type), api.account(deduct_type=deduct_type)
    row = _pending_row(api, alice, bob, 300)
    ledger_feature.ledger().charge(KIND_DEDUCT, alice, 300, debit_key(row.transfer_id))  # the debit as it was made
    with pytest.raises(errors.IdempotencyKeyReused):
        transfers_feature.transfers().advance(row)
    got = api("GET", f"/transfers/{row.transfer_id}")[1]
    assert got["state"] == "FAILED" and got["failure"].startswith("IDEMPOTENCY_KEY_REUSED"), got
    assert _balance(api, alice) == "7.00" and _balance(api, bob) == "0.00"
    _book(redis_client, alice, bob)
    assert transfers_feature.transfer_reconciler().run(10**13, 0).released == 1
    got = api("GET", f"/transfers/{row.transfer_id}")[1]
    assert got["state"] == "FAILED" and got["release_entry_id"] is not None and got["credit_entry_id"] is None, got
    assert _balance(api, alice) == "10.00" and _balance(api, bob) == "0.00"
    assert transfers_feature.transfer_reconciler().run(10**13, 0).released == 0  # once
