DROP TABLE idem_keys;
