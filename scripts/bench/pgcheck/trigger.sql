-- Not a check: a plpgsql BEFORE trigger raising check_violation (for
-- comparison only; a trigger can be disabled, a check cannot).
ALTER TABLE {{schema}}.idem_keys DROP CONSTRAINT IF EXISTS idem_keys_response_check;
CREATE OR REPLACE FUNCTION {{schema}}.idem_response_trigger() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT (CASE WHEN NEW.state = 'completed'
                THEN NEW.response_status IS NOT NULL OR NEW.not_replayable
                ELSE NEW.response_status IS NULL AND NEW.response_header IS NULL
                     AND NEW.response_body IS NULL AND NOT NEW.not_replayable
           END) THEN
        RAISE check_violation USING MESSAGE = 'idem_keys_response_check';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER idem_keys_response_trigger BEFORE INSERT OR UPDATE ON {{schema}}.idem_keys
    FOR EACH ROW EXECUTE FUNCTION {{schema}}.idem_response_trigger();
