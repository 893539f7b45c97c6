ALTER TABLE {{schema}}.idem_keys DROP COLUMN waiters;
