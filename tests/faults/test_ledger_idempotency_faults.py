"""Idempotency-Keys outlive a real Redis loss (issue 10, items 1 and 2): the local runtime over HTTP on a private
stack; Redis is killed and restarted empty once the charges are in the DB. A retry with a key answers the first
outcome (a charge or a refusal) from the DB and charges nothing again."""

from __future__ import annotations

from faults.test_faults import _account, _converged, stack  # noqa: F401  (stack: the module's private servers)


def test_keys_and_their_refusals_outlive_redis_restarted_empty(stack):  # noqa: F811
    api = stack.service("api-idem").start()
    try:
        user_id = _account(api, "10.00")
        charged = api.request("POST", f"/accounts/{user_id}/deduct", {"amount": "4.00"}, {"Idempotency-Key": "once"})
        refused = api.request("POST", f"/accounts/{user_id}/deduct", {"amount": "7.00"}, {"Idempotency-Key": "no"})
        assert charged[0] == 200 and refused[0] == 402
        _converged(stack, api, user_id, 600)  # the writer persisted the charge (and its key's answer)
        stack.redis.kill()
        stack.redis.restart()
        assert api.request("POST", f"/accounts/{user_id}/recharge", {"amount": "10.00"})[0] == 200
        assert (
            api.request("POST", f"/accounts/{user_id}/deduct", {"amount": "4.00"}, {"Idempotency-Key": "once"})
            == charged
        )
        assert (
            api.request("POST", f"/accounts/{user_id}/deduct", {"amount": "7.00"}, {"Idempotency-Key": "no"}) == refused
        )
        _converged(stack, api, user_id, 1600)
        assert stack.sql("SELECT COUNT(*) FROM t_order WHERE user_id = %s", (user_id,)) == ((1,),)
    finally:
        api.stop()
