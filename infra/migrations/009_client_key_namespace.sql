-- Issue 10 item 3: client Idempotency-Keys live in a namespace of their own ('c:' + the client's key); the service's
-- own keys (rp<id>, rprefund<id>, payorder<id>, payorderrefund<id>) stay as they are. Keys stored before: every key
-- not spelled like a service key was a client's and moves into the client namespace, so its answer is still found.
-- (A client key stored before that was spelled like a service key cannot be told apart and stays where it is.)
UPDATE IGNORE t_idempotency SET idem_key = CONCAT('c:', idem_key)
 WHERE idem_key NOT REGEXP '^(rp|rprefund|payorder|payorderrefund)[0-9]+$';
UPDATE t_order SET idem_key = CONCAT('c:', idem_key)
 WHERE idem_key IS NOT NULL AND idem_key NOT REGEXP '^(rp|rprefund|payorder|payorderrefund)[0-9]+$';
UPDATE t_pay SET idem_key = CONCAT('c:', idem_key)
 WHERE idem_key IS NOT NULL AND idem_key NOT REGEXP '^(rp|rprefund|payorder|payorderrefund)[0-9]+$';
