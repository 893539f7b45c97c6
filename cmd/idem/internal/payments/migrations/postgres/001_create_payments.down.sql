-- Reverts 001_create_payments.up.sql, in reverse order. {{schema}} is the
-- quoted schema name and a dot.
DROP INDEX {{schema}}payments_unsettled_idx;
DROP INDEX {{schema}}payments_tenant_seq_idx;
DROP TABLE {{schema}}payments;
