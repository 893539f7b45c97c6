DROP TABLE idem_outbox;
