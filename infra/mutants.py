"""`make mutants`: a curated mutation pass over the money and stock invariants.

Each mutant is one small, exact edit (a refusal removed, a boundary moved, an idempotency decision or a writer
de-duplication dropped, fencing disabled, a reconciler decision skipped) to one file of layers/lua/ or
functions/hotledger/. Every mutant is applied in turn to a scratch copy of the repo (the tracked and untracked
files, with .venv symlinked), only the tests named with it are run (tests/unit first, then the narrowest
tests/integration files), and the file is restored. A mutant is *killed* when its tests fail, *survived* when they
pass: a survivor means the suite does not guard that invariant, and the run exits 1.

    .venv/bin/python infra/mutants.py            # every mutant, in sequence
    .venv/bin/python infra/mutants.py --only ID  # some of them (repeatable)
    .venv/bin/python infra/mutants.py --list

tests/unit/test_mutants_list.py checks that every `original` still occurs exactly once in its file, so the list
cannot silently rot when the code changes: update the mutant together with the code it mutates.
Not part of `make test`: it needs the servers and runs its test sets one mutant after the other (minutes).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LEDGER_APPLY = "layers/lua/ledger_apply.lua"
LEDGER_SERVICE = "functions/hotledger/ledger/service.py"
LEDGER_PERSIST = "functions/hotledger/ledger/persist.py"
VOUCHER_PERSIST = "functions/hotledger/vouchers/persist.py"
PACKET_RECONCILE = "functions/hotledger/redpackets/reconcile.py"
PAYMENT_ORDERS = "functions/hotledger/notices/payment_orders.py"
TRANSFERS = "functions/hotledger/transfers/service.py"

U_LEDGER = "tests/unit/test_ledger.py"
U_VOUCHERS = "tests/unit/test_vouchers.py"
U_PACKETS = "tests/unit/test_redpackets.py"
U_NOTICES = "tests/unit/test_notices.py"
I_LUA = "tests/integration/test_lua_scripts.py"
I_ORDERS = "tests/integration/test_payment_orders.py"
I_HOLDS = "tests/integration/test_holds.py"
I_ROUTES = "tests/integration/test_route_table.py"
I_QUOTAS = "tests/integration/test_quotas_and_cursors.py"
I_BUCKETS = "tests/integration/test_voucher_buckets.py"
I_REFUSALS = "tests/integration/test_script_refusals.py"
I_LOG_WAITS = "tests/integration/test_rebuild_waits_for_the_log.py"
I_TRANSFERS = "tests/integration/test_transfers.py"
I_WEBHOOKS = "tests/integration/test_webhooks.py"
I_GRANTS = "tests/integration/test_grants.py"


@dataclass(frozen=True)
class Mutant:
    id: str
    file: str  # relative to the repo root
    original: str  # occurs exactly once in the file (tests/unit/test_mutants_list.py)
    replacement: str
    tests: tuple[str, ...]  # pytest paths or node ids, relative to the repo root
    breaks: str  # the invariant the mutant breaks


def m(id, file, original, replacement, tests, breaks):
    return Mutant(id, file, original, replacement, tuple(tests), breaks)


MUTANTS: list[Mutant] = [
    # ---- ledger_apply.lua: the ASYNC charge ----------------------------------------------------------------
    m(
        "lua-closed",
        LEDGER_APPLY,
        "if open ~= '1' then return refuse('closed') end",
        "if false then return refuse('closed') end",
        [I_LUA],
        "a deduct on a closed API (balance exhausted or operator close) is refused",
    ),
    m(
        "lua-insufficient-boundary",
        LEDGER_APPLY,
        "if balance - (tonumber(h[7]) or 0) - on_hold - amount < tonumber(h[3]) then return refuse('insufficient') end",
        "if balance - (tonumber(h[7]) or 0) - on_hold - amount <= tonumber(h[3]) then return refuse('insufficient') end",
        [I_LUA],
        "a deduct may take the balance exactly down to the threshold, never below",
    ),
    m(
        "lua-credit-spendable-before-durable",
        LEDGER_APPLY,
        "if balance - (tonumber(h[7]) or 0) - on_hold - amount < tonumber(h[3]) then return refuse('insufficient') end",
        "if balance - on_hold - amount < tonumber(h[3]) then return refuse('insufficient') end",
        [I_LUA],
        "a credit is spendable only once its event is durable (held until ledger_post or the writer's settle)",
    ),
    m(
        "lua-insufficient",
        LEDGER_APPLY,
        "if balance - (tonumber(h[7]) or 0) - on_hold - amount < tonumber(h[3]) then return refuse('insufficient') end",
        "if false then return refuse('insufficient') end",
        [I_LUA],
        "a deduct never takes the balance below the threshold",
    ),
    m(
        "lua-limit",
        LEDGER_APPLY,
        "if balance + amount > tonumber(ARGV[8]) then return refuse('limit') end",
        "if false then return refuse('limit') end",
        [I_LUA],
        "a recharge never passes the largest exact balance",
    ),
    m(
        "lua-key-conflict",
        LEDGER_APPLY,
        "if seen[1] ~= fingerprint then return {'conflict'} end",
        "if false then return {'conflict'} end",
        [I_LUA],
        "an Idempotency-Key used with another body is a conflict, not a replay",
    ),
    m(
        "lua-refusal-replayed",
        LEDGER_APPLY,
        "if seen[5] == 'refused' then return {redis.call('HGET', KEYS[4], 'refused'), seen[3], seen[4]} end",
        "if false then return {redis.call('HGET', KEYS[4], 'refused'), seen[3], seen[4]} end",
        [I_LUA],
        "a refusal is the key's answer for good: a retry after a recharge does not charge",
    ),
    m(
        "lua-in-progress",
        LEDGER_APPLY,
        "if seen[5] ~= 'done' and tonumber(seen[6]) >= tonumber(ARGV[9]) then return {'in_progress'} end",
        "if false then return {'in_progress'} end",
        [I_LUA],
        "a key whose first request is still publishing answers in_progress, not an unacknowledged replay",
    ),
    m(
        "lua-resend-recognised",
        LEDGER_APPLY,
        "local applied = redis.call('GET', KEYS[2])",
        "local applied = false",
        [I_LUA, "tests/integration/test_resend_after_settle.py"],
        "a redis-py resend of a script that already ran charges nothing",
    ),
    m(
        "lua-bounded-pending",
        LEDGER_APPLY,
        "if max_pending > 0 and redis.call('ZCARD', KEYS[3]) >= max_pending then return {'too_many_pending'} end",
        "if false then return {'too_many_pending'} end",
        ["tests/integration/test_limits.py"],
        "an account whose entries do not reach the DB takes no more (memory is finite)",
    ),
    m(
        "lua-bounded-keys",
        LEDGER_APPLY,
        "  if opened > max_keys then",
        "  if false then",
        ["tests/integration/test_limits.py"],
        "an account opens at most MAX_IDEMPOTENCY_KEYS new deduct / recharge keys per window (memory is finite)",
    ),
    # ---- other Lua scripts -----------------------------------------------------------------------------------
    m(
        "lua-settle-keeps-evidence",
        "layers/lua/ledger_settle.lua",
        "redis.call('SET', KEYS[i], 'settled;' .. entry, 'EX', SETTLED_TTL_S)",
        "redis.call('DEL', KEYS[i])",
        ["tests/integration/test_resend_after_settle.py"],
        "a settled entry stays recognisable past redis-py's resend horizon",
    ),
    m(
        "lua-claim-skips-rolled-back",
        "layers/lua/outbox_claim.lua",
        "if redis.call('GET', key) == 'rolledback' then",
        "if false then",
        [I_LUA, "tests/integration/test_rolled_back.py", "tests/integration/test_writer.py"],
        "the voucher and red packet persisters never persist a change the API rolled back (its tombstone)",
    ),
    # ---- transfers/service.py: two charges under the transfer's keys (issue 34) ------------------------------
    m(
        "transfer-same-account",
        TRANSFERS,
        "        if from_id == to_id:",
        "        if False:",
        [I_TRANSFERS],
        "a transfer to oneself is refused and changes nothing",
    ),
    m(
        "transfer-across-currencies",
        TRANSFERS,
        "        if payer != payee:",
        "        if False:",
        [I_TRANSFERS],
        "money moves between accounts of one currency only",
    ),
    m(
        "transfer-credit-after-lost-debit-race",
        TRANSFERS,
        "        if not self.store.move(tid, PENDING, DEBITED, now, debit_id=debit.entry_id):",
        "        if not self.store.move(tid, PENDING, DEBITED, now, debit_id=debit.entry_id) and False:",
        [I_TRANSFERS],
        "a debit made after its transfer FAILED is never credited (it is given back)",
    ),
    m(
        "transfer-release-despite-credit",
        TRANSFERS,
        "        if credited is not None:",
        "        if False:",
        [I_TRANSFERS],
        "a credit made after the release began stands, and the debit is then not given back too",
    ),
    m(
        "transfer-gives-up-on-a-transient-credit",
        TRANSFERS,
        "    return isinstance(exc, (errors.BalanceLimit, errors.AccountNotFound))",
        "    return True",
        [I_TRANSFERS],
        "only a refusal that stands fails a transfer whose debit was made; a failure that may pass leaves it in flight",
    ),
    m(
        "lua-transfer-plain-only",
        "layers/lua/ledger_apply.lua",
        "    if kind_in(KIND_PLAIN_ONLY, kind) then on_hold = on_hold + grants_live(KEYS[10], KEYS[11], KEYS[7], ts) end",
        "    -- the live grants within reach",
        [f"{I_TRANSFERS}::test_a_transfer_moves_only_plain_money_and_leaves_the_payers_grants_whole"],
        "a transfer moves plain money only: an ASYNC payer's live grants are out of its reach",
    ),
    m(
        "py-transfer-sync-plain-only",
        LEDGER_SERVICE,
        "out_of_reach += live_remaining(seen.grants, now)",
        "out_of_reach += 0",
        [f"{I_TRANSFERS}::test_a_transfer_moves_only_plain_money_and_leaves_the_payers_grants_whole"],
        "a transfer moves plain money only: a SYNC payer's live grants are out of its reach",
    ),
    m(
        "py-sync-memo-keeps-an-async-cache",
        LEDGER_SERVICE,
        "                if cache_said_sync:\n                    self.store.drop_cache(user_id)",
        "                if True:\n                    self.store.drop_cache(user_id)",
        [
            "tests/integration/test_sync_row_lock.py::"
            "test_an_account_remembered_sync_and_since_switched_to_async_is_charged_in_redis_and_its_cache_kept"
        ],
        "an account remembered SYNC and found ASYNC under the row lock keeps its cache (no rebuild, no RECOVERING)",
    ),
    m(
        "py-packet-second-claim-in-a-batch",
        "functions/hotledger/redpackets/persist.py",
        "items[e.item_id] = ItemRow(e.item_id, e.packet_id, e.amount, e.user_id, e.ts)",
        "items[e.item_id] = items.get(e.item_id)",
        [
            "tests/integration/test_redpackets.py::"
            "test_a_late_claim_and_the_regrab_of_its_item_in_one_batch_pay_once_and_refuse_the_other_loudly"
        ],
        "a batch's second claim of one item is judged against the first: refused loudly, not settled unpaid",
    ),
    m(
        "py-grants-load-starts-from-what-booked-spends-left",
        "functions/hotledger/grants/rows.py",
        "left = max(e.amount - spent_before.get(e.entry_id, 0), 0)",
        "left = e.amount",
        [
            f"{I_GRANTS}::"
            "test_a_cache_load_while_a_spend_is_booked_before_its_grant_starts_the_grant_from_what_the_spend_left"
        ],
        "a cache load starts a grant booked after spends of it from what they left, as the books do",
    ),
    m(
        "lua-grab-once",
        "layers/lua/redpacket_grab.lua",
        "local seen = redis.call('HGET', KEYS[3], ARGV[2])",
        "local seen = false",
        [I_LUA, "tests/integration/test_redpackets.py"],
        "a user grabs a red packet at most once",
    ),
    m(
        "lua-grab-expired",
        "layers/lua/redpacket_grab.lua",
        "if p[1] ~= 'OPEN' or now >= tonumber(p[2]) then return {'expired'} end",
        "if p[1] ~= 'OPEN' then return {'expired'} end",
        [I_LUA, "tests/integration/test_redpackets.py"],
        "an expired packet (being refunded) pays out nothing more",
    ),
    m(
        "lua-voucher-sold-out",
        "layers/lua/voucher_order.lua",
        "if tonumber(v[1]) <= 0 then\n  elsewhere = others()",
        "if tonumber(v[1]) < 0 then\n  elsewhere = others()",
        [I_LUA, "tests/integration/test_vouchers.py"],
        "a flash sale never sells more than its stock",
    ),
    m(
        "lua-voucher-bucket-sold-out",
        "layers/lua/voucher_take.lua",
        "if tonumber(v[1]) <= 0 then return {'sold_out'} end",
        "if tonumber(v[1]) < 0 then return {'sold_out'} end",
        ["tests/integration/test_voucher_buckets.py"],
        "a stock bucket never sells more than its share",
    ),
    m(
        "lua-voucher-away-limit",
        "layers/lua/voucher_order.lua",
        "if #elsewhere == 0 then return {'sold_out'} end",
        "if #elsewhere == 0 then elsewhere = {(home + 1) % shards} end",
        ["tests/integration/test_voucher_buckets.py"],
        "a sale is sold out, in one script call, once every bucket is seen empty",
    ),
    m(
        "lua-voucher-per-user",
        "layers/lua/voucher_order.lua",
        "if taken >= tonumber(v[4]) then return {'already', taken} end",
        "if taken > tonumber(v[4]) then return {'already', taken} end",
        [I_LUA, "tests/integration/test_vouchers.py"],
        "a user buys at most the voucher's per-user limit",
    ),
    m(
        "lua-voucher-ended",
        "layers/lua/voucher_order.lua",
        "if now >= tonumber(v[3]) then return {'ended', v[3]} end",
        "if false then return {'ended', v[3]} end",
        [I_LUA, "tests/integration/test_vouchers.py"],
        "nothing is sold after the sale's end",
    ),
    m(
        "lua-lock-fence-grows",
        "layers/lua/lock_acquire.lua",
        "local fence = math.max(tonumber(redis.call('GET', KEYS[2]) or '0') + 1,",
        "local fence = math.max(tonumber(redis.call('GET', KEYS[2]) or '0'),",
        ["tests/integration/test_lock.py"],
        "every new lock owner gets a larger fencing token than the last",
    ),
    m(
        "lua-lock-fence-clock",
        "layers/lua/lock_acquire.lua",
        "tonumber(now[1]) * 1000000 + math.floor(tonumber(now[2]) / 1000) * 1000)",
        "0)",
        ["tests/integration/test_lock.py"],
        "a token handed out after Redis lost the counter's last increments is larger than every one before",
    ),
    m(
        "lua-idem-conflict",
        "layers/lua/idem_begin.lua",
        "if fp ~= ARGV[1] then return {'conflict'} end",
        "if false then return {'conflict'} end",
        ["tests/integration/test_idempotency_keys.py"],
        "a route Idempotency-Key reused with another request is a conflict",
    ),
    m(
        "lua-idem-running",
        "layers/lua/idem_begin.lua",
        "if tonumber(redis.call('HGET', KEYS[1], 'lease_until')) > now then return {'running'} end",
        "if false then return {'running'} end",
        ["tests/integration/test_idempotency_keys.py"],
        "a key's first request still running is not run a second time concurrently",
    ),
    m(
        "lua-inbox-duplicate",
        "layers/lua/inbox_post.lua",
        "if first then return {'duplicate', first} end",
        "if false then return {'duplicate', first} end",
        ["tests/integration/test_notices.py"],
        "one business event posts one inbox message",
    ),
    m(
        "lua-inbox-age-trim",
        "layers/lua/inbox_post.lua",
        "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. (tonumber(ARGV[2]) - tonumber(ARGV[4]) * 1000))",
        "-- age trim removed",
        ["tests/integration/test_notices.py"],
        "the inbox index drops messages older than their TTL (bounded memory)",
    ),
    m(
        "lua-inbox-age-boundary",
        "layers/lua/inbox_post.lua",
        "'-inf', '(' .. (tonumber(ARGV[2])",
        "'-inf', '' .. (tonumber(ARGV[2])",
        ["tests/integration/test_notices.py"],
        "a message exactly as old as the TTL is still indexed (the trim is exclusive)",
    ),
    # ---- ledger service: SYNC charges, idempotency decisions ------------------------------------------------
    m(
        "py-fingerprint-kind",
        LEDGER_SERVICE,
        'f"{kind}:{user_id}:{amount}"',
        'f"{user_id}:{amount}"',
        [U_LEDGER, "tests/integration/test_ledger_idempotency.py"],
        "a recharge reusing a deduct's Idempotency-Key (same amount) is a conflict",
    ),
    m(
        "py-sync-closed",
        LEDGER_SERVICE,
        '        if account.open_flag != "1":\n            return ApplyReply(ApplyStatus.CLOSED',
        "        if False:\n            return ApplyReply(ApplyStatus.CLOSED",
        [U_LEDGER, "tests/integration/test_api_handler.py"],
        "a SYNC deduct on a closed API is refused",
    ),
    m(
        "py-sync-insufficient",
        LEDGER_SERVICE,
        "if account.balance - on_hold - amount < account.threshold:",
        "if False:",
        [U_LEDGER, "tests/integration/test_api_handler.py"],
        "a SYNC deduct never takes the balance below the threshold",
    ),
    m(
        "py-sync-limit",
        LEDGER_SERVICE,
        "elif account.balance + amount > MAX_BALANCE:",
        "elif False:",
        [U_LEDGER, "tests/integration/test_api_handler.py"],
        "a SYNC recharge never passes the largest exact balance",
    ),
    m(
        "py-stored-conflict",
        LEDGER_SERVICE,
        "    if seen.fingerprint != request:\n        return ApplyReply(ApplyStatus.CONFLICT)",
        "    if False:\n        return ApplyReply(ApplyStatus.CONFLICT)",
        [U_LEDGER, "tests/integration/test_ledger_idempotency.py"],
        "a key the DB answers is a conflict for another request, also once Redis forgot it",
    ),
    m(
        "py-client-refusal-final",
        LEDGER_SERVICE,
        "return bool(idem_key) and not isinstance(idem_key, ServiceKey)",
        "return False",
        [U_LEDGER, "tests/integration/test_ledger_idempotency.py"],
        "a business refusal is a client key's answer for good",
    ),
    m(
        "py-service-key-refusal-not-final",
        LEDGER_SERVICE,
        "return bool(idem_key) and not isinstance(idem_key, ServiceKey)",
        "return bool(idem_key)",
        [U_LEDGER, U_PACKETS, "tests/integration/test_payment_orders.py"],
        "the service's own keys (payorder<id>, rp<id>) can charge again once the cause of a refusal is gone",
    ),
    m(
        "py-open-after-deduct",
        LEDGER_SERVICE,
        'if sign < 0 and balance <= 0 and open_flag == "1":',
        'if sign < 0 and balance < 0 and open_flag == "1":',
        [U_LEDGER, I_LUA],
        "a deduct reaching 0 closes the API (SYNC like ASYNC)",
    ),
    m(
        "py-sync-fence",
        "functions/hotledger/ledger/tx.py",
        "if seen is not None and (seen[0] > fence or (seen[0] == fence and seen[1] not in (None, owner))):",
        "if seen is not None and (seen[0] == fence and seen[1] not in (None, owner)):",
        ["tests/integration/test_lock.py"],
        "a SYNC write under a stale lock token (a lost lease) is refused",
    ),
    m(
        "py-hold-dead-letters",
        "functions/hotledger/outbox/log_hold.py",
        "        if self.unresolved_dead_letters():",
        "        if False:",
        ["tests/integration/test_log_hold.py"],
        "a rebuilt entity stays RECOVERING while the trigger's dead-letter topic holds an unresolved record",
    ),
    m(
        "py-sync-fence-holder",
        "functions/hotledger/ledger/tx.py",
        "if seen is not None and (seen[0] > fence or (seen[0] == fence and seen[1] not in (None, owner))):",
        "if seen is not None and seen[0] > fence:",
        ["tests/integration/test_lock.py"],
        "an equal lock token from another holder (handed out twice after a Redis loss) is refused",
    ),
    m(
        "py-sync-row-lock",
        "functions/hotledger/ledger/tx.py",
        '"SELECT balance, version, threshold, seq, on_hold, booked_at FROM t_account WHERE user_id = %s FOR UPDATE"',
        '"SELECT balance, version, threshold, seq, on_hold, booked_at FROM t_account WHERE user_id = %s"',
        ["tests/integration/test_sync_row_lock.py"],
        "SYNC charges of one account are serialized by its row lock (no Redis account lock): none below the threshold",
    ),
    # ---- writer ------------------------------------------------------------------------------------------------
    m(
        "py-writer-dedupe-ids",
        "functions/hotledger/outbox/writer.py",
        "unique = list({event_id(e): e for e in events}.values())",
        "unique = list(events)",
        ["tests/unit/test_writer_routing.py", "tests/integration/test_writer.py"],
        "two copies of one event in a batch persist once, and the batch does not fail",
    ),
    m(
        "py-writer-skip-stored",
        LEDGER_PERSIST,
        "fresh = [e for e in events if e.id not in stored]",
        "fresh = list(events)",
        [U_LEDGER, "tests/integration/test_writer.py"],
        "an entry the DB holds already is skipped (a replay changes nothing)",
    ),
    m(
        "py-writer-key-in-batch",
        LEDGER_PERSIST,
        'if e.idem_key is not None and (key in seen or (stored is not None and "refused" not in stored.answer)):',
        'if e.idem_key is not None and (stored is not None and "refused" not in stored.answer):',
        [U_LEDGER, "tests/integration/test_writer.py"],
        "one Idempotency-Key holds one entry, also within one batch",
    ),
    m(
        "py-writer-key-taken",
        LEDGER_PERSIST,
        'if e.idem_key is not None and (key in seen or (stored is not None and "refused" not in stored.answer)):',
        "if e.idem_key is not None and key in seen:",
        [U_LEDGER, "tests/integration/test_writer.py"],
        "an entry whose key already answers another entry in the DB is dead-lettered, not a second charge",
    ),
    m(
        "py-writer-stale-open",
        LEDGER_PERSIST,
        "latest[user_id].open if latest[user_id].version > db_versions[user_id] else None",
        "latest[user_id].open",
        [U_LEDGER, "tests/integration/test_writer.py"],
        "the writer takes api_open only from an event newer than the DB's version",
    ),
    m(
        "py-writer-rolled-back-db",
        "functions/hotledger/outbox/persister.py",
        "judged = self.judge(tx, locked, [e for e in claimed if self.id_of(e) not in undone])",
        "judged = self.judge(tx, locked, claimed)",
        ["tests/integration/test_rolled_back.py", U_PACKETS],
        "a change the DB records as rolled back is never persisted, whatever Redis lost",
    ),
    m(
        "py-voucher-slot",
        VOUCHER_PERSIST,
        "            if _slot(e) in holders:",
        "            if False:",
        [U_VOUCHERS, "tests/integration/test_vouchers.py"],
        "one (voucher, user, seq) slot holds one order",
    ),
    m(
        "py-voucher-db-stock",
        VOUCHER_PERSIST,
        "if left[e.voucher_id] > 0:",
        "if True:",
        [U_VOUCHERS, "tests/integration/test_vouchers.py"],
        "the DB never accepts more orders than the voucher's stock",
    ),
    # ---- payment orders: pay and close exactly once ----------------------------------------------------------
    m(
        "py-order-close-finds-charge",
        PAYMENT_ORDERS,
        "                if charge is not None:\n                    self._settle_paid(payment_order, charge.entry_id)",
        "                if False:\n                    self._settle_paid(payment_order, charge.entry_id)",
        [I_ORDERS],
        "a close that finds the order's payorder<id> charge settles it PAID, never closes a charged order",
    ),
    m(
        "py-order-close-waits-in-flight",
        PAYMENT_ORDERS,
        "                if in_flight:",
        "                if False:",
        [I_ORDERS],
        "a close never decides while a pay of the order may still be charging (503, nothing changed)",
    ),
    m(
        "py-order-charge-after-close-refunded",
        PAYMENT_ORDERS,
        "        if self._load(payment_order.id).state is PaymentOrderState.PAID:\n            return",
        "        if True:\n            return",
        [I_ORDERS],
        "a charge that lands after the order was closed is refunded (charged and closed never both stand)",
    ),
    # ---- reconcilers --------------------------------------------------------------------------------------------
    m(
        "py-reconcile-creating",
        PACKET_RECONCILE,
        "for packet in self.store.creating(cutoff, PAGE):",
        "for packet in []:",
        [U_PACKETS, "tests/integration/test_redpackets.py"],
        "the reconciler finishes red packets left CREATING (debit again under the same key, then open or FAILED)",
    ),
    m(
        "py-reconcile-failed-debited",
        PACKET_RECONCILE,
        "for packet_id in self.store.failed_with_debit(PAGE):",
        "for packet_id in []:",
        [U_PACKETS, "tests/integration/test_redpackets.py"],
        "a FAILED packet whose sender was debited after all is refunded",
    ),
    m(
        "py-packet-refund-once",
        "functions/hotledger/redpackets/service.py",
        "if packet.refund and not self.store.refund_paid(packet_id, packet.sender_id):",
        "if packet.refund:",
        [U_PACKETS, "tests/integration/test_redpackets.py"],
        "a packet's refund is credited exactly once (t_pay is checked for its key first)",
    ),
    m(
        "py-packet-expire-waits-claims",
        "functions/hotledger/redpackets/service.py",
        "if reply.status is not ExpireStatus.EXPIRED or reply.claims_pending > 0 or now_ms < reply.hold_until:",
        "if reply.status is not ExpireStatus.EXPIRED or now_ms < reply.hold_until:",
        [U_PACKETS, "tests/integration/test_redpackets.py"],
        "an expired packet is refunded only once no claim is in flight (total paid out == its total)",
    ),
    m(
        "py-reconcile-ledger-drift",
        "functions/hotledger/ledger/reconcile.py",
        "if cache.dirty or cache.version < account.version or snapshot.balance != quick:",
        "if cache.dirty or cache.version < account.version:",
        ["tests/integration/test_reconciler.py", "tests/integration/test_reconciler_convergence.py"],
        "the reconciler corrects a Redis balance that drifted from DB + pending entries",
    ),
    # ---- issue 19: money edges, round 2 --------------------------------------------------------------------
    m(
        "charge-not-booked-not-a-key-answer",
        "functions/hotledger/errors.py",
        "waits = (IdempotencyInProgress, HoldBusy, ChargeNotBooked)",
        "waits = (IdempotencyInProgress, HoldBusy)",
        ["tests/integration/test_refunds.py"],
        "a refund waiting for its charge's booking is no key's answer: a retry under the key makes it once booked",
    ),
    m(
        "grant-past-expiry-checked-on-a-retry",
        "functions/hotledger/ledger/service.py",
        "and (idem_key is None or self.charged_with(KIND_RECHARGE, user_id, idem_key) is None)",
        "and True",
        ["tests/integration/test_grants.py"],
        "a granted recharge retried under its key after its expires_at is answered as the first time, not 422",
    ),
    m(
        "py-429-not-a-key-answer",
        "functions/hotledger/errors.py",
        "return exc.status < 500 and exc.status != 429 and not isinstance(exc, waits)",
        "return exc.status < 500 and not isinstance(exc, waits)",
        ["tests/integration/test_limits.py"],
        "a 429 (the ledger's backlog under a route, a quota) is never a key's answer",
    ),
    m(
        "py-key-scopes-by-caller",
        "functions/api/authorization.py",
        'return f"user:{scope}" if _end_user.get() else scope',
        "return scope",
        ["tests/integration/test_authorization.py"],
        "end users and backends never share Idempotency-Key scopes",
    ),
    m(
        "py-no-existence-oracle",
        "functions/api/authorization.py",
        "        if isinstance(owner, HiddenOwner):  # an entity found by its id: another user's answers as a missing one",
        "        if False:",
        ["tests/integration/test_authorization.py"],
        "another user's order named by id answers as a missing one",
    ),
    m(
        "py-405-allow",
        "functions/api/app.py",
        "    if allowed:",
        "    if False:",
        ["tests/unit/test_api_edge.py"],
        "an undeclared method of a route is 405 with Allow",
    ),
    m(
        "py-key-retention",
        "functions/hotledger/features.py",
        "        run.report.keys_pruned = sum(retention.prune(run.now_ms - self.retention_ms, run.budget).values())",
        "        run.report.keys_pruned = 0",
        ["tests/integration/test_reconciler.py"],
        "key and rollback records past their retention are pruned",
    ),
    m(
        "py-refused-entry-settled",
        "functions/hotledger/ledger/persist.py",
        "        self.store.take_back(e.user_id, e.id, e.kind, e.idem_key)",
        "        pass",
        ["tests/integration/test_writer_poison.py"],
        "a pending entry the DB refuses is settled as refused in Redis",
    ),
    m(
        "py-order-fence-holder",
        "functions/hotledger/notices/store.py",
        "seen[0] > held.fence or (seen[0] == held.fence and seen[1] not in (None, held.owner))",
        "seen[0] > held.fence",
        [I_ORDERS],
        "an equal lock token from another holder can neither take nor close a payment order",
    ),
    # ---- issue 20: holds, refunds, the ledger's numbering -------------------------------------------------------
    m(
        "lua-deduct-ignores-holds",
        LEDGER_APPLY,
        "if balance - (tonumber(h[7]) or 0) - on_hold - amount < tonumber(h[3]) then return refuse('insufficient') end",
        "if balance - (tonumber(h[7]) or 0) - amount < tonumber(h[3]) then return refuse('insufficient') end",
        [I_HOLDS],
        "a deduct spends available only: what holds keep is not spendable",
    ),
    m(
        "lua-hold-authorize-overdraws",
        "layers/lua/hold_change.lua",
        "if balance - held - live_holds(tonumber(h[8]) or 0, KEYS[4], KEYS[5], ts) - amount < tonumber(h[3]) then",
        "if false then",
        [I_HOLDS],
        "a hold is refused like a deduct, against available",
    ),
    m(
        "lua-expired-hold-counts",
        "layers/lua/lib/holds.lua",
        "on_hold = on_hold - (tonumber(r[1]) - tonumber(r[2]))",
        "on_hold = on_hold",
        [I_HOLDS],
        "a hold past expires_at keeps nothing out of available, tidied or not (lib/holds live_holds)",
    ),
    m(
        "lua-event-drops-kind-fields",
        "layers/lua/lib/event.lua",
        "fields[#fields + 1] = {name, value}",
        "",
        ["tests/integration/test_lua_events.py"],
        "a streamed ledger event carries its kind's fields, as the entry string and Entry.event do",
    ),
    m(
        "lua-entry-text-cut-at-semicolon",
        "layers/lua/lib/entry.lua",
        "e[names[#names] or ENTRY_HEAD[#ENTRY_HEAD]] = table.concat(parts, ';', count)",
        "e[names[#names] or ENTRY_HEAD[#ENTRY_HEAD]] = parts[count]",
        ["tests/integration/test_lua_events.py"],
        "a description or reason with ';' in it is read back whole from the entry string",
    ),
    m(
        "lua-hold-capture-over",
        "layers/lua/hold_change.lua",
        "if take > remaining then return {'exceeds', string.format('%d', remaining)} end",
        "",
        [I_HOLDS],
        "a capture never takes more than the hold has left",
    ),
    m(
        "lua-hold-expired-captured",
        "layers/lua/hold_change.lua",
        "elseif now >= tonumber(expires_at) then\n    return {'expired'}",
        "elseif false then\n    return {'expired'}",
        [I_HOLDS],
        "a hold past expires_at is neither captured nor voided",
    ),
    m(
        "lua-refund-over-charge",
        "layers/lua/ledger_refund.lua",
        "if refunded + amount > tonumber(ARGV[9]) then",
        "if false then",
        ["tests/integration/test_refunds.py"],
        "refunds of a charge never pass what was charged",
    ),
    m(
        "py-seq-gap",
        "functions/hotledger/ledger/book.py",
        "head = LedgerHead(head.seq + 1,",
        "head = LedgerHead(head.seq + 2,",
        ["tests/integration/test_history.py", "tests/unit/test_book.py"],
        "an account's entries are numbered without gaps",
    ),
    # ---- issue 31: one account, one rulebook (the holes' guards) ---------------------------------------------
    m(
        "balance-before-opening",
        "functions/hotledger/history/store.py",
        "            self._refuse_before_opening(user_id, at_ms)\n",
        "",
        ["tests/integration/test_history.py"],
        "before an account's opening entry the ledger cannot say what it held: 422, never 0 (hole 6)",
    ),
    m(
        "rebuild-hold-never",
        "functions/hotledger/outbox/log_hold.py",
        'return (now_ms, _encode(unapplied)) if unapplied else (0, "")',
        'return (0, "")',
        ["tests/integration/test_ledger_idempotency.py"],
        "a rebuilt account whose own records are still in the log holds new keys until the writer applied them",
    ),
    m(
        "rebuild-hold-always",
        "functions/hotledger/outbox/log_hold.py",
        "if not since:\n            return {}",
        "if True:\n            return None",
        ["tests/integration/test_ledger_idempotency.py"],
        "a cache miss with nothing of the account's in the log is no Redis loss: no hold (hole 8)",
    ),
    m(
        "hold-change-rebuild-hold",
        "layers/lua/hold_change.lua",
        "local held = rebuild_hold(KEYS[1], h[9], h[10], now)",
        "local held = nil",
        ["tests/integration/test_ledger_idempotency.py"],
        "a hold's change waits while the account's own records are on their way to the DB (hole 1)",
    ),
    m(
        "hold-change-one-clock",
        "layers/lua/hold_change.lua",
        "if script_now > tonumber(ts) then ts = string.format('%d', script_now) end",
        "",
        [I_HOLDS],
        "a hold's expiry is judged by the script's clock, never a time read before the call stalled (hole 3)",
    ),
    m(
        "ledger-load-keeps-waits",
        "layers/lua/ledger_load.lua",
        "if waiting then waits[#waits + 1] = {id, waiting} end",
        "",
        ["tests/integration/test_ledger_idempotency.py"],
        "a reload with a credit in flight keeps it unspendable until durable (hole 7)",
    ),
    m(
        "refund-unbooked-charge",
        "functions/hotledger/refunds/service.py",
        "                raise _not_booked(charge_kind, charge_id)\n            amount, idem_key = booked",
        "                return self.ledger.get_deduct(user_id, charge_id).amount\n            amount, idem_key = booked",
        ["tests/integration/test_refunds.py"],
        "a refund covers only a charge the books hold (hole 2)",
    ),
    m(
        "refund-service-charge",
        "functions/hotledger/refunds/service.py",
        "if idem_key is not None and not is_client_key(idem_key):",
        "if False:",
        ["tests/integration/test_refunds.py"],
        "the service's own charges (a packet's debit) are not refundable by a refund (hole 5)",
    ),
    m(
        "refund-resume-db-first",
        "functions/hotledger/refunds/service.py",
        "stood = self._pending(user_id, int(resumed_from)) or self.store.stored(user_id, int(resumed_from))",
        "stood = self.store.stored(user_id, int(resumed_from)) or self._pending(user_id, int(resumed_from))",
        ["tests/integration/test_refunds.py"],
        "a resumed refund looks in Redis before the DB, so one the writer settles between the reads is seen (hole 4)",
    ),
    m(
        "refund-books-unbacked",
        "functions/hotledger/refunds/tx.py",
        "        if unbacked:",
        "        if False:",
        ["tests/integration/test_refunds.py"],
        "the books refuse a refund whose charge they do not hold or that passes it (hole 2)",
    ),
    m(
        "py-refund-waits-for-the-holds-changes",
        "functions/hotledger/refunds/service.py",
        'if hold is None or hold.state == "ACTIVE" or self._changes_on_their_way(user_id, charge_id):',
        'if hold is None or hold.state == "ACTIVE":',
        ["tests/integration/test_refunds.py", I_GRANTS],
        "a hold whose ending change was booked before older changes of it (the reconciler persisting what the broker"
        " lost: its authorize, a partial capture) is refunded only once they are booked",
    ),
    m(
        "balance-at-expired-holds",
        "functions/hotledger/history/store.py",
        "return BalanceAt(seq, balance, available + self._expired_holds_kept(user_id, at_ms), booked_at)",
        "return BalanceAt(seq, balance, available, booked_at)",
        ["tests/integration/test_history.py"],
        "balance?at= never counts a hold past its expiry (hole 6)",
    ),
    m(
        "order-rolled-back-reads-pending",
        LEDGER_SERVICE,
        'status = "ROLLED_BACK" if self.store.is_rolled_back(entry_id) else "PENDING"',
        'status = "PENDING"',
        ["tests/integration/test_ledger_idempotency.py"],
        "an order the DB recorded rolled back reads ROLLED_BACK (hole 6)",
    ),
    m(
        "hold-change-before-authorize-durable",
        "layers/lua/hold_change.lua",
        "if redis.call('HEXISTS', KEYS[4], hold_id .. ':authorizing') == 1 then return {'busy'} end",
        "",
        [I_HOLDS],
        "a hold is not captured, voided or expired before its authorize is durable (hole 2 c)",
    ),
    m(
        "py-hold-load-keeps-what-was-booked-before-its-authorize",
        "functions/hotledger/holds/tx.py",
        "WHERE user_id = %s AND (state = 'ACTIVE' OR created_at = 0)",
        "WHERE user_id = %s AND state = 'ACTIVE'",
        [I_HOLDS],
        "a cache load never makes new a hold whose ending change was booked before its authorize (the reconciler"
        " persisting what the broker lost)",
    ),
    m(
        "py-hold-load-authorize-keeps-the-booked-state",
        "functions/hotledger/holds/store.py",
        "                ACTIVE if booked is None else booked.state,",
        "                ACTIVE,",
        [I_HOLDS],
        "a pending authorize applied by a cache load keeps the state its hold's changes booked before it left",
    ),
    m(
        "py-hold-load-authorize-keeps-the-booked-capture",
        "functions/hotledger/holds/store.py",
        "                0 if booked is None else booked.captured,",
        "                0,",
        [I_HOLDS],
        "a pending authorize applied by a cache load keeps what its hold's captures booked before it took",
    ),
    m(
        "packet-first-debit-held-unknown",
        "functions/hotledger/redpackets/service.py",
        "if first_debit and isinstance(exc, errors.Recovering):",
        "if False:",
        ["tests/integration/test_ledger_idempotency.py"],
        "a red packet whose first debit is held is refused and left unsent, not OUTCOME_UNKNOWN (hole 8)",
    ),
    # ---- issue 31: bookings have subscribers (the registry hands each booking to monitors and webhooks) ---------
    m(
        "booking-subscribers-skipped",
        "functions/hotledger/ledger/tx.py",
        "            self.on_booked(Booking(self.cursor, rows, prefetched=prefetched or {}))",
        "            Booking(self.cursor, rows, prefetched=prefetched or {})",
        ["tests/integration/test_monitors.py"],
        "every booking is handed to the registered subscribers in its transaction: monitors judge its rows",
    ),
    m(
        "booking-subscribers-reordered",
        "functions/hotledger/features.py",
        '    "hotledger.monitors.feature",\n    "hotledger.webhooks.feature",',
        '    "hotledger.webhooks.feature",\n    "hotledger.monitors.feature",',
        ["tests/integration/test_webhooks.py"],
        "the monitors hear of a booking before the webhooks, which send the monitors' crossings",
    ),
    # ---- issue 31: a new kind of entry by the table (an operator's adjustment) -----------------------------------
    m(
        "kind-debit-by-letter",
        LEDGER_APPLY,
        "if kind_in(KIND_DEBITS, kind) then",
        "if kind == 'D' then",
        ["tests/integration/test_adjustments.py"],
        "ledger_apply debits every kind whose row says so (an adjustment down), not the deduct's letter alone",
    ),
    m(
        "kind-undo-by-letter",
        "layers/lua/ledger_rollback.lua",
        "elseif kind_in(KIND_DEBITS, kind) then",
        "elseif kind == 'D' then",
        ["tests/integration/test_adjustments.py"],
        "a failed publish gives back every debit kind (an adjustment down), not the deduct's letter alone",
    ),
    m(
        "rules-adjustment-service",
        "functions/hotledger/ops/routes.py",
        '("POST", "/ops/accounts/<user_id>/adjustments"): only(ADMIN),',
        '("POST", "/ops/accounts/<user_id>/adjustments"): only(ADMIN, SERVICE),',
        ["tests/integration/test_adjustments.py"],
        "only an operator adjusts a balance",
    ),
    # ---- issue 35, class 1: who may call what (a route rule widened) ------------------------------------------
    m(
        "rules-owner-recharges",
        "functions/hotledger/ledger/routes.py",
        '("POST", "/accounts/<user_id>/recharge"): only(SERVICE),',
        '("POST", "/accounts/<user_id>/recharge"): only(SERVICE, owner=path_arg("user_id")),',
        [I_ROUTES],
        "an end user never recharges (mints money for) their own account",
    ),
    m(
        "rules-owner-captures",
        "functions/hotledger/holds/routes.py",
        '("POST", "/accounts/<user_id>/holds/<hold_id>/capture"): only(SERVICE),',
        '("POST", "/accounts/<user_id>/holds/<hold_id>/capture"): only(SERVICE, owner=path_arg("user_id")),',
        [I_ROUTES],
        "a hold is captured by the backend only, never by its account's end user",
    ),
    m(
        "rules-service-creates-vouchers",
        "functions/hotledger/vouchers/routes.py",
        '("POST", "/vouchers"): only(ADMIN),',
        '("POST", "/vouchers"): only(SERVICE, ADMIN),',
        [I_ROUTES],
        "only operators create vouchers (flash sales), not services",
    ),
    m(
        "rules-service-reads-dead-letters",
        "functions/hotledger/notices/routes.py",
        '("GET", "/delay-queues/<queue>/dead-letters"): only(ADMIN),',
        '("GET", "/delay-queues/<queue>/dead-letters"): only(SERVICE, ADMIN),',
        [I_ROUTES],
        "a delay queue's dead letters are the operators', not the backend's",
    ),
    m(
        "rules-operator-reads-inbox",
        "functions/hotledger/notices/routes.py",
        '("GET", "/inbox/<account>/messages"): only(SERVICE, owner=path_arg("account")),',
        '("GET", "/inbox/<account>/messages"): only(SERVICE, ADMIN, owner=path_arg("account")),',
        [I_ROUTES],
        "an inbox is read by its user and the platform's backend, not by operators",
    ),
    m(
        "rules-operator-pays",
        "functions/hotledger/notices/routes.py",
        '("POST", "/orders/<order_id>/pay"): only(SERVICE, owner=_payment_order_owner),',
        '("POST", "/orders/<order_id>/pay"): only(SERVICE, ADMIN, owner=_payment_order_owner),',
        [I_ROUTES],
        "an operator never pays a user's payment order (charges their account)",
    ),
    m(
        "rules-anyone-grabs",
        "functions/hotledger/redpackets/routes.py",
        '("POST", "/redpackets/<packet_id>/grab"): only(SERVICE, owner=body_field("user_id")),',
        '("POST", "/redpackets/<packet_id>/grab"): Rule(anyone=True),',
        [I_ROUTES],
        "a red packet is grabbed by the user themselves or the backend, never for another user",
    ),
    m(
        "rules-user-lists-webhooks",
        "functions/hotledger/webhooks/routes.py",
        '("GET", "/webhook-endpoints"): only(SERVICE, ADMIN),',
        '("GET", "/webhook-endpoints"): __import__("api.rules").rules.Rule(anyone=True),',
        [I_ROUTES],
        "webhook endpoints (their URLs) are the backend's and the operators', not end users'",
    ),
    m(
        "rules-other-deletes-monitor",
        "functions/hotledger/monitors/routes.py",
        '("DELETE", "/accounts/<user_id>/monitors/<monitor_id>"): only(SERVICE, ADMIN, owner=path_arg("user_id")),',
        '("DELETE", "/accounts/<user_id>/monitors/<monitor_id>"): __import__("api.rules").rules.Rule(anyone=True),',
        [I_ROUTES],
        "an end user removes only their own account's balance monitors",
    ),
    m(
        "rules-owner-reads-ops-account",
        "functions/hotledger/ops/routes.py",
        '("GET", "/ops/accounts/<user_id>"): only(ADMIN),',
        '("GET", "/ops/accounts/<user_id>"): only(ADMIN, owner=lambda args: args["user_id"]),',
        [I_ROUTES],
        "the operators' view of an account is the operators' alone",
    ),
    m(
        "py-admit-any-scope",
        "functions/api/authorization.py",
        "    if rule.anyone or caller.scopes & rule.scopes:",
        "    if rule.anyone or caller.scopes:",
        [I_ROUTES],
        "a scope admits only to the routes that name it (a service is not an operator)",
    ),
    m(
        "py-authorizer-scope-prefix",
        "functions/authorizer/claims.py",
        'for s in str(claims.get("scope", "")).split() if s.startswith(scope_prefix)}',
        'for s in str(claims.get("scope", "")).split()}',
        [I_ROUTES],
        "only the resource server's own scopes (hotledger/...) count: a bare `service` or `admin` scope is none",
    ),
    m(
        "py-owner-checked",
        "functions/api/authorization.py",
        "    if owner(args) != caller.user_id:",
        "    if False:",
        [I_ROUTES],
        "an end user acts only on their own account and entities",
    ),
    m(
        "py-authorizer-audience",
        "functions/authorizer/app.py",
        "        if client not in self.settings.client_ids:",
        "        if False:",
        [I_ROUTES],
        "a token the issuer signed for another app client (another audience) is 401 everywhere",
    ),
    m(
        "py-jwt-claims-token-use",
        "functions/authorizer/claims.py",
        "        raise InvalidToken(f\"token_use {claims.get('token_use')!r} is neither access nor id\")",
        '        client, username = claims.get("client_id"), claims.get("username")',
        ["tests/integration/test_front_doors.py"],
        "verified claims of a token that is neither an access nor an ID token name no caller (401), front door http",
    ),
    # ---- issue 33 goal 4: the front door (template.yaml, FrontDoor) ------------------------------------------------
    m(
        "template-http-proxy-route-authorized",
        "template.yaml",
        'RouteKey: "ANY /{proxy+}", AuthorizationType: JWT,',
        'RouteKey: "ANY /{proxy+}", AuthorizationType: NONE,',
        [
            "tests/integration/test_template.py::test_the_front_door_routes_every_operation_of_the_route_table_and_authorizes_all_but_the_description"
        ],
        "behind the HTTP API every route but the description needs a token its JWT authorizer verified",
    ),
    m(
        "template-web-acl-rest-only",
        "template.yaml",
        "      - Assert: !Equals [!Ref FrontDoor, rest]",
        "      - Assert: !Equals [!Ref FrontDoor, !Ref FrontDoor]",
        ["tests/integration/test_template.py::test_a_web_acl_attaches_to_the_rest_api_only"],
        "a web ACL given with FrontDoor http is refused before anything is created (WAF cannot attach to an HTTP API)",
    ),
    # ---- issue 35, class 2: quotas given back, reconciler cursors -------------------------------------------------
    m(
        "lua-idem-abandon-gives-quota-back",
        "layers/lua/idem_abandon.lua",
        "if tonumber(redis.call('GET', KEYS[2]) or '0') > 0 then redis.call('DECR', KEYS[2]) end",
        "-- the key's count kept",
        [I_QUOTAS],
        "a route Idempotency-Key abandoned (nothing changed) no longer counts in its scope's quota",
    ),
    m(
        "py-route-key-abandoned-on-503",
        "functions/api/idempotency.py",
        "        if not isinstance(exc, ANSWER_LOST):",
        "        if False:",
        [I_QUOTAS],
        "a 503 that changed nothing gives the route key back (and its count in the quota)",
    ),
    m(
        "py-route-key-given-back-on-lost-answer",
        "functions/api/idempotency.py",
        "        if not isinstance(exc, ANSWER_LOST):",
        "        if True:",
        [I_WEBHOOKS],
        "a route key whose request lost a backing service's answer stays in flight: a retry cannot repeat the change",
    ),
    m(
        "py-lost-answer-said-nothing-changed",
        "functions/api/app.py",
        "    if isinstance(exc, responses.ANSWER_LOST) and",
        "    if False and",
        ["tests/integration/test_delay_queue.py"],
        "a write whose backing service lost its answer is 503 OUTCOME_UNKNOWN, never SERVICE_UNAVAILABLE",
    ),
    m(
        "py-route-key-abandoned-on-refusal",
        "functions/api/idempotency.py",
        "            _abandon(\n                scope, idem_key, begun.token, forget_note\n            )",
        "            pass",
        [I_QUOTAS],
        "a refusal that is not the key's answer (a 429, a 503) gives the route key back (and its count in the quota)",
    ),
    m(
        "lua-rollback-gives-key-quota-back",
        "layers/lua/ledger_rollback.lua",
        "if ARGV[3] == '1' and tonumber(redis.call('GET', KEYS[6]) or '0') > 0 then redis.call('DECR', KEYS[6]) end",
        "-- the key's count kept",
        ["tests/integration/test_limits.py::test_a_deduct_key_given_back_by_a_failed_publish_gives_its_count_back"],
        "a deduct key taken back (a failed publish) no longer counts in the account's key quota",
    ),
    m(
        "lua-idem-quota-window",
        "layers/lua/idem_begin.lua",
        "if redis.call('INCR', KEYS[2]) == 1 then redis.call('EXPIRE', KEYS[2], tonumber(ARGV[5])) end",
        "redis.call('INCR', KEYS[2])",
        [I_QUOTAS],
        "a scope's route key quota counts one window: it expires with the window (else a scope is locked out for good)",
    ),
    m(
        "lua-ledger-quota-window",
        LEDGER_APPLY,
        "  if opened == 1 then redis.call('EXPIRE', KEYS[6], ARGV[7]) end",
        "",
        [I_QUOTAS],
        "an account's deduct / recharge key quota counts one window: it expires with the window",
    ),
    m(
        "cursor-accounts",
        "functions/hotledger/ledger/feature.py",
        "done = reconcile.run(run.now_ms, run.age_s, run.budget, run.cursor)",
        "done = reconcile.run(run.now_ms, run.age_s, run.budget, 0)",
        [I_QUOTAS],
        "the accounts part resumes after its cursor (a run sees only the accounts past it)",
    ),
    m(
        "cursor-vouchers",
        "functions/hotledger/vouchers/feature.py",
        "run.report.vouchers = reconcile.run(run.now_ms, run.age_s, run.budget, run.cursor)",
        "run.report.vouchers = reconcile.run(run.now_ms, run.age_s, run.budget, 0)",
        [I_QUOTAS],
        "the vouchers part resumes after its cursor",
    ),
    m(
        "cursor-packets",
        "functions/hotledger/redpackets/feature.py",
        "run.report.packets = reconcile.run(run.now_ms, run.age_s, run.budget, run.cursor)",
        "run.report.packets = reconcile.run(run.now_ms, run.age_s, run.budget, 0)",
        [I_QUOTAS],
        "the red packets part resumes after its cursor",
    ),
    m(
        "cursor-reminders",
        "functions/hotledger/notices/feature.py",
        "run.now_ms, run.budget, run.cursor",
        "run.now_ms, run.budget, 0",
        [I_QUOTAS],
        "the close reminders part resumes after its cursor",
    ),
    m(
        "cursor-holds",
        "functions/hotledger/reconciler.py",
        "after, ended = ctx.cursor, 0",
        "after, ended = 0, 0",
        [I_QUOTAS],
        "the expired holds (and grants) part resumes after its cursor (reconciler.expiry_part)",
    ),
    m(
        "py-reconciler-reads-cursor",
        "functions/hotledger/reconciler.py",
        "return self.cursors.get(part) if self.cursors is not None else 0",
        "return 0",
        [I_QUOTAS],
        "every part is handed the cursor its last run left",
    ),
    m(
        "py-reconciler-keeps-cursor",
        "functions/hotledger/reconciler.py",
        "            if after is not None:\n                self._save(part.name, after)",
        "            if False:\n                self._save(part.name, after)",
        [I_QUOTAS],
        "where a part stopped is kept for the next run",
    ),
    m(
        "cursor-accounts-advances",
        "functions/hotledger/ledger/reconcile.py",
        "            report.next_after = accounts[-1].user_id",
        "            report.next_after = 0",
        [I_QUOTAS],
        "an accounts run that ran out of budget leaves its cursor at the last account it saw",
    ),
    m(
        "cursor-vouchers-advances",
        "functions/hotledger/vouchers/reconcile.py",
        "            report.next_after = vouchers[-1][0]",
        "            report.next_after = 0",
        [I_QUOTAS],
        "a vouchers run that ran out of budget leaves its cursor at the last voucher it saw",
    ),
    m(
        "cursor-packets-advances",
        "functions/hotledger/redpackets/reconcile.py",
        "            report.next_after = open_ids[-1]",
        "            report.next_after = 0",
        [I_QUOTAS],
        "a packets run that ran out of budget leaves its cursor at the last open packet it saw",
    ),
    m(
        "cursor-reminders-advances",
        "functions/hotledger/notices/payment_orders.py",
        "            after = page[-1][0]",
        "            after = 0",
        [I_QUOTAS],
        "a reminders run that ran out of budget leaves its cursor at the last payment order it saw",
    ),
    m(
        "cursor-holds-advances",
        "functions/hotledger/reconciler.py",
        "            after = due[-1][1]",
        "            after = 0",
        [I_QUOTAS],
        "a holds (or grants) run that ran out of budget leaves its cursor at the last one it saw (reconciler.expiry_part)",
    ),
    # ---- issue 35, class 4: voucher buckets' bookkeeping (every bucket's stock, every slot) -----------------------
    m(
        "py-voucher-rollback-in-unit-bucket",
        "functions/hotledger/vouchers/store.py",
        "[*voucher_keys(voucher_id, bucket), keys.voucher_fate(voucher_id, order_id, bucket)],",
        "[*voucher_keys(voucher_id, home), keys.voucher_fate(voucher_id, order_id, home)],",
        [I_BUCKETS],
        "a rolled-back order's unit goes back to the bucket it was taken from, not the buyer's home",
    ),
    m(
        "py-voucher-rollback-frees-home-slot",
        "functions/hotledger/vouchers/store.py",
        "        if bucket != home:\n            self.release(voucher_id, home, order_id, user_id, give_back=True)",
        "        if False:\n            self.release(voucher_id, home, order_id, user_id, give_back=True)",
        [I_BUCKETS],
        "a rolled-back away order gives the buyer's slot back at home (its away record ends)",
    ),
    m(
        "py-voucher-undo-unit-bucket",
        "functions/hotledger/vouchers/service.py",
        "lambda: self._undo(voucher_id, order_id, user_id, reply.bucket, home),",
        "lambda: self._undo(voucher_id, order_id, user_id, home, home),",
        [I_BUCKETS],
        "a failed publish undoes the order in the bucket its unit came from",
    ),
    m(
        "lua-voucher-release-gives-slot-back",
        "layers/lua/voucher_release.lua",
        "if ARGV[3] == 'give_back' and redis.call('HINCRBY', KEYS[2], ARGV[2], -1) <= 0 then",
        "if ARGV[3] == 'give_back' and false then",
        [I_BUCKETS],
        "an away reservation given back (no bucket had a unit, or a rollback) frees the buyer's slot at home",
    ),
    m(
        "lua-voucher-rollback-home-slot",
        "layers/lua/voucher_rollback.lua",
        "if ARGV[4] == '1' and redis.call('HINCRBY', KEYS[2], ARGV[2], -1) <= 0 then",
        "if false then",
        [I_BUCKETS],
        "a rolled-back order taken at home gives the buyer's slot back there",
    ),
    m(
        "py-voucher-reconcile-keeps-persisted-slot",
        "functions/hotledger/vouchers/reconcile.py",
        "                if a.order_id in persisted:",
        "                if False:",
        [I_BUCKETS],
        "the reconciler ends a persisted away order's record keeping the buyer's slot (the order stands)",
    ),
    m(
        "lua-voucher-take-counts-its-bucket",
        "layers/lua/voucher_take.lua",
        "redis.call('HINCRBY', KEYS[1], 'stock', -1)\nredis.call('HSET', KEYS[3]",
        "redis.call('HSET', KEYS[3]",
        [I_BUCKETS],
        "a unit taken from another bucket is taken from that bucket's stock",
    ),
    m(
        "lua-voucher-away-slot-reserved",
        "layers/lua/voucher_order.lua",
        "redis.call('HSET', KEYS[5], ARGV[3], ARGV[2] .. ';' .. seq .. ';' .. ARGV[4])",
        "-- no away record",
        [I_BUCKETS],
        "a buyer's slot reserved at home while the unit comes from elsewhere is recorded (to be settled or given back)",
    ),
    m(
        "lua-voucher-settle-ends-away",
        "layers/lua/voucher_settle.lua",
        "      redis.call('HDEL', KEYS[4], order)",
        "      -- the away record kept",
        [I_BUCKETS],
        "the writer's settle ends a persisted away order's record at home",
    ),
    # ---- issue 35, class 2 of the issue: every reply of every script (the quiet refusals) -------------------------
    m(
        "lua-lock-renew-owner-only",
        "layers/lua/lock_renew.lua",
        "if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end",
        "-- any caller renews",
        [I_REFUSALS],
        "only the lock's owner renews its lease",
    ),
    m(
        "lua-delay-extend-current-receipt",
        "layers/lua/delay_extend.lua",
        "if redis.call('ZSCORE', KEYS[1], element) and redis.call('HGET', KEYS[2], element) == seq then",
        "if redis.call('ZSCORE', KEYS[1], element) then",
        [I_REFUSALS],
        "only the current delivery's receipt extends its visibility",
    ),
    m(
        "lua-delay-retry-current-receipt",
        "layers/lua/delay_retry.lua",
        "if redis.call('ZSCORE', KEYS[1], element) and redis.call('HGET', KEYS[2], element) == seq then",
        "if redis.call('ZSCORE', KEYS[1], element) then",
        [I_REFUSALS],
        "only the current delivery's receipt retries it (or dead-letters it)",
    ),
    m(
        "lua-journey-done-compare-and-set",
        "layers/lua/journey_done.lua",
        "if redis.call('ZSCORE', KEYS[1], ARGV[1]) == ARGV[2] then return",
        "if true then return",
        [I_REFUSALS],
        "a journey started again while its reminder was posted is kept for its own reminder",
    ),
    m(
        "lua-voucher-load-only-when-absent",
        "layers/lua/voucher_load.lua",
        "if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end",
        "-- loaded over a live bucket",
        [I_REFUSALS],
        "a rebuild never overwrites a voucher bucket Redis holds (its live stock and buyers)",
    ),
    # ---- issue 35, class 3: what waits for the log after a Redis loss ----------------------------------------------
    m(
        "lua-voucher-order-log-hold",
        "layers/lua/voucher_order.lua",
        "if v[7] then  -- one caller a second checks the writer's watermark",
        "if false then",
        [I_LOG_WAITS],
        "a voucher rebuilt after a Redis loss sells nothing until the writer applied the log as it was",
    ),
    m(
        "py-voucher-rebuild-log-hold",
        "functions/hotledger/vouchers/service.py",
        "self.load(voucher_id, hold_until=self.clock() + self.rebuild_hold_ms, hold_log=self.hold.rebuild_mark())",
        'self.load(voucher_id, hold_until=self.clock() + self.rebuild_hold_ms, hold_log="")',
        [I_LOG_WAITS],
        "a voucher's rebuild after a Redis loss holds it for the log, not only for REBUILD_HOLD_S",
    ),
    m(
        "py-packet-expiry-waits-log",
        "functions/hotledger/redpackets/service.py",
        "        if reply.hold_log and not self.hold.passed(self.cache.hold_key(packet_id)):\n            return Expiry.NOT_YET",
        "        if False:\n            return Expiry.NOT_YET",
        [I_LOG_WAITS],
        "an expired packet rebuilt after a Redis loss refunds nothing until the writer applied the log as it was",
    ),
    m(
        "py-packet-rebuild-log-hold",
        "functions/hotledger/redpackets/service.py",
        "self.load(packet_id, hold_until=self.clock() + self.rebuild_hold_ms, hold_log=self.hold.rebuild_mark())",
        'self.load(packet_id, hold_until=self.clock() + self.rebuild_hold_ms, hold_log="")',
        [I_LOG_WAITS],
        "a red packet's rebuild after a Redis loss holds it for the log, not only for REBUILD_HOLD_S",
    ),
    m(
        "py-log-hold-watermark",
        "functions/hotledger/outbox/log_hold.py",
        "        if any(applied.get(partition, -1) < end - 1 for partition, end in _decode(held).items()):",
        "        if False:",
        [I_LOG_WAITS],
        "a log hold lifts only once the writer's watermark reached where the log ended at the rebuild",
    ),
    m(
        "lua-voucher-take-log-hold",
        "layers/lua/voucher_take.lua",
        "if v[4] then",
        "if false then",
        [I_LOG_WAITS],
        "a bucket rebuilt after a Redis loss gives no unit to another home's buyer until the log is applied",
    ),
    m(
        "lua-hold-swap-compare-and-set",
        "layers/lua/outbox_hold_swap.lua",
        "if held ~= ARGV[1] then return held end",
        "-- swapped whatever it holds",
        [I_LOG_WAITS],
        "a log hold is lifted only from the value its checker read: a later loss's own hold stays",
    ),
    m(
        "py-account-rebuild-log-hold",
        "functions/hotledger/ledger/service.py",
        "if after_loss and self.hold.enabled:",
        "if False:",
        ["tests/integration/test_ledger_idempotency.py"],
        "an account rebuilt after a Redis loss holds charges under keys it does not know until the log is applied",
    ),
    m(
        "lua-ids-lease-token",
        "layers/lua/ids_lease.lua",
        "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end",
        "-- any token",
        ["tests/integration/test_ids.py"],
        "a lease is renewed or released only by the token holding it (compare-and-set)",
    ),
    m(
        "py-ops-sync-cache-shows-its-mode-alone",
        "functions/hotledger/ops/service.py",
        '"agrees": cached is None or sync or (cached.balance == expected and cached.open_flag == flag),',
        '"agrees": cached is None or (cached.balance == expected and cached.open_flag == flag),',
        ["tests/integration/test_ops.py::test_an_account_as_the_db_and_redis_hold_it"],
        "the operator console does not call a SYNC account's cache wrong: its balance is not kept, its mode is all",
    ),
    m(
        "lua-cache-update-never-creates",
        "layers/lua/ledger_cache_update.lua",
        "if not redis.call('HGET', KEYS[1], 'v') then return 0 end",
        "-- cached or not",
        [I_LUA],
        "an operator's change reaches the cached account only if it is cached: never a partial hash",
    ),
    # ---- issue 32, the rest: webhook secrets, where deliveries may go, who acted -----------------------------
    m(
        "py-webhook-rotation-keeps-older-secrets",
        "functions/hotledger/webhooks/store.py",
        'for old, until in [[current, overlap_ends], *json.loads(previous or "[]")]',
        "for old, until in [[current, overlap_ends]]",
        [f"{I_WEBHOOKS}::test_two_overlapping_rotations_keep_each_old_secret_signing_until_its_own_overlap_ends"],
        "a second rotation inside the first one's overlap keeps the first old secret signing until its overlap ends",
    ),
    m(
        "py-webhook-seal-leaves-sealed-secrets",
        "functions/hotledger/webhooks/service.py",
        "lambda s: s if box.sealed(s) else box.seal(s)",
        "lambda s: box.seal(s)",
        [f"{I_WEBHOOKS}::test_secrets_kept_in_clear_from_before_the_sealing_are_sealed_once_by_the_operators_step"],
        "sealing the clear secrets is done once: a sealed secret is left as it is",
    ),
    m(
        "py-webhook-reserved-address-refused",
        "functions/hotledger/webhooks/service.py",
        "and not ip.is_reserved",
        "and True",
        [f"{I_WEBHOOKS}::test_endpoints_never_point_inside"],
        "an endpoint never resolves to a reserved address, IPv6's included",
    ),
    m(
        "py-ops-person-named-by-operators-only",
        "functions/api/authorization.py",
        "if not (caller and ADMIN in caller.scopes):",
        "if not caller:",
        ["tests/integration/test_ops_console_stack.py"],
        "only an operator's request names the person acting in the operators' log",
    ),
    # ---- issue 34: credit grants (spend order, expiry, take-backs) ---------------------------------------------------
    m(
        "lua-grants-spend-first-to-expire",
        "layers/lua/lib/grants.lua",
        "for _, id in ipairs(redis.call('ZRANGEBYSCORE', expiry, '(' .. now, '+inf')) do",
        "for _, id in ipairs(redis.call('ZREVRANGEBYSCORE', expiry, '+inf', '(' .. now)) do",
        [I_GRANTS],
        "a deduct spends the live grants first-to-expire",
    ),
    m(
        "lua-grants-account-flag-never-set",
        "layers/lua/lib/grants.lua",
        "  redis.call('HSET', account, 'grants', '1')",
        "  -- the account's grants flag left as it was",
        [I_LUA, I_GRANTS],
        "an account with a grant in its expiry zset says so in its hash, so its debits spend and count its grants",
    ),
    m(
        "lua-grants-flag-learned-by-an-account-cached-without-it",
        "layers/lua/lib/grants.lua",
        "  local has = redis.call('EXISTS', expiry) == 1",
        "  local has = false",
        [I_LUA],
        "an account cached before the grants flag existed looks its grants up once",
    ),
    m(
        "lua-grants-expired-never-counted",
        LEDGER_APPLY,
        "  on_hold = on_hold + grants_expired(KEYS[10], KEYS[11], ts)",
        "  -- expired grants counted",
        [I_GRANTS],
        "an expired grant is never spent nor counted in available, whether or not its expiry entry is booked",
    ),
    m(
        "py-grants-sync-expired-never-counted",
        LEDGER_SERVICE,
        "out_of_reach = expired_remaining(seen.grants, now)",
        "out_of_reach = 0",
        [I_GRANTS],
        "a SYNC account's expired grant is never spent either (the scripts' rule, grants.rows)",
    ),
    m(
        "lua-grants-expiry-taken-back",
        "layers/lua/ledger_rollback.lua",
        "    grant_add(KEYS[1], KEYS[11], KEYS[12], e.grant_id, amount, e.ended_expires_at, e.ended_category)",
        "    -- the grant stays gone",
        [I_GRANTS],
        "a grant expiry whose publish failed puts its grant back (still expired: counted for nothing)",
    ),
    m(
        "lua-grants-granted-recharge-taken-back",
        "layers/lua/ledger_rollback.lua",
        "  if (e.grant_expires_at or '') ~= '' then grant_remove(KEYS[11], KEYS[12], ARGV[1]) end",
        "  -- the grant stays",
        [I_GRANTS],
        "a granted recharge whose publish failed takes its grant with it",
    ),
    m(
        "lua-grants-expired-never-held",
        "layers/lua/hold_change.lua",
        "held = held + expired  -- out of reach like a held credit, until its expiry entry",
        "-- expired grants authorized",
        [I_GRANTS],
        "a hold is never authorized against what an expired grant still holds, nor counted in a change's "
        "available_after",
    ),
    m(
        "lua-grants-refund-plain-first",
        "layers/lua/lib/grants.lua",
        "  local left = amount - math.min(math.max(plain - refunded_before, 0), amount)",
        "  local left = amount",
        [I_GRANTS],
        "a refund gives back what its charge took of the plain balance first, then its grants last-spent first",
    ),
    m(
        "lua-grants-refund-never-revives",
        "layers/lua/lib/grants.lua",
        "        if tonumber(expires_at) > tonumber(now) then",
        "        if true then",
        [I_GRANTS],
        "a refund never gives back to a grant past its expires_at: its part stays in the plain balance",
    ),
    m(
        "lua-grants-refund-taken-back",
        "layers/lua/ledger_rollback.lua",
        "  if (e.grants_refunded or '') ~= '' then grants_give_back(KEYS[11], e.grants_refunded, -1) end",
        "  -- a refund's give-back stays",
        [I_GRANTS],
        "a refund whose publish failed takes back what it gave its grants",
    ),
    m(
        "py-grants-refund-parts-plain-first",
        "functions/hotledger/grants/rows.py",
        "    left = amount - min(max(plain - refunded_before, 0), amount)",
        "    left = amount",
        [I_GRANTS],
        "a SYNC refund gives back the plain balance first, then the grants last-spent first (lib/grants' rule)",
    ),
    m(
        "py-grants-refund-never-revives",
        "functions/hotledger/refunds/service.py",
        "given = [(g, a) for g, a in parts if g in live]",
        "given = parts",
        [I_GRANTS],
        "a SYNC refund never gives back to an expired grant",
    ),
    m(
        "py-refund-waits-for-the-grants-it-gives-back",
        "functions/hotledger/refunds/store.py",
        "        if any(grant is None for _, _, grant in rows):",
        "        if False:",
        [I_GRANTS],
        "a refund of a charge booked before a grant it spent (the reconciler persisting what the broker lost) waits for"
        " the grant, so the grant's part goes back to it, not to the plain balance",
    ),
    m(
        "lua-grants-expiry-waits-for-the-log",
        "layers/lua/ledger_grant_expire.lua",
        "local held = rebuild_hold(KEYS[1], h[6], h[7], tonumber(ARGV[3]))",
        "local held = nil",
        [I_GRANTS],
        "a grant's expiry on an account rebuilt after a Redis loss waits for the spends still in the log",
    ),
    m(
        "py-grants-booked-after-its-spends",
        "functions/hotledger/grants/tx.py",
        "            f\" WHERE g.id IN ({','.join('%d' % e.id for e in made)})\"",
        "            f\" WHERE FALSE AND g.id IN ({','.join('%d' % e.id for e in made)})\"",
        [I_GRANTS],
        "a grant booked after spends of it (the reconciler persisting what the broker lost) starts from what they left",
    ),
    m(
        "lua-grants-spend-waits-for-the-log",
        "layers/lua/ledger_apply.lua",
        "    if fingerprint == '' and kind_in(KIND_SPENDS_GRANTS, kind) then",
        "    if false then",
        [I_GRANTS],
        "a debit without a key that spends grants on an account rebuilt after a Redis loss waits for the spends still in"
        " the log",
    ),
    m(
        "lua-grants-expiry-waits-for-the-entries-before-it",
        "layers/lua/ledger_grant_expire.lua",
        "if redis.call('ZCOUNT', KEYS[3], '-inf', '(' .. expires_at) > 0 then return {'early'} end",
        "-- the expiry does not wait for the entries made before it",
        [I_GRANTS],
        "a grant's expiry waits while an entry made before its expires_at (which may have spent it or given back to it)"
        " may still be taken back",
    ),
    m(
        "lua-grants-capture-spends",
        "layers/lua/hold_change.lua",
        "  if has_grants then spent = grants_spend(KEYS[8], KEYS[9], KEYS[6], ts, take) end",
        "  -- a capture spends no grant",
        [I_GRANTS],
        "a capture spends the live grants first-to-expire, then the plain balance, as a deduct does",
    ),
    m(
        "lua-grants-capture-not-past-expired",
        "layers/lua/hold_change.lua",
        "  if take > 0 and expired > 0 and",
        "  if false and",
        [I_GRANTS],
        "a capture never takes what grants that expired while its hold was open held",
    ),
    m(
        "lua-grants-capture-taken-back",
        "layers/lua/ledger_rollback.lua",
        "  if (e.grants_spent or '') ~= '' then grants_give_back(KEYS[11], e.grants_spent) end  -- a capture's spends",
        "  -- a capture's spends stay spent",
        [I_GRANTS],
        "a capture whose publish failed gives what it spent back to its grants",
    ),
    m(
        "py-grants-sync-capture-spends",
        "functions/hotledger/holds/service.py",
        "grants_spent=encode_spent(spend(grants, take, now_ms)),",
        "grants_spent=None,",
        [I_GRANTS],
        "a SYNC capture spends the live grants first-to-expire (hold_change.lua's rule)",
    ),
    m(
        "py-grants-sync-capture-not-past-expired",
        "functions/hotledger/holds/service.py",
        "if take and expired and account.balance - expired - others - take < account.threshold:",
        "if False:",
        [I_GRANTS],
        "a SYNC capture never takes what grants that expired while its hold was open held",
    ),
    m(
        "py-grants-sync-change-available-after",
        "functions/hotledger/holds/service.py",
        "available_after=account.balance - take - expired - (live - take - released),",
        "available_after=account.balance - take - (live - take - released),",
        [I_GRANTS],
        "a SYNC hold change's available_after leaves expired grants out",
    ),
    # ---- the charge's lean path: what it keeps must follow what it was built from -----------------------------
    m(
        "py-account-keys-follow-settings",
        "functions/hotledger/keys.py",
        "if cfg is not settings():",
        "if cfg is None:",
        ["tests/unit/test_key_slots.py"],
        "an account's kept keys are built again when the settings change (another transport, another slot)",
    ),
    m(
        "py-apply-reply-ok-fields",
        "functions/hotledger/ledger/replies.py",
        "_, entry_id, balance, version, epoch, open_flag, grant = raw",
        "_, entry_id, version, balance, epoch, open_flag, grant = raw",
        ["tests/unit/test_script_replies.py"],
        "an OK reply of ledger_apply read directly carries the balance and version the script answered",
    ),
]


def scratch_copy(dest: Path) -> None:
    """The repo's tracked and untracked (not ignored) files, with .venv and .tools symlinked."""
    names = (
        subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True, capture_output=True
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, names):
        src = REPO / name
        if not src.is_file():
            continue
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / name)
    for link in (".venv", ".tools"):
        if (REPO / link).exists():
            (dest / link).symlink_to((REPO / link).resolve())


