-- The same rule, fewer nodes: num_nonnulls for the three nulls.
ALTER TABLE {{schema}}.idem_keys DROP CONSTRAINT IF EXISTS idem_keys_response_check;
ALTER TABLE {{schema}}.idem_keys ADD CONSTRAINT idem_keys_response_check
    CHECK (CASE WHEN state = 'completed'
                THEN response_status IS NOT NULL OR not_replayable
                ELSE num_nonnulls(response_status, response_header, response_body) = 0
                     AND NOT not_replayable
           END) NOT VALID;
