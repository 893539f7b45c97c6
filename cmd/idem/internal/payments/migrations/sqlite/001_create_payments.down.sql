-- Reverts 001_create_payments.up.sql, in reverse order.
DROP INDEX payments_unsettled_idx;
DROP INDEX payments_tenant_seq_idx;
DROP TABLE payments;
