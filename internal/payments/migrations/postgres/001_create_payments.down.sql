DROP TABLE {{schema}}payments;
