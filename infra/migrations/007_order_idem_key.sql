-- The reconciler finds red packets left FAILED whose sender was debited after all by the debit's
-- Idempotency-Key in t_order (redpackets/store.py failed_with_debit), as 002 does for t_pay's keys.
CREATE INDEX idx_order_idem ON t_order (idem_key);
