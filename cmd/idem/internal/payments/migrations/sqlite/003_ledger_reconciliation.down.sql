-- Reverts 003_ledger_reconciliation.up.sql, in reverse order.
DROP INDEX payments_ledger_discrepancies_found_idx;
DROP TABLE payments_ledger_discrepancies;
DROP TABLE payments_ledger_watermark;
