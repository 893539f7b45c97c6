DROP TABLE {{schema}}.idem_keys;
