-- As migrated (001 … 005): the CASE of 001.
ALTER TABLE {{schema}}.idem_keys DROP CONSTRAINT IF EXISTS idem_keys_response_check;
ALTER TABLE {{schema}}.idem_keys ADD CONSTRAINT idem_keys_response_check
    CHECK (CASE WHEN state = 'completed'
                THEN response_status IS NOT NULL OR not_replayable
                ELSE response_status IS NULL AND response_header IS NULL
                     AND response_body IS NULL AND NOT not_replayable
           END) NOT VALID;