def apply(root: Path, mutant: Mutant) -> str:
    """Applies the mutant under `root`; returns the original text to restore."""
    path = root / mutant.file
    text = path.read_text()
    if text.count(mutant.original) != 1:
        raise SystemExit(
            f"{mutant.id}: the original snippet occurs {text.count(mutant.original)} times in {mutant.file}"
        )
    path.write_text(text.replace(mutant.original, mutant.replacement))
    return text


def pytest(root: Path, tests, timeout_s: int) -> tuple[int, str]:
    """pytest's exit code (-1: timed out) and output, stopping at the first failure, in the scratch copy."""
    env = {k: v for k, v in os.environ.items() if k not in ("LUA_DIR", "PYTEST_ADDOPTS")}
    env["HOTLEDGER_STATE_DIR"] = str(root / ".state")
    try:
        proc = subprocess.run(
            [
                str(root / ".venv/bin/python"),
                "-m",
                "pytest",
                "-q",
                "-x",
                "--no-header",
                "-p",
                "no:cacheprovider",
                *tests,
            ],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        return proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired:
        return -1, f"timed out after {timeout_s} s"


def first_failure(out: str) -> str:
    """The test that failed first (pytest -ra's summary line), to show what killed a mutant."""
    for line in out.splitlines():
        if line.startswith(("FAILED tests/", "ERROR tests/")):
            return line.split(" - ")[0].split(" ", 1)[1]
    return "?"


def run(root: Path, mutant: Mutant, timeout_s: int) -> tuple[str, float, str]:
    """('killed' | 'survived' | 'error', seconds, what killed it or the tail of pytest's output)."""
    original = apply(root, mutant)
    start = time.monotonic()
    try:
        code, out = pytest(root, mutant.tests, timeout_s)
    finally:
        (root / mutant.file).write_text(original)
    verdict = {0: "survived", 1: "killed"}.get(code, "error")  # 2..5: interrupted, usage, nothing collected
    detail = first_failure(out) if verdict == "killed" else "\n".join(out.strip().splitlines()[-15:])
    return verdict, time.monotonic() - start, detail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", default=[], help="a mutant id (repeatable)")
    parser.add_argument("--list", action="store_true", help="print the mutants and exit")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per mutant")
    parser.add_argument("--no-baseline", action="store_true", help="skip the run of the unmutated test sets")
    args = parser.parse_args(argv)
    chosen = [mu for mu in MUTANTS if not args.only or mu.id in args.only]
    if args.only and len(chosen) != len(set(args.only)):
        parser.error(f"unknown mutant id among {args.only}")
    if args.list:
        for mu in chosen:
            print(f"{mu.id:34} {mu.file}\n{'':34} breaks: {mu.breaks}\n{'':34} tests: {' '.join(mu.tests)}")
        return 0
    results = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hotledger-mutants-") as tmp:
        root = Path(tmp)
        scratch_copy(root)
        if not args.no_baseline:  # a red test set would "kill" every mutant: the unmutated copy must pass first
            tests = sorted({t for mu in chosen for t in mu.tests})
            code, out = pytest(root, tests, args.timeout)
            print(
                f"baseline (unmutated, {len(tests)} test files/ids): {'green' if code == 0 else 'RED'} "
                f"in {time.monotonic() - started:.0f} s",
                flush=True,
            )
            if code != 0:
                print(out[-3000:])
                return 2
        for i, mu in enumerate(chosen, 1):
            verdict, seconds, detail = run(root, mu, args.timeout)
            results.append((mu, verdict))
            print(f"[{i:2}/{len(chosen)}] {verdict.upper():8} {mu.id:34} {seconds:6.1f} s  ({mu.breaks})", flush=True)
            if verdict == "killed":
                print(f"{'':14}by {detail}", flush=True)
            else:
                print("    " + detail.replace("\n", "\n    "), flush=True)
    bad = [(mu, v) for mu, v in results if v != "killed"]
    total = time.monotonic() - started
    print(f"\n{len(results) - len(bad)}/{len(results)} mutants killed in {total:.0f} s")
    for mu, v in bad:
        print(f"  {v}: {mu.id} ({mu.file}): {mu.breaks}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
