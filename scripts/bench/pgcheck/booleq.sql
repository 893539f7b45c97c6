-- The same rule as comparisons of booleans, no CASE.
ALTER TABLE {{schema}}.idem_keys DROP CONSTRAINT IF EXISTS idem_keys_response_check;
ALTER TABLE {{schema}}.idem_keys ADD CONSTRAINT idem_keys_response_check
    CHECK ((state = 'completed') = (response_status IS NOT NULL OR not_replayable)
           AND (state = 'completed' OR num_nonnulls(response_header, response_body) = 0)) NOT VALID;
