-- The single-column checks become domains: PostgreSQL reads a table's check
-- constraints again, from their stored text, for every row a statement
-- writes (most of the server's work on a new key), while a domain's checks
-- are read once per connection. The guarantees are the same; only the check
-- that relates several columns (idem_keys_response_check) stays on the
-- table. The columns change to the domains before the domains have their
-- checks, so that the table is not rewritten; the checks are then added
-- and validated, which reads the table once per domain.
CREATE DOMAIN {{schema}}.idem_state AS text;
CREATE DOMAIN {{schema}}.idem_lease_expired_state AS text;
CREATE DOMAIN {{schema}}.idem_response_status AS integer;
CREATE DOMAIN {{schema}}.idem_attempts AS integer;
CREATE DOMAIN {{schema}}.idem_reconcile_attempts AS integer;
CREATE DOMAIN {{schema}}.idem_reconcile_error AS text;
CREATE DOMAIN {{schema}}.idem_ttl AS interval;

ALTER TABLE {{schema}}.idem_keys
    DROP CONSTRAINT idem_keys_state_check,
    DROP CONSTRAINT idem_keys_lease_expired_state_check,
    DROP CONSTRAINT idem_keys_response_status_check,
    DROP CONSTRAINT idem_keys_attempts_check,
    DROP CONSTRAINT idem_keys_reconcile_attempts_check,
    DROP CONSTRAINT idem_keys_reconcile_error_check,
    DROP CONSTRAINT idem_keys_ttl_check,
    ALTER COLUMN state TYPE {{schema}}.idem_state,
    ALTER COLUMN lease_expired_state TYPE {{schema}}.idem_lease_expired_state,
    ALTER COLUMN response_status TYPE {{schema}}.idem_response_status,
    ALTER COLUMN attempts TYPE {{schema}}.idem_attempts,
    ALTER COLUMN reconcile_attempts TYPE {{schema}}.idem_reconcile_attempts,
    ALTER COLUMN reconcile_error TYPE {{schema}}.idem_reconcile_error,
    ALTER COLUMN ttl TYPE {{schema}}.idem_ttl;

ALTER DOMAIN {{schema}}.idem_state ADD CONSTRAINT idem_state_check
    CHECK (VALUE IN ('in_progress', 'completed', 'released', 'unknown')) NOT VALID;
ALTER DOMAIN {{schema}}.idem_lease_expired_state ADD CONSTRAINT idem_lease_expired_state_check
    CHECK (VALUE IN ('unknown', 'released')) NOT VALID;
ALTER DOMAIN {{schema}}.idem_response_status ADD CONSTRAINT idem_response_status_check
    CHECK (VALUE BETWEEN 100 AND 999) NOT VALID;
ALTER DOMAIN {{schema}}.idem_attempts ADD CONSTRAINT idem_attempts_check
    CHECK (VALUE > 0) NOT VALID;
ALTER DOMAIN {{schema}}.idem_reconcile_attempts ADD CONSTRAINT idem_reconcile_attempts_check
    CHECK (VALUE >= 0) NOT VALID;
ALTER DOMAIN {{schema}}.idem_reconcile_error ADD CONSTRAINT idem_reconcile_error_check
    CHECK (octet_length(VALUE) <= 256) NOT VALID;
ALTER DOMAIN {{schema}}.idem_ttl ADD CONSTRAINT idem_ttl_check
    CHECK (VALUE >= interval '0') NOT VALID;
ALTER DOMAIN {{schema}}.idem_state VALIDATE CONSTRAINT idem_state_check;
ALTER DOMAIN {{schema}}.idem_lease_expired_state VALIDATE CONSTRAINT idem_lease_expired_state_check;
ALTER DOMAIN {{schema}}.idem_response_status VALIDATE CONSTRAINT idem_response_status_check;
ALTER DOMAIN {{schema}}.idem_attempts VALIDATE CONSTRAINT idem_attempts_check;
ALTER DOMAIN {{schema}}.idem_reconcile_attempts VALIDATE CONSTRAINT idem_reconcile_attempts_check;
ALTER DOMAIN {{schema}}.idem_reconcile_error VALIDATE CONSTRAINT idem_reconcile_error_check;
ALTER DOMAIN {{schema}}.idem_ttl VALIDATE CONSTRAINT idem_ttl_check;
