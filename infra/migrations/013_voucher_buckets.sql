-- Stock buckets (issue 12): a voucher created with stock_shards = N sells its stock from N Redis slots. The voucher's
-- total stock (t_seckill_voucher.stock) stays the judge (never below 0); t_voucher_bucket keeps each bucket's share,
-- moved by the writer in the same transaction, so a bucket Redis lost is rebuilt, and reconciled, on its own.
ALTER TABLE t_seckill_voucher ADD COLUMN stock_shards INT NOT NULL DEFAULT 1 COMMENT 'stock buckets (Redis slots) it sells from';
ALTER TABLE t_voucher_order ADD COLUMN bucket INT NOT NULL DEFAULT 0 COMMENT 'the stock bucket its unit came from';
CREATE TABLE IF NOT EXISTS t_voucher_bucket (
  voucher_id BIGINT NOT NULL,
  bucket INT NOT NULL,
  stock INT NOT NULL COMMENT 'the bucket''s share left in the DB: its initial share - orders persisted from it',
  PRIMARY KEY (voucher_id, bucket)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
INSERT IGNORE INTO t_voucher_bucket (voucher_id, bucket, stock) SELECT id, 0, stock FROM t_seckill_voucher;
