-- Reverts 003_ledger_reconciliation.up.sql, in reverse order.
DROP INDEX {{schema}}payments_ledger_discrepancies_found_idx;
DROP TABLE {{schema}}payments_ledger_discrepancies;
DROP TABLE {{schema}}payments_ledger_watermark;
