-- Reverts 002_create_settings.up.sql. {{schema}} is the quoted schema name
-- and a dot.
DROP TABLE {{schema}}payments_settings;
