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
I_TRANSFERS = "tests/integration/test_transfers.py"


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
        "        if not self.store.move(tid, PENDING, DEBITED, self.clock(), debit_id=debit.entry_id):",
        "        if not self.store.move(tid, PENDING, DEBITED, self.clock(), debit_id=debit.entry_id) and False:",
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
        'if kind == KIND_DEDUCT and balance <= 0 and open_flag == "1":',
        'if kind == KIND_DEDUCT and balance < 0 and open_flag == "1":',
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
        "py-429-not-a-key-answer",
        "functions/hotledger/errors.py",
        "return exc.status < 500 and exc.status != 429 and not isinstance(exc, (IdempotencyInProgress, HoldBusy))",
        "return exc.status < 500 and not isinstance(exc, (IdempotencyInProgress, HoldBusy))",
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
        "if balance - held - live(tonumber(h[8]) or 0) - amount < tonumber(h[3]) then return {'insufficient', h[1], h[2]} end",
        "if false then return {'insufficient', h[1], h[2]} end",
        [I_HOLDS],
        "a hold is refused like a deduct, against available",
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
        "seq=head.seq + 1,",
        "seq=head.seq + 2,",
        ["tests/integration/test_history.py", "tests/unit/test_book.py"],
        "an account's entries are numbered without gaps",
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
