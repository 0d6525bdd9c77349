-- The writer's log watermark (issue 10, item 7): per (topic, partition), the offset up to which the writer has
-- applied every record (persisted, skipped as a duplicate or rolled back, or dead-lettered). A voucher or red
-- packet Redis lost is rebuilt from the DB and refuses sales and grabs (RECOVERING) until this reaches the end
-- of the log as it was when the rebuild read it, so no order or claim acknowledged before the loss can find its
-- unit resold or its item handed out again.
CREATE TABLE IF NOT EXISTS t_log_watermark (
  topic VARCHAR(249) NOT NULL,
  partition_no INT NOT NULL,
  applied_offset BIGINT NOT NULL,
  update_time DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (topic, partition_no)
) ENGINE=InnoDB;
