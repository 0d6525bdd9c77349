-- Issue 19 item 3: the lease token of the attempt that holds a route key. Only that attempt writes the key's recovery
-- point and answer in the DB: an attempt that lost the key (its lease ran out while the DB stalled) cannot overwrite
-- what the attempt that took it over wrote.
ALTER TABLE t_route_key ADD COLUMN token CHAR(32) CHARACTER SET ascii COLLATE ascii_bin NULL;
