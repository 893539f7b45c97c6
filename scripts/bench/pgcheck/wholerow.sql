-- The rule in a plpgsql function of the whole row.
ALTER TABLE {{schema}}.idem_keys DROP CONSTRAINT IF EXISTS idem_keys_response_check;
CREATE OR REPLACE FUNCTION {{schema}}.idem_response_ok_row(r {{schema}}.idem_keys)
RETURNS boolean LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN CASE WHEN r.state = 'completed'
                THEN r.response_status IS NOT NULL OR r.not_replayable
                ELSE r.response_status IS NULL AND r.response_header IS NULL
                     AND r.response_body IS NULL AND NOT r.not_replayable
           END;
END
$$;
ALTER TABLE {{schema}}.idem_keys ADD CONSTRAINT idem_keys_response_check
    CHECK ({{schema}}.idem_response_ok_row(idem_keys)) NOT VALID;
