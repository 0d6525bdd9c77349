-- Issue 19 item 9: the holder that wrote an account under a fencing token. An equal token from another holder (a
-- promoted replica that missed the last acquisition handed it out again) is refused like a smaller one.
ALTER TABLE t_account ADD COLUMN fence_owner VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NULL;
