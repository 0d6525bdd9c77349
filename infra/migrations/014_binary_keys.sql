-- Issue 19 item 2: Idempotency-Keys are compared byte for byte. The default utf8mb4 collation folds case (MariaDB,
-- Aurora MySQL), so `order-a` found `Order-A`'s answer. Under that collation no two stored keys differed only in
-- case, so every existing row stays and stays unique under the binary one.
ALTER TABLE t_idempotency MODIFY idem_key VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL;
ALTER TABLE t_route_key MODIFY idem_key VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL;
ALTER TABLE t_order MODIFY idem_key VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL;
ALTER TABLE t_pay MODIFY idem_key VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL;
