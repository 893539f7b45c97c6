-- The rule in a LANGUAGE sql function (inlined when the check is planned).
ALTER TABLE {{schema}}.idem_keys DROP CONSTRAINT IF EXISTS idem_keys_response_check;
CREATE OR REPLACE FUNCTION {{schema}}.idem_response_ok_sql(
    state text, no_status boolean, no_header boolean, no_body boolean, not_replayable boolean)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
SELECT CASE WHEN state = 'completed'
            THEN NOT no_status OR not_replayable
            ELSE no_status AND no_header AND no_body AND NOT not_replayable
       END
$$;
ALTER TABLE {{schema}}.idem_keys ADD CONSTRAINT idem_keys_response_check
    CHECK ({{schema}}.idem_response_ok_sql(state, response_status IS NULL,
        response_header IS NULL, response_body IS NULL, not_replayable)) NOT VALID;
