-- The rule in a plpgsql function of the five columns themselves (the
-- parameters of the columns' types, domains included: no relabelling, no
-- null tests in the check's expression).
ALTER TABLE {{schema}}.idem_keys DROP CONSTRAINT IF EXISTS idem_keys_response_check;
CREATE OR REPLACE FUNCTION {{schema}}.idem_response_ok_vars(
    state {{schema}}.idem_state, response_status {{schema}}.idem_response_status,
    response_header jsonb, response_body bytea, not_replayable boolean)
RETURNS boolean LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN CASE WHEN state = 'completed'
                THEN response_status IS NOT NULL OR not_replayable
                ELSE response_status IS NULL AND response_header IS NULL
                     AND response_body IS NULL AND NOT not_replayable
           END;
END
$$;
ALTER TABLE {{schema}}.idem_keys ADD CONSTRAINT idem_keys_response_check
    CHECK ({{schema}}.idem_response_ok_vars(state, response_status,
        response_header, response_body, not_replayable)) NOT VALID;
