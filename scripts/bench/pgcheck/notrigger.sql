DROP TRIGGER IF EXISTS idem_keys_response_trigger ON {{schema}}.idem_keys;
