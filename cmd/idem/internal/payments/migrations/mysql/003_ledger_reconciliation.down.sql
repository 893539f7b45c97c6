-- Reverts 003_ledger_reconciliation.up.sql, in reverse order.
DROP TABLE IF EXISTS payments_ledger_discrepancies;
DROP TABLE IF EXISTS payments_ledger_watermark;
