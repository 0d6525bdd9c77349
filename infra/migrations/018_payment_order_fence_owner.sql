-- Issue 19 item 9, for payment orders as 015 for accounts: the holder that took the row under its fencing token. An
-- equal token from another holder is refused like a smaller one, and only that holder may close the order.
ALTER TABLE t_payment_order ADD COLUMN fence_owner VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NULL;
