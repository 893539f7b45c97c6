-- No check at all: the lower bound (a measurement only).
ALTER TABLE {{schema}}.idem_keys DROP CONSTRAINT IF EXISTS idem_keys_response_check;
