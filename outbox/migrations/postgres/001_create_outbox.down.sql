DROP TABLE {{schema}}idem_outbox;
