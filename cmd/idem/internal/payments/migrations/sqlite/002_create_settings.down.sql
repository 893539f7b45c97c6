-- Reverts 002_create_settings.up.sql.
DROP TABLE payments_settings;
