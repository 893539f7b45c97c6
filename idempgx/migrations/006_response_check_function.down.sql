ALTER TABLE {{schema}}.idem_keys
    DROP CONSTRAINT idem_keys_response_check,
    ADD CONSTRAINT idem_keys_response_check
        CHECK (CASE WHEN state = 'completed'
                    THEN response_status IS NOT NULL OR not_replayable
                    ELSE response_status IS NULL AND response_header IS NULL
                         AND response_body IS NULL AND NOT not_replayable
               END);
DROP FUNCTION {{schema}}.idem_response_ok({{schema}}.idem_state,
    {{schema}}.idem_response_status, jsonb, bytea, boolean);
